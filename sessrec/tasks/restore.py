"""Which settings ``sessrec validate|test|predict --model_dir`` take from the model directory.

The model directory holds the trained network (`sessrec.artifacts`); the task that evaluates it
(`NextItemTask.from_recommender`, `DLRMTask.from_ranker`) has its settings. The recipe and the
command line give settings too. `merge_with_model` decides setting by setting, by what the task
class declares:

- ``EVALUATION_SETTINGS`` (how the model is evaluated or run: metric cut-offs, recommendations
  per session, exclusion of seen items, compilation) are taken from the recipe and the command
  line over the model's; a setting they do not give keeps the model's value.
- ``TRAINING_SETTINGS`` (read only while fitting: loss, optimizer, schedule, seeds) are not
  read: the recipe a model was trained with passes as it is.
- every other setting fixes the network (its shape, the function it computes): the model's
  value; a given value that differs is refused with one line naming the key and both values.

"Given" means set by the recipe or the command line (a default is not given). Data-derived
settings, linked from the data module, are left out here: the data module reads the model
directory's vocabulary and feature transforms.

Examples:
    >>> from sessrec.tasks import NextItemTask
    >>> held = {"dropout": 0.1, "evaluation": {"ks": [10, 20], "top_k": 20, "exclude_seen": False}}
    >>> merged = merge_with_model(NextItemTask, held, given={"evaluation": {"top_k": 5}}, source="runs/x/model")
    >>> merged["evaluation"]
    {'ks': [10, 20], 'top_k': 5, 'exclude_seen': False}
    >>> merge_with_model(NextItemTask, held, given={"dropout": 0.3}, source="runs/x/model")
    Traceback (most recent call last):
    ...
    ValueError: --model.dropout 0.3 differs from the model's 0.1 (runs/x/model): the network (its shape and what it computes) is fixed by training; evaluate the model as it was trained
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from sessrec.saved.registry import ConfigError, parameters, resolve

_ABSENT = object()  # a setting the model does not hold


def merge_with_model(
    task: type,
    held: Mapping[str, Any],
    given: Mapping[str, Any],
    source: str,
    from_data: Iterable[str] = (),
    prefix: str = "--model.",
) -> dict[str, Any]:
    """The settings that evaluate the model of a model directory; refuses a given network setting that differs.

    Args:
        task: the task class (its ``EVALUATION_SETTINGS`` and ``TRAINING_SETTINGS`` are read; a class
            without them takes every setting from the model).
        held: the constructor settings of the model's task (plain data: ``{"class_path", "init_args"}`` for objects).
        given: the settings the recipe and the command line set, in the same form (dataclass parts
            may be plain mappings of their fields).
        source: the model directory, named in the error.
        from_data: settings linked from the data module, left out of the result.
        prefix: what names a setting in messages (``--model.encoder.init_args.d_model``).

    Returns:
        the constructor settings of the model's task, with the evaluation settings given over them.

    Raises:
        ValueError: a given setting that fixes the network differs from the model's, in one line
            naming the first such setting, both values, and how many others differ; or the model
            holds a setting `task` does not take.
    """
    unknown = [key for key in held if not _takes(task, key)]
    if unknown:
        raise ValueError(f"{source}: the model's setting {unknown[0]!r} is not one of {task.__name__}'s")
    evaluation = set(getattr(task, "EVALUATION_SETTINGS", ()))
    training = set(getattr(task, "TRAINING_SETTINGS", ()))
    skipped = set(from_data)
    init_args: dict[str, Any] = {}
    conflicts: list[str] = []
    for key, kept in held.items():
        if key in skipped:
            continue
        mine = given.get(key, _ABSENT)
        kept = _conform(kept, mine)
        if key in evaluation:
            init_args[key] = _overlay(kept, mine)
            continue
        init_args[key] = kept
        if key in training:
            continue
        for path, value, was in _differences(mine, kept, key):
            conflicts.append(f"{prefix}{path} {show(value)} differs from the model's {show(was)}")
    if conflicts:
        raise ValueError(
            f"{conflicts[0]} ({source}){_more(conflicts)}: the network (its shape and what it computes) is fixed by "
            "training; evaluate the model as it was trained"
        )
    return init_args


def refuse_changed(held: Mapping[str, Any], given: Mapping[str, Any], source: str, from_data: Iterable[str] = (),
                   prefix: str = "--model.") -> None:
    """``fit --ckpt_path``: refuse a given setting that differs from the checkpoint's, which LightningCLI's restore
    builds the task with (the given one would be ignored).

    Args:
        held: the checkpoint's hyper-parameters (the task's class as ``_class_path``).
        given: the settings the recipe and the command line set, as `merge_with_model` takes them; a
            ``class_path``: the task's class.
        source: the checkpoint, named in the error.
        from_data: settings linked from the data module, not compared.
        prefix: what names a setting in messages.

    Raises:
        ValueError: one line naming the first setting that differs, both values, and how many others differ.
    """
    conflicts = []
    named, saved = given.get("class_path"), held.get("_class_path")
    if named is not None and saved is not None and not same_class(str(named), str(saved)):
        conflicts.append(f"{prefix}class_path {named} differs from the checkpoint's {saved}")
    for key, kept in held.items():
        if key not in from_data and not key.startswith("_"):
            mine = given.get(key, _ABSENT)
            conflicts += [f"{prefix}{path} {show(value)} differs from the checkpoint's {show(was)}"
                          for path, value, was in _differences(mine, _conform(kept, mine), key)]
    if conflicts:
        raise ValueError(f"{conflicts[0]} ({source}){_more(conflicts)}: a resumed fit continues its run with the "
                         "settings it was trained with; resume with that run's recipe and flags, or fit anew "
                         "without --ckpt_path")


def _more(conflicts: list[str]) -> str:
    """`` (N more settings differ)`` after the first of `conflicts`."""
    return {1: "", 2: " (1 more setting differs)"}.get(len(conflicts), f" ({len(conflicts) - 1} more settings differ)")


def _takes(task: type, key: str) -> bool:
    """Whether `task`'s constructor takes a setting `key`."""
    params, open_ended = parameters(task)
    return key in params or open_ended


def task_class(path: str) -> type | None:
    """The registered class a ``class_path`` or an alias names (`sessrec.saved.registry.resolve`), or None."""
    try:
        return resolve(path, object, "")
    except ConfigError:
        return None


def same_class(a: str, b: str) -> bool:
    """Whether two class paths name one class (``sessrec.models.XLNetEncoder`` is ``sessrec.models.xlnet.XLNetEncoder``)."""
    first, second = task_class(a), task_class(b)
    if first is not None and second is not None:
        return first is second
    return a == b


def show(value: Any) -> str:
    """A setting's value as it is written on the command line (``true``, ``null``, ``[5, 10]``, ``cosine``)."""
    if value is _ABSENT:
        return "(not set)"
    if isinstance(value, str):
        return value
    return json.dumps(value, default=str)


def _conform(kept: Any, mine: Any) -> Any:
    """The model's `kept` in the form of the given `mine`: a dataclass part saved as
    ``{"class_path", "init_args"}`` is given as the mapping of its fields."""
    if not isinstance(kept, dict) or not isinstance(mine, dict):
        return kept
    if "class_path" in kept and "class_path" not in mine:
        return _conform(kept.get("init_args") or {}, mine)
    if "class_path" in kept:
        args = kept.get("init_args") or {}
        theirs = mine.get("init_args") or {}
        return {**kept, "init_args": {k: _conform(v, theirs.get(k, _ABSENT)) for k, v in args.items()}}
    return {k: _conform(v, mine.get(k, _ABSENT)) for k, v in kept.items()}


def _overlay(kept: Any, mine: Any) -> Any:
    """`kept` with what `mine` gives over it (mappings key by key)."""
    if mine is _ABSENT:
        return kept
    if isinstance(kept, dict) and isinstance(mine, dict) and ("class_path" not in mine or kept.get("class_path") == mine["class_path"]):
        return {**kept, **{k: _overlay(kept.get(k, _ABSENT), v) for k, v in mine.items()}}
    return mine


def _differences(mine: Any, kept: Any, path: str) -> list[tuple[str, Any, Any]]:
    """(setting, given value, model's value) for each given leaf of `mine` that differs from `kept`."""
    if mine is _ABSENT:
        return []
    if isinstance(mine, dict) and isinstance(kept, dict):
        if "class_path" in mine:
            if "class_path" not in kept or not same_class(str(mine["class_path"]), str(kept["class_path"])):
                return [(f"{path}.class_path", mine["class_path"], kept.get("class_path", _ABSENT))]
            return _differences(mine.get("init_args") or {}, kept.get("init_args") or {}, f"{path}.init_args")
        return [d for k, v in mine.items() for d in _differences(v, kept.get(k, _ABSENT), f"{path}.{k}")]
    return [] if same_value(mine, kept) else [(path, mine, kept)]


def same_value(a: Any, b: Any) -> bool:
    """Whether two settings are equal as plain data (a tuple equals the list of its items, ``1`` is not ``true``)."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return a == b
