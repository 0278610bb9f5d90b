"""Model directories: a trained network with what it needs to read raw input, saved and loaded without Lightning.

`SessionModel` and `DLRM` save themselves (``save_pretrained``) and load back (``from_pretrained``,
or `load_pretrained` for whichever network a directory holds); the training tasks write and read
the same directories (`sessrec.tasks.Pretrained`), adding their own section. A model directory::

    config.json         {"format": "sessrec.model", "version": 3,
                         "model": {"class_path", "init_args"},      the network, built from registered classes
                         "objective": {"class_path", "init_args"},  session models: how the next item is read
                         "inference": {"max_length", "exclude_seen", "top_k"},  session models (`Inference`)
                         "task": {"class_path", "init_args"},       when a task wrote it: the trainable task
                         "side_features": {...},                    with features.npz: what the transforms read
                         "vocab": {"fingerprint", "rows"}, "parts": {file name: content hash}}
    model.safetensors   the weights
    vocab.parquet       raw ids <-> model ids (`ItemVocab`; a `RankingVocab` for DLRM)
    features.npz        fitted side-feature transforms, when the model reads side features

One weights file serves both loaders. Its keys are those of the task's state dict: the network's
tensors under ``model.`` (the task holds its network as ``self.model``) and an objective's own
under ``objective.`` (RTD's generator and discriminator head). A network saved on its own writes
the same keys, so a task reads it; the network loader takes the ``model.`` (and ``objective.``)
tensors of a task's file and leaves anything else a task may add.

``config.json`` is written last and records the content hash of every other file and the
fingerprint of the vocabulary the weights were trained with, so loading refuses a part that does
not belong (`sessrec.saved.directory`). Saving again into the same directory adds a version and
moves its pointer (`sessrec.saved.versions`). Versions 1 (before the parts were hashed) and 2
hold only the ``task`` section: the network loader builds the network from it
(`network_sections`) for `NextItemTask` and `DLRMTask` configs, with no Lightning.

Examples:
    >>> import tempfile, numpy as np, pyarrow as pa, torch
    >>> from sessrec.data import ItemVocab
    >>> from sessrec.models import GRU4RecEncoder, SessionModel
    >>> vocab = ItemVocab.fit(pa.array(np.arange(1, 9)))
    >>> model = SessionModel(len(vocab), GRU4RecEncoder(d_model=8), max_length=6)
    >>> path = model.save_pretrained(tempfile.mkdtemp() + "/model", vocab)
    >>> loaded = SessionModel.from_pretrained(path)
    >>> loaded.vocab == vocab, loaded.inference.max_length
    (True, 5)
"""

from __future__ import annotations

import inspect
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sessrec.data.side import SideFeatures
from sessrec.data.vocab import ItemVocab
from sessrec.datasets.clickout_rows import RankingVocab
from sessrec.embeddings.dynamic import DynamicEmbeddingBag
from sessrec.embeddings.sparse_arch import sparse_of_flags
from sessrec.features.side_transform import SideFeatureTransform
from sessrec.saved import versions
from sessrec.saved.directory import (
    check_vocabulary,
    describe,
    read_description,
    vocabulary_record,
    write_description,
)
from sessrec.saved.registry import ConfigError, config_of, resolve, split_config

FORMAT, VERSION = "sessrec.model", 3
# 1: a task section, parts not hashed; 2: a task section, parts hashed; 3: the network's own sections
READABLE_VERSIONS = (1, 2, 3)
CONFIG, WEIGHTS, VOCAB, FEATURES = "config.json", "model.safetensors", "vocab.parquet", "features.npz"
NETWORK, OBJECTIVE = "model.", "objective."  # the weight keys' prefixes (the task's state dict)
SESSION_MODEL, DLRM_MODEL = "sessrec.models.session_model.SessionModel", "sessrec.models.dlrm.DLRM"

Vocab = ItemVocab | RankingVocab


@dataclass(frozen=True)
class Inference:
    """What serving a session model reads besides its weights.

    Args:
        max_length: items of a session read (its latest ones); the network adds its [MASK] slot.
        exclude_seen: never recommend an item of the input session.
        top_k: recommendations per session by default (``sessrec predict``, export with top-k outputs).
    """

    max_length: int
    exclude_seen: bool = False
    top_k: int = 20

    def __post_init__(self) -> None:
        for name in ("max_length", "top_k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"inference {name} must be an integer >= 1, got {value!r}")
        if not isinstance(self.exclude_seen, bool):
            raise ValueError(f"inference exclude_seen must be true or false, got {self.exclude_seen!r}")  # noqa: TRY004

    @classmethod
    def read(cls, section: Any, source: str, key: str = "inference") -> Inference:
        """The settings a config's ``inference`` section holds; one `ConfigError` line for anything else."""
        if not isinstance(section, dict):
            raise ConfigError(source, key, f"expected a mapping of max_length, exclude_seen, top_k, got {type(section).__name__}")
        unknown = sorted(map(str, section.keys() - {"max_length", "exclude_seen", "top_k"}))
        if unknown:
            raise ConfigError(source, key, f"unknown settings {unknown}; it holds max_length, exclude_seen, top_k")
        try:
            return cls(**section)
        except (TypeError, ValueError) as err:
            raise ConfigError(source, key, str(err)) from None


class PretrainedNetwork:
    """Mixin of the networks that save and load themselves as model directories (module docstring).

    A loaded network carries what it was saved with: ``vocab``, and for a model that reads side
    features ``side_transform`` (the fitted transforms) and ``side_features`` (their settings).
    """

    vocab: Vocab | None = None
    side_transform: SideFeatureTransform | None = None
    side_features: SideFeatures | None = None

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike) -> Any:
        """The network a model directory holds (its current version), in eval mode, with its vocabulary.

        ``PretrainedNetwork.from_pretrained`` (or `load_pretrained`) loads any network; a network
        class refuses a directory that holds another.
        """
        folder = versions.resolve(directory)
        config = read_config(folder)
        source = str(folder / CONFIG)
        config = network_sections(config, source)
        path, _ = split_config(config.get("model"), source, "model")
        return resolve(path, cls, source, "model").load_directory(folder, config, source)

    @classmethod
    def load_directory(cls, folder: Path, config: dict[str, Any], source: str) -> Any:
        """Build the network of a read `config` (with its network sections) and load the weights of `folder`."""
        raise NotImplementedError

    def attach(self, vocab: Vocab, side_transform: SideFeatureTransform | None = None,
               side_features: SideFeatures | None = None) -> None:
        """Keep the fitted data the network reads raw input with (what `from_pretrained` restores)."""
        self.vocab, self.side_transform, self.side_features = vocab, side_transform, side_features


def load_pretrained(directory: str | os.PathLike) -> Any:
    """The network (`SessionModel` or `DLRM`) a model directory holds, as `PretrainedNetwork.from_pretrained`."""
    return PretrainedNetwork.from_pretrained(directory)


# -- writing -------------------------------------------------------------------------------------
def with_prefix(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {f"{prefix}{k}": v for k, v in state.items()}


def under(weights: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The tensors of `weights` whose key starts with `prefix`, without it."""
    return {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}


def write_model_directory(
    directory: str | os.PathLike,
    sections: dict[str, Any],
    weights: dict[str, torch.Tensor],
    vocab: Vocab | None,
    side_transform: SideFeatureTransform | None = None,
    side_features: SideFeatures | None = None,
) -> Path:
    """Write a model directory (a new version of an existing one); returns the folder written.

    Args:
        directory: the model directory.
        sections: the config's sections (``model``, and ``objective``, ``inference``, ``task``).
        weights: the tensors, keyed as the module docstring says.
        vocab: the vocabulary the weights were trained with.
        side_transform: the fitted side-feature transforms, for a model that reads side features.
        side_features: their settings.
    """
    from safetensors.torch import save_file

    if vocab is None:
        raise ValueError("the model has no vocabulary to save: pass the vocabulary it was trained with")
    config = {"format": FORMAT, "version": VERSION, **sections,
              "vocab": vocabulary_record(vocab)}
    if side_transform is not None:
        config["side_features"] = config_of(side_features if side_features is not None else side_transform.config)["init_args"]
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in weights.items()}

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
def read_config(directory: Path) -> dict[str, Any]:
    """A model directory's ``config.json``, checked (format, version, every part's content hash);
    one clear line for anything else."""
    config = read_description(directory, CONFIG, FORMAT, READABLE_VERSIONS)
    for name in (WEIGHTS, VOCAB):
        if not (directory / name).exists():
            raise FileNotFoundError(f"{directory}: the model directory lacks {name}")
    return config


def load_weights(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(directory / WEIGHTS))


def load_into(module: nn.Module, weights: dict[str, torch.Tensor], source: str) -> None:
    """``module.load_state_dict(weights)`` after `check_weights`."""
    check_weights(module, weights, source)
    module.load_state_dict(weights)


def load_vocab(directory: Path, config: dict[str, Any], reader: type[ItemVocab | RankingVocab]) -> Vocab:
    """The directory's vocabulary, checked against the fingerprint its config records."""
    vocab = reader.load(directory / VOCAB)
    check_vocabulary(vocab, config, directory / VOCAB)
    return vocab


def load_side(directory: Path, config: dict[str, Any]) -> tuple[SideFeatureTransform | None, SideFeatures | None]:
    """The fitted side-feature transforms and their settings, when the directory holds them."""
    if not (directory / FEATURES).exists():
        return None, None
    settings = SideFeatures(**config.get("side_features", {}))
    return SideFeatureTransform.load(directory / FEATURES, settings), settings


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


# -- the network of a task's config ---------------------------------------------------------------
def network_sections(config: dict[str, Any], source: str) -> dict[str, Any]:
    """`config` with its network sections: as they are (version 3), or built from the ``task`` section
    that a version 1 or 2 directory holds alone (`sections_from_task`)."""
    if "model" in config:
        return config
    if "task" not in config:
        raise ConfigError(source, "", "the model directory's config has neither a 'model' nor a 'task' section")
    return {**config, **sections_from_task(config["task"], source)}


def sections_from_task(task: Any, source: str, key: str = "task") -> dict[str, Any]:
    """The network sections (``model``, and ``objective`` and ``inference`` for a session model) of a
    `NextItemTask` or `DLRMTask` config (``{"class_path", "init_args"}``), as plain data.

    Only the arguments that shape the network are read (a task's loss, optimizer and metric
    settings are not), and nothing is imported or built: the sections are resolved like any saved
    config when the network is built from them. A config of another task is refused with one line.
    """
    path, init_args = split_config(task, source, key)
    if not isinstance(path, str):
        raise ConfigError(source, key, f"class_path must be a string, got {type(path).__name__}")
    if init_args is None:
        init_args = {}
    if not isinstance(init_args, dict):
        raise ConfigError(source, f"{key}.init_args", f"the task's arguments must be a mapping, got {type(init_args).__name__}")
    name = path.rpartition(".")[2]
    if name == "NextItemTask":
        return _session_sections(init_args, source, f"{key}.init_args")
    if name == "DLRMTask":
        return _dlrm_sections(init_args, source, f"{key}.init_args")
    raise ConfigError(
        source, key, f"{path!r}: only a NextItemTask's or a DLRMTask's network is built from its task config here; "
        "load this directory with its task class (sessrec.tasks.Pretrained.from_pretrained)"
    )


# NextItemTask's defaults for the settings a saved config may lack (tests/test_pretrained.py checks them)
TASK_MAX_LENGTH, TASK_TOP_K = 20, 20
TASK_ENCODER = {"class_path": "sessrec.models.xlnet.XLNetEncoder", "init_args": {}}
TASK_OBJECTIVE = {"class_path": "sessrec.models.masking.MaskedItemModeling", "init_args": {}}
SESSION_MODEL_ARGS = ("num_items", "position_embedding", "dropout", "input_norm", "output_transform", "score_scale", "num_virtual")


def _session_sections(args: dict[str, Any], source: str, key: str) -> dict[str, Any]:
    if "num_items" not in args:
        raise ConfigError(source, key, "the task config lacks num_items, the size of the network's item table")
    encoder = args.get("encoder") or TASK_ENCODER
    split_config(encoder, source, f"{key}.encoder")
    max_length = args.get("max_length", TASK_MAX_LENGTH)
    if isinstance(max_length, bool) or not isinstance(max_length, int):
        raise ConfigError(source, f"{key}.max_length", f"expected an integer, got {max_length!r}")
    model = {k: args[k] for k in SESSION_MODEL_ARGS if k in args}
    model.update(encoder=encoder, max_length=max_length + 1)  # + the [MASK] slot after the last item
    side_features = args.get("side_features")
    if side_features is not None:
        side_info = args.get("side_info") or {}
        if isinstance(side_info, dict) and "class_path" not in side_info:
            side_info = {"class_path": "sessrec.models.side_info.SideInfoConfig", "init_args": side_info}
        model["side_info"] = {"class_path": "sessrec.models.side_info.SideInfoEmbedding", "init_args": {
            "d_model": _d_model(encoder, source, f"{key}.encoder"), "num_items": args["num_items"],
            "spec": {"class_path": "sessrec.data.side.SideInfoSpec", "init_args": side_features}, "config": side_info}}
    evaluation = _fields(args.get("evaluation"), source, f"{key}.evaluation")
    inference = {"max_length": max_length,
                 "exclude_seen": evaluation.get("exclude_seen", args.get("exclude_seen", False)),
                 "top_k": evaluation.get("top_k", args.get("top_k", TASK_TOP_K))}
    return {"model": {"class_path": SESSION_MODEL, "init_args": model},
            "objective": args.get("objective") or TASK_OBJECTIVE, "inference": inference}


# the defaults of the DLRMTask that wrote version 1 and 2 directories, for the settings a config may lack
DLRM_TASK_DEFAULTS = {"dense_layers": [64, 16], "over_layers": [128, 64], "interaction": "dot", "dcn_layers": 2, "dcn_rank": 16,
                      "seed": 0}
DLRM_TASK_SPARSE = {"sparse_backend": "fused", "dynamic_tables": False, "embedding_optimizer": "adagrad_rowwise",
                    "embedding_lr": 0.05, "max_rows": 1 << 20, "pad_to_bytes": 16}


def _dlrm_sections(args: dict[str, Any], source: str, key: str) -> dict[str, Any]:
    """The DLRM of a DLRMTask config: the settings named one by one (what version 1 and 2 directories
    hold, `sparse_of_flags` choosing the sparse module), or grouped into ``network`` and ``sparse``."""
    cardinalities, num_dense = args.get("cardinalities"), args.get("num_dense")
    if not isinstance(cardinalities, dict) or not cardinalities:
        raise ConfigError(source, f"{key}.cardinalities", f"expected the sparse features' table sizes, got {cardinalities!r}")
    args = {**args, **_fields(args.get("network"), source, f"{key}.network")}  # the grouped form names a network part
    dim = args.get("embedding_dim", 16)
    tables = [{"class_path": "sessrec.embeddings.config.TableConfig", "init_args": {
        "name": name, "num_embeddings": rows, "embedding_dim": dim, "pooling": "sum", "feature_names": []}}
        for name, rows in cardinalities.items()]
    try:
        sparse = args.get("sparse") or sparse_of_flags(args, DLRM_TASK_SPARSE)
    except ValueError as err:
        raise ConfigError(source, key, str(err)) from None
    model = {"num_dense": num_dense, "tables": tables,
             **{k: args.get(k, default) for k, default in DLRM_TASK_DEFAULTS.items()}, "sparse": sparse}
    return {"model": {"class_path": DLRM_MODEL, "init_args": model}}


def _fields(part: Any, source: str, key: str) -> dict[str, Any]:
    """A task's typed part as its fields: ``{"class_path", "init_args"}``, a mapping of fields, or nothing."""
    if part is None:
        return {}
    if isinstance(part, dict) and "class_path" in part:
        _, part = split_config(part, source, key)
        part = part or {}
    if not isinstance(part, dict):
        raise ConfigError(source, key, f"expected a mapping of its settings, got {type(part).__name__}")
    return part


def _d_model(encoder: dict[str, Any], source: str, key: str) -> int:
    """The width an encoder config gives (its ``d_model``, else its class's default), read without building it."""
    path, init_args = split_config(encoder, source, key)
    if isinstance(init_args, dict) and "d_model" in init_args:
        return init_args["d_model"]
    default = inspect.signature(resolve(path, nn.Module, source, key)).parameters.get("d_model")
    if default is None or default.default is inspect.Parameter.empty:
        raise ConfigError(source, key, f"{path!r} does not give its width d_model, which the side information needs")
    return default.default


def inference_of(model: nn.Module, max_length: int | None, exclude_seen: bool | None, top_k: int | None,
                 saved: Inference | None) -> Inference:
    """The inference settings to save: those given, else those the model was loaded with, else the defaults
    (every position but the [MASK] slot, seen items kept, 20 recommendations)."""
    base = asdict(saved) if saved is not None else {"max_length": int(model.max_length) - 1}
    given = {"max_length": max_length, "exclude_seen": exclude_seen, "top_k": top_k}
    return Inference(**{**base, **{k: v for k, v in given.items() if v is not None}})
