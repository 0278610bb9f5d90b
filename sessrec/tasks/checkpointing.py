"""What every training task shares: the fitted data it trains with, checkpoints that resume ``fit``.

A checkpoint (``.ckpt``, Lightning's) exists to resume ``sessrec fit``: the task's config, the
weights, the optimizer and loop state, the random state and the data module's state. The trained
model leaves training as an artifact (`sessrec.artifacts`): `NextItemTask.recommender` and
`DLRMTask.ranker` build it, and ``sessrec fit`` writes it as ``runs/<name>/model``.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch

from sessrec.artifacts.model_directory import VERSION, check_weights
from sessrec.data.side import SideFeatures
from sessrec.data.vocab import ItemVocab
from sessrec.datasets.clickout_rows import RankingVocab
from sessrec.features.side_transform import SideFeatureTransform
from sessrec.saved.checkpoint import read_checkpoint
from sessrec.saved.registry import class_path, construct, resolve, split_config
from sessrec.tasks.settings import Evaluation, Optimization


def full_precision(task: pl.LightningModule) -> torch.autocast:
    """Autocast off on the task's device: under a mixed-precision Trainer (``--trainer.precision bf16-mixed``
    or ``16-mixed``) training steps run in half precision, but validation, test and prediction score in
    float32, as a loaded model directory does. bfloat16 scores over a catalogue tie by the hundreds (8 bits of
    mantissa: 5,000 items take about 1,450 distinct values), and a tie with the target counts against it, so
    half-precision scores would lower the metrics that choose the checkpoint and change the lists."""
    return torch.autocast(device_type=task.device.type, enabled=False)


class Pretrained:
    """Mixin of the training tasks: the data module's fitted data, checkpoints that resume ``fit``, and
    the Lightning loops over the task's one ``_step(batch, stage)`` and ``_log_metrics(stage)``.

    The fitted data a model needs to read raw input (``vocab``, ``side_transform``) is taken from
    the data module at setup.
    """

    vocab: ItemVocab | RankingVocab | None = None
    side_transform: SideFeatureTransform | None = None
    side_config: SideFeatures | None = None

    def attach_data(self: pl.LightningModule, datamodule: Any) -> None:
        """Keep the data module's fitted vocabulary and side-feature transforms with the model."""
        self.vocab = getattr(datamodule, "vocab", None)
        self.side_transform = getattr(datamodule, "side", None)
        self.side_config = getattr(datamodule, "side_features", None) if self.side_transform is not None else None

    # the parts are read from the hyper-parameters, so what a checkpoint saves is what the task uses
    @property
    def optimization(self: pl.LightningModule) -> Optimization:
        """The dense optimizer's settings (`Optimization`: AdamW's)."""
        return Optimization.of(self.hparams.optimization)

    @property
    def evaluation(self: pl.LightningModule) -> Evaluation:
        """Metric cut-offs, recommendations per session, exclusion of seen items (`Evaluation`; a DLRM reads ``ks``)."""
        return Evaluation.of(self.hparams.evaluation)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self._step(batch, "train")

    def validation_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        with full_precision(self):
            return self._step(batch, "val")

    def test_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        with full_precision(self):
            return self._step(batch, "test")

    def on_validation_epoch_end(self) -> None:
        self._log_metrics("val")

    def on_test_epoch_end(self) -> None:
        self._log_metrics("test")

    def on_train_epoch_start(self: pl.LightningModule) -> None:
        # the loaders shuffle by the trainer's epoch, so a resumed run draws the orders the uninterrupted one drew
        loader = self.trainer.train_dataloader
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(self.current_epoch)

    def on_save_checkpoint(self: pl.LightningModule, checkpoint: dict[str, Any]) -> None:
        # the random state too (dropout draws from it): a resumed run continues the very same draws
        rng = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        checkpoint["sessrec"] = {"task": class_path(self), "format_version": VERSION, "rng": rng}
        trainer = self._trainer  # None for a checkpoint built by hand, outside a fit
        if trainer is None or not trainer.training:
            return
        fit_loop = trainer.fit_loop
        epochs = fit_loop.epoch_progress.current
        if epochs.processed == epochs.started and not fit_loop.epoch_loop._num_ready_batches_reached():
            # saved at the end of an epoch cut short (--trainer.max_steps, max_time, a stop): Lightning has counted it
            # processed, and a resume would start the next epoch (or stop at max_epochs), skipping the rest of this one;
            # saved as the mid-epoch checkpoint it is, the resume trains on from the loader's position in this epoch
            progress = checkpoint["loops"]["fit_loop"]["epoch_progress"]
            for counts in (progress["total"], progress["current"]):
                counts["processed"] -= 1

    def on_load_checkpoint(self: pl.LightningModule, checkpoint: dict[str, Any]) -> None:
        check_weights(self, checkpoint["state_dict"], "the checkpoint")
        rng = checkpoint.get("sessrec", {}).get("rng", {})
        if "torch" in rng:
            torch.set_rng_state(rng["torch"])
        if "cuda" in rng and torch.cuda.is_available() and len(rng["cuda"]) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(rng["cuda"])


def with_more_items(task: pl.LightningModule, old_to_new: np.ndarray, num_items: int) -> pl.LightningModule:
    """A copy of a session-model task over a grown catalogue of `num_items` ids (warm start).

    Every tensor of the state with one row per item id (the item table, the output bias, item
    side vectors) keeps its learned rows at their new ids
    (`old_to_new`, from `ItemVocab.grow`); the rows of new items keep their fresh
    initialisation. Every other tensor is copied as it is.
    """
    old_items = int(task.hparams.num_items)
    if len(old_to_new) != old_items:
        raise ValueError(f"old_to_new maps {len(old_to_new)} ids, the model has {old_items}")
    grown = build({"class_path": class_path(task), "init_args": {**plain_hparams(task), "num_items": num_items}},
                  "the grown model")
    index = torch.from_numpy(np.asarray(old_to_new, dtype=np.int64))
    state = grown.state_dict()
    for name, old in task.state_dict().items():
        new = state[name]
        if old.shape == new.shape:
            state[name] = old.clone()
        elif old.dim() >= 1 and old.shape[0] == old_items and new.shape[0] == num_items and old.shape[1:] == new.shape[1:]:
            state[name] = new.clone().index_copy_(0, index, old)
        else:
            raise ValueError(f"cannot grow {name}: {tuple(old.shape)} -> {tuple(new.shape)} is not one row per item id")
    grown.load_state_dict(state)
    return grown


def plain_hparams(task: pl.LightningModule) -> dict[str, Any]:
    """The constructor arguments of `task` (without LightningCLI's private entries)."""
    return {k: v for k, v in dict(task.hparams).items() if not str(k).startswith("_")}


def build(
    task_config: Any, source: str, key: str = "task", args_key: str | None = None, expected: type = Pretrained,
) -> pl.LightningModule:
    """The `expected` task that ``{"class_path", "init_args"}`` describes, built from registered classes only.

    The whole config resolves (`sessrec.saved.registry`) before anything is constructed; anything
    else is refused with one line naming `source` and the key path: `key` is the config's path in
    the file, `args_key` that of its arguments (``<key>.init_args`` unless given).
    """
    path, init_args = split_config(task_config, source, key)
    cls = resolve(path, expected, source, key)
    args_key = args_key or f"{key}.init_args"
    return construct(cls, init_args or {}, source, args_key)


def best_of_run(task: pl.LightningModule, checkpoint: str | os.PathLike, datamodule: Any) -> pl.LightningModule:
    """A copy of the task of a run with the weights of its `checkpoint` (the best one kept) and the
    fitted data of its `datamodule`, in eval mode: what leaves training as an artifact."""
    trained = build({"class_path": class_path(task), "init_args": plain_hparams(task)}, str(checkpoint), "hyper_parameters",
                    expected=type(task))
    state = read_checkpoint(checkpoint)["state_dict"]
    check_weights(trained, state, str(checkpoint))
    trained.load_state_dict(state)
    trained.attach_data(datamodule)
    return trained.eval()
