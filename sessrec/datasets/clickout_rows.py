"""Ranking data for `DLRMTask`: click-out rows (`sessrec.datasets.clickouts`) encoded and served in batches.

Categorical ids are fitted on training rows only (`RankingVocab`: 0 = padding, 1 = unseen/rare,
as `ItemVocab`) and saved beside checkpoints. Rows are encoded once into tensors (`RankingTensors`)
and served as `RankingBatch`es by slicing (`RankingLoader`); evaluation batches never split a
click-out. `sessrec.tasks.clickout_data.ClickoutDataModule` builds the rows from the raw log
and splits them by click-out time.

Shape letters: Q click-outs (queries), N rows (click-out x shown hotel), B batch rows,
F sparse features, T filter values, Dd dense features.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from sessrec.data.vocab import ItemVocab
from sessrec.datasets.clickouts import (
    CLICKS,
    MULTI_HOT,
    ONE_HOT,
    SPARSE_FEATURES,
)
from sessrec.embeddings.jagged import SparseFeatures
from sessrec.saved.atomic import ParquetFile


# -- fitted ids ----------------------------------------------------------------------------------
class RankingVocab(ParquetFile):
    """One `ItemVocab` per categorical feature (and the clicked hotels of training), fitted on training rows.

    Saved as one parquet file (``feature``, ``raw_id``, ``count``), written atomically.
    """

    def __init__(self, vocabs: dict[str, ItemVocab]) -> None:
        missing = [f for f in (*SPARSE_FEATURES, CLICKS) if f not in vocabs]
        if missing:
            raise ValueError(f"ranking vocabulary lacks feature {missing[0]!r}")
        self.vocabs = vocabs

    @classmethod
    def empty(cls) -> RankingVocab:
        """A vocabulary of no values (padding and OOV only per feature): what `load_state_dict` fills."""
        return cls({name: ItemVocab.empty() for name in (*SPARSE_FEATURES, CLICKS)})

    @classmethod
    def fit(cls, train: pa.Table, min_count: int = 1) -> RankingVocab:
        """Fit on training rows; `min_count` applies to hotels and cities (the long-tailed ones)."""
        return cls({name: ItemVocab.fit(values, min_count if name in ("hotel", "city") else 1)
                    for name, values in _raw_values(train).items()})

    def grow(self, train: pa.Table) -> RankingVocab:
        """This vocabulary plus the values of `train` (ranking rows) it lacks: every known value keeps
        its id, new ones get the ids after (`ItemVocab.grow`), for retraining on a later window."""
        return RankingVocab({name: self.vocabs[name].grow(values)[0] for name, values in _raw_values(train).items()})

    @property
    def cardinalities(self) -> dict[str, int]:
        """Rows of each sparse feature's table (padding and unseen included)."""
        return {name: len(self.vocabs[name]) for name in SPARSE_FEATURES}

    def to_table(self) -> pa.Table:
        """``feature``, ``raw_id``, ``count``: every feature's vocabulary, one after the other."""
        parts = [
            pa.table({"feature": pa.array([name] * len(v.raw_ids), pa.string()), "raw_id": v.raw_ids.cast(pa.string()),
                      "count": v.counts})
            for name, v in self.vocabs.items()
        ]
        return pa.concat_tables(parts)

    @classmethod
    def from_table(cls, table: pa.Table, path: str | os.PathLike) -> RankingVocab:
        if table.column_names != ["feature", "raw_id", "count"]:
            raise ValueError(f"{path}: not a sessrec ranking vocabulary (columns {table.column_names})")
        feature = table.column("feature").to_numpy(zero_copy_only=False)
        vocabs = {}
        for name in (*SPARSE_FEATURES, CLICKS):
            sel = pa.array(feature == name)
            part = table.filter(sel)
            vocabs[name] = ItemVocab(part.column("raw_id").combine_chunks(), part.column("count").to_numpy())
        try:
            return cls(vocabs)
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from err


def _raw_values(train: pa.Table) -> dict[str, pa.Array]:
    """Every sparse feature's raw values in ranking rows (multi-hot lists flattened), and the clicked hotels, as text."""
    out = {}
    for name in SPARSE_FEATURES:
        values = train.column(name)
        values = pc.list_flatten(values) if name in MULTI_HOT else values
        out[name] = (values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values).cast(pa.string())
    out[CLICKS] = train.filter(pc.equal(train.column("label"), 1)).column("hotel").combine_chunks().cast(pa.string())
    return out


LAYOUT = {"rows": "training rows (the log's click-outs x shown hotels, its window)", "batch_size": "--data.init_args.batch_size",
          "world_size": "data-parallel processes"}  # what a saved position counts in


# -- tensors and batches -------------------------------------------------------------------------
@dataclass
class RankingBatch:
    """A batch of (click-out, shown hotel) rows.

    Args:
        dense: (B, Dd) float32 dense features (`DENSE_FEATURES`).
        sparse: `SparseFeatures` with keys `SPARSE_FEATURES` (one id per row, ``filters`` multi-hot).
        labels: (B,) float32, 1 = the hotel clicked.
        groups: (B,) int64 click-out (query) id of each row; a query's rows are contiguous, and in
            evaluation batches a query is never split across batches.
        baselines: scores of the reference rankers by name, each (B,): ``position`` (-position,
            "as displayed") and ``popularity`` (training clicks of the hotel, ties broken by position).
    """

    dense: torch.Tensor
    sparse: SparseFeatures
    labels: torch.Tensor
    groups: torch.Tensor
    baselines: dict[str, torch.Tensor] = field(default_factory=dict)

    def __len__(self) -> int:
        return self.labels.shape[0]

    def to(self, device: torch.device | str, non_blocking: bool = False) -> RankingBatch:
        move = lambda t: t.to(device, non_blocking=non_blocking)
        sparse = self.sparse.to(device, non_blocking=non_blocking)
        return RankingBatch(move(self.dense), sparse, move(self.labels), move(self.groups),
                            {k: move(v) for k, v in self.baselines.items()})


@dataclass
class RankingTensors:
    """A split as pre-built tensors; batches are slices or `index_select`s of these.

    Args:
        dense: (N, Dd) float32.
        one_hot: (N, len(ONE_HOT)) int64 ids.
        filter_values: (T,) int64 ids of the multi-hot ``filters``; row i's are
            ``filter_values[filter_offsets[i]:filter_offsets[i + 1]]``.
        filter_offsets: (N + 1,) int64.
        labels: (N,) float32.
        groups: (N,) int64 query ids.
        baselines: name -> (N,) float32 scores.
    """

    dense: torch.Tensor
    one_hot: torch.Tensor
    filter_values: torch.Tensor
    filter_offsets: torch.Tensor
    labels: torch.Tensor
    groups: torch.Tensor
    baselines: dict[str, torch.Tensor]

    def __len__(self) -> int:
        return self.labels.shape[0]

    def batch(self, rows: torch.Tensor | slice) -> RankingBatch:
        """The rows (a slice for contiguous ones, else (B,) indices) as a `RankingBatch`."""
        if isinstance(rows, slice):
            start, stop = rows.start, rows.stop
            values = self.filter_values[self.filter_offsets[start]:self.filter_offsets[stop]]
            lengths = self.filter_offsets[start + 1:stop + 1] - self.filter_offsets[start:stop]
            pick = lambda t: t[start:stop]
        else:
            first = self.filter_offsets.index_select(0, rows)
            lengths = self.filter_offsets.index_select(0, rows + 1) - first
            # each chosen row's run of filter values, gathered at once
            run_start = torch.repeat_interleave(first - (torch.cumsum(lengths, 0) - lengths), lengths)
            values = self.filter_values.index_select(0, run_start + torch.arange(int(lengths.sum())))
            pick = lambda t: t.index_select(0, rows)
        one_hot = pick(self.one_hot)  # (B, len(ONE_HOT))
        b = one_hot.shape[0]
        sparse = SparseFeatures(
            keys=SPARSE_FEATURES,
            values=torch.cat([one_hot.t().reshape(-1), values]),  # feature-major
            lengths=torch.cat([torch.ones(b * len(ONE_HOT), dtype=torch.int64), lengths]),
        )
        return RankingBatch(pick(self.dense), sparse, pick(self.labels), pick(self.groups),
                            {k: pick(v) for k, v in self.baselines.items()})


def encode_rows(rows: pa.Table, vocab: RankingVocab) -> RankingTensors:
    """Map a split's raw rows to tensors with the fitted ids (unseen values -> id 1)."""
    ids = [vocab.vocabs[name].encode(rows.column(name).cast(pa.string())).ids for name in ONE_HOT]
    filters = rows.column("filters").combine_chunks()
    flat = pc.list_flatten(filters)
    filter_ids = vocab.vocabs["filters"].encode(flat).ids if len(flat) else np.zeros(0, np.int64)
    lengths = pc.list_value_length(filters).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    num = lambda name: rows.column(name).to_numpy(zero_copy_only=False).astype(np.float64)
    price, n_imp, position = num("price"), num("num_impressions"), num("position")
    log_price = np.log1p(price)
    group = rows.column("query").to_numpy().astype(np.int64)
    mean_log_price = _group_mean(log_price, group)
    interactions, seconds, score = num("interactions"), num("seconds_since"), num("session_score")
    span = np.maximum(n_imp - 1, 1)
    dense = np.stack([
        log_price,
        num("price_rank") / span,
        log_price - mean_log_price,
        position / span,
        np.log1p(n_imp),
        np.log1p(num("prior_actions")),
        (interactions > 0).astype(np.float64),
        np.log1p(interactions),
        num("last_interacted"),
        np.where(np.isnan(seconds), 0.0, np.log1p(np.maximum(np.nan_to_num(seconds), 0.0))),
        np.nan_to_num(score),
        (~np.isnan(score)).astype(np.float64),
    ], axis=1)
    clicks = vocab.vocabs[CLICKS]
    popularity = clicks.id_counts()[clicks.encode(rows.column("hotel").cast(pa.string())).ids].astype(np.float64)
    as_t = lambda a, dtype=torch.float32: torch.from_numpy(np.ascontiguousarray(a)).to(dtype)
    return RankingTensors(
        dense=as_t(dense),
        one_hot=as_t(np.stack(ids, axis=1) if ids else np.zeros((rows.num_rows, 0)), torch.int64),
        filter_values=as_t(filter_ids, torch.int64),
        filter_offsets=as_t(np.r_[0, np.cumsum(lengths)], torch.int64),
        labels=as_t(num("label")),
        groups=as_t(group, torch.int64),
        # popularity ties (most hotels have no training click) are broken by the displayed order
        baselines={"position": as_t(-position), "popularity": as_t(popularity - position / 100.0)},
    )


def _group_mean(values: np.ndarray, group: np.ndarray) -> np.ndarray:
    """(N,) mean of `values` over each row's group."""
    _, inverse, counts = np.unique(group, return_inverse=True, return_counts=True)
    return (np.bincount(inverse, weights=values) / counts)[inverse]


class RankingLoader:
    """Batches of a `RankingTensors`: shuffled `index_select`s in training, whole queries in evaluation.

    Args:
        tensors: the split.
        batch_size: rows per batch (evaluation: about this many, cut at query boundaries so that
            no query is split; a query longer than the batch is a batch of its own).
        shuffle: permute rows every epoch (training), seeded by `seed` and the epoch.
        drop_last: drop a final incomplete training batch.
        seed: base seed of the shuffling.
        rank: this process's index among the data-parallel processes (0 .. world_size - 1).
        world_size: the number of data-parallel processes. In training every
            `world_size`-th row of the epoch's order from row `rank` on (the same number of rows on
            every rank), in evaluation every `world_size`-th batch of whole queries, so that each
            query is scored once.
    """

    def __init__(self, tensors: RankingTensors, batch_size: int, shuffle: bool = False, drop_last: bool = False,
                 seed: int = 0, rank: int = 0, world_size: int = 1) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need world_size >= 1 and 0 <= rank < world_size, got rank {rank} of {world_size}")
        self.tensors, self.batch_size, self.shuffle, self.drop_last, self.seed = tensors, batch_size, shuffle, drop_last, seed
        self.rank, self.world_size = rank, world_size
        self.epoch = 0
        self._current, self._position, self._resume_at = 0, 0, 0  # the epoch iterated, batches handed out, to skip
        n = len(tensors)
        if shuffle:
            self.cuts = None
        else:
            g = tensors.groups.numpy()
            starts = np.r_[np.flatnonzero(np.r_[True, g[1:] != g[:-1]]), n] if n else np.zeros(1, np.int64)
            self.cuts = [0]
            while self.cuts[-1] < n:  # one step per batch: the last query start within batch_size rows
                i = np.searchsorted(starts, self.cuts[-1] + batch_size, side="right") - 1
                if starts[i] <= self.cuts[-1]:  # a query longer than a batch
                    i = np.searchsorted(starts, self.cuts[-1], side="right")
                self.cuts.append(int(starts[i]))
            self.spans = list(zip(self.cuts[:-1], self.cuts[1:]))[rank::world_size]

    def set_epoch(self, epoch: int) -> None:
        """Draw the next training order for `epoch` (the trainer's, so a resumed run shuffles alike)."""
        self.epoch = int(epoch)

    def state_dict(self) -> dict[str, int]:
        """Where the current epoch stands: its number and the batches handed out, with the seed and what the position
        counts in (the rows, the batch size, the processes). Lightning saves it in checkpoints and hands it back on
        resume, so a run killed mid-epoch continues at the next batch of the same order."""
        return {"epoch": self._current, "position": self._position, "seed": self.seed, **self._layout()}

    def _layout(self) -> dict[str, int]:
        return {"rows": len(self.tensors), "batch_size": self.batch_size, "world_size": self.world_size}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue the epoch of `state` after the batches it had handed out; refused for a state shuffled with
        another seed, or one whose batches were cut from other rows or in another way: skipping them here would train
        some rows of the epoch twice and others never."""
        if int(state.get("seed", self.seed)) != self.seed:
            raise ValueError(f"the saved loader state was shuffled with seed {state['seed']}, this loader with {self.seed}: "
                             "resume with the --data.init_args.seed it was trained with")
        for key, mine in self._layout().items() if int(state["position"]) else ():
            saved = int(state.get(key, mine))
            if saved != mine:
                raise ValueError(f"the saved loader state stands {state['position']} batches into epoch {state['epoch']} "
                                 f"with {LAYOUT[key]} {saved}, this loader with {mine}: resume mid-epoch with the rows and "
                                 "batches it was trained with")
        self.epoch, self._resume_at = int(state["epoch"]), int(state["position"])

    def __len__(self) -> int:
        if self.cuts is not None:
            return len(self.spans)
        n = len(self.tensors) // self.world_size
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self) -> Iterator[RankingBatch]:
        skip, self._resume_at, self._position = self._resume_at, 0, 0
        if self.cuts is not None:
            for start, stop in self.spans[skip:]:
                self._position += 1
                yield self.tensors.batch(slice(start, stop))
            return
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        self._current, self.epoch = self.epoch, self.epoch + 1  # without set_epoch, each iteration draws anew
        order = torch.randperm(len(self.tensors), generator=gen)
        order = order[self.rank :: self.world_size][: len(self) * self.batch_size]
        for rows in order.split(self.batch_size)[skip:]:
            self._position += 1
            yield self.tensors.batch(rows)
