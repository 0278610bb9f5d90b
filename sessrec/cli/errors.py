"""sessrec's own check of a command's keys and plain values: one line naming the key, and the closest valid
key or the type the value should have.

A recipe or a flag is checked against the signatures of the classes and functions it configures
before jsonargparse parses it: every key of a ``{class_path, init_args}`` block (or of a block
of a root's default class) must be a parameter of that class, every key below a dataclass setting
(``optimization.lr``) a field of it, and a value of a plain type (int, float, bool, a Literal,
optional or not) must be one (a float is finite: jsonargparse reads no ``nan``), and a list setting
(``--paths``) a list, not one value. A short ``class_path`` (``EventLogSource``) is the subclass of that
name, as jsonargparse resolves it; a setting given as the path of another YAML file
(``--data.source source.yaml``) is checked in that file. jsonargparse then checks everything else;
its message for a value it refuses names the key and the value and is shown as it is, on one line
(`one_line`).

A configuration file is read here first (`read_config`): a YAML syntax error is one line
``file:line:column: problem``, and a key or value refused in a file is prefixed with the line and
column of that key (`locate`).

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
import math
import re
import textwrap
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from jsonargparse import get_loader

from sessrec.cli.class_paths import CLASS_NAME, CLOSE, resolve, subclasses, unknown_class
from sessrec.saved.registry import parameters


class RecipeError(ValueError):
    """A recipe key, value or command-line flag that the command refuses, in one line.

    Args:
        message: the line.
        keys: the key refused, as the path of keys written in its file (``("data", "source",
            "init_args", "path")``); empty when the error is not about one key.
        located: the message already names the file, line and column.
    """

    def __init__(self, message: str, keys: tuple[str, ...] = (), located: bool = False) -> None:
        super().__init__(message)
        self.keys, self.located = keys, located


PARSER_KEYS = ("config", "help", "print_config")  # keys of every jsonargparse parser, of no class
NO_VALUE = "<no value>"  # a flag given without a value (``--print_config``): its key is checked, not its value


def one_line(err: BaseException) -> str:
    """`err`'s message on one line (jsonargparse's messages indent a tree of the types it tried)."""
    return " ".join(str(err).split())


UNION_SUMMARY = "Does not validate against any of the Union subtypes"
OTHER_SUBTYPE = ("does not correspond to a subclass of", "Expected a <class")  # a subtype the value is not
PARSER_KEY = re.compile(r'Parser key "([^"]+)":\n')
CLASS_PROBLEM = re.compile(r"Problem with given class_path '(?:[\w]+\.)*(\w+)':\s*")


def named_subtype_error(text: str) -> str | None:
    """Of jsonargparse's union summary `text`, the one listed error that is not a subtype's mismatch; None
    for another message, or when no or several errors remain."""
    if not text.startswith(UNION_SUMMARY) or "\nErrors:\n" not in text:
        return None
    entries: list[str] = []
    for line in text.split("\nErrors:\n", 1)[1].splitlines():
        if line.startswith("  - "):
            entries.append(line[4:])
        elif line.startswith("    ") and entries:
            entries[-1] += " " + line.strip()
        else:
            break
    own = [e for e in entries if not any(mark in e for mark in OTHER_SUBTYPE)]
    return own[0] if len(own) == 1 else None


def union_error(text: str) -> str | None:
    """A parser's refusal of a value that matched no type of its key's union (``Parser key "K": Does not
    validate ...``) as ``K: <the one error of the type it was meant for>`` (``pipeline.models: ModelRetrieval:
    the following arguments are required: model_dir``); None for another message."""
    found = PARSER_KEY.match(text)
    if found is None:
        return None
    own = named_subtype_error(textwrap.dedent(text[found.end():]))
    return None if own is None else f"{found.group(1)}: {CLASS_PROBLEM.sub(lambda m: m.group(1) + ': ', own)}"


CONFIG_SUFFIXES = (".yaml", ".yml", ".json")  # a setting of a class given as a file of these names is that file's content


def read_config(path: Path) -> dict[str, Any]:
    """A configuration file's mapping as jsonargparse loads it; {} for a file that is missing or not
    a mapping (the command's parser then says what is wrong with it).

    Raises:
        RecipeError: ``file:line:column: problem`` for a YAML syntax error, or a key given twice in
            one mapping (YAML keeps the last one silently).
    """
    if not path.is_file():
        return {}
    text = path.read_text()
    try:
        content = get_loader("yaml")(text)
        _refuse_repeated_keys(yaml.compose(text, Loader=yaml.SafeLoader), path)
    except yaml.MarkedYAMLError as err:
        raise RecipeError(yaml_error(path, text, err), located=True) from err
    return content if isinstance(content, dict) else {}


def yaml_error(path: Path, text: str, err: yaml.MarkedYAMLError) -> str:
    """``file:line:column: problem (context that starts at line:column)`` of a YAML syntax error (an unclosed
    bracket: where YAML gave up, and where the bracket opened); a tab where the problem is says that YAML
    indents with spaces."""
    mark = err.problem_mark or err.context_mark
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
    lines = text.splitlines()
    found = lines[mark.line][mark.column : mark.column + 1] if mark is not None and mark.line < len(lines) else ""
    problem = (err.problem or err.context or "not YAML") + (" (a tab: YAML indents with spaces)" if found == "\t" else "")
    start = err.context_mark
    if err.context and err.problem and start is not None and (mark is None or (start.line, start.column) != (mark.line, mark.column)):
        problem += f" ({err.context} that starts at {start.line + 1}:{start.column + 1})"
    return f"{where}: {problem}"


def _refuse_repeated_keys(node: yaml.Node | None, path: Path) -> None:
    """Refuse a key given twice in one mapping of the YAML tree `node` (of `path`), naming both places."""
    if isinstance(node, yaml.MappingNode):
        first: dict[Any, yaml.Mark] = {}
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value in first and key.value != "<<":
                mark, before = key.start_mark, first[key.value]
                raise RecipeError(f"{path}:{mark.line + 1}:{mark.column + 1}: key {key.value!r} is given twice in one "
                                  f"mapping (first at {before.line + 1}:{before.column + 1}); only one may stand",
                                  located=True)
            first.setdefault(key.value, key.start_mark)
            _refuse_repeated_keys(value, path)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _refuse_repeated_keys(item, path)


def locate(err: RecipeError, path: Path | None) -> RecipeError:
    """`err` prefixed with ``file:line:column`` of its key in `path` (the deepest key of its path that the
    file has); `err` itself when it is located already or `path` is no file (flags)."""
    if err.located or path is None or not path.is_file():
        return err
    node, mark = yaml.compose(path.read_text(), Loader=yaml.SafeLoader), None
    for part in err.keys:
        if part == "init_args" and isinstance(node, yaml.MappingNode) and not any(k.value == "init_args" for k, _ in node.value):
            continue  # a setting of a class_path block written beside its class_path
        found = [(k, v) for k, v in node.value if k.value == part] if isinstance(node, yaml.MappingNode) else []
        if not found:
            break
        key, node = found[-1]
        mark = key.start_mark
    if mark is None:
        return RecipeError(f"{path}: {err}", err.keys, located=True)
    return RecipeError(f"{path}:{mark.line + 1}:{mark.column + 1}: {err}", err.keys, located=True)


def check_keys(config: Mapping[str, Any], roots: Mapping[str, Callable[..., Any] | None], prefix: str = "",
               base: Path | None = None) -> None:
    """Refuse the first key of `config` that no class or function of `roots` accepts.

    Args:
        config: a command's configuration as a mapping (a recipe file, or flags as `flag_mapping` nests them).
        roots: top-level key -> the class or function its block configures (its default: a block
            with a ``class_path`` configures that class); None: a key whose block is not checked.
            A top-level key outside `roots` is left to the parser.
        prefix: the key path of `config` in the messages (``--`` for flags).
        base: the folder that a setting given as a file name is relative to (the file of `config`'s);
            None: the working directory.

    Raises:
        RecipeError: ``unknown key K (Owner has no option 'o'); did you mean V?``, or
            ``K: expected int or null, got 'abc'`` (`_check_value`).
    """
    for key, value in config.items():
        if key in roots and roots[key] is not None:
            place = _Place((key,), prefix, base)
            flow = isinstance(value, str) and value.lstrip().startswith(("{", "["))
            _check_block(_flow_value(value, place) if flow else value, roots[key], place)


def check_arguments(config: Mapping[str, Any], owner: Callable[..., Any], prefix: str = "", extra: tuple[str, ...] = (),
                    base: Path | None = None) -> None:
    """Refuse a top-level key of `config` that `owner` (a class or function) does not take, and check
    each block below it; `extra`: keys the command's parser adds beside `owner`'s."""
    _check_block({k: v for k, v in config.items() if k not in extra}, owner, _Place((), prefix, base), top=True)


def flag_mapping(args: list[str]) -> dict[str, Any]:
    """The ``--key value`` / ``--key=value`` flags of `args` as nested mappings (``--model.encoder.init_args.d_model 16``
    -> ``{"model": {"encoder": {"init_args": {"d_model": "16"}}}}``); values stay text, flags without one
    (``--print_config``) map to `NO_VALUE`; a flag's value with flags below it is the class they configure
    (``--model.loss X --model.loss.factor 2`` -> ``{"loss": {"class_path": "X", "factor": "2"}}``).
    jsonargparse parses the flags themselves."""
    found: dict[str, Any] = {}
    for i, arg in enumerate(args):
        if not arg.startswith("--") or arg == "--":
            continue
        name, eq, value = arg[2:].partition("=")
        name = name.removesuffix("+")  # --trainer.callbacks+=...: appends to a list
        if name.endswith(".help"):  # --data.help SessionDataModule: jsonargparse's help of a class-typed setting
            continue
        if not eq:
            value = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else NO_VALUE
        *parents, leaf = name.split(".")
        block = found
        for part in parents:
            inner = block.get(part)
            if isinstance(inner, str) and inner is not NO_VALUE:
                inner = {"class_path": inner}  # --model.loss SampledSoftmax --model.loss.negatives in_batch
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


def check_in_order(sources: list[Mapping[str, Any]], roots: Mapping[str, Callable[..., Any] | None],
                   origins: list[Path | None] | None = None) -> None:
    """`check_keys` of each source (the ``--config`` files, then the flags) in the order jsonargparse
    reads them: a block without a ``class_path`` configures the class that an earlier source chose at
    its place (``model``, ``model.encoder``), else its root's default. jsonargparse drops the keys of an
    earlier block that a newly chosen class does not take, so each block is checked against the class
    it was written for. `origins`: the file of each source (None: flags), whose line and column a
    refusal names."""
    classes: dict[tuple[str, ...], str] = {}  # the place of a block (without init_args) -> its class_path so far
    for source, origin in zip(sources, origins or [None] * len(sources), strict=True):
        try:
            check_keys(_with_classes(source, classes, ()), roots, base=origin.parent if origin is not None else None)
        except RecipeError as err:
            raise locate(err, origin) from None
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
    """Note the ``class_path`` of each block of `block` in `classes` (and each text value, which may name the
    class of its place: ``loss: sessrec.tasks.SampledSoftmax``); a class that changes forgets those below it."""
    if place and "class_path" in block:
        _record(classes, place, str(block["class_path"]))
    for key, value in block.items():
        if isinstance(value, Mapping):
            _record_classes(value, classes, place if key == "init_args" else (*place, key))
        elif isinstance(value, str) and key not in ("class_path", "init_args") and value is not NO_VALUE:
            _record(classes, (*place, key), value)


def _record(classes: dict[tuple[str, ...], str], place: tuple[str, ...], class_path: str) -> None:
    if classes.get(place) != class_path:
        for below in [p for p in classes if p[: len(place)] == place]:
            del classes[below]
    classes[place] = class_path


class _Place(typing.NamedTuple):
    """Where a block is: its keys as written in its source, the prefix of its messages (``--`` for
    flags), the folder that a file named in it is relative to (None: the working directory) and,
    in a file named by a setting, the keys of that setting (shown before `keys`)."""

    keys: tuple[str, ...]
    prefix: str = ""
    base: Path | None = None
    outer: tuple[str, ...] = ()

    def below(self, key: str) -> _Place:
        return self._replace(keys=(*self.keys, key))

    def __str__(self) -> str:
        return self.prefix + ".".join((*self.outer, *self.keys))


def _check_block(block: Any, owner: Callable[..., Any], place: _Place, top: bool = False,
                 bases: tuple[type, ...] = ()) -> None:
    """Check `block`, the configuration of `owner` at `place` (its own keys, or ``class_path``/``init_args``);
    `bases`: the classes a short ``class_path`` names a subclass of (else `owner`'s)."""
    if not isinstance(block, Mapping):
        return
    if not top and ("class_path" in block or "init_args" in block):
        found = resolve(str(block["class_path"]), bases or _classes(owner)) if "class_path" in block else owner
        if found is None and CLASS_NAME.match(str(block["class_path"])):
            _refuse_unknown_class(place.below("class_path"), str(block["class_path"]), bases or _classes(owner))
        if found is None or found is object:
            return  # a class of several of that name: jsonargparse says what is wrong
        owner, init = found, block.get("init_args")
        extra = [k for k in block if k not in ("class_path", "init_args", "dict_kwargs")]
        block = {**(init if isinstance(init, Mapping) else {}), **{k: block[k] for k in extra}}
        place = place.below("init_args") if isinstance(init, Mapping) else place  # the key as written
    hints, open_ended = parameters(owner)
    if open_ended:
        return  # takes **kwargs: any key may stand
    params = list(hints)
    for name, value in block.items():
        where = place.below(name)
        if top and name in PARSER_KEYS:
            continue
        if name not in params:
            _refuse(where, name, params, owner)
        hint = hints.get(name)
        kind = _one_kind(hint)[0]
        if isinstance(value, str) and value.lstrip().startswith(("{", "[")) and not _takes_text(hint):
            value = _flow_value(value, where)  # a flag's mapping or list, which jsonargparse reads as YAML
        if isinstance(value, str) and value.endswith(CONFIG_SUFFIXES) and _configures_a_class(hint):
            _check_file(value, hint, where)
        elif (isinstance(value, str) and _configures_a_class(hint) and CLASS_NAME.match(value)
              and not any(k.__module__ == "builtins" for k in _classes(hint))):  # a float's 'NaN' is no class name
            if resolve(value, _classes(hint)) is None:
                _refuse_unknown_class(where, value, _classes(hint))
        elif isinstance(value, Mapping) and "class_path" in value:
            _check_block(value, object, where, bases=_classes(hint))
        elif isinstance(value, Mapping) and _is_plain(kind):
            _check_value(where, value, hint)  # a mapping where a number, bool or one of some values goes
        elif (entry := _entry_class(kind)) is not None and value is not None and value is not NO_VALUE:
            _check_named(value, entry, where)  # a mapping of named settings (pipeline.models.<name>)
        elif isinstance(value, Mapping):
            default = _default(owner, name)
            if inspect.isclass(kind) and isinstance(default, kind):
                kind = type(default)  # a block without class_path configures the default's class
            elif default is None and inspect.isclass(kind) and len(subclasses(kind)) > 1:
                choices = sorted(c.__name__ for c in subclasses(kind) if c is not kind and not inspect.isabstract(c))
                raise RecipeError(f"{where} gives settings but no class_path, and {name} has no class to take them by "
                                  f"default: name one ({where}.class_path: {', '.join(choices)})", where.keys)
            if inspect.isclass(kind) and not inspect.isabstract(kind) and typing.get_origin(kind) is None:
                _check_block(value, kind, where)  # a dataclass setting, or the init args of the one class it takes
        elif isinstance(value, list) and _is_plain(kind):
            _check_value(where, value, hint)
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, Mapping) and "class_path" in item:
                    _check_block(item, object, where, bases=_classes(_item_hint(hint)))
        elif value is not NO_VALUE:
            _check_value(where, value, hint)


def _check_file(name: str, hint: Any, place: _Place) -> None:
    """Check the YAML file `name` that gives the setting at `place` (of type `hint`), as jsonargparse reads
    it (relative to the file that names it); a refusal names that file's line and column."""
    path = Path(name) if place.base is None else place.base / name
    if not path.is_file():
        return  # not a file: jsonargparse says what is wrong
    content = read_config(path)
    kind = _one_kind(hint)[0]
    inner = _Place((), place.prefix, path.parent, (*place.outer, *place.keys))
    try:
        if "class_path" in content or "init_args" in content:
            _check_block(content, object, inner, bases=_classes(hint))
        elif inspect.isclass(kind) and not inspect.isabstract(kind):
            _check_block(content, kind, inner)
    except RecipeError as err:
        raise locate(err, path) from None


def _flow_value(text: str, place: _Place) -> Any:
    """`text`, a mapping or list in YAML's flow style (``[5, 10]``, ``{class_path: ...}``), loaded as jsonargparse
    loads it; a syntax error is one line naming the setting and the column."""
    try:
        return get_loader("yaml")(text)
    except yaml.MarkedYAMLError as err:
        mark, start = err.problem_mark, err.context_mark
        where = f" at column {mark.column + 1}" if mark is not None and mark.line == 0 else " at its end"
        context = f" ({err.context} that starts at column {start.column + 1})" if err.context and start is not None else ""
        raise RecipeError(f"{place} {text!r}: {err.problem or 'not YAML'}{where}{context}", place.keys) from None


def _takes_text(hint: Any) -> bool:
    """Whether a setting of type `hint` may be any text (a str, a path, or no annotation)."""
    if hint is Any or hint is None:
        return True
    return any(issubclass(k, (str, Path)) for k in _classes(hint))


def _default(owner: Callable[..., Any], name: str) -> Any:
    """The default value of `owner`'s parameter `name` (None when it has none)."""
    try:
        param = inspect.signature(owner).parameters.get(name)
    except (TypeError, ValueError):
        return None
    return None if param is None or param.default is inspect.Parameter.empty else param.default


def _configures_a_class(hint: Any) -> bool:
    """Whether a setting of type `hint` is a class's configuration (which may be given as a file), not text."""
    kinds = _classes(hint)
    return bool(kinds) and not any(issubclass(k, (str, Path)) for k in kinds)


def _is_plain(kind: Any) -> bool:
    """A type whose values are plain (a number, a bool or a Literal's value): never a mapping or a list."""
    return kind in (int, float, bool) or typing.get_origin(kind) is Literal


def _check_named(value: Any, owner: type, place: _Place) -> None:
    """Check a mapping of names to `owner`'s settings (``pipeline.models``: name -> `ModelRetrieval`), each entry
    as a block of `owner`; a list or a plain value in its place, or in an entry's, is refused in one line."""
    fields = ", ".join(parameters(owner)[0])
    if not isinstance(value, Mapping):
        raise RecipeError(f"{place}: expected a mapping of names to {owner.__name__} settings ({fields}), got {value!r}",
                          place.keys)
    for name, settings in value.items():
        where = place.below(str(name))
        if not isinstance(settings, Mapping):
            raise RecipeError(f"{where}: expected {owner.__name__}'s settings as a mapping ({fields}), got {settings!r}",
                              where.keys)
        _check_block(settings, owner, where)


def _entry_class(kind: Any) -> type | None:
    """The class of a ``dict[str, C]`` type's values (``dict[str, ModelRetrieval]`` -> ModelRetrieval), else None
    (a dict of numbers, text or mappings: nothing to check a key against)."""
    args = typing.get_args(kind) if typing.get_origin(kind) is dict else ()
    value = args[1] if len(args) == 2 else None
    plain = not inspect.isclass(value) or value.__module__ == "builtins" or issubclass(value, Path)
    return None if plain or typing.get_origin(value) is not None or inspect.isabstract(value) else value


def _item_hint(hint: Any) -> Any:
    """The item type of a list type (``list[Callback] | None`` -> Callback), else `hint`."""
    kind = _one_kind(hint)[0]
    args = typing.get_args(kind) if typing.get_origin(kind) in (list, tuple) else ()
    return args[0] if args else hint


def _classes(hint: Any) -> tuple[type, ...]:
    """The classes that `hint` takes (the members of a union; none for a Literal or a generic)."""
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    return tuple(a for a in args if inspect.isclass(a) and typing.get_origin(a) is None and a is not type(None))


def _check_value(place: _Place, value: Any, hint: Any) -> None:
    """Refuse a value that a plain setting's type cannot take: an int, float or bool (or null where the
    type is optional), one of a Literal's values, a list (where one value is given); other types are left
    to jsonargparse. A text value (a flag's) is read as jsonargparse reads it (``null``, ``true``, numbers;
    ``nan`` and ``inf`` are no float)."""
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
    elif kind is int:  # a YAML float (64.7, 20.0) is not one: jsonargparse refuses it in a summary of the whole block
        ok = (isinstance(value, int) and not isinstance(value, bool)) or _number(text, kind)
    elif kind is float:
        ok = (isinstance(value, (int, float)) and not isinstance(value, bool)) or (
            _number(text, kind) and math.isfinite(float(text)))  # jsonargparse reads no 'nan' or 'inf'
    elif typing.get_origin(kind) is list and not isinstance(value, (list, tuple)):
        one = f"{place} '[{value}]'" if place.prefix else f"{place}: [{value}]"
        raise RecipeError(f"{place}: expected a list, got {value!r}: give a list of one, {one}", place.keys)
    else:
        return
    if not ok:
        name = "one of " + ", ".join(map(repr, typing.get_args(kind))) if typing.get_origin(kind) is Literal else kind.__name__
        raise RecipeError(f"{place}: expected {name}{' or null' if optional else ''}, got {value!r}", place.keys)


def _one_kind(hint: Any) -> tuple[Any, bool]:
    """The one type `hint` takes besides None (None when it takes several; one Literal of all their values
    when they are Literals, as Lightning's ``precision``), and whether it takes None."""
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    kinds = [a for a in args if a is not type(None)]
    if len(kinds) > 1 and all(typing.get_origin(k) is Literal for k in kinds):
        kinds = [Literal[tuple(v for k in kinds for v in typing.get_args(k))]]
    return (kinds[0] if len(kinds) == 1 else None), type(None) in args


def _number(text: str | None, kind: type) -> bool:
    try:
        kind(text) if text is not None else None
    except ValueError:
        return False
    return text is not None


def _refuse(place: _Place, option: str, valid: list[str], owner: Callable[..., Any]) -> typing.NoReturn:
    name = getattr(owner, "__name__", str(owner))
    close = difflib.get_close_matches(option, valid, n=1, cutoff=CLOSE)
    where = f"unknown key {place} ({name} has no option {option!r})"
    inner = setting_below(owner, option)
    if inner is not None:  # a key one level too high (model.lr for model.optimization.lr): before a misspelling
        raise RecipeError(f"{where}; it is an option of {name}'s {inner}: did you mean "
                          f"{place._replace(keys=(*place.keys[:-1], inner, option))}?", place.keys)
    if close:
        raise RecipeError(f"{where}; did you mean {place._replace(keys=(*place.keys[:-1], close[0]))}?", place.keys)
    raise RecipeError(f"{where}; its options are {', '.join(valid[:24])}", place.keys)


def setting_below(owner: Callable[..., Any], option: str) -> str | None:
    """The setting of `owner` whose own class (a dataclass setting such as ``optimization``, or the class of its
    default) takes `option`; None when none does."""
    for name, hint in parameters(owner)[0].items():
        kind, default = _one_kind(hint)[0], _default(owner, name)
        kind = type(default) if inspect.isclass(kind) and isinstance(default, kind) else kind
        if (inspect.isclass(kind) and not inspect.isabstract(kind) and typing.get_origin(kind) is None
                and kind.__module__.startswith("sessrec") and option in parameters(kind)[0]):
            return name
    return None


def _refuse_unknown_class(place: _Place, class_path: str, bases: tuple[type, ...]) -> None:
    """Refuse a class name that names no class of `bases` in one line (`unknown_class`)."""
    wrong = unknown_class(class_path, bases)
    if wrong is not None:
        raise RecipeError(f"{place}: {wrong}", place.keys)
