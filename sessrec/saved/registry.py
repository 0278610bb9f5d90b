"""Constructor configs: what rebuilds a network without the recipe that built it.

A saved model (a Lightning checkpoint's hyper-parameters, a model directory's ``config.json``)
must say how to construct every part of it, the encoder included, in a form that is plain data:
JSON-able values and ``{"class_path": ..., "init_args": {...}}`` for objects, the layout of
LightningCLI recipes. `Configurable` records the arguments a module was built with;
`config_of` turns an object (a `Configurable` module, a dataclass, or plain values) into that
form, and `instantiate` turns it back, building only classes of this library.

Example:
    >>> from sessrec.models import GRU4RecEncoder
    >>> config = config_of(GRU4RecEncoder(d_model=8))
    >>> config["class_path"], config["init_args"]["d_model"]
    ('sessrec.models.gru4rec.GRU4RecEncoder', 8)
    >>> type(instantiate(config)).__name__
    'GRU4RecEncoder'
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
from typing import Any

LIBRARY = "sessrec."


class Configurable:
    """Mixin that records the arguments each instance was constructed with (read by `config_of`).

    The outermost ``__init__`` of the instance's class records them (defaults filled in), so a
    subclass that calls its parent's ``__init__`` with other values still records its own.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is None:
            return
        signature = inspect.signature(init)

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


def instantiate(config: Any) -> Any:
    """Build the objects a `config_of` result describes (only classes of this library)."""
    if isinstance(config, list):
        return [instantiate(v) for v in config]
    if not isinstance(config, dict):
        return config
    if "class_path" not in config:
        return {k: instantiate(v) for k, v in config.items()}
    path = str(config["class_path"])
    if not path.startswith(LIBRARY):
        raise ValueError(f"class_path {path!r} is outside the sessrec library; a saved model builds only sessrec classes")
    module, _, name = path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"class_path {path!r} does not name a class of this sessrec version") from err
    return cls(**{k: instantiate(v) for k, v in (config.get("init_args") or {}).items()})
