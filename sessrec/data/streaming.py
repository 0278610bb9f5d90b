"""Training batches streamed from a prepared dataset's parquet row groups, in memory flat in its size.

A prepared dataset (``sessrec prepare``) holds each split as parquet parts of session tables,
listed in ``manifest.json`` with their sha256. `StreamingLoader` reads the training parts one
row group at a time and never holds the split: its memory is the shuffle buffer plus a row group
(two while the next one is read ahead, `prefetch`).

An epoch, on every rank alike: a permutation of the row groups, drawn from the seed and the epoch
number, lays their training rows end to end; rank ``r`` of ``w`` takes the ``r``-th of ``w`` equal
contiguous spans of that sequence (``T // w`` rows each, where ``T`` is the epoch's training rows),
so it reads its own row groups (a group at the end of a span is read by both neighbours, each
keeping its part) and every rank steps the same number of batches. The remainder of the division,
under ``w`` rows, sits out the epoch (the last rows of the sequence: others every epoch).

Each rank's rows pass through a shuffle buffer of ``shuffle_buffer`` rows: a batch is drawn at random
from the buffer and its places are refilled with the next rows read; once the span is read, the
rows left are drawn in a random order. With a buffer as large as the span, an epoch is one uniform
permutation of it.

A row group becomes rows as the in-memory training tensors do (`TrainingRows`: the vocabulary's
ids, reversed copies, prefixes, the side-feature transforms, the last ``max_length`` events
right-aligned), and a batch is trimmed to its longest row, as `SessionLoader` trims it: the batches
of the two loaders hold the same rows alike. ``SessionBatch.index`` is the row of each session in
the split (the parts concatenated in the manifest's order).

Mid-epoch resume: `state_dict` says the epoch and the batches handed out; a loader given it draws that
epoch again and skips those batches (it reads and encodes the row groups they came from, without
cutting batches), so a run resumed from ``last.ckpt`` continues with exactly the batches not yet seen.

Shape letters: G row groups, T training rows of an epoch, C buffer rows, B batch, L padded length.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from sessrec.data import frame
from sessrec.data.batch import ITEM_DTYPE, SessionBatch
from sessrec.data.prepared.dataset import read_checked
from sessrec.data.side import FittedSideFeatures
from sessrec.data.sources import SessionSplits
from sessrec.data.training_rows import TrainingRows
from sessrec.data.vocab import ItemVocab

Block = dict[str, np.ndarray]  # "items" (R, L), "index" (R,), "times" (R, L), "feature/<name>" (R, L)


class StreamingLoader:
    """Iterate over the training `SessionBatch`es of parquet session tables, row group by row group.

    Args:
        files: the training parts, in the split's order (a prepared dataset's ``splits.train.files``).
        vocab: the fitted vocabulary (raw ids -> model ids; unknown ids -> OOV).
        max_length: most recent events kept per row.
        batch_size: rows per batch.
        shuffle_buffer: rows held for shuffling (at least `batch_size`).
        side: fitted side-feature transforms; batches carry their features.
        times: batches carry their events' times (the parts need a ``timestamp`` column).
        augment_reversed: add a reversed copy of every session with two or more events (`TrainingRows`).
        train_prefixes: train on every prefix of the rows instead (`TrainingRows`). With either, the
            constructor reads the ``item_id`` (and ``virtual``) column of every row group once, to count
            its rows (the ranks' spans need them); without, the parquet footers say it.
        drop_last: drop each epoch's final incomplete batch. None: drop it unless a rank's rows fit in
            one batch (as `SessionDataModule`'s in-memory training loader).
        pin_memory: return batches in pinned memory.
        prefetch: read and encode the next row group in a background thread while batches are drawn
            from the current one (memory: one more row group).
        seed: base seed of the row-group permutations and of the buffer's draws.
        rank: this process's index among the data-parallel processes (0 .. world_size - 1).
        world_size: the number of data-parallel processes (module docstring).
    """

    def __init__(
        self,
        files: Sequence[str | Path],
        vocab: ItemVocab,
        max_length: int = 20,
        batch_size: int = 256,
        shuffle_buffer: int = 65_536,
        side: FittedSideFeatures | None = None,
        times: bool = False,
        augment_reversed: bool = False,
        train_prefixes: bool = False,
        drop_last: bool | None = None,
        pin_memory: bool = False,
        prefetch: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if shuffle_buffer < batch_size:
            raise ValueError(f"shuffle_buffer ({shuffle_buffer}) must hold at least one batch (batch_size {batch_size})")
        if seed < 0:
            raise ValueError(f"seed must be >= 0 (it seeds NumPy's generators), got {seed}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need world_size >= 1 and 0 <= rank < world_size, got rank {rank} of {world_size}")
        if not files:
            raise ValueError("StreamingLoader: no training parts to read")
        self.files = [Path(f) for f in files]
        self.vocab, self.max_length, self.side, self.times = vocab, max_length, side, times
        self.augment_reversed, self.train_prefixes = augment_reversed, train_prefixes
        self.batch_size, self.shuffle_buffer, self.pin_memory, self.seed = batch_size, shuffle_buffer, pin_memory, seed
        self.rank, self.world_size, self.prefetch = rank, world_size, prefetch
        self._stats = [_identity(f) for f in self.files]  # before the footers: a file replaced after is refused
        self._metadata = [pq.read_metadata(f) for f in self.files]
        schemas = [m.schema.to_arrow_schema().remove_metadata() for m in self._metadata]
        for path, schema in zip(self.files, schemas):
            if frame.ITEMS not in schema.names:
                raise ValueError(f"{path}: no {frame.ITEMS!r} column (it has {schema.names}); a training part is a session table")
            if schema != schemas[0]:
                columns = lambda s: ", ".join(f"{f.name} {f.type}" for f in s)
                raise ValueError(f"{path}: its columns ({columns(schema)}) differ from those of {self.files[0]} "
                                 f"({columns(schemas[0])})")
        self._columns = schemas[0].names
        groups = [(i, g, m.row_group(g).num_rows) for i, m in enumerate(self._metadata) for g in range(m.num_row_groups)]
        self._file, self._group, sessions = np.array(groups, dtype=np.int64).reshape(-1, 3).T  # (G,) each
        self._first_session = np.cumsum(sessions) - sessions  # (G,) the split row of each group's first session
        self._rows = sessions if not (augment_reversed or train_prefixes) else self._count_rows()  # (G,) training rows
        self.share = int(self._rows.sum()) // world_size  # rows each rank reads per epoch
        self.drop_last = self.share > batch_size if drop_last is None else drop_last
        self.epoch = 0  # the epoch whose order the next iteration draws (`set_epoch`)
        self._current = 0  # the epoch of the iteration in progress
        self._position = 0  # batches of it handed out so far
        self._resume_at = 0  # batches to skip at the start of the next iteration (`load_state_dict`)

    # -- the row groups ------------------------------------------------------------------------
    def _read(self, k: int, columns: list[str] | None = None) -> pa.Table:
        """Row group `k` (of all the parts' groups, in order) as a session table; refused in one line when its
        file is no longer the one whose footer the constructor read (a preparation replaced the dataset since)."""
        path = self.files[self._file[k]]
        if _identity(path) != self._stats[self._file[k]]:
            raise ValueError(f"{path}: replaced or changed since this loader read it (another sessrec prepare into the "
                             "dataset?); a run reads one preparation: start it again on the dataset as it is now")
        return pq.ParquetFile(path, metadata=self._metadata[self._file[k]]).read_row_group(int(self._group[k]),
                                                                                          columns=columns)

    def _count_rows(self) -> np.ndarray:
        """(G,) training rows of each row group, from its ``item_id`` (and ``virtual``) columns."""
        counts = np.zeros(len(self._group), dtype=np.int64)
        for k in range(len(self._group)):
            table = self._read(k, [c for c in (frame.ITEMS, frame.VIRTUAL) if c in self._columns])
            offsets = frame.list_offsets(table.column(frame.ITEMS))[1]
            counts[k] = len(TrainingRows.of(offsets, frame.virtual_flags(table), self.augment_reversed, self.train_prefixes))
        return counts

    def _block(self, k: int) -> Block:
        """The padded training rows of row group `k` (`TrainingRows`), as the in-memory tensors hold them."""
        table, where = self._read(k), f"{self.files[self._file[k]]} (row group {self._group[k]})"
        values, offsets = frame.list_offsets(table.column(frame.ITEMS))
        virtual = frame.virtual_flags(table)
        rows = TrainingRows.of(offsets, virtual, self.augment_reversed, self.train_prefixes)
        ids = self.vocab.encode(values, virtual=virtual, source=f"{where}, column {frame.ITEMS!r}").ids
        block = {"items": rows.pad(ids, self.max_length, ITEM_DTYPE), "index": self._first_session[k] + rows.session}
        if self.side is not None:
            for name, flat in self.side.transform(table, where).items():
                block[f"feature/{name}"] = rows.pad(flat, self.max_length)
        if self.times:
            flat = frame.event_times(table)
            if flat is None:
                raise ValueError(f"{where}: the batches need event times, but there is no {frame.TIMES!r} column")
            block["times"] = rows.pad(flat, self.max_length, np.float64)
        return block

    def _span(self, epoch: int) -> Iterator[Block]:
        """This rank's training rows of `epoch`, one row group (or the part of one in its span) at a time."""
        order = np.random.default_rng([self.seed, epoch]).permutation(len(self._rows))  # the same on every rank
        ends = np.cumsum(self._rows[order])
        lo, hi = self.rank * self.share, (self.rank + 1) * self.share
        last = min(int(np.searchsorted(ends, hi, side="left")), len(order) - 1)  # the last group that starts before hi
        for i in range(int(np.searchsorted(ends, lo, side="right")), last + 1):
            first = ends[i] - self._rows[order[i]]
            a, b = max(lo - first, 0), min(hi, ends[i]) - first  # the part of the group in the span
            if b > a:
                block = self._block(int(order[i]))
                yield block if (a, b) == (0, ends[i] - first) else {k: v[a:b] for k, v in block.items()}

    # -- epochs ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.share // self.batch_size if self.drop_last else -(-self.share // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """Draw the next iteration's order for `epoch` (the trainer's epoch, so a resumed run shuffles alike)."""
        self.epoch = int(epoch)

    def state_dict(self) -> dict[str, int]:
        """Where the current epoch stands: its number and the batches handed out (Lightning saves it in
        checkpoints and hands it back on resume), with the settings that give those numbers their meaning."""
        return {"epoch": self._current, "position": self._position, **self._settings()}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue the epoch of `state` after the batches it had handed out; refused when it was saved by
        a loader that cuts other batches (another seed, batch size, buffer, number of processes or split)."""
        for key, value in self._settings().items():
            if key not in state:
                raise ValueError(f"the saved loader state has no {key!r}: it is not a StreamingLoader's; resume with "
                                 "the loader the checkpoint was trained with (--data.streaming as then)")
            if int(state[key]) != value:
                raise ValueError(f"the saved loader state has {key} {state[key]}, this loader {value}: resume with the same setting")
        self.epoch, self._resume_at = int(state["epoch"]), int(state["position"])

    def _settings(self) -> dict[str, int]:
        return {"seed": self.seed, "batch_size": self.batch_size, "shuffle_buffer": self.shuffle_buffer,
                "world_size": self.world_size, "rows": int(self._rows.sum())}

    def __iter__(self) -> Iterator[SessionBatch]:
        self._current, self.epoch = self.epoch, self.epoch + 1  # without set_epoch, each iteration draws anew
        skip, self._resume_at, self._position = self._resume_at, 0, 0
        if skip >= len(self):  # resumed at the epoch's end: nothing is left to read
            self._position = len(self)
            return
        rng = np.random.default_rng([self.seed, self._current, self.rank])
        blocks = self._span(self._current)
        draws = _Buffer(_ahead(blocks) if self.prefetch else blocks, self.shuffle_buffer, rng)
        total = len(self) * self.batch_size if self.drop_last else self.share
        for start in range(0, total, self.batch_size):
            n = min(self.batch_size, total - start)
            if self._position < skip:
                draws.draw(n, keep=False)
                self._position += 1
                continue
            self._position += 1
            batch = _batch(draws.draw(n), self.max_length)
            yield batch.pin_memory() if self.pin_memory else batch


class _Buffer:
    """A shuffle buffer of `capacity` rows over a stream of blocks (module docstring)."""

    def __init__(self, blocks: Iterator[Block], capacity: int, rng: np.random.Generator) -> None:
        self.blocks, self.rng = blocks, rng
        self.pending: list[Block] = []  # blocks read, not yet in the buffer (the first may be partly taken)
        first = self._take(capacity)
        self.rows = {k: np.empty((capacity, *v.shape[1:]), v.dtype) for k, v in first.items()}
        self.fill = _length(first)
        for k, v in first.items():
            self.rows[k][: self.fill] = v
        self.drain: np.ndarray | None = None if self.fill == capacity else rng.permutation(self.fill)

    def _take(self, n: int) -> Block:
        """The next `n` rows of the stream (fewer at its end)."""
        got, parts = 0, []
        while got < n:
            if not self.pending:
                block = next(self.blocks, None)
                if block is None:
                    break
                self.pending.append(block)
            block = self.pending[0]
            m = min(n - got, _length(block))
            parts.append({k: v[:m] for k, v in block.items()})
            got += m
            if m == _length(block):
                self.pending.pop(0)
            else:
                self.pending[0] = {k: v[m:] for k, v in block.items()}
        if len(parts) == 1:
            return parts[0]
        return {k: np.concatenate([p[k] for p in parts]) for k in (parts[0] if parts else {})}

    def draw(self, n: int, keep: bool = True) -> Block:
        """`n` rows drawn at random (empty when not `keep`: the draw is made, the rows are not cut)."""
        if self.drain is not None:  # the stream is read: the rows left, in a random order
            at, self.drain = self.drain[:n], self.drain[n:]
            return {k: v[at] for k, v in self.rows.items()} if keep else {}
        at = self.rng.choice(self.fill, size=n, replace=False)
        out = {k: v[at] for k, v in self.rows.items()} if keep else {}
        new = self._take(n)
        m = _length(new) if new else 0
        for k, v in new.items():
            self.rows[k][at[:m]] = v
        if m < n:  # the stream ended: close the holes, then draw the rest in a random order
            live = np.ones(self.fill, dtype=bool)
            live[at[m:]] = False
            self.fill = int(live.sum())
            for v in self.rows.values():
                v[: self.fill] = v[: len(live)][live]
            self.drain = self.rng.permutation(self.fill)
        return out


def _ahead(blocks: Iterator[Block]) -> Iterator[Block]:
    """The blocks of `blocks`, each next one read and encoded in a background thread while the current one
    is drawn from (Parquet reads, Arrow kernels and NumPy copies release the GIL); the order is the same."""
    with ThreadPoolExecutor(1, thread_name_prefix="StreamingLoader") as reader:
        pending = reader.submit(next, blocks, None)
        while (block := pending.result()) is not None:
            pending = reader.submit(next, blocks, None)
            yield block


def _identity(path: Path) -> tuple[int, int, int, int]:
    """What tells one file at `path` from another written there later: its device, inode, size and mtime."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        raise ValueError(f"{path}: a part of the prepared dataset is missing (deleted, or moved by another sessrec "
                         "prepare?); prepare the dataset again") from None
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


def _length(block: Block) -> int:
    return len(block["items"]) if block else 0


def _batch(rows: Block, max_length: int) -> SessionBatch:
    """A `SessionBatch` of rows, trimmed to the longest row in it (as `SessionLoader` trims)."""
    items = rows["items"]
    cut = max_length - max(int((items != 0).sum(axis=1).max(initial=0)), 1)
    features = {k.removeprefix("feature/"): torch.from_numpy(v[:, cut:]) for k, v in rows.items() if k.startswith("feature/")}
    times = rows.get("times")
    return SessionBatch(items=torch.from_numpy(items[:, cut:]), index=torch.from_numpy(rows["index"]),
                        features=features or None, times=None if times is None else torch.from_numpy(times[:, cut:]))


# -- prepared datasets --------------------------------------------------------------------------
def split_files(directory: str | Path, manifest: dict[str, Any], split: str) -> list[Path]:
    """The parts of `split` in their order (a manifest `PreparedSource` has read and checked)."""
    return [Path(directory) / name for name in manifest["splits"][split]["files"]]


class StreamedSplits(SessionSplits):
    """The evaluation splits of a prepared dataset in memory, the training split left on disk (it streams).

    Reading ``train`` is refused in one line: nothing silently sees an empty training split.
    """

    def __init__(self, directory: str | Path, manifest: dict[str, Any]) -> None:
        read = lambda split: pa.concat_tables(read_checked(Path(directory), name, manifest)
                                              for name in manifest["splits"][split]["files"])
        self.valid, self.test, self.source = read("valid"), read("test"), str(directory)
        self.counts = {split: manifest["splits"][split] for split in ("train", "valid", "test")}
        self.train_files = split_files(directory, manifest, "train")

    @property
    def train(self) -> pa.Table:  # type: ignore[override]
        raise ValueError(
            f"{self.source}: the training split streams (--data.streaming true) and is not held in memory; "
            "what needs it whole (fitting a vocabulary or side features, indexing training sessions) needs streaming false"
        )

    def train_end(self) -> float | None:
        """The training split's last event time, from the parts' parquet statistics (the greatest ``timestamp``
        of each row group), without reading the split; None when its sessions carry no timestamps."""
        highs = []
        for path in self.train_files:
            metadata = pq.read_metadata(path)
            names = [metadata.schema.column(i).path.split(".")[0] for i in range(metadata.num_columns)]
            if frame.TIMES not in names:
                return None
            stats = [metadata.row_group(g).column(names.index(frame.TIMES)).statistics for g in range(metadata.num_row_groups)]
            if all(s is not None and s.has_min_max for s in stats):
                highs += [s.max for s in stats]
            else:  # written without statistics: the column itself
                times = pq.read_table(path, columns=[frame.TIMES]).column(frame.TIMES).combine_chunks().flatten()
                highs.append(pc.max(times).as_py())
        highs = [h for h in highs if h is not None]
        return float(max(highs)) if highs else None

    def summary(self) -> dict[str, int]:
        return {f"{split}_{what}": int(self.counts[split][what]) for split in ("train", "valid", "test")
                for what in ("sessions", "events")}
