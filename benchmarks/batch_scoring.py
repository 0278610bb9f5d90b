"""Batch scoring in one process against 2 Dask workers: ``sessrec predict --engine local|dask`` on rsc15_100k.

The input is the sessions of rsc15_100k's ``train_full`` file as the dataset ships it (tab-separated,
gzipped, one row per event: 70,279 events), scored by a seeded XLNet-MLM (d_model 64, 2 heads,
2 layers, 20 items per session) over that file's items; the weights are not trained (the time to
score does not depend on them). Both contenders run `sessrec.scoring.predict_file` with the same
partitions (the same parts, joined into the same bytes, which the script checks):

- ``local``: the partitions one after the other in this process (torch: 1 thread);
- ``dask``: one task per partition on a `distributed.LocalCluster` of 2 worker processes with one
  thread each, started once (its start, and the workers' first imports and model read, are timed
  apart: a warm-up run), reached with ``--scheduler`` as a long-lived cluster would be.

The two run interleaved, ``--repeats`` times each after one warm-up run of each; the JSON line
reports their medians, sessions per second and the ratio, and the one-shot time of
``--engine dask --workers 2`` (a cluster started and closed by the run itself). Progress goes to
stderr, the JSON line to stdout.

Example (from the repository root):
    python benchmarks/batch_scoring.py
    python benchmarks/batch_scoring.py --quick
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.csv as pacsv
import torch

from sessrec.artifacts import Inference, SessionRecommender
from sessrec.data import ItemVocab
from sessrec.data.schema import Schema
from sessrec.models import MaskedItemModeling, SessionModel, XLNetEncoder
from sessrec.scoring import predict_file

ROOT = Path(__file__).resolve().parents[1]
INPUT = ROOT.parent / "shared" / "data" / "rsc15_100k" / "yoochoose-clicks-100k_train_full.txt.gz"
SCHEMA = Schema(session_id="SessionId", item_id="ItemId", timestamp=None)


def build_model(events: Path, folder: Path, d_model: int, layers: int, max_length: int) -> tuple[Path, int]:
    """A seeded, untrained XLNet-MLM over the items of `events`, saved as a model directory; and its vocabulary's size."""
    table = pacsv.read_csv(events, parse_options=pacsv.ParseOptions(delimiter="\t"))
    vocab = ItemVocab.fit(table.column("ItemId").combine_chunks())
    torch.manual_seed(0)
    model = SessionModel(len(vocab), XLNetEncoder(d_model=d_model, n_head=2, n_layer=layers), max_length=max_length)
    recommender = SessionRecommender(model.eval(), MaskedItemModeling(), vocab, Inference(max_length=max_length))
    return recommender.save_pretrained(folder / "model"), len(vocab)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", type=Path, default=INPUT, help="event file (SessionId, ItemId; tab-separated)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each contender, interleaved")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--partition-batches", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--quick", action="store_true",
                        help="smoke size: the first 3,000 events, d_model 16, 1 layer, batch 64, 1 repeat")
    args = parser.parse_args()
    if not args.input.exists():
        parser.error(f"{args.input}: no such file (the rsc15_100k folder of ../shared/data)")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="batch_scoring_") as tmp:
        print(json.dumps(measure(args, Path(tmp))))


def measure(args: argparse.Namespace, folder: Path) -> dict:
    """The contenders' timings on `args.input` (working files in `folder`)."""
    events = args.input
    if args.quick:
        args.repeats, args.batch_size, args.d_model, args.layers = 1, 64, 16, 1
        with gzip.open(args.input, "rt") as fh:
            head = [next(fh) for _ in range(3001)]
        events = folder / "events.tsv"
        events.write_text("".join(head))
    model_dir, vocab_size = build_model(events, folder, args.d_model, args.layers, max_length=20)

    from distributed import LocalCluster

    runs: dict[str, list[float]] = {"local": [], "dask": []}
    outputs: dict[str, Path] = {}
    with contextlib.redirect_stdout(sys.stderr):  # predict_file's progress lines
        start = time.perf_counter()
        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0")
        cluster_start = time.perf_counter() - start
        engines = {"local": {"engine": "local"}, "dask": {"engine": "dask", "scheduler": cluster.scheduler_address}}

        def score(name: str) -> dict:
            outputs[name] = folder / f"{name}.parquet"
            begin = time.perf_counter()
            counts = predict_file(model_dir, events, outputs[name], batch_size=args.batch_size, schema=SCHEMA,
                                  overwrite=True, partition_batches=args.partition_batches, **engines[name])
            counts["wall_s"] = time.perf_counter() - begin
            return counts

        warm = {name: score(name) for name in runs}  # the workers import sessrec and read the model here
        for _ in range(args.repeats):
            for name, times in runs.items():
                times.append(score(name)["wall_s"])
        cluster.close()
        one_shot = predict_file(model_dir, events, folder / "one_shot.parquet", batch_size=args.batch_size,
                                schema=SCHEMA, engine="dask", workers=2, partition_batches=args.partition_batches)
    same = outputs["local"].read_bytes() == outputs["dask"].read_bytes() == (folder / "one_shot.parquet").read_bytes()
    sessions = warm["local"]["sessions"]
    local_s, dask_s = statistics.median(runs["local"]), statistics.median(runs["dask"])
    return {
        "system": "batch_scoring", "input": str(args.input), "quick": args.quick, "sessions": sessions,
        "vocabulary": vocab_size,
        "model": f"XLNet-MLM d_model {args.d_model}, 2 heads, {args.layers} layers, max_length 20, top 20",
        "batch_size": args.batch_size, "partition_batches": args.partition_batches,
        "partitions": warm["local"]["partitions_written"], "workers": 2, "cpus": os.cpu_count(), "repeats": args.repeats,
        "local_s_runs": runs["local"], "dask_s_runs": runs["dask"], "local_s_median": local_s, "dask_s_median": dask_s,
        "local_sessions_per_s": sessions / local_s, "dask_sessions_per_s": sessions / dask_s,
        "dask_speedup": local_s / dask_s, "cluster_start_s": cluster_start, "dask_warmup_s": warm["dask"]["wall_s"],
        "dask_warmup_model_reads": warm["dask"]["loads"], "one_shot_workers_2_s": one_shot["seconds"],
        "bytes_equal": same,
    }


if __name__ == "__main__":
    main()
