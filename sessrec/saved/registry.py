"""Constructor configs and the registry of the classes they may build.

A saved model (a Lightning checkpoint's hyper-parameters, a model directory's ``config.json``, a
pipeline's ``pipeline.json``) says how to construct every part of it in a form that is plain data:
JSON-able values and ``{"class_path": ..., "init_args": {...}}`` for objects, the layout of
LightningCLI recipes. `Configurable` records the arguments a module was built with; `config_of`
turns an object (a `Configurable` module, a dataclass, or plain values) into that form, and
`instantiate` turns it back.

Reading a saved config never imports or runs anything it names. A class is built only if it is
in the registry: every `Configurable` subclass registers itself when its module is imported, and
`register` adds any other class. `instantiate` first resolves the whole config (every
``class_path`` against the registry, each class against the type that its place in the config
takes: the caller's `expected` at the top, the annotation of the constructor parameter below),
and constructs only when all of it resolves; otherwise one `ConfigError` line names the file, the
key path and the fix. A class written outside the library (a user's loss) loads once its module
is imported, since it registers itself on definition.

A ``class_path`` is the class's ``module.qualname``, or a public alias of it: a package prefix and
the class name (``sessrec.tasks.NextItemTask``, ``sessrec.MaskedItemModeling``) names the one
registered class of that name whose module lies under the prefix.

Examples:
    >>> from sessrec.models import GRU4RecEncoder
    >>> config = config_of(GRU4RecEncoder(d_model=8))
    >>> config["class_path"], config["init_args"]["d_model"]
    ('sessrec.models.gru4rec.GRU4RecEncoder', 8)
    >>> type(instantiate(config, expected=GRU4RecEncoder, source="example")).__name__
    'GRU4RecEncoder'
    >>> resolve("sessrec.models.GRU4RecEncoder", expected=object, source="example") is GRU4RecEncoder
    True
    >>> instantiate({"class_path": "os.system", "init_args": {"command": "true"}}, expected=object, source="x.json")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    sessrec.saved.registry.ConfigError: x.json: config: 'os.system' is not registered; import the module ...
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import math
import os
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

LIBRARY = "sessrec."
MAX_DEPTH = 32  # nesting levels of a config (a task config is 5 deep: task, init_args, encoder, init_args, value)
MAX_VALUES = 100_000  # values in one config
CLASS_KEYS = frozenset({"class_path", "init_args"})

T = TypeVar("T", bound=type)
_CLASSES: dict[str, type] = {}  # class path -> class


def register(cls: T) -> T:
    """Let saved configs build `cls` (a class decorator; `Configurable` subclasses register themselves).

    The class is registered under its path ``module.qualname``; a class defined again under the
    same path (a reloaded module) replaces the earlier one.
    """
    if not isinstance(cls, type):
        raise TypeError(f"register takes a class, got {type(cls).__name__}")
    _CLASSES[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return cls


IMPORT_VARIABLE = "SESSREC_IMPORT"  # modules of a user's own classes, comma-separated (``sessrec --import``)


def import_user_modules() -> None:
    """Import the modules that the environment variable ``SESSREC_IMPORT`` names (comma-separated; ``sessrec
    --import MODULE`` sets it): a user's own classes register themselves when their module is imported. The
    modules the user names are the only ones imported, never one a saved config names; processes started
    from this one (a server's workers, local Dask workers) inherit the variable and import them too.

    Raises:
        ValueError: a named module that cannot be imported, with the reason, in one line.
    """
    for module in filter(None, (m.strip() for m in os.environ.get(IMPORT_VARIABLE, "").split(","))):
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise ValueError(f"{IMPORT_VARIABLE}: module {module!r} cannot be imported ({err}); put its folder on "
                             "PYTHONPATH") from err


def registered() -> dict[str, type]:
    """Class path -> class of every registered class (a copy)."""
    return dict(_CLASSES)


class Configurable:
    """Mixin that records the arguments each instance was constructed with (read by `config_of`), and
    registers each subclass on definition, so that a saved config may build it. A subclass whose
    ``__init__`` takes ``*args`` or positional-only arguments is refused there (a TypeError): a config
    names every argument.

    The outermost ``__init__`` of the instance's class records them (defaults filled in), so a
    subclass that calls its parent's ``__init__`` with other values still records its own.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is None:
            register(cls)
            return
        signature = inspect.signature(init)
        for param in list(signature.parameters.values())[1:]:  # after self
            if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.POSITIONAL_ONLY):
                named = f"*{param.name}" if param.kind is inspect.Parameter.VAR_POSITIONAL else param.name
                raise TypeError(f"{cls.__qualname__}.__init__ takes {named}, which a config cannot name: a Configurable "
                                "is rebuilt from its arguments by name; make each a keyword argument")
        register(cls)

        @functools.wraps(init)
        def recording_init(self: Any, *args: Any, **kw: Any) -> None:
            if "_init_args" not in self.__dict__:
                bound = signature.bind(self, *args, **kw)
                bound.apply_defaults()
                recorded = dict(list(bound.arguments.items())[1:])  # without self
                for name, param in signature.parameters.items():
                    if param.kind is inspect.Parameter.VAR_KEYWORD:
                        recorded.update(recorded.pop(name, {}))
                self.__dict__["_init_args"] = recorded
            init(self, *args, **kw)

        cls.__init__ = recording_init  # type: ignore[method-assign]


def class_path(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def config_of(value: Any) -> Any:
    """`value` as plain data: objects become ``{"class_path", "init_args"}``, containers recurse."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if type(value).__module__ == "numpy" and hasattr(value, "tolist"):  # a numpy scalar or array
        return config_of(value.tolist())
    if isinstance(value, (list, tuple)):
        return [config_of(v) for v in value]
    if isinstance(value, dict):
        return {str(k): config_of(v) for k, v in value.items()}
    if "_init_args" in getattr(value, "__dict__", {}):
        return {"class_path": class_path(value), "init_args": config_of(value.__dict__["_init_args"])}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.init}
        return {"class_path": class_path(value), "init_args": config_of(fields)}
    raise TypeError(
        f"cannot record a {type(value).__name__} in a model config: give it the Configurable mixin or make it a dataclass"
    )


def check_integers(values: Mapping[str, Any], what: str = "", minimum: int = 1) -> None:
    """Refuse a config's count settings in one line, ``<what><name> must be an integer >= <minimum>, got
    <value>``, for the first of `values` that is not an int (a bool is not one) of at least `minimum`."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"{what}{name} must be an integer >= {minimum}, got {value!r}")


def check_switches(values: Mapping[str, Any], what: str = "") -> None:
    """Refuse a config's on/off settings in one line, ``<what><name> must be true or false, got <value>``, for the
    first of `values` that is not a bool (read by its truth, the text 'false' would switch the setting on)."""
    for name, value in values.items():
        if not isinstance(value, bool):
            raise ValueError(f"{what}{name} must be true or false, got {value!r}")


def check_probabilities(values: Mapping[str, Any], what: str = "", zero: bool = True, one: bool = False) -> None:
    """Refuse a config's probability settings in one line, ``<what><name> must be a probability in [0, 1),
    got <value>``, for the first of `values` that is not a number (a bool is not one) in the interval;
    `zero`, `one`: whether 0 and 1 belong to it (a dropout of 1 zeroes everything: nothing trains)."""
    for name, value in values.items():
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not ((0.0 <= value) if zero else (0.0 < value)) or not ((value <= 1.0) if one else (value < 1.0)):
            interval = f"{'[' if zero else '('}0, 1{']' if one else ')'}"
            raise ValueError(f"{what}{name} must be a probability in {interval}, got {value!r}")


class ConfigError(ValueError):
    """A saved config that does not resolve: one line ``<source>: <key path>: <problem>``."""

    def __init__(self, source: str, key: str, problem: str) -> None:
        self.source, self.key, self.problem = source, key, problem
        super().__init__(f"{source}: {key}: {problem}" if key else f"{source}: {problem}")

    def within(self, source: str, prefix: str) -> ConfigError:
        """The same problem, located in `source` under the key path `prefix`."""
        return ConfigError(source, f"{prefix}.{self.key}" if self.key else prefix, self.problem)


def check_saveable(config: Any, source: str, key: str = "") -> None:
    """Refuse to save a config that names a class defined in ``__main__`` (the script or notebook being
    run): a saved config names a class by its module, and no other process can import that one.

    Raises:
        ConfigError: the first such class, with its key path, in one line.
    """
    if isinstance(config, Mapping):
        name = config.get("class_path")
        if isinstance(name, str) and name.startswith("__main__."):
            raise ConfigError(source, key or "config", (
                f"{name.partition('.')[2]} is defined in the script being run (__main__), which no other process can "
                "import to read the saved model; define it in a module and import it from there (the sessrec command: "
                "--import MODULE)"))
        for k, v in config.items():
            check_saveable(v, source, _child(key, k) if key else str(k))
    elif isinstance(config, (list, tuple)):
        for i, v in enumerate(config):
            check_saveable(v, source, f"{key}[{i}]")


# -- resolution ------------------------------------------------------------------------------------
NOTHING = object()  # the annotation of a place that holds plain data only: no class may be built there


@dataclasses.dataclass
class _Build:
    """A resolved class config: the class, its resolved arguments, where it was found."""

    cls: type
    kwargs: dict[str, Any]
    key: str


def resolve(name: Any, expected: Any, source: str, key: str = "") -> type:
    """The registered class that `name` (a class path or an alias) names, checked against `expected`.

    Args:
        name: ``module.qualname``, an alias (``package.ClassName``) or a bare class name.
        expected: the class, tuple of classes or annotation the class must satisfy (`object`: any).
        source: the file named in errors.
        key: the key path of `name` in that file.

    Raises:
        ConfigError: `name` is not a string, names no registered class, several, or a class that
            is not an `expected`.
    """
    if not isinstance(name, str):
        raise ConfigError(source, key, f"class_path must be a string, got {type(name).__name__}")
    allowed = _classes(_annotation(expected))
    cls = _CLASSES.get(name) or _alias(name, source, key)
    if cls is None and os.environ.get(IMPORT_VARIABLE):
        import_user_modules()  # the user's own classes, named by the user
        cls = _CLASSES.get(name) or _alias(name, source, key)
    if cls is None:
        raise ConfigError(source, key, _unregistered(name, allowed))
    if allowed is not None and not issubclass(cls, allowed):
        raise ConfigError(source, key, f"{name!r} is a registered class, but not a {_names(allowed)}, which this key takes")
    return cls


def split_config(config: Any, source: str, key: str) -> tuple[Any, Any]:
    """The ``class_path`` and ``init_args`` of a class config; one `ConfigError` line for anything else."""
    if not (isinstance(config, Mapping) and "class_path" in config):
        raise ConfigError(source, key, f"expected a {{class_path, init_args}} mapping, got {type(config).__name__}")
    extra = sorted(map(str, config.keys() - CLASS_KEYS))
    if extra:
        raise ConfigError(source, key, f"a class config holds only class_path and init_args, not {extra}")
    return config["class_path"], config.get("init_args")


def instantiate(config: Any, expected: Any, source: str, key: str = "config") -> Any:
    """Build the object a ``{"class_path", "init_args"}`` config describes, after resolving all of it.

    Args:
        config: the class config (what `config_of` writes).
        expected: the class, tuple of classes or annotation the built object must be.
        source: the file the config was read from (named in errors).
        key: the key path of `config` in that file.

    Raises:
        ConfigError: any part of the config does not resolve (nothing is constructed then), or a
            constructor refuses its arguments.
    """
    split_config(config, source, key)
    return _construct(_Resolver(source).value(config, _annotation(expected), key, 0), source)


def construct(cls: type, init_args: Any, source: str, key: str = "init_args") -> Any:
    """``cls(**init_args)`` with every class config among the arguments resolved first, then built.

    `cls` was resolved by the caller (`resolve`); `key` is the key path of `init_args`.
    """
    node = _Resolver(source).arguments(cls, init_args, key, 1)  # the depth of a class config's init_args
    return _construct(_Build(cls, node, key), source)


class _Resolver:
    """Walks one config (at most `MAX_DEPTH` levels, `MAX_VALUES` values) into `_Build` nodes and plain values."""

    def __init__(self, source: str) -> None:
        self.source, self.values = source, 0

    def value(self, value: Any, annotation: Any, key: str, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise ConfigError(self.source, key, f"nested deeper than {MAX_DEPTH} levels")
        self.values += 1
        if self.values > MAX_VALUES:
            raise ConfigError(self.source, key, f"the config holds more than {MAX_VALUES} values")
        if isinstance(value, Mapping) and "class_path" in value:
            return self.class_config(value, annotation, key, depth)
        if isinstance(value, Mapping):
            inner = _inner(annotation, "mapping")
            return {k: self.value(v, inner, _child(key, k), depth + 1) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            inner = _inner(annotation, "sequence")
            items = [self.value(v, inner, f"{key}[{i}]", depth + 1) for i, v in enumerate(value)]
            return tuple(items) if isinstance(value, tuple) else items
        return value

    def class_config(self, config: Mapping, annotation: Any, key: str, depth: int) -> _Build:
        path, init_args = split_config(config, self.source, key)
        if annotation is NOTHING:
            raise ConfigError(self.source, key, f"{path!r}: this key holds plain values, not a class")
        cls = resolve(path, annotation, self.source, key)
        return _Build(cls, self.arguments(cls, init_args, f"{key}.init_args", depth + 1), key)

    def arguments(self, cls: type, init_args: Any, key: str, depth: int) -> dict[str, Any]:
        if init_args is None:
            init_args = {}
        if not isinstance(init_args, Mapping):
            raise ConfigError(self.source, key, f"the arguments of {cls.__name__} must be a mapping, got {type(init_args).__name__}")
        params, open_ended = parameters(cls)
        out = {}
        for name, value in init_args.items():
            if not isinstance(name, str) or (name not in params and not open_ended):
                raise ConfigError(self.source, _child(key, name), f"{cls.__name__} takes no argument {name!r}")
            out[name] = self.value(value, params.get(name, Any), _child(key, name), depth + 1)
        return out


def _construct(node: Any, source: str) -> Any:
    if isinstance(node, _Build):
        kwargs = {k: _construct(v, source) for k, v in node.kwargs.items()}
        try:
            return node.cls(**kwargs)
        except ConfigError:
            raise
        except (TypeError, ValueError) as err:
            problem = " ".join(str(err).split())
            raise ConfigError(source, node.key, f"the saved arguments do not build a {node.cls.__name__} ({problem})") from err
    if isinstance(node, dict):
        return {k: _construct(v, source) for k, v in node.items()}
    if isinstance(node, list):
        return [_construct(v, source) for v in node]
    if isinstance(node, tuple):
        return tuple(_construct(v, source) for v in node)
    return node


# -- the registry's side: names, annotations -------------------------------------------------------
def _alias(name: str, source: str, key: str) -> type | None:
    """The one registered class named by ``prefix.ClassName`` (its module under `prefix`), or a bare name."""
    prefix, _, tail = name.rpartition(".")
    found = {
        c for c in _CLASSES.values()
        if c.__qualname__ == tail and (not prefix or c.__module__ == prefix or c.__module__.startswith(f"{prefix}."))
    }
    if len(found) > 1:
        paths = sorted(f"{c.__module__}.{c.__qualname__}" for c in found)
        raise ConfigError(source, key, f"{name!r} names {len(found)} registered classes {paths}; give the full class path")
    return found.pop() if found else None


def _unregistered(name: str, allowed: tuple[type, ...] | None) -> str:
    if name.startswith(LIBRARY) or "." not in name:
        known = sorted(p for p, c in _CLASSES.items() if allowed is None or issubclass(c, allowed))
        shown = ", ".join(known[:12]) + (", ..." if len(known) > 12 else "")
        return f"{name!r} is not a registered class; a saved config builds only registered classes ({shown})"
    bases = [c.__name__ for c in allowed or () if issubclass(c, Configurable)] or ["Configurable"]
    return (
        f"{name!r} is not registered; import the module that defines it (subclasses of {' or '.join(bases)} "
        f"register themselves; the sessrec command: --import MODULE) or call "
        f"sessrec.saved.registry.register({name.rpartition('.')[2]}) before loading"
    )


def _names(classes: tuple[type, ...]) -> str:
    return " or ".join(c.__name__ for c in classes) or "plain value"


def _child(key: str, name: Any) -> str:
    part = name if isinstance(name, str) and name.isidentifier() else f"[{name!r}]"
    return f"{key}.{part}" if not part.startswith("[") else f"{key}{part}"


def _annotation(expected: Any) -> Any:
    """A caller's `expected` (a class, a tuple of classes, an annotation) as an annotation."""
    if isinstance(expected, tuple):
        return typing.Union[expected] if expected else NOTHING  # noqa: UP007 - a union of a runtime tuple
    return expected


def _members(annotation: Any) -> tuple[Any, ...]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _classes(annotation: Any) -> tuple[type, ...] | None:
    """The classes a class config at a place of this annotation may build (None: any registered class)."""
    found: list[type] = []
    for member in _members(annotation):
        if member is NOTHING or member is type(None) or typing.get_origin(member) is typing.Literal:
            continue
        if member is Any or member is object or isinstance(member, (str, typing.ForwardRef)):
            return None  # unannotated, or an annotation that did not evaluate
        if isinstance(member, TypeVar):
            if member.__bound__ is None:
                return None
            member = member.__bound__
        origin = typing.get_origin(member)
        if isinstance(origin or member, type):
            found.append(origin or member)
    return tuple(found)


def _inner(annotation: Any, kind: str) -> Any:
    """The annotation of the values inside a mapping or a sequence given at a place of `annotation`.

    ``dict[str, X]`` / ``list[X]`` hold X's; `Any` holds anything; a bare ``dict``, ``list`` or any
    other annotation holds plain values only.
    """
    inner = []
    for member in _members(annotation):
        if member is Any or member is object or isinstance(member, (str, typing.ForwardRef)):
            return Any
        origin, args = typing.get_origin(member), [a for a in typing.get_args(member) if a is not Ellipsis]
        if kind == "mapping" and isinstance(origin, type) and issubclass(origin, Mapping) and len(args) == 2:
            inner.append(args[1])
        elif kind == "sequence" and isinstance(origin, type) and issubclass(origin, Sequence) and args:
            inner.extend(args)
    return typing.Union[tuple(inner)] if inner else NOTHING  # noqa: UP007


@functools.cache
def parameters(owner: Callable[..., Any]) -> tuple[dict[str, Any], bool]:
    """(keyword name -> annotation, whether ``**kwargs`` takes any other name) of a function, or of a
    class's ``__init__`` (without self); an annotation that does not evaluate is `Any`, and a callable
    without a readable signature takes any name."""
    function = owner.__init__ if isinstance(owner, type) else owner
    if function is object.__init__:  # no constructor of its own: no arguments (not object's *args, **kwargs)
        return {}, False
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return {}, True
    hints = _hints(function)
    params = {}
    open_ended = False
    for i, (name, param) in enumerate(signature.parameters.items()):
        if (i == 0 and function is not owner) or param.kind in (param.VAR_POSITIONAL, param.POSITIONAL_ONLY):
            continue  # self, or no keyword
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            open_ended = True
            continue
        params[name] = hints.get(name, Any)
    return params, open_ended


def _hints(function: Any) -> dict[str, Any]:
    """The evaluated annotations of `function`; one that does not evaluate counts as `Any`."""
    try:
        return typing.get_type_hints(function)
    except Exception:  # noqa: BLE001 - a name imported only for type checkers: fall back to each annotation
        unwrapped = inspect.unwrap(function)
        namespace = getattr(unwrapped, "__globals__", {})
        hints = {}
        for name, annotation in getattr(unwrapped, "__annotations__", {}).items():
            try:
                hints[name] = eval(annotation, namespace) if isinstance(annotation, str) else annotation
            except Exception:  # noqa: BLE001
                hints[name] = Any
        return hints


def check_numbers(owner: str, values: Mapping[str, tuple[float, str]]) -> None:
    """Refuse in one line the first of `values` (name -> (value, rule)) outside its rule: ``positive``
    (finite, > 0), ``non-negative`` (finite, >= 0), ``fraction`` (0 < value < 1), ``share`` (0 < value <= 1)
    or ``rate`` (0 <= value < 1).

    Examples:
        >>> check_numbers("GBDTScorer", {"learning_rate": (0.0, "positive")})
        Traceback (most recent call last):
        ...
        ValueError: GBDTScorer learning_rate must be a finite number > 0, got 0.0
    """
    rules = {"positive": ("a finite number > 0", lambda v: 0 < v < math.inf),
             "non-negative": ("a finite number >= 0", lambda v: 0 <= v < math.inf),
             "fraction": ("a number in (0, 1)", lambda v: 0 < v < 1), "share": ("a number in (0, 1]", lambda v: 0 < v <= 1),
             "rate": ("a number in [0, 1)", lambda v: 0 <= v < 1)}
    for name, (value, rule) in values.items():
        text, ok = rules[rule]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
            raise ValueError(f"{owner} {name} must be {text}, got {value!r}")
