"""The four-stage pipeline: retrieval -> filtering -> scoring -> ordering, offline and online.

One folder a stage: `retrieval/` (session models through `ExactIndex`/`FaissIndex`, baselines
through `BaselineRetriever`, co-visitation), `filters.py`, `candidate_features.py` + `scoring/`
(DLRM, GBDT and blended rankers), `ordering.py`; `pipeline.py` composes them, `training.py` fits
the ranker and evaluates (`evaluate_pipeline`), `recipe.py` reads a pipeline recipe, `offline.py`
recommends for a file of sessions. See docs/pipeline.md.

Loading and serving a saved pipeline imports no training stack: `PipelineRecipe` (the Lightning
data module) is imported on first use; a recipe file is read by `sessrec.cli.parsers.load_recipe`.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from sessrec.pipeline.candidate_features import CandidateFeatures
from sessrec.pipeline.candidates import Candidates, Recommendations, RequestSessions, Retrieved, merge
from sessrec.pipeline.filters import ItemTableFilter, NonProductFilter, SeenItemsFilter
from sessrec.pipeline.offline import recommend_file
from sessrec.pipeline.ordering import BoostRule, DiversityCap, Ordering, SoftmaxSampling
from sessrec.pipeline.pipeline import Pipeline
from sessrec.pipeline.retrieval.baseline import BaselineRetriever
from sessrec.pipeline.retrieval.covisitation import CoVisitation
from sessrec.pipeline.retrieval.index import ExactIndex, FaissIndex
from sessrec.pipeline.retrieval.session_model import SessionModelRetriever
from sessrec.pipeline.scoring import BlendScorer, DLRMScorer, GBDTScorer
from sessrec.pipeline.training import evaluate_pipeline, fit_ranker, retrieval_recall

if TYPE_CHECKING:
    from sessrec.pipeline.recipe import PipelineRecipe

FIT_TIME = {"PipelineRecipe": "sessrec.pipeline.recipe"}


def __getattr__(name: str) -> Any:
    if name in FIT_TIME:
        return getattr(import_module(FIT_TIME[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BaselineRetriever", "BlendScorer", "BoostRule", "CandidateFeatures", "Candidates", "CoVisitation", "DLRMScorer",
    "DiversityCap", "ExactIndex", "FaissIndex", "GBDTScorer", "ItemTableFilter", "NonProductFilter", "Ordering",
    "Pipeline", "PipelineRecipe", "Recommendations", "RequestSessions", "Retrieved", "SeenItemsFilter",
    "SessionModelRetriever", "SoftmaxSampling", "evaluate_pipeline", "fit_ranker", "merge",
    "recommend_file", "retrieval_recall",
]
