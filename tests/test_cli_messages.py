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
from sessrec.cli.errors import explain_parse_error

ROOT = Path(__file__).resolve().parents[1]


def test_help_lists_every_command_on_its_own_line(capsys):
    run(["--help"])
    out = capsys.readouterr().out
    for name in COMMAND_NAMES:
        assert sum(line.startswith(f"    sessrec {name} ") for line in out.splitlines()) == 1, name
    assert "--traceback" in out and "--show-warnings" in out and "SESSREC_SHOW_WARNINGS" in out


UNION = """Parser key "model":
  Does not validate against any of the Union subtypes
  Subtypes: [<class 'pytorch_lightning.core.module.LightningModule'>, <class 'NoneType'>]
  Errors:
    - Problem with given class_path 'sessrec.tasks.NextItemTask':
        Parser key "encoder":
          Does not validate against any of the Union subtypes
          Subtypes: [<class 'torch.nn.modules.module.Module'>, <class 'NoneType'>]
          Errors:
            - Problem with given class_path 'sessrec.models.XLNetEncoder':
                {leaf}
            - Expected a <class 'NoneType'>
          Given value type: <class 'dict'>
          Given value: {{'class_path': 'sessrec.models.XLNetEncoder'}}
    - Expected a <class 'NoneType'>
  Given value type: <class 'dict'>
  Given value: {{'encoder': {{'class_path': 'sessrec.models.XLNetEncoder'}}}}"""
TOP = """Parser key "model":
  Does not validate against any of the Union subtypes
  Errors:
    - Problem with given class_path 'sessrec.tasks.NextItemTask':
        {leaf}
    - Expected a <class 'NoneType'>
  Given value: {{'optimisation': {{'lr': 0.1}}}}"""
KEYS = ["--trainer.max_epochs", "--trainer.min_epochs", "--model", "--data", "--config"]


@pytest.mark.parametrize("message, expected", [
    (UNION.format(leaf="Option 'd_modle' is not accepted"),
     ("unknown key model.encoder.init_args.d_modle (XLNetEncoder has no option 'd_modle'); "
      "did you mean model.encoder.init_args.d_model?")),
    (UNION.format(leaf='Parser key "n_head":\n                  Expected a <class \'int\'>. Got value: two'),
     "model.encoder.init_args.n_head: expected int, got 'two'"),
    (TOP.format(leaf="Option 'optimisation.lr' is not accepted"),
     "unknown key model.optimisation.lr (NextItemTask has no option 'optimisation'); did you mean model.optimization.lr?"),
    (TOP.format(leaf="Option 'optimization.lrr' is not accepted"),
     ("unknown key model.optimization.lrr (NextItemTask has no option 'optimization.lrr'); "
      "did you mean model.optimization.lr?")),
    ("unrecognized arguments: --trainer.max_epochz 3", "unknown key trainer.max_epochz; did you mean trainer.max_epochs?"),
    ("Subcommand 'fit' does not accept option 'trainer.max_epochz'",
     "unknown key trainer.max_epochz; did you mean trainer.max_epochs?"),
    (('Parser key "trainer.max_epochs":\n  Does not validate against any of the Union subtypes\n  Subtypes: '
      "[<class 'int'>, <class 'NoneType'>]\n  Errors:\n    - Expected a <class 'int'>\n    - Expected a <class 'NoneType'>\n"
      "  Given value type: <class 'str'>\n  Given value: abc"), "trainer.max_epochs: expected int or null, got 'abc'"),
    (TOP.format(leaf=('Parser key "schedule.seconds":\n          Does not validate against any of the Union subtypes\n'
                      "          Subtypes: [<class 'float'>, <class 'NoneType'>]\n          Errors:\n"
                      "            - Expected a <class 'float'>\n            - Expected a <class 'NoneType'>\n"
                      "          Given value type: <class 'str'>\n          Given value: None")),
     ("model.schedule.seconds: expected float or null, got 'None'; a dotted flag below a class cannot carry null: "
      "give its group as a mapping, --model.schedule '{seconds: null}'")),
])
def test_a_refused_key_or_value_is_one_line_with_the_closest_key(message, expected):
    assert explain_parse_error(message, KEYS) == expected


def test_a_recipe_typo_through_sessrec_is_one_line(tmp_path, capsys, sessrec_main):
    recipe = tmp_path / "typo.yaml"
    recipe.write_text("model:\n  encoder:\n    class_path: sessrec.models.XLNetEncoder\n    init_args: {d_modle: 16}\n")
    got = sessrec_main("fit", "--config", str(ROOT / "recipes" / "quickstart.yaml"), "--config", str(recipe))
    assert got == ("sessrec fit: error: unknown key model.encoder.init_args.d_modle (XLNetEncoder has no option "
                   "'d_modle'); did you mean model.encoder.init_args.d_model? (--traceback for details)")
    assert "usage" not in capsys.readouterr().err
    got = sessrec_main("fit", "--config", str(ROOT / "recipes" / "quickstart.yaml"), "--trainer.max_epochs", "abc")
    assert got == "sessrec fit: error: trainer.max_epochs: expected int or null, got 'abc' (--traceback for details)"
    got = sessrec_main("fit", "--config", str(ROOT / "recipes" / "quickstart.yaml"), "--model.schedule.seconds", "null")
    assert got.endswith("give its group as a mapping, --model.schedule '{seconds: null}' (--traceback for details)")


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
from sessrec.cli import quiet_third_parties

def noise():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if sys.argv[1] == "quiet":
            quiet_third_parties()
        pl.Trainer(logger=False, enable_checkpointing=False, accelerator="cpu", enable_progress_bar=False)
        _tree_flatten(1)
        warnings.warn("sessrec's own warning", UserWarning)
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
    assert "GPU available" in quiet.stderr  # Lightning's other messages stay


def test_stages_print_a_line_when_each_starts_and_ends_and_while_one_runs(capsys):
    import time

    from sessrec.pipeline.progress import Stages

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
    got = sessrec_main("serve", "--model-dir", str(model), "--port", "80000")
    assert got == "sessrec serve: error: --port 80000 is not a TCP port (0 to 65535) (--traceback for details)"
    weights = next(model.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:100])
    got = sessrec_main("serve", "--model-dir", str(model))
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
