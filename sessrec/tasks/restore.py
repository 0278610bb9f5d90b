"""Which settings of a trained task ``sessrec validate|test|predict`` takes from the checkpoint.

A checkpoint holds the constructor config its task was trained with; the recipe and the command
line give another. `merge_with_checkpoint` decides setting by setting, by what the task class
declares:

- ``EVALUATION_SETTINGS`` (how the model is evaluated or run: metric cut-offs, recommendations
  per session, exclusion of seen items, compilation) are taken from the recipe and the command
  line over the checkpoint; a setting they do not give keeps the checkpoint's value.
- ``TRAINING_SETTINGS`` (read only while fitting: optimizer, schedule, seeds) keep the
  checkpoint's value; a given value that differs is not used, and is reported in a note.
- every other setting fixes the network (its shape, the function it computes): the checkpoint's
  value; a given value that differs is refused with one line naming the key and both values.

"Given" means set by the recipe or the command line (a default is not given). Data-derived
settings, linked from the data module, are left out here: the data module reads the
checkpoint's vocabulary and feature transforms, and the CLI compares what it derives.

Examples:
    >>> from sessrec.tasks import NextItemTask
    >>> held = {"dropout": 0.1, "evaluation": {"ks": [10, 20], "top_k": 20, "exclude_seen": False}}
    >>> merged = merge_with_checkpoint(NextItemTask, held, given={"evaluation": {"top_k": 5}}, source="best.ckpt")
    >>> merged.init_args["evaluation"]
    {'ks': [10, 20], 'top_k': 5, 'exclude_seen': False}
    >>> merge_with_checkpoint(NextItemTask, held, given={"dropout": 0.3}, source="best.ckpt")
    Traceback (most recent call last):
    ...
    ValueError: --model.dropout 0.3 differs from the checkpoint's 0.1 (best.ckpt): the network (its shape and what it computes) is fixed by training; evaluate with the checkpoint's value
"""

from __future__ import annotations

import importlib
import inspect
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

_ABSENT = object()  # a setting the checkpoint does not hold


@dataclass(frozen=True)
class Merged:
    """What a trained task is evaluated with.

    Attributes:
        init_args: the constructor settings from the checkpoint, with the evaluation settings given over them.
        notes: the training settings given with another value than the checkpoint's (not used), one per entry.
    """

    init_args: dict[str, Any]
    notes: list[str] = field(default_factory=list)


def merge_with_checkpoint(
    task: type,
    held: Mapping[str, Any],
    given: Mapping[str, Any],
    source: str,
    from_data: Iterable[str] = (),
    prefix: str = "--model.",
) -> Merged:
    """The settings that evaluate the checkpoint of a `task`; refuses a given network setting that differs.

    Args:
        task: the task class (its ``EVALUATION_SETTINGS`` and ``TRAINING_SETTINGS`` are read; a class
            without them takes every setting from the checkpoint).
        held: the checkpoint's constructor settings (plain data: ``{"class_path", "init_args"}`` for objects).
        given: the settings the recipe and the command line set, in the same form (dataclass parts
            may be plain mappings of their fields).
        source: the checkpoint, named in the error.
        from_data: settings linked from the data module, left out of the result.
        prefix: what names a setting in messages (``--model.encoder.init_args.d_model``).

    Returns:
        the settings to build the task with, and the notes on unused training settings.

    Raises:
        ValueError: a given setting that fixes the network differs from the checkpoint's, in one line
            naming the first such setting, both values, and how many others differ; or the checkpoint
            holds a setting `task` does not take (a checkpoint of another version or task).
    """
    unknown = [key for key in held if not _takes(task, key)]
    if unknown:
        raise ValueError(
            f"{source}: the checkpoint's setting {unknown[0]!r} is not one of {task.__name__}'s; evaluate it with the "
            "sessrec version and task it was trained with"
        )
    evaluation = set(getattr(task, "EVALUATION_SETTINGS", ()))
    training = set(getattr(task, "TRAINING_SETTINGS", ()))
    skipped = set(from_data)
    init_args: dict[str, Any] = {}
    notes: list[str] = []
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
        for path, value, was in _differences(mine, kept, key):
            line = f"{prefix}{path} {show(value)} differs from the checkpoint's {show(was)}"
            (notes if key in training else conflicts).append(line)
    if conflicts:
        more = {1: "", 2: " (1 more setting differs)"}.get(len(conflicts), f" ({len(conflicts) - 1} more settings differ)")
        raise ValueError(
            f"{conflicts[0]} ({source}){more}: the network (its shape and what it computes) is fixed by training; "
            "evaluate with the checkpoint's value"
        )
    return Merged(init_args, notes)


def _takes(task: type, key: str) -> bool:
    """Whether `task`'s constructor takes a setting `key`."""
    parameters = _parameters(task)
    return key in parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


def _parameters(task: type) -> Mapping[str, inspect.Parameter]:
    """The parameters of `task`'s constructor."""
    return inspect.signature(task.__init__).parameters


def task_class(path: str) -> type | None:
    """The class a ``class_path`` names (``NextItemTask`` alone is looked up in `sessrec.tasks`), or None."""
    module, _, name = path.rpartition(".")
    try:
        found = getattr(importlib.import_module(module or "sessrec.tasks"), name)
    except (ImportError, AttributeError, ValueError):
        return None
    return found if isinstance(found, type) else None


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
    """The checkpoint's `kept` in the form of the given `mine`: a dataclass part saved as
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
    """(setting, given value, checkpoint's value) for each given leaf of `mine` that differs from `kept`."""
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
