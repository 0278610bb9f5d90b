"""Data layer: readers, schema, session building, vocabulary, loaders. Imports no model."""

from sessrec.data.batch import SessionBatch
from sessrec.data.datamodule import SessionDataModule
from sessrec.data.loader import SessionLoader
from sessrec.data.readers import read_events, read_srgnn, read_user_sequences
from sessrec.data.schema import FeatureSpec, Schema, SchemaError
from sessrec.data.sources import (
    EventLogSource,
    SessionSource,
    SessionSplits,
    SRGNNSource,
    SyntheticSource,
    UserSequenceSource,
)
from sessrec.data.stream import ScoringStream
from sessrec.data.synthetic import generate_sessions
from sessrec.data.vocab import ItemVocab

__all__ = [
    "EventLogSource", "FeatureSpec", "ItemVocab", "SRGNNSource", "Schema", "SchemaError", "ScoringStream",
    "SessionBatch", "SessionDataModule", "SessionLoader", "SessionSource", "SessionSplits", "SyntheticSource",
    "UserSequenceSource", "generate_sessions", "read_events", "read_srgnn", "read_user_sequences",
]
