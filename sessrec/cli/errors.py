"""sessrec's own check of a command's keys and plain values: one line naming the key, and the closest valid
key or the type the value should have.

A recipe or a flag is checked against the signatures of the classes and functions it configures
before jsonargparse parses it: every key of a ``{class_path, init_args}`` block (or of a block
of a root's default class) must be a parameter of that class, every key below a dataclass setting
(``optimization.lr``) a field of it, and a value of a plain type (int, float, bool, a Literal,
optional or not) must be one. jsonargparse then checks everything else; its message for a value it
refuses names the key and the value and is shown as it is, on one line (`one_line`).

Examples:
    >>> from sessrec.models import XLNetEncoder
    >>> check_keys({"encoder": {"class_path": "sessrec.models.XLNetEncoder", "init_args": {"d_modle": 16}}},
    ...            {"encoder": XLNetEncoder})
    Traceback (most recent call last):
    ...
    sessrec.cli.errors.RecipeError: unknown key encoder.init_args.d_modle (XLNetEncoder has no option 'd_modle'); did you mean encoder.init_args.d_model?
"""

from __future__ import annotations

import difflib
import inspect
import types
import typing
from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any, Literal

from sessrec.saved.registry import parameters


class RecipeError(ValueError):
    """A recipe key, value or command-line flag that the command refuses, in one line."""


PARSER_KEYS = ("config", "help", "print_config")  # keys of every jsonargparse parser, of no class
NO_VALUE = "<no value>"  # a flag given without a value (``--print_config``): its key is checked, not its value


def one_line(err: BaseException) -> str:
    """`err`'s message on one line (jsonargparse's messages indent a tree of the types it tried)."""
    return " ".join(str(err).split())


def check_keys(config: Mapping[str, Any], roots: Mapping[str, Callable[..., Any] | None], prefix: str = "") -> None:
    """Refuse the first key of `config` that no class or function of `roots` accepts.

    Args:
        config: a command's configuration as a mapping (a recipe file, or flags as `flag_mapping` nests them).
        roots: top-level key -> the class or function its block configures (its default: a block
            with a ``class_path`` configures that class); None: a key whose block is not checked.
            A top-level key outside `roots` is left to the parser.
        prefix: the key path of `config` in the messages (``--`` for flags).

    Raises:
        RecipeError: ``unknown key K (Owner has no option 'o'); did you mean V?``, or
            ``K: expected int or null, got 'abc'`` (`_check_value`).
    """
    for key, value in config.items():
        if key in roots and roots[key] is not None:
            _check_block(value, roots[key], f"{prefix}{key}")


def check_arguments(config: Mapping[str, Any], owner: Callable[..., Any], prefix: str = "", extra: tuple[str, ...] = ()) -> None:
    """Refuse a top-level key of `config` that `owner` (a class or function) does not take, and check
    each block below it; `extra`: keys the command's parser adds beside `owner`'s."""
    _check_block({k: v for k, v in config.items() if k not in extra}, owner, prefix, top=True)


def flag_mapping(args: list[str]) -> dict[str, Any]:
    """The ``--key value`` / ``--key=value`` flags of `args` as nested mappings (``--model.encoder.init_args.d_model 16``
    -> ``{"model": {"encoder": {"init_args": {"d_model": "16"}}}}``); values stay text, flags without one
    (``--print_config``) map to `NO_VALUE`. jsonargparse parses the flags themselves."""
    found: dict[str, Any] = {}
    for i, arg in enumerate(args):
        if not arg.startswith("--") or arg == "--":
            continue
        name, eq, value = arg[2:].partition("=")
        name = name.removesuffix("+")  # --trainer.callbacks+=...: appends to a list
        if not eq:
            value = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else NO_VALUE
        *parents, leaf = name.split(".")
        block = found
        for part in parents:
            inner = block.get(part)
            block[part] = inner = inner if isinstance(inner, dict) else {}
            block = inner
        block[leaf] = value
    return found


def refuse_null_below_class(args: list[str], groups: tuple[str, ...]) -> None:
    """Refuse ``--G.a.b null`` for a group G of `groups` (a class chosen by ``class_path``): jsonargparse
    passes such a flag on to the class as the text 'None', so the null is lost; the group's mapping carries it.

    Raises:
        RecipeError: naming the flag and the mapping that sets the same value.
    """
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        value = value if eq else (args[i + 1] if i + 1 < len(args) else "")
        group, *path = name.removeprefix("--").split(".") if name.startswith("--") else ("",)
        path = [p for p in path if p != "init_args"]
        if group in groups and len(path) >= 2 and value.strip() == "null":
            inner = ".".join(path[:-1])
            raise RecipeError(f"{name} null: a dotted flag below a class cannot carry null: give its group as a mapping, "
                              f"--{group}.{inner} '{{{path[-1]}: null}}'")


def check_in_order(sources: list[Mapping[str, Any]], roots: Mapping[str, Callable[..., Any] | None]) -> None:
    """`check_keys` of each source (the ``--config`` files, then the flags) in the order jsonargparse
    reads them: a block without a ``class_path`` configures the class that an earlier source chose at
    its place (``model``, ``model.encoder``), else its root's default. jsonargparse drops the keys of an
    earlier block that a newly chosen class does not take, so each block is checked against the class
    it was written for."""
    classes: dict[tuple[str, ...], str] = {}  # the place of a block (without init_args) -> its class_path so far
    for source in sources:
        check_keys(_with_classes(source, classes, ()), roots)
        _record_classes(source, classes, ())


def _with_classes(block: Mapping[str, Any], classes: dict[tuple[str, ...], str], place: tuple[str, ...],
                  inject: bool = True) -> dict[str, Any]:
    """`block` with the ``class_path`` of `classes` added to each block of it that names none."""
    out = {k: _with_classes(v, classes, place if k == "init_args" else (*place, k), k != "init_args")
           if isinstance(v, Mapping) else v for k, v in block.items()}
    if inject and place and "class_path" not in out and place in classes:
        out["class_path"] = classes[place]
    return out


def _record_classes(block: Mapping[str, Any], classes: dict[tuple[str, ...], str], place: tuple[str, ...]) -> None:
    """Note the ``class_path`` of each block of `block` in `classes`; a class that changes forgets those below it."""
    if place and "class_path" in block:
        if classes.get(place) != block["class_path"]:
            for below in [p for p in classes if p[: len(place)] == place]:
                del classes[below]
        classes[place] = str(block["class_path"])
    for key, value in block.items():
        if isinstance(value, Mapping):
            _record_classes(value, classes, place if key == "init_args" else (*place, key))


def _check_block(block: Any, owner: Callable[..., Any], key: str, top: bool = False) -> None:
    """Check `block`, the configuration of `owner` at `key` (its own keys, or ``class_path``/``init_args``)."""
    if not isinstance(block, Mapping):
        return
    if not top and ("class_path" in block or "init_args" in block):
        found = _importable(str(block["class_path"])) if "class_path" in block else owner
        if found is None or found is object:
            return  # a short or unknown class name: jsonargparse resolves it or says what is wrong
        owner, init = found, block.get("init_args")
        extra = [k for k in block if k not in ("class_path", "init_args", "dict_kwargs")]
        block, key = ({**(init if isinstance(init, Mapping) else {}), **{k: block[k] for k in extra}},
                      f"{key}.init_args" if isinstance(init, Mapping) else key)  # the key as written
    hints, open_ended = parameters(owner)
    if open_ended:
        return  # takes **kwargs: any key may stand
    params = list(hints)
    for name, value in block.items():
        where = f"{key}{name}" if top else f"{key}.{name}"
        if top and name in PARSER_KEYS:
            continue
        if name not in params:
            _refuse(where, name, params, owner)
        hint = hints.get(name)
        if isinstance(value, Mapping) and "class_path" in value:
            _check_block(value, object, where)
        elif isinstance(value, Mapping):
            kind = _one_kind(hint)[0]
            if inspect.isclass(kind) and not inspect.isabstract(kind) and typing.get_origin(kind) is None:
                _check_block(value, kind, where)  # a dataclass setting, or the init args of the one class it takes
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, Mapping) and "class_path" in item:
                    _check_block(item, object, where)
        elif value is not NO_VALUE:
            _check_value(where, value, hint)


def _check_value(key: str, value: Any, hint: Any) -> None:
    """Refuse a value that a plain setting's type cannot take: an int, float or bool (or null where the
    type is optional), one of a Literal's values; other types are left to jsonargparse. A text value
    (a flag's) is read as jsonargparse reads it (``null``, ``true``, numbers)."""
    kind, optional = _one_kind(hint)
    if kind is None:
        return
    text = value.strip() if isinstance(value, str) else None
    if text == "null" or value is None:
        ok = optional
    elif typing.get_origin(kind) is Literal:
        ok = value in typing.get_args(kind) or text in map(str, typing.get_args(kind))
    elif kind is bool:
        ok = isinstance(value, bool) or (text or "").lower() in ("true", "false")
    elif kind in (int, float):
        ok = (isinstance(value, (int, float)) and not isinstance(value, bool)) or _number(text, kind)
    else:
        return
    if not ok:
        name = "one of " + ", ".join(map(repr, typing.get_args(kind))) if typing.get_origin(kind) is Literal else kind.__name__
        raise RecipeError(f"{key}: expected {name}{' or null' if optional else ''}, got {value!r}")


def _one_kind(hint: Any) -> tuple[Any, bool]:
    """The one type `hint` takes besides None (None when it takes several), and whether it takes None."""
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    kinds = [a for a in args if a is not type(None)]
    return (kinds[0] if len(kinds) == 1 else None), type(None) in args


def _number(text: str | None, kind: type) -> bool:
    try:
        kind(text) if text is not None else None
    except ValueError:
        return False
    return text is not None


def _refuse(key: str, option: str, valid: list[str], owner: Callable[..., Any]) -> typing.NoReturn:
    stem = key[: len(key) - len(option)]
    name = getattr(owner, "__name__", str(owner))
    close = difflib.get_close_matches(option, valid, n=1, cutoff=0.6)
    where = f"unknown key {key} ({name} has no option {option!r})"
    if close:
        raise RecipeError(f"{where}; did you mean {stem}{close[0]}?")
    raise RecipeError(f"{where}; its options are {', '.join(valid[:24])}")


def _importable(class_path: str) -> type | None:
    module, _, name = class_path.rpartition(".")
    try:
        found = getattr(import_module(module), name) if module else None
    except (ImportError, AttributeError, ValueError):
        return None
    return found if inspect.isclass(found) else None
