"""``sessrec fit --ckpt_path``: a resume that would train nothing refused, and a killed run continued in its own
run folder (its version, checkpoints and ``metrics.csv``) rather than a new one beside it."""

from __future__ import annotations

import csv
import re
import warnings
from pathlib import Path

from jsonargparse import Namespace

from sessrec.saved.checkpoint import checkpoint_summary


def refuse_finished_resume(cfg: object) -> None:
    """For ``fit --ckpt_path``: refuse a checkpoint that stands at or past ``--trainer.max_steps``, or has finished
    ``--trainer.max_epochs`` epochs, in one line: the fit would take no step and still write its model directory
    again, as a new version of the same weights."""
    ckpt, max_steps, max_epochs = cfg.get("ckpt_path"), cfg.trainer.get("max_steps"), cfg.trainer.get("max_epochs")
    if not ckpt or not Path(ckpt).is_file():
        return
    summary = checkpoint_summary(ckpt)
    step, epochs = int(summary.get("global_step") or 0), summary.get("epochs_done")
    if isinstance(max_steps, int) and 0 <= max_steps <= step:
        raise ValueError(f"--ckpt_path {ckpt} stands at step {step}, --trainer.max_steps {max_steps}: the resumed fit "
                         f"would take no step; give a --trainer.max_steps above {step} to train on")
    if isinstance(max_epochs, int) and epochs is not None and 0 <= max_epochs <= epochs:
        raise ValueError(f"--ckpt_path {ckpt} has finished {epochs} epochs, --trainer.max_epochs {max_epochs}: the "
                         f"resumed fit would take no step; give a --trainer.max_epochs above {epochs} to train on")


def resumed_run(cfg: object) -> tuple[Path, int] | None:
    """For ``fit --ckpt_path <save_dir>/<name>/version_N/checkpoints/<file>`` with a logger that writes
    to ``<save_dir>/<name>`` and no version of its own: set its version to N, so the resumed run logs
    and checkpoints into the folder of the run it continues (not a new ``version_N+1`` beside a stale
    ``best.ckpt``); returns that folder and the checkpoint's global step, else None. A logger given that
    version (N, or the folder's name) writes there too, and is resumed alike."""
    ckpt = cfg.get("ckpt_path")
    logger = cfg.trainer.get("logger") if ckpt else None
    args = logger.get("init_args") if isinstance(logger, Namespace) else None
    if args is None or "version" not in args or args.get("save_dir") is None:
        return None
    run = Path(ckpt).resolve().parent.parent
    number = re.fullmatch(r"version_(\d+)", run.name)
    same = (Path(args.save_dir) / str(args.get("name") or "")).resolve() == run.parent
    if Path(ckpt).resolve().parent.name != "checkpoints" or number is None or not same:
        return None
    if args.get("version") is None:
        args.version = int(number.group(1))
    elif args.version not in (int(number.group(1)), run.name):
        return None
    return run, int(checkpoint_summary(ckpt).get("global_step") or 0)


def restore_metrics(logger: object, run: Path, step: int) -> None:
    """Log again the rows of ``<run>/metrics.csv`` up to `step` (those of the run resumed), which a
    CSV logger removes when it opens a folder that is not empty (and warns that it does, which a run
    resumed into its own folder does not need to hear)."""
    if type(logger).__name__ != "CSVLogger":
        return
    path = run / "metrics.csv"
    rows = []
    if path.is_file():
        with open(path, newline="") as fh:
            rows = list(csv.DictReader(fh))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Experiment logs directory")  # the rows are put back below
        experiment = logger.experiment
    for row in rows:
        at = int(float(row.pop("step", "") or -1))
        if 0 <= at <= step:
            experiment.log_metrics({k: float(v) for k, v in row.items() if v not in ("", None)}, at)
    experiment.save()
