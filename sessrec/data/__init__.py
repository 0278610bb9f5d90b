"""Data layer: readers, schema, session building, vocabulary, features, loaders. Imports no model.

The Lightning data modules (`SessionDataModule`, `ClickoutDataModule`) are imported on first use,
so that the data layer, and the embeddings and models built on it, import without Lightning.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from sessrec.data.batch import SessionBatch
from sessrec.data.clickouts import build_clickout_rows
from sessrec.data.criteo import generate_criteo
from sessrec.data.features import (
    Categorify,
    CountEncoding,
    CyclicTime,
    FeaturePipeline,
    HashedCross,
    LogNormalize,
    SessionTimeFeatures,
    TargetEncoding,
)
from sessrec.data.jagged import SparseFeatures
from sessrec.data.loader import SessionLoader
from sessrec.data.merlin import MerlinSchema, MerlinSource, read_merlin_schema
from sessrec.data.pairs import EvalPairs
from sessrec.data.ranking import RankingBatch, RankingVocab
from sessrec.data.readers import read_events, read_srgnn, read_user_sequences
from sessrec.data.schema import FeatureSpec, Schema, SchemaError
from sessrec.data.side import SideFeatures, SideFeatureTransform, SideInfoSpec, read_item_vectors
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
from sessrec.data.trivago import TrivagoSource
from sessrec.data.vocab import ItemVocab

if TYPE_CHECKING:
    from sessrec.data.datamodule import SessionDataModule
    from sessrec.data.ranking_datamodule import ClickoutDataModule

LIGHTNING_MODULES = {"SessionDataModule": "sessrec.data.datamodule", "ClickoutDataModule": "sessrec.data.ranking_datamodule"}


def __getattr__(name: str) -> Any:
    if name in LIGHTNING_MODULES:
        return getattr(import_module(LIGHTNING_MODULES[name]), name)
    raise AttributeError(f"module 'sessrec.data' has no attribute {name!r}")

__all__ = [
    "Categorify",
    "ClickoutDataModule",
    "CountEncoding",
    "CyclicTime",
    "EvalPairs",
    "EventLogSource",
    "FeaturePipeline",
    "FeatureSpec",
    "HashedCross",
    "ItemVocab",
    "LogNormalize",
    "MerlinSchema",
    "MerlinSource",
    "RankingBatch",
    "RankingVocab",
    "SRGNNSource",
    "Schema",
    "SchemaError",
    "ScoringStream",
    "SessionBatch",
    "SessionDataModule",
    "SessionLoader",
    "SessionSource",
    "SessionSplits",
    "SessionTimeFeatures",
    "SideFeatureTransform",
    "SideFeatures",
    "SideInfoSpec",
    "SparseFeatures",
    "SyntheticSource",
    "TargetEncoding",
    "TimeWindowSource",
    "TrivagoSource",
    "UserSequenceSource",
    "build_clickout_rows",
    "generate_criteo",
    "generate_sessions",
    "read_events",
    "read_item_vectors",
    "read_merlin_schema",
    "read_srgnn",
    "read_user_sequences",
]
