"""``sessrec`` command line.

    sessrec fit --config <recipe> ...                            train a task recipe, or fit a pipeline recipe's ranker
    sessrec validate --config <data recipe> --model_dir M        validation metrics of a trained model (runs/<name>/model)
    sessrec test --config <recipe> [--model_dir M]               test metrics of a trained model, or of a pipeline end to end
    sessrec predict --config <data recipe> --model_dir M ...     top-k items for sessions of --data.predict_path (parquet)
    sessrec recommend --config <pipeline recipe> --input F ...   a pipeline's top-k for a file of sessions (--output)
    sessrec serve --model-dir D                                  HTTP recommendations (`sessrec.deploy.server`)
    sessrec export --model_dir M --format ...                    ONNX, TorchScript or a Triton repository
    sessrec retrain --config <retrain recipe> ...                one warm-start turn with its quality gate
    sessrec rollback --model-dir D [--to VERSION]                an earlier version of D current again

Options of every command:

    --traceback (or SESSREC_TRACEBACK=1)          the full trace of an error, and jsonargparse's full report
    --show-warnings (or SESSREC_SHOW_WARNINGS=1)  third-party notices that are hidden by default: Lightning's
                                                  logger tips, wandb's banner, known deprecation warnings

Only the Lightning commands, the pipeline's ``fit`` and ``retrain`` import the training stack
(Lightning, jsonargparse's LightningCLI); ``serve``, ``export`` of a model directory, ``recommend``
and ``rollback`` start without it. A user error is one line on stderr and exit status 1
(``--traceback`` or ``SESSREC_TRACEBACK=1`` for the trace).
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import os
import sys
import typing
import warnings
from pathlib import Path
from typing import Any

import yaml

from sessrec.cli.errors import parse_args
from sessrec.saved.checkpoint import data_state

PIPELINE_COMMANDS = ("fit", "test", "recommend")
LIGHTNING_COMMANDS = ("fit", "validate", "test", "predict")


def _recipe(path: Path) -> dict:
    """A recipe file's mapping; {} for anything else (jsonargparse then says what is wrong)."""
    try:
        content = yaml.safe_load(path.read_text()) if path.is_file() else None
    except (OSError, yaml.YAMLError):
        return {}
    return content if isinstance(content, dict) else {}


def _config_paths(args: list[str]) -> list[Path]:
    """The files named by ``--config PATH`` or ``--config=PATH`` in `args`."""
    paths = [args[i + 1] for i, arg in enumerate(args[:-1]) if arg == "--config"]
    paths += [arg.partition("=")[2] for arg in args if arg.startswith("--config=")]
    return [Path(p) for p in paths]


def pipeline_recipe(args: list[str]) -> bool:
    """True when a ``--config`` of `args` is a pipeline recipe (a top-level ``pipeline:`` block)."""
    for path in _config_paths(args):
        content = yaml.safe_load(path.read_text()) if path.is_file() else None
        if isinstance(content, dict) and "pipeline" in content:
            return True
    return False


def pipeline_cli(args: list[str]) -> object:
    """``sessrec fit|test|recommend`` on a pipeline recipe; returns what the subcommand returns."""
    from sessrec.pipeline.offline import recommend_file
    from sessrec.pipeline.recipe import recipe_parser

    command, rest = args[0], args[1:]
    parser = recipe_parser(prog=f"sessrec {command}")
    if command == "recommend":
        parser.add_argument("--input", type=str, required=True, help="sessions (parquet/CSV): a list column or one row per event")
        parser.add_argument("--output", type=str, required=True, help="a .parquet file (session_id, item_ids, scores) or a .csv file (session_id, rank, item_id, score)")
        parser.add_argument("--k", type=int, default=20, help="recommendations per session")
        parser.add_argument("--batch_size", type=int, default=1024, help="sessions per batch (and per part file)")
        parser.add_argument("--overwrite", type=bool, default=False, help="replace an existing output")
        parser.add_argument("--now", type=float | None, default=None,
                            help="seconds since the epoch at which allow/deny windows hold, for every session "
                                 "(default: each session's last event with a time column, else the time the run starts)")
    refuse_checkpoint_models(_config_paths(rest))
    cfg = parse_args(parser, rest)
    recipe = parser.instantiate(cfg).pipeline
    if command == "fit":
        return recipe.fit()
    if command == "test":
        return recipe.test()
    return recommend_file(
        recipe.output, cfg.input, cfg.output, k=cfg.k, batch_size=cfg.batch_size,
        schema=recipe.data.predict_schema, overwrite=cfg.overwrite, now=cfg.now,
    )


def refuse_checkpoint_models(paths: list[Path]) -> None:
    """One line for a pipeline recipe whose session model is named by its training recipe and checkpoint."""
    for path in paths:
        pipeline = _recipe(path).get("pipeline")
        models = pipeline.get("models") if isinstance(pipeline, dict) else None
        for name, spec in (models.items() if isinstance(models, dict) else ()):
            if isinstance(spec, dict) and spec.keys() & {"recipe", "checkpoint"}:
                raise ValueError(
                    f"{path}: pipeline.models.{name}: a pipeline takes the model directory that sessrec fit writes, "
                    "not a recipe and a checkpoint: model_dir: runs/<name>/model"
                )


def _recipe_error(err: BaseException) -> BaseException:
    """The error a recipe's own class raised, beneath jsonargparse's wrapping of it.

    jsonargparse re-raises a constructor's error (``from`` it) inside a multi-line summary of
    every type it tried (``Does not validate against any of the Union subtypes ...``); the
    constructor's message is the one that names the file, the column and the value.
    """
    while err.__cause__ is not None and _raised_in(err, "jsonargparse"):
        err = err.__cause__
    return err


def _raised_in(err: BaseException, package: str) -> bool:
    """True when the innermost frame of `err`'s traceback is code of `package`."""
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_globals.get("__name__", "").partition(".")[0] == package


def retrain_cli(args: list[str]) -> object:
    """``sessrec retrain``: one warm-start turn with its quality gate, for the session model or the DLRM
    that ``--model_dir`` holds (`sessrec.deploy.retrain.retrain` / `retrain_dlrm`)."""
    from jsonargparse import ActionConfigFile, ArgumentParser

    from sessrec.deploy.retrain import retrain, retrain_dlrm, summary

    turn = retrain_dlrm if _model_kind(args) == "ClickRanker" else retrain
    parser = ArgumentParser(prog="sessrec retrain", description=turn.__doc__.splitlines()[0], exit_on_error=False)
    parser.add_argument("--config", action=ActionConfigFile)
    parser.add_function_arguments(turn)
    kwargs = parser.instantiate(parse_args(parser, args)).as_dict()
    kwargs.pop("config", None)
    decision = turn(**kwargs)
    print(f"sessrec retrain: {summary(decision)}")
    return decision


def _model_kind(args: list[str]) -> str:
    """The artifact the model directory that ``--model_dir`` (on the command line or in a ``--config``
    file) names holds, by its sections: ``SessionRecommender`` (it has an ``objective``) or
    ``ClickRanker``; "" when it cannot be read (the chosen turn then says what is wrong)."""
    from sessrec.saved.versions import resolve

    found = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--model_dir"]
    found += [a.partition("=")[2] for a in args if a.startswith("--model_dir=")]
    for path in _config_paths(args):
        content = yaml.safe_load(path.read_text()) if path.is_file() else None
        if isinstance(content, dict) and "model_dir" in content and not found:
            found.append(str(content["model_dir"]))
    try:
        config = resolve(found[-1]) / "config.json" if found else None  # a versioned directory: its current version's
        sections = json.loads(config.read_text()) if config is not None else None
        if not isinstance(sections, dict) or "model" not in sections:
            return ""
        return "SessionRecommender" if "objective" in sections else "ClickRanker"
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def serve_cli(args: list[str]) -> None:
    """``sessrec serve --model-dir <dir>``: HTTP recommendations from a model or pipeline directory."""
    from sessrec.deploy.server import serve

    serve(**vars(function_parser(serve, "sessrec serve").parse_args(args)))


def export_cli(args: list[str]) -> object:
    """``sessrec export --model_dir runs/<name>/model --format {onnx,torchscript,triton} --out <dir>``."""
    parser = argparse.ArgumentParser(prog="sessrec export", description="export a session model or DLRM for serving")
    parser.add_argument("--model_dir", type=str, required=True, help="the model directory that sessrec fit writes (runs/<name>/model)")
    parser.add_argument("--format", choices=["onnx", "torchscript", "triton"], default="onnx",
                        help="onnx / torchscript: one model file; triton: a Triton model repository (ONNX backend)")
    parser.add_argument("--out", type=str, required=True, help="output directory")
    parser.add_argument("--top_k", type=_optional(int), default=20,
                        help="session models also output the K best items (null: scores only)")
    parser.add_argument("--name", type=str, default="sessrec", help="the model's name in a Triton repository")
    parser.add_argument("--max_batch_size", type=int, default=64, help="Triton's dynamic batching: largest batch")
    cfg = parser.parse_args(args)
    from sessrec.deploy.export import export_model_dir

    if cfg.format == "triton":
        from sessrec.artifacts import load_artifact
        from sessrec.deploy.triton import triton_repository

        written = triton_repository(load_artifact(cfg.model_dir), cfg.out, cfg.name, cfg.max_batch_size, top_k=cfg.top_k)
    else:
        written = export_model_dir(cfg.model_dir, cfg.out, cfg.format, top_k=cfg.top_k)
    print(f"sessrec export: wrote {written} (checked against PyTorch on a batch of another size and length)")
    return written


def rollback_cli(args: list[str]) -> str:
    """``sessrec rollback --model-dir D [--to VERSION]``: make an earlier version of a versioned model or
    pipeline directory current again (default: the one current before this one); logged like a promotion."""
    from sessrec.saved.versions import VersionedDirectory

    parser = argparse.ArgumentParser(prog="sessrec rollback", description="make an earlier version current again")
    parser.add_argument("--model_dir", "--model-dir", dest="model_dir", required=True,
                        help="a model or pipeline directory with versions")
    parser.add_argument("--to", default=None, help="the version to make current (e.g. v000003); default: the previous one")
    cfg = parser.parse_args(args)
    store = VersionedDirectory(cfg.model_dir)
    before = store.current_version()
    version = store.rollback(cfg.to)
    print(f"sessrec rollback: {cfg.model_dir}: {version} is current (was {before}); a server following it reloads")
    return version


def function_parser(func: Any, prog: str) -> argparse.ArgumentParser:
    """A command-line parser of `func`'s keyword arguments (``--name`` and ``--name-with-dashes``), typed by
    its annotations (int, float, str, bool, paths), helped by its docstring's ``Args:``: the lifecycle
    commands parse their flags without jsonargparse (which the serving path does not import)."""
    hints = typing.get_type_hints(func)
    parser = argparse.ArgumentParser(prog=prog, description=(func.__doc__ or "").strip().splitlines()[0])
    docs = _argument_docs(func.__doc__ or "")
    for name, param in inspect.signature(func).parameters.items():
        kind = hints.get(name, str)
        convert = {bool: _boolean, int: int, float: float}.get(kind, str)
        flags = [f"--{name}"] + ([f"--{name.replace('_', '-')}"] if "_" in name else [])
        required = param.default is inspect.Parameter.empty
        parser.add_argument(*flags, dest=name, type=convert, required=required,
                            default=None if required else param.default, help=docs.get(name))
    return parser


def _argument_docs(doc: str) -> dict[str, str]:
    """``name: text`` entries of a Google-style ``Args:`` section (continuation lines joined)."""
    found: dict[str, str] = {}
    name = None
    for line in doc.partition("Args:")[2].splitlines():
        head, sep, text = line.strip().partition(": ")
        if sep and head.isidentifier() and line.startswith(" " * 8) and not line.startswith(" " * 12):
            name, found[head] = head, text
        elif name and line.strip() and not line.strip().endswith(":"):
            found[name] += " " + line.strip()
        elif not line.strip() or line.strip().endswith(":"):
            name = None if line.strip().endswith(":") else name
    return found


def _boolean(text: str) -> bool:
    value = text.strip().lower()
    if value not in ("true", "false", "1", "0", "yes", "no"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return value in ("true", "1", "yes")


def _optional(convert: Any) -> Any:
    def parse(text: str) -> Any:
        return None if text.strip().lower() in ("null", "none") else convert(text)

    parse.__name__ = convert.__name__
    return parse


COMMANDS = {"export": export_cli, "retrain": retrain_cli, "rollback": rollback_cli, "serve": serve_cli}
USER_ERRORS = (ValueError, TypeError, RuntimeError, OSError, KeyError)  # OSError: missing or existing files
LIGHTNING = ("lightning", "lightning_fabric", "pytorch_lightning")
VERBOSE_FLAGS = ("--traceback", "--verbose")
SHOW_WARNINGS = "--show-warnings"


def is_user_error(err: BaseException) -> bool:
    """An error the user's input caused, shown as one line: `USER_ERRORS`, and Lightning's
    MisconfigurationException (a trainer setting it refuses, such as a LearningRateMonitor without a
    logger), matched by name so that the commands without the training stack never import Lightning."""
    return isinstance(err, USER_ERRORS) or any(
        c.__name__ == "MisconfigurationException" and c.__module__.partition(".")[0] in LIGHTNING for c in type(err).__mro__
    )


def run(args: list[str]) -> object:
    """Dispatch ``sessrec <command> ...``: the pipeline, lifecycle and Lightning commands."""
    command = args[0] if args else ""
    if command in ("", "-h", "--help"):
        print(_usage())
        return None
    if command in COMMANDS:
        return COMMANDS[command](args[1:])
    if command in PIPELINE_COMMANDS and pipeline_recipe(args):
        return pipeline_cli(args)
    if command == "recommend":
        raise ValueError("--config must name a pipeline recipe (a top-level 'pipeline:' block)")
    if command in ("validate", "test", "predict") and any(a.partition("=")[0] == "--ckpt_path" for a in args):
        raise ValueError(f"sessrec {command} takes the model directory that sessrec fit writes: --model_dir "
                         "runs/<name>/model (checkpoints only resume fit)")
    for i, arg in enumerate(args[:-1]):
        if arg == "--ckpt_path":  # a one-line error for an unreadable file, before LightningCLI reads its config
            data_state(args[i + 1])  # (and the data module's state, read once here for every later use)
    if command not in LIGHTNING_COMMANDS:
        raise ValueError(f"unknown command {command!r}; the commands are {', '.join(COMMAND_NAMES)} (sessrec --help)")
    from sessrec.cli.lightning import cli

    sys.argv = [sys.argv[0], *args]  # LightningCLI reads them there
    return cli()


COMMAND_NAMES = ("fit", "validate", "test", "predict", "recommend", "serve", "export", "retrain", "rollback")


def _usage() -> str:
    """The commands and the options of every command, as the module docstring lists them."""
    commands, options = __doc__.split("\n\n")[1], __doc__.split("\n\n")[3]
    return ("usage:\n" + commands + "\n\noptions of every command:\n" + options
            + "\n\n(sessrec <command> --help for a command's options)")


NOISE = ("\N{ELECTRIC LIGHT BULB} Tip:",)  # Lightning's advertisements (rank_zero_info at INFO)
NOISY_WARNINGS = (r".*LeafSpec",)  # torch's deprecation of what pytorch_lightning's _pytree still uses
RANK_ZERO_LOGGERS = ("pytorch_lightning.utilities.rank_zero", "lightning_fabric.utilities.rank_zero",
                     "lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")


class _Advertisements(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(NOISE)


def quiet_third_parties() -> None:
    """Hide third-party notices a user cannot act on (`NOISE`, `NOISY_WARNINGS`, wandb's banner);
    sessrec's own warnings and Lightning's other messages stay."""
    os.environ.setdefault("WANDB_SILENT", "true")
    for pattern in NOISY_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    for name in RANK_ZERO_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Advertisements) for f in logger.filters):
            logger.addFilter(_Advertisements())


def main() -> None:
    """Console entry point ``sessrec``: a user error is one line (``--traceback`` or SESSREC_TRACEBACK=1 for the trace)."""
    args = sys.argv[1:]
    verbose = any(a in VERBOSE_FLAGS for a in args) or bool(os.environ.get("SESSREC_TRACEBACK"))
    if not (SHOW_WARNINGS in args or os.environ.get("SESSREC_SHOW_WARNINGS")):
        quiet_third_parties()
    args = [a for a in args if a not in (*VERBOSE_FLAGS, SHOW_WARNINGS)]
    try:
        run(args)
    except ModuleNotFoundError as err:
        extra = EXTRA_OF.get((err.name or "").partition(".")[0])
        if verbose or extra is None:
            raise
        sys.exit(f"sessrec {args[0] if args else ''}: error: this command needs the '{extra}' extra (module {err.name!r} "
                 f"is not installed): pip install 'sessrec[{extra}]' (or pip install -e '.[{extra}]' in a checkout)")
    except Exception as err:
        if verbose or not is_user_error(err):
            raise
        message = " ".join(str(_recipe_error(err)).split()) or type(err).__name__
        sys.exit(f"sessrec {args[0] if args else ''}: error: {message} (--traceback for details)")


# modules of the optional extras (pyproject.toml) -> the extra that installs them
EXTRA_OF = {
    **dict.fromkeys(("fastapi", "uvicorn", "prometheus_client", "onnx", "onnxscript", "onnxruntime"), "deploy"),
    **dict.fromkeys(("faiss", "lightgbm"), "pipeline"),
    **dict.fromkeys(("cudf", "cupy"), "gpu"),
}


def __getattr__(name: str) -> Any:
    # the LightningCLI and its runner load Lightning: only when asked for
    if name in ("cli", "SessrecCLI"):
        from sessrec.cli import lightning

        return getattr(lightning, name)
    raise AttributeError(f"module 'sessrec.cli' has no attribute {name!r}")
