"""Offline batch recommendation: a sessions file in, a recommendations parquet or CSV out, resumable.

`recommend_file` cuts the input into partitions of whole sessions (`ScoringStream.partitions`,
`partition_batches` batches each) and scores each with `RecommendJob`: the partition's batches
(`ScoringStream`: parquet or CSV, a list column or one row per event, bounded memory) through the
same `Pipeline.recommend_batch` that serves one request, into its own part under
``<output>.parts/`` (`sessrec.scoring.PartsFolder`), written under a temporary name and renamed
when complete. The partitions are scored in this process or on the workers of a Dask cluster
(`sessrec.scoring.Engine`: ``--engine dask``), where each worker reads the pipeline directory once.
A run that is killed (or whose worker died) leaves complete parts only; the next run with the same
input, pipeline and settings scores only the other partitions. A run refused for its input (a bad
row, a time in the wrong unit) removes its parts: rerun, it would be refused again. "The same" is decided by content: the
manifest records the input file's content hash and the saved pipeline's (`Pipeline.content_hash`),
never a path, a size or a time, so a pipeline re-fitted in place or an input rewritten meanwhile
starts the run over. At the end the parts are joined into ``<output>`` in input order, the same bytes
whatever the partitions and the number of workers, on as many torch threads per process: a Dask worker
and each thread of ``--workers N`` with the local engine score on one, this process alone on torch's
(``OMP_NUM_THREADS=1`` makes it write the workers' bytes; on more threads a matrix product may sum in
another order and a score differ in its last bit).

Time, by the rule of every entry point (`sessrec.pipeline.clock`): an input with the schema's
``timestamp`` column gives each session its event times, from which the ranker's time features are
built, and serves it at its last event, where the allow/deny windows hold; a ``now`` given serves
every session at it, and a session whose last event comes more than `CLOCK_SKEW` after it is refused
(the message `Pipeline.recommend` and the server give, naming the file and the session). An input
without a time column is served at one ``now`` for every session: the one given, else the time the
run starts. That time is recorded in the manifest: a resumed run
serves at the time its first part was served at, and a run given another ``now`` starts over.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pyarrow as pa
import torch

from sessrec.data.batch import SessionBatch
from sessrec.data.schema import Schema
from sessrec.data.stream import ScoringStream
from sessrec.pipeline.clock import LATEST, check_now, check_served_after
from sessrec.pipeline.pipeline import Pipeline
from sessrec.pipeline.request import check_k
from sessrec.saved import versions
from sessrec.saved.atomic import digest
from sessrec.scoring.engine import Engine, load_once, worker_name
from sessrec.scoring.output import OutputFile
from sessrec.scoring.parts import PartsFolder, check_settings, write_part
from sessrec.scoring.predict import summary

LAST_EVENT = "last event"  # the manifest's ``now`` of an input with event times


def recommend_file(
    pipeline: str | os.PathLike | Pipeline,
    input_path: str | os.PathLike,
    output: str | os.PathLike,
    k: int = 20,
    batch_size: int = 1024,
    schema: Schema = Schema(),  # noqa: B008 - a config value, never mutated
    overwrite: bool = False,
    now: float | None = None,
    engine: Literal["local", "dask"] = "local",
    scheduler: str | None = None,
    workers: int | None = None,
    partition_batches: int = 8,
) -> dict:
    """Recommend `k` items for every session of `input_path`; write ``session_id``, ``item_ids``, ``scores``.

    Args:
        pipeline: a saved pipeline directory (or a loaded `Pipeline`, with the local engine).
        input_path: sessions file (see `ScoringStream`).
        output: the file to write, its format by its extension (`sessrec.scoring.output`): ``.parquet`` or
            ``.pq`` (``session_id``, ``item_ids``, ``scores``) or ``.csv`` (one row per recommendation:
            ``session_id``, ``rank``, ``item_id``, ``score``); missing folders on the way are created.
        k: recommendations per session.
        batch_size: sessions per batch.
        schema: column names of the input; its ``timestamp`` column (in its ``time_unit``), when
            the input has it, gives each session's event times and serves it at its last event.
        overwrite: replace an existing output (otherwise refuse).
        now: the time every session is served at (seconds since the epoch), for the allow/deny
            windows only; a session whose last event comes more than `CLOCK_SKEW` after it is refused.
            None: each session's last event time where the input has a time column, else the time
            the run starts (the time a resumed run started, recorded in its manifest).
        engine: ``local`` (this process) or ``dask`` (one task per partition on a Dask cluster).
        scheduler: with ``dask``, the address of a running Dask scheduler (``tcp://host:8786``); none: a
            local cluster of `workers` processes.
        workers: with ``dask`` and no scheduler, the processes of the local cluster, one thread each (none: 2);
            with ``local``, the partitions scored at once on threads of this process, one torch thread each
            (none: one at a time on torch's threads). One thread each writes the bytes of ``OMP_NUM_THREADS=1``.
        partition_batches: batches per partition and per part: the unit of work and of resumption.

    Returns:
        counts: sessions, partitions written and resumed (skipped), unknown items (of the partitions
        scored), the workers and how often each read the pipeline, output, and ``now`` (the time every
        session was served at; None: each at its last event).

    Raises:
        ValueError: `k`, `batch_size` or `partition_batches` below 1, `output` a directory, of another
            extension, the input itself or inside the pipeline directory, an engine setting that cannot be honoured (all before anything
            is read or written), an implausible `now` or event time (after the year 3000: milliseconds
            given as seconds), a `now` before a session's last event, or an input without a time column
            for a ranker fitted with time features or a retriever trained with event times (a refusal while scoring removes the parts written).
        FileExistsError: `output` exists and `overwrite` is false (before anything is read).
        PermissionError: `output` cannot be written there (`OutputFile.check`).
        OSError: the scheduler cannot be reached (one line naming its address).
    """
    k = check_k(k)  # the rule and message of every entry point
    out, input_path = OutputFile(output), Path(input_path).absolute()
    check_settings(k, batch_size, partition_batches)
    out.check(overwrite, [input_path], [] if isinstance(pipeline, Pipeline) else [pipeline])
    run_on = Engine(engine, scheduler, workers)
    if run_on.engine == "dask" and isinstance(pipeline, Pipeline):
        raise ValueError("--engine dask reads the pipeline on every worker from its directory: pass the saved "
                         "directory, not a loaded Pipeline")
    if now is not None:
        now = float(check_now(now, 1)[0])
    directory = None if isinstance(pipeline, Pipeline) else str(versions.resolve(pipeline).absolute())
    pipe = pipeline if isinstance(pipeline, Pipeline) else Pipeline.from_pretrained(directory)
    stream = ScoringStream(input_path, pipe.vocab, schema, pipe.history_length, batch_size, times=True)
    if (pipe.time_features or pipe.timed_retrievers) and not stream.times:
        where = f"column {schema.timestamp!r}" if schema.timestamp is not None else "a column named by the schema's timestamp"
        raise ValueError(f"{input_path}: {pipe.missing_times(where)}; the file has columns {stream.columns()}")
    stream.check_known()
    started = time.monotonic()
    settings = {"input": digest(input_path), "pipeline": pipe.content_hash, "k": k, "batch_size": batch_size,
                "partition_batches": partition_batches, "schema": repr(schema)}
    parts = PartsFolder(out, {**settings, "now": LAST_EVENT}, reusable=pipe.content_hash is not None, tag="recommend")
    if now is None and not stream.times:  # the time the run starts, or the one the run it resumes started at
        recorded = parts.recorded() or {}
        started_at = recorded.get("now")
        resumes = isinstance(started_at, float) and {**recorded, "now": None} == {**settings, "now": None}
        now = started_at if resumes else time.time()
    parts.manifest = {**settings, "now": LAST_EVENT if now is None else now}
    with parts:  # its lock held until the parts are joined
        with run_on.started() as runner:
            partitions = stream.partitions(batch_size * partition_batches)
            parts.open()
            pending = [(i, (p.start, p.stop)) for i, p in enumerate(partitions) if not parts.done(i)]
            print(f"[recommend] {input_path}: {len(partitions)} partitions of {partition_batches} batches of {batch_size} "
                  f"sessions, {len(partitions) - len(pending)} already written; scoring on {run_on.describe()}")
            job = RecommendJob(directory, pipe.content_hash, str(input_path), schema, batch_size, k, now,
                               str(parts.folder), pipe if runner.client is None else None)
            records = parts.run(lambda: runner.run(job, pending, str(parts.folder)))
        parts.join(len(partitions))
    counts = {**summary(records, partitions, time.monotonic() - started, out.path), "now": now}
    print(f"[recommend] {counts['sessions']} sessions -> {out.path} ({counts['partitions_written']} partitions scored, "
          f"{counts['partitions_resumed']} resumed, {counts['unknown_items']} unknown item ids scored as OOV)")
    return counts


@dataclass(frozen=True)
class RecommendJob:
    """Recommend for one partition of the input and write its part (a Dask task).

    Args:
        directory: the saved pipeline's version folder (None: `pipeline` given, the local engine).
        identity: its content hash (`Pipeline.content_hash`).
        input_path: the sessions file.
        schema: its column names.
        batch_size: sessions per batch.
        k: recommendations per session.
        now: the time every session is served at (None: each at its last event).
        parts: the parts folder.
        pipeline: the pipeline, where the run has it in memory (the local engine).
    """

    directory: str | None
    identity: str | None
    input_path: str
    schema: Schema
    batch_size: int
    k: int
    now: float | None
    parts: str
    pipeline: Pipeline | None = None

    def __call__(self, index: int, rows: tuple[int, int]) -> dict:
        """Write part `index` from the file rows `rows`; its counts, the worker and whether it read the pipeline."""
        pipe, loaded = self.pipeline, False
        if pipe is None:
            pipe, loaded = load_once(self.directory, self.identity, Pipeline.from_pretrained)
        stream = ScoringStream(self.input_path, pipe.vocab, self.schema, pipe.history_length, self.batch_size,
                               times=True, rows=rows)
        write_part(Path(self.parts) / f"part-{index:06d}.parquet", (self.recommend(pipe, b) for b in stream))
        return {"index": index, "sessions": stream.num_sessions, "items": stream.num_items,
                "unknown": stream.num_unknown, "worker": worker_name(), "pid": os.getpid(), "loaded": loaded}

    def recommend(self, pipe: Pipeline, batch: SessionBatch) -> pa.Table:
        """The recommendations of one batch, as `Pipeline.recommend` gives them for one request."""
        now = None if self.now is None else torch.full((len(batch),), self.now, dtype=torch.float64)
        times = _checked_times(batch, Path(self.input_path), self.schema)
        def name(row: int) -> str:
            return f"session {batch.keys[row].as_py()!r}"

        try:
            if now is not None and times is not None:
                check_served_after(now, times[:, -1], name)
            sessions = pipe.wrap(batch.items, times, now, name)
        except ValueError as err:
            raise ValueError(f"{self.input_path}: {err}") from None
        with torch.inference_mode():  # Arrow out: no tensor outlives the call
            item_ids, scores = pipe.decode_lists(pipe.recommend_batch(sessions, self.k))
        return pa.table({"session_id": batch.keys, "item_ids": item_ids, "scores": scores})


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
