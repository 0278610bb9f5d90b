"""sessrec: session-based and sequential recommendation with transformers."""

from sessrec.data import (
    EventLogSource,
    ItemVocab,
    Schema,
    SchemaError,
    SessionBatch,
    SessionDataModule,
    SRGNNSource,
    SyntheticSource,
    UserSequenceSource,
)
from sessrec.metrics import TopKMetrics
from sessrec.models import (
    BertEncoder,
    CausalLanguageModeling,
    ElectraEncoder,
    GPT2Encoder,
    GRU4RecEncoder,
    MaskedItemModeling,
    PermutationLanguageModeling,
    ReplacedTokenDetection,
    SASRecEncoder,
    SessionModel,
    XLNetEncoder,
)
from sessrec.pipeline import Pipeline
from sessrec.tasks import NextItemTask

__version__ = "0.1.0"

__all__ = [
    "BertEncoder", "CausalLanguageModeling", "ElectraEncoder", "EventLogSource", "GPT2Encoder", "GRU4RecEncoder",
    "ItemVocab", "MaskedItemModeling", "NextItemTask", "Pipeline", "PermutationLanguageModeling", "ReplacedTokenDetection",
    "SASRecEncoder", "SRGNNSource", "Schema", "SchemaError", "SessionBatch", "SessionDataModule", "SessionModel",
    "SyntheticSource", "TopKMetrics", "UserSequenceSource", "XLNetEncoder",
]
