"""Smoke test of the batch-scoring benchmark: `benchmarks/batch_scoring.py --quick` runs end to end on
rsc15_100k and its JSON record carries what `--quick` sets (timings belong to docs/benchmarks.md)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_batch_scoring_quick_run_writes_the_same_bytes_on_two_workers(shared_data):
    shared_data("rsc15_100k")
    done = subprocess.run([sys.executable, "benchmarks/batch_scoring.py", "--quick"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    (record,) = [json.loads(line) for line in done.stdout.splitlines()]
    assert (record["quick"], record["repeats"], record["batch_size"]) == (True, 1, 64)
    assert record["sessions"] > 700 and record["partitions"] == -(-record["sessions"] // (64 * 4))
    assert record["bytes_equal"] is True
    reads = record["warmup_model_reads"]  # each worker read the model once
    assert (list(reads["dask_1"].values()), sorted(reads["dask_2"].values())) == ([1], [1, 1])
    assert min(record[f"{name}_s_median"] for name in ("local", "dask_1", "dask_2", "dask_1_malloc_trim")) > 0
