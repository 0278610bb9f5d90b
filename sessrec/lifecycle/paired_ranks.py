"""Test metrics pair by pair: what the retraining gate compares between models.

A task's test metric is a mean over test pairs: over (prefix, next item) pairs for a `NextItemTask`
(`sessrec.metrics`), over clicked rows within their click-out for a `DLRMTask`
(`sessrec.metrics.RankingMetrics`). `PairRanks` keeps the rank of every pair's target, keyed by where the
pair comes from, so that two models evaluated on the same splits, each read with its own
vocabulary, are compared pair by pair (`aligned`): an item a model never saw is a miss for it.

The per-pair values (`PairRanks.values`) are `sessrec.metrics.rank_values`, the formulas the metric
classes sum; `PairRanks.values` checks their mean against the metric class's own aggregate of the
same pass.

Shape letters: P test pairs.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pyarrow as pa
import torch

from sessrec.data import frame
from sessrec.metrics import RankingMetrics, TopKMetrics, clicked_ranks, rank_values, target_ranks
from sessrec.tasks import NextItemTask
from sessrec.tasks.dlrm_task import DLRMTask
from sessrec.tasks.next_item import next_item_scores
from sessrec.tasks.session_data import SessionDataModule

if TYPE_CHECKING:
    from sessrec.tasks.clickout_data import ClickoutDataModule

AGREEMENT = 1e-6  # per-pair means and the metric classes' aggregates (float32) agree to this


@dataclass(frozen=True)
class PairRanks:
    """The rank of every test pair's target under one model, and that model's aggregate test metrics.

    Args:
        sessions: (P,) where each pair comes from: the session id (next item) or click-out (query) id.
        positions: (P,) 0-based position of the target within its session (next item) or list (click-out).
        ranks: (P,) float64 1-based pessimistic rank of the target; inf when the model cannot rank it.
        metrics: the task's own test metrics on the same pass (its metric class), by name.
    """

    sessions: np.ndarray
    positions: np.ndarray
    ranks: np.ndarray
    metrics: dict[str, float]

    def __len__(self) -> int:
        return len(self.ranks)

    def values(self, metric: str) -> np.ndarray:
        """(P,) per-pair values of `metric` (`sessrec.metrics.rank_values`), checked against the task's aggregate
        when it has one."""
        values = rank_values(torch.from_numpy(np.asarray(self.ranks, dtype=np.float64)), metric).numpy()
        if metric in self.metrics and len(values) and abs(values.mean() - self.metrics[metric]) > AGREEMENT:
            raise RuntimeError(
                f"the per-pair {metric} averages {values.mean():.7f} but the task's metric is {self.metrics[metric]:.7f}: "
                "sessrec.lifecycle.paired_ranks and the metric class compute it differently"
            )
        return values


def aligned(named: dict[str, PairRanks]) -> int:
    """The number of test pairs when every model's pairs are the same pairs in the same order; else ValueError."""
    (first, reference), *others = named.items()
    for name, ranks in others:
        same = len(ranks) == len(reference) and np.array_equal(ranks.sessions, reference.sessions) and np.array_equal(
            ranks.positions, reference.positions
        )
        if not same:
            raise ValueError(
                f"the test pairs of {name} ({len(ranks)}) are not those of {first} ({len(reference)}) in the same order: "
                "the models cannot be compared pair by pair"
            )
    return len(reference)


class ProtocolPairs(NamedTuple):
    """The (prefix, next item) pairs of a test split under an evaluation protocol: the split's flat item `values`
    and their `virtual` flags, and each pair's `session` row, target index in the values (`target_at`) and target
    `position` within its session."""

    values: pa.Array
    virtual: np.ndarray
    session: np.ndarray
    target_at: np.ndarray
    position: np.ndarray


def protocol_pairs(test: pa.Table, protocol: str) -> ProtocolPairs:
    """The pairs `frame.expand_prefixes` cuts from a test split under `protocol`."""
    values, offsets = frame.list_offsets(test.column(frame.ITEMS))
    virtual = frame.virtual_flags(test)
    session, target_at = frame.expand_prefixes(offsets, protocol, frame.target_flags(test, virtual))
    return ProtocolPairs(values, virtual, session, target_at, (target_at - offsets[:-1][session]).astype(np.int64))


@torch.no_grad()
def next_item_ranks(task: NextItemTask, data: SessionDataModule) -> PairRanks:
    """The rank of each test (prefix, next item) target under `task`, the way its ``trainer.test`` scores it.

    `data` must read the test split with `task`'s vocabulary (``vocab_path`` of its model directory) and, for a
    task whose encoder reads event times, with them (``times=True``).
    Scores are `next_item_scores` (the input session's items excluded when the task's evaluation says
    so), on the device of `task`'s parameters, in eval mode.
    """
    test = data.splits.test
    values, virtual, session, target_at, position = protocol_pairs(test, data.eval_protocol)
    _, targets = data.tensors("test")
    expected = data.vocab.encode(values, virtual=virtual).ids[target_at]
    if targets is None or not np.array_equal(targets.numpy(), expected):
        raise RuntimeError(
            f"{data.splits.source} (test split): the data module's test pairs are not the "
            f"{len(target_at)} pairs of the {data.eval_protocol!r} protocol; they cannot be keyed by session and position"
        )
    ids = test.column(frame.SESSION).to_numpy() if frame.SESSION in test.column_names else np.arange(test.num_rows)
    device = next(task.parameters()).device
    metric = TopKMetrics(task.evaluation.ks).to(device)
    ranks = []
    for batch in evaluation_batches(task, data, device):
        features = task.model.batch_features(batch)  # side features, and event times for an encoder that reads them
        scores = next_item_scores(task.model, task.objective, batch.items, features, task.evaluation.exclude_seen)
        metric.update(scores, batch.targets)
        ranks.append(target_ranks(scores, batch.targets).cpu())
    return PairRanks(
        sessions=np.asarray(ids)[session], positions=position,
        ranks=torch.cat(ranks).numpy() if ranks else np.zeros(0), metrics=_floats(metric.compute()),
    )


@torch.no_grad()
def clickout_ranks(task: DLRMTask, data: ClickoutDataModule) -> PairRanks:
    """The rank of each clicked row within its click-out's list under a `DLRMTask`, as its ``trainer.test`` ranks it.

    `data` is a `ClickoutDataModule` reading the test split with `task`'s vocabulary. Click-outs without a
    click are left out (as in the task's MRR). Keyed by click-out (``query``) and the clicked row's
    ``position`` in the list.
    """
    rows = data.rows["test"]
    clicked = rows.column("label").to_numpy(zero_copy_only=False) > 0.5
    device = next(task.parameters()).device
    metric = RankingMetrics(list(task.evaluation.ks)).to(device)
    ranks = []
    for batch in evaluation_batches(task, data, device):
        logits = task(batch)
        metric.update(logits, batch.labels, batch.groups)
        ranks.append(clicked_ranks(logits.detach().float(), batch.labels, batch.groups).cpu())
    found = torch.cat(ranks).numpy() if ranks else np.zeros(0)
    if len(found) != int(clicked.sum()):
        raise RuntimeError(f"{data.path} (test split): {len(found)} clicks ranked, {int(clicked.sum())} clicked rows")
    column = lambda name: rows.column(name).to_numpy(zero_copy_only=False)[clicked].astype(np.int64)
    return PairRanks(sessions=column("query"), positions=column("position"), ranks=found, metrics=_floats(metric.compute()))


def evaluation_batches(task: torch.nn.Module, data: Any, device: torch.device) -> Iterator[Any]:
    """The test split's batches on `device`, with `task` in eval mode meanwhile (its mode restored after)."""
    was_training = task.training
    task.eval()
    try:
        for batch in data.test_dataloader():
            yield batch.to(device)
    finally:
        task.train(was_training)


def _floats(metrics: dict[str, torch.Tensor]) -> dict[str, float]:
    return {name: float(value) for name, value in metrics.items()}

