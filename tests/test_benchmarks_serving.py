"""Smoke tests of the serving and lifecycle benchmark scripts: each runs end to end with `--quick` and its
JSON records carry the configuration `--quick` sets (timings are not checked: they belong to benchmarks/)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_quick(script: str, *flags: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, f"benchmarks/{script}", "--quick", *flags], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, check=False)


@pytest.mark.slow
def test_serve_load_quick_run_serves_its_own_tiny_pipeline():
    done = run_quick("serve_load.py", "--overload")
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["system"] for r in records] == ["serve-model-batch"] * 2 + ["serve", "serve", "serve-overload",
                                                                           "serve-bad-requests"]
    for r, batch in zip(records[:2], [1, 4]):  # --quick: the model timed at batch 1 and 4, 8 sessions each
        assert (r["model"], r["batch"], r["calls"], r["threads"]) == ("Pipeline", batch, max(3, 8 // batch), 1)
        assert list(r["stages_cpu_ms_per_call"]) == ["parse_encode", "join", "retrieve_covisitation", "merge_filters",
                                                      "score", "ordering", "decode", "answers"]
        assert r["cpu_ms_per_session"] == pytest.approx(r["cpu_ms_per_call"] / batch, abs=1e-3)
    for r, concurrency in zip(records[2:4], [1, 4]):  # --quick: concurrency 1 and 4, 20 requests each
        assert (r["concurrency"], r["requests"], r["errors"], r["threads"]) == (concurrency, 20, 0, 1)
        assert (r["model"], r["items"], r["max_batch_size"], r["max_wait_ms"]) == ("Pipeline", 58, 64, 2.0)
        assert r["p99_ms"] >= r["p50_ms"] > 0
        assert r["model_calls"] >= 20 / concurrency and r["mean_model_call_ms"] > 0
        split = r["server_loop_cpu_us_per_request"] + r["server_other_threads_cpu_us_per_request"]
        assert r["server_cpu_us_per_request"] == pytest.approx(split, abs=1)  # each rounded to the microsecond
    flood = records[4]
    assert (flood["sessions_per_request"], flood["seconds"], flood["factor"]) == (8, 2.0, 4.0)
    assert flood["capacity_requests_per_s"] > 0 and flood["unanswered"] == 0
    assert sum(flood["statuses"].values()) == flood["offered_requests"] == flood["answered"]
    assert set(flood["statuses"]) <= {"200", "503", "504"}
    assert flood["health"]["probes"] > 0 and flood["rss_after_mb"] > 0
    bad = records[5]
    assert bad["all_4xx"] and bad["server_alive"] and bad["health_after"] == 200
    assert bad["statuses"]["body_over_limit_chunked"] == 413 and bad["statuses"]["broken_json"] == 400


@pytest.mark.slow
def test_serve_cold_start_quick_run_times_one_round():
    done = run_quick("serve_cold_start.py")
    assert done.returncode == 0, done.stderr[-2000:]
    (record,) = [json.loads(line) for line in done.stdout.splitlines()]
    assert (record["checkout"], record["path"], record["repeats"]) == ("current", str(ROOT), 1)
    assert Path(record["model_dir"]).name == "pipeline"  # --quick: its own tiny pipeline
    assert len(record["serve_ready_s_runs"]) == 1 and record["serve_ready_s_median"] > 0
    assert record["serve_rss_mib_median"] > 0
    assert record["import sessrec.serving.server_s_median"] > 0
    assert not any(key.startswith("import sessrec.pipeline") for key in record)  # --quick: the server's import only
    # docs/deploy.md: the serving module loads no training stack, the serve command no Lightning
    assert record["import sessrec.serving.server_training_stack"] == []
    assert not {"pytorch_lightning", "lightning_fabric", "lightning"} & set(record["serve_training_stack"])


@pytest.mark.slow
def test_resume_check_quick_run_resumes_where_it_was_killed():
    done = run_quick("resume_check.py")
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads(done.stdout)  # one indented JSON object
    assert (record["benchmark"], record["recipe"], record["quick"]) == ("resume_check", "recipes/quickstart.yaml", True)
    assert record["killed_at_step"] == record["resumed_from_step"] == 6  # last.ckpt every 3 steps
    assert set(record["uninterrupted"]) == set(record["resumed"]) >= {"val/loss", "val/recall@20", "val/ndcg@20"}
    assert record["max_abs_diff"] < 1e-5


@pytest.mark.slow
def test_t4r_peer_quick_run():
    """The script runs Transformers4Rec alone (sessrec's side is `sessrec fit`): without it, one line naming it."""
    if importlib.util.find_spec("transformers4rec") is None:
        done = run_quick("t4r_peer.py", timeout=60)
        assert done.returncode == 1 and done.stdout == ""
        (line,) = done.stderr.strip().splitlines()
        assert line.startswith("t4r_peer.py needs transformers4rec")
        pytest.skip("transformers4rec is not installed here (Transformers4Rec 23.12 runs in its own virtualenv)")
    done = run_quick("t4r_peer.py")
    assert done.returncode == 0, done.stderr[-2000:]
    (record,) = [json.loads(line) for line in done.stdout.splitlines()]
    assert record["library"].startswith("transformers4rec")
    assert Path(record["dataset"]) == ROOT / "tests/fixtures/merlin/sequence_testing"
    settings = record["settings"]
    assert (settings["epochs"], settings["d_model"], settings["n_head"], settings["n_layer"],
            settings["batch_size"], settings["quick"]) == (1, 16, 2, 1, 32, True)
    assert min(record["sessions"].values()) > 0 and record["test"]
