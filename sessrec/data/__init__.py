"""Data layer: schema, readers, frame operations, vocabulary, sources (Merlin/NVTabular directories
among them), loaders, streams, evaluation pairs, side information, synthetic sessions and prepared
datasets (`prepare`, `PreparedSource`).
Imports no model and no Lightning.
"""

from sessrec.data.batch import SessionBatch
from sessrec.data.loader import SessionLoader
from sessrec.data.merlin import MerlinSchema, MerlinSource, read_merlin_schema
from sessrec.data.pairs import EvalPairs
from sessrec.data.prepared import prepare
from sessrec.data.prepared.dataset import PreparedSource
from sessrec.data.readers import read_events, read_user_sequences
from sessrec.data.schema import FeatureSpec, Schema, SchemaError, VirtualSpec
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
from sessrec.data.srgnn import read_srgnn
from sessrec.data.stream import ScoringStream
from sessrec.data.streaming import StreamingLoader
from sessrec.data.synthetic import generate_sessions
from sessrec.data.vocab import ItemVocab

__all__ = [
    "EvalPairs", "EventLogSource", "FeatureSpec", "FittedSideFeatures", "ItemVocab", "MerlinSchema", "MerlinSource",
    "PreparedSource", "SRGNNSource", "ScoringStream", "Schema", "SchemaError", "SessionBatch", "SessionLoader", "SessionSource",
    "SessionSplits", "SideFeatures", "SideInfoSpec", "StreamingLoader", "SyntheticSource", "TimeWindowSource", "UserSequenceSource", "VirtualSpec",
    "generate_sessions", "prepare", "read_events", "read_item_vectors", "read_merlin_schema", "read_srgnn", "read_user_sequences",
]
