"""``sessrec fit`` runs: the metrics printed are the kept checkpoint's, and resuming a killed run
continues in its own folder."""

from __future__ import annotations

import csv
import os
import re
import signal
import sys
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch

from sessrec.cli import cli

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "--config", str(ROOT / "recipes" / "quickstart.yaml"),
    "--trainer.enable_progress_bar", "false",
    "--data.source.init_args.num_sessions", "1500",
    "--data.source.init_args.num_items", "150",
    "--model.encoder.init_args.d_model", "16",
    "--model.encoder.init_args.n_head", "2",
    "--model.encoder.init_args.n_layer", "1",
]
# keep the worst epoch: training raises ndcg, so the checkpoint kept is not the last epoch's
WORST = """trainer:
  callbacks:
    - class_path: pytorch_lightning.callbacks.ModelCheckpoint
      init_args: {monitor: val/ndcg@20, mode: min, save_top_k: 1, filename: best}
"""


def val_lines(out: str) -> dict[int, float]:
    """epoch -> ndcg@20 of the printed ``[val]`` lines."""
    found = re.findall(r"^\[val\] epoch (\d+) step \d+: .*ndcg@20=([0-9.]+)", out, flags=re.MULTILINE)
    return {int(epoch): float(value) for epoch, value in found}


@pytest.mark.slow
def test_fit_prints_the_kept_checkpoints_metrics_and_a_resume_continues_its_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "worst.yaml").write_text(WORST)
    cli(["fit", *TINY, "--config", "worst.yaml", "--trainer.max_epochs", "2"])
    out = capsys.readouterr().out
    ndcg = val_lines(out)
    kept = min(ndcg, key=ndcg.get)
    assert sorted(ndcg) == [0, 1] and kept != 1  # the kept checkpoint is not the last epoch's
    (line,) = [x for x in out.splitlines() if x.startswith("sessrec fit: metrics of")]
    assert f"best.ckpt (epoch {kept}, step " in line and "the checkpoint kept" in line
    assert float(re.search(r"val/ndcg@20=([0-9.]+)", line).group(1)) == pytest.approx(ndcg[kept], abs=1e-4)

    run = tmp_path / "runs" / "quickstart" / "version_0"
    cli(["fit", *TINY, "--config", "worst.yaml", "--trainer.max_epochs", "3",
         "--ckpt_path", str(run / "checkpoints" / "last.ckpt")])  # a killed run, resumed for one more epoch
    out = capsys.readouterr().out
    assert sorted(p.name for p in run.parent.iterdir()) == ["version_0"]  # no version_1 beside a stale best.ckpt
    assert sorted(val_lines(out)) == [2]
    assert sorted(p.name for p in (run / "checkpoints").glob("*.ckpt")) == ["best.ckpt", "last.ckpt"]
    with open(run / "metrics.csv", newline="") as fh:
        epochs = {float(r["epoch"]) for r in csv.DictReader(fh) if r.get("val/ndcg@20")}
    assert epochs == {0.0, 1.0, 2.0}  # the rows of the run resumed are kept
    (line,) = [x for x in out.splitlines() if x.startswith("sessrec fit: metrics of")]
    assert f"(epoch {kept}, step " in line


class Failing(pl.Callback):
    """Fails the fit when training starts: after the run folder's config.yaml and hparams.yaml, before any checkpoint."""

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        raise RuntimeError("the disk is full")


def test_a_fit_that_fails_before_its_first_checkpoint_leaves_no_run_folder(tmp_path, sessrec_main):
    from test_cli_config_errors import DATA, MODEL, TRAINER

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text((TRAINER + MODEL + DATA).replace("OUT", str(tmp_path / "out")))
    got = sessrec_main("fit", "--config", str(recipe), "--trainer.callbacks+=test_cli_runs.Failing")
    assert got == "sessrec fit: error: the disk is full (--traceback for details)"
    assert not (tmp_path / "out" / "run" / "version_0").exists()
    assert sessrec_main("fit", "--config", str(recipe)) == ""  # the next run is version_0 again, and kept
    assert (tmp_path / "out" / "run" / "version_0" / "config.yaml").is_file()


def test_a_failed_fit_logging_to_wandb_leaves_no_run_folder_once_the_run_ends(tmp_path, sessrec_main, monkeypatch):
    """The data fragments log to Weights & Biases (offline): a fit that failed before its first checkpoint removed
    its folder, and wandb's run, still open, wrote its console log (the error line) back into it."""
    import wandb
    from test_cli_config_errors import DATA, MODEL, TRAINER

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONSOLE", "wrap")  # its console log, as in a terminal (pytest captures the output)
    out = tmp_path / "out"
    logger = f"  logger: {{class_path: pytorch_lightning.loggers.WandbLogger, init_args: {{save_dir: {out}, offline: true}}}}\n"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(re.sub(r"  logger: .*\n", logger, TRAINER + MODEL + DATA).replace("OUT", str(out)))
    try:
        got = sessrec_main("fit", "--config", str(recipe), "--trainer.callbacks+=test_cli_runs.Failing")
        print(got, file=sys.stderr)  # as the entry point's exit prints it
    finally:
        wandb.finish()  # what the interpreter's exit does to a run still open
    assert got == "sessrec fit: error: the disk is full (--traceback for details)"
    assert not out.exists()


class FitMeanwhile(pl.Callback):
    """Runs another ``sessrec fit`` (`args`, through `main`) when this fit starts training: two fits at once."""

    main, args, got = None, [], []

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        FitMeanwhile.got.append(FitMeanwhile.main(*FitMeanwhile.args))


@pytest.mark.parametrize("folder", ["checkpoints", "run folder"])
def test_a_fit_into_the_folders_another_fit_writes_is_refused(tmp_path, sessrec_main, monkeypatch, folder):
    """Two fits at once (a scheduler, a CI matrix) into one run folder, or one checkpoint folder: the second is
    refused in one line naming the folder, before it writes anything, and the first writes its run whole (its
    checkpoints, config.yaml and model directory alone, not a mix of the two runs')."""
    from test_cli_config_errors import DATA, MODEL, TRAINER

    out = tmp_path / "out"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text((TRAINER + MODEL + DATA).replace("OUT", str(out)))
    other = ["--trainer.logger.init_args.version", "0"] if folder == "run folder" else []  # else version_1 beside it
    monkeypatch.setattr(FitMeanwhile, "main", sessrec_main)
    monkeypatch.setattr(FitMeanwhile, "args", ["fit", "--config", str(recipe), "--model.seed", "7", *other])
    monkeypatch.setattr(FitMeanwhile, "got", [])
    assert sessrec_main("fit", "--config", str(recipe), "--trainer.callbacks+=test_cli_runs.FitMeanwhile") == ""
    held = out / "checkpoints" if folder == "checkpoints" else out / "run" / "version_0"
    assert FitMeanwhile.got == [f"sessrec fit: error: {held}: another sessrec fit is writing its checkpoints or logs "
                                "here; wait for it to finish, or give this run another folder (the logger's name or "
                                "version, --trainer.default_root_dir, the checkpoint callback's dirpath) (--traceback "
                                "for details)"]
    assert sorted(p.name for p in (out / "run").iterdir()) == ["version_0"]
    assert "seed: 7" not in (out / "run" / "version_0" / "config.yaml").read_text()
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["best.ckpt", "last.ckpt"]
    assert (out / "model" / "config.json").is_file() and not (out / "model" / "versions").exists()


class Terminated(pl.Callback):
    """Sends this process SIGTERM (a scheduler or a container runtime stopping the job) at the end of the first epoch."""

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.current_epoch == 0:
            os.kill(os.getpid(), signal.SIGTERM)


def test_a_fit_stopped_by_sigterm_exits_with_an_error_naming_its_last_checkpoint(tmp_path, sessrec_main):
    """A fit stopped by SIGTERM before its end wrote no model directory: it exits non-zero, in one line saying so and
    naming the ``last.ckpt`` that resumes it (Lightning's own stop is an exit of status 0, a run that succeeded)."""
    from test_cli_config_errors import DATA, MODEL, TRAINER

    out = tmp_path / "out"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text((TRAINER + MODEL + DATA).replace("OUT", str(out)))
    got = sessrec_main("fit", "--config", str(recipe), "--trainer.max_epochs", "3",
                       "--trainer.callbacks+=test_cli_runs.Terminated")
    assert got == ("sessrec fit: error: stopped by SIGTERM at step 1 (epochs done: 1), before the end of its training: "
                   f"no model directory was written; sessrec fit --ckpt_path {out / 'checkpoints' / 'last.ckpt'} resumes it")
    assert (out / "checkpoints" / "last.ckpt").is_file() and not (out / "model").exists()


@pytest.mark.slow
def test_a_fit_logging_to_wandb_shows_no_notice_of_wandb(tmp_path):
    """The data fragments log to Weights & Biases (offline): Lightning's logger passes wandb an `anonymous` setting
    of no effect, on which wandb warns before it reads WANDB_SILENT; the fit leaves it unset, and prints no notice."""
    import subprocess

    from test_cli_config_errors import DATA, MODEL, TRAINER

    out = tmp_path / "out"
    logger = f"  logger: {{class_path: pytorch_lightning.loggers.WandbLogger, init_args: {{save_dir: {out}, offline: true}}}}\n"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(re.sub(r"  logger: .*\n", logger, TRAINER + MODEL + DATA).replace("OUT", str(out)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "SESSREC_"))}
    env.update(PYTHONPATH=str(Path(__file__).resolve().parents[1]), OMP_NUM_THREADS="1")

    run = subprocess.run([sys.executable, "-m", "sessrec.cli", "fit", "--config", str(recipe)],
                         capture_output=True, text=True, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "wandb:" not in run.stdout + run.stderr
    assert len(list(out.glob("wandb/offline-run-*"))) == 1  # logged, offline
