"""Class names a user writes in a recipe or on the command line (``class_path: FullSoftmax``,
``--model.loss sessrec.tasks.losses.SampledSoftmax``): the class each names, as jsonargparse resolves
it, and for a name of no class the line that says so with the closest class."""

from __future__ import annotations

import difflib
import inspect
import re
from importlib import import_module

CLOSE = 0.5  # difflib's ratio of a misspelt name to the one suggested (item_colum -> item_id: 0.59)
CLASS_NAME = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*$")  # a class's name, short or with its module


def resolve(class_path: str, bases: tuple[type, ...]) -> type | None:
    """The class `class_path` names: imported, or for a name without a module (``EventLogSource``) the one
    subclass of that name of `bases` (or of their own bases: a data module's), as jsonargparse resolves it."""
    if "." in class_path:
        module, _, name = class_path.rpartition(".")
        try:
            found = getattr(import_module(module), name)
        except (ImportError, AttributeError, ValueError):
            return None
        return found if inspect.isclass(found) else None
    for base in (c for b in bases for c in b.__mro__ if c is not object):
        named = {c for c in subclasses(base) if c.__name__ == class_path}
        if len(named) == 1:
            return named.pop()
    return None


def unknown_class(class_path: str, bases: tuple[type, ...]) -> str | None:
    """What is wrong with a class name that names no class of `bases` (a misspelt ``FullSoftmax``), in words
    with the closest class of theirs (of the module named, for a dotted name), or else some of them; None for a
    short name of several classes, for jsonargparse to say so."""
    module, _, name = class_path.rpartition(".")
    if not module and any(c.__name__ == name for b in bases for base in b.__mro__ if base is not object
                          for c in subclasses(base)):
        return None  # several classes of that name
    kinds = [c for b in bases for c in subclasses(b) if not inspect.isabstract(c) and not c.__name__.startswith("_")]
    if module:
        try:
            inside = vars(import_module(module))
        except ImportError:
            return f"{class_path!r} names no class: there is no module {module!r}"
        names = {n: f"{module}.{n}" for n, c in inside.items() if c in kinds}
    else:
        names = {c.__name__: c.__name__ for c in kinds if c.__module__.startswith("sessrec") or len(kinds) <= 40}
    wanted = " or ".join(b.__name__ for b in bases)
    close = difflib.get_close_matches(name, list(names), n=1, cutoff=CLOSE)
    said = f"{class_path!r} names no class of {wanted}"
    if close:
        return f"{said}; did you mean {names[close[0]]}?"
    return f"{said}; the classes are {', '.join(sorted(names.values())[:24])}"


def subclasses(base: type) -> set[type]:
    """`base` and every class below it."""
    found = {base}
    for sub in base.__subclasses__():
        found |= subclasses(sub)
    return found
