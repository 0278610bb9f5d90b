"""``sessrec`` command line.

    sessrec fit --config <recipe> ...                            train a task recipe, or fit a pipeline recipe's ranker
    sessrec validate --config <recipe> [--model_dir M]           validation metrics of a trained model (runs/<name>/model) or a baseline
    sessrec test --config <recipe> [--model_dir M]               test metrics of a trained model, or of a pipeline end to end
    sessrec predict --config <data recipe> --model_dir M ...     top-k items for sessions of --data.predict_path (parquet or CSV)
    sessrec recommend --config <pipeline recipe> --input_path F a pipeline's top-k for a file of sessions (--output)
    sessrec prepare --config <data recipe> --out D               sessions, splits and vocabulary computed once (a prepared dataset)
    sessrec serve --model_dir D                                  HTTP recommendations (`sessrec.serving.server`)
    sessrec export --model_dir M --format ...                    ONNX, TorchScript or a Triton repository
    sessrec retrain --config <retrain recipe> ...                one warm-start turn with its quality gate
    sessrec promote --model_dir D [--version V]                  a version of D (by default its canary) current for every session
    sessrec rollback --model_dir D [--to VERSION]                an earlier version of D current again, or its canary dropped
    sessrec monitor --config <monitor recipe>                    served log + events: hit rate, drift; exit 3 on a threshold, 4 on a worse canary

Options of every command:

    --traceback (or SESSREC_TRACEBACK=1)          the full trace of an error, and jsonargparse's full report
    --show-warnings (or SESSREC_SHOW_WARNINGS=1)  third-party notices that are hidden by default: Lightning's
                                                  logger tips, wandb's banner, known deprecation warnings
    --import MODULE (or SESSREC_IMPORT=M1,M2)     import a module of your own classes (an encoder, an objective, a
                                                  loss) first, so that a model directory naming them loads; the
                                                  processes a command starts import it too

Only the Lightning commands, the pipeline commands (a pipeline recipe's data block is the Lightning
data module) and ``retrain`` import the training stack (Lightning, LightningCLI); ``serve``,
``export`` of a model directory, ``promote`` and ``rollback`` start without it. A user error is one line on stderr and exit status 1
(``--traceback`` or ``SESSREC_TRACEBACK=1`` for the trace); a YAML syntax error, or a key or value refused, in a
configuration file names the file, line and column (``recipe.yaml:4:1: ...``, `sessrec.cli.errors`).

Every command parses its flags and ``--config`` files with jsonargparse (`sessrec.cli.parsers`; the
Lightning commands with LightningCLI): flags are spelt as the parameters of the function or class the
command runs (``--model_dir``, ``--max_batch_size``), and ``sessrec <command> --help`` shows them with
the help of its docstring. Whether ``fit``, ``test`` and ``recommend`` run a pipeline is read from the
configuration: a recipe with a top-level ``pipeline:`` block is a pipeline recipe.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

# OpenMP threads that wait for work sleep instead of spinning (unless the user sets OMP_WAIT_POLICY): beside
# another job on the same cores, spinning threads take the cores the work needs. Measured on 2 cores beside a
# 2-thread training: the pipeline's DLRM ranker fit 62.6 -> 32.8 s, the same alone (10.5-13.3 s either way).
# libgomp reads it once, when torch (or LightGBM) loads it: before any command imports either.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

PIPELINE_COMMANDS = ("fit", "test", "recommend")
LIGHTNING_COMMANDS = ("fit", "validate", "test", "predict")


def pipeline_cli(args: list[str]) -> object:
    """``sessrec fit|test|recommend`` on a pipeline recipe; returns what the subcommand returns."""
    from sessrec.cli.parsers import config_paths, parse, recipe_parser
    from sessrec.pipeline.offline import recommend_file
    from sessrec.pipeline_training.recipe import PipelineRecipe
    from sessrec.scoring import check_settings

    command, rest = args[0], args[1:]
    parser = recipe_parser(prog=f"sessrec {command}")
    owner = None
    if command == "recommend":
        parser.add_function_arguments(recommend_file, skip={"pipeline", "schema"})
        owner = recommend_file
    refuse_checkpoint_models(config_paths(rest))
    cfg = parse(parser, rest, owner=owner, roots={"pipeline": PipelineRecipe})
    recipe = parser.instantiate(cfg).pipeline
    if command in READ_AT_USE:
        refuse_fit_settings(command, rest, recipe.output)
    if command == "fit":
        return recipe.fit()
    if command == "test":
        return recipe.test()
    check_settings(cfg.k, cfg.batch_size, cfg.partition_batches,  # named as typed, before the pipeline is read
                   flags={"k": "--k", "batch_size": "--batch_size", "partition_batches": "--partition_batches"})
    return recommend_file(
        recipe.output, cfg.input_path, cfg.output, k=cfg.k, batch_size=cfg.batch_size,
        schema=recipe.data.predict_schema, overwrite=cfg.overwrite, now=cfg.now, engine=cfg.engine,
        scheduler=cfg.scheduler, workers=cfg.workers, partition_batches=cfg.partition_batches,
    )


# the pipeline settings that `sessrec test` and `recommend` read; every other one is read by `sessrec fit` alone (the
# saved pipeline holds what it built from them)
READ_AT_USE = {"test": ("data", "output", "ks", "batch_size"), "recommend": ("data", "output")}


def refuse_fit_settings(command: str, args: list[str], output: str) -> None:
    """Refuse, in one line, a ``--pipeline.<key>`` flag of `args` that `command` would not read: a setting of the
    pipeline's fit, which the pipeline saved at `output` was built with."""
    from sessrec.cli.errors import RecipeError, flag_mapping

    given = flag_mapping(args).get("pipeline")
    for key in given if isinstance(given, dict) else ():
        if key not in READ_AT_USE[command]:
            raise RecipeError(
                f"--pipeline.{key}: sessrec {command} reads the pipeline saved at {output} as it was fitted, and this "
                f"setting only when fitting; refit it (sessrec fit) to change it, or drop the flag "
                f"({command} reads {', '.join(f'pipeline.{k}' for k in READ_AT_USE[command])})"
            )


def refuse_checkpoint_models(paths: list[Path]) -> None:
    """One line for a pipeline recipe whose session model is named by its training recipe and checkpoint."""
    from sessrec.cli.errors import read_config

    for path in paths:
        pipeline = read_config(path).get("pipeline")
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
    constructor's message is the one that names the file, the column and the value. Of a union of
    classes the summary chains the first subtype's error (the class path names another): the one
    error of the subtype the class path names is taken from the summary's list.
    """
    from sessrec.cli.errors import named_subtype_error

    while err.__cause__ is not None and _raised_in(err, "jsonargparse"):
        named = named_subtype_error(str(err))
        if named is not None:
            return ValueError(named)
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
    that ``--model_dir`` holds (`sessrec.lifecycle.retrain.retrain` / `retrain_dlrm`)."""
    from sessrec.artifacts import ClickRanker, artifact_class
    from sessrec.cli.parsers import config_value
    from sessrec.lifecycle.retrain import retrain, retrain_dlrm, summary

    model_dir = config_value(args, "model_dir")
    turn = retrain_dlrm if model_dir is not None and artifact_class(str(model_dir)) is ClickRanker else retrain
    decision = call_with_flags(turn, "sessrec retrain", args, instantiate=True)
    print(f"sessrec retrain: {summary(decision)}")
    return decision


def monitor_cli(args: list[str]) -> object:
    """``sessrec monitor``: the served log's quality and drift per version and window (`sessrec.lifecycle.monitor`);
    exit status 3 with one line when a threshold is crossed, so that a scheduler chains ``sessrec retrain`` on it,
    and 4 when a canary is worse than live by more than its tolerance (``sessrec rollback``)."""
    from sessrec.lifecycle.monitor import CanaryWorse, ThresholdCrossed, monitor

    try:
        return call_with_flags(monitor, "sessrec monitor", args, instantiate=True)
    except CanaryWorse as err:
        print(f"sessrec monitor: canary worse: {err}", file=sys.stderr)
        raise SystemExit(4) from None
    except ThresholdCrossed as err:
        print(f"sessrec monitor: threshold crossed: {err}", file=sys.stderr)
        raise SystemExit(3) from None


def serve_cli(args: list[str]) -> None:
    """``sessrec serve --model_dir <dir>``: HTTP recommendations from a model or pipeline directory."""
    from sessrec.serving.server import serve

    call_with_flags(serve, "sessrec serve", args)


def call_with_flags(func: Callable[..., Any], prog: str, args: list[str], instantiate: bool = False) -> Any:
    """`func` called with the arguments that the flags and ``--config`` files of `args` give its parameters
    (`sessrec.cli.parsers.function_command`); `instantiate`: build the classes its arguments name."""
    from sessrec.cli.parsers import function_command, parse

    parser = function_command(func, prog)
    cfg = parse(parser, args, owner=func)
    kwargs = (parser.instantiate(cfg) if instantiate else cfg).as_dict()
    kwargs.pop("config", None)
    return func(**kwargs)


def export(
    model_dir: str,
    out: str,
    format: Literal["onnx", "torchscript", "triton"] = "onnx",
    top_k: int | None = 20,
    name: str = "sessrec",
    max_batch_size: int = 64,
) -> str:
    """Export a session model or DLRM for serving, checked against PyTorch on a batch of another size and length.

    Args:
        model_dir: the model directory that ``sessrec fit`` writes (``runs/<name>/model``).
        out: output directory.
        format: ``onnx`` / ``torchscript``: one model file; ``triton``: a Triton model repository (ONNX backend).
        top_k: session models also output the K best items (null: scores only).
        name: the model's name in a Triton repository.
        max_batch_size: Triton's dynamic batching: largest batch.

    Returns:
        The file or repository written.
    """
    from sessrec.lifecycle.export import export_model_dir, read_model_dir

    if format == "triton":
        from sessrec.lifecycle.triton import triton_repository
        from sessrec.scoring.output import check_folder

        check_folder(out, "--out", [model_dir])
        artifact, version = read_model_dir(model_dir)
        return str(triton_repository(artifact, out, name, max_batch_size, top_k=top_k, version=version))
    return str(export_model_dir(model_dir, out, format, top_k=top_k))


def _holds_session_model(model_dir: str) -> bool:
    """Whether a model directory holds a session model (its config has an objective), not a click ranker; its
    ``config.json`` checked (`read_model_directory`), and any error about it raised here."""
    from sessrec.artifacts.model_directory import read_model_directory

    return "objective" in read_model_directory(model_dir)[1]


def export_cli(args: list[str]) -> str:
    """``sessrec export --model_dir runs/<name>/model --format {onnx,torchscript,triton} --out <dir>``."""
    from sessrec.cli.errors import RecipeError, flag_mapping
    from sessrec.cli.parsers import checkpoint_refused

    if any(arg.partition("=")[0] == "--ckpt_path" for arg in args):
        raise ValueError(checkpoint_refused("export"))
    flags = flag_mapping(args)
    fmt = flags.get("format", "onnx")
    for key in ("name", "max_batch_size"):  # settings of a Triton repository, which the one-file formats would ignore
        if key in flags and fmt != "triton":
            raise RecipeError(f"--{key}: a setting of a Triton model repository (--format triton); --format {fmt} writes "
                              "one model file, without a name or a batch limit")
    if "top_k" in flags and isinstance(flags.get("model_dir"), str) and not _holds_session_model(flags["model_dir"]):
        raise RecipeError(f"--top_k: a session model's setting (the K best items it outputs); {flags['model_dir']} holds "
                          "a click ranker, whose export scores the click-out rows it is given (logits)")
    written = call_with_flags(export, "sessrec export", args)
    print(f"sessrec export: wrote {written} (checked against PyTorch on a batch of another size and length)")
    return written


def rollback(model_dir: str, to: str | None = None) -> str:
    """Make an earlier version of a versioned model or pipeline directory current again (logged like a promotion).

    Args:
        model_dir: a model or pipeline directory with versions.
        to: the version to make current (e.g. ``v000003``); default: the one before the current one in the
            promotion history, so that rollbacks in a row walk back one version each.

    Returns:
        The version now current.
    """
    from sessrec.saved.versions import VersionedDirectory, canary

    store = VersionedDirectory(model_dir)
    store.check_versioned("nothing to roll back to")
    with store.lock():  # what it was and the move, one decision: another writer waits for it or is refused
        before = store.recover()
        running = canary(model_dir)
        version = store.rollback(to)
    if running is not None and to is None:
        print(f"sessrec rollback: {model_dir}: canary {running[0]} dropped; {version} answers every session "
              "(a server following it reloads)")
    else:
        dropped = "" if running is None else f"; canary {running[0]} dropped"  # any move of the pointer ends it
        print(f"sessrec rollback: {model_dir}: {version} is current (was {before}){dropped}; a server following it reloads")
    return version


def promote(model_dir: str, version: str | None = None) -> str:
    """Make a version of a versioned model or pipeline directory current for every session, which ends a canary.

    The version's parts are checked against their hashes before the pointer moves; the move is logged.

    Args:
        model_dir: a model or pipeline directory with versions.
        version: the version to make current (e.g. ``v000003``); default: the directory's canary
            (``sessrec serve --canary``), refused when none runs.

    Returns:
        The version now current.
    """
    from sessrec.saved.versions import VersionedDirectory, canary

    store = VersionedDirectory(model_dir)
    store.check_versioned("nothing to promote")
    with store.lock():  # the state read and the move, one decision: another writer is refused meanwhile
        before = store.recover()  # the pointer and the canary as the log says, after a crash between them
        running = canary(model_dir)
        if version is None:
            if running is None:
                raise ValueError(f"{model_dir}: runs no canary; give --version to promote")
            version = running[0]
        if version == before:
            raise ValueError(f"{model_dir}: {version} is already the current version")
        store.promote(version, {"reason": "sessrec promote"})
    ended = "" if running is None else (f"; canary {running[0]} " + ("promoted" if running[0] == version else "dropped"))
    print(f"sessrec promote: {model_dir}: {version} is current (was {before}){ended}; a server following it reloads")
    return version


def prepare_cli(args: list[str]) -> Path:
    """``sessrec prepare --config <data recipe> --out DIR [--engine local|dask|memory]``: the recipe's source
    prepared once (`sessrec.data.prepared.prepare`), with its data block's vocabulary settings; the recipe's
    other blocks (`UNUSED_BY_PREPARE`) are read and not used."""
    from sessrec.cli.parsers import command_parser, parse
    from sessrec.data.prepared import prepare
    from sessrec.tasks import SessionDataModule

    parser = command_parser("sessrec prepare", (prepare.__doc__ or "").strip().splitlines()[0])
    parser.add_function_arguments(prepare, skip={"source", "min_item_count", "max_vocab_size"}, fail_untyped=False)
    parser.add_class_arguments(SessionDataModule, "data")
    for unused in UNUSED_BY_PREPARE:
        parser.add_argument(f"--{unused}", type=dict | int | None, default=None, help="read from the recipe, not used")
    cfg = parse(parser, args, owner=prepare, roots={"data": SessionDataModule, **dict.fromkeys(UNUSED_BY_PREPARE)})
    for unused in UNUSED_BY_PREPARE:
        cfg[unused] = None  # nothing of them is built
    data = parser.instantiate(cfg).data
    kwargs = {k: v for k, v in cfg.as_dict().items() if k not in ("config", "data", *UNUSED_BY_PREPARE)}
    out = prepare(data.source, min_item_count=data.min_item_count, max_vocab_size=data.max_vocab_size, **kwargs)
    print(f"sessrec prepare: wrote {out} ({kwargs.get('engine')} engine)")
    return out


UNUSED_BY_PREPARE = ("trainer", "model", "seed_everything", "last_checkpoint", "scoring")  # a task recipe's other blocks
COMMANDS = {"export": export_cli, "prepare": prepare_cli, "retrain": retrain_cli, "serve": serve_cli, "monitor": monitor_cli,
            "rollback": lambda args: call_with_flags(rollback, "sessrec rollback", args),
            "promote": lambda args: call_with_flags(promote, "sessrec promote", args)}
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


def user_modules(args: list[str]) -> list[str]:
    """`args` without their ``--import MODULE`` (or ``--import=MODULE``) flags, whose modules are added to
    ``SESSREC_IMPORT`` and imported now (`sessrec.saved.registry.import_user_modules`)."""
    from sessrec.saved.registry import IMPORT_VARIABLE, import_user_modules

    rest, modules, i = [], [], 0
    while i < len(args):
        arg = args[i]
        if arg == "--import":
            if i + 1 == len(args) or args[i + 1].startswith("-"):
                raise ValueError("--import needs a module name (--import mylib.encoders)")
            modules.append(args[i + 1])
            i += 2
            continue
        if arg.startswith("--import="):
            modules.append(arg.partition("=")[2])
        else:
            rest.append(arg)
        i += 1
    if modules:
        os.environ[IMPORT_VARIABLE] = ",".join(filter(None, [os.environ.get(IMPORT_VARIABLE, ""), *modules]))
    import_user_modules()
    return rest


def refuse_missing_configs(args: list[str]) -> None:
    """Refuse a ``--config`` file that does not exist, in one line with the closest file of its folder (a misspelt
    ``recipes/model/sasrc.yaml``); YAML given inline (``--config '{...}'``) is left to the parser."""
    for i, arg in enumerate(args):
        value = args[i + 1] if arg == "--config" and i + 1 < len(args) else arg.partition("=")[2] if arg.startswith(
            "--config=") else None
        if value is None or value.lstrip().startswith("{") or ": " in value or "\n" in value or Path(value).is_file():
            continue
        path = Path(value)
        if path.is_dir():
            raise FileNotFoundError(f"--config {value}: is a folder, not a recipe file")
        if not path.parent.is_dir():
            raise FileNotFoundError(f"--config {value}: no such file (there is no folder {str(path.parent)!r})")
        import difflib

        siblings = sorted(p.name for p in path.parent.iterdir() if p.suffix in (".yaml", ".yml", ".json"))
        close = difflib.get_close_matches(path.name, siblings, n=1, cutoff=0.6)
        raise FileNotFoundError(f"--config {value}: no such file" + (f"; did you mean {path.with_name(close[0])}?"
                                                                     if close else ""))


def run(args: list[str]) -> object:
    """Dispatch ``sessrec <command> ...``: the pipeline, lifecycle and Lightning commands."""
    command = args[0] if args else ""
    if command in ("", "-h", "--help"):
        print(_usage())
        return None
    refuse_missing_configs(args[1:])
    if command in COMMANDS:
        return COMMANDS[command](args[1:])
    from sessrec.cli.parsers import config_value

    asks_help = bool({"-h", "--help"} & set(args))
    pipeline_recipe = command in PIPELINE_COMMANDS and config_value(args, "pipeline") is not None  # a `pipeline:` block
    if pipeline_recipe or (command == "recommend" and asks_help):
        return pipeline_cli(args)
    if command == "recommend":
        raise ValueError("--config must name a pipeline recipe (a top-level 'pipeline:' block)")
    for i, arg in enumerate(args[:-1]):
        if command == "fit" and arg == "--ckpt_path":  # a one-line error for an unreadable file, before LightningCLI reads its config
            from sessrec.saved.checkpoint import checkpoint_summary

            checkpoint_summary(args[i + 1])  # (read once for every later use)
    if command not in LIGHTNING_COMMANDS:
        raise ValueError(f"unknown command {command!r}; the commands are {', '.join(COMMAND_NAMES)} (sessrec --help)")
    from sessrec.cli.lightning import cli

    sys.argv = [sys.argv[0], *args]  # LightningCLI reads them there
    return cli()


COMMAND_NAMES = ("fit", "validate", "test", "predict", "recommend", "prepare", "serve", "export", "retrain", "rollback", "promote", "monitor")


def _usage() -> str:
    """The commands and the options of every command, as the module docstring lists them."""
    commands, options = __doc__.split("\n\n")[1], __doc__.split("\n\n")[3]
    return ("usage:\n" + commands + "\n\noptions of every command:\n" + options
            + "\n\n(sessrec <command> --help for a command's options; the data and model options of fit, validate, "
              "test and predict: sessrec <command> --data.help SessionDataModule, --model.help NextItemTask)")


NOISE = ("\N{ELECTRIC LIGHT BULB} Tip:",)  # Lightning's advertisements (rank_zero_info at INFO)
# torch's deprecation of what pytorch_lightning's _pytree still uses; Lightning's note on every predict that sessrec's
# loader keeps no batch indices, which its TopKWriter does not read (it writes each batch as it comes); transformers'
# deprecation of a property that torch.jit.trace reads on every submodule of a Hugging Face encoder (sessrec export);
# torch.onnx's note that inputs share a dynamic axis's name (a DLRM's dense and id inputs: the batch)
NOISY_WARNINGS = (r".*LeafSpec", r"Couldn't infer the batch indices fetched from your dataloader",
                  r"`is_gradient_checkpointing` is deprecated", r"# The axis name: .* will not be used, since it shares")
RANK_ZERO_LOGGERS = ("pytorch_lightning.utilities.rank_zero", "lightning_fabric.utilities.rank_zero",
                     "lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")
# logger -> the beginnings of its messages that are noise: torch.onnx's exporter (a pipeline fit exporting a
# retriever's query, sessrec export) notes that it skips torchvision's operators, which sessrec never exports;
# transformers notes the loss it would train with when torch.jit.trace reads its `loss_function` property (sessrec
# export to TorchScript), a loss sessrec never uses (its objectives compute their own)
NOISY_LOGS = {**dict.fromkeys(RANK_ZERO_LOGGERS, NOISE),
              "torch.onnx._internal.exporter._registration": ("torchvision is not installed",),
              "transformers.modeling_utils": ("`loss_type=",)}


class _Noise(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefixes)


def quiet_third_parties() -> None:
    """Hide third-party notices a user cannot act on (`NOISY_LOGS`, `NOISY_WARNINGS`, wandb's banner);
    sessrec's own warnings and Lightning's other messages stay."""
    os.environ.setdefault("WANDB_SILENT", "true")
    for pattern in NOISY_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    for name, prefixes in NOISY_LOGS.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Noise) for f in logger.filters):
            logger.addFilter(_Noise(prefixes))


def main() -> None:
    """Console entry point ``sessrec``: a user error is one line (``--traceback`` or SESSREC_TRACEBACK=1 for the trace)."""
    args = sys.argv[1:]
    verbose = any(a in VERBOSE_FLAGS for a in args) or bool(os.environ.get("SESSREC_TRACEBACK"))
    if not (SHOW_WARNINGS in args or os.environ.get("SESSREC_SHOW_WARNINGS")):
        quiet_third_parties()
    args = [a for a in args if a not in (*VERBOSE_FLAGS, SHOW_WARNINGS)]
    try:
        args = user_modules(args)
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
    **dict.fromkeys(("cudf", "cupy", "dask_cudf", "dask_cuda"), "gpu"),
    **dict.fromkeys(("dask", "distributed"), "cluster"),
    "matplotlib": "dev",  # sessrec monitor --plot
}


def __getattr__(name: str) -> Any:
    # the LightningCLI and its runner load Lightning: only when asked for
    if name in ("cli", "SessrecCLI"):
        from sessrec.cli import lightning

        return getattr(lightning, name)
    raise AttributeError(f"module 'sessrec.cli' has no attribute {name!r}")
