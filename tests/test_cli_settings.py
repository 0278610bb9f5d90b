"""The model's settings at ``sessrec validate|test|predict --model_dir`` (`sessrec.tasks.restore`).

Evaluation settings are the given ones (recipe, command line), else the model's; training settings
are not read; the network's settings are the model's, and a given value that differs is refused
with one line. A checkpoint is refused in one line naming the model directory. Renamed settings
name the key that replaces them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from sessrec.artifacts import SessionRecommender
from sessrec.cli import cli
from sessrec.tasks import DLRMTask, NextItemTask
from sessrec.tasks.checkpointing import plain_hparams
from sessrec.tasks.restore import merge_with_model
from sessrec.tasks.settings import Evaluation

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
DATA = ["--trainer.enable_progress_bar", "false", "--trainer.logger", "false",
        "--data.source.init_args.num_sessions", "2000", "--data.source.init_args.num_items", "150"]
TINY = ["--config", str(ROOT / "recipes" / "quickstart.yaml"), *DATA, "--trainer.max_epochs", "1",
        "--model.encoder.init_args.d_model", "16", "--model.encoder.init_args.n_head", "2",
        "--model.encoder.init_args.n_layer", "1"]
TRAINED_TOP_K = 7  # the model's evaluation.top_k, not the default 20


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """The model directory of a fitted run (named for the tests it shares with the checkpoint it replaced)."""
    run = tmp_path_factory.mktemp("fitted")
    cli(["fit", *TINY, "--trainer.default_root_dir", str(run), "--model.evaluation.top_k", str(TRAINED_TOP_K)])
    return next(run.glob("**/checkpoints/best.ckpt")).parent.parent / "model"


@pytest.fixture(scope="module")
def sessions(checkpoint, tmp_path_factory) -> Path:
    """Sessions of known items for predict: long ones, so that a seen item ranks high without exclusion."""
    raw = SessionRecommender.from_pretrained(checkpoint).vocab.raw_ids.to_pylist()
    path = tmp_path_factory.mktemp("sessions") / "sessions.parquet"
    items = [raw[i : i + 12] for i in range(0, 120, 12)]
    pq.write_table(pa.table({"session_id": [f"s{i}" for i in range(len(items))], "item_id": items}), path)
    return path


def predicted(checkpoint: Path, sessions: Path, out: Path, *flags: str) -> dict[str, list]:
    cli(["predict", *TINY, "--model_dir", str(checkpoint), "--data.predict_path", str(sessions),
         "--scoring.output", str(out), *flags])
    return {row["session_id"]: row["item_ids"] for row in pq.read_table(out).to_pylist()}


@pytest.mark.slow
def test_predict_takes_top_k_from_the_command_line_else_from_the_model(checkpoint, sessions, tmp_path):
    assert {len(v) for v in predicted(checkpoint, sessions, tmp_path / "a.parquet").values()} == {TRAINED_TOP_K}
    given = predicted(checkpoint, sessions, tmp_path / "b.parquet", "--model.evaluation.top_k", "5")
    assert len(given) == 10 and {len(v) for v in given.values()} == {5}


@pytest.mark.slow
def test_predict_excludes_seen_items_when_told(checkpoint, sessions, tmp_path):
    seen = {row["session_id"]: set(row["item_id"]) for row in pq.read_table(sessions).to_pylist()}
    plain = predicted(checkpoint, sessions, tmp_path / "a.parquet", "--model.evaluation.top_k", "40")
    excluded = predicted(checkpoint, sessions, tmp_path / "b.parquet", "--model.evaluation.top_k", "40",
                         "--model.evaluation.exclude_seen", "true")
    assert sum(len(seen[s] & set(items)) for s, items in plain.items()) > 0  # without it, seen items are recommended
    assert all(not seen[s] & set(items) and len(items) == 40 for s, items in excluded.items())


@pytest.mark.slow
def test_test_excludes_seen_items_when_told(checkpoint):
    plain = cli(["test", *TINY, "--model_dir", str(checkpoint)]).trainer.callback_metrics
    excluded = cli(["test", *TINY, "--model_dir", str(checkpoint), "--model.evaluation.exclude_seen", "true"])
    assert excluded.model.evaluation.exclude_seen
    # the synthetic sessions repeat items: excluding them changes every metric
    metrics = excluded.trainer.callback_metrics
    assert all(float(metrics[k]) != pytest.approx(float(plain[k])) for k in ("test/recall@20", "test/mrr@20"))
    assert float(metrics["test/loss"]) == pytest.approx(float(plain["test/loss"]))  # the loss is computed before the filter


@pytest.mark.parametrize("sub, stage", [("test", "test"), ("validate", "val")])
def test_evaluation_without_checkpointing_gives_the_same_metrics(checkpoint, sub, stage):
    """Lightning refused ``enable_checkpointing: false`` beside the recipe's ModelCheckpoint, which an evaluation
    never writes; the setting now runs it without checkpoint callbacks, to the same figures."""
    plain = cli([sub, *TINY, "--model_dir", str(checkpoint)]).trainer
    quiet = cli([sub, *TINY, "--model_dir", str(checkpoint), "--trainer.enable_checkpointing", "false"]).trainer
    assert plain.checkpoint_callbacks and not quiet.checkpoint_callbacks
    assert float(quiet.callback_metrics[f"{stage}/recall@20"]) == float(plain.callback_metrics[f"{stage}/recall@20"]) > 0


def test_predict_without_checkpointing_writes_what_it_writes_with(checkpoint, sessions, tmp_path):
    assert predicted(checkpoint, sessions, tmp_path / "quiet.parquet", "--trainer.enable_checkpointing", "false") == (
        predicted(checkpoint, sessions, tmp_path / "plain.parquet"))


@pytest.mark.parametrize("sub, stage", [("test", "test"), ("validate", "val")])
def test_ks_from_the_command_line(checkpoint, sub, stage):
    metrics = cli([sub, *TINY, "--model_dir", str(checkpoint), "--model.evaluation.ks", "[5]"]).trainer.callback_metrics
    assert sorted(k for k in metrics if "@" in k) == [f"{stage}/mrr@5", f"{stage}/ndcg@5", f"{stage}/recall@5"]
    assert 0 < float(metrics[f"{stage}/mrr@5"]) <= float(metrics[f"{stage}/recall@5"])


def test_not_given_settings_are_the_models(checkpoint):
    """A recipe without a model block: the network and the evaluation settings of the model directory."""
    data = ["--config", str(ROOT / "recipes" / "data" / "synthetic.yaml"), *DATA]
    task = cli(["test", *data, "--model_dir", str(checkpoint)]).model
    assert task.hparams.encoder["init_args"]["d_model"] == 16 and task.evaluation.top_k == TRAINED_TOP_K
    assert task.hparams.objective["class_path"].endswith("MaskedItemModeling")


def test_a_recipe_with_no_model_key_at_all_takes_the_models(checkpoint, sessions, tmp_path):
    recipe = tmp_path / "data.yaml"
    recipe.write_text("data:\n  source: {class_path: sessrec.data.SyntheticSource}\n  max_length: 20\n")
    data = ["--config", str(recipe), *DATA, "--model_dir", str(checkpoint)]
    assert cli(["test", *data]).model.evaluation.top_k == TRAINED_TOP_K
    cli(["predict", *data, "--data.predict_path", str(sessions), "--scoring.output", str(tmp_path / "recs.parquet")])
    assert {len(items) for items in pq.read_table(tmp_path / "recs.parquet").column("item_ids").to_pylist()} == {TRAINED_TOP_K}


@pytest.mark.slow
@pytest.mark.parametrize("flags, message", [
    (["--model.encoder.init_args.d_model", "32"],
     ("--model.encoder.init_args.d_model 32 differs from the model's 16 ({ckpt}): the network (its shape and what "
      "it computes) is fixed by training; evaluate the model as it was trained")),
    (["--model.dropout", "0.3", "--model.encoder.init_args.n_layer", "2"],
     "--model.dropout 0.3 differs from the model's 0.1 ({ckpt}) (1 more setting differs): the network"),
    (["--model.objective", '{"class_path": "sessrec.models.CausalLanguageModeling"}'],
     ("--model.objective.class_path sessrec.models.CausalLanguageModeling differs from the model's "
      "sessrec.models.masking.MaskedItemModeling ({ckpt})")),
    (["--data.max_length", "30"],
     "--data.max_length 30 differs from the model's 20 ({ckpt}): evaluate it with the session length it was trained with"),
], ids=["width", "dropout-and-depth", "objective", "max-length"])
@pytest.mark.parametrize("sub", ["test", "predict"])
def test_a_network_setting_that_differs_is_refused(
    checkpoint, sessions, tmp_path, sub, flags, message, sessrec_main,
):
    out = tmp_path / "recs.parquet"
    where = ["--data.predict_path", str(sessions), "--scoring.output", str(out)] if sub == "predict" else []
    got = sessrec_main(sub, *TINY, "--model_dir", str(checkpoint), *where, *flags)
    assert got.startswith(f"sessrec {sub}: error: ") and message.format(ckpt=checkpoint) in got
    assert not out.exists()


def test_another_task_than_the_models_is_refused(checkpoint, sessrec_main):
    got = sessrec_main("test", "--config", str(ROOT / "recipes" / "data" / "synthetic.yaml"), *DATA,
                       "--config", str(ROOT / "recipes" / "model" / "vsknn.yaml"), "--model_dir", str(checkpoint))
    assert (f"--model.class_path sessrec.tasks.BaselineTask cannot evaluate {checkpoint}: it holds a SessionRecommender, "
            "which NextItemTask evaluates") in got


@pytest.mark.slow
def test_training_settings_are_not_read(checkpoint, capsys):
    task = cli(["test", *TINY, "--model_dir", str(checkpoint), "--model.optimization.lr", "0.1",
                "--model.seed", "4"]).model
    assert task.optimization.lr == 0.001 and task.hparams.seed == 0  # the task's defaults: nothing trains here
    assert "note" not in capsys.readouterr().err


@pytest.mark.parametrize("sub", ["test", "predict", "validate"])
def test_a_checkpoint_is_refused_in_one_line_naming_the_model_directory(checkpoint, sub, sessrec_main):
    ckpt = next(checkpoint.parent.glob("checkpoints/best.ckpt"))
    got = sessrec_main(sub, *TINY, "--ckpt_path", str(ckpt))
    assert got == (f"sessrec {sub}: error: sessrec {sub} takes the model directory that sessrec fit writes: --model_dir "
                   "runs/<name>/model (checkpoints only resume fit) (--traceback for details)")
    with pytest.raises(ValueError, match=rf"^sessrec {sub} takes the model directory that sessrec fit writes"):
        cli([sub, *TINY, "--ckpt_path", str(ckpt)])


def test_export_refuses_a_checkpoint_in_one_line_naming_the_model_directory(checkpoint, sessrec_main, tmp_path):
    ckpt = next(checkpoint.parent.glob("checkpoints/best.ckpt"))
    got = sessrec_main("export", "--ckpt_path", str(ckpt), "--out", str(tmp_path / "out"))
    assert got == ("sessrec export: error: sessrec export takes the model directory that sessrec fit writes: --model_dir "
                   "runs/<name>/model (checkpoints only resume fit) (--traceback for details)")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("owner", "new_way"), [
    ("sessrec.models.SessionModel", "use sessrec.artifacts.SessionRecommender.from_pretrained('{d}').model"),
    ("sessrec.models.DLRM", "use sessrec.artifacts.ClickRanker.from_pretrained('{d}').model"),
    ("sessrec.tasks.NextItemTask", "use NextItemTask.from_recommender(sessrec.artifacts.SessionRecommender.from_pretrained('{d}'))"),
    ("sessrec.tasks.DLRMTask", "use DLRMTask.from_ranker(sessrec.artifacts.ClickRanker.from_pretrained('{d}'))"),
])
def test_a_network_or_task_refuses_to_load_a_directory_naming_the_artifact(checkpoint, owner, new_way):
    import importlib

    module, _, name = owner.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    with pytest.raises(TypeError) as err:
        cls.from_pretrained(str(checkpoint))
    assert str(err.value) == f"{name} loads no model directory: " + new_way.format(d=checkpoint)


@pytest.mark.slow
def test_a_fit_without_logger_or_root_folder_writes_no_config_in_the_working_directory(tmp_path, monkeypatch):
    """With a root folder the full config is saved there (the test below reads it); without one, nothing is
    left beside the user's files but what the recipe names."""
    monkeypatch.chdir(tmp_path)
    cli(["fit", *TINY])
    assert not (tmp_path / "config.yaml").exists()
    assert next(tmp_path.glob("**/model/config.json"))  # the run's model directory was written


@pytest.mark.slow
@pytest.mark.parametrize("saved", [False, True], ids=["recipe-and-flags", "saved-config"])
def test_the_training_config_passes_without_a_note(checkpoint, capsys, saved):
    """The recipe and flags of the training run, or the full config `sessrec fit` saved in its run folder."""
    recipe = ["--config", str(checkpoint.parent / "config.yaml")] if saved else TINY
    task = cli(["test", *recipe, "--model_dir", str(checkpoint)]).model
    assert task.evaluation.top_k == TRAINED_TOP_K
    assert "error" not in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("flags, message", [
    (["--model.evaluation.top_k", "0"], "--model.evaluation.top_k 0: the number of recommendations per session must be "
                                        "1 or more"),
    (["--model.evaluation.ks", "[5, -1]"], "evaluation ks must be positive integer cut-offs, got [5, -1]"),
    (["--model.evaluation.ks", "[]"], "evaluation ks must be positive integer cut-offs, got []"),
])
@pytest.mark.parametrize("sub", ["test", "predict"])
def test_bad_evaluation_settings_are_refused(
    checkpoint, sessions, tmp_path, sub, flags, message, sessrec_main,
):
    out = tmp_path / "recs.parquet"
    where = ["--data.predict_path", str(sessions), "--scoring.output", str(out)] if sub == "predict" else []
    got = sessrec_main(sub, *TINY, "--model_dir", str(checkpoint), *where, *flags)
    assert got == f"sessrec {sub}: error: {message} (--traceback for details)"
    assert not out.exists()


@pytest.mark.parametrize("flag", ["--model.top_k", "--model.init_args.top_k"])
def test_a_setting_outside_its_part_is_an_unknown_key_in_one_line(capsys, checkpoint, flag, sessrec_main):
    got = sessrec_main("test", *TINY, "--model_dir", str(checkpoint), flag, "5")
    part = flag[2:].replace("top_k", "evaluation.top_k")
    assert got == (f"sessrec test: error: unknown key {flag[2:]} (NextItemTask has no option 'top_k'); it is an option "
                   f"of NextItemTask's evaluation: did you mean {part}? (--traceback for details)")
    assert "NestedArg" not in capsys.readouterr().err  # nothing of jsonargparse's printed before it


def test_a_recipe_key_outside_its_part_is_an_unknown_key_in_one_line(capsys, tmp_path, sessrec_main):
    recipe = tmp_path / "flat.yaml"
    recipe.write_text("model:\n  exclude_seen: true\n  evaluation: {ks: [5]}\n")
    got = sessrec_main("fit", *TINY, "--config", str(recipe))
    assert got == (f"sessrec fit: error: {recipe}:2:3: unknown key model.exclude_seen (NextItemTask has no option "
                   "'exclude_seen'); it is an option of NextItemTask's evaluation: did you mean "
                   "model.evaluation.exclude_seen? (--traceback for details)")
    assert capsys.readouterr().err == ""


DLRM_HELD = plain_hparams(DLRMTask(cardinalities={"hotel": 10}, num_dense=3))


def test_dlrm_takes_ks_and_compile_and_refuses_its_shape():
    given = {"evaluation": {"ks": [3]}, "compile": "aot_eager", "optimization": {"lr": 0.01}, "network": {"embedding_dim": 16}}
    merged = merge_with_model(DLRMTask, DLRM_HELD, given, "runs/dlrm/model", from_data=("cardinalities", "num_dense"))
    assert Evaluation.of(merged["evaluation"]).ks == [3]
    assert merged["compile"] == "aot_eager" and merged["sparse"] == DLRM_HELD["sparse"]
    for given, key, value in (({"network": {"embedding_dim": 32}}, "network.embedding_dim", 32),
                              ({"sparse": {"class_path": "sessrec.embeddings.FusedTables", "init_args": {"optimizer": "sgd"}}},
                               "sparse.init_args.optimizer", "sgd")):
        with pytest.raises(ValueError, match=rf"^--model\.{key} {value} differs from the model's \S+ \(runs/dlrm/model\): the network"):
            merge_with_model(DLRMTask, DLRM_HELD, given, "runs/dlrm/model")


def test_a_model_setting_the_task_does_not_take_is_refused():
    with pytest.raises(ValueError, match=r"^x: the model's setting 'lr' is not one of NextItemTask's"):
        merge_with_model(NextItemTask, {"dropout": 0.1, "lr": 0.01}, {}, "x")


def test_a_saved_part_is_compared_field_by_field():
    held = {"evaluation": {"class_path": "sessrec.tasks.settings.Evaluation",
                           "init_args": {"ks": [10, 20], "top_k": 20, "exclude_seen": True}},
            "encoder": {"class_path": "sessrec.models.xlnet.XLNetEncoder", "init_args": {"d_model": 16, "n_head": 2}}}
    given = {"evaluation": {"ks": [5]}, "encoder": {"class_path": "sessrec.models.XLNetEncoder", "init_args": {"d_model": 16}}}
    merged = merge_with_model(NextItemTask, held, given, "x")
    assert merged["evaluation"] == {"ks": [5], "top_k": 20, "exclude_seen": True}
    assert merged["encoder"] == held["encoder"]
    with pytest.raises(ValueError, match=r"^--model\.encoder\.class_path sessrec\.models\.GRU4RecEncoder differs"):
        merge_with_model(NextItemTask, held, {"encoder": {"class_path": "sessrec.models.GRU4RecEncoder"}}, "x")


# -- DLRMTask: ks and compile are its evaluation settings -------------------------------------------


@pytest.fixture(scope="module")
def dlrm(tmp_path_factory) -> tuple[list[str], Path]:
    """The DLRM recipe fitted for one epoch on a hand-made click-out log: (its flags, its model directory)."""
    from test_ranking_data import log_table

    run = tmp_path_factory.mktemp("dlrm")
    pq.write_table(log_table(), run / "log.parquet")
    flags = ["--config", str(ROOT / "recipes" / "dlrm_trivago.yaml"), "--data.init_args.path", str(run / "log.parquet"),
             "--data.init_args.test_hours", str(50 / 3600), "--data.init_args.valid_hours", str(30 / 3600),
             "--data.init_args.min_count", "1", "--trainer.max_epochs", "1", "--trainer.enable_progress_bar", "false",
             "--trainer.logger", "false", "--model.init_args.network.embedding_dim", "8",
             "--model.init_args.network.dense_layers", "[8, 8]", "--model.init_args.network.over_layers", "[8]"]
    cwd = os.getcwd()
    os.chdir(run)  # the recipe keeps its checkpoints under runs/dlrm_trivago/
    try:
        cli(["fit", *flags])
    finally:
        os.chdir(cwd)
    return flags, run / "runs" / "dlrm_trivago" / "model"


@pytest.mark.slow
def test_dlrm_test_takes_ks_and_refuses_another_width(dlrm, sessrec_main):
    flags, model_dir = dlrm
    given = cli(["test", *flags, "--model_dir", str(model_dir), "--model.evaluation.ks", "[2]", "--model.optimization.lr", "0.5"])
    assert given.model.evaluation.ks == [2]
    assert sorted(k for k in given.trainer.callback_metrics if k.startswith("test/recall")) == ["test/recall@2"]
    got = sessrec_main("test", *flags, "--model_dir", str(model_dir), "--model.network.embedding_dim", "4",
                       "--model.network.dense_layers", "[8, 4]")
    assert f"--model.network.embedding_dim 4 differs from the model's 8 ({model_dir}) (1 more setting differs): the network" in got
    got = sessrec_main("test", *flags, "--model_dir", str(model_dir), "--model.sparse.init_args.optimizer", "sgd")
    assert f"--model.sparse.init_args.optimizer sgd differs from the model's adagrad_rowwise ({model_dir}): the network" in got


@pytest.mark.slow
def test_a_click_rankers_evaluation_refuses_data_settings_its_model_was_not_trained_with(dlrm, tmp_path, sessrec_main,
                                                                                          monkeypatch):
    """The model directory recorded no data settings: a --data.min_count the model's vocabulary ignores, and session
    scores (a dense input) for a model trained without them, or none for one trained with them, gave metrics with
    exit 0."""
    flags, model_dir = dlrm
    recorded = json.loads((model_dir / "config.json").read_text())["data"]
    assert recorded["class_path"] == "sessrec.tasks.clickout_data.ClickoutDataModule"
    assert (recorded["init_args"]["min_count"], recorded["init_args"]["session_scores"]) == (1, None)
    scores = tmp_path / "scores.parquet"
    pq.write_table(pa.table({"session_id": ["a"], "step": [5], "item_id": ["H1"], "score": [0.5]}), scores)
    got = sessrec_main("test", *flags, "--model_dir", str(model_dir), "--data.init_args.min_count", "5")
    assert got == (f"sessrec test: error: --data.min_count 5 differs from the model's 1 ({model_dir}): the model reads the "
                   "vocabulary it was trained with (its vocab.parquet); evaluate it with that run's data settings "
                   "(--traceback for details)")
    got = sessrec_main("test", *flags, "--model_dir", str(model_dir), "--data.init_args.session_scores", str(scores))
    assert got == (f"sessrec test: error: --data.session_scores {scores}: the model ({model_dir}) was trained without "
                   "session scores; leave it out (--traceback for details)")
    monkeypatch.chdir(tmp_path)  # the recipe keeps its checkpoints under runs/dlrm_trivago/
    assert sessrec_main("fit", *flags, "--data.init_args.session_scores", str(scores)) == ""
    trained = tmp_path / "runs" / "dlrm_trivago" / "model"
    assert sessrec_main("test", *flags, "--model_dir", str(trained)) == (
        f"sessrec test: error: the model ({trained}) was trained with session scores ({scores}): give --data.session_scores "
        "of the click-outs it evaluates, which it would read as absent on every row (--traceback for details)")


def test_a_source_picked_by_a_recipe_gets_its_own_defaults_not_the_default_sources(tmp_path, capsys):
    """jsonargparse keeps the init_args of a parameter's default instance that the class a recipe picks
    also takes: with `SyntheticSource()` as the default, an `EventLogSource` recipe silently got its
    test_days and valid_days 1.0 (valid_days beating valid_fraction)."""
    import yaml

    events = tmp_path / "events.csv"
    events.write_text("session_id,item_id,timestamp\n1,1,1600000000\n1,2,1600000060\n")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"data": {"source": {
        "class_path": "sessrec.data.EventLogSource",
        "init_args": {"path": str(events), "test_fraction": 0.2, "valid_fraction": 0.2}}}}))
    with pytest.raises(SystemExit):
        cli(["fit", "--config", str(recipe), "--print_config"])
    source = yaml.safe_load(capsys.readouterr().out)["data"]["init_args"]["source"]["init_args"]
    assert (source["test_days"], source["test_fraction"], source["valid_days"], source["valid_fraction"]) == (
        None, 0.2, None, 0.2)


def test_no_setting_of_a_class_a_recipe_can_pick_defaults_to_an_instance_whose_siblings_differ():
    """The rule behind the test above, for every class a recipe builds: a parameter typed by a base class
    whose default is an instance of one subclass would lend that instance's settings to a sibling the
    recipe picks instead, wherever the two share a setting with different defaults."""
    import inspect

    from sessrec.saved.registry import registered

    classes = set(registered().values())
    leaks = []
    for owner in classes:
        for name, parameter in inspect.signature(owner).parameters.items():
            default = parameter.default
            if not isinstance(default, tuple(classes)):
                continue
            mine = inspect.signature(type(default)).parameters
            for base in type(default).__mro__[1:]:
                for sibling in (c for c in classes if issubclass(c, base) and c is not type(default) and base in classes):
                    theirs = inspect.signature(sibling).parameters
                    leaks += [f"{owner.__name__}.{name}: {type(default).__name__}.{key} -> {sibling.__name__}"
                              for key in set(mine) & set(theirs)
                              if theirs[key].default is not inspect.Parameter.empty
                              and repr(getattr(default, key, mine[key].default)) != repr(theirs[key].default)]
    assert not leaks, leaks
