"""Fitting the ranker on held-out sessions, and evaluating a pipeline with the models' protocol.

Leakage. The stage-1 models (session models, kNN, co-visitation) are fitted on the training
split, which ends before the validation sessions begin; the ranker and its feature ops are
fitted on the candidates of the validation sessions only; the test split is touched once, by
`evaluate_pipeline`. `fit_ranker` records the (prefix, target) pairs it trained on, and
``tests/test_pipeline.py`` checks that no test session is among them. Within the validation
pairs, every row keeps the session it was cut from (`EvalPairs.sessions`): the out-of-fold target
encoding and the ranker's early-stopping split put all the prefixes of one session on one side.

Time. Pairs that carry event times (`EvalPairs.times`) reach every stage as `RequestSessions.times`:
validity windows of rule tables hold at the last event of each prefix, and the ranker's ``time``
features are built from them.

Memory and time. The ranker's rows (`RankerData`) keep only the filled candidate slots, as flat
float32 columns, built batch by batch. The feature ops are fitted on them as they are (one frame
row per slot); the features are then built once, `CHUNK` pairs at a time, into one (M', F) matrix
of the slots the scorers read (`FeatureMatrix`), which every member of a blend fits on in turn, and
evaluation reads the rows back batch by batch: no (N, K, F) grid of all pairs is built.

Metrics: the final list is ranked by the pipeline; a target outside it is a miss, exactly as a
target ranked below the cut-off by a single model. The rank of a target is its position in the
list served; in lists served in score order, ties count against the target as in
`sessrec.metrics` (`list_metrics`). Everything runs on the pipeline's device (`Pipeline.device`):
the pairs are moved there batch by batch, and the compact ranker rows are kept on the host.
Shape letters: N pairs, L positions, K candidates, M filled candidate slots, k recommendations.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from sessrec.data.pairs import EvalPairs
from sessrec.metrics.aggregate import cutoffs
from sessrec.metrics.ranks import list_ranks, rank_sums, rank_values
from sessrec.pipeline.candidate_features import RankingInputs
from sessrec.pipeline.candidates import Candidates, RequestSessions
from sessrec.pipeline.pipeline import Pipeline
from sessrec.pipeline.scoring import BlendScorer, RankerRows, Scorer
from sessrec.pipeline.scoring.scorer import slot_positions

CHUNK = 4096  # pairs whose features a scorer's fit reads at once
# pairs as the stages see them: their sessions, (B, K) candidates, and the (M,) raw columns and labels of the filled slots
Block = tuple[RequestSessions, Candidates, dict[str, torch.Tensor], torch.Tensor]


def sessions_of(pairs: EvalPairs) -> RequestSessions:
    """The prefixes of `pairs` as pipeline `RequestSessions`, with their event times when the pairs carry them."""
    return RequestSessions(pairs.items.long(), times=pairs.times)


@dataclass
class RankerData:
    """Candidate rows of (prefix, target) pairs, kept compactly: one entry per filled candidate slot.

    Args:
        pairs: the N (prefix, target) pairs, with their sessions and event times, the prefixes as the stages see
            them (their last ``max_length`` events, `Pipeline.wrap`).
        valid: (N, K) bool, the filled candidate slots of each pair.
        items: (M,) int32 candidate ids of the filled slots, row-major (M = ``valid.sum()``).
        labels: (M,) bool, True where the candidate is its pair's target.
        raw: name -> (M,) float32 raw feature column (`CandidateFeatures.raw`) of the filled slots.
    """

    pairs: EvalPairs
    valid: torch.Tensor
    items: torch.Tensor
    labels: torch.Tensor
    raw: dict[str, torch.Tensor]

    def __post_init__(self) -> None:
        self.offsets = torch.cat([torch.zeros(1, dtype=torch.long, device=self.valid.device), self.valid.sum(dim=1).cumsum(0)])  # (N + 1,)

    def __len__(self) -> int:
        return len(self.pairs)

    @property
    def coverage(self) -> float:
        """Share of pairs whose next item is among the candidates (the ranker's ceiling)."""
        hits = torch.searchsorted(self.offsets, torch.nonzero(self.labels).squeeze(1), right=True) - 1
        return float(len(torch.unique(hits))) / max(len(self), 1)

    def block(self, lo: int, hi: int) -> Block:
        """Pairs ``lo:hi`` as the stages see them: `RequestSessions`, (B, K) `Candidates`, and the (M_b,) raw
        columns and labels of their filled slots."""
        return self._rows(slice(lo, hi), slice(int(self.offsets[lo]), int(self.offsets[min(hi, len(self))])))

    def slots(self, rows: torch.Tensor) -> torch.Tensor:
        """(M_r,) int64 positions of the filled slots of pairs `rows` ((R,) indices), row by row in that order."""
        return slot_positions(self.offsets, rows)

    def take(self, rows: torch.Tensor) -> tuple[RequestSessions, Candidates, dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        """Pairs `rows` ((R,) indices, in that order) as `block` gives them, and the positions of their slots (`slots`)."""
        rows = rows.long().to(self.valid.device)
        slots = self.slots(rows)
        return (*self._rows(rows, slots), slots)

    def _rows(self, rows: slice | torch.Tensor, slots: slice | torch.Tensor) -> Block:
        valid = self.valid[rows]
        items = torch.zeros(valid.shape, dtype=torch.long, device=valid.device)
        items[valid] = self.items[slots].long()
        raw = {name: value[slots] for name, value in self.raw.items()}
        return sessions_of(self.pairs.take(rows)), Candidates(items), raw, self.labels[slots]


class FeatureMatrix(RankerRows):
    """The ranker's training rows for a scorer (`RankerRows`), their features built once and shared by
    every member of a blend and every epoch of a DLRM: (M', F) float32 dense features and (M',) int32
    sparse ids of the slots kept, about 4F + 12 bytes a slot.

    The features are built `chunk` pairs at a time from the compact `RankerData` (its raw columns) with
    the fitted feature ops; the ops' out-of-fold outputs of the training rows (`CandidateFeatures.fit`'s
    return, (M,) per name) replace what `transform` would compute, so the features of a slot are exactly
    its row of `fit_transform`'s grid. The slots kept are those of the pairs whose target is among their
    candidates (the only pairs a scorer trains or stops on) and, with `negatives`, of each such pair its
    target and that many of its other candidates drawn at random (`sampled_slots`); `valid` marks them.
    `inputs` gathers the slots of the pairs asked for into (R, K, F) grids, 0 at the other slots, as
    `transform` gives them.

    Args:
        pipe: the pipeline, its features fitted on `data`.
        data: the compact candidate rows.
        fitted: name -> (M,) out-of-fold outputs over all of `data`'s slots.
        chunk: the most pairs whose features are built (and whose grids are gathered) at once.
        negatives: the candidates other than the target kept per pair (None: all of them).
        seed: seeds the sample of negatives.
    """

    def __init__(self, pipe: Pipeline, data: RankerData, fitted: dict[str, np.ndarray], chunk: int = CHUNK,
                 negatives: int | None = None, seed: int = 0) -> None:
        if pipe.features.names is None:
            raise RuntimeError("FeatureMatrix: fit the pipeline's features on these rows first (CandidateFeatures.fit)")
        if negatives is not None and negatives < 1:
            raise ValueError(f"negatives must be >= 1 candidates per pair (or None: all of them), got {negatives}")
        keep = sampled_slots(data.labels, data.offsets.cpu(), negatives or data.valid.shape[1], seed)  # (M,)
        valid = data.valid.clone()
        valid[data.valid] = keep
        super().__init__(valid.to(pipe.device), data.pairs.sessions.long().to(pipe.device), pipe.features.names, {}, chunk)
        self.host_valid = valid
        self.offsets = torch.cat([torch.zeros(1, dtype=torch.long), valid.sum(dim=1).cumsum(0)])  # (N + 1,) into the kept slots
        dense, sparse, cardinality = [], {}, {}
        for lo in range(0, len(data), chunk):
            hi = min(lo + chunk, len(data))
            first, last = int(data.offsets[lo]), int(data.offsets[hi])
            sessions, cands, raw, _ = to_device(data.block(lo, hi), pipe.device)
            part = {name: values[first:last] for name, values in fitted.items()}
            out = pipe.features.transform(sessions, cands, {}, raw, fitted=part)
            kept = valid[lo:hi].to(out.valid.device)
            dense.append(out.dense[kept].cpu())
            for name, ids in out.sparse.items():
                sparse.setdefault(name, []).append(ids[kept].int().cpu())
            cardinality = out.cardinality
        self.dense = torch.cat(dense) if dense else torch.zeros(0, len(self.names))
        self.sparse = {name: torch.cat(parts) for name, parts in sparse.items()}
        self.cardinality = dict(cardinality)

    def slots(self, rows: torch.Tensor) -> torch.Tensor:
        """(M_r,) int64 positions of the kept slots of pairs `rows` ((R,) indices), row by row in that order."""
        return slot_positions(self.offsets, rows)

    def valid_rows(self, rows: torch.Tensor) -> np.ndarray:
        return self.dense[self.slots(rows)].numpy()

    def _build(self, rows: torch.Tensor) -> RankingInputs:
        valid = self.host_valid[rows.long().cpu()]
        slots = self.slots(rows)
        dense = torch.zeros(*valid.shape, len(self.names))
        dense[valid] = self.dense[slots]
        sparse = {}
        for name, ids in self.sparse.items():
            sparse[name] = torch.zeros(valid.shape, dtype=torch.long)
            sparse[name][valid] = ids[slots].long()
        device = self.device
        return RankingInputs(dense.to(device), {n: v.to(device) for n, v in sparse.items()}, valid.to(device), self.names,
                             self.groups[rows.to(self.groups.device)], self.cardinality)


def sampled_slots(labels: torch.Tensor, offsets: torch.Tensor, negatives: int, seed: int) -> torch.Tensor:
    """(M,) bool, the slots kept of pairs whose slots are ``offsets[i]:offsets[i + 1]`` of (M,) `labels`:
    of each pair with a positive, its positives and `negatives` of its other slots drawn at random (all of
    them when it has fewer); nothing of a pair without a positive.

    Examples:
        >>> labels = torch.tensor([False, True, False, False, False, False])  # pairs of 4 and 2 slots, one positive
        >>> keep = sampled_slots(labels, torch.tensor([0, 4, 6]), negatives=2, seed=0)
        >>> bool(keep[1]), int(keep[:4].sum()), int(keep[4:].sum())
        (True, 3, 0)
    """
    counts = offsets.diff()
    pair = torch.repeat_interleave(torch.arange(len(counts)), counts)  # (M,)
    key = torch.rand(len(labels), generator=torch.Generator().manual_seed(seed))
    key[labels] = -1.0  # positives first within their pair
    order = torch.argsort(key)
    order = order[torch.argsort(pair[order], stable=True)]  # by pair, within a pair positives then at random
    rank = torch.arange(len(labels)) - offsets[pair[order]]  # place within its pair
    positives = torch.zeros(len(counts), dtype=torch.long).index_add_(0, pair, labels.long())
    keep = torch.zeros(len(labels), dtype=torch.bool)
    keep[order] = (rank < negatives + positives[pair[order]]) & (positives[pair[order]] > 0)
    return keep


def candidate_rows(pipe: Pipeline, pairs: EvalPairs, batch_size: int = 512) -> RankerData:
    """Candidates of every (prefix, target) pair with their raw feature columns, built batch by batch
    and kept compactly (the filled slots only, float32). The prefixes are read as a served session is
    (`Pipeline.wrap`): the stages see their last ``max_length`` events, the filters of everything seen up to
    ``history_length``; the rows keep the pairs as the stages see them."""
    valid, items, labels, raws = [], [], [], {}
    for lo in range(0, len(pairs), batch_size):
        part = pairs.take(slice(lo, lo + batch_size))
        sessions = pipe.wrap(part.items, part.times).to(pipe.device)
        cands = pipe.candidates(sessions)
        filled = cands.valid
        valid.append(filled.cpu())
        items.append(cands.items[filled].int().cpu())
        labels.append((cands.items == part.targets.to(cands.items.device).long().unsqueeze(1))[filled].cpu())
        for name, value in pipe.features.raw(sessions, cands, pipe.stage_retrievers).items():
            raws.setdefault(name, []).append(value[filled].float().cpu())
    raw = {name: torch.cat(raws.pop(name)) for name in list(raws)}  # one column at a time: no second copy of all
    width = pipe.max_candidates
    cat = lambda parts, empty: torch.cat(parts) if parts else empty  # noqa: E731
    if pairs.items.shape[1] != pipe.max_length:  # pairs of another width: kept as the stages see them
        served = pipe.wrap(pairs.items, pairs.times)
        pairs = replace(pairs, items=served.items.to(pairs.items.dtype), times=served.times)
    return RankerData(pairs, cat(valid, torch.zeros(0, width, dtype=torch.bool, device="cpu")), cat(items, torch.zeros(0, dtype=torch.int32, device="cpu")),
                      cat(labels, torch.zeros(0, dtype=torch.bool, device="cpu")), raw)


def to_device(block: Block, device: torch.device) -> Block:
    """A `RankerData.block` on `device`."""
    sessions, cands, raw, labels = block
    cands = Candidates(cands.items.to(device), {n: v.to(device) for n, v in cands.features.items()})
    return sessions.to(device), cands, {n: v.to(device) for n, v in raw.items()}, labels.to(device)


def fit_ranker(pipe: Pipeline, pairs: EvalPairs, scorer: Scorer, batch_size: int = 512, chunk: int = CHUNK,
               negatives: int | None = None, log: Callable[[str], None] | None = None) -> dict:
    """Fit the feature ops and `scorer` on the candidates of held-out (prefix, target) pairs; set it on `pipe`.

    Args:
        negatives: the candidates other than the target that the scorer trains on per pair, drawn at
            random (None: all of them); the feature ops are fitted on all candidates either way.
        log: called with one line as each step ends (the candidates, the feature ops, the features,
            each ranker), with its seconds.

    Returns:
        what was fitted on: pairs, candidate coverage, feature names, rows the scorer read, seconds of each step and in all.
    """
    start = time.perf_counter()
    data = candidate_rows(pipe, pairs, batch_size)
    seconds = time.perf_counter() - start
    if log is not None:
        log(f"candidates of {len(data):,} pairs ({int(data.valid.sum()):,} rows): {seconds:.0f} s")
    info = fit_on(pipe, data, scorer, chunk, negatives, log=log)
    info["steps"] = {"candidates": seconds, **info["steps"]}
    return info | {"seconds": time.perf_counter() - start}


def fit_on(pipe: Pipeline, data: RankerData, scorer: Scorer, chunk: int = CHUNK, negatives: int | None = None,
           seed: int = 0, log: Callable[[str], None] | None = None) -> dict:
    """Fit the feature ops and `scorer` on prepared candidate rows (reused across ablations).

    The ops are fitted on all the compact rows (one frame row per filled slot); the features are then
    built once (`FeatureMatrix`: the pairs whose target is among their candidates, with `negatives`
    sampled negatives each, seeded by `seed`) and every ranker (each member of a `BlendScorer`, in turn)
    fits on that matrix. The target encoding folds and the scorers' early-stopping splits go by the
    pairs' sessions. `log` (`fit_ranker`) gets one line as each step ends.
    """
    steps: dict[str, float] = {}

    def done(step: str, line: str, began: float) -> None:
        steps[step] = time.perf_counter() - began
        if log is not None:
            log(f"{line}: {steps[step]:.0f} s")

    began = time.perf_counter()
    sessions, cands, raw, labels = data.block(0, len(data))
    fitted = pipe.features.fit(sessions, cands, raw, labels, groups=data.pairs.sessions)
    del sessions, cands, raw
    done("feature_ops", f"feature ops fitted on {len(labels):,} rows", began)
    began = time.perf_counter()
    rows = FeatureMatrix(pipe, data, fitted, chunk, negatives, seed)
    del fitted
    done("features", f"{len(rows.names)} features of the {len(rows.dense):,} rows the rankers read, built once", began)
    grid = torch.zeros(data.valid.shape, device=pipe.device)  # (N, K) labels
    grid[data.valid.to(pipe.device)] = labels.to(pipe.device).float()
    members = scorer.scorers if isinstance(scorer, BlendScorer) else [scorer]
    for i, member in enumerate(members):
        began = time.perf_counter()
        member.fit(rows, grid)
        done(f"ranker_{i}", f"ranker {i + 1}/{len(members)} {type(member).__name__} fitted", began)
    pipe.scorer = scorer
    return {"pairs": len(data), "coverage": data.coverage, "features": rows.names, "rows": len(rows.dense), "steps": steps}


def list_metrics(
    recommended: torch.Tensor, scores: torch.Tensor, targets: torch.Tensor, ks: Sequence[int] = (10, 20),
    by_score: bool = True,
) -> dict[str, float]:
    """Recall/MRR/NDCG@k of served (N, W) lists against (N,) targets: sums, to be divided by N.

    Args:
        recommended: (N, W) item ids as served, 0 at empty slots.
        scores: (N, W) their scores.
        targets: (N,) the items to find.
        ks: cut-offs.
        by_score: the lists are served in score order (the top-k by score, `Ordering.by_score`).
            Ties count against the target (`sessrec.metrics.list_ranks`); a target scoring no
            higher than a full list's last entry counts as a miss (ask for one more item than the
            largest cut-off). False: the lists are served in another order (sampled,
            `SoftmaxSampling`), and the rank of a target is its position in the list.

    Examples:
        >>> list_metrics(torch.tensor([[4, 7, 9]]), torch.tensor([[3., 2., 2.]]), torch.tensor([9]), ks=[2])
        {'recall@2': 0.0, 'ndcg@2': 0.0, 'mrr@2': 0.0}
        >>> list_metrics(torch.tensor([[4, 9, 7]]), torch.tensor([[3., 1., 2.]]), torch.tensor([9]), ks=[2], by_score=False)
        {'recall@2': 1.0, 'ndcg@2': 0.6309297535714575, 'mrr@2': 0.5}
    """
    return {name: float(value) for name, value in rank_sums(list_ranks(recommended, scores, targets, by_score), ks).items()}


def evaluate_pipeline(pipe: Pipeline, pairs: EvalPairs, ks: Sequence[int] = (10, 20), batch_size: int = 512) -> dict[str, float]:
    """Recall/MRR/NDCG@k of the pipeline's final lists on (prefix, target) pairs, and candidate coverage.

    The prefixes are read as a served session is (`Pipeline.wrap`): the stages see their last ``max_length`` events,
    the filters of everything seen up to ``history_length`` (pairs that wide: ``pairs(split, width=history_length)``).
    The sessions carry the pairs' event times when they have them (validity windows, time features).
    Cut-offs that are no positive integers, or no pairs, are a ValueError.
    """
    ks = cutoffs(ks)
    if not len(pairs):
        raise ValueError("evaluate_pipeline: no (prefix, target) pairs to evaluate")
    totals: dict[str, float] = {}
    covered = 0.0
    for lo in range(0, len(pairs), batch_size):
        part = pairs.take(slice(lo, lo + batch_size))
        sessions = pipe.wrap(part.items, part.times).to(pipe.device)
        cands = pipe.score(sessions, pipe.candidates(sessions))
        target = part.targets.to(pipe.device)
        covered += float((cands.items == target.long().unsqueeze(1)).any(dim=1).sum())
        recs = pipe.ordering.order(sessions, cands, max(ks) + 1)
        for name, value in list_metrics(recs.items, recs.scores, target, ks, pipe.ordering.by_score).items():
            totals[name] = totals.get(name, 0.0) + value
    n = len(pairs)
    return {**{k: v / n for k, v in totals.items()}, "candidate_recall": covered / n}


@torch.no_grad()
def evaluate_rows(pipe: Pipeline, data: RankerData, ks: Sequence[int] = (10, 20), batch_size: int = 1024) -> dict[str, float]:
    """`evaluate_pipeline` on prepared candidate rows (`candidate_rows` of the test pairs): score, order, metrics.

    The same numbers as `evaluate_pipeline` for the same pipeline (candidates and raw features are what
    `evaluate_pipeline` computes itself), without rebuilding the candidates for each ranker compared.
    """
    ks = cutoffs(ks)
    if not len(data):
        raise ValueError("evaluate_rows: no candidate rows to evaluate")
    totals: dict[str, float] = {}
    retrievers = pipe.stage_retrievers
    for lo in range(0, len(data), batch_size):
        sessions, cands, raw, _ = to_device(data.block(lo, lo + batch_size), pipe.device)
        scores = pipe.scorer.score(pipe.features.transform(sessions, cands, retrievers, raw))
        cands = Candidates(cands.items, cands.features, scores.masked_fill(~cands.valid, float("-inf")))
        recs = pipe.ordering.order(sessions, cands, max(ks) + 1)
        targets = data.pairs.targets[lo : lo + batch_size].to(pipe.device)
        for name, value in list_metrics(recs.items, recs.scores, targets, ks, pipe.ordering.by_score).items():
            totals[name] = totals.get(name, 0.0) + value
    n = len(data)
    return {**{k: v / n for k, v in totals.items()}, "candidate_recall": data.coverage}


@torch.no_grad()
def retrieval_recall(
    pipe: Pipeline, items: torch.Tensor, targets: torch.Tensor, ks: Sequence[int] = (20, 50, 100, 200, 500),
    batch_size: int = 256,
) -> dict[str, dict[str, float]]:
    """Recall@K of each retriever alone (its top-K by its own score), for several K: the ceilings.
    Cut-offs that are no positive integers, or no sessions, are a ValueError."""
    ks = cutoffs(ks)
    if not len(items):
        raise ValueError("retrieval_recall: no sessions to evaluate")
    top = max(ks)
    out: dict[str, dict[str, float]] = {name: dict.fromkeys((f"recall@{k}" for k in ks), 0.0) for name in pipe.retrievers}
    for lo in range(0, len(items), batch_size):
        sessions = RequestSessions(items[lo : lo + batch_size].long()).to(pipe.device)
        target = targets[lo : lo + batch_size].long().unsqueeze(1).to(pipe.device)
        for name, (retriever, _) in pipe.retrievers.items():
            found = retriever.retrieve(sessions, top)
            ranks = list_ranks(found.items, found.scores, target.squeeze(1), by_score=False)  # (B,) its place in the list
            for k in ks:
                out[name][f"recall@{k}"] += float(rank_values(ranks, f"recall@{k}").sum())
    n = len(items)
    return {name: {k: v / n for k, v in vals.items()} for name, vals in out.items()}
