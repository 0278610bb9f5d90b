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
from sessrec.models import MaskedItemModeling, SessionModel, XLNetEncoder
from sessrec.tasks import NextItemTask

__version__ = "0.1.0"

__all__ = [
    "EventLogSource", "ItemVocab", "MaskedItemModeling", "NextItemTask", "SRGNNSource", "Schema", "SchemaError",
    "SessionBatch", "SessionDataModule", "SessionModel", "SyntheticSource", "TopKMetrics", "UserSequenceSource",
    "XLNetEncoder",
]
