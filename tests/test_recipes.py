"""Every recipe parses and runs end to end with ``--trainer.fast_dev_run true``.

Neural recipes run ``fit`` (one training and one validation batch); baseline recipes, which
have nothing to train, run ``test`` (the baseline is fitted, one test batch is ranked).

Recipes name their data as ``../shared/data/...`` relative to the working directory. The tests
run in a scratch directory whose ``../shared`` points at the real one, so nothing is written
into the repository; a recipe whose dataset is absent is skipped.
"""

import os
import re
from pathlib import Path

import pytest
import torch

from sessrec.cli import cli as main

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    if SHARED.exists():
        (tmp_path / "shared").symlink_to(SHARED)
    monkeypatch.chdir(work)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    return work


def test_there_are_recipes():
    names = {p.stem for p in RECIPES}
    assert {"quickstart", "xlnet_mlm_diginetica", "xlnet_mlm_yoochoose164", "xlnet_mlm_rsc15"} <= names
    zoo = ("gru4rec", "sasrec", "gpt2_clm", "bert_mlm", "electra_rtd", "xlnet_plm")
    assert {f"{m}_diginetica" for m in zoo} <= names
    assert {"xlnet_mlm_trivago", "xlnet_mlm_trivago_virtual", "xlnet_mlm_trivago_reversal", "xlnet_mlm_trivago_side"} <= names
    datasets = ("diginetica", "yoochoose164", "rsc15")
    assert {f"{m}_{d}" for m in ("popularity", "vsknn", "stan") for d in datasets} <= names


PIPELINES = [p for p in RECIPES if p.stem.startswith("pipeline_")]
RETRAINING = [p for p in RECIPES if p.stem.startswith("retrain_")]  # `sessrec retrain` configs (tests/test_lifecycle.py)
TRAINABLE = [p for p in RECIPES if p not in PIPELINES and p not in RETRAINING]
VOCAB_KEYS = ("source", "min_item_count", "max_vocab_size")  # what decides the vocabulary


@pytest.mark.parametrize("recipe", PIPELINES, ids=lambda p: p.stem)
def test_pipeline_recipe_parses_and_shares_its_models_vocabulary(recipe, monkeypatch):
    """A pipeline recipe is typed-checked, and its data block fits the same vocabulary as each model's recipe.

    Running it needs the stage-1 checkpoints (``sessrec fit`` on each model's recipe): tests/test_pipeline.py
    runs the same code on a tiny pipeline; benchmarks/pipeline_eval.py runs these recipes.
    """
    import yaml

    from sessrec.pipeline.recipe import load_recipe

    monkeypatch.chdir(ROOT)
    spec = yaml.safe_load(recipe.read_text())["pipeline"]
    parsed = load_recipe(recipe)
    assert parsed.models or parsed.baselines
    for name, model in spec.get("models", {}).items():
        trained = yaml.safe_load((ROOT / model["recipe"]).read_text())
        assert {k: trained["data"].get(k) for k in VOCAB_KEYS} == {k: spec["data"].get(k) for k in VOCAB_KEYS}, name
        assert model["checkpoint"].startswith(f"runs/{Path(model['recipe']).stem}/checkpoints/"), name
        assert trained["data"].get("eval_protocol") == spec["data"]["eval_protocol"], name


@pytest.mark.parametrize("recipe", TRAINABLE, ids=lambda p: p.stem)
def test_recipe_fast_dev_run(recipe, scratch):
    for rel in re.findall(r"\.\./shared/data/[\w.\-/]+", recipe.read_text()):
        if not (scratch / rel).exists():
            pytest.skip(f"{rel} is not available here")
    fast = ["--config", str(recipe), "--trainer.fast_dev_run", "true"]
    fast += ["--trainer.enable_progress_bar", "false"]
    if "sessrec.tasks.BaselineTask" in recipe.read_text():
        cli = main(["test", *fast])
        assert cli.trainer.state.finished
        assert 0 <= cli.trainer.callback_metrics["test/recall@20"] <= 1
        return
    cli = main(["fit", *fast])
    assert cli.trainer.state.finished
    loss = cli.trainer.callback_metrics["train/loss"]
    assert torch.isfinite(loss) and loss > 0
    assert "val/recall@20" in cli.trainer.callback_metrics
    assert not any(Path(os.getcwd()).rglob("*.ckpt"))
