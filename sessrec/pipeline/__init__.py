"""The four-stage pipeline: retrieval -> filtering -> scoring -> ordering, offline and online.

One folder a stage: `retrieval/` (session models through `ExactIndex`/`FaissIndex`, baselines
through `BaselineRetriever`, co-visitation), `filters.py`, `candidate_features.py` + `scoring/`
(DLRM, GBDT and blended rankers), `ordering.py`; `pipeline.py` composes them, `offline.py`
recommends for a file of sessions; `request.py` checks a request (`check_request`, for every entry
point, the server's included) and `clock.py` holds the rule of its two times. See docs/pipeline.md.

This package holds what runs at request time and imports no training stack; fitting a pipeline
(the recipe, the ranker's fit, its evaluation) is `sessrec.pipeline_training`.
"""

from sessrec.pipeline.candidate_features import CandidateFeatures
from sessrec.pipeline.candidates import Candidates, Recommendations, RequestSessions, Retrieved, merge
from sessrec.pipeline.filters import ItemTableFilter, NonProductFilter, SeenItemsFilter
from sessrec.pipeline.offline import recommend_file
from sessrec.pipeline.ordering import BoostRule, DiversityCap, Ordering, SoftmaxSampling
from sessrec.pipeline.pipeline import Pipeline
from sessrec.pipeline.request import Request, check_request
from sessrec.pipeline.retrieval.baseline_retriever import BaselineRetriever
from sessrec.pipeline.retrieval.covisitation import CoVisitation
from sessrec.pipeline.retrieval.index import ExactIndex, FaissIndex
from sessrec.pipeline.retrieval.session_model_retriever import SessionModelRetriever
from sessrec.pipeline.scoring import BlendScorer, DLRMScorer, GBDTScorer

__all__ = [
    "BaselineRetriever", "BlendScorer", "BoostRule", "CandidateFeatures", "Candidates", "CoVisitation", "DLRMScorer",
    "DiversityCap", "ExactIndex", "FaissIndex", "GBDTScorer", "ItemTableFilter", "NonProductFilter", "Ordering",
    "Pipeline", "Recommendations", "Request", "RequestSessions", "Retrieved", "SeenItemsFilter",
    "SessionModelRetriever", "SoftmaxSampling", "check_request", "merge", "recommend_file",
]
