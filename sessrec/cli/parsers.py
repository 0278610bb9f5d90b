"""The one way sessrec builds a command's parser and reads its configuration files: jsonargparse.

Every command parses with a jsonargparse `ArgumentParser` (the Lightning commands through
LightningCLI, which is one): ``--config FILE`` (YAML) and typed flags from the signature of the
function or class the command runs, with help texts from its docstring (jsonargparse's own reading
of the ``Args:`` section). Flags are spelt as the parameters are, with underscores
(``--model_dir``). Before jsonargparse parses, sessrec reads the files (a YAML syntax error is one line
``file:line:column: problem``) and checks the keys and plain values of the flags and files against
the same signatures (`check_sources`, `sessrec.cli.errors`): a flag before a ``--config`` file that sets its key
(which the file would replace: jsonargparse reads the arguments in order) is refused, an unknown key is one line naming the
closest valid one, a value of another type one line naming the key, the type and the value, each
prefixed with the line and column of the key in its file; what jsonargparse refuses beyond that is
its own message, on one line.

`config_value` reads a key of the ``--config`` files with jsonargparse's loader (`read_config`): which command a
recipe is for (a pipeline recipe's top-level ``pipeline:``) and which model a lifecycle command
works on are read from the configuration so loaded, before the command's parser is chosen.
"""

from __future__ import annotations

from argparse import ArgumentError
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from jsonargparse import ActionConfigFile, ArgumentParser, Namespace

from sessrec.cli.errors import (
    PARSER_KEYS,
    RecipeError,
    check_arguments,
    check_in_order,
    flag_mapping,
    locate,
    one_line,
    read_config,
    union_error,
)


def command_parser(prog: str, description: str | None = None) -> ArgumentParser:
    """A parser that raises on a parse error (``exit_on_error=False``) and reads ``--config`` files."""
    parser = ArgumentParser(prog=prog, description=description, exit_on_error=False)
    parser.add_argument("--config", action=ActionConfigFile, help="a YAML file of this command's options")
    return parser


def function_command(func: Callable[..., Any], prog: str, skip: set[str] | None = None) -> ArgumentParser:
    """`command_parser` with `func`'s parameters as flags (``--name``), typed and helped by its
    signature and docstring; `skip`: parameters the command sets itself."""
    parser = command_parser(prog, (func.__doc__ or "").strip().splitlines()[0])
    parser.add_function_arguments(func, skip=skip, fail_untyped=False)
    return parser


def parse(parser: ArgumentParser, args: list[str], owner: Callable[..., Any] | None = None,
          roots: Mapping[str, Callable[..., Any] | None] | None = None, extra: tuple[str, ...] = ()) -> Namespace:
    """``parser.parse_args(args)``, after sessrec's own check of the keys and plain values of `args` and of
    its ``--config`` files: every top-level key against `owner` (with `extra`, the keys added beside it),
    the blocks of `roots` against their classes (`sessrec.cli.errors.check_in_order`).

    Raises:
        RecipeError: the first key or value refused, in one line; a value the parser refuses beyond
            those checks, with the parser's message on one line.
    """
    check_sources(args, owner, roots, extra)
    try:
        return parser.parse_args(args)
    except ArgumentError as err:
        raise RecipeError(union_error(str(err)) or one_line(err)) from err


def check_sources(args: list[str], owner: Callable[..., Any] | None = None,
                  roots: Mapping[str, Callable[..., Any] | None] | None = None, extra: tuple[str, ...] = ()) -> None:
    """sessrec's check of the ``--config`` files (each read first: a YAML syntax error is one line
    ``file:line:column: problem``) and the flags of `args`: every top-level key against `owner` (with
    `extra`, the keys added beside it), the blocks of `roots` against their classes; a refusal in a file
    names its line and column (`sessrec.cli.errors.locate`), one of a flag the flag.

    Raises:
        RecipeError: the first syntax error, key or value refused.
    """
    refuse_flags_before_files(args)
    paths = config_paths(args)
    sources, origins = [*map(read_config, paths), flag_mapping(args)], [*paths, None]
    if owner is not None:
        for source, origin in zip(sources, origins, strict=True):
            try:
                check_arguments(source, owner, "--" if origin is None else "", extra=(*extra, *(roots or {})),
                                base=origin.parent if origin is not None else None)
            except RecipeError as err:
                raise locate(err, origin) from None
    if roots:
        check_in_order(sources, roots, origins)


def refuse_flags_before_files(args: list[str]) -> None:
    """Refuse a flag of `args` followed by a ``--config`` file that sets its key, a key below it or one above it
    (a class chosen there): jsonargparse reads the arguments in order, so the file's value would replace the
    flag's, where a flag is meant to override every file.

    Raises:
        RecipeError: naming the flag, the file and the key it sets.
    """
    for i, arg in enumerate(args):
        if arg != "--config" and not arg.startswith("--config="):
            continue
        path = Path(arg.partition("=")[2] if "=" in arg else args[i + 1] if i + 1 < len(args) else "")
        file_keys = _key_paths(read_config(path))
        for flag in args[:i]:
            name = flag[2:].partition("=")[0].removesuffix("+") if flag.startswith("--") else ""
            key = tuple(part for part in name.split(".") if part != "init_args")
            if not name or key[0] in PARSER_KEYS or key[-1] == "help":
                continue
            hit = next((k for k in file_keys if k[: len(key)] == key or key[: len(k)] == k), None)
            if hit is not None:
                raise RecipeError(f"--{name} comes before --config {path}, which sets {'.'.join(hit)} and would "
                                  "override it: give the flags after the --config files")


def _key_paths(block: Mapping[str, Any], place: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The key paths of `block`'s values, without ``init_args`` (a ``class_path`` is its block's own path)."""
    found = []
    for key, value in block.items():
        here = place if key in ("init_args", "class_path") else (*place, str(key))
        found += _key_paths(value, here) if isinstance(value, Mapping) and value else [here]
    return found


def recipe_parser(prog: str = "sessrec") -> ArgumentParser:
    """The parser of a pipeline recipe: ``--config`` and the ``pipeline.*`` arguments of
    `sessrec.pipeline_training.PipelineRecipe`, typed."""
    from sessrec.pipeline_training.recipe import PipelineRecipe

    parser = command_parser(prog, "a pipeline recipe: its retrievers, filters, features, ranker and ordering")
    parser.add_class_arguments(PipelineRecipe, "pipeline", instantiate=True)
    return parser


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> Any:
    """The `sessrec.pipeline_training.PipelineRecipe` of a recipe file, with ``--pipeline.<key> value`` overrides."""
    from sessrec.pipeline_training.recipe import PipelineRecipe

    parser = recipe_parser()
    cfg = parse(parser, ["--config", str(path), *(overrides or [])], roots={"pipeline": PipelineRecipe})
    return parser.instantiate(cfg).pipeline


def config_paths(args: list[str]) -> list[Path]:
    """The files named by ``--config PATH`` or ``--config=PATH`` in `args`, in order."""
    paths = [args[i + 1] for i, arg in enumerate(args[:-1]) if arg == "--config"]
    paths += [arg.partition("=")[2] for arg in args if arg.startswith("--config=")]
    return [Path(p) for p in paths]


def config_value(args: list[str], key: str) -> Any:
    """The value `args` give `key`: its last ``--key V`` / ``--key=V`` flag, else the last ``--config``
    file with a top-level `key`; None when none gives it."""
    flags = [args[i + 1] for i, a in enumerate(args[:-1]) if a == f"--{key}"]
    flags += [a.partition("=")[2] for a in args if a.startswith(f"--{key}=")]
    if flags:
        return flags[-1]
    found = [content[key] for content in map(read_config, config_paths(args)) if key in content]
    return found[-1] if found else None


def checkpoint_refused(command: str) -> str:
    """The one line for a checkpoint given to a command that reads a trained model (only ``fit`` resumes one)."""
    return (f"sessrec {command} takes the model directory that sessrec fit writes: --model_dir runs/<name>/model "
            "(checkpoints only resume fit)")
