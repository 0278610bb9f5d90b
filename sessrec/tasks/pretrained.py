"""Saved models without their recipe: Lightning checkpoints and model directories.

A task's hyper-parameters are its full constructor config as plain data (the encoder and the
objective as ``class_path``/``init_args``), so either form rebuilds the network alone:

- a **checkpoint** (``.ckpt``, Lightning's, for resuming): the config, the weights, the optimizer
  and loop state, and the data module's state (vocabulary, fitted feature transforms);
  `load_checkpoint` reads it with ``torch.load(weights_only=True)``.
- a **model directory** (`save_pretrained` / `from_pretrained`, for serving and export)::

      config.json         {"format": "sessrec.model", "version": 2, "task": {"class_path", "init_args"},
                           "vocab": {"fingerprint", "rows"}, "parts": {file name: content hash}}
      model.safetensors   the weights
      vocab.parquet       raw ids <-> model ids (a RankingVocab for DLRM)
      features.npz        fitted side-feature transforms, when the model has side features

  ``config.json`` is written last and records the content hash of every other file and the
  fingerprint of the vocabulary the weights were trained with, so loading refuses a part that does
  not belong (`sessrec.saved.directory`). Saving again into the same directory adds a version and
  moves its pointer (`sessrec.saved.versions`): a crash at any moment leaves the old model or the
  new one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch

from sessrec.saved.checkpoint import DATA_STATE_KEYS, read_checkpoint, to_bytes
from sessrec.saved.directory import describe, read_description, write_description
from sessrec.saved import versions
from sessrec.data.ranking import RankingVocab
from sessrec.data.side import SideFeatures, SideFeatureTransform
from sessrec.data.vocab import ItemVocab
from sessrec.embeddings.dynamic import DynamicEmbeddingBag
from sessrec.saved.registry import ConfigError, class_path, config_of, construct, resolve, split_config
from sessrec.tasks.settings import grouped

FORMAT, VERSION = "sessrec.model", 2
READABLE_VERSIONS = (1, 2)  # version 1: written before the parts were hashed; read without that check
GROUPED_TASKS = ("NextItemTask", "BaselineTask")  # tasks whose settings form typed parts (`sessrec.tasks.settings`)
CONFIG, WEIGHTS, VOCAB, FEATURES = "config.json", "model.safetensors", "vocab.parquet", "features.npz"


class Pretrained:
    """Mixin of the tasks: checkpoints that say which class they are, shape checks on load, model directories.

    The fitted data a model needs to read raw input (``vocab``, ``side_transform``) is taken from
    the data module at setup, from a checkpoint, or from a model directory.
    """

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
        """Write the model directory (see the module docstring); replaces an existing one."""
        from safetensors.torch import save_file

        if self.vocab is None:
            raise ValueError("the model has no vocabulary to save: train it with a data module, or load it with one")
        config = {"format": FORMAT, "version": VERSION, "task": {"class_path": class_path(self),
                                                                  "init_args": plain_hparams(self)},
                  "vocab": {"fingerprint": self.vocab.fingerprint(), "rows": self.vocab.to_table().num_rows}}
        if self.side_transform is not None:
            config["side_features"] = config_of(self.side_config)["init_args"]
        weights = {k: v.detach().cpu().contiguous().clone() for k, v in self.state_dict().items()}

        def write(tmp: Path) -> None:
            save_file(weights, str(tmp / WEIGHTS))
            self.vocab.save(tmp / VOCAB)
            parts = [WEIGHTS, VOCAB]
            if self.side_transform is not None:
                self.side_transform.save(tmp / FEATURES)
                parts.append(FEATURES)
            write_description(tmp, CONFIG, describe(tmp, config, parts))

        return versions.write_directory(directory, write)

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike) -> pl.LightningModule:
        """The task a model directory holds, in eval mode, with its vocabulary and feature transforms
        (``Pretrained.from_pretrained`` takes any task; a task class refuses the others)."""
        from safetensors.torch import load_file

        directory = versions.resolve(directory)
        config = read_config(directory)
        task = build(config.get("task"), f"{directory / CONFIG}", "task", expected=cls)
        weights = load_file(str(directory / WEIGHTS))
        check_weights(task, weights, str(directory / WEIGHTS))
        task.load_state_dict(weights)
        if isinstance(task.hparams.get("cardinalities"), dict):
            task.vocab = RankingVocab.load(directory / VOCAB)
        else:
            task.vocab = ItemVocab.load(directory / VOCAB)
        check_vocab(task.vocab, config, directory / VOCAB)
        if (directory / FEATURES).exists():
            task.side_config = SideFeatures(**config.get("side_features", {}))
            task.side_transform = SideFeatureTransform.load(directory / FEATURES, task.side_config)
        return task.eval()


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
    init_args = init_args or {}
    if cls.__name__ in GROUPED_TASKS and isinstance(init_args, dict):  # a saved config may name lr, ks, ... one by one
        try:
            init_args = grouped(init_args)
        except ValueError as err:
            raise ConfigError(source, args_key, str(err)) from err
    return construct(cls, init_args, source, args_key)


def check_weights(task: torch.nn.Module, weights: dict[str, torch.Tensor], source: str) -> None:
    """Refuse weights that do not fit `task` with one line naming the first differing tensor."""
    own = task.state_dict()
    # a growing table's buffers are as large as the table has grown: it resizes itself on load
    growing = tuple(f"{name}." for name, m in task.named_modules() if isinstance(m, DynamicEmbeddingBag))
    weights = {k: v for k, v in weights.items() if not k.startswith(growing)}
    own = {k: v for k, v in own.items() if not k.startswith(growing)}
    missing = [k for k in own if k not in weights]
    unexpected = [k for k in weights if k not in own]
    wrong = [k for k in own if k in weights and tuple(own[k].shape) != tuple(weights[k].shape)]
    if wrong:
        k = wrong[0]
        raise ValueError(
            f"{source} holds weights of another configuration: {k} is {tuple(weights[k].shape)} there and "
            f"{tuple(own[k].shape)} in the model built here ({len(wrong)} tensors differ); use the recipe or "
            "model directory it was trained with"
        )
    if missing or unexpected:
        name = (missing or unexpected)[0]
        where = "lacks" if missing else "has an extra"
        raise ValueError(
            f"{source} holds weights of another network: it {where} tensor {name!r} "
            f"({len(missing)} missing, {len(unexpected)} unexpected); use the recipe or model directory it was trained with"
        )


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
            task.vocab = reader.from_bytes(to_bytes(state["vocab"]), path)
    return task.eval()


def read_config(directory: Path) -> dict[str, Any]:
    """A model directory's ``config.json``, checked (format, version, every part's content hash);
    one clear line for anything else."""
    config = read_description(directory, CONFIG, FORMAT, READABLE_VERSIONS)
    for name in (WEIGHTS, VOCAB):
        if not (directory / name).exists():
            raise FileNotFoundError(f"{directory}: the model directory lacks {name}")
    return config


def check_vocab(vocab: ItemVocab | RankingVocab, config: dict[str, Any], source: Path) -> None:
    """Refuse a vocabulary other than the one the weights were trained with (by content, not by file)."""
    recorded = (config.get("vocab") or {}).get("fingerprint")
    if recorded is not None and vocab.fingerprint() != recorded:
        raise ValueError(
            f"{source}: is not the vocabulary this model was trained with ({vocab.to_table().num_rows} rows, fingerprint "
            f"{vocab.fingerprint()[:19]}...; the model's: {config['vocab'].get('rows')} rows, {recorded[:19]}...)"
        )
