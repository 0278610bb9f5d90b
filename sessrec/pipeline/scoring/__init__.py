"""Stage 3, scoring: rankers trained on the candidates of held-out sessions.

`DLRMScorer` (`sessrec.models.DLRM` on the embedding core, trained with a listwise softmax over
each session's candidates), `GBDTScorer` (LightGBM lambdarank) and `BlendScorer` (several of them,
their per-session standardised scores averaged). Each reads `RankingInputs` and returns (B, K)
scores, -inf at empty slots; each fits on `RankerRows`, read a chunk of sessions at a time, or on
one whole `RankingInputs`.
"""

from sessrec.pipeline.scoring.blend_scorer import BlendScorer
from sessrec.pipeline.scoring.dlrm_scorer import DLRMScorer
from sessrec.pipeline.scoring.gbdt_scorer import GBDTScorer
from sessrec.pipeline.scoring.scorer import InputRows, RankerRows, Scorer, early_stopping_split

__all__ = ["BlendScorer", "DLRMScorer", "GBDTScorer", "InputRows", "RankerRows", "Scorer", "early_stopping_split"]
