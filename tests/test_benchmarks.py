"""Smoke tests of the benchmark scripts: each runs end to end at its tiny size and its JSON
records carry the configuration they claim (timings are not checked: they belong to benchmarks/)."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_embedding_benchmark_quick_run_prints_its_records():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from embedding import table_sizes
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    done = subprocess.run(
        [sys.executable, "benchmarks/embedding.py", "--quick"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(line) for line in done.stdout.splitlines()]
    sizes = table_sizes(4, 1e3, 1e4, 0)  # --quick: 4 tables of at most 1e4 rows
    kinds = [(r["pass"], r["hot"], r.get("optimizer")) for r in records]
    assert kinds == [("forward", 1, None), ("forward_backward_step", 1, "sgd"), ("forward_backward_step", 1, "adagrad"),
                     ("forward", 10, None), ("forward_backward_step", 10, "sgd"),
                     ("forward_backward_step", 10, "adagrad"), ("padding", 1, None), ("padding", 10, None)]
    for r in records:
        assert r["batch_size"] == 256 and r["threads"] == 1 and r["malloc"] == "retain"
        if r["pass"] != "padding":
            assert r["rows"] == sum(sizes) and r["tables"] == 4
            assert r["separate_ms"] > 0 and r["fused_ms"] > 0 and r["fused_speedup_vs_separate"] > 0
        if r["pass"] == "forward":
            assert r["rows_MB"] == round(256 * r["hot"] * 4 * 64 * 4 / 1e6, 1)  # ids x width x 4 bytes
            assert 0 < r["fused_fraction_of_memcpy"]
        if r["pass"] == "forward_backward_step":
            assert r["compiled_update"] is (r["optimizer"] == "sgd")
            assert r["fused_optimizer"] == ("sgd" if r["optimizer"] == "sgd" else "adagrad_rowwise")
        if r["pass"] == "padding":
            assert (r["padded_width"], r["unpadded_width"]) == (64, 62)


@pytest.mark.slow
def test_ann_index_benchmark_quick_run_prints_one_record_per_kind():
    pytest.importorskip("faiss")  # optional dependency
    done = subprocess.run(
        [sys.executable, "benchmarks/ann_index.py", "--quick"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["system"] for r in records] == ["faiss-hnsw", "faiss-ivf"]
    for r in records:
        assert (r["items"], r["dim"], r["k"], r["queries"], r["threads"]) == (20_000, 64, 100, 50, 1)
        assert 0.0 <= r["recall@k"] <= 1.0 and 0.0 <= r["batch_recall@k"] <= 1.0
        assert r["exact_ms_per_query"] > 0 and r["ann_ms_per_query"] > 0
        assert r["speedup"] > 0 and r["build_s"] >= 0
    assert {"hnsw_m", "ef_construction", "ef_search"} <= set(records[0])
    assert records[1]["nlist"] == round(4 * 20_000 ** 0.5) and records[1]["nprobe"] == 32


@pytest.mark.slow
def test_gpu_suite_reports_every_item_as_skipped_without_cuda():
    """What CI runs on its CPU machine: `bash benchmarks/gpu_suite.sh`, every GPU item reported as skipped."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the suite would measure, not skip")
    done = subprocess.run(["bash", "benchmarks/gpu_suite.sh"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          check=False, env={**os.environ, "PYTHON": sys.executable})
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["item"] for r in records] == [
        "gpu_tests", "xlnet_mlm_fit", "encoder_steps", "encoder_widths", "dlrm_train", "embedding_lookup", "feature_etl", "resident_loader",
    ]
    assert all(r["status"] == "skipped" and "no CUDA device" in r["reason"] for r in records)


def test_gpu_suite_code_paths_run_on_cpu(monkeypatch):
    """The suite's measurements at --quick sizes on the CPU (the CuPy item on NumPy arrays): each item runs."""
    import runpy

    import numpy

    monkeypatch.setitem(sys.modules, "cupy", numpy)  # the CuPy branch's array code, on NumPy arrays
    monkeypatch.setattr(sys, "argv", ["gpu_suite.py", "--device", "cpu", "--quick", "--repeats", "1"])
    printed = []
    monkeypatch.setattr("builtins.print", lambda line, **_: printed.append(json.loads(line)))
    runpy.run_path(str(ROOT / "benchmarks" / "gpu_suite.py"), run_name="__main__")
    assert [r["item"] for r in printed] == [
        "xlnet_mlm_fit", "encoder_steps", "encoder_widths", "dlrm_train", "embedding_lookup", "feature_etl", "resident_loader"
    ]
    assert all(r["status"] == "ok" for r in printed), [r for r in printed if r["status"] != "ok"]
    assert printed[0]["sessions_per_s"] > 0 and 0 < printed[4]["share_of_copy_bandwidth"]
    steps = [f"{name}_step_ms" for name in ("xlnet_mlm", "sasrec", "hstu_jagged", "hstu_padded")]
    assert all(printed[1][key] > 0 for key in steps), printed[1]  # every encoder ran (an error has no *_step_ms)
    widths = printed[2]
    for name in ("xlnet_mlm", "hstu"):  # a wider model counts more operations a step
        assert 0 < widths[f"{name}_d32_gflop_per_step"] < widths[f"{name}_d64_gflop_per_step"], widths
        # the rate is the bf16 product measured in the run: on a GPU the step stays under it; on a loaded CPU the
        # small product may be timed slower than the step's own float32 work, so here only its sign is known
        assert all(widths[f"{name}_d{d}_share_of_peak"] > 0 for d in (32, 64)), widths


TINY_TRAIN = ["benchmarks/train_throughput.py", "--steps", "20", "--warmup", "1", "--batch", "16", "--items", "300",
              "--d-model", "16", "--n-head", "2", "--n-layer", "1", "--max-len", "8"]


@pytest.mark.slow
def test_train_throughput_prints_its_record_and_the_profile():
    done = subprocess.run([sys.executable, *TINY_TRAIN, "--profile"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    (record,) = [json.loads(line) for line in done.stdout.splitlines()]
    assert (record["batch_size"], record["items"], record["d_model"], record["timed_steps"]) == (16, 300, 16, 20)
    assert record["sessions_per_s"] > 0 and "peer" not in record
    profile = done.stderr[done.stderr.index("profile sessrec:"):].splitlines()
    assert len(profile) == 15 and all(" ms " in line and "calls/step" in line for line in profile[1:])


@pytest.mark.slow
def test_train_throughput_compares_encoders_step_by_step():
    done = subprocess.run([sys.executable, *TINY_TRAIN, "--encoders", "hstu", "hstu_padded", "sasrec", "xlnet_mlm"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    (record,) = [json.loads(line) for line in done.stdout.splitlines()]
    assert record["encoder"] == "hstu" and list(record["compared"]) == ["hstu_padded", "sasrec", "xlnet_mlm"]
    padded = record["compared"]["hstu_padded"]
    # the same sessions and objective (next item at every position): as many targets; the same weights
    assert padded["median_targets_per_step"] == record["median_masked_targets_per_step"]
    assert padded["parameters"] == record["parameters"]
    assert all(r["median_step_ms"] > 0 and r["step_time_over_first"] > 0 for r in record["compared"].values())


@pytest.mark.slow
def test_train_throughput_peer_without_transformers4rec_fails_in_one_line():
    import importlib.util

    if importlib.util.find_spec("transformers4rec") is not None:
        pytest.skip("Transformers4Rec is installed here: the peer would run")
    done = subprocess.run([sys.executable, *TINY_TRAIN, "--peer", "transformers4rec"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 1 and done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("--peer transformers4rec: Transformers4Rec 23.12 does not import here")


def test_train_throughput_peer_record():
    """With Transformers4Rec installed (its own virtualenv): both sides timed, the ratio of their sessions/s."""
    pytest.importorskip("transformers4rec.torch")
    done = subprocess.run([sys.executable, *TINY_TRAIN, "--peer", "transformers4rec"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    (r,) = [json.loads(line) for line in done.stdout.splitlines()]
    assert r["peer"].startswith("transformers4rec 23.12") and 0 < r["peer_mlm_probability"] <= 1
    assert r["peer_median_masked_targets_per_step"] > 0 and r["peer_sessions_per_s"] > 0
    assert r["ratio"] == pytest.approx(r["sessions_per_s"] / r["peer_sessions_per_s"], rel=0.01)


# -------------------------------------------------------------------------- pipeline_eval.py seeds
def pipeline_eval():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import pipeline_eval
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return pipeline_eval


STAGE1 = {
    "seed_everything": 0,
    "trainer": {
        "logger": {"class_path": "pytorch_lightning.loggers.CSVLogger", "init_args": {"save_dir": "runs/m", "name": "m"}},
        "callbacks": [
            {"class_path": "pytorch_lightning.callbacks.ModelCheckpoint",
             "init_args": {"dirpath": "runs/m/checkpoints", "monitor": "val/mrr@20", "filename": "best"}},
            {"class_path": "pytorch_lightning.callbacks.LearningRateMonitor", "init_args": {"logging_interval": "epoch"}},
        ],
    },
    "model": {"encoder": {"class_path": "sessrec.models.XLNetEncoder", "init_args": {"d_model": 16, "n_head": 2, "n_layer": 1}}},
}


def test_pipeline_eval_seed_plan_and_stage1_overlays(tmp_path, monkeypatch):
    pe = pipeline_eval()
    assert pe.seed_plan(3, None) == [(0, 0), (1, 1), (2, 2)]
    assert pe.seed_plan(3, [0]) == [(0, 0), (0, 1), (0, 2)]  # one stage-1 model, three ranker seeds
    assert pe.seed_plan(2, [4, 7]) == [(4, 0), (7, 1)]
    with pytest.raises(SystemExit, match="one seed or one per run"):
        pe.seed_plan(3, [0, 1])
    monkeypatch.chdir(tmp_path)
    (tmp_path / "recipes").mkdir()
    recipe = tmp_path / "recipes" / "gpt2_x.yaml"
    recipe.write_text(json.dumps(STAGE1))
    assert pe.stage1_recipe("runs/gpt2_x_seed3/model") == Path("recipes/gpt2_x.yaml")
    with pytest.raises(SystemExit, match=r"runs/elsewhere/model: not runs/<recipe>/model of a stage-1 recipe"):
        pe.stage1_recipe("runs/elsewhere/model")
    own = pe.model_dir_of("runs/gpt2_x/model", 0, 0)
    other = pe.model_dir_of("runs/gpt2_x/model", 2, 0)
    assert own == Path("runs/gpt2_x/model") and other == Path("runs/gpt2_x_seed2/model")
    # the ModelCheckpoint is edited where the recipe lists it (first here), the whole list given
    overlay = pe.seed_overlay(STAGE1, str(recipe), 2, other.parent / "checkpoints")
    assert overlay["seed_everything"] == 2
    callbacks = overlay["trainer"]["callbacks"]
    assert [c["class_path"].rsplit(".", 1)[1] for c in callbacks] == ["ModelCheckpoint", "LearningRateMonitor"]
    assert callbacks[0]["init_args"] == {**STAGE1["trainer"]["callbacks"][0]["init_args"], "dirpath": str(other.parent / "checkpoints")}
    assert overlay["trainer"]["logger"]["init_args"]["save_dir"] == "runs/gpt2_x_seed2"
    assert STAGE1["trainer"]["callbacks"][0]["init_args"]["dirpath"] == "runs/m/checkpoints"  # the recipe is left as it was
    assert "logger" not in pe.seed_overlay(STAGE1, str(recipe), 0, own.parent / "checkpoints")["trainer"]  # its own seed logs as usual
    with pytest.raises(SystemExit, match="one ModelCheckpoint"):
        pe.seed_overlay({"trainer": {"callbacks": []}}, str(recipe), 1, other.parent)
    # a two-seed ensemble of one recipe: run i takes seeds 2i and 2i + 1, the run of the models' own seeds their directories
    from sessrec.pipeline_training.recipe import ModelRetrieval
    pair = {"a": ModelRetrieval("runs/gpt2_x/model"), "b": ModelRetrieval("runs/gpt2_x_seed1/model", seed=1)}
    assert pe.model_seeds(pair, 0) == {"a": (0, Path("runs/gpt2_x/model")), "b": (1, Path("runs/gpt2_x_seed1/model"))}
    assert pe.model_seeds(pair, 2) == {"a": (4, Path("runs/gpt2_x_seed4/model")), "b": (5, Path("runs/gpt2_x_seed5/model"))}
    assert pe.model_seeds({"a": pair["a"]}, 2) == {"a": (2, Path("runs/gpt2_x_seed2/model"))}
    with pytest.raises(SystemExit, match=r"models \['a', 'c'\] are one stage-1 recipe with one seed \(0\)"):
        pe.model_seeds({**pair, "c": ModelRetrieval("runs/gpt2_x_seed9/model", seed=0)}, 0)
    means = pe.summary([{"system": "p", "dataset": "d", "recall@20": 0.5, "stage1_seed": 0, "ranker_seed": 0},
                        {"system": "p", "dataset": "d", "recall@20": 0.7, "stage1_seed": 0, "ranker_seed": 1}], "p", ["ranker"])
    assert means["recall@20"] == pytest.approx(0.6) and means["recall@20_std"] == pytest.approx(0.1414, abs=1e-4)
    assert (means["seeds"], means["stage1_seeds"], means["ranker_seeds"], means["varied"]) == (2, [0, 0], [0, 1], ["ranker"])


def test_pipeline_eval_ablates_only_the_feature_groups_the_data_has(capsys):
    """Without event times (the SR-GNN files) there is no time column, so no time ablation; the ids are
    never removed (the DLRM's tables need them); the target encodings exist wherever there are labels."""
    pe = pipeline_eval()
    groups = ["retrievers", "popularity", "session", "covisitation", "context", "time", "encodings", "ids"]
    columns = ["xlnet_score", "xlnet_rrank", "popularity", "recent_popularity", "seen_count", "is_last", "covis_last",
               "session_length"]
    untimed = SimpleNamespace(raw=dict.fromkeys(columns))
    assert pe.ablated_groups(groups, untimed) == ["retrievers", "popularity", "session", "covisitation", "context",
                                                  "encodings"]
    assert "['time']" in capsys.readouterr().err
    timed = SimpleNamespace(raw=dict.fromkeys([*columns, "session_duration"]))
    assert pe.ablated_groups(groups, timed) == groups[:-1]
    assert pe.ablated_groups(["retrievers", "time"], SimpleNamespace(raw={"stan_score": None})) == ["retrievers"]


def test_pipeline_eval_blend_weights_are_checked_against_the_recipe_blend(capsys):
    pe = pipeline_eval()
    import argparse

    from sessrec.pipeline.scoring import BlendScorer, GBDTScorer

    parser = argparse.ArgumentParser()
    blend = BlendScorer([GBDTScorer(), GBDTScorer(seed=1), GBDTScorer(seed=2)])
    assert pe.weight_lists(["1,1,0", "2,0.5,1"], blend, parser) == [[1.0, 1.0, 0.0], [2.0, 0.5, 1.0]]
    for text, message in (("1,1", "one finite, non-negative weight per scorer"), ("1,x,1", "numbers separated by commas"),
                          ("0,0,0", "not all 0"), ("1,nan,1", "one finite, non-negative weight per scorer")):
        with pytest.raises(SystemExit):
            pe.weight_lists([text], blend, parser)
        err = capsys.readouterr().err
        assert f"--blend-weights {text!r}" in err and message in err, err
    with pytest.raises(SystemExit):
        pe.weight_lists(["1"], GBDTScorer(), parser)
    assert "the recipe's scorer is GBDTScorer" in capsys.readouterr().err


def run_pipeline_eval(tmp_path: Path, scorer: dict, *flags: str) -> list[dict]:
    """pipeline_eval.py on synthetic sessions with the model directories of untrained XLNets of stage-1 seeds 0
    (where the pipeline recipe names it) and 1 (in its seed folder), written here so that nothing is trained."""
    import torch
    import yaml

    from sessrec.data import SyntheticSource
    from sessrec.models import XLNetEncoder
    from sessrec.tasks import NextItemTask, SessionDataModule

    source = {"num_sessions": 1500, "num_items": 150, "days": 10}
    dm = SessionDataModule(source=SyntheticSource(**source), max_length=8)
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "stage1.yaml").write_text(yaml.safe_dump(STAGE1))
    for seed, folder in ((0, "runs/stage1/model"), (1, "runs/stage1_seed1/model")):
        torch.manual_seed(seed)
        task = NextItemTask(num_items=dm.num_items, max_length=8, encoder=XLNetEncoder(d_model=16, n_head=2, n_layer=1))
        task.vocab = dm.vocab
        task.recommender().save_pretrained(tmp_path / folder)
    pipeline = {
        "data": {"source": {"class_path": "sessrec.data.SyntheticSource", "init_args": source}, "max_length": 8},
        "models": {"xlnet": {"model_dir": "runs/stage1/model", "k": 20}},
        "covisitation": {}, "covisitation_k": 20, "max_candidates": 30, "scorer": scorer, "output": "runs/pipeline",
    }
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump({"pipeline": pipeline}))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "pipeline_eval.py"), "--recipe", "tiny.yaml", "--threads", "1",
         "--recall-ks", "10,20", *flags],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "training" not in done.stderr  # both checkpoints existed
    return [json.loads(line) for line in done.stdout.splitlines()]


TINY_GBDT = {"max_rounds": 10, "threads": 1, "min_data_in_leaf": 5}


@pytest.mark.slow
def test_pipeline_eval_over_two_seeds_prints_each_seed_then_the_means(tmp_path):
    """Two stage-1 checkpoints and two ranker seeds."""
    records = run_pipeline_eval(tmp_path, {"class_path": "sessrec.pipeline.scoring.GBDTScorer", "init_args": TINY_GBDT},
                                "--seeds", "2")
    systems = [(r["system"], r.get("stage1_seed"), r.get("ranker_seed"), "seeds" in r) for r in records]
    rankers = ("pipeline-gbdt", "pipeline-dlrm", "pipeline")
    assert systems == [
        ("xlnet", 0, None, False), ("covisitation", None, None, False),
        *[(s, 0, 0, False) for s in rankers],
        ("xlnet", 1, None, False),  # co-visitation depends on no seed: printed once
        *[(s, 1, 1, False) for s in rankers],
        ("xlnet", None, None, True), ("covisitation", None, None, True),
        ("pipeline-gbdt", None, None, True), ("pipeline-dlrm", None, None, True), ("pipeline", None, None, True),
    ]
    xlnet = [r for r in records if r["system"] == "xlnet"]
    assert xlnet[0]["mrr@20"] != xlnet[1]["mrr@20"]  # two different stage-1 models
    runs, last = [r for r in records if r["system"] == "pipeline"][:2], records[-1]
    for key in ("recall@20", "mrr@20", "candidate_recall"):
        values = [r[key] for r in runs]
        assert last[key] == pytest.approx(sum(values) / 2, abs=1e-4)
        assert last[f"{key}_std"] == pytest.approx(abs(values[0] - values[1]) / 2 ** 0.5, abs=1e-4)
    assert (last["seeds"], last["stage1_seeds"], last["ranker_seeds"], last["varied"]) == (2, [0, 1], [0, 1], ["stage1", "ranker"])
    assert last["scorer"] == "GBDTScorer" and last["stage1_trained"] == 0 and last["device"] == "cpu"
    assert last["peak_rss_mb"] > 50 and last["wall_seconds"] > 0 and "peak_rss_children_mb" in last


@pytest.mark.slow
def test_pipeline_eval_reweights_the_fitted_blend_members(tmp_path):
    """A blend weighted onto one member ranks every session as that member alone (standardising a
    session's scores keeps their order), so its metrics are that member's."""
    member = {"class_path": "sessrec.pipeline.scoring.GBDTScorer", "init_args": TINY_GBDT}
    seeded = {"class_path": "sessrec.pipeline.scoring.GBDTScorer", "init_args": {**TINY_GBDT, "seed": 1}}
    blend = {"class_path": "sessrec.pipeline.scoring.BlendScorer", "init_args": {"scorers": [member, seeded]}}
    records = {r["system"]: r for r in run_pipeline_eval(tmp_path, blend, "--blend-weights", "1,0", "0,2",
                                                         "--shortlists", "1", "1000")}
    assert list(records)[-8:] == ["pipeline-gbdt", "pipeline-gbdt-1", "pipeline-blend", "pipeline-blend[1,0]", "pipeline-blend[0,2]",
                                  "pipeline-blend[shortlist 1]", "pipeline-blend[shortlist 1000]", "pipeline"]
    # a shortlist of one keeps the first member's order; one of every candidate is the blend itself
    for weighted, alone in (("pipeline-blend[1,0]", "pipeline-gbdt"), ("pipeline-blend[0,2]", "pipeline-gbdt-1"),
                            ("pipeline-blend[shortlist 1]", "pipeline-gbdt"), ("pipeline-blend[shortlist 1000]", "pipeline-blend")):
        for key in ("recall@20", "mrr@20", "ndcg@10"):
            assert records[weighted][key] == pytest.approx(records[alone][key], abs=1e-9)
    assert records["pipeline-gbdt"]["mrr@20"] != records["pipeline-gbdt-1"]["mrr@20"]  # two different members
