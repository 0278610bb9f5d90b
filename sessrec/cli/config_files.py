"""The ``--config`` files of a command line, found before a parser runs (`sessrec.cli` reads them)."""

from __future__ import annotations

from pathlib import Path


def config_paths(args: list[str]) -> list[Path]:
    """The files named by ``--config PATH`` or ``--config=PATH`` in `args`."""
    paths = [args[i + 1] for i, arg in enumerate(args[:-1]) if arg == "--config"]
    paths += [arg.partition("=")[2] for arg in args if arg.startswith("--config=")]
    return [Path(p) for p in paths]
