"""Preparing an event log at scale: the in-memory path, ``--engine local``, ``--engine dask`` and Polars.

A synthetic click log is generated into a temporary folder (never committed): sessions of 6 events,
items drawn from a Zipf law (exponent 1) over a 1M-item catalogue, rows in arrival order (sessions
interleaved by time), 28 days; parquet in row groups of 1M rows. Each contender then prepares it:
sessions sorted by time and grouped, sessions of 2+ events kept, the last day test and the day before
validation, the vocabulary counted on the training sessions, everything written to parquet.

- ``memory``: `EventLogSource.load` + `ItemVocab.fit` (today's in-memory path), ``sessrec prepare --engine memory``;
- ``local``: ``sessrec prepare --engine local`` (2 threads, 4 GiB budget);
- ``dask``: ``sessrec prepare --engine dask`` on a local cluster of 2 worker processes (4 GiB together);
- ``polars``: Polars' streaming engine doing the same steps (sort by session and time, group, filter,
  split by end time, count the training items), sinking each result to parquet.

The three sessrec engines write the same files; each contender runs in a subprocess of its own, timed
there from after its imports (the dask figures include starting the local cluster), and its peak memory is the process tree's: ``peak_rss_mb`` the largest resident set of one of
its processes (``getrusage``), ``peak_tree_rss_mb`` the sum over the tree sampled every 0.1 s (psutil;
what a Dask cluster's driver, scheduler and workers hold together). Sizes run smallest first; the in-memory
path is skipped where its peak, extrapolated from the sizes it ran (bytes per event), would exceed
`--memory-cap` (its ``needed_gb`` says how much).

Prints one JSON line per (size, contender), with ``events_per_s`` and ``ratio_to_polars``
(events/s over Polars' at that size); progress on stderr.

Example (from the repository root):
    python benchmarks/etl_scale.py --repeats 3           # 1M, 10M (each 3 times, interleaved) and 100M events
    python benchmarks/etl_scale.py --sizes 1000000 10000000
    python benchmarks/etl_scale.py --quick               # 200,000 events, every contender
    python benchmarks/etl_scale.py --sizes 10000000 --write-log /tmp/log.parquet   # the log alone
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

CATALOGUE = 1_000_000
EVENTS_PER_SESSION = 6
DAYS = 28
CONTENDERS = ("memory", "local", "dask", "polars")
SCHEMA = {"session_id": "session_id", "item_id": "item_id", "timestamp": "timestamp"}


def generate(path: Path, events: int, seed: int = 0, chunk_sessions: int = 1_000_000) -> None:
    """The synthetic log (see the module's docstring), written a chunk of sessions at a time."""
    rng = np.random.default_rng(seed)
    cdf = np.cumsum(1.0 / np.arange(1, CATALOGUE + 1))
    cdf /= cdf[-1]
    sessions = events // EVENTS_PER_SESSION
    span = DAYS * 86400.0
    schema = pa.schema([("session_id", pa.int64()), ("item_id", pa.int64()), ("timestamp", pa.float64())])
    with pq.ParquetWriter(path, schema) as writer:
        for first in range(0, sessions, chunk_sessions):
            n = min(chunk_sessions, sessions - first)
            start = (first + np.arange(n) + rng.random(n)) * (span / sessions)  # sessions start in id order
            gaps = rng.exponential(60.0, (n, EVENTS_PER_SESSION)).cumsum(axis=1)
            times = (1.4e9 + start[:, None] + gaps).ravel()
            ids = np.repeat(first + np.arange(n, dtype=np.int64), EVENTS_PER_SESSION)
            items = np.searchsorted(cdf, rng.random(n * EVENTS_PER_SESSION)).astype(np.int64)
            order = np.argsort(times, kind="stable")  # arrival order
            table = pa.table({"session_id": ids[order], "item_id": items[order], "timestamp": times[order]})
            writer.write_table(table, row_group_size=1 << 20)


def import_contender(name: str) -> None:
    """Import what a contender runs (before its clock starts)."""
    if name == "polars":
        import polars  # noqa: F401
    else:
        import pyarrow as pa

        import sessrec.data.prepared.local  # noqa: F401

        pa.array([0]).to_numpy()  # pyarrow imports pandas on its first to_numpy (0.3 s): an import, before the clock
        if name == "dask":
            import dask.dataframe  # noqa: F401
            import distributed  # noqa: F401


def run_contender(name: str, log: str, out: str, workers: int, budget: str) -> None:
    """One contender, in this (sub)process."""
    if name == "polars":
        polars_sessionize(log, out)
        return
    from sessrec.data import EventLogSource, Schema, prepare

    source = EventLogSource(log, schema=Schema(**SCHEMA), test_days=1.0, valid_days=1.0)
    prepare(source, out, engine=name, memory_budget=budget, workers=workers)


def polars_sessionize(log: str, out: str) -> None:
    """The same preparation with Polars' streaming engine: each step sinks its result to parquet."""
    import polars as pl

    folder = Path(out)
    folder.mkdir(parents=True)
    sessions = (
        pl.scan_parquet(log)
        .sort(["session_id", "timestamp"], maintain_order=True)
        .group_by("session_id", maintain_order=True)
        .agg(pl.col("item_id"), pl.col("timestamp"))
        .filter(pl.col("item_id").list.len() >= 2)
        .with_columns(end=pl.col("timestamp").list.last())
    )
    sessions.sink_parquet(folder / "sessions.parquet", engine="streaming")
    scan = pl.scan_parquet(folder / "sessions.parquet")
    t_max = scan.select(pl.col("end").max()).collect(engine="streaming").item()
    t_test, t_valid = t_max - 86400.0, t_max - 2 * 86400.0
    splits = {"train": pl.col("end") <= t_valid, "valid": (pl.col("end") > t_valid) & (pl.col("end") <= t_test),
              "test": pl.col("end") > t_test}
    for split, keep in splits.items():
        scan.filter(keep).drop("end").sink_parquet(folder / f"{split}.parquet", engine="streaming")
    (pl.scan_parquet(folder / "train.parquet").select(pl.col("item_id").explode()).group_by("item_id").len()
     .sort(["len", "item_id"], descending=[True, False]).sink_parquet(folder / "vocab.parquet", engine="streaming"))
    (folder / "sessions.parquet").unlink()


def measure(name: str, log: str, scratch: Path, workers: int, budget: str) -> dict:
    """Run a contender in a subprocess: its seconds and the peak memory of its process tree."""
    import psutil

    out = scratch / f"out-{name}"
    code = ("import sys, time, resource; sys.path.insert(0, 'benchmarks'); "
            "from etl_scale import import_contender, run_contender; import_contender(sys.argv[1]); "
            "t = time.perf_counter(); run_contender(*sys.argv[1:4], int(sys.argv[4]), sys.argv[5]); "
            "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "
            "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    proc = subprocess.Popen([sys.executable, "-c", code, name, log, str(out), str(workers), budget],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    peak_tree = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak_tree
        root = psutil.Process(proc.pid)
        while not done.is_set():
            try:
                procs = [root, *root.children(recursive=True)]
                peak_tree = max(peak_tree, sum(p.memory_info().rss for p in procs if p.is_running()))
            except psutil.Error:
                pass
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, stderr = proc.communicate()
    done.set()
    sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{stderr[-3000:]}")
    seconds, own, children = stdout.strip().splitlines()[-1].split()
    subprocess.run(["rm", "-rf", str(out)], check=True)
    return {"seconds": float(seconds), "peak_rss_mb": round(max(int(own), int(children)) / 1024, 1),  # KiB
            "peak_tree_rss_mb": round(peak_tree / 2**20, 1)}


def extrapolated(runs: list[tuple[int, float]], events: int) -> float:
    """Peak bytes of the in-memory path at `events`, from its two largest runs (bytes per event between them
    above the fixed cost), or in proportion to its one run."""
    if len(runs) == 1:
        return runs[0][1] * events / runs[0][0]
    (n0, b0), (n1, b1) = sorted(runs)[-2:]
    return b1 + (b1 - b0) / (n1 - n0) * (events - n1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000, 100_000_000])
    parser.add_argument("--contenders", nargs="+", default=list(CONTENDERS), choices=CONTENDERS)
    parser.add_argument("--workers", type=int, default=2, help="local engine threads, dask workers")
    parser.add_argument("--memory-budget", default="4GiB", help="of the local engine, of the dask workers together")
    parser.add_argument("--memory-cap", type=float, default=6.0, help="GB the in-memory path may need, else skipped")
    parser.add_argument("--memory-runs", type=float, nargs="*", default=[],
                        help="events and peak bytes of earlier in-memory runs (e1 b1 e2 b2), for its extrapolation")
    parser.add_argument("--scratch", default=None, help="folder for the logs and outputs (a temporary one inside)")
    parser.add_argument("--repeats", type=int, default=1, help="interleaved runs of each contender (the median)")
    parser.add_argument("--repeat-below", type=int, default=20_000_000, help="repeat only sizes up to this")
    parser.add_argument("--quick", action="store_true", help="200,000 events, every contender")
    parser.add_argument("--write-log", default=None, help="write the log of the first size here and stop")
    args = parser.parse_args()
    sizes = [200_000] if args.quick else args.sizes
    if args.write_log:
        generate(Path(args.write_log), sizes[0])
        return
    memory_runs = [(int(e), b) for e, b in zip(args.memory_runs[::2], args.memory_runs[1::2], strict=True)]
    with tempfile.TemporaryDirectory(prefix="etl-scale-", dir=args.scratch) as tmp:
        scratch = Path(tmp)
        for events in sizes:
            log = scratch / f"log-{events}.parquet"
            t = time.perf_counter()
            generate(log, events)
            print(f"generated {events:,} events in {time.perf_counter() - t:.1f} s", file=sys.stderr)
            rows = pq.ParquetFile(log).metadata.num_rows
            repeats = args.repeats if rows <= args.repeat_below else 1
            results = {name: {"benchmark": "etl_scale", "events": rows, "contender": name, "workers": args.workers,
                              "memory_budget": args.memory_budget, "repeats": repeats, "quick": args.quick}
                       for name in args.contenders}
            if "memory" in results and memory_runs:
                needed = extrapolated(memory_runs, rows)
                if needed > args.memory_cap * 1e9:
                    results["memory"].update(skipped=True, needed_gb=round(needed / 1e9, 1))
            runs: dict[str, list[dict]] = {name: [] for name in results}
            for _ in range(repeats):  # interleaved: A, B, C, D, A, B, ...
                for name, record in results.items():
                    if not record.get("skipped"):
                        print(f"{events:,} events: {name} ...", file=sys.stderr)
                        runs[name].append(measure(name, str(log), scratch, args.workers, args.memory_budget))
                        if repeats == 1:
                            print(json.dumps({**record, **runs[name][0]}), file=sys.stderr, flush=True)  # as it ends
            for name, record in results.items():
                if runs[name]:
                    record["seconds"] = statistics.median(r["seconds"] for r in runs[name])
                    record["peak_rss_mb"] = max(r["peak_rss_mb"] for r in runs[name])
                    record["peak_tree_rss_mb"] = max(r["peak_tree_rss_mb"] for r in runs[name])
                    record["events_per_s"] = round(rows / record["seconds"])
            if "seconds" in results.get("memory", {}):
                memory_runs.append((rows, results["memory"]["peak_tree_rss_mb"] * 2**20))
            polars = results.get("polars", {}).get("events_per_s")
            for record in results.values():
                if polars and "events_per_s" in record:
                    record["ratio_to_polars"] = round(record["events_per_s"] / polars, 2)
                print(json.dumps(record), flush=True)
            log.unlink()


if __name__ == "__main__":
    main()
