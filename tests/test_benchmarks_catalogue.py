"""Smoke tests of benchmarks/large_catalogue.py: `--quick` runs every part end to end at 25k items from the
repository root (one child process per measurement) and its JSON records carry the sizes they claim, with
positive timings; a memory budget below every estimate skips each measurement with its estimate."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ITEMS = 25_000


def records(*args: str) -> list[dict]:
    done = subprocess.run(
        [sys.executable, "benchmarks/large_catalogue.py", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=1200, check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


@pytest.mark.slow
def test_large_catalogue_quick_run_measures_every_part_at_25k_items():
    out = records("--quick")
    assert [(r["part"], r.get("raw_ids") or r.get("index")) for r in out] == [
        ("vocab", "int64"), ("vocab", "string"), ("train", None), ("head_lookups", None), ("eval", None),
        ("ann", "faiss-ivf"), ("ann", "faiss-hnsw")]
    assert all(r["items"] == ITEMS and r["benchmark"] == "large_catalogue" and r["threads"] == 1 for r in out)
    int_vocab, text_vocab, train, lookups, evaluation, ivf, hnsw = out
    for r in (int_vocab, text_vocab):
        assert r["events"] == 5 * ITEMS
        assert min(r["fit_s"], r["encode_events_per_s"], r["encode_request_ms"], r["file_bytes_per_item"]) > 0
    assert int_vocab["vocab_bytes_per_item"] == 16.0  # an int64 raw id and an int64 count
    assert text_vocab["vocab_bytes_per_item"] > 16.0  # "item" + digits, offsets, counts
    assert (train["dim"], train["batch"], train["samples"], train["timed_steps"]) == (64, 256, 1024, 2)
    assert (train["optimizer"], train["item_grad_layout"], train["table_bytes_per_item"]) == ("AdamW", "dense", 256)
    assert train["parameters"] > (ITEMS + 2) * 65  # the table and the output bias, plus the encoder
    assert train["step_ms"] == pytest.approx(train["forward_ms"] + train["backward_ms"] + train["optimizer_ms"], abs=0.2)
    assert min(train["forward_ms"], train["backward_ms"], train["optimizer_ms"], train["sampler_ms"]) > 0
    assert lookups["timed_steps"] == 2 and min(lookups["library_step_ms"], lookups["dense_lookups_step_ms"]) > 0
    assert lookups["speedup"] == pytest.approx(lookups["dense_lookups_step_ms"] / lookups["library_step_ms"], abs=0.01)
    assert evaluation["eval_batch"] == 16 and evaluation["test_step_s"] > 0 and evaluation["serve_top20_one_session_ms"] > 0
    for r in (ivf, hnsw):
        assert (r["vector_width"], r["k"], r["queries"]) == (65, 100, 20)
        assert 0 < r["recall@k"] <= 1 and r["ann_ms_per_query"] > 0 and r["build_s"] > 0
    assert ivf["nlist"] == round(4 * ITEMS ** 0.5) and ivf["nprobe"] == 32
    assert hnsw["ef_search"] == 384


@pytest.mark.slow
def test_a_budget_below_every_estimate_skips_each_measurement_with_its_estimate():
    out = records("--items", "1000000", "10000000", "--memory-gb", "0.1")
    assert [(r["part"], r["items"]) for r in out] == [
        (part, n) for part in ("vocab", "train", "head_lookups", "eval", "ann") for n in (1_000_000, 10_000_000)]
    assert all(r["skipped"].startswith("estimated peak ") and r["skipped"].endswith("> --memory-gb 0.1") for r in out)
