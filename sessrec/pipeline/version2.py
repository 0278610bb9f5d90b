"""Reading the stages of a ``pipeline.json`` of format versions 1 and 2.

Those versions describe a stage by its class name (``kind``; the features and the ordering by
their place), its settings (``config``, a layout of each stage's own) and one ``.safetensors``
file of its arrays; the fitted feature ops lie beside them in ``features.npz``. `stage` turns
such an entry into what version 3 holds, the stage's constructor config and its state dict,
with the key of the file that each part of the config comes from, so that an error names the key
that was read. Only the library's stages were saved this way; the class named by ``kind`` is
resolved through the registry like any saved config.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from sessrec.features import FeaturePipeline
from sessrec.models.pretrained import sections_from_task
from sessrec.pipeline.candidate_features import CandidateFeatures
from sessrec.pipeline.filters import ItemTableFilter, SeenItemsFilter
from sessrec.pipeline.ordering import BoostRule, DiversityCap, Ordering, SoftmaxSampling
from sessrec.pipeline.retrieval.baseline import BaselineRetriever
from sessrec.pipeline.retrieval.covisitation import CoVisitation
from sessrec.pipeline.retrieval.session_model import SessionModelRetriever, as_class_config
from sessrec.pipeline.scoring import DLRMScorer, GBDTScorer
from sessrec.saved.registry import ConfigError, resolve

Converted = tuple[dict[str, Any], dict[str, Any], dict[str, str]]  # init_args, state, moves (relative keys)


def stage(base: Any, entry: Mapping[str, Any], key: str, arrays: dict[str, np.ndarray], directory: Path,
          source: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """(config, state, moves) of a version 1 or 2 stage entry at `key`: `moves` maps each key prefix of
    the config to the key of ``pipeline.json`` it was read from."""
    if base in (CandidateFeatures, Ordering):
        cls = base
    else:
        cls = resolve(entry.get("kind"), base, source, f"{key}.kind")
    settings = entry.get("config")
    if not isinstance(settings, Mapping):
        raise ConfigError(source, f"{key}.config", f"expected a mapping of the stage's settings, got {type(settings).__name__}")
    convert = CONVERTERS.get(cls)
    if convert is None:
        raise ConfigError(source, f"{key}.kind", f"{cls.__name__}: a version 1 or 2 pipeline holds the library's stages only")
    try:
        init_args, state, moves = convert(dict(settings), arrays, directory, source, f"{key}.config")
    except KeyError as err:
        raise ConfigError(source, f"{key}.config", f"the saved settings lack {err}") from None
    moves = {f"{key}.config.init_args{k}": f"{key}.config{v}" for k, v in moves.items()}
    moves[f"{key}.config"] = f"{key}.config"
    return {"class_path": _path(cls), "init_args": init_args}, state, moves


def _path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _under(arrays: Mapping[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    """The arrays named ``<prefix><name>``, by name."""
    return {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}


def _session_model(settings: dict, arrays: dict, directory: Path, source: str, key: str) -> Converted:
    """``{"network", "objective", "index": {"type", settings}}``, or ``{"model": a task config, "index"}``;
    arrays ``weights/<model.* | objective.*>`` and ``index/<name>``."""
    index = settings.get("index")
    if not isinstance(index, Mapping):
        raise ConfigError(source, f"{key}.index", f"expected a mapping of the index's settings, got {type(index).__name__}")
    index = dict(index)
    index_config = {"class_path": index.pop("type", None), "init_args": index}
    moves = {"": "", ".index.init_args": ".index", ".index": ".index.type"}
    if "network" in settings:
        model, objective = settings["network"], settings.get("objective")
        moves.update({".model": ".network", ".objective": ".objective"})
    else:  # the task's config
        sections = sections_from_task(as_class_config(settings.get("model")), source, f"{key}.model")
        model, objective = sections["model"], sections["objective"]
        moves.update({".model": ".model", ".objective": ".model.init_args.objective"})
    state = {"weights": _under(arrays, "weights/"), "index": _under(arrays, "index/")}
    return {"model": model, "objective": objective, "index": index_config}, state, moves


def _baseline(settings: dict, arrays: dict, directory: Path, source: str, key: str) -> Converted:
    """``{"baseline", "num_items", "chunk"}``; arrays ``sessions``."""
    init_args = {"baseline": settings["baseline"], "chunk": settings.get("chunk", 512)}
    return init_args, {"sessions": arrays["sessions"], "num_items": settings["num_items"]}, {"": ""}


def _covisitation(settings: dict, arrays: dict, directory: Path, source: str, key: str) -> Converted:
    """The constructor's arguments and ``num_items``; arrays ``indptr``, ``indices``, ``data``."""
    num_items = settings.pop("num_items")
    return settings, {**arrays, "num_items": num_items}, {"": ""}


def _seen(settings: dict, arrays: dict, directory: Path, source: str, key: str) -> Converted:
    return settings, {}, {"": ""}


def _item_table(settings: dict, arrays: dict, directory: Path, source: str, key: str) -> Converted:
    """``{"mode", "path", "num_unknown"}``; arrays ``ids``, ``valid_from``, ``valid_to``."""
    return {"path": settings["path"], "mode": settings["mode"]}, {**arrays, "num_unknown": settings["num_unknown"]}, {"": ""}


def _features(settings: dict, arrays: dict, directory: Path, source: str, key: str) -> Converted:
    """The constructor's arguments and ``names``; arrays ``popularity``; the ops in ``features.npz``."""
    state: dict[str, Any] = {"names": settings.pop("names", None), **arrays}
    if (directory / "features.npz").exists():
        state["ops"] = FeaturePipeline.load(directory / "features.npz").state_dict()
    return settings, state, {"": ""}


def _dlrm(settings: dict, arrays: dict, directory: Path, source: str, key: str) -> Converted:
    """``{"config": the constructor's arguments, "sizes", "num_dense", "history"}`` and, from a scorer with
    unseen-id rows, ``"vocabulary"``; arrays ``weights/*``, ``ids/*``, and ``mean`` and ``std`` or ``quantiles``.
    A state without ``ids`` is refused by `DLRMScorer.load_state_dict`."""
    state = {name: value for name, value in settings.items() if name != "config"}
    state.update({name: value for name, value in arrays.items() if "/" not in name})
    state["weights"] = _under(arrays, "weights/")
    ids = _under(arrays, "ids/")
    if ids:
        state["ids"] = ids
    return dict(settings["config"]), state, {"": ".config"}


def _gbdt(settings: dict, arrays: dict, directory: Path, source: str, key: str) -> Converted:
    """``{"params": LightGBM's parameters, "best_round", "max_rounds", "early_stopping", "stop_fraction",
    "seed"}``; arrays ``model``."""
    params = settings["params"]
    init_args = {"num_leaves": params["num_leaves"], "learning_rate": params["learning_rate"],
                 "max_rounds": settings["max_rounds"], "early_stopping": settings["early_stopping"],
                 "min_data_in_leaf": params["min_data_in_leaf"], "feature_fraction": params["feature_fraction"],
                 "stop_fraction": settings["stop_fraction"], "threads": params["num_threads"], "seed": settings["seed"]}
    return init_args, {"model": arrays["model"], "best_round": settings["best_round"]}, {"": ""}


def _ordering(settings: dict, arrays: dict, directory: Path, source: str, key: str) -> Converted:
    """``{"boosts": [{"weight", "mode", "num_unknown"}], "diversity": {"max_per_category", "num_unknown"},
    "sampling": {"temperature", "seed"}}``; arrays ``boosts.<i>.<name>``, ``diversity.<name>``. The rules
    hold model ids only: their sources (raw ids, files) were not saved."""
    boosts, state = [], {"boosts": {}}
    for i, rule in enumerate(settings.get("boosts") or []):
        boosts.append({"class_path": _path(BoostRule),
                       "init_args": {"items": None, "weight": rule["weight"], "mode": rule["mode"]}})
        state["boosts"][str(i)] = {**_under(arrays, f"boosts.{i}."), "num_unknown": rule["num_unknown"]}
    diversity = settings.get("diversity")
    if diversity is not None:
        state["diversity"] = {**_under(arrays, "diversity."), "num_unknown": diversity["num_unknown"]}
        diversity = {"class_path": _path(DiversityCap),
                     "init_args": {"category_path": None, "max_per_category": diversity["max_per_category"]}}
    sampling = settings.get("sampling")
    if sampling is not None:
        sampling = {"class_path": _path(SoftmaxSampling), "init_args": sampling}
    return {"boosts": boosts, "diversity": diversity, "sampling": sampling}, state, {"": ""}


CONVERTERS: dict[type, Callable[..., Converted]] = {
    SessionModelRetriever: _session_model, BaselineRetriever: _baseline, CoVisitation: _covisitation,
    SeenItemsFilter: _seen, ItemTableFilter: _item_table, CandidateFeatures: _features, DLRMScorer: _dlrm,
    GBDTScorer: _gbdt, Ordering: _ordering,
}
