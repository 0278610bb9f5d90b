"""One line for a recipe or flag that jsonargparse refuses, naming the key and the closest valid key.

jsonargparse reports an unknown key or a wrong type as a tree of every type it tried (``Does not
validate against any of the Union subtypes ... Errors: - Problem with given class_path ...``),
and LightningCLI prints it after a 50-line usage. `explain_parse_error` reads that tree and keeps
the one branch that names the problem: the key (as a recipe writes it), the class that refused it,
and the closest valid key (`difflib`).
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import re
import typing
from argparse import ArgumentError
from collections.abc import Iterable
from importlib import import_module


class RecipeError(ValueError):
    """A recipe key or command-line flag the parser refuses (one line; the tree is its ``__cause__``)."""


_KEY = re.compile(r'^(\s*)(?:- )?Parser key "([^"]+)":')
_CLASS = re.compile(r"^(\s*)- Problem with given class_path '([^']+)':")
_OPTION = re.compile(r"^\s*Option '([^']+)' is not accepted")
_TYPE = re.compile(r"^\s*Expected a <class '([^']+)'>\. Got value: (.*)$")
_UNION_TYPE = re.compile(r"^\s*- Expected a <class '([^']+)'>\s*$")
_GIVEN = re.compile(r"^\s*Given value: (.*)$")
_UNRECOGNIZED = re.compile(r"unrecognized arguments: (.*)$")
_NOT_ACCEPTED = re.compile(r"does not accept option '([^']+)'")


def parse_args(parser: typing.Any, args: list[str]) -> typing.Any:
    """``parser.parse_args(args)`` of a jsonargparse parser made with ``exit_on_error=False``; a refused
    key or value raises `RecipeError` in one line (`explain_parse_error`)."""
    try:
        return parser.parse_args(args)
    except ArgumentError as err:
        keys = [o for a in parser._actions for o in a.option_strings]
        raise RecipeError(explain_parse_error(str(err), keys)) from err


def explain_parse_error(message: str, valid_keys: Iterable[str] = ()) -> str:
    """One line for jsonargparse's error `message`; `valid_keys`: the parser's keys (``trainer.max_epochs``).

    Examples:
        >>> explain_parse_error("unrecognized arguments: --trainer.max_epochz 3", ["trainer.max_epochs"])
        'unknown key trainer.max_epochz; did you mean trainer.max_epochs?'
    """
    valid = sorted({k.lstrip("-") for k in valid_keys})
    lines = message.splitlines()
    first = lines[0].strip() if lines else ""
    if (found := _UNRECOGNIZED.search(first)) is not None:
        flag = next((a for a in found.group(1).split() if a.startswith("--")), found.group(1).split()[0])
        return _unknown(flag.lstrip("-").partition("=")[0], valid)
    if (found := _NOT_ACCEPTED.search(first)) is not None:
        return _unknown(found.group(1), valid)
    path: list[tuple[int, str, str]] = []  # (indent, "key" | "class", name): the branch being read
    union: list[str] = []
    for line in lines:
        indent = len(line) - len(line.lstrip())
        if (found := _KEY.match(line)) is not None or (found := _CLASS.match(line)) is not None:
            depth = len(found.group(1))
            while path and path[-1][0] >= depth:
                path.pop()
            path.append((depth, "key" if found.re is _KEY else "class", found.group(2)))
            union = []
            continue
        if (found := _OPTION.match(line)) is not None:
            owner = next((name for _, kind, name in reversed(path) if kind == "class"), "")
            option = found.group(1)
            return _unknown(_dotted(path, option), _options(owner, option), owner, option)
        if (found := _TYPE.match(line)) is not None:
            return f"{_dotted(path)}: expected {_type_name(found.group(1))}, got {found.group(2).strip()!r}"
        if (found := _UNION_TYPE.match(line)) is not None:
            union.append(_type_name(found.group(1)))
            continue
        if (found := _GIVEN.match(line)) is not None and union and indent <= (path[-1][0] + 2 if path else indent):
            key, given = _dotted(path), found.group(1).strip()
            return f"{key}: expected {' or '.join(union)}, got {given!r}" + _null_hint(key, given, union)
    return " ".join(message.split())


def _null_hint(key: str, given: str, union: list[str]) -> str:
    """How to write null for `key` when jsonargparse read a dotted flag's ``null`` as the text 'None'.

    Below a class (``--model.schedule.seconds null``) jsonargparse passes the flag on as a nested
    argument and loses the null; the same value given as a mapping of its group is read.
    """
    group, _, leaf = key.rpartition(".")
    if given != "None" or "null" not in union or group.count(".") < 1:
        return ""
    return f"; a dotted flag below a class cannot carry null: give its group as a mapping, --{group} '{{{leaf}: null}}'"


def _dotted(path: list[tuple[int, str, str]], option: str | None = None) -> str:
    """The key as a recipe writes it: classes below the top-level model/data take ``init_args``."""
    parts: list[str] = []
    classes = 0
    for _, kind, name in path:
        if kind == "class":
            classes += 1
        elif classes > 1:
            parts += ["init_args", name]
        else:
            parts.append(name)
    if option is not None:
        parts += (["init_args"] if classes > 1 else []) + [option]
    return ".".join(parts)


def _unknown(key: str, valid: list[str], owner: str = "", option: str = "") -> str:
    """``unknown key K; did you mean V?``, or the valid keys where none is close.

    Args:
        key: the key as given (``model.encoder.init_args.d_modle``).
        valid: the keys that could stand there (the parser's keys, or the options of `owner`).
        owner: the class that refused `option` (its last part is `key`'s end), or "".
        option: the refused option of `owner` (``d_modle``, ``optimisation.lr``).
    """
    if owner:
        probe = option if any("." in v for v in valid) else option.partition(".")[0]
        stem = key[: len(key) - len(option)]
        close = difflib.get_close_matches(probe, valid, n=1, cutoff=0.6)
        where = f" ({owner.rpartition('.')[2]} has no option {probe!r})"
        if close:
            return f"unknown key {key}{where}; did you mean {stem}{close[0]}{option[len(probe):]}?"
        return f"unknown key {key}{where}; its options are {', '.join(valid[:16])}"
    prefix = key.rpartition(".")[0]
    candidates = [v for v in valid if v.startswith(prefix + ".")] if prefix else valid
    close = difflib.get_close_matches(key, candidates or valid, n=1, cutoff=0.6)
    if close:
        return f"unknown key {key}; did you mean {close[0]}?"
    names = [v.removeprefix(prefix + ".") if prefix else v for v in candidates or valid][:16]
    return f"unknown key {key}; the valid keys{' of ' + prefix if candidates and prefix else ''} are {', '.join(names)}"


def _options(class_path: str, option: str) -> list[str]:
    """The keys `class_path` accepts at the depth of `option` (``optimization.lr``: the fields of its
    ``optimization`` setting), as dotted keys; [] when the class cannot be imported."""
    module, _, name = class_path.rpartition(".")
    try:
        cls = getattr(import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return []
    names = [p for p in inspect.signature(cls).parameters if p not in ("self", "args", "kwargs")]
    head, _, rest = option.partition(".")
    if not rest or head not in names:
        return names
    hint = _hints(cls.__init__).get(head)
    for arg in (hint, *typing.get_args(hint)):
        if dataclasses.is_dataclass(arg):
            return [f"{head}.{f.name}" for f in dataclasses.fields(arg)]
    return names


def _hints(func: object) -> dict[str, object]:
    try:
        return typing.get_type_hints(func)
    except (NameError, TypeError, AttributeError):  # an annotation that does not resolve here: the names still help
        return {}


def _type_name(text: str) -> str:
    return {"NoneType": "null"}.get(text, text.rpartition(".")[2])
