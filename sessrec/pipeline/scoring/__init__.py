"""Stage 3, scoring: rankers trained on the candidates of held-out sessions.

`DLRMScorer` (the default: `sessrec.models.DLRM` on the embedding core, trained with a listwise
softmax over each session's candidates) and `GBDTScorer` (LightGBM lambdarank). Both read
`RankingInputs` and return (B, K) scores, -inf at empty slots.
"""

from sessrec.pipeline.scoring.base import Scorer, early_stopping_split
from sessrec.pipeline.scoring.dlrm import DLRMScorer
from sessrec.pipeline.scoring.gbdt import GBDTScorer

__all__ = ["DLRMScorer", "GBDTScorer", "Scorer", "early_stopping_split"]
