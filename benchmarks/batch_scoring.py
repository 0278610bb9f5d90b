"""Batch scoring in one process against 2 Dask workers: ``sessrec predict --engine local|dask`` on rsc15_100k.

The input is the sessions of rsc15_100k's ``train_full`` file as the dataset ships it (tab-separated,
gzipped, one row per event: 70,279 events), scored by a seeded XLNet-MLM (d_model 64, 2 heads,
2 layers, 20 items per session) over that file's items; the weights are not trained (the time to
score does not depend on them). Both contenders run `sessrec.scoring.predict_file` with the same
partitions (the same parts, joined into the same bytes, which the script checks):

- ``local``: the partitions one after the other in this process (torch: 1 thread);
- ``dask_1`` / ``dask_2``: one task per partition on a `distributed.LocalCluster` of 1 / 2 worker
  processes with one thread each, started once (its start, and the workers' first imports and model
  read, are timed apart: a warm-up run), reached with ``--scheduler`` as a long-lived cluster would
  be. One worker against this process is the engine's own cost; two, what a second core gives;
- ``dask_1_malloc_trim``: one worker started with Dask's own ``distributed.nanny.pre-spawn-environ``,
  ``MALLOC_TRIM_THRESHOLD_=65536`` included, which ``--workers`` leaves out.

The four run interleaved, ``--repeats`` times each after one warm-up run of each; the JSON line
reports their medians, sessions per second and the ratios, the 1-minute load average at the end (the
machine is shared), and the one-shot time of
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
from sessrec.scoring.engine import scoring_environ

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

    import dask
    from distributed import LocalCluster

    # name -> (workers, the variables they start with): as --workers starts them, and with Dask's own
    # (MALLOC_TRIM_THRESHOLD_ too; started last: a nanny puts them in this process's environment as well)
    specs = {"dask_1": (1, scoring_environ()), "dask_2": (2, scoring_environ()),
             "dask_1_malloc_trim": (1, dask.config.get("distributed.nanny.pre-spawn-environ"))}
    runs: dict[str, list[float]] = {"local": [], **{name: [] for name in specs}}
    outputs: dict[str, Path] = {}
    with contextlib.redirect_stdout(sys.stderr):  # predict_file's progress lines
        clusters, started = {}, {}
        for name, (workers, environ) in specs.items():
            begin = time.perf_counter()
            with dask.config.set({"distributed.nanny.pre-spawn-environ": environ}):
                clusters[name] = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                              dashboard_address=":0")
            started[name] = time.perf_counter() - begin
        engines = {"local": {"engine": "local"},
                   **{name: {"engine": "dask", "scheduler": c.scheduler_address} for name, c in clusters.items()}}

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
        for cluster in clusters.values():
            cluster.close()
        one_shot = predict_file(model_dir, events, folder / "one_shot.parquet", batch_size=args.batch_size,
                                schema=SCHEMA, engine="dask", workers=2, partition_batches=args.partition_batches)
    written = {path.read_bytes() for path in [*outputs.values(), folder / "one_shot.parquet"]}
    sessions = warm["local"]["sessions"]
    median = {name: statistics.median(times) for name, times in runs.items()}
    return {
        "system": "batch_scoring", "input": str(args.input), "quick": args.quick, "sessions": sessions,
        "vocabulary": vocab_size,
        "model": f"XLNet-MLM d_model {args.d_model}, 2 heads, {args.layers} layers, max_length 20, top 20",
        "batch_size": args.batch_size, "partition_batches": args.partition_batches,
        "partitions": warm["local"]["partitions_written"], "cpus": os.cpu_count(), "repeats": args.repeats,
        "load_average_1min": os.getloadavg()[0],
        **{f"{name}_s_runs": times for name, times in runs.items()},
        **{f"{name}_s_median": value for name, value in median.items()},
        **{f"{name}_sessions_per_s": sessions / value for name, value in median.items()},
        **{f"{name}_over_local": median["local"] / median[name] for name in specs},
        "cluster_start_s": started, "warmup_s": {name: counts["wall_s"] for name, counts in warm.items()},
        "warmup_model_reads": {name: counts["loads"] for name, counts in warm.items()},
        "one_shot_workers_2_s": one_shot["seconds"], "bytes_equal": len(written) == 1,
    }

if __name__ == "__main__":
    main()
