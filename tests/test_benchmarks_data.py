"""Smoke test of the data preparation benchmark: ``benchmarks/etl_scale.py --quick`` runs every contender
end to end on a generated log in a temporary folder of its own, and its JSON records carry what they claim
(the timings belong to docs/benchmarks.md)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_etl_scale_quick_run_prints_every_contender_with_its_ratio_to_polars():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "benchmarks/etl_scale.py", "--quick"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["contender"] for r in records] == ["memory", "local", "dask", "polars"]
    for r in records:
        assert r["benchmark"] == "etl_scale" and r["quick"] and r["events"] == 199_998  # 33,333 sessions of 6
        assert r["seconds"] > 0 and r["events_per_s"] == round(r["events"] / r["seconds"])
        assert r["peak_rss_mb"] > 20 and r["peak_tree_rss_mb"] > 20  # the tree's is sampled: a short peak may fall between
        assert r["ratio_to_polars"] == round(r["events_per_s"] / records[-1]["events_per_s"], 2)
    assert records[-1]["ratio_to_polars"] == 1.0
    assert records[2]["peak_tree_rss_mb"] > records[2]["peak_rss_mb"]  # dask: the workers beside the driver
