"""Trainer and resume settings that ``sessrec fit`` cannot honour are refused in one line before anything is
written: a time limit of zero, a run of no planned end under a schedule that decays over the planned steps,
a resume with settings other than its checkpoint's, or with data of another vocabulary."""

from __future__ import annotations

import shutil
from datetime import timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from jsonargparse import Namespace
from test_cli_config_errors import DATA, MODEL, QUIET_TRAINER

from sessrec.cli import cli
from sessrec.cli.trainer_settings import refuse_no_training
from sessrec.data.vocab import ItemVocab, vocab_difference
from sessrec.saved.checkpoint import checkpoint_summary

torch.set_num_threads(1)
RECIPE = "seed_everything: 0\n" + QUIET_TRAINER + MODEL + DATA


def recipe(folder: Path) -> Path:
    """The tiny recipe, logging to ``folder/out``."""
    path = folder / "recipe.yaml"
    path.write_text(RECIPE.replace("OUT", str(folder / "out")))
    return path


def refused(sessrec_main, folder: Path, *args: str) -> str:
    """The one line ``sessrec fit --config <recipe> *args`` exits with; nothing written to ``folder/out``."""
    message = sessrec_main("fit", "--config", str(recipe(folder)), *args)
    assert message.startswith("sessrec fit: error: ") and message.endswith(" (--traceback for details)")
    assert not (folder / "out").exists()
    return message.removeprefix("sessrec fit: error: ").removesuffix(" (--traceback for details)")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """``last.ckpt`` of a fitted run of the tiny recipe (d_model 8, max_length 8)."""
    folder = tmp_path_factory.mktemp("fitted")
    cli(["fit", "--config", str(recipe(folder))])
    return next((folder / "out").glob("run/version_0/checkpoints/last.ckpt"))


@pytest.mark.parametrize("max_time", ["00:00:00:00", "{seconds: 0}", "{minutes: 1, seconds: -60}"])
def test_a_max_time_of_zero_is_refused_before_anything_is_written(max_time, tmp_path, sessrec_main):
    got = refused(sessrec_main, tmp_path, "--trainer.max_time", max_time)
    assert got.startswith("--trainer.max_time ") and "a time limit of 0 s; sessrec fit would take no training step" in got


def test_a_max_time_of_zero_as_a_timedelta_is_refused():
    with pytest.raises(ValueError, match=r"--trainer.max_time 0:00:00: a time limit of 0 s"):
        refuse_no_training(Namespace(max_time=timedelta(0)))
    refuse_no_training(Namespace(max_time=timedelta(seconds=1)))


@pytest.mark.parametrize("flags, given", [
    (["--trainer.max_epochs", "-1"], "--trainer.max_epochs -1"),
    (["--trainer.max_epochs", "-1", "--trainer.max_steps", "-1"], "--trainer.max_epochs -1"),
    (["--trainer.max_epochs", "null", "--trainer.max_time", "00:00:01:00"], "--trainer.max_time without --trainer.max_epochs"),
    (["--trainer.max_epochs", "-1", "--model.schedule.decay", "linear"], "--trainer.max_epochs -1"),
])
def test_a_run_of_no_planned_end_is_refused_for_a_schedule_that_decays_over_the_planned_steps(flags, given, tmp_path,
                                                                                               sessrec_main):
    got = refused(sessrec_main, tmp_path, *flags)
    assert got.startswith(f"{given} and no --trainer.max_steps: training has no planned end, and the ")
    assert "set --trainer.max_steps or a --trainer.max_epochs, a time budget --model.schedule.seconds" in got


@pytest.mark.parametrize("flags", [
    ["--model.schedule.decay", "constant"],  # nothing to decay
    ["--model.schedule.seconds", "60"],  # the schedule's own length: a time budget
])
def test_a_run_of_no_planned_end_trains_with_a_schedule_of_no_planned_steps(flags, tmp_path, sessrec_main):
    assert sessrec_main("fit", "--config", str(recipe(tmp_path)), "--trainer.max_epochs", "-1",
                        "--trainer.max_time", "00:00:00:01", *flags) == ""
    assert (tmp_path / "out" / "run" / "version_0" / "model" / "config.json").is_file()


@pytest.mark.parametrize("flags, expected", [
    (["--model.encoder.init_args.d_model", "16"], "--model.encoder.init_args.d_model 16 differs from the checkpoint's 8"),
    (["--model.encoder", "{class_path: sessrec.models.SASRecEncoder, init_args: {d_model: 8, n_head: 2}}"],
     "--model.encoder.class_path sessrec.models.SASRecEncoder differs from the checkpoint's sessrec.models.gru4rec.GRU4RecEncoder"),
    (["--model.optimization.lr", "0.1", "--model.dropout", "0.3"],
     "--model.dropout 0.3 differs from the checkpoint's 0.1"),
    (["--data.max_length", "10"], "--data.max_length 10 differs from the checkpoint's 8"),
])
def test_a_resume_with_settings_other_than_its_checkpoints_is_refused(flags, expected, checkpoint, tmp_path, sessrec_main):
    got = refused(sessrec_main, tmp_path, "--ckpt_path", str(checkpoint), "--trainer.max_epochs", "2", *flags)
    assert got.startswith(f"{expected} ({checkpoint})")
    assert "a resumed fit" in got


def test_a_resume_from_a_checkpoint_at_max_steps_is_refused(checkpoint, tmp_path, sessrec_main):
    """The tiny recipe's checkpoint stands at step 1 (one batch, one epoch): nothing is left to train."""
    got = refused(sessrec_main, tmp_path, "--ckpt_path", str(checkpoint), "--trainer.max_steps", "1")
    assert got == (f"--ckpt_path {checkpoint} stands at step 1, --trainer.max_steps 1: the resumed fit would "
                   "take no step; give a --trainer.max_steps above 1 to train on")


def test_a_resume_from_a_checkpoint_at_max_epochs_is_refused(checkpoint, tmp_path, sessrec_main):
    """The tiny recipe's checkpoint ends its one epoch: resumed with its own recipe (max_epochs 1) the fit took no
    step, exit 0, and still wrote its model directory again, a second version of the same weights."""
    got = refused(sessrec_main, tmp_path, "--ckpt_path", str(checkpoint))
    assert got == (f"--ckpt_path {checkpoint} has finished 1 epochs, --trainer.max_epochs 1: the resumed fit would "
                   "take no step; give a --trainer.max_epochs above 1 to train on")


def test_a_resume_with_its_recipe_trains_on(checkpoint, tmp_path, sessrec_main):
    assert sessrec_main("fit", "--config", str(recipe(tmp_path)), "--ckpt_path", str(checkpoint),
                        "--trainer.max_epochs", "2") == ""
    assert (tmp_path / "out" / "run" / "version_0" / "model" / "config.json").is_file()


def test_a_resume_on_other_sessions_names_what_differs_in_the_vocabulary(checkpoint, tmp_path, sessrec_main):
    got = refused(sessrec_main, tmp_path, "--ckpt_path", str(checkpoint), "--trainer.max_epochs", "2",
                  "--data.source.init_args.num_sessions", "600")  # the same 40 items, in another order of counts
    assert got.startswith("the checkpoint's vocabulary differs from the one this data module uses (both have 42 ids, "
                          "but ")
    assert "of them stand for other items: id " in got


def test_vocab_difference_names_the_count_the_item_or_the_counts():
    ids = pa.array([7, 8, 9])
    vocab = ItemVocab(ids, np.array([5, 4, 3]))
    assert vocab_difference(vocab, ItemVocab(ids.slice(0, 2), np.array([5, 4]))) == "5 ids in the checkpoint, 4 here"
    assert vocab_difference(vocab, ItemVocab(pa.array([7, 9, 8]), np.array([5, 4, 3]))) == (
        "both have 5 ids, but 2 of them stand for other items: id 3 is item 8 in the checkpoint, 9 here")
    assert vocab_difference(vocab, ItemVocab(ids, np.array([5, 4, 2]))) == (
        "the same 5 ids of the same items, counted on other sessions: item 9 3 times in the checkpoint, 2 here")


@pytest.mark.parametrize("command", ["validate", "test", "predict"])
@pytest.mark.parametrize(("flag", "value", "held"), [("min_item_count", "5", "1"), ("max_vocab_size", "10", "None")])
def test_a_vocabulary_setting_other_than_the_models_is_refused_by_model_dir_commands(
    sessrec_main, checkpoint: Path, tmp_path: Path, command: str, flag: str, value: str, held: str
) -> None:
    """With --model_dir the model's own vocabulary is read: a min_item_count or max_vocab_size other than its training's
    would be ignored, so it is refused in one line; the same values as the model's pass."""
    model_dir = checkpoint.parents[1] / "model"
    extra = ["--data.predict_path", str(tmp_path / "x.parquet"), "--scoring.output", str(tmp_path / "r.parquet")] \
        if command == "predict" else []
    message = sessrec_main(command, "--config", str(recipe(tmp_path)), "--model_dir", str(model_dir), *extra,
                           f"--data.{flag}", value)
    assert message == (f"sessrec {command}: error: --data.{flag} {value} differs from the model's {held} ({model_dir}): "
                       "the model reads the vocabulary it was trained with (its vocab.parquet); evaluate it with that "
                       "run's data settings (--traceback for details)")
    assert not (tmp_path / "r.parquet").exists()
    assert sessrec_main("validate", "--config", str(recipe(tmp_path)), "--model_dir", str(model_dir),
                        f"--data.{flag}", held.replace("None", "null")) == ""


def test_data_with_no_item_of_the_models_vocabulary_is_refused_not_scored_zero(
    sessrec_main, checkpoint: Path, tmp_path: Path
) -> None:
    """Evaluating a model on data none of whose items it knows would print metrics of 0 for a mismatch of files:
    refused in one line naming the data and the vocabulary."""
    model_dir = checkpoint.parents[1] / "model"
    rows = [(s, 900_000 + (s * 3 + i) % 17, 1_700_000_000 + s * 7_200 + i * 60) for s in range(60) for i in range(3)]
    events = tmp_path / "events.csv"
    events.write_text("session_id,item_id,timestamp\n" + "".join(f"{s},{i},{t}\n" for s, i, t in rows))
    message = sessrec_main("test", "--config", str(recipe(tmp_path)), "--model_dir", str(model_dir),
                           "--data.source", "sessrec.data.EventLogSource", "--data.source.init_args.path", str(events),
                           "--data.source.init_args.schema.time_unit", "s", "--data.source.init_args.test_days", "1",
                           "--data.source.init_args.valid_days", "1")
    assert message.startswith(f"sessrec test: error: {events}: none of the ") and " items of the test split is in " \
        f"the vocabulary of {model_dir / 'vocab.parquet'} (" in message
    assert "; the data's first 9000" in message
    assert message.endswith("): the data and the model do not belong together (--traceback for details)")


def test_item_ids_of_another_type_than_the_models_are_refused_naming_the_file_and_column(
    sessrec_main, checkpoint: Path, tmp_path: Path
) -> None:
    model_dir = checkpoint.parents[1] / "model"
    rows = [(s, f"x{(s * 3 + i) % 17}", 1_700_000_000 + s * 7_200 + i * 60) for s in range(60) for i in range(3)]
    events = tmp_path / "events.csv"
    events.write_text("sid,iid,ts\n" + "".join(f"{s},{i},{t}\n" for s, i, t in rows))
    message = sessrec_main("test", "--config", str(recipe(tmp_path)), "--model_dir", str(model_dir),
                           "--data.source", "sessrec.data.EventLogSource", "--data.source.init_args.path", str(events),
                           "--data.source.init_args.schema.session_id", "sid", "--data.source.init_args.schema.item_id",
                           "iid", "--data.source.init_args.schema.timestamp", "ts",
                           "--data.source.init_args.schema.time_unit", "s", "--data.source.init_args.test_days", "1",
                           "--data.source.init_args.valid_days", "1")
    assert message.startswith(f"sessrec test: error: {events}, column 'iid': item ids of type string cannot be matched "
                              "with a vocabulary of int64: 'x")


def test_a_mid_epoch_resume_with_other_batches_is_refused_before_anything_is_written(tmp_path, sessrec_main):
    """A run stopped one batch into its epoch, resumed with another batch size: the loader's position counts in
    batches of the checkpoint's size, so the resume is refused, and the run's folder (its config.yaml above all)
    is left as it was."""
    args = ["--config", str(recipe(tmp_path)), "--trainer.limit_train_batches", "1.0", "--trainer.max_epochs", "2"]
    assert sessrec_main("fit", *args, "--trainer.max_steps", "1") == ""
    run = tmp_path / "out" / "run" / "version_0"
    checkpoint = run / "checkpoints" / "last.ckpt"
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted((tmp_path / "out").rglob("*")) if p.is_file()}
    got = sessrec_main("fit", *args, "--trainer.max_steps", "3", "--data.batch_size", "16", "--ckpt_path", str(checkpoint))
    assert got == ("sessrec fit: error: the saved loader state stands 1 batches into epoch 0 with --data.batch_size 32, "
                   "this loader with 16: resume mid-epoch with the rows and batches it was trained with "
                   "(--traceback for details)")
    after = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted((tmp_path / "out").rglob("*")) if p.is_file()}
    assert after == before


def test_a_run_stopped_by_max_steps_mid_epoch_resumes_in_that_epoch_and_ends_as_the_uninterrupted_run(tmp_path):
    """Stopped one step into its first epoch of 8 batches, the run's last.ckpt counted that epoch finished: resumed
    with --trainer.max_epochs 2 it finished epoch 0 and stopped, 8 steps where the uninterrupted run takes 12 (and
    resumed with max_epochs 1 it was refused as finished). It now continues epoch 0 from the loader's position."""
    args = ["--trainer.limit_train_batches", "1.0", "--trainer.max_epochs", "2", "--model.schedule.decay", "constant"]
    (tmp_path / "whole").mkdir()
    (tmp_path / "cut").mkdir()
    cli(["fit", "--config", str(recipe(tmp_path / "whole")), *args, "--trainer.max_steps", "12"])
    cli(["fit", "--config", str(recipe(tmp_path / "cut")), *args, "--trainer.max_steps", "1"])
    last = tmp_path / "cut" / "out" / "run" / "version_0" / "checkpoints" / "last.ckpt"
    assert checkpoint_summary(last)["epochs_done"] == 0
    cli(["fit", "--config", str(recipe(tmp_path / "cut")), *args, "--trainer.max_steps", "12", "--ckpt_path", str(last)])
    whole = torch.load(tmp_path / "whole" / "out" / "run" / "version_0" / "checkpoints" / "last.ckpt", weights_only=False)
    resumed = torch.load(last, weights_only=False)
    assert resumed["global_step"] == whole["global_step"] == 12 and resumed["epoch"] == whole["epoch"] == 1
    assert resumed["state_dict"].keys() == whole["state_dict"].keys()
    for name, value in whole["state_dict"].items():
        assert torch.equal(resumed["state_dict"][name], value), name


@pytest.mark.parametrize("version", [[], ["--trainer.logger.init_args.version", "0"]], ids=["found", "given"])
def test_a_resume_keeps_the_runs_metrics_and_says_nothing_is_deleted(tmp_path, sessrec_main, version):
    """A resume into the run's own folder: with the version given (it is the run's), the CSV logger deleted the run's
    metrics.csv (steps 0 and 1 lost); without a metrics.csv yet (stopped before logging) it warned that previous
    log files would be deleted. Either way the rows of the run resumed are kept, and no such warning is printed."""
    import csv
    import warnings

    args = ["--config", str(recipe(tmp_path)), "--trainer.limit_train_batches", "1.0", "--trainer.max_epochs", "3"]
    run = tmp_path / "out" / "run" / "version_0"
    for log_every, logged in (("1", [0, 1, 2, 3]), ("50", [])):
        assert sessrec_main("fit", *args, "--trainer.max_steps", "2", "--trainer.log_every_n_steps", log_every) == ""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert sessrec_main("fit", *args, *version, "--trainer.max_steps", "4", "--trainer.log_every_n_steps",
                                log_every, "--ckpt_path", str(run / "checkpoints" / "last.ckpt")) == ""
        assert not [w for w in caught if "will be deleted" in str(w.message)]
        assert sorted(p.name for p in run.parent.iterdir()) == ["version_0"]
        rows = list(csv.DictReader((run / "metrics.csv").read_text().splitlines())) if (run / "metrics.csv").exists() else []
        assert [int(r["step"]) for r in rows if r.get("train/loss")] == logged
        shutil.rmtree(tmp_path / "out")


def test_a_click_ranker_stopped_mid_epoch_resumes_in_that_epoch_and_ends_as_the_uninterrupted_run(tmp_path, monkeypatch):
    """The click-out loader kept no position: a DLRM resumed from a checkpoint 3 batches into its epoch started the
    epoch over, trained its first 3 batches twice and its last 3 never, and ended with other weights, with exit 0."""
    from test_trivago import fake_log

    log = fake_log(tmp_path / "log.parquet")
    recipes = Path(__file__).resolve().parents[1] / "recipes"
    args = ["--config", str(recipes / "dlrm_trivago.yaml"), "--data.init_args.path", str(log),
            "--data.init_args.test_hours", "10", "--data.init_args.valid_hours", "10", "--data.init_args.min_count", "1",
            "--data.init_args.batch_size", "64", "--trainer.enable_progress_bar", "false", "--trainer.logger", "false",
            "--model.init_args.network.embedding_dim", "8", "--model.init_args.network.dense_layers", "[8, 8]",
            "--model.init_args.network.over_layers", "[8]", "--trainer.callbacks", "[]",
            "--last_checkpoint.every_n_train_steps", "1"]
    for run in ("whole", "cut"):
        (tmp_path / run).mkdir()
    monkeypatch.chdir(tmp_path / "whole")  # without a logger or callbacks, last.ckpt is checkpoints/last.ckpt
    cli(["fit", *args, "--trainer.max_epochs", "1"])
    monkeypatch.chdir(tmp_path / "cut")
    cli(["fit", *args, "--trainer.max_epochs", "1", "--trainer.max_steps", "3"])
    last = Path("checkpoints/last.ckpt")
    assert torch.load(last, weights_only=True)["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]["position"] == 3
    cli(["fit", *args, "--trainer.max_epochs", "1", "--ckpt_path", str(last)])
    whole = torch.load(tmp_path / "whole" / last, weights_only=True)
    resumed = torch.load(last, weights_only=True)
    assert resumed["global_step"] == whole["global_step"] > 3
    for name, value in whole["state_dict"].items():
        assert torch.equal(resumed["state_dict"][name], value), name
