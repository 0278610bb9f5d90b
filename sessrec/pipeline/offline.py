"""Offline batch recommendation: a sessions file in, a recommendations parquet out, resumable.

`recommend_file` streams the input (`ScoringStream`: parquet or CSV, a list column or one row per
event, bounded memory) through the same `Pipeline.recommend_batch` that serves one request,
and writes each batch to its own part file under ``<output>.parts/``, each under a temporary
name and renamed when complete. A run that is killed leaves complete parts only; the next run
with the same input, pipeline and settings skips them (the batches are cut the same way) and goes
on. "The same" is decided by content: the parts folder's manifest records the input file's content
hash and the saved pipeline's (`Pipeline.content_hash`), never a path, a size or a time, so a
pipeline re-fitted in place or an input rewritten meanwhile starts the run over.
At the end the parts are joined into ``<output>`` under a temporary name, renamed, and the
parts folder is removed: every session exactly once, in input order.

Time: an input with the schema's ``timestamp`` column gives each session its event times (for
the ranker's time features) and its request time ``now``, at which the allow/deny windows hold:
the time of its last event. An input without one is served at one ``now`` for every session: the
one given, else the time the run starts. That time is recorded in the manifest: a resumed run
serves at the time its first part was served at, and a run given another ``now`` starts over.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import torch

from sessrec.data.batch import SessionBatch
from sessrec.data.schema import Schema
from sessrec.data.stream import ScoringStream
from sessrec.pipeline.clock import LATEST, check_seconds
from sessrec.pipeline.pipeline import Pipeline
from sessrec.saved.atomic import digest, write_text

LAST_EVENT = "last event"  # the manifest's ``now`` of an input with event times


def _manifest(input_path: Path, k: int, batch_size: int, pipeline: Pipeline, schema: Schema, now: float | str) -> dict:
    """What the parts of a run depend on, by content; a pipeline never saved has no identity (None): its
    parts are never reused."""
    return {"input": digest(input_path), "pipeline": pipeline.content_hash, "k": k, "batch_size": batch_size,
            "schema": repr(schema), "now": now}


def recommend_file(
    pipeline: str | os.PathLike | Pipeline,
    input_path: str | os.PathLike,
    output: str | os.PathLike,
    k: int = 20,
    batch_size: int = 1024,
    schema: Schema = Schema(),  # noqa: B008 - a config value, never mutated
    overwrite: bool = False,
    now: float | None = None,
) -> dict:
    """Recommend `k` items for every session of `input_path`; write ``session_id``, ``item_ids``, ``scores``.

    Args:
        pipeline: a saved pipeline directory (or a loaded `Pipeline`).
        input_path: sessions file (see `ScoringStream`).
        output: the file to write: ``.parquet`` (``session_id``, ``item_ids``, ``scores``) or ``.csv``
            (one row per recommendation: ``session_id``, ``rank``, ``item_id``, ``score``).
        k: recommendations per session.
        batch_size: sessions per batch and per part file.
        schema: column names of the input; its ``timestamp`` column (in its ``time_unit``), when
            the input has it, gives each session's event times and serves it at its last event.
        overwrite: replace an existing output (otherwise refuse).
        now: the time every session is served at (seconds since the epoch), for the allow/deny
            windows. None: each session's last event time where the input has a time column,
            else the time the run starts (the time a resumed run started, recorded in its manifest).

    Returns:
        counts: sessions, batches written, batches resumed (skipped), unknown items, output, and
        ``now`` (the time every session was served at; None: each at its last event).

    Raises:
        ValueError: `k` or `batch_size` below 1, `output` a directory or of another suffix (before
            anything is written), an implausible `now` or event time (after the year 3000: milliseconds given
            as seconds), or an input without a time column for a ranker fitted with time features.
    """
    output, input_path = Path(output), Path(input_path)
    check_output(output, k, batch_size)
    if output.exists() and not overwrite:
        raise FileExistsError(f"{output} exists; pass --overwrite true to replace it")
    if now is not None:
        now = float(check_seconds(now, "now"))
    pipe = pipeline if isinstance(pipeline, Pipeline) else Pipeline.from_pretrained(pipeline)
    stream = ScoringStream(input_path, pipe.vocab, schema, pipe.history_length, batch_size, times=True)
    if pipe.time_features and not stream.times:
        where = f"column {schema.timestamp!r}" if schema.timestamp is not None else "a column named by the schema's timestamp"
        raise ValueError(f"{input_path}: {pipe.missing_times(where)}; the file has columns {stream.columns()}")
    parts = output.with_name(output.name + ".parts")
    marker = parts / "manifest.json"
    recorded = _read(marker) if marker.exists() else None
    if now is None and not stream.times:  # the time the run starts, or the one the run it resumes started at
        same = _manifest(input_path, k, batch_size, pipe, schema, None)
        started = recorded.get("now") if isinstance(recorded, dict) else None
        resumes = isinstance(started, float) and {**recorded, "now": None} == same
        now = started if resumes else time.time()
    manifest = _manifest(input_path, k, batch_size, pipe, schema, LAST_EVENT if now is None else now)
    if parts.exists() and (manifest["pipeline"] is None or recorded != manifest):
        print(f"[recommend] {parts}: written by another pipeline, input or settings; starting over")
        shutil.rmtree(parts)
    parts.mkdir(parents=True, exist_ok=True)
    write_text(marker, json.dumps(manifest))
    written = resumed = sessions = 0
    names = []
    for i, batch in enumerate(stream):
        part = parts / f"part-{i:06d}.parquet"
        names.append(part)
        sessions += len(batch)
        if part.exists():
            resumed += 1
            continue
        request = pipe.wrap(batch.items, _checked_times(batch, input_path, schema),
                            None if now is None else torch.full((len(batch),), now, dtype=torch.float64))
        recs = pipe.recommend_batch(request, k)  # as `Pipeline.recommend` for one request
        item_ids, scores = pipe.decode_lists(recs)
        table = pa.table({"session_id": batch.keys, "item_ids": item_ids, "scores": scores})
        tmp = part.with_name(part.name + ".tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, part)
        written += 1
    if not names:
        raise ValueError(f"{input_path}: no sessions to recommend for")
    _join(names, output)
    shutil.rmtree(parts)
    counts = {"sessions": sessions, "batches_written": written, "batches_resumed": resumed,
              "unknown_items": stream.num_unknown, "output": str(output), "now": now}
    print(f"[recommend] {sessions} sessions -> {output} ({written} batches scored, {resumed} resumed, "
          f"{stream.num_unknown} unknown item ids scored as OOV)")
    return counts


OUTPUT_SUFFIXES = (".parquet", ".csv")


def check_output(output: Path, k: int, batch_size: int) -> None:
    """Refuse settings that cannot give an output, before anything is written.

    Raises:
        ValueError: `k` or `batch_size` below 1, `output` a directory, or a suffix other than
            `OUTPUT_SUFFIXES`.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"--k {k}: the number of recommendations per session must be 1 or more")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"--batch_size {batch_size}: must be 1 or more")
    if output.is_dir():
        raise ValueError(f"--output {output} is a directory; name a file in it (e.g. {output / 'recs.parquet'})")
    if output.suffix.lower() not in OUTPUT_SUFFIXES:
        raise ValueError(
            f"--output {output}: unknown suffix {output.suffix or '(none)'!r}; name a .parquet file (session_id, "
            "item_ids, scores) or a .csv file (one row per recommendation: session_id, rank, item_id, score)"
        )


def _join(names: list[Path], output: Path) -> None:
    """Join the part files into `output` (parquet as they are; CSV one row per recommendation), under a
    temporary name renamed when complete."""
    tmp = output.with_name(f".{output.name}.tmp")
    try:
        if output.suffix.lower() == ".csv":
            with pacsv.CSVWriter(tmp, _long(pq.read_table(names[0]).slice(0, 0)).schema) as writer:
                for name in names:
                    writer.write_table(_long(pq.read_table(name)))
        else:
            with pq.ParquetWriter(tmp, pq.read_schema(names[0])) as writer:
                for name in names:
                    writer.write_table(pq.read_table(name))
        os.replace(tmp, output)
    finally:
        tmp.unlink(missing_ok=True)  # only still there when joining failed


def _long(table: pa.Table) -> pa.Table:
    """One row per recommendation: ``session_id``, ``rank`` (1 = best), ``item_id``, ``score``."""
    items, scores = table.column("item_ids").combine_chunks(), table.column("scores").combine_chunks()
    parent = pc.list_parent_indices(items)
    starts = pc.take(items.offsets, parent)
    rank = pc.add(pc.subtract(pa.array(np.arange(len(parent), dtype=np.int64)), starts.cast(pa.int64())), 1)
    return pa.table({"session_id": pc.take(table.column("session_id"), parent), "rank": rank,
                     "item_id": pc.list_flatten(items), "score": pc.list_flatten(scores)})


def _checked_times(batch: SessionBatch, input_path: Path, schema: Schema) -> torch.Tensor | None:
    """The batch's event times, refused when one is after the year 3000 (a time unit of ms read as s)."""
    if batch.times is None:
        return None
    late = (batch.times >= LATEST).any(dim=1)
    if late.any():
        row = int(late.nonzero()[0, 0])
        value = float(batch.times[row][batch.times[row] >= LATEST][0])
        raise ValueError(
            f"{input_path}: column {schema.timestamp!r}: session {batch.keys[row].as_py()!r} has the time "
            f"{value:.0f} s, after the year 3000; set the schema's time_unit (now {schema.time_unit!r}) to the "
            "column's unit (ms?)"
        )
    return batch.times


def _read(marker: Path) -> dict | None:
    try:
        return json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
