"""The Lightning commands: ``sessrec fit|validate|test|predict`` on a task recipe (LightningCLI).

LightningCLI over a task (`NextItemTask` unless the recipe names
another, e.g. ``class_path: sessrec.tasks.BaselineTask``) and a data module (`SessionDataModule`
unless the recipe names another, e.g. ``class_path: sessrec.tasks.ClickoutDataModule`` with
``sessrec.tasks.DLRMTask``).

    sessrec fit     --config recipes/quickstart.yaml
    sessrec test    --config recipes/xlnet_mlm_diginetica.yaml --model_dir runs/xlnet_mlm_diginetica/model
    sessrec predict --config recipes/xlnet_mlm_diginetica.yaml --model_dir runs/xlnet_mlm_diginetica/model \\
                    --data.predict_path sessions.parquet [--scoring.output recs.parquet]

A pipeline recipe (one top-level ``pipeline:`` block, `sessrec.pipeline_training.PipelineRecipe`) runs the
four-stage pipeline instead of a Lightning task:

    sessrec fit       --config recipes/pipeline_rsc15.yaml      # ranker on the validation sessions
    sessrec test      --config recipes/pipeline_rsc15.yaml      # end-to-end test metrics
    sessrec recommend --config recipes/pipeline_rsc15.yaml --input_path sessions.parquet --output recs.parquet

Data-derived values (catalogue size, sequence length, virtual items, side-feature sizes) are
linked from the data module into the model, never typed twice.

``sessrec fit`` writes the model directory of its best checkpoint, ``runs/<name>/model``
(`sessrec.artifacts`: a `SessionRecommender` or a `ClickRanker`); a session model's records the
configuration of the `SessionDataModule` it was trained on (its ``data`` section), from which a
pipeline recipe without a data block reads its sessions. ``validate``, ``test`` and
``predict`` of a trained model take that directory (``--model_dir``) with the data recipe
(``--config``; ``validate`` and ``test`` refuse one that names no ``data.source``, whose default is
generated synthetic sessions): the data module reads the directory's vocabulary and side-feature transforms, and
the model is the directory's, by one rule (`sessrec.tasks.restore`), where "given" means
set by a recipe or on the command line:

- the evaluation settings (``--model.evaluation.top_k|ks|exclude_seen``; a DLRM's
  ``--model.evaluation.ks`` and ``--model.compile``) are the given ones, else the model's (its
  saved inference settings: top_k, exclude_seen);
- the training settings (loss, ``--model.optimization.*``, ``--model.schedule.*``, seeds) are not read;
- every other model setting fixes the network: a given value that differs from the model's is
  refused with one line naming the key and both values, as is a ``--data.max_length`` other than
  the model's. The recipe a model was trained with always passes.

``validate`` and ``test`` refuse a ``limit_val_batches`` / ``limit_test_batches`` of 0 (no metric), ``predict`` any
``limit_predict_batches`` (an output of part of the file's sessions), and a click ranker's ``validate`` and
``test`` a split holding a click-out no later than the last it trained on (its ``train_end``). A click ranker
has no ``predict`` (``test`` ranks each click-out's hotels): refused before the log is read.

LightningCLI's ``--optimizer`` and ``--lr_scheduler`` are not options: the task's optimiser is
``--model.optimization`` (AdamW) and ``--model.schedule``, which they would replace.

A flag that only another command reads (``--scoring.*`` and ``--data.predict_path``, ``predict``'s;
``--last_checkpoint.*``, ``fit``'s) is refused in one line; a recipe may hold them for that command.

A checkpoint resumes ``fit`` (``--ckpt_path``) and nothing else. ``fit`` refuses a Trainer that would
take no training step (``max_epochs``, ``max_steps`` or ``limit_train_batches`` 0, a ``max_time`` of
zero), which would save untrained weights as the model directory, and one of no planned end
(``max_epochs -1``, or ``max_time`` without ``max_epochs``, and no ``max_steps``) for a schedule that
decays over the planned steps (cosine or linear without ``schedule.seconds``), and an integer below 1 for
``accumulate_grad_batches``, ``check_val_every_n_epoch`` or ``val_check_interval``
(`sessrec.cli.trainer_settings`).

``fit --ckpt_path`` resumes with the checkpoint's model settings (LightningCLI's own restore): a model
setting given by the recipe or a flag that differs from the checkpoint's, or a ``--data.max_length``
other than its, is refused in one line naming it, and so is data of another vocabulary, before
anything is written. A checkpoint of ``<save_dir>/<name>/version_N/checkpoints/`` (``last.ckpt`` of a
killed run) continues in ``version_N`` (its logger, checkpoints and ``metrics.csv``), not in a new
version folder (`sessrec.cli.resume`).

``fit`` writes its run folder and its checkpoint folders alone: from before it trains until its model directory is
written it holds a lock on each (`sessrec.saved.atomic.lock_folder`), and a second fit into one of them (two runs of
one name and version, one ``default_root_dir``, one checkpoint ``dirpath``) is refused in one line naming the folder,
before it writes anything.

After ``fit``, the metrics printed are those of the checkpoint kept (``best.ckpt``: the validation
that chose it, with its epoch and step), which need not be the last epoch's.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
from argparse import ArgumentError
from collections.abc import Iterator
from importlib import import_module
from pathlib import Path
from typing import Any, Literal

import pytorch_lightning as pl
from jsonargparse import Namespace
from pytorch_lightning.callbacks import ModelCheckpoint, ProgressBar
from pytorch_lightning.cli import LightningArgumentParser, LightningCLI
from pytorch_lightning.loggers import WandbLogger
from pytorch_lightning.utilities.exceptions import SIGTERMException

from sessrec.artifacts import ClickRanker, SessionRecommender, load_artifact
from sessrec.artifacts.model_directory import FEATURES, VOCAB, read_model_directory
from sessrec.cli.errors import RecipeError, one_line, refuse_null_below_class, setting_below
from sessrec.cli.parsers import check_sources, checkpoint_refused
from sessrec.cli.resume import refuse_finished_resume, restore_metrics, resumed_run
from sessrec.cli.trainer_settings import (
    refuse_absent_gpu,
    refuse_counts_below_one,
    refuse_endless_schedule,
    refuse_flags_of_other_commands,
    refuse_half_weights,
    refuse_no_checkpointing,
    refuse_no_training,
    refuse_overfit_batches,
    refuse_partial_scoring,
    refuse_trainer_settings,
    refuse_unlogged_monitor,
)
from sessrec.saved.atomic import lock_folder
from sessrec.saved.checkpoint import checkpoint_summary, read_checkpoint
from sessrec.saved.registry import config_of, parameters
from sessrec.scoring import Engine, check_counts, predict_file
from sessrec.tasks import (
    ClickoutDataModule,
    DLRMTask,
    LastCheckpoint,
    NextItemTask,
    SessionDataModule,
    TopKWriter,
)
from sessrec.tasks.callbacks import MetricHistory, PredictProgress
from sessrec.tasks.checkpointing import best_of_run, plain_hparams
from sessrec.tasks.restore import merge_with_model, refuse_changed, task_class

PARTITION_BATCHES = 8  # predict --engine dask: batches per partition by default
EVALUATING = ("validate", "test", "predict")  # subcommands that evaluate or run a trained model
# the task settings linked from the data module: the model directory's vocabulary and transforms give them
FROM_DATA = ("num_items", "num_virtual", "side_features", "max_length", "cardinalities", "num_dense")


def refuse_top_k_below_one(model: object) -> None:
    """Refuse ``--model.evaluation.top_k`` below 1 (or not an integer) in one line naming the option, before
    the task checks it again and names its argument (``evaluation top_k``)."""
    top_k = model.get("init_args.evaluation.top_k") if isinstance(model, Namespace) else None
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"--model.evaluation.top_k {top_k}: the number of recommendations per session must be 1 or more")


class SessrecCLI(LightningCLI):
    _args: list[str] | None = None  # the arguments parsed (None when given as a dict or Namespace)
    _history: MetricHistory | None = None  # the metrics of every validation of `fit`
    _resumed: tuple[Path, int] | None = None  # the run folder a `fit --ckpt_path` continues, and its step
    _model_dir: Path | None = None  # the model directory evaluated (its current version)
    _artifact: SessionRecommender | ClickRanker | None = None  # what it holds
    _settings: dict | None = None  # the evaluation settings it is evaluated with
    _engine: Engine = Engine()  # where predict scores (--engine, --scheduler, --workers)
    _fresh: bool = False  # fit: the run folder is this run's own (it did not exist), removed when the fit fails early

    def parse_arguments(self, parser: LightningArgumentParser, args: object) -> None:
        """Refuse an unknown key of the model, data or trainer in one line naming the closest valid one
        (`check_recipe_keys`), then parse (LightningCLI's); a value the parser refuses is its message on
        one line. ``predict``'s output is checked here, before the model or any data is read
        (`TopKWriter.check`)."""
        if args is None or isinstance(args, (list, tuple)):
            self._args = list(sys.argv[1:] if args is None else args)
            check_recipe_keys(self._args)
        try:
            super().parse_arguments(parser, args)
        except ArgumentError as err:  # jsonargparse's tree of every type it tried: one line of it
            raise RecipeError(one_line(err) + _top_level_hint(str(err))) from err
        cfg = self.config.get("predict") if self.config.get("subcommand") == "predict" else None
        if cfg is not None and cfg.data.init_args.get("predict_path") is not None:
            TopKWriter(**cfg.scoring.as_dict()).check(cfg.data.init_args.predict_path,
                                                      [] if cfg.model_dir is None else [cfg.model_dir])

    def _parse_ckpt_path(self) -> None:
        """LightningCLI's hook that puts a checkpoint's hyper-parameters over the model's config: ``fit``
        resumes with it. ``validate``, ``test`` and ``predict`` refuse a checkpoint in one line naming
        the model directory they take, and with ``--model_dir`` put the settings of the directory's
        model over the config by the rule of the module docstring (`merge_with_model`)."""
        sub = self.config.get("subcommand")
        if sub not in EVALUATING:
            if sub == "fit" and self.config[sub].get("ckpt_path") and Path(self.config[sub].ckpt_path).is_file():
                refuse_other_settings(self._given(sub), self.config[sub].ckpt_path)
            super()._parse_ckpt_path()
            return
        cfg = self.config[sub]
        if cfg.get("ckpt_path"):
            raise ValueError(checkpoint_refused(sub))
        if not cfg.get("model_dir"):
            return
        folder, recorded = read_model_directory(cfg.model_dir)  # its format, version and parts checked before anything is built
        artifact = load_artifact(folder)
        task = NextItemTask if isinstance(artifact, SessionRecommender) else DLRMTask
        named = str(cfg.model.class_path)
        if task_class(named) is not task:
            raise ValueError(
                f"--model.class_path {named} cannot evaluate {folder}: it holds a {type(artifact).__name__}, which "
                f"{task.__name__} evaluates; give a data recipe without a model block, or the recipe it was trained with"
            )
        base = NextItemTask.from_recommender(artifact) if task is NextItemTask else DLRMTask.from_ranker(artifact)
        given = self._given(sub)
        refuse_other_vocabulary(given.get("data"), recorded.get("data"), folder)
        refuse_other_inputs(given.get("data"), recorded.get("data"), folder)
        model = given.get("model")
        init_args = model.get("init_args") if model is not None else None
        merged = merge_with_model(task, plain_hparams(base), init_args.as_dict() if init_args is not None else {},
                                  str(folder), from_data=FROM_DATA)
        update = {sub: {"model": {"class_path": named, "init_args": merged}}}
        self.config = self.parser.parse_object(update, self.config)
        self._model_dir, self._artifact = folder, artifact
        self._settings = {k: merged[k] for k in task.EVALUATION_SETTINGS}

    def _given(self, sub: str) -> Namespace:
        """The settings of `sub` that the recipes and flags give, without the defaults; not validated, as
        without the defaults a recipe with no ``model`` key lacks the required model (the parse with them
        validated everything)."""
        if self._args is None:
            return self.config[sub]
        return self.parser.parse_args(self._args, defaults=False, _skip_validation=True)[sub]

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # a recipe's `model:` block without class_path configures NextItemTask, the default task
        parser.set_defaults({"model": {"class_path": "sessrec.tasks.NextItemTask"}})
        # likewise a `data:` block without class_path configures SessionDataModule
        parser.set_defaults({"data": {"class_path": "sessrec.tasks.SessionDataModule"}})
        # links whose source the chosen data module lacks, or whose target the task lacks, are ignored
        parser.link_arguments("data.num_items", "model.init_args.num_items", apply_on="instantiate")
        # tasks without these arguments (BaselineTask has no side_features) ignore the links
        parser.link_arguments("data.num_virtual", "model.init_args.num_virtual", apply_on="instantiate")
        parser.link_arguments("data.side_info", "model.init_args.side_features", apply_on="instantiate")
        # tasks without a max_length argument (BaselineTask) ignore this link
        parser.link_arguments("data.init_args.max_length", "model.init_args.max_length", apply_on="parse")
        parser.add_lightning_class_args(TopKWriter, "scoring")
        parser.add_argument("--model_dir", type=str | None, default=None,
                            help="validate, test, predict: the model directory of a trained model (runs/<name>/model)")
        parser.add_lightning_class_args(LastCheckpoint, "last_checkpoint")
        parser.add_argument("--engine", type=Literal["local", "dask"], default="local",
                            help="predict: local (the Trainer, in this process) or dask (partitions of the input on the "
                                 "workers of a Dask cluster, sessrec.scoring)")
        parser.add_argument("--scheduler", type=str | None, default=None,
                            help="predict --engine dask: the address of a running Dask scheduler (else a local cluster)")
        parser.add_argument("--workers", type=int | None, default=None,
                            help="predict --engine dask without --scheduler: worker processes of the local cluster (2)")
        parser.add_argument("--partition_batches", type=int | None, default=None,
                            help="predict --engine dask: batches per partition, the unit of work and of resumption (8)")

    def before_instantiate_classes(self) -> None:
        sub = self.subcommand
        if sub is None:
            return
        cfg = self.config[sub]
        module, _, name = cfg.data.class_path.rpartition(".")
        if hasattr(getattr(import_module(module), name), "cardinalities"):
            if sub == "predict":  # before the log is read: the ranking data has no predict loader
                raise ValueError(
                    f"sessrec predict writes a session model's next items; a DLRMTask on click-outs ({cfg.data.class_path}) "
                    "has none: sessrec test ranks each click-out's hotels, sessrec export writes the scorer"
                )
            # ranking data (ClickoutDataModule) -> DLRMTask. Added only for such a data module: for one
            # without the attribute jsonargparse would format it in a debug message, and a
            # LightningDataModule's str() builds (and here fails on) every loader
            parser = self._subcommand_parsers[sub]
            parser.link_arguments("data.cardinalities", "model.init_args.cardinalities", apply_on="instantiate")
            parser.link_arguments("data.num_dense", "model.init_args.num_dense", apply_on="instantiate")
        if self._args is not None:
            refuse_flags_of_other_commands(sub, self._args)
        self._engine = Engine(cfg.engine, cfg.scheduler, cfg.workers)
        if sub != "predict" and self._engine.engine != "local":
            raise ValueError(f"--engine {cfg.engine} is for sessrec predict (and recommend); {sub} runs on the Trainer")
        if cfg.workers is not None and self._engine.engine == "local":
            raise ValueError(f"--workers {cfg.workers} needs --engine dask for sessrec {sub} (the local engine scores on "
                             "the Trainer)")
        if cfg.partition_batches is not None and self._engine.engine == "local":
            raise ValueError("--partition_batches needs --engine dask (the local engine scores on the Trainer)")
        if cfg.partition_batches is not None:
            check_counts({"partition_batches": cfg.partition_batches}, {"partition_batches": "--partition_batches"})
        if self._engine.engine == "dask":
            refuse_trainer_settings(cfg.trainer)
        refuse_absent_gpu(cfg.trainer)
        refuse_half_weights(cfg.trainer)
        if sub in EVALUATING:
            refuse_partial_scoring(sub, cfg.trainer)
        if sub == "fit":
            refuse_no_training(cfg.trainer)
            refuse_no_checkpointing(cfg.trainer)
            refuse_counts_below_one(cfg.trainer)
            refuse_overfit_batches(cfg.trainer)
            refuse_endless_schedule(cfg.trainer, cfg.model)
            if cfg.get("model_dir"):
                raise ValueError("sessrec fit trains the recipe's model: --model_dir is for validate, test and predict "
                                 "(--ckpt_path resumes a fit)")
            refuse_finished_resume(cfg)
            self._resumed = resumed_run(cfg)
            if cfg.trainer.get("logger") is False and cfg.trainer.get("default_root_dir") is None:
                self.save_config_callback = None  # no run folder: no config.yaml in the working directory
        refuse_top_k_below_one(cfg.get("model"))
        if sub not in ("validate", "test", "predict"):
            return
        if sub == "predict" and cfg.get("return_predictions") is None:
            cfg["return_predictions"] = False  # stream to parquet, keep nothing in memory
        # evaluation and scoring log nothing to a new run folder (a version_N beside the trained run's
        # would make "the latest run" point at a run without a model); the metrics are printed
        cfg.trainer.logger = False
        self.save_config_callback = None  # nor a config.yaml in the working directory
        model_dir = cfg.get("model_dir")
        if not model_dir and not cfg.model.class_path.endswith(UNTRAINED_TASKS):
            raise ValueError(
                f"{sub} needs --model_dir: the model {cfg.model.class_path.rpartition('.')[2]} is trained, and "
                "without its model directory it would score random weights (e.g. --model_dir runs/<name>/model)"
            )
        if not model_dir:
            return
        folder = self._model_dir
        data = cfg.data.init_args
        if sub != "predict" and "source" in data and data.source is None:  # SessionDataModule's default: generated sessions
            raise ValueError(
                f"{sub} --model_dir {model_dir}: no recipe or flag names the sessions to evaluate on (data.source), and "
                "the default would be generated synthetic sessions: give the data recipe the model was trained with "
                "(--config recipes/data/<name>.yaml) or --data.source"
            )
        if "vocab_path" in data:
            data.vocab_path = str(folder / VOCAB)  # the ids the model was trained with
        if "features_path" in data:
            data.features_path = str(folder / FEATURES) if (folder / FEATURES).exists() else None

    def after_instantiate_classes(self) -> None:
        """With ``--model_dir``: the task that evaluates the directory's model with the settings chosen
        (`_parse_ckpt_path`), in place of the one built from the config."""
        if self._model_dir is None:
            return
        artifact, folder = self._artifact, self._model_dir
        if isinstance(artifact, SessionRecommender):
            length = getattr(self.datamodule, "max_length", None)
            if length is not None and int(length) != artifact.inference.max_length:
                raise ValueError(
                    f"--data.max_length {length} differs from the model's {artifact.inference.max_length} ({folder}): "
                    f"evaluate it with the session length it was trained with (--data.max_length {artifact.inference.max_length})"
                )
            self.model = NextItemTask.from_recommender(artifact, **self._settings)
        else:
            split = {"validate": "valid", "test": "test"}.get(self.subcommand)
            if split is not None and artifact.train_end is not None and isinstance(self.datamodule, ClickoutDataModule):
                self.datamodule.check_unseen(split, artifact.train_end, str(folder))
            self.model = DLRMTask.from_ranker(artifact, **self._settings)

    def before_fit(self) -> None:
        """Record the metrics of every validation (`MetricHistory`), and on a resume put the earlier
        rows of the run's ``metrics.csv`` back (the CSV logger starts the file over). A checkpoint's data
        state (its vocabulary: `SessionDataModule.load_state_dict`) is taken here, before anything is
        written, so that one of other data is refused with no run folder left; so is the position of a run stopped
        mid-epoch, which the training loader built here takes (and refuses where it counts in other batches)
        before the Trainer rewrites the run's config.yaml."""
        refuse_unlogged_monitor(self.trainer, self.model)
        for logger in self.trainer.loggers:
            if isinstance(logger, WandbLogger) and logger._wandb_init.get("anonymous", False) is None:
                # Lightning's logger passes anonymous=None, a setting of no effect that wandb warns about whatever its
                # value, before it reads WANDB_SILENT (`quiet_third_parties`): leave it unset
                del logger._wandb_init["anonymous"]
        ckpt = self.config["fit"].get("ckpt_path")
        checkpoint = read_checkpoint(ckpt) if ckpt and Path(ckpt).is_file() else {}
        state = checkpoint.get(type(self.datamodule).__qualname__)
        if state is not None and callable(getattr(self.datamodule, "load_state_dict", None)):
            self.datamodule.load_state_dict(state)
        loaders = checkpoint.get("loops", {}).get("fit_loop", {}).get("state_dict", {}).get("combined_loader")
        if loaders and callable(getattr(self.datamodule, "train_dataloader", None)):
            self.datamodule.trainer = self.trainer  # its ranks, as the fit will build the loader
            loader = self.datamodule.train_dataloader()
            if callable(getattr(loader, "load_state_dict", None)):
                loader.load_state_dict(loaders[0])
        self._history = MetricHistory()
        self.trainer.callbacks.append(self._history)
        if self._resumed is not None:
            restore_metrics(self.trainer.logger, *self._resumed)

    def _run_subcommand(self, subcommand: str) -> None:
        """LightningCLI's; ``fit`` holds the folders it writes (`writing_alone`) from before it trains until its model
        directory is written (`after_fit`)."""
        if subcommand != "fit":
            super()._run_subcommand(subcommand)
            return
        trainer = self.trainer
        folder = Path(trainer.log_dir) if trainer.logger is not None and trainer.log_dir else None
        self._fresh = folder is not None and not folder.exists() and self._resumed is None
        folders = [Path(trainer.log_dir or trainer.default_root_dir)]
        folders += [Path(cb.dirpath) for cb in trainer.checkpoint_callbacks if cb.dirpath is not None]
        with writing_alone(folders if trainer.is_global_zero else []):
            super()._run_subcommand(subcommand)

    def fit(self, model: pl.LightningModule, datamodule: pl.LightningDataModule | None = None, **kwargs: object) -> None:
        """``sessrec fit``: the Trainer's fit. One that fails (an error, Ctrl-C) before any checkpoint was saved removes
        the run folder it created (its config.yaml, hparams.yaml and metrics.csv describe no model), once its wandb
        run is finished (an open one writes its console log, the error line included, back into the folder): nothing
        half-written is left behind. A resumed run's folder, or one that existed before, is left as it is. A fit stopped
        by SIGTERM (Lightning's stop: an exit of status 0) exits with an error naming the ``last.ckpt`` that resumes it."""
        trainer = self.trainer
        folder = Path(trainer.log_dir) if trainer.logger is not None and trainer.log_dir else None
        try:
            trainer.fit(model, datamodule=datamodule, **kwargs)
        except BaseException as err:
            saved = any(cb.best_model_path or cb.last_model_path for cb in trainer.checkpoint_callbacks)
            if self._fresh and trainer.is_global_zero and not saved and not any(folder.rglob("*.ckpt")):
                for logger in trainer.loggers:
                    if isinstance(logger, WandbLogger) and logger._experiment is not None:
                        logger.experiment.finish(exit_code=1)
                shutil.rmtree(folder, ignore_errors=True)
            if isinstance(err, SIGTERMException):
                last = next((cb.best_model_path for cb in trainer.callbacks if isinstance(cb, LastCheckpoint)
                             and cb.best_model_path), None)
                resume = f"; sessrec fit --ckpt_path {last} resumes it" if last else ""
                raise SystemExit(f"sessrec fit: error: stopped by SIGTERM at step {trainer.global_step} (epochs done: "
                                 f"{trainer.current_epoch}), before the end of its training: no model directory was "
                                 f"written{resume}") from None
            raise

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[pl.Callback]) -> pl.Trainer:
        """The Trainer; for validate, test and predict with ``enable_checkpointing: false`` without the recipe's and
        sessrec's checkpoint callbacks, which write nothing there and with which Lightning refuses the setting."""
        if self.subcommand in ("validate", "test", "predict") and config.get("enable_checkpointing") is False:
            config["callbacks"] = [c for c in config.get("callbacks") or [] if not isinstance(c, ModelCheckpoint)]
            callbacks = [c for c in callbacks if not isinstance(c, ModelCheckpoint)]
        return super()._instantiate_trainer(config, callbacks)

    def before_predict(self) -> None:
        """A line of progress every 30 s (`PredictProgress`) in place of the progress bar, which cannot
        know the length of a stream of sessions."""
        self.trainer.callbacks = [cb for cb in self.trainer.callbacks if not isinstance(cb, ProgressBar)]
        self.trainer.callbacks.append(PredictProgress())

    def predict(self, model: pl.LightningModule, datamodule: pl.LightningDataModule | None = None,
                **kwargs: object) -> None:
        """``sessrec predict``: the Trainer's prediction loop with ``--engine local``; with ``--engine dask``,
        `sessrec.scoring.predict_file` on the model directory, the data module's ``predict_path``,
        ``predict_schema`` and ``eval_batch_size``, the evaluation settings chosen (top_k, exclude_seen)
        and the `TopKWriter`'s output: the same file, partition by partition on the workers."""
        engine = self._engine
        if engine.engine == "local":
            self.trainer.predict(model, datamodule=datamodule, **kwargs)
            return
        if not isinstance(self._artifact, SessionRecommender) or not isinstance(model, NextItemTask):
            held = f"{self._model_dir} holds a {type(self._artifact).__name__}"
            raise ValueError(  # noqa: TRY004 - a setting, not a type
                "--engine dask scores a session model's directory (--model_dir runs/<name>/model); "
                + ("no --model_dir" if self._model_dir is None else held))
        if not isinstance(datamodule, SessionDataModule) or datamodule.predict_path is None:
            raise ValueError("set --data.predict_path to the sessions file to score")
        writer = next(cb for cb in self.trainer.callbacks if isinstance(cb, TopKWriter))
        path, evaluation = datamodule.predict_path, model.evaluation
        predict_file(self._model_dir, path, writer.target(path), k=evaluation.top_k,
                     exclude_seen=evaluation.exclude_seen, batch_size=datamodule.eval_batch_size,
                     schema=datamodule.predict_schema, overwrite=writer.overwrite, engine=engine.engine,
                     scheduler=engine.scheduler, workers=engine.workers,
                     partition_batches=self.config["predict"].partition_batches or PARTITION_BATCHES,
                     times=datamodule.times)

    def after_fit(self) -> None:
        """Print the metrics of the checkpoint kept (the best one, with its epoch) and write its model
        directory beside it; a session model's directory records the data module's configuration (its
        ``data`` section) and the time of its training split's last event (``train_end``)."""
        trainer, model = self.trainer, self.model
        if trainer.fast_dev_run or not trainer.is_global_zero:
            return
        saved = [cb.best_model_path for cb in trainer.checkpoint_callbacks if cb.best_model_path]
        best = next((path for path in saved if Path(path).name != "last.ckpt"), saved[0] if saved else "")
        print(f"sessrec fit: {self._kept_metrics(best)}")
        if not best or not isinstance(model, (NextItemTask, DLRMTask)):
            return
        trained = best_of_run(model, best, self.datamodule)
        artifact = trained.recommender() if isinstance(trained, NextItemTask) else trained.ranker()
        if isinstance(self.datamodule, SessionDataModule if isinstance(artifact, SessionRecommender) else ClickoutDataModule):
            # the data it was trained on: a pipeline recipe rebuilds a session model's sessions from it, and evaluating
            # commands hold their data settings to it (`refuse_other_vocabulary`, `refuse_other_inputs`)
            artifact.data = config_of(self.datamodule)
        if callable(getattr(self.datamodule, "train_end", None)):  # SessionDataModule, ClickoutDataModule
            artifact.train_end = self.datamodule.train_end()  # sessrec retrain never goes back before it
        directory = artifact.save_pretrained(Path(best).parent.parent / "model")
        print(f"sessrec fit: best checkpoint {best}; model directory {directory}")

    def _kept_metrics(self, best: str) -> str:
        """``metrics of <best> (epoch E, step S): ...``: the validation that chose the checkpoint kept;
        the last metrics when no checkpoint is kept."""
        if not best:
            last = _shown(self.trainer.callback_metrics)
            return f"final metrics (epoch {self.trainer.current_epoch - 1}, no checkpoint kept): {last}"
        summary = checkpoint_summary(best)
        epoch, step = summary.get("epoch"), summary.get("global_step")
        metrics = self._history.at_step.get(step) if self._history is not None else None
        if metrics is None:  # chosen before a resume, or saved without a validation (no monitor)
            scores = {cb.monitor: cb.best_model_score for cb in self.trainer.checkpoint_callbacks
                      if cb.best_model_path == best and cb.monitor and cb.best_model_score is not None}
            return f"metrics of {best} (epoch {epoch}, step {step}): {_shown(scores) or 'not recorded in this run'}"
        return f"metrics of {best} (epoch {epoch}, step {step}, the checkpoint kept): {_shown(metrics)}"


@contextlib.contextmanager
def writing_alone(folders: list[Path]) -> Iterator[None]:
    """Hold a lock on each of `folders` (a fit's run folder and checkpoint folders, `lock_folder`) for the block; one
    that another fit holds is refused in one line naming it. The folders it created are removed when left empty."""
    folders = list(dict.fromkeys(folder.absolute() for folder in folders))
    made = [p for p in dict.fromkeys(p for f in folders for p in (*reversed(f.parents), f)) if not p.exists()]
    held: dict[Path, int] = {}
    try:
        for folder in folders:
            held[folder] = lock_folder(folder, (
                f"{folder}: another sessrec fit is writing its checkpoints or logs here; wait for it to finish, or give "
                "this run another folder (the logger's name or version, --trainer.default_root_dir, the checkpoint "
                "callback's dirpath)"))
        yield
    finally:
        for fd in held.values():
            os.close(fd)
        for folder in reversed(made):  # innermost first: those locked here, and those made on the way to them
            if folder in held or folder not in folders:
                with contextlib.suppress(OSError):  # not empty, or removed already: kept, or nothing to do
                    folder.rmdir()


# data settings that decide the vocabulary a model is trained on: SessionDataModule's, ClickoutDataModule's
VOCAB_SETTINGS = ("min_item_count", "max_vocab_size", "min_count")


def refuse_other_vocabulary(given: Namespace | None, recorded: dict | None, folder: Path) -> None:
    """With ``--model_dir``: refuse a vocabulary setting (`VOCAB_SETTINGS`) given by the recipe or a flag that differs
    from the one the model was trained with (its directory's ``data`` section): the model's own vocabulary is read
    (``vocab.parquet``), so the setting would be ignored."""
    init = given.get("init_args") if given is not None else None
    held = (recorded or {}).get("init_args") or {}
    for key in VOCAB_SETTINGS:
        value = init.get(key, held.get(key)) if init is not None else held.get(key)
        if key in held and value != held[key]:
            raise ValueError(f"--data.{key} {value} differs from the model's {held[key]} ({folder}): the model reads the "
                             "vocabulary it was trained with (its vocab.parquet); evaluate it with that run's data settings")


def refuse_other_inputs(given: Namespace | None, recorded: dict | None, folder: Path) -> None:
    """With ``--model_dir`` of a click ranker: refuse data with session scores (a dense input) for a model trained
    without them, and data without them for one trained with them: its network would read an input it never learned."""
    held = ((recorded or {}).get("init_args") or {}).get("session_scores", False)
    init = given.get("init_args") if given is not None else None
    scores = init.get("session_scores") if init is not None else None
    if held is False or (scores is None) == (held is None):
        return
    raise ValueError(f"--data.session_scores {scores}: the model ({folder}) was trained without session scores; leave it out"
                     if held is None else f"the model ({folder}) was trained with session scores ({held}): give "
                     "--data.session_scores of the click-outs it evaluates, which it would read as absent on every row")


def refuse_other_settings(given: Namespace, ckpt: str) -> None:
    """For ``fit --ckpt_path``: refuse a model setting given by the recipe or the command line that differs from the
    checkpoint's (LightningCLI's restore builds the task from the checkpoint's: it would be ignored), and a
    ``--data.max_length`` other than the checkpoint's (`sessrec.tasks.restore.refuse_changed`)."""
    held = checkpoint_summary(ckpt)["hyper_parameters"]
    model, data = given.get("model") or Namespace(), given.get("data") or Namespace()
    length = (data.get("init_args") or Namespace()).get("max_length")
    if length is not None and held.get("max_length") not in (None, length):
        raise ValueError(f"--data.max_length {length} differs from the checkpoint's {held['max_length']} ({ckpt}): a "
                         "resumed fit reads sessions of the length its network was trained on")
    mine = {**(model.get("init_args") or Namespace()).as_dict(), "class_path": model.get("class_path")}
    refuse_changed(held, mine, ckpt, from_data=FROM_DATA)


def _shown(metrics: dict) -> str:
    """``name=value`` of the logged metrics (names with a ``/``), sorted, six decimals."""
    return " ".join(f"{k}={float(v):.6f}" for k, v in sorted(metrics.items()) if "/" in k)


UNTRAINED_TASKS = ("BaselineTask", "EnsembleTask")  # tasks with nothing to train: test and predict need no checkpoint


def cli(args: list[str] | None = None) -> SessrecCLI:
    """Run the CLI in-process and return it (trainer, model and data module for inspection)."""
    return SessrecCLI(
        pl.LightningModule,
        pl.LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        seed_everything_default=0,
        auto_configure_optimizers=False,  # the task's optimiser: --model.optimization and --model.schedule
        save_config_kwargs={"overwrite": True},
        parser_kwargs={"exit_on_error": False},  # a parse error raises: `sessrec.cli.main` says it in one line
        args=args,
    )


def _top_level_hint(message: str) -> str:
    """For jsonargparse's refusal of a top-level key (``Subcommand 'fit' does not accept option 'max_length'``, or a
    flag ``--max_length``), the
    block whose class takes it (``; did you mean data.max_length?``: `NextItemTask`, `SessionDataModule`, the
    Trainer); "" for another message."""
    found = re.search(r"does not accept option '(\w+)'|^unrecognized arguments: --(\w+)(?:[= ]|$)", message)
    if found is None:
        return ""
    key, tasks = found.group(1) or found.group(2), import_module("sessrec.tasks")
    blocks = (("data", tasks.SessionDataModule), ("model", tasks.NextItemTask), ("trainer", pl.Trainer))
    for block, owner in blocks:  # the data block first: the model's data settings are linked from it
        if key in parameters(owner)[0]:
            return f"; did you mean {block}.{key}?"
    for block, owner in blocks:
        inner = setting_below(owner, key)
        if inner is not None:
            return f"; did you mean {block}.{inner}.{key}?"
    return ""


def check_recipe_keys(args: list[str]) -> None:
    """Refuse a YAML syntax error of the ``--config`` files and the first key of them and of the flags that
    the task, the data module or the Trainer does not take (`sessrec.cli.parsers.check_sources`;
    `NextItemTask` and `SessionDataModule` where a block names no class), and a null that a dotted flag
    would lose (`refuse_null_below_class`)."""
    task, data = import_module("sessrec.tasks").NextItemTask, import_module("sessrec.tasks").SessionDataModule
    check_sources(args, roots={"model": task, "data": data, "trainer": pl.Trainer})
    refuse_null_below_class(args, ("model", "data"))
