"""Full-catalogue ranking metrics for next-item prediction, accumulated over batches.

For one target per row: Recall@K (= HR@K), NDCG@K = 1 / log2(rank + 1) and MRR@K = 1 / rank
when rank <= K, else 0. Ties are broken pessimistically: the rank of the target is 1 + the
number of *other* items scoring at least as high, so a model that scores everything equally
earns nothing. A target that cannot be recommended (padding or OOV, scored -inf) is a miss.

Shape letters: B batch, V items.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torchmetrics import Metric

from sessrec.data.vocab import NUM_SPECIAL


def target_ranks(scores: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """1-based pessimistic rank (B,) of each target in its row of scores (B, V); inf if unrankable."""
    target_score = scores.gather(1, targets.unsqueeze(1))  # (B, 1)
    at_least = (scores >= target_score).sum(dim=1)  # includes the target itself
    ranks = at_least.to(torch.float64)
    unrankable = (targets < NUM_SPECIAL) | ~torch.isfinite(target_score.squeeze(1))
    return ranks.masked_fill(unrankable, float("inf"))


class TopKMetrics(Metric):
    """Recall@K, NDCG@K and MRR@K for several K, summed over batches and reduced across processes.

    Example:
        >>> m = TopKMetrics(ks=[1, 2])
        >>> m.update(torch.tensor([[0., 0., 3., 2., 1.]]), torch.tensor([3]))
        >>> {k: round(float(v), 4) for k, v in m.compute().items()}
        {'recall@1': 0.0, 'ndcg@1': 0.0, 'mrr@1': 0.0, 'recall@2': 1.0, 'ndcg@2': 0.6309, 'mrr@2': 0.5}
    """

    full_state_update = False

    def __init__(self, ks: Sequence[int] = (10, 20)) -> None:
        super().__init__()
        if not ks or min(ks) < 1:
            raise ValueError(f"ks must be positive cut-offs, got {list(ks)}")
        self.ks = sorted(set(int(k) for k in ks))
        n = len(self.ks)
        self.add_state("recall", default=torch.zeros(n, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("ndcg", default=torch.zeros(n, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("mrr", default=torch.zeros(n, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, scores: torch.Tensor, targets: torch.Tensor) -> None:  # type: ignore[override]
        ranks = target_ranks(scores.detach(), targets)  # (B,)
        ks = torch.tensor(self.ks, dtype=torch.float64, device=ranks.device)
        hit = ranks.unsqueeze(0) <= ks.unsqueeze(1)  # (n_k, B)
        finite = torch.where(torch.isfinite(ranks), ranks, torch.ones_like(ranks))
        self.recall += hit.sum(dim=1)
        self.ndcg += (hit * (1.0 / torch.log2(finite + 1.0))).sum(dim=1)
        self.mrr += (hit * (1.0 / finite)).sum(dim=1)
        self.count += ranks.numel()

    def compute(self) -> dict[str, torch.Tensor]:  # type: ignore[override]
        n = self.count.clamp(min=1.0)
        out: dict[str, torch.Tensor] = {}
        for i, k in enumerate(self.ks):
            out[f"recall@{k}"] = (self.recall[i] / n).float()
            out[f"ndcg@{k}"] = (self.ndcg[i] / n).float()
            out[f"mrr@{k}"] = (self.mrr[i] / n).float()
        return out
