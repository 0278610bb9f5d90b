"""Smoke tests of the ranking and export benchmark scripts (dlrm, sharded_dlrm, export_parity, loader):
each runs end to end with ``--quick`` from the repository root and its JSON records carry the
configuration they claim, with positive timings where it times."""

import functools
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TRIVAGO = ROOT.parent / "shared" / "data" / "trivago_rsc19_100k" / "trivago_val_100k.parquet.snappy"


def quick_run(script: str, *args: str, timeout: int = 120) -> list[dict]:
    done = subprocess.run([sys.executable, f"benchmarks/{script}", "--quick", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


@functools.cache
def torchrec_usable() -> bool:
    """Whether ``import torchrec`` works in a script's process (CI installs it without its deps); asked in a
    subprocess, as the scripts run, since here its import warnings would be errors; once per test process
    (the import takes seconds)."""
    done = subprocess.run([sys.executable, "-c", "import torchrec"], cwd=ROOT, capture_output=True, timeout=60, check=False)
    return done.returncode == 0


@pytest.mark.slow
def test_dlrm_benchmark_quick_run_prints_its_records():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from dlrm import cardinalities
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    records = quick_run("dlrm.py")
    variants = ["sessrec_fused_rowwise_adagrad", "sessrec_dense_adagrad", "torchrec_dense_adagrad"]
    timed = [r for r in records if r["bench"] == "dlrm_train" and "skipped" not in r]
    skipped = [r["variant"] for r in records if "skipped" in r]
    assert skipped == ([] if torchrec_usable() else ["torchrec_dense_adagrad"])
    assert [r["variant"] for r in timed] == [v for v in variants if v not in skipped]
    for r in timed:  # --quick: 4 tables of 100-1000 rows, batch 256
        assert (r["batch"], r["tables"], r["rows"], r["dim"], r["multi_hot"], r["threads"]) == (
            256, 4, "100-1000 log-uniform", 16, 1, 1)
        assert r["total_rows"] == sum(cardinalities(4, 1e2, 1e3, 0))
        assert (r["dense_layers"], r["over_layers"]) == ([64, 16], [128, 64])
        assert 0 < r["min"] <= r["samples_per_s"] <= r["max"]
        assert ("vs_torchrec" in r) is not bool(skipped)
    summary = records[-1]
    assert summary["bench"] == "dlrm_train_summary"
    assert summary["samples_per_s"] == {r["variant"]: r["samples_per_s"] for r in timed}


@pytest.mark.slow
def test_loader_benchmark_quick_run_compares_both_loaders_on_synthetic_sessions():
    records = quick_run("loader.py")
    assert [r["batch_size"] for r in records] == [64, 128]
    for r in records:
        assert (r["benchmark"], r["dataset"], r["max_length"]) == ("loader", "synthetic", 20)
        assert (r["batches_per_measurement"], r["repeats"], r["threads"]) == (5, 2, 1)
        assert r["sessions"] >= 5 * r["batch_size"]  # 5 full batches were drawn
        assert r["sessrec_sessions_per_s"] > 0 and r["torch_dataset_sessions_per_s"] > 0
        assert r["ratio"] > 0 and 0 < r["ratio_min_max"][0] <= r["ratio_min_max"][1]


@pytest.mark.slow
def test_export_parity_quick_run_exports_refuses_and_matches():
    pytest.importorskip("onnxruntime")  # the deploy extra: the ONNX rows run under it
    records = quick_run("export_parity.py")
    assert [(r["model"], r["format"], r["exported"]) for r in records] == [
        ("xlnet-mlm", "onnx", True), ("xlnet-mlm", "torchscript", True),
        ("gru4rec-clm", "onnx", False), ("gru4rec-clm", "torchscript", True),
        ("dlrm-dot", "onnx", True), ("dlrm-dot", "torchscript", True),
    ]
    for r in records:
        if not r["exported"]:
            assert r["reason"].startswith("GRU4RecEncoder cannot be exported to onnx")
            continue
        assert 0.0 <= r["max_abs_diff"] <= 1e-4
        if r["model"].startswith("dlrm"):
            assert r["shapes"] == [[1, 1], [50, 3]]
        else:
            assert r["shapes"] == [[1, 1], [7, 13]] and r["identical_top20"] is True


@pytest.mark.slow
def test_sharded_dlrm_quick_run_compares_one_and_two_processes(tmp_path):
    if not torchrec_usable():
        pytest.skip("torchrec is not importable (the torchrec extra with its deps, docs/sharding.md)")
    if not TRIVAGO.exists():
        pytest.skip(f"the trivago click-out log is missing: {TRIVAGO}")
    if shutil.which("sessrec") is None:
        pytest.skip("the sessrec command is not on PATH (pip install -e .)")
    (record,) = quick_run("sharded_dlrm.py", "--work", str(tmp_path / "work"), timeout=300)
    runs = {"one_process", "two_processes_sharded"}
    assert record["benchmark"] == "sharded_dlrm" and record["quick"] is True
    assert record["steps_compared"] == 3  # --quick: 3 training batches, every step logged
    assert record["train_loss_max_abs_diff"] >= 0
    assert set(record["train_loss_first_last"]) == set(record["val_mrr_by_epoch"]) == set(record["test_mrr"]) == runs
    assert all(list(v) == ["0"] for v in record["val_mrr_by_epoch"].values())  # one epoch
    assert all(0 < v <= 1 for v in record["test_mrr"].values())
    assert all(v > 0 for v in record["fit_seconds"].values())
