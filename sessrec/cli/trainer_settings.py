"""Trainer settings a command cannot honour, each refused in one line naming it before anything is written.

`SessrecCLI` (`sessrec.cli.lightning`) calls these on the parsed config: a flag that only another command reads,
a Trainer that ``predict --engine dask`` cannot use, a GPU the machine lacks, half-precision weights, a limit
with which ``validate``, ``test`` or ``predict`` scores nothing or part of the file, and for ``fit`` a Trainer of
no training step, a count below 1, ``overfit_batches``, a monitor the validation never logs, or no planned end for a schedule that
decays over the planned steps.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytorch_lightning as pl
import torch
from jsonargparse import Namespace

from sessrec.cli.errors import flag_mapping

# what a Dask worker scores with: its CPU, float32, one process per worker (the Trainer is not used)
DASK_TRAINER = {"accelerator": ("auto", "cpu"), "strategy": ("auto",), "devices": ("auto", 1, "1"), "num_nodes": (1,),
                "precision": (None, 32, "32", "32-true")}


# settings that one command reads and the others do not: a recipe may hold them for that command, a flag is refused
ONE_COMMAND = {("scoring",): "predict", ("data", "predict_path"): "predict", ("data", "init_args", "predict_path"): "predict",
               ("last_checkpoint",): "fit"}


def refuse_flags_of_other_commands(sub: str, args: list[str]) -> None:
    """Refuse a flag of `args` that only another command reads (`ONE_COMMAND`: ``--scoring.output`` writes
    ``sessrec predict``'s recommendations, ``--last_checkpoint.*`` saves ``fit``'s), in one line naming it."""
    given = flag_mapping(args)
    for path, reader in ONE_COMMAND.items():
        found: object = given
        for part in path:
            found = found.get(part) if isinstance(found, dict) else None
        if found is None or sub == reader:
            continue
        flag = ".".join((*path, *([next(iter(found))] if isinstance(found, dict) and found else [])))
        raise ValueError(f"--{flag} is read by sessrec {reader} alone, and sessrec {sub} would ignore it: drop the flag")


def refuse_trainer_settings(trainer: Namespace) -> None:
    """Refuse a Trainer setting that ``predict --engine dask`` cannot honour (its workers score on their CPU in
    float32, without the Trainer), in one line naming it."""
    for key, allowed in DASK_TRAINER.items():
        value = trainer.get(key, allowed[0])
        if value not in allowed:
            raise ValueError(f"--trainer.{key} {value}: predict --engine dask scores on each worker's CPU in float32, "
                             f"without the Trainer; set --trainer.{key} {allowed[-1] if key == 'precision' else allowed[0]} "
                             "or use --engine local")


NO_TRAINING = {"max_epochs": (0,), "max_steps": (0,), "limit_train_batches": (0, 0.0)}  # Trainer settings of no step
NO_STEP = "sessrec fit would take no training step and save untrained weights; give at least one"


def refuse_absent_gpu(trainer: Namespace) -> None:
    """Refuse ``--trainer.accelerator gpu`` (or ``cuda``) on a machine where torch sees no GPU, in one line naming it
    (Lightning's own refusal names no setting: "No supported gpu backend found!")."""
    accelerator = str(trainer.get("accelerator") or "auto")
    mps = accelerator == "gpu" and torch.backends.mps.is_available()  # Apple's GPU, which "gpu" picks too
    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available() and not mps:
        raise ValueError(f"--trainer.accelerator {accelerator}: torch sees no GPU on this machine (CUDA not available); "
                         "use --trainer.accelerator cpu, or auto to take a GPU where there is one")


HALF_WEIGHTS = {"16-true": "16-mixed", "bf16-true": "bf16-mixed"}  # precision -> the mixed setting to use instead


def refuse_half_weights(trainer: Namespace) -> None:
    """Refuse a precision that keeps the weights in half precision: validation, test and prediction would
    score the catalogue in it (`sessrec.tasks.checkpointing.full_precision` turns autocast off, not the weights'
    dtype), and bfloat16 scores tie by the hundreds, a tie counting against the target."""
    value = trainer.get("precision")
    if value in HALF_WEIGHTS:
        raise ValueError(f"--trainer.precision {value}: the weights would be half precision and every score of the catalogue "
                         f"with them (ties by the hundreds, each against the target); use {HALF_WEIGHTS[value]}: the "
                         "training steps in half precision, evaluation and predictions in float32")
    accelerator = str(trainer.get("accelerator") or "auto")
    on_cpu = accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())
    if str(value) in ("16-mixed", "16") and on_cpu:  # Lightning would run bfloat16 instead, with a warning
        raise ValueError(f"--trainer.precision {value}: float16 autocast runs on a GPU, and this run is on the CPU "
                         f"(--trainer.accelerator {accelerator}); use bf16-mixed on the CPU")


LIMITS = {"validate": "limit_val_batches", "test": "limit_test_batches", "predict": "limit_predict_batches"}


def refuse_partial_scoring(sub: str, trainer: Namespace) -> None:
    """Refuse a Trainer limit with which ``validate`` or ``test`` scores no batch (``limit_*_batches 0``: no metric,
    exit 0), or with which ``predict`` scores part of the file (any ``limit_predict_batches``: an output of part of
    the sessions), in one line naming it."""
    key = LIMITS[sub]
    value = trainer.get(key)
    if value is None or isinstance(value, bool):
        return
    if sub == "predict" and not (isinstance(value, float) and value == 1.0):  # an int counts batches: 1 is one
        raise ValueError(f"--trainer.{key} {value}: sessrec predict writes every session of --data.predict_path, and a "
                         "limit would write part of them as the output; drop the flag")
    if value == 0:
        raise ValueError(f"--trainer.{key} {value}: sessrec {sub} would score no batch and print no metric; give at "
                         "least one")


def refuse_no_training(trainer: Namespace) -> None:
    """Refuse a Trainer setting with which ``fit`` takes no training step (and would save untrained weights
    as the model directory), in one line naming it."""
    for key, nothing in NO_TRAINING.items():
        value = trainer.get(key)
        if value is not None and not isinstance(value, bool) and value in nothing:
            raise ValueError(f"--trainer.{key} {value}: {NO_STEP} (fast_dev_run true checks a recipe without saving)")
    seconds = duration_seconds(trainer.get("max_time"))
    if seconds is not None and seconds <= 0:
        raise ValueError(f"--trainer.max_time {trainer.max_time}: a time limit of {seconds:g} s; {NO_STEP} second "
                         "(DD:HH:MM:SS, e.g. 00:01:00:00 for an hour)")


def refuse_no_checkpointing(trainer: Namespace) -> None:
    """Refuse ``enable_checkpointing: false`` for ``fit``, in one line naming it: the model directory is written from
    the best checkpoint and ``last.ckpt`` resumes the run (Lightning would refuse it naming a ModelCheckpoint the
    user never gave: sessrec's own ``last.ckpt`` callback)."""
    if trainer.get("enable_checkpointing") is False:
        raise ValueError("--trainer.enable_checkpointing false: sessrec fit writes the model directory from the best "
                         "checkpoint and keeps last.ckpt to resume the run; drop the setting (fast_dev_run true checks a "
                         "recipe without saving)")


COUNTS = {"accumulate_grad_batches": "batches", "check_val_every_n_epoch": "epochs", "val_check_interval": "batches"}


def refuse_counts_below_one(trainer: Namespace) -> None:
    """Refuse a Trainer setting that counts the batches or epochs of a training step or a validation (`COUNTS`) given
    as an integer below 1, in one line naming it: Lightning divides by it (0) or reads it as another count (below 0).
    A float ``val_check_interval`` is a share of the epoch, as Lightning reads it."""
    for key, counted in COUNTS.items():
        value = trainer.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value < 1:
            raise ValueError(f"--trainer.{key} {value}: a number of {counted}, 1 or more")


def refuse_overfit_batches(trainer: Namespace) -> None:
    """Refuse ``--trainer.overfit_batches``: Lightning fixes the batches it repeats by turning off a sampler's
    shuffling, and sessrec's loaders shuffle by their own seed and epoch, with no sampler, so every epoch would
    train on other batches than the last."""
    value = trainer.get("overfit_batches")
    if value is not None and not isinstance(value, bool) and value != 0:
        raise ValueError(f"--trainer.overfit_batches {value}: the loaders shuffle each epoch by their own seed, with no "
                         "sampler Lightning can turn off, so each epoch would train on other batches; train on a few with "
                         "--trainer.limit_train_batches")


def refuse_unlogged_monitor(trainer: pl.Trainer, task: pl.LightningModule) -> None:
    """Refuse a callback (``ModelCheckpoint``, ``EarlyStopping``) that monitors a validation metric ``val/<name>``
    which the task's validation never logs (``val/ndcg@20`` with ``--model.evaluation.ks [5, 10]``), in one line
    before training: Lightning stops at the end of the first validation. A task without validation metrics of known
    names (``metrics["val"].names``), and a name below another level (``val/<ranker>/<name>``), are not checked."""
    metrics = getattr(task, "metrics", None)
    names = getattr(metrics["val"], "names", None) if isinstance(metrics, torch.nn.ModuleDict) and "val" in metrics else None
    if names is None:
        return
    logged = ["val/loss", *(f"val/{name}" for name in names)]
    for callback in trainer.callbacks:
        monitor = getattr(callback, "monitor", None)
        if isinstance(monitor, str) and monitor.startswith("val/") and monitor.count("/") == 1 and monitor not in logged:
            raise ValueError(
                f"--trainer.callbacks: {type(callback).__name__} monitors {monitor}, which the validation never logs; "
                f"it logs {', '.join(logged)} (the cut-offs of --model.evaluation.ks {metrics['val'].ks}): monitor one "
                "of them, or add the cut-off to --model.evaluation.ks"
            )


def duration_seconds(value: object) -> float | None:
    """A Trainer's ``max_time`` in seconds, read as Lightning's `Timer` reads it (``DD:HH:MM:SS``, a mapping of
    `timedelta`'s arguments, a `timedelta`); None when unset or not such a value (the Timer refuses it)."""
    found = re.fullmatch(r"(\d+):(\d\d):(\d\d):(\d\d)", value.strip()) if isinstance(value, str) else None
    if found is not None:
        value = timedelta(**dict(zip(("days", "hours", "minutes", "seconds"), map(int, found.groups()), strict=True)))
    elif isinstance(value, dict):
        try:
            value = timedelta(**value)
        except TypeError:
            return None
    return value.total_seconds() if isinstance(value, timedelta) else None


def refuse_endless_schedule(trainer: Namespace, model: Namespace) -> None:
    """Refuse a Trainer of no planned end (``max_epochs -1``, or none with ``max_time``, and no ``max_steps``: Lightning
    trains until stopped) for a task whose learning-rate schedule decays over the planned steps (a cosine or linear
    `sessrec.tasks.settings.Schedule` without a time budget, ``seconds``), in one line saying why."""
    init = model.get("init_args")
    schedule = init.get("schedule") if isinstance(init, Namespace) else None
    epochs, steps = trainer.get("max_epochs"), trainer.get("max_steps")
    endless = steps in (None, -1) and (epochs == -1 or (epochs is None and trainer.get("max_time") is not None))
    if not endless or schedule is None or schedule.get("decay") == "constant" or schedule.get("seconds") is not None:
        return
    given = "--trainer.max_epochs -1" if epochs == -1 else "--trainer.max_time without --trainer.max_epochs"
    raise ValueError(f"{given} and no --trainer.max_steps: training has no planned end, and the {schedule.decay} "
                     "learning-rate schedule decays over the planned steps; set --trainer.max_steps or a "
                     "--trainer.max_epochs, a time budget --model.schedule.seconds, or --model.schedule.decay constant")
