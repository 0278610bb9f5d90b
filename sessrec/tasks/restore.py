"""The task classes of ``class_path`` names and their renamed settings, as the CLI reads them.

Examples:
    >>> from sessrec.tasks import NextItemTask
    >>> renamed(NextItemTask, "top_k")
    'evaluation.top_k'
    >>> task_class("NextItemTask") is NextItemTask
    True
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping

from sessrec.tasks.settings import SEPARATE


def renamed(task: type, key: str) -> str | None:
    """The key that replaces `key` among `task`'s settings (``top_k`` -> ``evaluation.top_k``), or None.

    A setting of `SEPARATE` is renamed for a task that takes its part (``evaluation``) and not the
    setting itself (`DLRMTask` keeps its own ``lr`` and ``ks``).
    """
    if key not in SEPARATE:
        return None
    part, name = SEPARATE[key]
    parameters = _parameters(task)
    return f"{part}.{name}" if part in parameters and key not in parameters else None


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
