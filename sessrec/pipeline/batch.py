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
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from sessrec.data.schema import Schema
from sessrec.saved.atomic import digest, write_text
from sessrec.data.stream import ScoringStream
from sessrec.pipeline.pipeline import Pipeline


def _manifest(input_path: Path, k: int, batch_size: int, pipeline: Pipeline, schema: Schema) -> dict:
    """What the parts of a run depend on, by content; a pipeline never saved has no identity (None): its
    parts are never reused."""
    return {"input": digest(input_path), "pipeline": pipeline.content_hash, "k": k, "batch_size": batch_size,
            "schema": repr(schema)}


def recommend_file(
    pipeline: str | os.PathLike | Pipeline,
    input_path: str | os.PathLike,
    output: str | os.PathLike,
    k: int = 20,
    batch_size: int = 1024,
    schema: Schema = Schema(timestamp=None),  # noqa: B008 - a config value, never mutated
    overwrite: bool = False,
) -> dict:
    """Recommend `k` items for every session of `input_path`; write ``session_id``, ``item_ids``, ``scores``.

    Args:
        pipeline: a saved pipeline directory (or a loaded `Pipeline`).
        input_path: sessions file (see `ScoringStream`).
        output: parquet file to write.
        k: recommendations per session.
        batch_size: sessions per batch and per part file.
        schema: column names of the input.
        overwrite: replace an existing output (otherwise refuse).

    Returns:
        counts: sessions, batches written, batches resumed (skipped), unknown items.
    """
    output, input_path = Path(output), Path(input_path)
    if output.exists() and not overwrite:
        raise FileExistsError(f"{output} exists; pass --overwrite true to replace it")
    pipe = pipeline if isinstance(pipeline, Pipeline) else Pipeline.from_pretrained(pipeline)
    stream = ScoringStream(input_path, pipe.vocab, schema, pipe.history_length, batch_size)
    parts = output.with_name(output.name + ".parts")
    manifest = _manifest(input_path, k, batch_size, pipe, schema)
    marker = parts / "manifest.json"
    if parts.exists() and (manifest["pipeline"] is None or not marker.exists() or _read(marker) != manifest):
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
        recs = pipe.recommend_batch(pipe.wrap(batch.items), k)  # as `Pipeline.recommend` for one request
        item_ids, scores = pipe.decode_lists(recs)
        table = pa.table({"session_id": batch.keys, "item_ids": item_ids, "scores": scores})
        tmp = part.with_name(part.name + ".tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, part)
        written += 1
    tmp = output.with_name(f".{output.name}.tmp")
    if not names:
        raise ValueError(f"{input_path}: no sessions to recommend for")
    with pq.ParquetWriter(tmp, pq.read_schema(names[0])) as writer:
        for name in names:
            writer.write_table(pq.read_table(name))
    os.replace(tmp, output)
    shutil.rmtree(parts)
    counts = {"sessions": sessions, "batches_written": written, "batches_resumed": resumed,
              "unknown_items": stream.num_unknown, "output": str(output)}
    print(f"[recommend] {sessions} sessions -> {output} ({written} batches scored, {resumed} resumed, "
          f"{stream.num_unknown} unknown item ids scored as OOV)")
    return counts


def _read(marker: Path) -> dict | None:
    try:
        return json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
