"""Rank metrics, in one place: next-item tasks, click-out ranking, the pipeline's served lists, the
ranker's early stopping and the retraining gate all compute them here.

Every metric is a function of the 1-based rank of a target (`rank_values`): Recall@K (= HR@K)
is 1, NDCG@K = 1 / log2(rank + 1) and MRR@K = 1 / rank when rank <= K, else 0; ``mrr`` (no
cut-off) is 1 / rank. A rank of inf is a miss. The ranks come from

- `target_ranks`: a target among a full catalogue row of scores (`TopKMetrics`);
- `clicked_ranks`: a clicked row among the rows of its query (`RankingMetrics`);
- `list_ranks`: a target within a served list (the pipeline's evaluation);
- `pessimistic_ranks`: the shared rule below, for any row of scores and a target score.

Ties are broken pessimistically everywhere: the rank of the target is 1 + the number of *other*
candidates scoring at least as high (or NaN), so a model that scores everything equally earns nothing.
A target that cannot be recommended (padding or OOV, scored -inf, an item of the session under
``exclude_seen``) is a miss, and `TopKMetrics` reports the share of such targets as ``unrankable``. AUC is torchmetrics'
binary AUROC (`binary_auc`), tied scores counted half.

Two modules: `ranks` (plain torch: the ranks and the values of ranks; what the pipeline and the
server import) and `aggregate` (torchmetrics: `TopKMetrics`, `RankingMetrics`, `binary_auc`,
imported on first use).
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from sessrec.metrics.ranks import (
    clicked_ranks,
    list_ranks,
    pessimistic_ranks,
    rank_sums,
    rank_values,
    target_ranks,
)

if TYPE_CHECKING:
    from sessrec.metrics.aggregate import RankingMetrics, TopKMetrics, binary_auc

AGGREGATE = ("RankingMetrics", "TopKMetrics", "binary_auc")


def __getattr__(name: str) -> Any:
    if name in AGGREGATE:
        return getattr(import_module("sessrec.metrics.aggregate"), name)
    raise AttributeError(f"module 'sessrec.metrics' has no attribute {name!r}")


__all__ = [
    "RankingMetrics", "TopKMetrics", "binary_auc", "clicked_ranks", "list_ranks", "pessimistic_ranks", "rank_sums",
    "rank_values", "target_ranks",
]
