"""sessrec: session-based and sequential recommendation with transformers.

The names below are imported on first use: ``import sessrec.models`` (or ``sessrec.embeddings``,
``sessrec.data``) loads only its own layer, without Lightning; ``sessrec.NextItemTask`` loads the
training layer when asked for.
"""

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

EXPORTS = {
    "sessrec.artifacts": ["ClickRanker", "SessionRecommender"],
    "sessrec.data": ["EventLogSource", "ItemVocab", "SRGNNSource", "Schema", "SchemaError", "SessionBatch",
                     "SyntheticSource", "UserSequenceSource"],
    "sessrec.metrics": ["TopKMetrics"],
    "sessrec.models": ["BSARecEncoder", "BertEncoder", "CausalLanguageModeling", "ElectraEncoder", "GPT2Encoder", "GRU4RecEncoder",
                       "HSTUEncoder", "MaskedItemModeling", "PermutationLanguageModeling", "ReplacedTokenDetection", "SASRecEncoder",
                       "SessionModel", "XLNetEncoder"],
    "sessrec.pipeline": ["Pipeline"],
    "sessrec.tasks": ["NextItemTask", "SessionDataModule"],
}
MODULE_OF = {name: module for module, names in EXPORTS.items() for name in names}
__all__ = sorted(MODULE_OF)


def __getattr__(name: str) -> Any:
    if name in MODULE_OF:
        return getattr(import_module(MODULE_OF[name]), name)
    raise AttributeError(f"module 'sessrec' has no attribute {name!r}")


def __dir__() -> list[str]:
    return [*globals(), *__all__]
