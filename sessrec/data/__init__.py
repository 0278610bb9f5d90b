"""Data layer: schema, readers, frame operations, vocabulary, sources (Merlin/NVTabular directories
among them), loaders, streams, evaluation pairs, side information, synthetic sessions and prepared datasets (`prepare`, `PreparedSource`).
Imports no model and no Lightning.

Each name below is imported from its module on first use (``sessrec.data.SRGNNSource`` loads
`sessrec.data.sources` only).
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sessrec.data.batch import SessionBatch
    from sessrec.data.loader import SessionLoader
    from sessrec.data.merlin import MerlinSchema, MerlinSource, read_merlin_schema
    from sessrec.data.pairs import EvalPairs
    from sessrec.data.prepared import prepare
    from sessrec.data.prepared.dataset import PreparedSource
    from sessrec.data.readers import read_events, read_srgnn, read_user_sequences
    from sessrec.data.schema import FeatureSpec, Schema, SchemaError
    from sessrec.data.side import FittedSideFeatures, SideFeatures, SideInfoSpec, read_item_vectors
    from sessrec.data.sources import (
        EventLogSource,
        SessionSource,
        SessionSplits,
        SRGNNSource,
        SyntheticSource,
        TimeWindowSource,
        UserSequenceSource,
    )
    from sessrec.data.stream import ScoringStream
    from sessrec.data.synthetic import generate_sessions
    from sessrec.data.vocab import ItemVocab

EXPORTS = {
    "sessrec.data.batch": ["SessionBatch"],
    "sessrec.data.loader": ["SessionLoader"],
    "sessrec.data.merlin": ["MerlinSchema", "MerlinSource", "read_merlin_schema"],
    "sessrec.data.pairs": ["EvalPairs"],
    "sessrec.data.prepared": ["prepare"],
    "sessrec.data.prepared.dataset": ["PreparedSource"],
    "sessrec.data.readers": ["read_events", "read_srgnn", "read_user_sequences"],
    "sessrec.data.schema": ["FeatureSpec", "Schema", "SchemaError"],
    "sessrec.data.side": ["FittedSideFeatures", "SideFeatures", "SideInfoSpec", "read_item_vectors"],
    "sessrec.data.sources": ["EventLogSource", "SRGNNSource", "SessionSource", "SessionSplits", "SyntheticSource",
                             "TimeWindowSource", "UserSequenceSource"],
    "sessrec.data.stream": ["ScoringStream"],
    "sessrec.data.synthetic": ["generate_sessions"],
    "sessrec.data.vocab": ["ItemVocab"],
}
MODULE_OF = {name: module for module, names in EXPORTS.items() for name in names}
SUBMODULES = ("batch", "frame", "loader", "merlin", "pairs", "prepared", "readers", "schema", "side", "sources", "stream", "synthetic", "vocab")
__all__ = sorted(MODULE_OF)


def __getattr__(name: str) -> Any:
    if name in MODULE_OF:
        return getattr(import_module(MODULE_OF[name]), name)
    if name in SUBMODULES:  # ``sessrec.data.frame`` after a bare ``import sessrec.data``
        return import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return [*globals(), *__all__]
