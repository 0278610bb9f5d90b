"""Saved models without their recipe: Lightning checkpoints and model directories.

A task's hyper-parameters are its full constructor config as plain data (the encoder and the
objective as ``class_path``/``init_args``), so either form rebuilds the network alone:

- a **checkpoint** (``.ckpt``, Lightning's, for resuming): the config, the weights, the optimizer
  and loop state, and the data module's state (vocabulary, fitted feature transforms);
  `load_checkpoint` reads it with ``torch.load(weights_only=True)``.
- a **model directory** (`save_pretrained` / `from_pretrained`, for serving and export): the
  format of `sessrec.models.pretrained`, written through the network's own writer
  (``self.model.pretrained_parts``) with the task's section added (``"task": {"class_path",
  "init_args"}``, what rebuilds the trainable task) and the task's state dict as the weights (the
  network's tensors under ``model.``, an objective's under ``objective.``: the keys the network
  loader reads). `from_pretrained` reads a directory with a ``task`` section (any version) by it,
  and one written by a network alone (``SessionModel.save_pretrained``) by building the task
  that trains that network (`NextItemTask`, `DLRMTask`) from the network's sections.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytorch_lightning as pl
import torch
from torch import nn

from sessrec.data.side import SideFeatures
from sessrec.data.vocab import ItemVocab
from sessrec.datasets.clickout_rows import RankingVocab
from sessrec.features.side_transform import SideFeatureTransform
from sessrec.models.pretrained import (  # noqa: F401 - CONFIG ... READABLE_VERSIONS: the format's names, read here too
    CONFIG,
    FEATURES,
    FORMAT,
    READABLE_VERSIONS,
    VERSION,
    VOCAB,
    WEIGHTS,
    check_weights,
    load_side,
    load_weights,
    read_config,
    write_model_directory,
)
from sessrec.saved import versions
from sessrec.saved.checkpoint import DATA_STATE_KEYS, parquet_state, read_checkpoint
from sessrec.saved.directory import check_vocabulary
from sessrec.saved.registry import (  # noqa: F401 - config_of: sessrec.deploy.retrain reads it from here
    ConfigError,
    class_path,
    config_of,
    construct,
    resolve,
    split_config,
)

_TASK_OF_NETWORK: dict[type, type] = {}  # network class -> the task that trains it (`Pretrained.NETWORK`)


class Pretrained:
    """Mixin of the tasks: checkpoints that say which class they are, shape checks on load, model directories.

    The fitted data a model needs to read raw input (``vocab``, ``side_transform``) is taken from
    the data module at setup, from a checkpoint, or from a model directory.
    """

    NETWORK: ClassVar[type | None] = None  # the network a subclass trains: it reads that network's own directories
    vocab: ItemVocab | RankingVocab | None = None
    side_transform: SideFeatureTransform | None = None
    side_config: SideFeatures | None = None

    def attach_data(self: pl.LightningModule, datamodule: Any) -> None:
        """Keep the data module's fitted vocabulary and side-feature transforms with the model."""
        self.vocab = getattr(datamodule, "vocab", None)
        self.side_transform = getattr(datamodule, "side", None)
        self.side_config = getattr(datamodule, "side_features", None) if self.side_transform is not None else None

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

    def on_load_checkpoint(self: pl.LightningModule, checkpoint: dict[str, Any]) -> None:
        check_weights(self, checkpoint["state_dict"], "the checkpoint")
        rng = checkpoint.get("sessrec", {}).get("rng", {})
        if "torch" in rng:
            torch.set_rng_state(rng["torch"])
        if "cuda" in rng and torch.cuda.is_available() and len(rng["cuda"]) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(rng["cuda"])

    def save_pretrained(self: pl.LightningModule, directory: str | os.PathLike) -> Path:
        """Write the model directory (see the module docstring); a new version of an existing one."""
        if self.vocab is None:
            raise ValueError("the model has no vocabulary to save: train it with a data module, or load it with one")
        sections, _ = self.network_parts()
        sections["task"] = {"class_path": class_path(self), "init_args": plain_hparams(self)}
        return write_model_directory(directory, sections, self.state_dict(), self.vocab, self.side_transform,
                                     self.side_config)

    def network_parts(self) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """The network's sections and weights of a model directory (`sessrec.models.pretrained`)."""
        raise NotImplementedError

    @classmethod
    def task_from_network(cls, config: dict[str, Any], source: str) -> dict[str, Any]:
        """The ``{"class_path", "init_args"}`` of the task that trains the network of `config`'s
        network sections (a directory written by the network alone)."""
        raise NotImplementedError

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        network = cls.__dict__.get("NETWORK")
        if network is not None:
            _TASK_OF_NETWORK[network] = cls

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike) -> pl.LightningModule:
        """The task a model directory holds, in eval mode, with its vocabulary and feature transforms
        (``Pretrained.from_pretrained`` takes any task; a task class refuses the others)."""
        directory = versions.resolve(directory)
        config = read_config(directory)
        source = f"{directory / CONFIG}"
        task_config = config.get("task") if "task" in config else _task_of_network(cls, config, source)
        task = build(task_config, source, "task", expected=cls)
        weights = load_weights(directory)
        check_weights(task, weights, str(directory / WEIGHTS))
        task.load_state_dict(weights)
        if isinstance(task.hparams.get("cardinalities"), dict):
            task.vocab = RankingVocab.load(directory / VOCAB)
        else:
            task.vocab = ItemVocab.load(directory / VOCAB)
        check_vocabulary(task.vocab, config, directory / VOCAB)
        task.side_transform, task.side_config = load_side(directory, config)
        return task.eval()


def _task_of_network(cls: type, config: dict[str, Any], source: str) -> dict[str, Any]:
    """The task config of a directory that a network wrote alone: the task that trains its network."""
    path, _ = split_config(config.get("model"), source, "model")
    network = resolve(path, nn.Module, source, "model")
    task = next((t for n, t in _TASK_OF_NETWORK.items() if issubclass(network, n)), None)
    if task is None or not issubclass(task, cls):
        wanted = cls.__name__ if cls is not Pretrained else "a task"
        raise ConfigError(source, "model", f"holds a {network.__name__}, which {wanted} does not train; "
                          f"load it with {network.__name__}.from_pretrained")
    return task.task_from_network(config, source)


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


def load_checkpoint(path: str | os.PathLike) -> pl.LightningModule:
    """The task a checkpoint holds, built from its saved config, in eval mode, with its vocabulary attached."""
    checkpoint = read_checkpoint(path)
    hparams = {k: v for k, v in checkpoint.get("hyper_parameters", {}).items() if not str(k).startswith("_")}
    task_path = checkpoint.get("sessrec", {}).get("task") or checkpoint.get("hyper_parameters", {}).get("_class_path")
    if not task_path:
        raise ValueError(f"{path}: the checkpoint does not say which task it holds; load it with the recipe it was trained with")
    if isinstance(task_path, str) and task_path.rpartition(".")[2] == "NextItemTask" and "encoder" not in hparams:
        raise ValueError(
            f"{path}: the checkpoint has no encoder config (an older sessrec wrote it); "
            "evaluate it with the recipe it was trained with: sessrec test --config <recipe> --ckpt_path ..."
        )
    task = build({"class_path": task_path, "init_args": hparams}, str(path), "sessrec.task", "hyper_parameters")
    check_weights(task, checkpoint["state_dict"], str(path))
    task.load_state_dict(checkpoint["state_dict"])
    for key in DATA_STATE_KEYS:
        state = checkpoint.get(key)
        if isinstance(state, dict) and "vocab" in state:
            reader = RankingVocab if key == "ClickoutDataModule" else ItemVocab
            task.vocab = reader.empty().load_state_dict(parquet_state(state["vocab"]), str(path))
    return task.eval()
