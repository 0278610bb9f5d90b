"""Smoke tests of the pipeline and retraining benchmark scripts: each runs end to end with ``--quick``
(synthetic data and tiny untrained or 1-epoch models, in a temporary folder of its own, so nothing is
written under runs/) and its JSON records carry the configuration they claim (metrics and timings are
not checked: they belong to benchmarks/)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def quick(script: str, *args: str) -> str:
    """``python benchmarks/<script> --quick [args]`` from the repository root, on one thread; its stdout."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, f"benchmarks/{script}", "--quick", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
def test_pipeline_eval_quick_run_prints_every_system_then_the_pipeline():
    records = [json.loads(line) for line in quick("pipeline_eval.py").splitlines()]
    assert [r["system"] for r in records] == ["xlnet", "covisitation", "pipeline-gbdt", "pipeline-dlrm", "pipeline"]
    for r in records:
        assert r["dataset"] == "quick" and {"recall@10", "recall@20", "mrr@20", "ndcg@10"} <= set(r)
    for r in records[:2]:  # --quick: recall@10 and @20 only
        assert {k for k in r if k.startswith("retrieval_")} == {"retrieval_recall@10", "retrieval_recall@20"}
    assert records[0]["stage1_seed"] == 0
    last = records[-1]
    assert last["scorer"] == "GBDTScorer" and (last["stage1_seed"], last["ranker_seed"]) == (0, 0)
    assert last["stage1_trained"] == 0 and last["device"] == "cpu" and last["ranker_pairs"] > 0
    assert last["peak_rss_mb"] > 50 and last["wall_seconds"] > 0 and "peak_rss_children_mb" in last


@pytest.mark.slow
def test_ranker_memory_quick_run_prints_the_rows_then_one_fit_per_default_scorer():
    records = [json.loads(line) for line in quick("ranker_memory.py").splitlines()]
    assert [(r["stage"], r.get("scorer")) for r in records] == [("rows", None), ("fit", "gbdt"), ("fit", "dlrm")]
    rows = records[0]
    assert rows["pairs"] == 100 and rows["candidates"] == 30 and 0 < rows["slots"] <= 30 * rows["pairs"]
    for r in records[1:]:
        assert r["chunk"] == 64 and (r["pairs"], r["slots"]) == (rows["pairs"], rows["slots"]) and r["features"] > 0
        assert r["peak_rss_mb"] >= r["loaded_rss_mb"] > 0


@pytest.mark.slow
def test_ranker_fit_quick_run_prints_the_rows_then_one_fit_per_negatives_setting():
    rows, *fits = [json.loads(line) for line in quick("ranker_fit.py").splitlines()]
    assert rows["stage"] == "rows" and rows["quick"] and rows["pairs"] > 0 and 0 < rows["slots"] <= 30 * rows["pairs"]
    assert [(f["stage"], f["negatives"], f["scorer"]) for f in fits] == [("fit", None, "BlendScorer"), ("fit", 10, "BlendScorer")]
    every, sampled = fits
    assert every["pairs"] == sampled["pairs"] == rows["pairs"] and sampled["rows"] <= 11 * rows["pairs"] < every["rows"]
    for f in fits:
        assert list(f["steps"]) == ["feature_ops", "features", "ranker_0", "ranker_1", "ranker_2"]
        assert f["fit_seconds"] >= sum(f["steps"].values()) - 0.1 and f["load_average"] >= 0
        assert {"recall@20", "mrr@20", "candidate_recall"} <= set(f["test"]) and set(f["valid"]) == set(f["test"])


@pytest.mark.slow
def test_ranker_fit_fits_one_member_of_the_blend_alone_once_per_seed_offset():
    rows, *fits = [json.loads(line) for line in quick("ranker_fit.py", "--member", "0", "--seed-offsets", "0", "3").splitlines()]
    assert [(f["scorer"], f["seed_offset"], f["negatives"]) for f in fits] == [
        ("DLRMScorer", 0, None), ("DLRMScorer", 0, 10), ("DLRMScorer", 3, None), ("DLRMScorer", 3, 10)]
    for f in fits:
        assert list(f["steps"]) == ["feature_ops", "features", "ranker_0"] and f["pairs"] == rows["pairs"]
    assert fits[0]["valid"] != fits[2]["valid"]  # other weights, other scores
    done = subprocess.run([sys.executable, "benchmarks/ranker_fit.py", "--quick", "--member", "3"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2 and "--member 3: the ranker has 3 member(s)" in done.stderr


@pytest.mark.slow
def test_retrain_daily_quick_run_prints_each_turn_and_never_promotes_a_shadow_run():
    """The quick base is untrained, so any warm start may beat it (the lr-0.05 turn too): the gate's rejection of
    that turn is the full run's (docs/deploy.md), not checked here."""
    stdout = quick("retrain_daily.py")
    out = json.loads(stdout[stdout.index("{"):])  # after the fits' validation lines
    assert out["benchmark"] == "retrain_daily"
    assert out["settings"] == {"replay_days": 2, "warm_epochs": 1, "warm_lr": 0.003, "threads": 1, "quick": True,
                               "scratch_epochs": 1, "min_pairs": 50}
    rows = out["rows"]
    assert [r["run"] for r in rows] == ["warm start", "from scratch (shadow)"] * 3 + ["warm start, lr 0.05"]
    for r in rows:
        assert r["test_sessions"] > 0 and r["pairs"] > 0 and r["items"] > 0 and "candidate_recall@20" in r
    assert [r["promoted"] for r in rows[1:-1:2]] == [False] * 3  # the shadow runs are never promoted
    days = ["2014-04-04", "2014-04-05", "2014-04-06", "2014-04-07", "2014-04-08"]
    replay = ["2014-04-02", "2014-04-03", "2014-04-04"]  # 2 days before each new one
    assert [r["train_window"] for r in rows[:-1:2]] == [[replay[i], days[i + 1]] for i in range(3)]
    assert [r["train_window"] for r in rows[1:-1:2]] == [["2014-04-01", days[i + 1]] for i in range(3)]
    assert rows[-1]["train_window"] == rows[-3]["train_window"]


@pytest.mark.slow
def test_retrain_dlrm_quick_run_prints_each_window_and_grows_the_tables():
    """The quick base is barely trained, so the gate's decisions are the full run's to show, not checked here."""
    stdout = quick("retrain_dlrm.py")
    out = json.loads(stdout[stdout.index("{"):])
    assert (out["benchmark"], out["epochs"], out["quick"], out["path"], out["min_pairs"]) == (
        "retrain_dlrm", 1, True, "synthetic", 100)
    rows = out["rows"]
    assert [r["run"] for r in rows] == ["warm start"] * 4 + ["warm start, lr 0.1"]
    assert [r["window_end"] for r in rows][:4] == sorted({r["window_end"] for r in rows})
    for r in rows:
        assert r["train_rows"] > 0 and r["test_rows"] > 0 and r["clickouts"] > 0
        assert r["hotel_ids"][1] >= r["hotel_ids"][0] > 0
    assert any(r["hotel_ids"][1] > r["hotel_ids"][0] for r in rows)  # the tables grow by new hotels


@pytest.mark.slow
def test_pipeline_latency_quick_run_times_requests_with_their_event_times_and_every_stage():
    (record,) = [json.loads(line) for line in quick("pipeline_latency.py", "--profile", "--shortlist", "20",
                                                       "--batch-threads", "2").splitlines()]
    assert record["system"] == "pipeline-exact" and record["threads"] == 1 and record["candidates"] == 200
    assert record["retrievers"] == ["xlnet", "vsknn", "stan", "covisitation"] and record["scorer"] == "BlendScorer"
    trees = record["trees"]  # the blend's two LightGBM members, each of 10 rounds at most (--quick)
    assert len(trees) == 2 and 1 <= min(trees) <= max(trees) <= 10
    assert record["requests"] > 0 and 0 < record["p50_ms"] <= record["p90_ms"] <= record["p99_ms"]
    assert record["sessions_per_s"] > 0 and record["batch"] == 64
    assert list(record["sessions_per_s_on_threads"]) == ["2"] and record["sessions_per_s_on_threads"]["2"] > 0
    short = record["shortlist"]  # the blend's trees on the DLRM's 20 best, alternated with the whole blend
    assert short["n"] == 20 and 0 < short["p50_ms"] <= short["p99_ms"] and short["sessions_per_s"] > 0
    assert short["p50_ratio"] == pytest.approx(short["p50_ms"] / record["p50_ms"], abs=1e-3)
    assert 0 < short["lists_differ"] <= 1  # 20 of 200 candidates blended: some lists change
    stages = record["stages"]  # the staged runs gave recommend's lists (the script checks)
    assert list(stages) == ["encode", "retrieve_xlnet", "retrieve_vsknn", "retrieve_stan", "retrieve_covisitation",
                            "merge_filters", "features", "rank_0_DLRMScorer", "rank_1_GBDTScorer", "rank_2_GBDTScorer",
                            "blend", "ordering", "decode", "total"]
    assert all(0 <= s["p50_ms"] <= s["p99_ms"] and s["cpu_p50_ms"] >= 0 for s in stages.values())
    batch = record["batch_stages_us_per_session"]  # the batch of 64 stage by stage: every stage but the total
    assert list(batch) == list(stages)[:-1] and all(us > 0 for us in batch.values())
    assert sum(batch.values()) == pytest.approx(1e6 / record["sessions_per_s"], rel=1.0)  # the same work, timed apart
    offline = record["offline"]  # recommend_file of 256 sessions on one thread and on 2, the same bytes (checked there)
    assert (offline["sessions"], offline["batch"], offline["same_bytes"]) == (256, 64, True)
    assert offline["one_thread_sessions_per_s"] > 0 and offline["2_threads_sessions_per_s"] > 0
