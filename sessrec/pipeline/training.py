"""Fitting the ranker on held-out sessions, and evaluating a pipeline with the models' protocol.

Leakage. The stage-1 models (session models, kNN, co-visitation) are fitted on the training
split, which ends before the validation sessions begin; the ranker and its feature ops are
fitted on the candidates of the validation sessions only; the test split is touched once, by
`evaluate`. `fit_ranker` records the (prefix, target) pairs it trained on, and
``tests/test_pipeline.py`` checks that no test session is among them.

Metrics: the final list is ranked by the pipeline; a target outside it is a miss, exactly as a
target ranked below the cut-off by a single model, and ties count against the target as in
`sessrec.metrics` (`list_metrics`). Everything runs on the pipeline's device (`Pipeline.device`): the
ranker rows are built there, and the pairs are moved there batch by batch. Shape letters: N pairs,
L positions, K candidates, k recommendations.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from sessrec.pipeline.candidates import Candidates, Sessions
from sessrec.pipeline.pipeline import Pipeline
from sessrec.pipeline.scoring import Scorer


@dataclass
class RankerData:
    """Candidate rows of held-out sessions: the sessions, their (N, K) candidates, 0/1 labels and raw features."""

    sessions: Sessions
    candidates: Candidates
    labels: torch.Tensor
    raw: dict[str, torch.Tensor]
    targets: torch.Tensor

    @property
    def coverage(self) -> float:
        """Share of sessions whose next item is among the candidates (the ranker's ceiling)."""
        return float((self.labels.sum(dim=1) > 0).double().mean())


def candidate_rows(pipe: Pipeline, items: torch.Tensor, targets: torch.Tensor, batch_size: int = 512) -> RankerData:
    """Candidates of every (prefix, target) pair with their raw feature columns, built batch by batch
    on the pipeline's device."""
    parts, raws = [], []
    items, targets = items.to(pipe.device), targets.to(pipe.device)
    for lo in range(0, len(items), batch_size):
        sessions = Sessions(items[lo : lo + batch_size].long())
        cands = pipe.candidates(sessions)
        parts.append(cands)
        raws.append(pipe.features.raw(sessions, cands, pipe.stage_retrievers))
    cands = Candidates(
        torch.cat([p.items for p in parts]),
        {name: torch.cat([p.features[name] for p in parts]) for name in parts[0].features},
    )
    labels = (cands.items == targets.long().unsqueeze(1)) & cands.valid
    raw = {name: torch.cat([r[name] for r in raws]) for name in raws[0]}
    return RankerData(Sessions(items.long()), cands, labels.float(), raw, targets.long())


def fit_ranker(pipe: Pipeline, items: torch.Tensor, targets: torch.Tensor, scorer: Scorer, batch_size: int = 512) -> dict:
    """Fit the feature ops and `scorer` on the candidates of held-out (prefix, target) pairs; set it on `pipe`.

    Returns:
        what was fitted on: pairs, candidate coverage, feature names, seconds.
    """
    start = time.perf_counter()
    data = candidate_rows(pipe, items, targets, batch_size)
    return fit_on(pipe, data, scorer) | {"seconds": time.perf_counter() - start}


def fit_on(pipe: Pipeline, data: RankerData, scorer: Scorer) -> dict:
    """Fit the feature ops and `scorer` on prepared candidate rows (reused across ablations)."""
    inputs = pipe.features.fit_transform(data.sessions, data.candidates, data.raw, data.labels)
    scorer.fit(inputs, data.labels)
    pipe.scorer = scorer
    return {"pairs": len(data.labels), "coverage": data.coverage, "features": inputs.names}


def list_metrics(
    recommended: torch.Tensor, scores: torch.Tensor, targets: torch.Tensor, ks: Sequence[int] = (10, 20)
) -> dict[str, float]:
    """Recall/MRR/NDCG@k of ranked (N, W) lists against (N,) targets: sums, to be divided by N.

    Ties count against the target, as in `sessrec.metrics`: its rank is 1 + the number of other
    listed items scoring at least as high. Unlisted items score no higher than a full list's last
    entry, so a target scoring no higher than that entry counts as a miss (ask for one more item
    than the largest cut-off).

    Example:
        >>> list_metrics(torch.tensor([[4, 7, 9]]), torch.tensor([[3., 2., 2.]]), torch.tensor([9]), ks=[2])
        {'recall@2': 0.0, 'mrr@2': 0.0, 'ndcg@2': 0.0}
    """
    hit = recommended == targets.long().unsqueeze(1)
    found = hit.any(dim=1)
    target_score = torch.where(hit, scores, torch.full_like(scores, float("-inf"))).amax(dim=1, keepdim=True)
    at_least = ((scores >= target_score) & ~hit & (recommended != 0)).sum(dim=1) + 1  # (N,)
    rank = torch.where(found, at_least.double(), torch.full_like(found, float("inf"), dtype=torch.float64))
    # a full list says nothing of the unlisted items that tie with its last entry: count them all against the target
    unknown = (recommended[:, -1] != 0) & (target_score.squeeze(1) <= scores[:, -1])
    rank = torch.where(unknown, torch.full_like(rank, float("inf")), rank)
    out = {}
    for k in ks:
        inside = rank <= k
        out[f"recall@{k}"] = float(inside.sum())
        out[f"mrr@{k}"] = float(torch.where(inside, 1.0 / rank, 0.0).sum())
        out[f"ndcg@{k}"] = float(torch.where(inside, 1.0 / torch.log2(rank + 1.0), 0.0).sum())
    return out


@torch.no_grad()
def evaluate(
    pipe: Pipeline, items: torch.Tensor, targets: torch.Tensor, ks: Sequence[int] = (10, 20), batch_size: int = 512
) -> dict[str, float]:
    """Recall/MRR/NDCG@k of the pipeline's final lists on (prefix, target) pairs, and candidate coverage."""
    totals: dict[str, float] = {}
    covered = 0.0
    for lo in range(0, len(items), batch_size):
        sessions = Sessions(items[lo : lo + batch_size].long()).to(pipe.device)
        target = targets[lo : lo + batch_size].to(pipe.device)
        cands = pipe.score(sessions, pipe.candidates(sessions))
        covered += float((cands.items == target.long().unsqueeze(1)).any(dim=1).sum())
        recs = pipe.ordering.order(sessions, cands, max(ks) + 1)
        for name, value in list_metrics(recs.items, recs.scores, target, ks).items():
            totals[name] = totals.get(name, 0.0) + value
    n = max(len(items), 1)
    return {**{k: v / n for k, v in totals.items()}, "candidate_recall": covered / n}


@torch.no_grad()
def evaluate_rows(pipe: Pipeline, data: RankerData, ks: Sequence[int] = (10, 20), batch_size: int = 1024) -> dict[str, float]:
    """`evaluate` on prepared candidate rows (`candidate_rows` of the test pairs): score, order, metrics.

    The same numbers as `evaluate` for the same pipeline (candidates and raw features are what
    `evaluate` computes itself), without rebuilding the candidates for each ranker compared.
    """
    totals: dict[str, float] = {}
    retrievers = pipe.stage_retrievers
    for lo in range(0, len(data.labels), batch_size):
        rows = slice(lo, lo + batch_size)
        sessions = Sessions(data.sessions.items[rows])
        cands = Candidates(data.candidates.items[rows], {n: v[rows] for n, v in data.candidates.features.items()})
        raw = {n: v[rows] for n, v in data.raw.items()}
        scores = pipe.scorer.score(pipe.features.transform(sessions, cands, retrievers, raw))
        cands = Candidates(cands.items, cands.features, scores.masked_fill(~cands.valid, float("-inf")))
        recs = pipe.ordering.order(sessions, cands, max(ks) + 1)
        for name, value in list_metrics(recs.items, recs.scores, data.targets[rows], ks).items():
            totals[name] = totals.get(name, 0.0) + value
    n = max(len(data.labels), 1)
    return {**{k: v / n for k, v in totals.items()}, "candidate_recall": data.coverage}


@torch.no_grad()
def retrieval_recall(
    pipe: Pipeline, items: torch.Tensor, targets: torch.Tensor, ks: Sequence[int] = (20, 50, 100, 200, 500),
    batch_size: int = 256,
) -> dict[str, dict[str, float]]:
    """Recall@K of each retriever alone (its top-K by its own score), for several K: the ceilings."""
    top = max(ks)
    out: dict[str, dict[str, float]] = {name: dict.fromkeys((f"recall@{k}" for k in ks), 0.0) for name in pipe.retrievers}
    for lo in range(0, len(items), batch_size):
        sessions = Sessions(items[lo : lo + batch_size].long()).to(pipe.device)
        target = targets[lo : lo + batch_size].long().unsqueeze(1).to(pipe.device)
        for name, (retriever, _) in pipe.retrievers.items():
            found = retriever.retrieve(sessions, top).items == target  # (B, top)
            for k in ks:
                out[name][f"recall@{k}"] += float(found[:, :k].any(dim=1).sum())
    n = max(len(items), 1)
    return {name: {k: v / n for k, v in vals.items()} for name, vals in out.items()}
