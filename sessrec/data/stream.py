"""Bounded-memory stream of sessions to score, read from a parquet or CSV file in chunks.

Two input layouts are accepted:
- one row per session, with a list column of raw item ids (as ``sessrec`` writes splits);
- one row per event, rows of a session contiguous (as loggers write them), optionally with a
  time column to order events within a session. A session cut by a chunk boundary is carried
  over to the next chunk, so memory stays at one chunk plus one session.

A model trained with side features needs their columns in the file, under the names the
recipe's ``side_features`` gives (per event, or as list columns beside ``item_id``), and a
timestamp column for time features; they are transformed by the transforms fitted in training
(``features.npz``). A boolean ``virtual`` column, when present, marks events whose ``item_id``
holds a virtual item's key (e.g. ``filter selection:4 Star``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import torch

from sessrec.data import frame
from sessrec.data.batch import ITEM_DTYPE, SessionBatch
from sessrec.data.readers import _is_parquet, _sniff_delimiter
from sessrec.data.schema import FeatureSpec, Schema, SchemaError
from sessrec.data.side import SideFeatureTransform
from sessrec.data.vocab import ItemVocab


class ScoringStream:
    """Iterate over `SessionBatch`es (with raw session ids in ``keys``) of a sessions file.

    Args:
        path: parquet, or CSV/TSV (optionally gzipped).
        vocab: the fitted vocabulary of the model; unknown items map to OOV and are counted.
        schema: session/item (and optional timestamp) column names of the file.
        max_length: most recent items kept per session.
        batch_size: sessions per batch.
        chunk_rows: rows read from the file at a time.
        side: fitted side-feature transforms of the model, if it uses side features.
    """

    def __init__(
        self,
        path: str | Path,
        vocab: ItemVocab,
        schema: Schema = Schema(timestamp=None),
        max_length: int = 20,
        batch_size: int = 1024,
        chunk_rows: int = 100_000,
        side: SideFeatureTransform | None = None,
    ) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise FileNotFoundError(f"{self.path}: no such file to score")
        self.vocab, self.schema, self.side = vocab, schema, side
        self.extra = [] if side is None else [*side.config.categorical, *side.config.continuous]
        if side is not None and side.config.time and schema.timestamp is None:
            raise ValueError(
                f"the model's side features {side.config.time} need event times: set --data.predict_schema.timestamp "
                f"to the time column of {self.path}"
            )
        self.max_length, self.batch_size, self.chunk_rows = max_length, batch_size, chunk_rows
        self.num_sessions = self.num_items = self.num_unknown = 0

    def _chunks(self) -> Iterator[pa.Table]:
        try:
            if _is_parquet(self.path):
                for rb in pq.ParquetFile(self.path).iter_batches(batch_size=self.chunk_rows):
                    yield pa.Table.from_batches([rb])
            else:
                parse = pacsv.ParseOptions(delimiter=_sniff_delimiter(self.path))
                convert = pacsv.ConvertOptions(null_values=["", "NA", "null"], strings_can_be_null=True)
                reader = pacsv.open_csv(
                    self.path,
                    read_options=pacsv.ReadOptions(block_size=1 << 22),
                    parse_options=parse,
                    convert_options=convert,
                )
                for rb in reader:
                    yield pa.Table.from_batches([rb])
        except (pa.ArrowInvalid, OSError) as err:
            raise SchemaError(f"{self.path}: cannot be read: {err}") from err

    def _sessions(self) -> Iterator[pa.Table]:
        """Complete sessions (``session_id``, ``item_id`` list), chunk by chunk."""
        s = self.schema
        carry: pa.Table | None = None
        row = 0
        for chunk in self._chunks():
            source = f"{self.path} (rows {row}-{row + chunk.num_rows - 1})"
            row += chunk.num_rows
            if s.item_id in chunk.column_names and pa.types.is_list(chunk.schema.field(s.item_id).type):
                yield self._validate_lists(chunk, source)
                continue
            events = s.validate(chunk, source=source)
            for name in [*self.extra, *([frame.VIRTUAL] if frame.VIRTUAL in chunk.column_names else [])]:
                if name not in chunk.column_names:
                    raise SchemaError(
                        f"{source}: column {name!r} is missing; the model uses it as a side feature "
                        f"(the file has columns {chunk.column_names})"
                    )
                events = events.append_column(name, chunk.column(name))
            if carry is not None:
                events = pa.concat_tables([carry, events], promote_options="default")
            ids = events.column(s.session_id).to_numpy(zero_copy_only=False)
            offsets = np.concatenate([[0], np.flatnonzero(ids[1:] != ids[:-1]) + 1, [len(ids)]])
            run_ids = ids[offsets[:-1]]
            if len(np.unique(run_ids)) != len(run_ids):
                dup = run_ids[np.flatnonzero(_duplicated(run_ids))[0]]
                raise SchemaError(
                    f"{source}: column {s.session_id!r}: session {dup!r} is split over non-adjacent rows; "
                    "group the events of a session together"
                )
            carry = events.slice(offsets[-2])
            complete = events.slice(0, offsets[-2])
            if complete.num_rows:
                yield self._group(complete)
        if carry is not None and carry.num_rows:
            yield self._group(carry)

    def _group(self, events: pa.Table) -> pa.Table:
        s = self.schema
        if s.timestamp is not None:
            events = frame.sort_events(events, s)
        carried = [c for c in events.column_names if c not in (s.session_id, s.item_id, s.timestamp, s.order_by)]
        keep_times = self.side is not None and bool(self.side.config.time)
        grouping = Schema(s.session_id, s.item_id, s.timestamp if keep_times else None, features=[FeatureSpec(c) for c in carried])
        return frame.group_sessions(events, grouping)

    def _validate_lists(self, chunk: pa.Table, source: str) -> pa.Table:
        s = self.schema
        if s.session_id not in chunk.column_names:
            raise SchemaError(f"{source}: column {s.session_id!r} is missing; the file has {chunk.column_names}")
        lists = chunk.column(s.item_id)
        lengths = pc.list_value_length(lists).fill_null(0).to_numpy(zero_copy_only=False)
        if (lengths == 0).any():
            row = int(np.flatnonzero(lengths == 0)[0])
            raise SchemaError(
                f"{source}: column {s.item_id!r}: session {chunk.column(s.session_id)[row].as_py()!r} "
                f"(row {row}) has no items"
            )
        flat = pa.table({"sid": pa.array(np.zeros(int(lengths.sum()), dtype=np.int64)), "iid": pc.list_flatten(lists)})
        Schema("sid", "iid", None).validate(flat, source=f"{source} column {s.item_id!r}")
        out = {frame.SESSION: chunk.column(s.session_id), frame.ITEMS: lists}
        extra = [*self.extra, *([frame.VIRTUAL] if frame.VIRTUAL in chunk.column_names else [])]
        if self.side is not None and self.side.config.time:
            extra.append(frame.TIMES)
        for name in extra:
            source_name = s.timestamp if name == frame.TIMES and s.timestamp else name
            if source_name not in chunk.column_names:
                raise SchemaError(
                    f"{source}: column {source_name!r} is missing; the model uses it as a side feature "
                    f"(the file has columns {chunk.column_names})"
                )
            out[name] = chunk.column(source_name)
        return pa.table(out)

    def __iter__(self) -> Iterator[SessionBatch]:
        for sessions in self._sessions():
            values, offsets = frame.list_offsets(sessions.column(frame.ITEMS))
            virtual = None
            if frame.VIRTUAL in sessions.column_names:
                virtual = frame.list_offsets(sessions.column(frame.VIRTUAL))[0].to_numpy(zero_copy_only=False).astype(bool)
            encoded = self.vocab.encode(values, virtual=virtual)
            self.num_sessions += sessions.num_rows
            self.num_items += len(encoded.ids)
            self.num_unknown += encoded.num_unknown
            starts, ends = offsets[:-1], offsets[1:]
            items = torch.from_numpy(frame.pad_sessions(encoded.ids, starts, ends, self.max_length, ITEM_DTYPE))
            flat = {} if self.side is None else self.side.transform(sessions, str(self.path))
            feats = {k: torch.from_numpy(frame.pad_sessions(v, starts, ends, self.max_length)) for k, v in flat.items()}
            keys = sessions.column(frame.SESSION).combine_chunks()
            for lo in range(0, sessions.num_rows, self.batch_size):
                hi = min(lo + self.batch_size, sessions.num_rows)
                rows = items[lo:hi]
                width = max(int((rows != 0).sum(dim=1).max()), 1)
                yield SessionBatch(
                    items=rows[:, -width:],
                    index=torch.arange(lo, hi),
                    keys=keys.slice(lo, hi - lo),
                    features={k: v[lo:hi, -width:] for k, v in feats.items()} if self.side is not None else None,
                )


def _duplicated(values: np.ndarray) -> np.ndarray:
    """Boolean mask of entries equal to an earlier entry (first occurrences are False)."""
    _, first = np.unique(values, return_index=True)
    dup = np.ones(len(values), dtype=bool)
    dup[first] = False
    return dup
