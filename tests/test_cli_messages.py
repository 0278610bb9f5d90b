"""What ``sessrec`` says: the command list, one line for a refused recipe key or value, and quiet
third-party notices."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sessrec.cli import COMMAND_NAMES, run

ROOT = Path(__file__).resolve().parents[1]


def test_help_lists_every_command_on_its_own_line(capsys):
    run(["--help"])
    out = capsys.readouterr().out
    for name in COMMAND_NAMES:
        assert sum(line.startswith(f"    sessrec {name} ") for line in out.splitlines()) == 1, name
    assert "--traceback" in out and "--show-warnings" in out and "SESSREC_SHOW_WARNINGS" in out
    # a baseline validates without a model directory; predict reads CSV as well as parquet
    assert "sessrec validate --config <recipe> [--model_dir M]" in out and "--data.predict_path (parquet or CSV)" in out
    assert "sessrec <command> --data.help SessionDataModule, --model.help NextItemTask)" in out  # shown by the test below


@pytest.mark.parametrize("config, expected", [
    ({"model": {"encoder": {"class_path": "sessrec.models.XLNetEncoder", "init_args": {"d_modle": 16}}}},
     ("unknown key model.encoder.init_args.d_modle (XLNetEncoder has no option 'd_modle'); "
      "did you mean model.encoder.init_args.d_model?")),
    ({"model": {"optimisation": {"lr": 0.1}}},
     "unknown key model.optimisation (NextItemTask has no option 'optimisation'); did you mean model.optimization?"),
    ({"model": {"init_args": {"optimization": {"lrr": 0.1}}}},
     "unknown key model.init_args.optimization.lrr (Optimization has no option 'lrr'); did you mean model.init_args.optimization.lr?"),
    ({"model": {"class_path": "sessrec.tasks.BaselineTask", "init_args": {"zzz": 1}}},
     "unknown key model.init_args.zzz (BaselineTask has no option 'zzz'); its options are "),
    ({"trainer": {"max_epochz": 3}}, "unknown key trainer.max_epochz (Trainer has no option 'max_epochz'); did you mean trainer.max_epochs?"),
    ({"trainer": {"max_epochs": "abc"}}, "trainer.max_epochs: expected int or null, got 'abc'"),
    ({"trainer": {"max_epochs": 2, "enable_progress_bar": "maybe"}}, "trainer.enable_progress_bar: expected bool or null, got 'maybe'"),
    ({"model": {"dropout": "high"}}, "model.dropout: expected float, got 'high'"),
    ({"model": {"optimization": {"lr": None}}}, "model.optimization.lr: expected float, got None"),
    ({"model": {"encoder": {"class_path": "sessrec.models.XLNetEncoder", "init_args": {"n_head": "two"}}}},
     "model.encoder.init_args.n_head: expected int, got 'two'"),
    ({"data": {"eval_protocol": "every_prefix"}}, "data.eval_protocol: expected one of "),
    ({"data": {"batch_size": 64.7}}, "data.batch_size: expected int, got 64.7"),  # a YAML float
    ({"data": {"max_length": 20.0}}, "data.max_length: expected int, got 20.0"),
    ({"trainer": {"max_epochs": 1.5}}, "trainer.max_epochs: expected int or null, got 1.5"),
    ({"model": {"dropout": 1}}, None),  # an int where a float is expected is one
    # a key one level too high: the setting whose class takes it, before a misspelt key of this level
    ({"model": {"lr": 0.1}}, "unknown key model.lr (NextItemTask has no option 'lr'); it is an option of NextItemTask's "
                             "optimization: did you mean model.optimization.lr?"),
    ({"model": {"warmup_steps": 10}}, "unknown key model.warmup_steps (NextItemTask has no option 'warmup_steps'); it is "
                                      "an option of NextItemTask's schedule: did you mean model.schedule.warmup_steps?"),
    ({"model": {"top_k": 5}}, "unknown key model.top_k (NextItemTask has no option 'top_k'); it is an option of "
                              "NextItemTask's evaluation: did you mean model.evaluation.top_k?"),
])
def test_an_unknown_key_or_a_value_of_another_type_is_one_line(config, expected):
    import pytorch_lightning as pl

    from sessrec.cli.errors import RecipeError, check_keys
    from sessrec.tasks import NextItemTask, SessionDataModule

    if expected is None:
        check_keys(config, {"model": NextItemTask, "data": SessionDataModule, "trainer": pl.Trainer})
        return
    with pytest.raises(RecipeError) as refused:
        check_keys(config, {"model": NextItemTask, "data": SessionDataModule, "trainer": pl.Trainer})
    assert str(refused.value).startswith(expected) and "\n" not in str(refused.value)


def test_each_block_is_checked_against_the_class_it_was_written_for():
    """A data fragment's NextItemTask settings stay valid when a later fragment chooses BaselineTask (jsonargparse
    drops them), and a block without class_path configures the class chosen before it."""
    from sessrec.cli.errors import NO_VALUE, RecipeError, check_in_order, flag_mapping
    from sessrec.tasks import NextItemTask

    data = {"model": {"score_scale": 16.0, "optimization": {"lr": 0.005}}}
    baseline = {"model": {"class_path": "sessrec.tasks.BaselineTask",
                          "init_args": {"baseline": {"class_path": "sessrec.baselines.STAN", "init_args": {"k": 500}}}}}
    tuned = {"model": {"init_args": {"baseline": {"init_args": {"k": 200}}}}}
    flags = flag_mapping(["--model.init_args.evaluation.ks=[5]", "--print_config"])
    assert flags == {"model": {"init_args": {"evaluation": {"ks": "[5]"}}}, "print_config": NO_VALUE}
    check_in_order([data, baseline, tuned, flags], {"model": NextItemTask})
    with pytest.raises(RecipeError, match=r"^unknown key model.score_scale \(BaselineTask has no option"):
        check_in_order([baseline, data], {"model": NextItemTask})
    with pytest.raises(RecipeError, match=r"^unknown key model.init_args.baseline \(NextItemTask has no option"):
        check_in_order([tuned], {"model": NextItemTask})


def test_a_flag_no_parameter_takes_names_the_closest_one(sessrec_main, tmp_path):
    """The serving commands' flags are spelt as the parameters (``--model_dir``); the dashed spelling
    and a typo are one line naming the flag to use."""
    got = sessrec_main("serve", "--model-dir", str(tmp_path))
    assert got == ("sessrec serve: error: unknown key --model-dir (serve has no option 'model-dir'); did you mean "
                   "--model_dir? (--traceback for details)")
    got = sessrec_main("rollback", "--model_dir", str(tmp_path), "--too", "v000001")
    assert got == ("sessrec rollback: error: unknown key --too (rollback has no option 'too'); did you mean --to? "
                   "(--traceback for details)")
    got = sessrec_main("recommend", "--config", str(ROOT / "recipes" / "pipeline_rsc15.yaml"), "--input", "x.parquet")
    assert got == ("sessrec recommend: error: unknown key --input (recommend_file has no option 'input'); did you mean "
                   "--input_path? (--traceback for details)")
    got = sessrec_main("serve", "--model_dir", str(tmp_path), "--port", "eighty")
    assert got == "sessrec serve: error: --port: expected int, got 'eighty' (--traceback for details)"
    got = sessrec_main("serve", "--model_dir", str(tmp_path), "--access_log", "maybe")
    assert got == "sessrec serve: error: --access_log: expected bool, got 'maybe' (--traceback for details)"
    config = tmp_path / "serve.yaml"
    config.write_text("model_dir: x\nmax_batch_sise: 8\n")
    got = sessrec_main("serve", "--config", str(config))
    assert got == (f"sessrec serve: error: {config}:2:1: unknown key max_batch_sise (serve has no option 'max_batch_sise'); "
                   "did you mean max_batch_size? (--traceback for details)")


def test_one_value_where_a_list_goes_and_a_nan_float_are_one_line_of_sessrec(sessrec_main, tmp_path):
    """jsonargparse's "Expected a <class 'list'>" and its Union summary of a 'nan' are sessrec's own line, naming the
    key and the value (and for a list, the list of one to give)."""
    events = str(tmp_path / "events.csv")
    args = ("--served_log", str(tmp_path), "--reference", str(tmp_path), "--out", str(tmp_path / "m.csv"))
    got = sessrec_main("monitor", "--paths", events, *args)
    assert got == (f"sessrec monitor: error: --paths: expected a list, got {events!r}: give a list of one, --paths "
                   f"'[{events}]' (--traceback for details)")
    config = tmp_path / "monitor.yaml"
    config.write_text(f"paths: {events}\n")
    got = sessrec_main("monitor", "--config", str(config), *args)
    assert got == (f"sessrec monitor: error: {config}:1:1: paths: expected a list, got {events!r}: give a list of one, "
                   f"paths: [{events}] (--traceback for details)")
    for text in ("nan", "NaN", "inf"):
        got = sessrec_main("serve", "--model_dir", str(tmp_path), "--canary", "v000002", "--canary_share", text)
        assert got == f"sessrec serve: error: --canary_share: expected float or null, got {text!r} (--traceback for details)"


@pytest.mark.parametrize("command, flag, help_text", [
    ("serve", "--max_queue_wait_ms", "503 before the body is read"),
    ("rollback", "--to", "the version to make current"),
    ("promote", "--version", "default: the directory's canary"),
    ("promote", "--model_dir", "current for every session, which ends a canary."),
    ("serve", "--canary_share", "the share of the sessions the canary answers"),
    ("export", "--top_k", "session models also output the K best items"),
    ("retrain", "--model_dir", "retrain --model_dir <its directory> --help``"),
    ("recommend", "--input_path", "sessions file"),
])
def test_command_help_comes_from_the_docstring(command, flag, help_text, capsys):
    with pytest.raises(SystemExit) as exit_:
        run([command, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert exit_.value.code == 0 and flag in out and help_text in out


def test_a_recipe_typo_through_sessrec_is_one_line(tmp_path, capsys, sessrec_main):
    recipe = tmp_path / "typo.yaml"
    recipe.write_text("model:\n  encoder:\n    class_path: sessrec.models.XLNetEncoder\n    init_args: {d_modle: 16}\n")
    got = sessrec_main("fit", "--config", str(ROOT / "recipes" / "quickstart.yaml"), "--config", str(recipe))
    assert got == (f"sessrec fit: error: {recipe}:4:17: unknown key model.encoder.init_args.d_modle (XLNetEncoder has no "
                   "option 'd_modle'); did you mean model.encoder.init_args.d_model? (--traceback for details)")
    assert "usage" not in capsys.readouterr().err
    got = sessrec_main("fit", "--config", str(ROOT / "recipes" / "quickstart.yaml"), "--trainer.max_epochz", "3")
    assert got == ("sessrec fit: error: unknown key trainer.max_epochz (Trainer has no option 'max_epochz'); "
                   "did you mean trainer.max_epochs? (--traceback for details)")
    got = sessrec_main("fit", "--config", str(ROOT / "recipes" / "quickstart.yaml"), "--trainer.max_epochs", "abc")
    assert got == "sessrec fit: error: trainer.max_epochs: expected int or null, got 'abc' (--traceback for details)"
    got = sessrec_main("fit", "--config", str(ROOT / "recipes" / "quickstart.yaml"), "--model.encoder.init_args.n_head", "two")
    assert got == "sessrec fit: error: model.encoder.init_args.n_head: expected int, got 'two' (--traceback for details)"
    got = sessrec_main("fit", "--config", str(ROOT / "recipes" / "quickstart.yaml"), "--model.evaluation.ks", "[a]")
    assert got.startswith('sessrec fit: error: Parser key "model": ')  # a list: jsonargparse's own message, one line
    assert '"evaluation.ks": Expected a <class \'int\'>. Got value: a' in got
    got = sessrec_main("fit", "--config", str(ROOT / "recipes" / "quickstart.yaml"), "--model.schedule.seconds", "null")
    assert got == ("sessrec fit: error: --model.schedule.seconds null: a dotted flag below a class cannot carry null: "
                   "give its group as a mapping, --model.schedule '{seconds: null}' (--traceback for details)")
    assert "usage" not in capsys.readouterr().err


def test_a_trainer_setting_lightning_refuses_is_one_line(tmp_path, sessrec_main):
    """A LearningRateMonitor with the logger turned off: Lightning's MisconfigurationException, one line."""
    got = sessrec_main("fit", "--config", str(ROOT / "recipes" / "quickstart.yaml"), "--trainer.logger", "false",
                       "--trainer.callbacks+=pytorch_lightning.callbacks.LearningRateMonitor",
                       "--trainer.default_root_dir", str(tmp_path), "--trainer.fast_dev_run", "true")
    assert got == ("sessrec fit: error: Cannot use `LearningRateMonitor` callback with `Trainer` that has no logger. "
                   "(--traceback for details)")


def test_a_programming_error_keeps_its_traceback(monkeypatch):
    """Only input errors are shortened: an error of sessrec's own code propagates with its trace."""
    from sessrec import cli

    def broken(args):
        raise IndexError("a bug, not an input error")

    monkeypatch.setattr("sys.argv", ["sessrec", "fit"])
    monkeypatch.setattr(cli, "run", broken)
    with pytest.raises(IndexError, match="a bug"):
        cli.main()


NOISY = """
import json, logging, sys, warnings
import pytorch_lightning as pl
from pytorch_lightning.utilities._pytree import _tree_flatten
from pytorch_lightning.utilities.rank_zero import rank_zero_warn
from sessrec.cli import quiet_third_parties

def noise():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if sys.argv[1] == "quiet":
            quiet_third_parties()
        pl.Trainer(logger=False, enable_checkpointing=False, accelerator="cpu", enable_progress_bar=False)
        _tree_flatten(1)
        onnx = logging.getLogger("torch.onnx._internal.exporter._registration")
        onnx.warning("torchvision is not installed. Skipping torchvision::nms")  # what a query's export logs
        onnx.warning("another exporter note")
        warnings.warn("sessrec's own warning", UserWarning)
        rank_zero_warn("Couldn't infer the batch indices fetched from your dataloader: `SessionLoader`")  # on predict
    return [str(w.message) for w in caught]

print(json.dumps(noise()))
"""


@pytest.mark.slow
def test_third_party_notices_are_hidden_and_sessrecs_own_warnings_are_not():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    shown = subprocess.run([sys.executable, "-c", NOISY, "show"], capture_output=True, text=True, env=env, check=True)
    quiet = subprocess.run([sys.executable, "-c", NOISY, "quiet"], capture_output=True, text=True, env=env, check=True)
    assert "Tip:" in shown.stderr and "LeafSpec" in shown.stdout and "sessrec's own warning" in shown.stdout
    assert "Tip:" not in quiet.stderr and "LeafSpec" not in quiet.stdout and "sessrec's own warning" in quiet.stdout
    assert "batch indices" in shown.stdout and "batch indices" not in quiet.stdout
    assert "GPU available" in quiet.stderr  # Lightning's other messages stay
    assert "torchvision is not installed" in shown.stderr and "torchvision is not installed" not in quiet.stderr
    assert "another exporter note" in quiet.stderr


def test_stages_print_a_line_when_each_starts_and_ends_and_while_one_runs(capsys):
    import time

    from sessrec.pipeline_training.progress import Stages

    stages = Stages("fit", 2, interval=0.05)
    with stages.stage("reading the data"):
        time.sleep(0.3)
    with stages.stage("fitting the ranker"):
        pass
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "[fit 1/2] reading the data ..."
    still = [x for x in lines if x.startswith("[fit 1/2] reading the data: still running (")]
    assert len(still) >= 2 and lines[1 : 1 + len(still)] == still
    assert lines[1 + len(still)].startswith("[fit 1/2] reading the data: done in ")
    assert lines[2 + len(still) :] == ["[fit 2/2] fitting the ranker ...", "[fit 2/2] fitting the ranker: done in 0 s"]


@pytest.mark.parametrize("refit", [False, True])
def test_pipeline_fit_prints_its_stages(tmp_path, capsys, sessrec_main, refit):
    import yaml

    block = {
        "data": {"source": {"class_path": "sessrec.data.SyntheticSource",
                            "init_args": {"num_sessions": 600, "num_items": 80, "days": 10}}, "max_length": 10},
        "covisitation": {}, "covisitation_k": 20, "max_candidates": 30,
        "scorer": {"class_path": "sessrec.pipeline.scoring.GBDTScorer",
                   "init_args": {"max_rounds": 5, "threads": 1, "min_data_in_leaf": 5}},
        "features": {"groups": ["retrievers", "popularity"]},
        "output": str(tmp_path / "pipeline"),
        "refit_retrievers": refit,
    }
    recipe = tmp_path / "pipeline.yaml"
    recipe.write_text(yaml.safe_dump({"pipeline": block}))
    assert sessrec_main("fit", "--config", str(recipe)) == ""
    stages = [x.split(" ...")[0] for x in capsys.readouterr().out.splitlines() if re.match(r"\[fit \d/\d\] .* \.\.\.$", x)]
    n = 5 if refit else 4
    refitting = ["fitting the kNN and co-visitation retrievers again on the training and validation sessions"] if refit else []
    names = ["reading the data, fitting the retrievers and the feature statistics",
             "fitting the ranker GBDTScorer on the validation pairs", "scoring the validation pairs", *refitting,
             f"saving the pipeline to {tmp_path / 'pipeline'}"]
    assert stages == [f"[fit {i}/{n}] {name}" for i, name in enumerate(names, 1)]


def test_serve_with_a_port_out_of_range_or_a_truncated_weights_file_is_one_line(tmp_path, sessrec_main):
    import numpy as np
    import pyarrow as pa

    from sessrec.data import ItemVocab
    from sessrec.models import CausalLanguageModeling, GRU4RecEncoder
    from sessrec.tasks import NextItemTask

    vocab = ItemVocab(pa.array(np.arange(100, 130)), np.arange(30, 0, -1))
    task = NextItemTask(num_items=len(vocab), max_length=8, encoder=GRU4RecEncoder(d_model=8),
                        objective=CausalLanguageModeling()).eval()
    task.vocab = vocab
    model = task.recommender().save_pretrained(tmp_path / "model")
    got = sessrec_main("serve", "--model_dir", str(model), "--port", "80000")
    assert got == "sessrec serve: error: --port 80000 is not a TCP port (0 to 65535) (--traceback for details)"
    weights = next(model.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:100])
    got = sessrec_main("serve", "--model_dir", str(model))
    assert got.startswith(f"sessrec serve: error: {weights}: ") and got.endswith("(--traceback for details)")


def test_a_truncated_gz_input_is_one_line(tmp_path):
    import gzip

    from sessrec.data.readers import read_events
    from sessrec.data.schema import Schema, SchemaError

    text = "session_id,item_id,timestamp\n" + "".join(f"{i // 3},{i % 50},{1.4e9 + i}\n" for i in range(20_000))
    packed = gzip.compress(text.encode())
    path = tmp_path / "clicks.csv.gz"
    path.write_bytes(packed[: len(packed) // 2])
    with pytest.raises(SchemaError, match=r"clicks.csv.gz: cannot be read as CSV: Truncated compressed stream"):
        read_events(path, Schema())


def test_export_and_rollback_run_from_their_flags(tmp_path, capsys):
    """``sessrec export`` parses a Literal, an optional int and the defaults with jsonargparse and writes the model;
    ``rollback`` (given in a ``--config`` file) makes the version before current again."""
    import numpy as np
    import pyarrow as pa

    from sessrec.data import ItemVocab
    from sessrec.models import CausalLanguageModeling, GRU4RecEncoder
    from sessrec.saved.directory import describe, write_description
    from sessrec.saved.versions import VersionedDirectory
    from sessrec.tasks import NextItemTask

    def write(folder, text):  # a saved folder of one part and its description
        (folder / "part.txt").write_text(text)
        write_description(folder, "config.json", describe(folder, {"format": "test"}, ["part.txt"]))

    vocab = ItemVocab(pa.array(np.arange(100, 130)), np.arange(30, 0, -1))
    task = NextItemTask(num_items=len(vocab), max_length=8, encoder=GRU4RecEncoder(d_model=8),
                        objective=CausalLanguageModeling()).eval()
    task.vocab = vocab
    model = task.recommender().save_pretrained(tmp_path / "model")
    written = run(["export", "--model_dir", str(model), "--format", "torchscript", "--top_k", "null", "--out", str(tmp_path / "ts")])
    assert Path(written).exists() and Path(written).parent == tmp_path / "ts"
    assert f"sessrec export: wrote {written}" in capsys.readouterr().out

    store = VersionedDirectory(tmp_path / "versions")
    for text in ("one", "two"):
        store.publish(lambda folder, text=text: write(folder, text))
    config = tmp_path / "rollback.yaml"
    config.write_text(f"model_dir: {store.root}\n")
    assert run(["rollback", "--config", str(config)]) == "v000001"
    assert run(["promote", "--model_dir", str(store.root), "--version", "v000002"]) == "v000002"
    assert "sessrec promote: " + f"{store.root}: v000002 is current (was v000001); a server" in capsys.readouterr().out


def test_a_pipeline_recipe_typo_is_one_line_with_the_closest_key(tmp_path, sessrec_main):
    """Below ``pipeline:``, a block of the one class a setting takes (the data module) is checked against it."""
    recipe = tmp_path / "pipeline.yaml"
    recipe.write_text("pipeline:\n  data:\n    max_lenght: 10\n  covisitation: {}\n")
    got = sessrec_main("fit", "--config", str(recipe))
    assert got == (f"sessrec fit: error: {recipe}:3:5: unknown key pipeline.data.max_lenght (SessionDataModule has no "
                   "option 'max_lenght'); did you mean pipeline.data.max_length? (--traceback for details)")
    recipe.write_text("pipeline:\n  data:\n    max_length: 10\n  covisitation: {}\n")
    got = sessrec_main("test", "--config", str(recipe), "--pipeline.covisitation_k", "many")
    assert got == "sessrec test: error: pipeline.covisitation_k: expected int or null, got 'many' (--traceback for details)"


@pytest.mark.parametrize(("command", "flag", "name"), [("fit", "--data.help", "SessionDataModule"),
                                                       ("predict", "--model.help", "NextItemTask")])
def test_the_help_of_a_class_typed_setting_is_shown(sessrec_main, capsys, command: str, flag: str, name: str) -> None:
    """``--help`` lists ``--data.help CLASS_PATH_OR_NAME``: it prints that class's settings and exits 0."""
    assert sessrec_main(command, flag, name) in ("", "0")
    shown = capsys.readouterr().out
    assert shown.startswith("usage: ") and f"--{flag[2:].split('.')[0]}.max_length" in shown
