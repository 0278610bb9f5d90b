"""A session model's top-k for every session of a file, partition by partition, on an `Engine`.

`predict_file` is what ``sessrec predict --engine dask`` runs: the input is cut into partitions of
whole sessions (`ScoringStream.partitions`, `partition_batches` batches each), each partition is
scored by `TopKJob` (on a Dask worker: the model directory read once per worker, `load_once`) into
its own part, and the parts are joined in input order (`PartsFolder`). A rerun with the same input,
model and settings scores only the partitions without a complete part.

The output is the one ``sessrec predict`` writes in one process (`sessrec.tasks.TopKWriter`), byte
for byte: the same batches (`ScoringStream` cuts them the same way whatever the partitions), the
same scores (`next_item_scores`, the call of `NextItemTask.recommend`), the same table per batch
(`topk_table`), one row group each. Workers need the scoring stack only: this module imports
neither Lightning nor the training side.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pyarrow as pa
import torch

from sessrec.artifacts.session_recommender import SessionRecommender
from sessrec.data.batch import SessionBatch
from sessrec.data.schema import Schema
from sessrec.data.stream import Partition, ScoringStream
from sessrec.data.vocab import ItemVocab, decode_lists
from sessrec.models.session_model import next_item_scores, top_recommendable
from sessrec.saved import versions
from sessrec.saved.atomic import digest
from sessrec.scoring.engine import Engine, load_once, worker_name
from sessrec.scoring.output import OutputFile
from sessrec.scoring.parts import PartsFolder, check_settings, write_part


def topk_table(keys: pa.Array, vocab: ItemVocab, items: torch.Tensor, scores: torch.Tensor) -> pa.Table:
    """``session_id``, ``item_ids`` (raw ids, best first) and ``scores`` (float32) of a batch: its
    session ids and the raw ids and scores of its (B, K) top model ids, the empty slots (id 0: a
    session with fewer recommendable items, `top_recommendable`) dropped."""
    item_ids, values = decode_lists(vocab, items, scores.detach().float())
    return pa.table({"session_id": keys, "item_ids": item_ids, "scores": values})


@dataclass(frozen=True)
class TopKJob:
    """Score one partition of the input with a model directory and write its part (a Dask task).

    Args:
        folder: the model directory's version folder (`sessrec.saved.versions.resolve`).
        identity: its content hash (the hash of its ``config.json``, which records every part's).
        input_path: the sessions file.
        schema: its column names.
        batch_size: sessions per batch.
        k: recommendations per session.
        exclude_seen: never recommend an item of the session.
        parts: the parts folder.
        times: give the batches the file's event times (the schema's timestamp column).
    """

    folder: str
    identity: str
    input_path: str
    schema: Schema
    batch_size: int
    k: int
    exclude_seen: bool
    parts: str
    times: bool

    def __call__(self, index: int, rows: tuple[int, int]) -> dict:
        """Write part `index` from the file rows `rows`; its counts, the worker and whether it read the model."""
        recommender, loaded = load_once(self.folder, self.identity, SessionRecommender.from_pretrained)
        stream = ScoringStream(self.input_path, recommender.vocab, self.schema, recommender.inference.max_length,
                               self.batch_size, side=recommender.side_transform, times=self.times, rows=rows,
                               schema_flag="--data.predict_schema")
        write_part(Path(self.parts) / f"part-{index:06d}.parquet", (self.score(recommender, b) for b in stream))
        return {"index": index, "sessions": stream.num_sessions, "items": stream.num_items,
                "unknown": stream.num_unknown, "worker": worker_name(), "pid": os.getpid(), "loaded": loaded}

    def score(self, recommender: SessionRecommender, batch: SessionBatch) -> pa.Table:
        """The top-k table of one batch, as `NextItemTask.recommend` scores it."""
        model = recommender.model
        with torch.inference_mode():
            scores = next_item_scores(model, recommender.objective, batch.items, model.batch_features(batch),
                                      self.exclude_seen)
            items, values = top_recommendable(scores, self.k, int(model.recommendable.sum()))
        return topk_table(batch.keys, recommender.vocab, items, values)


def predict_file(
    model_dir: str | os.PathLike,
    input_path: str | os.PathLike,
    output: str | os.PathLike,
    k: int | None = None,
    exclude_seen: bool | None = None,
    batch_size: int = 1024,
    schema: Schema = Schema(),  # noqa: B008 - a config value, never mutated
    overwrite: bool = False,
    engine: Literal["local", "dask"] = "local",
    scheduler: str | None = None,
    workers: int | None = None,
    partition_batches: int = 8,
    times: bool | None = None,
) -> dict:
    """Write the top-`k` items of every session of `input_path` to `output` (``session_id``, ``item_ids``, ``scores``;
    in CSV one row per recommendation).

    Args:
        model_dir: a session model's directory (``runs/<name>/model``).
        input_path: sessions file (parquet or CSV; `ScoringStream`'s layouts).
        output: the file to write, its format by its extension (`sessrec.scoring.output`: ``.parquet``/``.pq``
            or ``.csv``); its parts go to ``<output>.parts/`` until joined.
        k: recommendations per session (None: the model's inference setting ``top_k``).
        exclude_seen: never recommend an item of the session (None: the model's inference setting).
        batch_size: sessions per batch.
        schema: column names of the input.
        overwrite: replace an existing output (otherwise refuse, before anything is scored).
        engine: ``local`` (this process, without the Trainer) or ``dask`` (one task per partition on a Dask
            cluster).
        scheduler: with ``dask``, the address of a running Dask scheduler (``tcp://host:8786``); none: a
            local cluster of `workers` processes.
        workers: with ``dask`` and no scheduler, the processes of the local cluster, one thread each (none: 2);
            with ``local``, the partitions scored at once on threads of this process, one torch thread each.
        partition_batches: batches per partition (and per part): the unit of work and of resumption.
        times: give the batches the event times of the schema's timestamp column (``--data.times``): None,
            when the model reads them (its ``uses_times``) and the file has the column; True: where the
            file has it; False: never (refused for a model trained with times).

    Returns:
        counts: sessions, items, unknown items, partitions (written, resumed), the workers that scored
        them and how often each read the model, seconds, output.

    Raises:
        ValueError: a setting below 1, `output` a directory, of another extension, the input itself or inside
            `model_dir`, an engine setting that cannot be honoured, a directory that holds no session model, a model
            trained with event times for sessions without a time column (all before anything is read or scored); a
            bad row of the input (the parts written are removed).
        FileExistsError: `output` exists and `overwrite` is false.
        PermissionError: `output` cannot be written there (`OutputFile.check`).
        OSError: the scheduler cannot be reached (one line naming its address).
    """
    out, input_path = OutputFile(output, "--scoring.output"), Path(input_path).absolute()
    out.check(overwrite, [input_path], [model_dir])
    run_on = Engine(engine, scheduler, workers)
    folder = versions.resolve(model_dir).absolute()
    recommender = SessionRecommender.from_pretrained(folder)  # refused here, in one line, before any scoring
    k = recommender.inference.top_k if k is None else k
    exclude_seen = recommender.inference.exclude_seen if exclude_seen is None else exclude_seen
    check_settings(k, batch_size, partition_batches)
    identity = digest(folder / "config.json")
    times = recommender.model.uses_times if times is None else times
    stream = ScoringStream(input_path, recommender.vocab, schema, recommender.inference.max_length, batch_size,
                           times=times, schema_flag="--data.predict_schema")
    if recommender.model.needs_times and not stream.times:
        why = "none (--data.times false)" if times is False else stream.no_times
        raise ValueError(f"{input_path}: the model was trained with event times and these sessions have "
                         f"{why}; give them their time column (--data.predict_schema.timestamp)"
                         + (" and set --data.times null" if times is False else ""))
    stream.check_known()
    started = time.monotonic()
    manifest = {"input": digest(input_path), "model": identity, "k": k, "exclude_seen": exclude_seen,
                "batch_size": batch_size, "partition_batches": partition_batches, "schema": repr(schema),
                "times": stream.times}
    with PartsFolder(out, manifest, tag="predict") as parts:  # its lock held until the parts are joined
        with run_on.started() as runner:
            if runner.client is None:  # this process scores: with the model read above
                load_once(str(folder), identity, lambda _: recommender)
            partitions = stream.partitions(batch_size * partition_batches)
            parts.open()
            pending = [(i, (p.start, p.stop)) for i, p in enumerate(partitions) if not parts.done(i)]
            print(f"[predict] {input_path}: {len(partitions)} partitions of {partition_batches} batches of {batch_size} "
                  f"sessions, {len(partitions) - len(pending)} already written; scoring on {run_on.describe()}")
            job = TopKJob(str(folder), identity, str(input_path), schema, batch_size, k, exclude_seen, str(parts.folder),
                          stream.times)
            records = parts.run(lambda: runner.run(job, pending, str(parts.folder)))
        parts.join(len(partitions))
    counts = summary(records, partitions, time.monotonic() - started, out.path)
    print(f"[predict] wrote {out.path}: {counts['partitions_written']} partitions scored, {counts['partitions_resumed']} "
          f"resumed; {counts['unknown_items']} of {counts['items']} input items of those scored were unknown to the "
          f"model (scored as OOV); model read {sum(counts['loads'].values())} times ({len(counts['loads'])} workers)")
    return counts


def summary(records: list[dict], partitions: list[Partition], seconds: float, output: Path) -> dict:
    """The counts of a run: sessions of the input, and from the records of the partitions it scored, the
    items and unknown items read, the partitions written and resumed, each worker's reads of the model."""
    loads: dict[str, int] = {}
    for record in records:
        loads[record["worker"]] = loads.get(record["worker"], 0) + int(record["loaded"])
    return {"sessions": sum(p.sessions for p in partitions), "items": sum(r["items"] for r in records),
            "unknown_items": sum(r["unknown"] for r in records), "partitions_written": len(records),
            "partitions_resumed": len(partitions) - len(records), "loads": loads, "seconds": seconds, "output": str(output)}
