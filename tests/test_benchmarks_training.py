"""Smoke tests of the training-side benchmark scripts (compile_speed, train_throughput, sampled_softmax,
predict_throughput): each runs end to end with `--quick` from the repository root, and its JSON records carry
the configuration `--quick` claims, every kind of record it promises and positive timings."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def quick_records(script: str) -> list[dict]:
    """`python benchmarks/<script> --quick` from the repository root: its JSON lines, after a zero exit."""
    done = subprocess.run(
        [sys.executable, f"benchmarks/{script}", "--quick"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


@pytest.mark.slow
def test_compile_speed_quick_run_times_eager_and_compiled():
    # TorchInductor's CPU code generation compiles C++: without a compiler the compiled side cannot run
    if not any(shutil.which(cxx) for cxx in ("g++", "c++", "clang++")):
        pytest.skip("no C++ compiler (g++/c++/clang++) for TorchInductor: encoder.compile() cannot run here")
    (r,) = quick_records("compile_speed.py")  # --quick compiles in-process (no worker pool): about 1 min with a cold cache
    assert (r["benchmark"], r["encoder"], r["d_model"], r["items"], r["batch_size"]) == ("compile_speed", "xlnet", 16, 300, 16)
    assert (r["widths"], r["threads"], r["timed_steps"]) == ([8], 1, 3)
    assert r["eager_step_ms"] > 0 and r["compiled_step_ms"] > 0
    assert r["eager_over_compiled"] == pytest.approx(r["eager_step_ms"] / r["compiled_step_ms"], rel=0.02)
    assert r["wall_s_including_compilation"] > 0


@pytest.mark.slow
def test_train_throughput_quick_run_prints_its_record():
    (r,) = quick_records("train_throughput.py")
    assert (r["benchmark"], r["encoder"]) == ("train_throughput", "xlnet_mlm")
    sizes = (r["batch_size"], r["items"], r["d_model"], r["n_head"], r["n_layer"], r["max_len"], r["threads"])
    assert sizes == (16, 300, 16, 2, 1, 8, 1) and r["timed_steps"] == 20
    assert r["parameters"] > 0 and r["median_masked_targets_per_step"] > 0
    assert 0 < r["step_ms_min_max"][0] <= r["median_step_ms"] <= r["step_ms_min_max"][1]
    assert r["steps_per_s"] > 0 and r["sessions_per_s"] > 0
    assert "peer" not in r and "compared" not in r


@pytest.mark.slow
def test_sampled_softmax_quick_run_prints_one_record_per_loss():
    records = quick_records("sampled_softmax.py")
    assert [r["loss"] for r in records] == ["full_softmax", "sampled_uniform", "sampled_popularity", "in_batch", "mixed"]
    for r in records:
        assert (r["benchmark"], r["encoder"]) == ("sampled_softmax", "xlnet")
        assert (r["items"], r["d_model"], r["n_layer"], r["batch_size"], r["threads"], r["timed_steps"]) == (2000, 16, 1, 32, 1, 3)
        assert r["samples"] == (0 if r["loss"] in ("full_softmax", "in_batch") else 64)
        assert r["median_targets_per_step"] > 0
        assert 0 < r["step_ms_min_max"][0] <= r["median_step_ms"] <= r["step_ms_min_max"][1]
        assert r["speedup_vs_full"] > 0
    assert records[0]["speedup_vs_full"] == 1.0
    assert len({r["median_targets_per_step"] for r in records}) == 1  # the same masked batches for every loss


@pytest.mark.slow
def test_predict_throughput_quick_run_reports_each_batch_size():
    (r,) = quick_records("predict_throughput.py")
    assert r["benchmark"] == "predict_throughput"
    assert (r["d_model"], r["n_head"], r["n_layer"], r["max_len"], r["items"]) == (16, 2, 1, 8, 300)
    assert (r["top_k"], r["threads"], r["repeats"]) == (20, 1, 3)
    assert [b["batch_size"] for b in r["results"]] == [16, 64]
    for b in r["results"]:
        assert 0 < b["batch_ms_min_max"][0] <= b["median_batch_ms"] <= b["batch_ms_min_max"][1]
        assert b["sessions_per_s"] == pytest.approx(b["batch_size"] / b["median_batch_ms"] * 1e3, rel=0.01)
