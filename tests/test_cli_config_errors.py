"""Configuration errors through the ``sessrec`` entry point: a YAML syntax error is one line
``file:line:column: problem``, a mistyped key at any depth names its line and column and the closest
valid key, a value outside a Literal lists the allowed ones, and a setting that trains nothing (a
dropout of 1, no layers, a batch of 0, a Trainer of no step) is refused when it is built; nothing is
written when a command refuses its configuration."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sessrec.cli.parsers import check_sources

QUIET_TRAINER = """trainer:
  max_epochs: 1
  limit_train_batches: 1
  limit_val_batches: 1
  enable_progress_bar: false
  enable_model_summary: false
  logger: {class_path: pytorch_lightning.loggers.CSVLogger, init_args: {save_dir: OUT, name: run}}
"""
TRAINER = QUIET_TRAINER + """  callbacks:
    - class_path: pytorch_lightning.callbacks.ModelCheckpoint
      init_args: {dirpath: OUT/checkpoints, monitor: val/ndcg@20, mode: max, save_top_k: 1, filename: best}
"""
MODEL = """model:
  encoder: {class_path: sessrec.models.GRU4RecEncoder, init_args: {d_model: 8}}
  objective: {class_path: sessrec.models.CausalLanguageModeling}
"""
DATA = """data:
  source: {class_path: sessrec.data.SyntheticSource, init_args: {num_sessions: 300, num_items: 40, num_clusters: 4}}
  max_length: 8
  batch_size: 32
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text.replace("OUT", str(tmp_path / "out")))
    return path


def refused(sessrec_main, tmp_path: Path, *args: str) -> str:
    """The one line `args` exit with; nothing written to the output folder."""
    message = sessrec_main(*args)
    assert message.startswith(f"sessrec {args[0]}: error: ") and message.endswith(" (--traceback for details)")
    assert not (tmp_path / "out").exists()
    return message.removeprefix(f"sessrec {args[0]}: error: ").removesuffix(" (--traceback for details)")


TAB = TRAINER + "model:\n\tdropout: 0.2\n" + DATA
BRACKET = TRAINER + MODEL + "data:\n  source: {class_path: sessrec.data.SyntheticSource, init_args: {num_sessions: 300\n  max_length: 8\n"


@pytest.mark.parametrize("command", ["fit", "validate", "test", "predict", "prepare", "recommend", "serve", "retrain",
                                     "export", "rollback", "promote", "monitor"])
def test_a_tab_in_the_config_of_any_command_is_its_line_and_column(command, tmp_path, sessrec_main):
    recipe = write(tmp_path, "tab.yaml", TAB)
    line = TAB.splitlines().index("\tdropout: 0.2") + 1
    got = refused(sessrec_main, tmp_path, command, "--config", str(recipe))
    assert got == f"{recipe}:{line}:1: found character that cannot start any token (a tab: YAML indents with spaces)"


def test_the_trace_of_a_syntax_error_is_shown_when_asked(tmp_path, monkeypatch):
    import yaml

    from sessrec.cli import main
    from sessrec.cli.errors import RecipeError

    recipe = write(tmp_path, "tab.yaml", TAB)
    monkeypatch.setattr("sys.argv", ["sessrec", "fit", "--config", str(recipe), "--traceback"])
    with pytest.raises(RecipeError, match=rf"^{recipe}:\d+:1: found character") as raised:
        main()
    assert isinstance(raised.value.__cause__, yaml.MarkedYAMLError)


def test_an_unclosed_bracket_is_where_yaml_gave_up_and_where_it_opened(tmp_path, sessrec_main):
    recipe = write(tmp_path, "bracket.yaml", BRACKET)
    lines = BRACKET.splitlines()
    opened = next(i for i, x in enumerate(lines) if "num_sessions: 300" in x) + 1
    column = lines[opened - 1].index("{num_sessions") + 1
    got = refused(sessrec_main, tmp_path, "fit", "--config", str(recipe))
    assert got == (f"{recipe}:{opened + 1}:13: did not find expected ',' or '}}' "
                   f"(while parsing a flow mapping that starts at {opened}:{column})")


def test_a_syntax_error_in_a_pipeline_recipe_or_a_file_named_by_a_setting(tmp_path, sessrec_main):
    pipeline = write(tmp_path, "pipeline.yaml", "pipeline:\n  covisitation: {}\n  ks: [10, 20\n")
    got = refused(sessrec_main, tmp_path, "fit", "--config", str(pipeline))
    assert got == f"{pipeline}:4:1: did not find expected ',' or ']' (while parsing a flow sequence that starts at 3:7)"
    source = write(tmp_path, "source.yaml", "class_path: sessrec.data.SyntheticSource\ninit_args:\n\tnum_items: 40\n")
    recipe = write(tmp_path, "recipe.yaml", TRAINER + MODEL + "data:\n  source: source.yaml\n")
    expected = f"{source}:3:1: found character that cannot start any token (a tab: YAML indents with spaces)"
    assert refused(sessrec_main, tmp_path, "fit", "--config", str(recipe)) == expected  # relative to the recipe
    recipe = write(tmp_path, "recipe.yaml", TRAINER + MODEL + DATA)
    assert refused(sessrec_main, tmp_path, "fit", "--config", str(recipe), "--data.source", str(source)) == expected


def test_a_key_given_twice_is_refused(tmp_path, sessrec_main):
    recipe = write(tmp_path, "twice.yaml", TRAINER + MODEL + DATA + "  batch_size: 64\n")
    line = len((TRAINER + MODEL + DATA).splitlines()) + 1
    got = refused(sessrec_main, tmp_path, "fit", "--config", str(recipe))
    assert got == f"{recipe}:{line}:3: key 'batch_size' is given twice in one mapping (first at {line - 1}:3); only one may stand"


@pytest.mark.parametrize("block, typo, expected", [
    ("trainer:\n  max_epoch: 1\n", "max_epoch",
     "unknown key trainer.max_epoch (Trainer has no option 'max_epoch'); did you mean trainer.max_epochs?"),
    ("data:\n  source:\n    class_path: sessrec.data.EventLogSource\n    init_args: {path: x.csv, schema: {item_colum: item}}\n",
     "item_colum", ("unknown key data.source.init_args.schema.item_colum (Schema has no option 'item_colum'); did you mean "
     "data.source.init_args.schema.item_id?")),
    ("data:\n  class_path: sessrec.tasks.SessionDataModule\n  init_args:\n    predict_schema:\n      item_colum: item\n",
     "item_colum", ("unknown key data.init_args.predict_schema.item_colum (Schema has no option 'item_colum'); did you mean "
     "data.init_args.predict_schema.item_id?")),
    ("data:\n  source:\n    class_path: EventLogSource\n    init_args:\n      path: x.csv\n      schema: {sesion_id: s}\n",
     "sesion_id", ("unknown key data.source.init_args.schema.sesion_id (Schema has no option 'sesion_id'); did you mean "
     "data.source.init_args.schema.session_id?")),
    ("data:\n  class_path: sessrec.tasks.SessionDataModule\n  init_args:\n    eval_protocol: {lastt: true}\n",
     "eval_protocol", "data.init_args.eval_protocol: expected one of 'last', 'all_prefixes', got {'lastt': True}"),
    ("data:\n  eval_protocol: every_prefix\n", "eval_protocol",
     "data.eval_protocol: expected one of 'last', 'all_prefixes', got 'every_prefix'"),
    (("model:\n  class_path: sessrec.tasks.NextItemTask\n  init_args:\n    encoder:\n"
     "      class_path: sessrec.models.GRU4RecEncoder\n      init_args: {d_model: 8, n_layers: 2}\n"),
     "n_layers", ("unknown key model.init_args.encoder.init_args.n_layers (GRU4RecEncoder has no option 'n_layers'); did "
     "you mean model.init_args.encoder.init_args.n_layer?")),
])
def test_a_mistyped_key_or_value_at_any_depth_names_its_line_and_the_closest_key(block, typo, expected, tmp_path,
                                                                                  sessrec_main):
    recipe = write(tmp_path, "base.yaml", TRAINER + MODEL + DATA)
    typos = write(tmp_path, "typo.yaml", block)
    line = next(i for i, x in enumerate(block.splitlines()) if typo in x)
    column = block.splitlines()[line].index(typo) + 1
    got = refused(sessrec_main, tmp_path, "fit", "--config", str(recipe), "--config", str(typos))
    assert got == f"{typos}:{line + 1}:{column}: {expected}"


def test_typos_in_a_pipeline_recipe_in_a_file_named_by_a_flag_and_of_prepare(tmp_path, sessrec_main):
    pipeline = write(tmp_path, "pipeline.yaml", "pipeline:\n  data:\n    source: {class_path: sessrec.data.SyntheticSource}\n"
                                                "    eval_protocol: {kind: last}\n  covisitation: {}\n")
    got = refused(sessrec_main, tmp_path, "fit", "--config", str(pipeline))
    assert got == f"{pipeline}:4:5: pipeline.data.eval_protocol: expected one of 'last', 'all_prefixes', got {{'kind': 'last'}}"
    source = write(tmp_path, "source.yaml", "class_path: sessrec.data.SyntheticSource\ninit_args:\n  num_itms: 40\n")
    recipe = write(tmp_path, "recipe.yaml", TRAINER + MODEL + DATA)
    got = refused(sessrec_main, tmp_path, "fit", "--config", str(recipe), "--data.source", str(source))
    assert got == (f"{source}:3:3: unknown key data.source.init_args.num_itms (SyntheticSource has no option 'num_itms'); "
                   "did you mean data.source.init_args.num_items?")
    typo = write(tmp_path, "prepare.yaml", DATA.replace("batch_size", "batch_sise"))
    got = refused(sessrec_main, tmp_path, "prepare", "--config", str(typo), "--out", str(tmp_path / "out"))
    assert got == (f"{typo}:4:3: unknown key data.batch_sise (SessionDataModule has no option 'batch_sise'); "
                   "did you mean data.batch_size?")



def test_each_named_session_model_of_a_pipeline_recipe_is_checked_key_by_key(tmp_path, sessrec_main):
    """``pipeline.models`` maps names to `ModelRetrieval` settings: a value outside a Literal or a mistyped
    key of one of them is one line naming it, from the file or from a flag."""
    head = "pipeline:\n  data:\n    source: {class_path: sessrec.data.SyntheticSource}\n  models:\n    gru:\n"
    recipe = write(tmp_path, "pipeline.yaml", head + "      model_dir: runs/gru/model\n      runtime: onnx\n")
    got = refused(sessrec_main, tmp_path, "fit", "--config", str(recipe))
    assert got == f"{recipe}:7:7: pipeline.models.gru.runtime: expected one of 'torch', 'onnxruntime', got 'onnx'"
    recipe = write(tmp_path, "pipeline.yaml", head + "      model_dir: runs/gru/model\n      indx: hnsw\n")
    got = refused(sessrec_main, tmp_path, "fit", "--config", str(recipe))
    assert got == (f"{recipe}:7:7: unknown key pipeline.models.gru.indx (ModelRetrieval has no option 'indx'); "
                   "did you mean pipeline.models.gru.index?")
    recipe = write(tmp_path, "pipeline.yaml", head + "      model_dir: runs/gru/model\n")
    got = refused(sessrec_main, tmp_path, "fit", "--config", str(recipe), "--pipeline.models.gru.index", "annoy")
    assert got == "pipeline.models.gru.index: expected one of 'exact', 'hnsw', 'ivf', got 'annoy'"
    fields = "(model_dir, k, index, runtime, seed)"
    recipe = write(tmp_path, "pipeline.yaml", head.replace("    gru:\n", "    - gru\n"))
    got = refused(sessrec_main, tmp_path, "fit", "--config", str(recipe))
    assert got == f"{recipe}:4:3: pipeline.models: expected a mapping of names to ModelRetrieval settings {fields}, got ['gru']"
    recipe = write(tmp_path, "pipeline.yaml", head.replace("    gru:\n", "    gru: runs/gru/model\n"))
    got = refused(sessrec_main, tmp_path, "fit", "--config", str(recipe))
    assert got == (f"{recipe}:5:5: pipeline.models.gru: expected ModelRetrieval's settings as a mapping {fields}, "
                   "got 'runs/gru/model'")
    recipe = write(tmp_path, "pipeline.yaml", head + "      k: 50\n")
    got = refused(sessrec_main, tmp_path, "fit", "--config", str(recipe))
    assert got == "pipeline.models: ModelRetrieval: the following arguments are required: model_dir"

def test_a_block_without_class_path_is_its_defaults_class_and_literals_of_a_union_are_listed(tmp_path, sessrec_main):
    """``--data.source.init_args.*`` without a class_path (the data module's source has no default class: None
    stands for SyntheticSource, so that a recipe's class never inherits its settings) asks for the class, and
    a value outside a union of Literals (Lightning's precision) lists them all."""
    recipe = write(tmp_path, "recipe.yaml", TRAINER + MODEL)
    got = refused(sessrec_main, tmp_path, "fit", "--config", str(recipe), "--data.source.init_args.num_sessions", "300")
    assert got.startswith("data.source gives settings but no class_path, and source has no class to take them by "
                          "default: name one (data.source.class_path: ") and "EventLogSource, " in got
    assert "SyntheticSource" in got
    got = refused(sessrec_main, tmp_path, "fit", "--config", str(recipe), "--trainer.precision", "16-mixd")
    assert got.startswith("trainer.precision: expected one of 64, 32, 16, ") and got.endswith("or null, got '16-mixd'")
    assert "'16-mixed'" in got and "'bf16'" in got


def test_a_flags_mapping_or_list_is_read_as_yaml_and_checked(tmp_path, sessrec_main):
    recipe = write(tmp_path, "recipe.yaml", TRAINER + MODEL + DATA)
    got = refused(sessrec_main, tmp_path, "fit", "--config", str(recipe), "--model.evaluation.ks", "[5, 10")
    assert got == ("model.evaluation.ks '[5, 10': did not find expected ',' or ']' at its end "
                   "(while parsing a flow sequence that starts at column 1)")
    got = refused(sessrec_main, tmp_path, "fit", "--config", str(recipe), "--data", "{max_lenght: 8}")
    assert got == "unknown key data.max_lenght (SessionDataModule has no option 'max_lenght'); did you mean data.max_length?"
    callback = "{class_path: ModelCheckpoint, init_args: {monitr: val/ndcg@20}}"
    got = refused(sessrec_main, tmp_path, "fit", "--config", str(recipe), f"--trainer.callbacks+={callback}")
    assert got == ("unknown key trainer.callbacks.init_args.monitr (ModelCheckpoint has no option 'monitr'); "
                   "did you mean trainer.callbacks.init_args.monitor?")


@pytest.mark.parametrize("flags, expected", [
    (["--model.encoder.init_args.dropout", "1.0"], "GRU4RecEncoder dropout must be a probability in [0, 1), got 1.0"),
    (["--model.dropout", "1.0"], "SessionModel dropout must be a probability in [0, 1), got 1.0"),
    (["--model.encoder.init_args.n_layer", "0"], "GRU4RecEncoder n_layer must be an integer >= 1, got 0"),
    (["--data.batch_size", "0"], "SessionDataModule batch_size must be an integer >= 1, got 0"),
    (["--trainer.max_epochs", "0"], ("--trainer.max_epochs 0: sessrec fit would take no training step and save untrained "
                                    "weights; give at least one (fast_dev_run true checks a recipe without saving)")),
    (["--trainer.limit_train_batches", "0"], "--trainer.limit_train_batches 0: sessrec fit would take no training step"),
])
def test_a_setting_that_trains_nothing_is_refused_before_anything_is_written(flags, expected, tmp_path, sessrec_main):
    recipe = write(tmp_path, "recipe.yaml", TRAINER + MODEL + DATA)
    assert refused(sessrec_main, tmp_path, "fit", "--config", str(recipe), *flags).startswith(expected)


@pytest.mark.parametrize("flags, expected", [
    (["--model.loss", "FulSoftmax"], "model.loss: 'FulSoftmax' names no class of CatalogueLoss; did you mean FullSoftmax?"),
    (["--model.loss", "sessrec.tasks.losses.FulSoftmax"], ("model.loss: 'sessrec.tasks.losses.FulSoftmax' names no class of "
                                                          "CatalogueLoss; did you mean sessrec.tasks.losses.FullSoftmax?")),
    (["--model.encoder", "sessrec.models.GRU4RecEncodr"], ("model.encoder: 'sessrec.models.GRU4RecEncodr' names no class "
                                                          "of Module; did you mean sessrec.models.GRU4RecEncoder?")),
    (["--model.encoder", "{class_path: GRU4RecEncodr}"], ("model.encoder.class_path: 'GRU4RecEncodr' names no class of "
                                                         "Module; did you mean GRU4RecEncoder?")),
    (["--model.encoder", "sessrec.modls.GRU4RecEncoder"], ("model.encoder: 'sessrec.modls.GRU4RecEncoder' names no class: "
                                                          "there is no module 'sessrec.modls'")),
    (["--data.source.class_path", "SyntheticSorce"], ("data.source.class_path: 'SyntheticSorce' names no class of "
                                                     "SessionSource; did you mean SyntheticSource?")),
])
def test_a_misspelt_class_name_is_refused_naming_the_closest_class(flags, expected, tmp_path, sessrec_main):
    """jsonargparse answered with its whole union summary, 'Expected a path but FulSoftmax either not accessible or
    invalid - Expected a dot import path string ...'."""
    recipe = write(tmp_path, "recipe.yaml", TRAINER + MODEL + DATA)
    assert refused(sessrec_main, tmp_path, "fit", "--config", str(recipe), *flags) == expected


def test_a_misspelt_class_path_in_a_recipe_names_its_line_and_column(tmp_path, sessrec_main):
    recipe = write(tmp_path, "recipe.yaml", TRAINER + MODEL + "  loss: {class_path: sessrec.tasks.losses.SampledSoftmx}\n"
                   + DATA)
    assert refused(sessrec_main, tmp_path, "fit", "--config", str(recipe)) == (
        f"{recipe}:14:10: model.loss.class_path: 'sessrec.tasks.losses.SampledSoftmx' names no class of CatalogueLoss; "
        "did you mean sessrec.tasks.losses.SampledSoftmax?")


@pytest.mark.parametrize("command", ["fit", "test", "serve", "retrain", "prepare"])
def test_a_missing_config_file_is_one_line_naming_the_closest_file(command, tmp_path, sessrec_main):
    """jsonargparse answered 'Parser key "config": File does not exist: <absolute path>', without the file meant."""
    recipe = write(tmp_path, "recipe.yaml", TRAINER + MODEL + DATA)
    misspelt = tmp_path / "recipi.yaml"
    assert sessrec_main(command, "--config", str(recipe), "--config", str(misspelt)) == (
        f"sessrec {command}: error: --config {misspelt}: no such file; did you mean {recipe}? (--traceback for details)")
    assert sessrec_main(command, f"--config={tmp_path}/nowhere/recipe.yaml") == (
        f"sessrec {command}: error: --config {tmp_path}/nowhere/recipe.yaml: no such file (there is no folder "
        f"'{tmp_path}/nowhere') (--traceback for details)")
    assert sessrec_main(command, "--config", str(tmp_path)) == (
        f"sessrec {command}: error: --config {tmp_path}: is a folder, not a recipe file (--traceback for details)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recipe.yaml"]


def test_a_fit_without_checkpoints_is_refused_naming_the_setting(tmp_path, sessrec_main):
    """Lightning refused it naming a ModelCheckpoint in the callbacks, which a recipe without one never gave."""
    recipe = write(tmp_path, "recipe.yaml", QUIET_TRAINER + MODEL + DATA)
    got = refused(sessrec_main, tmp_path, "fit", "--config", str(recipe), "--trainer.enable_checkpointing", "false")
    assert got == ("--trainer.enable_checkpointing false: sessrec fit writes the model directory from the best checkpoint "
                   "and keeps last.ckpt to resume the run; drop the setting (fast_dev_run true checks a recipe without "
                   "saving)")


@pytest.mark.parametrize("value", ["2", "0.1"])
def test_overfit_batches_which_the_loaders_cannot_honour_is_refused(value, tmp_path, sessrec_main):
    """Lightning repeats the same batches by turning off a sampler's shuffling; the loaders have none."""
    recipe = write(tmp_path, "recipe.yaml", TRAINER + MODEL + DATA)
    got = refused(sessrec_main, tmp_path, "fit", "--config", str(recipe), "--trainer.overfit_batches", value)
    assert got.startswith(f"--trainer.overfit_batches {value}: the loaders shuffle each epoch by their own seed")


@pytest.mark.parametrize("key, value, counted", [
    ("accumulate_grad_batches", "0", "batches"), ("accumulate_grad_batches", "-2", "batches"),
    ("check_val_every_n_epoch", "0", "epochs"), ("check_val_every_n_epoch", "-1", "epochs"),
    ("val_check_interval", "0", "batches"), ("val_check_interval", "-3", "batches"),
])
def test_a_trainer_count_below_one_is_refused_before_anything_is_written(key, value, counted, tmp_path, sessrec_main):
    recipe = write(tmp_path, "recipe.yaml", TRAINER + MODEL + DATA)
    got = refused(sessrec_main, tmp_path, "fit", "--config", str(recipe), f"--trainer.{key}", value)
    assert got.startswith(f"--trainer.{key} {value}: a number of {counted}, 1 or more")


@pytest.mark.parametrize("flags, callback, monitor, ks", [
    (["--model.evaluation.ks", "[5, 10]"], "ModelCheckpoint", "val/ndcg@20", [5, 10]),
    (["--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.monitor", "val/ndcg@50"], "EarlyStopping", "val/ndcg@50",
     [10, 20]),
])
def test_a_callback_monitoring_a_metric_the_validation_never_logs_is_refused_before_training(
    flags, callback, monitor, ks, tmp_path, sessrec_main
):
    recipe = write(tmp_path, "recipe.yaml", TRAINER + MODEL + DATA)
    got = refused(sessrec_main, tmp_path, "fit", "--config", str(recipe), *flags)
    logged = ", ".join([*(f"val/{name}@{k}" for k in ks for name in ("recall", "ndcg", "mrr")), "val/unrankable"])
    assert got == (f"--trainer.callbacks: {callback} monitors {monitor}, which the validation never logs; it logs "
                   f"val/loss, {logged} (the cut-offs of --model.evaluation.ks {ks}): monitor one of them, or add the "
                   "cut-off to --model.evaluation.ks")


@pytest.mark.parametrize("command, flag, value, reader", [
    ("test", "--scoring.output", "recs.parquet", "predict"),
    ("fit", "--scoring.overwrite", "true", "predict"),
    ("validate", "--data.predict_path", "sessions.parquet", "predict"),
    ("test", "--last_checkpoint.every_n_train_steps", "5", "fit"),
])
def test_a_flag_of_another_command_is_refused_not_ignored(command, flag, value, reader, tmp_path, sessrec_main):
    recipe = write(tmp_path, "recipe.yaml", TRAINER + MODEL + DATA)
    got = refused(sessrec_main, tmp_path, command, "--config", str(recipe), flag, value)
    assert got == f"{flag} is read by sessrec {reader} alone, and sessrec {command} would ignore it: drop the flag"


@pytest.mark.parametrize("command, key, value, expected", [
    ("test", "limit_test_batches", "0", "sessrec test would score no batch and print no metric; give at least one"),
    ("validate", "limit_val_batches", "0.0", "sessrec validate would score no batch and print no metric; give at least one"),
    ("predict", "limit_predict_batches", "1", "sessrec predict writes every session of --data.predict_path, and a "
                                              "limit would write part of them as the output; drop the flag"),
    ("predict", "limit_predict_batches", "0", "sessrec predict writes every session of --data.predict_path, and a "
                                              "limit would write part of them as the output; drop the flag"),
])
def test_an_evaluation_or_scoring_limited_to_part_of_its_batches_is_refused(command, key, value, expected, tmp_path,
                                                                            sessrec_main):
    recipe = write(tmp_path, "recipe.yaml", TRAINER + MODEL + DATA)
    sessions = tmp_path / "sessions.csv"
    sessions.write_text("session_id,item_id\n1,5\n")
    scoring = ["--data.predict_path", str(sessions), "--scoring.output", str(tmp_path / "out" / "recs.parquet")]
    got = refused(sessrec_main, tmp_path, command, "--config", str(recipe), f"--trainer.{key}", value,
                  *(scoring if command == "predict" else []))
    assert got == f"--trainer.{key} {value}: {expected}"


@pytest.mark.parametrize("command", ["fit", "test"])
@pytest.mark.parametrize("precision, instead", [("bf16-true", "bf16-mixed"), ("16-true", "16-mixed")])
def test_half_precision_weights_are_refused_before_anything_is_written(command, precision, instead, tmp_path, sessrec_main):
    recipe = write(tmp_path, "recipe.yaml", TRAINER + MODEL + DATA)
    got = refused(sessrec_main, tmp_path, command, "--config", str(recipe), "--trainer.precision", precision)
    assert got.startswith(f"--trainer.precision {precision}: the weights would be half precision") and f"use {instead}:" in got


@pytest.mark.parametrize("command", ["fit", "test"])
@pytest.mark.parametrize("precision", ["16-mixed", "16"])
def test_float16_autocast_on_the_cpu_is_refused_not_turned_into_bfloat16(command, precision, tmp_path, sessrec_main):
    recipe = write(tmp_path, "recipe.yaml", TRAINER + MODEL + DATA)
    got = refused(sessrec_main, tmp_path, command, "--config", str(recipe), "--trainer.precision", precision,
                  "--trainer.accelerator", "cpu")
    assert got == (f"--trainer.precision {precision}: float16 autocast runs on a GPU, and this run is on the CPU "
                   "(--trainer.accelerator cpu); use bf16-mixed on the CPU")


@pytest.mark.parametrize("command", ["fit", "validate", "test", "predict"])
@pytest.mark.parametrize("accelerator", ["gpu", "cuda"])
def test_a_gpu_accelerator_on_a_machine_without_one_is_refused_naming_it(command, accelerator, tmp_path, sessrec_main,
                                                                        monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr("torch.backends.mps.is_available", lambda: False)
    recipe = write(tmp_path, "recipe.yaml", TRAINER + MODEL + DATA)
    got = refused(sessrec_main, tmp_path, command, "--config", str(recipe), "--trainer.accelerator", accelerator)
    assert got == (f"--trainer.accelerator {accelerator}: torch sees no GPU on this machine (CUDA not available); use "
                   "--trainer.accelerator cpu, or auto to take a GPU where there is one")


@pytest.mark.parametrize("flags, expected", [
    (["--optimizer", "torch.optim.SGD"], "unrecognized arguments: --optimizer torch.optim.SGD"),
    (["--lr_scheduler", "torch.optim.lr_scheduler.StepLR", "--lr_scheduler.step_size", "1"],
     "unrecognized arguments: --lr_scheduler torch.optim.lr_scheduler.StepLR --lr_scheduler.step_size 1"),
])
def test_lightnings_optimizer_and_lr_scheduler_are_refused_not_put_over_the_tasks(flags, expected, tmp_path, sessrec_main):
    """The task's optimiser is --model.optimization and --model.schedule: LightningCLI's own would replace them
    (the recipe's learning rate and warm-up ignored), or alone (a scheduler without an optimizer) be ignored."""
    recipe = write(tmp_path, "recipe.yaml", TRAINER + MODEL + DATA)
    assert refused(sessrec_main, tmp_path, "fit", "--config", str(recipe), *flags) == expected
    in_file = write(tmp_path, "optimizer.yaml", "optimizer: {class_path: torch.optim.SGD, init_args: {lr: 0.1}}\n")
    got = refused(sessrec_main, tmp_path, "fit", "--config", str(recipe), "--config", str(in_file))
    assert got == "Subcommand 'fit' does not accept option 'optimizer.init_args.lr'"


@pytest.mark.parametrize("flags, key", [
    (["--data.batch_size", "16"], "data.batch_size"),
    (["--data.batch_size=16"], "data.batch_size"),
    (["--model.encoder.init_args.d_model", "16"], "model.encoder"),  # the file picks the encoder's class
    (["--model.encoder", "{init_args: {n_layer: 2}}"], "model.encoder"),
])
def test_a_flag_before_a_config_file_that_sets_it_is_refused_not_overridden(flags, key, tmp_path, sessrec_main):
    """jsonargparse reads the arguments in order: the later file's value would replace the flag's."""
    recipe = write(tmp_path, "recipe.yaml", TRAINER + MODEL + DATA)
    got = refused(sessrec_main, tmp_path, "fit", *flags, "--config", str(recipe))
    assert got == (f"--{flags[0].partition('=')[0].removeprefix('--')} comes before --config {recipe}, which sets {key} "
                   "and would override it: give the flags after the --config files")


def test_a_flag_before_a_config_file_that_does_not_set_it_is_read():
    recipes = Path(__file__).parents[1] / "recipes"
    check_sources(["--trainer.max_steps", "1", "--model.seed", "3", "--print_config", "--config", str(recipes / "data/synthetic.yaml"),
                   "--config", str(recipes / "model/gru4rec.yaml")])
    with pytest.raises(ValueError, match=r"^--model.optimization.lr comes before --config .*synthetic.yaml, which sets "):
        check_sources(["--model.optimization.lr", "0.01", "--config", str(recipes / "data/synthetic.yaml")])


def test_every_dropout_probability_of_the_models_is_checked_by_one_rule():
    from sessrec.models import (
        BertEncoder,
        BSARecEncoder,
        ElectraEncoder,
        FastDropout,
        GPT2Encoder,
        GRU4RecEncoder,
        HSTUEncoder,
        MaskedItemModeling,
        SASRecEncoder,
        XLNetEncoder,
    )
    from sessrec.saved.registry import check_probabilities
    from sessrec.tasks.losses import FullSoftmax
    from sessrec.tasks.settings import DLRMNetwork

    for encoder in (XLNetEncoder, BertEncoder, ElectraEncoder, GPT2Encoder, SASRecEncoder, HSTUEncoder, GRU4RecEncoder,
                    BSARecEncoder):
        for bad in (1.0, -0.1, float("nan"), True):
            with pytest.raises(ValueError, match=rf"^{encoder.__name__} dropout must be a probability in \[0, 1\), got "):
                encoder(d_model=8, n_layer=1, dropout=bad)
        assert encoder(d_model=8, n_layer=1, dropout=0.0).d_model == 8
    with pytest.raises(ValueError, match=r"^FastDropout p must be a probability in \[0, 1\), got 1.0$"):
        FastDropout(1.0)
    with pytest.raises(ValueError, match=r"^MaskedItemModeling mask_prob must be a probability in \(0, 1\], got 0.0$"):
        MaskedItemModeling(mask_prob=0.0)
    with pytest.raises(ValueError, match="hides every item of every session"):
        MaskedItemModeling(mask_prob=1.0, last_item_prob=0.0).check(XLNetEncoder(d_model=8, n_layer=1))
    MaskedItemModeling(mask_prob=1.0, last_item_prob=0.5).check(XLNetEncoder(d_model=8, n_layer=1))  # half read items
    with pytest.raises(ValueError, match=r"^label_smoothing must be a probability in \[0, 1\), got 1.0$"):
        FullSoftmax(label_smoothing=1.0)
    with pytest.raises(ValueError, match=r"^network over_layers\[0\] must be an integer >= 1, got 0$"):
        DLRMNetwork(over_layers=[0])
    with pytest.raises(ValueError, match=r"^network dcn_rank must be an integer >= 1, got 0$"):
        DLRMNetwork(interaction="dcn", dcn_rank=0)
    check_probabilities({"p": 0.0, "q": 1.0}, one=True)
    with pytest.raises(ValueError, match=r"^x q must be a probability in \(0, 1\), got 0$"):
        check_probabilities({"p": 0.5, "q": 0}, "x ", zero=False)


def test_an_on_off_setting_given_as_anything_but_a_bool_is_refused_not_read_by_its_truth():
    """The research API's constructors: the text 'false' would switch the setting on."""
    from sessrec.models import CausalLanguageModeling, SASRecEncoder, SessionModel
    from sessrec.tasks import SessionDataModule
    from sessrec.tasks.losses import SampledSoftmax
    from sessrec.tasks.settings import Evaluation

    for build, given, message in [
        (Evaluation, {"exclude_seen": "false"}, "evaluation exclude_seen must be true or false, got 'false'"),
        (CausalLanguageModeling, {"last_only": "no"}, "CausalLanguageModeling last_only must be true or false, got 'no'"),
        (SampledSoftmax, {"logq_correction": "false"}, "SampledSoftmax logq_correction must be true or false, got 'false'"),
        (SASRecEncoder, {"d_model": 8, "gated": "no"}, "SASRecEncoder gated must be true or false, got 'no'"),
        (SessionModel, {"num_items": 10, "encoder": SASRecEncoder(d_model=8), "position_embedding": "false"},
         "SessionModel position_embedding must be true or false, got 'false'"),
        (SessionDataModule, {"source": None, "augment_reversed": 1},
         "SessionDataModule augment_reversed must be true or false, got 1"),
    ]:
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            build(**given)


def test_a_ranker_setting_of_a_pipeline_recipe_is_refused_in_the_rankers_own_words(tmp_path, sessrec_main):
    """The recipe's scorer is one of three classes: the refusal is the named class's, not the first class
    tried's ("does not correspond to a subclass of DLRMScorer"), before anything is fitted."""
    recipe = ("pipeline:\n  data:\n    source: {class_path: sessrec.data.SyntheticSource}\n  covisitation: {}\n"
              "  output: OUT/pipeline\n")
    pipeline = write(tmp_path, "pipeline.yaml", recipe)
    got = refused(sessrec_main, tmp_path, "fit", "--config", str(pipeline), "--pipeline.scorer.init_args.shortlist", "0")
    assert got == "BlendScorer shortlist must be an integer >= 1, got 0"
    got = refused(sessrec_main, tmp_path, "fit", "--config", str(pipeline), "--pipeline.scorer.init_args.weights", "[1, -1, 1]")
    assert got == "BlendScorer needs one finite, non-negative weight per scorer (3), not all 0; got [1.0, -1.0, 1.0]"
    dlrm = write(tmp_path, "dlrm.yaml", recipe + "  scorer: {class_path: sessrec.pipeline.scoring.DLRMScorer, "
                                                "init_args: {max_epochs: 0}}\n")
    assert refused(sessrec_main, tmp_path, "fit", "--config", str(dlrm)) == "DLRMScorer max_epochs must be an integer >= 1, got 0"
    got = refused(sessrec_main, tmp_path, "test", "--config", str(pipeline), "--pipeline.scorer",
                  "sessrec.pipeline.scoring.GBDTScorer", "--pipeline.scorer.init_args.num_leaves", "1")
    assert got == "GBDTScorer num_leaves must be an integer >= 2, got 1"


@pytest.mark.parametrize("source, message", [
    ("{class_path: sessrec.data.SRGNNSource, init_args: {path: data/srgnn}}", "data/srgnn: no such folder"),
    ("{class_path: sessrec.data.EventLogSource, init_args: {path: data/events.csv, test_fraction: 0.2}}",
     "data/events.csv: no such file"),
    ("{class_path: sessrec.data.UserSequenceSource, init_args: {path: data/seq.txt}}", "data/seq.txt: no such file"),
    ("{class_path: sessrec.data.PreparedSource, init_args: {path: data/prepared}}", "data/prepared: no such folder"),
])
def test_a_relative_data_path_that_is_not_there_names_the_working_directory(source, message, tmp_path, sessrec_main,
                                                                          monkeypatch):
    """A recipe run from another folder: its relative data path is read from the working directory, which the
    message names (not the recipe's folder)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    recipe = write(tmp_path, "recipe.yaml", TRAINER + MODEL + DATA.replace("{class_path: sessrec.data.SyntheticSource, "
                                                                          "init_args: {num_sessions: 300, num_items: 40, "
                                                                          "num_clusters: 4}}", source))
    assert refused(sessrec_main, tmp_path, "fit", "--config", str(recipe)) == (
        f"{message} (read from the working directory {elsewhere})")
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("given, expected", [
    (["--config", "RECIPE", "--config", "TOP"], "Subcommand 'fit' does not accept option 'max_length'; did you mean "
                                                "data.max_length?"),
    (["--config", "RECIPE", "--max_epochs", "2"], "unrecognized arguments: --max_epochs 2; did you mean trainer.max_epochs?"),
    (["--config", "RECIPE", "--lr=0.1"], "unrecognized arguments: --lr=0.1; did you mean model.optimization.lr?"),
])
def test_a_key_at_the_top_level_names_the_block_that_takes_it(given, expected, tmp_path, sessrec_main):
    recipe = write(tmp_path, "recipe.yaml", TRAINER + MODEL + DATA)
    top = write(tmp_path, "top.yaml", "max_length: 8\n")
    args = [str(recipe) if a == "RECIPE" else str(top) if a == "TOP" else a for a in given]
    assert refused(sessrec_main, tmp_path, "fit", *args) == expected
