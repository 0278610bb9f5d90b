"""The model directory both artifacts write and read: parts, the description, the weights' keys.

A model directory::

    config.json         {"format": "sessrec.model", "version": 5, <the artifact's sections>,
                         "vocab": {"fingerprint", "rows"}, "parts": {file name: content hash},
                         "hash": the content hash of everything above}
    model.safetensors   the weights: the network's tensors under ``model.``, an objective's own under ``objective.``
    vocab.parquet       raw ids <-> model ids (`ItemVocab`, or `RankingVocab` for a click ranker)
    features.npz        fitted side-feature transforms, when the model reads side features

``config.json`` is written last and records the content hash of every other file, the
fingerprint of the vocabulary the weights were trained with and its own content hash, so loading
refuses a part that does not belong, an edited ``config.json``, and any of the files above that
``config.json`` does not list (`sessrec.saved.directory`), and weights with a NaN or infinite value, saved or
loaded (`check_finite`). The network is recorded once, in the
``model`` section, which every loader reads. Saving again into the same directory adds a version and
moves its pointer (`sessrec.saved.versions`). A directory of another format version is refused in
one line: retrain it with ``sessrec fit``, which writes this version.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sessrec.data.side import SideFeatures
from sessrec.embeddings.dynamic import DynamicEmbeddingBag
from sessrec.features.side_transform import SideFeatureTransform
from sessrec.saved import versions
from sessrec.saved.directory import (
    check_vocabulary,
    describe,
    read_description,
    vocabulary_record,
    write_description,
)
from sessrec.saved.registry import ConfigError, check_saveable, config_of

FORMAT, VERSION = "sessrec.model", 5
CONFIG, WEIGHTS, VOCAB, FEATURES = "config.json", "model.safetensors", "vocab.parquet", "features.npz"
NETWORK, OBJECTIVE = "model.", "objective."  # the weight keys' prefixes


def with_prefix(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """`state` with `prefix` before every key."""
    return {f"{prefix}{k}": v for k, v in state.items()}


def under(weights: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The tensors of `weights` whose key starts with `prefix`, without it."""
    return {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}


def check_weights(module: nn.Module, weights: dict[str, torch.Tensor], source: str) -> None:
    """Refuse weights that do not fit `module` with one line naming the first differing tensor."""
    own = module.state_dict()
    # a growing table's buffers are as large as the table has grown: it resizes itself on load
    growing = tuple(f"{name}." for name, m in module.named_modules() if isinstance(m, DynamicEmbeddingBag))
    weights = {k: v for k, v in weights.items() if not k.startswith(growing)}
    own = {k: v for k, v in own.items() if not k.startswith(growing)}
    missing = [k for k in own if k not in weights]
    unexpected = [k for k in weights if k not in own]
    wrong = [k for k in own if k in weights and tuple(own[k].shape) != tuple(weights[k].shape)]
    if wrong:
        k = wrong[0]
        raise ValueError(
            f"{source} holds weights of another configuration: {k} is {tuple(weights[k].shape)} there and "
            f"{tuple(own[k].shape)} in the model built here ({len(wrong)} tensors differ); use the model directory "
            "it was trained with"
        )
    if missing or unexpected:
        name = (missing or unexpected)[0]
        where = "lacks" if missing else "has an extra"
        raise ValueError(
            f"{source} holds weights of another network: it {where} tensor {name!r} "
            f"({len(missing)} missing, {len(unexpected)} unexpected); use the model directory it was trained with"
        )


def check_finite(weights: dict[str, torch.Tensor], source: str) -> None:
    """Refuse weights with a NaN or infinite value (a run that diverged, a corrupted file): a model scores every
    item with them and would rank by NaN. One line naming `source`, the tensor, the first such value and its place."""
    for key, tensor in weights.items():
        if not (tensor.is_floating_point() or tensor.is_complex()):
            continue
        bad = ~torch.isfinite(tensor)
        if bool(bad.any()):
            at = bad.nonzero()[0].tolist()
            raise ValueError(f"{source}: tensor {key!r} holds {tensor[tuple(at)].item()} at {at} ({int(bad.sum())} of "
                             f"{tensor.numel()} values are not finite numbers): a model with NaN or infinite weights "
                             "ranks items by them; retrain it, or save it from a checkpoint of before it diverged")


def load_into(module: nn.Module, weights: dict[str, torch.Tensor], source: str) -> None:
    """``module.load_state_dict(weights)`` after `check_weights`."""
    check_weights(module, weights, source)
    module.load_state_dict(weights)


# -- writing -------------------------------------------------------------------------------------
def write_model_directory(
    directory: str | os.PathLike,
    sections: dict[str, Any],
    weights: dict[str, torch.Tensor],
    vocab: Any,
    side_transform: SideFeatureTransform | None = None,
    side_features: SideFeatures | None = None,
) -> Path:
    """Write a model directory (a new version of an existing one); returns the folder written.

    Args:
        directory: the model directory.
        sections: the artifact's config sections (plain data).
        weights: the tensors, keyed as the module docstring says.
        vocab: the vocabulary the weights were trained with (``save``, ``fingerprint``, ``to_table``).
        side_transform: the fitted side-feature transforms, for a model that reads side features.
        side_features: their settings (default: the transforms' own).
    """
    from safetensors.torch import save_file

    config = {"format": FORMAT, "version": VERSION, **sections, "vocab": vocabulary_record(vocab)}
    if side_transform is not None:
        config["side_features"] = config_of(side_features if side_features is not None else side_transform.config)["init_args"]
    check_saveable(config, str(Path(directory) / CONFIG))
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in weights.items()}
    check_finite(tensors, f"{directory}: not saved")

    def write(tmp: Path) -> None:
        save_file(tensors, str(tmp / WEIGHTS))
        vocab.save(tmp / VOCAB)
        parts = [WEIGHTS, VOCAB]
        if side_transform is not None:
            side_transform.save(tmp / FEATURES)
            parts.append(FEATURES)
        write_description(tmp, CONFIG, describe(tmp, config, parts))

    return versions.write_directory(directory, write)


# -- reading -------------------------------------------------------------------------------------
EXPORT_DESCRIPTION = "model.json"  # what ``sessrec export`` writes beside the exported file


def exported_not_saved(directory: str | os.PathLike) -> str:
    """The one line that refuses an export's folder (``model.json``) where a model directory is read."""
    return (f"{directory}: holds an export ({EXPORT_DESCRIPTION}, written by sessrec export for ONNX/TorchScript "
            "runtimes), not a model directory: give the model directory it was exported from (runs/<name>/model)")


def read_model_directory(directory: str | os.PathLike) -> tuple[Path, dict[str, Any]]:
    """The folder of a model directory's current version and its checked ``config.json``.

    A directory of another format version is refused in one line naming the file and its version; a saved
    pipeline, in one line saying so; an edited ``config.json``, a missing part, one whose content hash differs or one that
    ``config.json`` does not list, in one line naming the file.
    """
    folder = versions.resolve(directory)
    if not (folder / CONFIG).exists() and (folder / "pipeline.json").is_file():
        raise ValueError(
            f"{directory}: is a saved pipeline (pipeline.json), not a model directory: Pipeline.from_pretrained and "
            "sessrec serve --model_dir read it; sessrec export and the model readers take a session model's or a DLRM's "
            "model directory (a pipeline recipe's models.<name>.model_dir)"
        )
    if not (folder / CONFIG).exists() and (folder / EXPORT_DESCRIPTION).is_file():
        raise FileNotFoundError(exported_not_saved(directory))
    config = read_description(folder, CONFIG, FORMAT, VERSION, "model directory",
                              f"retrain the model with sessrec fit, which writes a version {VERSION} directory")
    for name in (WEIGHTS, VOCAB):
        if not (folder / name).exists():
            raise FileNotFoundError(f"{folder}: the model directory lacks {name}")
    for name in (WEIGHTS, VOCAB, FEATURES):
        if (folder / name).exists() and name not in config.get("parts", {}):
            raise ValueError(f"{folder / name}: is not a part that {CONFIG} lists (a file from elsewhere): remove it, "
                             "or save the model again")
    return folder, config


def load_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The tensors of the directory's weights file; one with a NaN or infinite value is refused (`check_finite`)."""
    from safetensors.torch import load_file

    weights = load_file(str(folder / WEIGHTS))
    check_finite(weights, str(folder / WEIGHTS))
    return weights


def load_vocab(folder: Path, config: dict[str, Any], load: Callable[[Path], Any]) -> Any:
    """The directory's vocabulary (read by `load`), checked against the fingerprint its config records."""
    vocab = load(folder / VOCAB)
    check_vocabulary(vocab, config, folder / VOCAB)
    return vocab


def read_train_end(config: dict[str, Any], source: str) -> float | None:
    """The ``train_end`` a directory records: the epoch seconds of its training data's last event (None: not
    recorded); a value that is not a finite number is refused in one line naming the file."""
    value = config.get("train_end")
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)):
        raise ConfigError(source, "train_end", f"expected the epoch seconds of the training data's last event, got {value!r}")
    return value


def load_side(folder: Path, config: dict[str, Any]) -> tuple[SideFeatureTransform | None, SideFeatures | None]:
    """The fitted side-feature transforms and their settings, when the directory's parts list them."""
    if FEATURES not in config.get("parts", {}):
        return None, None
    settings = SideFeatures(**config.get("side_features", {}))
    return SideFeatureTransform.load(folder / FEATURES, settings), settings
