"""Smoke test of benchmarks/streaming_memory.py: its quick run ends and its records carry what they claim."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_streaming_memory_quick_run_prints_both_loaders_at_both_sizes():
    done = subprocess.run([sys.executable, "benchmarks/streaming_memory.py", "--quick"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(r.get("loader"), r["sessions"]) for r in records] == [
        ("memory", 20_000), ("streaming", 20_000), (None, 20_000), ("memory", 100_000), ("streaming", 100_000), (None, 100_000)]
    for r in records:
        if "loader" in r:
            assert (r["batch_size"], r["items"], r["group_rows"], r["max_length"]) == (512, 10_000, 4096, 20)
            assert r["shuffle_buffer"] == (8192 if r["loader"] == "streaming" else None)
            assert r["batches"] == r["sessions"] // 512 and r["rows_seen"] == r["batches"] * 512  # drop_last, both
            assert abs(r["peak_rss_mb"] - r["base_rss_mb"] - r["data_mb"]) <= 1  # each rounded
        else:
            assert r["peak_rss_ratio_memory_to_streaming"] > 0 and r["speed_ratio_streaming_to_memory"] > 0
