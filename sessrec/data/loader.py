"""Columnar session loader: batches are slices of padded tensors, never per-sample lookups.

The sessions of a split are held in host memory as one right-aligned (N, L) int32 tensor (and
one (N, L) tensor per side feature and, when given, one of event times, aligned with it). An epoch is a permutation of rows
(optionally of contiguous chunks of rows); each batch is one row gather per tensor, trimmed to
the longest session in it. No `Dataset.__getitem__`, no collate: no Python call per session.

A batch is only a few gathers, so fixed per-call overhead is a large share of its cost: the
gathers go through NumPy views of the tensors' memory (`ndarray.take` has less fixed overhead
than `Tensor.index_select`'s dispatch) and come back as tensors with `torch.from_numpy`, without
a copy. Figures against a per-item `DataLoader`: ``docs/benchmarks.md``, Loader.

Shape letters: N sessions, L padded length, B batch.
"""

from __future__ import annotations

import atexit
from collections.abc import Iterator
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

from sessrec.data.batch import SessionBatch


class SessionLoader:
    """Iterate over `SessionBatch`es of a padded session matrix.

    Args:
        items: (N, L) tensor of right-aligned item ids (int32 from `SessionDataModule`, any integer dtype), 0 = padding;
            in host memory, or on an accelerator (see `gather`).
        targets: optional (N,) next-item targets (evaluation pairs).
        features: optional side features by name, each (N, L) aligned with `items`; batches
            carry the same rows and columns of them.
        times: optional (N, L) event times aligned with `items` (float64 seconds, 0 on padding);
            batches carry the same rows and columns of them as `SessionBatch.times`.
        batch_size: sessions per batch.
        shuffle: permute rows every epoch (seeded by `seed` and the epoch number).
        shuffle_chunk: when > 1, permute contiguous chunks of this many rows instead of single rows
            (cache-friendlier on very large splits); rows inside a chunk keep their order.
        bucket_batches: when > 0 (with `shuffle`), batches of similar lengths: the shuffled rows are cut
            into pools of this many batches, each pool is sorted by session length (ties keep the
            shuffled order) and cut into batches, and the epoch's full batches are shuffled (the
            incomplete one stays last). Every row still comes once an epoch and the order is seeded;
            a batch is trimmed to its longest session, so a padded encoder computes close to the real
            items only. Each batch's loss then averages targets of like sessions (short sessions' targets
            weigh more per step than in mixed batches).
        drop_last: drop a final incomplete batch.
        pin_memory: return batches in pinned memory for faster host-to-GPU copies.
        seed: base seed of the shuffling.
        rank: this process's index among the data-parallel processes (0 .. world_size - 1).
        world_size: the number of data-parallel processes. Every rank draws the
            same epoch order and keeps every `world_size`-th row of it from row `rank` on, so the
            ranks' rows are disjoint and, together, every row. A shuffled (training) loader
            gives every rank the same number of rows, as data-parallel steps must match: the
            remainder of the division, under `world_size` rows, sits out that epoch (other rows
            each epoch).
        gather: how batches are cut: ``numpy`` (host tensors: NumPy `take` on views, the fastest on
            CPU) or ``torch`` (`index_select` on the tensors' own device). None: NumPy for host
            tensors, torch for tensors on an accelerator. With the split on a GPU (the NVTabular
            idea) batches are gathered there, with no copy from the host per batch.
    """

    def __init__(
        self,
        items: torch.Tensor,
        targets: torch.Tensor | None = None,
        features: dict[str, torch.Tensor] | None = None,
        times: torch.Tensor | None = None,
        batch_size: int = 256,
        shuffle: bool = False,
        shuffle_chunk: int = 1,
        bucket_batches: int = 0,
        drop_last: bool = False,
        pin_memory: bool = False,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        gather: Literal["numpy", "torch"] | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need world_size >= 1 and 0 <= rank < world_size, got rank {rank} of {world_size}")
        for name, value in (features or {}).items():
            if value.shape != items.shape:
                raise ValueError(f"side feature {name!r} has shape {tuple(value.shape)}, items {tuple(items.shape)}")
        if times is not None and times.shape != items.shape:
            raise ValueError(f"times has shape {tuple(times.shape)}, items {tuple(items.shape)}")
        for name, value in {"targets": targets, "times": times, **(features or {})}.items():
            if value is not None and value.device != items.device:
                raise ValueError(f"SessionLoader: {name!r} is on {value.device} but the items are on {items.device}")
        if bucket_batches < 0 or (bucket_batches and (not shuffle or shuffle_chunk > 1)):
            raise ValueError(f"bucket_batches needs shuffle and shuffle_chunk 1 and must be >= 0, got {bucket_batches}")
        if gather not in (None, "numpy", "torch"):
            raise ValueError(f"gather must be None, 'numpy' or 'torch', got {gather!r}")
        if gather == "numpy" and items.device.type != "cpu":
            raise ValueError(f"gather='numpy' reads host memory, but the items are on {items.device}")
        self.gather = gather or ("numpy" if items.device.type == "cpu" else "torch")
        self.items, self.targets, self.features, self.times = items, targets, features or None, times
        self.batch_size, self.shuffle, self.shuffle_chunk = batch_size, shuffle, max(1, shuffle_chunk)
        self.bucket_batches = bucket_batches
        self.drop_last, self.pin_memory, self.seed = drop_last, pin_memory, seed
        self.rank, self.world_size = rank, world_size
        self.epoch = 0  # the epoch whose order the next iteration draws (`set_epoch`)
        self._current = 0  # the epoch of the iteration in progress
        self._position = 0  # batches of it handed out so far
        self._resume_at = 0  # batches to skip at the start of the next iteration (`load_state_dict`)
        self.lengths = (items != 0).sum(dim=1)  # (N,)
        if self.gather == "numpy":  # NumPy views of the same memory, for the per-batch gathers (module docstring)
            self._items = items.numpy()
            self._targets = None if targets is None else targets.numpy()
            self._features = None if not features else {k: v.numpy() for k, v in features.items()}
            self._times = None if times is None else times.numpy()

    @property
    def num_rows(self) -> int:
        """Rows this rank reads per epoch."""
        n = self.items.shape[0]
        if self.shuffle:
            return n // self.world_size
        return len(range(self.rank, n, self.world_size))

    def __len__(self) -> int:
        n = self.num_rows
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def _order(self) -> torch.Tensor | None:
        if not self.shuffle:
            return None
        n = self.items.shape[0]
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        if self.bucket_batches:
            return self._bucketed(torch.randperm(n, generator=gen), gen)
        if self.shuffle_chunk == 1:
            return torch.randperm(n, generator=gen)
        n_chunks = -(-n // self.shuffle_chunk)
        chunks = torch.randperm(n_chunks, generator=gen)
        order = (chunks[:, None] * self.shuffle_chunk + torch.arange(self.shuffle_chunk)[None, :]).reshape(-1)
        return order[order < n]

    def _bucketed(self, order: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """The shuffled `order` regrouped into batches of like lengths (`bucket_batches`). A group is the
        rows of one step on every rank (batch_size * world_size), so each rank's strided share of a
        group is one of its batches."""
        group = self.batch_size * self.world_size
        pool = self.bucket_batches * group
        lengths = self.lengths.cpu().index_select(0, order)
        pad = (-len(order)) % pool  # the last pool's missing rows sort after every real one, then are dropped
        keys = torch.cat([lengths, lengths.new_full((pad,), torch.iinfo(lengths.dtype).max)]).view(-1, pool)
        within = keys.argsort(dim=1, stable=True) + torch.arange(0, len(keys) * pool, pool)[:, None]
        order = torch.cat([order, order.new_full((pad,), -1)])[within.reshape(-1)][: len(order)]
        full = len(order) // group
        groups = torch.randperm(full, generator=gen)
        return torch.cat([order[: full * group].view(full, group)[groups].reshape(-1), order[full * group :]])

    def set_epoch(self, epoch: int) -> None:
        """Draw the next iteration's order for `epoch` (the trainer's epoch, so a resumed run shuffles alike)."""
        self.epoch = int(epoch)

    def state_dict(self) -> dict[str, int]:
        """Where the current epoch stands: its number and the batches handed out, with what that position counts
        in (`EPOCH_LAYOUT`: the rows, and how they are ordered and cut into batches). Lightning saves it in
        checkpoints and hands it back on resume, so a run killed mid-epoch continues at the next batch."""
        return {"epoch": self._current, "position": self._position, "seed": self.seed, **self._layout()}

    def _layout(self) -> dict[str, int]:
        return {"rows": int(self.items.shape[0]), "batch_size": self.batch_size, "shuffle_chunk": self.shuffle_chunk,
                "bucket_batches": self.bucket_batches, "world_size": self.world_size}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue the epoch of `state` after the batches it had handed out; refused for a state shuffled with
        another seed, or one whose batches handed out were cut from other rows or in another way
        (`EPOCH_LAYOUT`): skipping them here would train some rows of the epoch twice and others never."""
        if "shuffle_buffer" in state:
            raise ValueError("the saved loader state is a StreamingLoader's: resume with --data.streaming true, as it was trained")
        if int(state.get("seed", self.seed)) != self.seed:
            raise ValueError(f"the saved loader state was shuffled with seed {state['seed']}, this loader with {self.seed}")
        for key, mine in self._layout().items() if int(state["position"]) else ():
            saved = int(state.get(key, mine))
            if saved != mine:
                raise ValueError(f"the saved loader state stands {state['position']} batches into epoch {state['epoch']} "
                                 f"with {EPOCH_LAYOUT[key]} {saved}, this loader with {mine}: resume mid-epoch with the "
                                 "rows and batches it was trained with")
        self.epoch, self._resume_at = int(state["epoch"]), int(state["position"])

    def __iter__(self) -> Iterator[SessionBatch]:
        n, width = self.items.shape
        order = self._order()
        self._current, self.epoch = self.epoch, self.epoch + 1  # without set_epoch, each iteration draws anew
        skip, self._resume_at, self._position = self._resume_at, 0, 0
        order = np.arange(n) if order is None else order.numpy()
        if self.world_size > 1:
            order = order[self.rank :: self.world_size][: self.num_rows]
        if self.drop_last:
            order = order[: len(self) * self.batch_size]
        # per-batch longest session, for all batches at once: one gather and one reduction per epoch
        b = self.batch_size
        if self.gather == "torch":
            yield from self._torch_batches(torch.as_tensor(order, device=self.items.device), width, skip)
            return
        lengths = np.pad(self.lengths.numpy().take(order), (0, (-len(order)) % b))
        widths = lengths.reshape(-1, b).max(axis=1).clip(min=1).tolist()
        for start, w in zip(range(skip * b, len(order), b), widths[skip:]):
            self._position += 1
            rows = order[start : start + b]  # a view: no per-epoch split into hundreds of arrays
            cut = width - w  # trim to the longest session in the batch
            feats = None
            if self._features is not None:
                feats = {k: torch.from_numpy(v.take(rows, axis=0)[:, cut:]) for k, v in self._features.items()}
            batch = SessionBatch(
                items=torch.from_numpy(self._items.take(rows, axis=0)[:, cut:]),
                targets=None if self._targets is None else torch.from_numpy(self._targets.take(rows)),
                index=torch.from_numpy(rows),
                features=feats,
                times=None if self._times is None else torch.from_numpy(self._times.take(rows, axis=0)[:, cut:]),
            )
            yield batch.pin_memory() if self.pin_memory else batch

    def _torch_batches(self, order: torch.Tensor, width: int, skip: int) -> Iterator[SessionBatch]:
        """The same batches as the NumPy path, gathered with `index_select` where the tensors live
        (a GPU-resident split: no host round trip per batch, one device-to-host sync per epoch)."""
        b = self.batch_size
        lengths = F.pad(self.lengths.index_select(0, order), (0, (-len(order)) % b))
        widths = lengths.reshape(-1, b).amax(dim=1).clamp(min=1).tolist()  # the epoch's one sync
        for start, w in zip(range(skip * b, len(order), b), widths[skip:]):
            self._position += 1
            rows = order[start : start + b]
            cut = width - w
            feats = None
            if self.features is not None:
                feats = {k: v.index_select(0, rows)[:, cut:] for k, v in self.features.items()}
            yield SessionBatch(
                items=self.items.index_select(0, rows)[:, cut:],
                targets=None if self.targets is None else self.targets.index_select(0, rows),
                index=rows,
                features=feats,
                times=None if self.times is None else self.times.index_select(0, rows)[:, cut:],
            )


# what a mid-epoch position of `SessionLoader` counts in, in the words of the settings that decide it
EPOCH_LAYOUT = {"rows": "training rows (the sessions, --data.train_prefixes, --data.augment_reversed)",
                "batch_size": "--data.batch_size", "shuffle_chunk": "--data.shuffle_chunk",
                "bucket_batches": "--data.bucket_batches", "world_size": "data-parallel processes"}


def ranks_of(trainer: object | None) -> dict[str, int]:
    """``rank`` and ``world_size`` of a Lightning trainer's process, for the loaders' data-parallel shards
    (empty without a trainer: one process)."""
    if trainer is None:
        return {}
    return {"rank": int(trainer.global_rank), "world_size": int(trainer.world_size)}


def release_process_group_at_exit() -> None:
    """Destroy this process's default process group when it exits, while the interpreter still runs.

    Lightning's spawned processes return without destroying it; its Gloo threads then die in the
    interpreter's teardown and may abort the process (SIGABRT) after its work is done, failing the
    whole run. Called by the data modules' ``setup`` in every process; registered once."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        atexit.unregister(_destroy_process_group)
        atexit.register(_destroy_process_group)


def _destroy_process_group() -> None:
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
