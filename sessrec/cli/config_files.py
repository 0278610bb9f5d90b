"""The ``--config`` files of a command line, read before a parser runs: which files, and their mappings.

Both the command's entry point (`sessrec.cli`) and the Lightning commands (`sessrec.cli.lightning`)
read them, so they live below both.
"""

from __future__ import annotations

from pathlib import Path

import yaml


def recipe_mapping(path: Path) -> dict:
    """A recipe file's mapping; {} for anything else (jsonargparse then says what is wrong)."""
    try:
        content = yaml.safe_load(path.read_text()) if path.is_file() else None
    except (OSError, yaml.YAMLError):
        return {}
    return content if isinstance(content, dict) else {}


def config_paths(args: list[str]) -> list[Path]:
    """The files named by ``--config PATH`` or ``--config=PATH`` in `args`."""
    paths = [args[i + 1] for i, arg in enumerate(args[:-1]) if arg == "--config"]
    paths += [arg.partition("=")[2] for arg in args if arg.startswith("--config=")]
    return [Path(p) for p in paths]
