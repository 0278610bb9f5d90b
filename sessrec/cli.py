"""``sessrec`` command line: LightningCLI over a task (`NextItemTask` unless the recipe names
another, e.g. ``class_path: sessrec.tasks.BaselineTask``) and a data module (`SessionDataModule`
unless the recipe names another, e.g. ``class_path: sessrec.data.ClickoutDataModule`` with
``sessrec.tasks.DLRMTask``).

    sessrec fit     --config recipes/quickstart.yaml
    sessrec test    --config recipes/xlnet_mlm_diginetica.yaml --ckpt_path runs/.../best.ckpt
    sessrec predict --config recipes/xlnet_mlm_diginetica.yaml --ckpt_path runs/.../best.ckpt \\
                    --data.predict_path sessions.parquet [--scoring.output recs.parquet]

A pipeline recipe (one top-level ``pipeline:`` block, `sessrec.pipeline.PipelineRecipe`) runs the
four-stage pipeline instead of a Lightning task:

    sessrec fit       --config recipes/pipeline_rsc15.yaml      # ranker on the validation sessions
    sessrec test      --config recipes/pipeline_rsc15.yaml      # end-to-end test metrics
    sessrec recommend --config recipes/pipeline_rsc15.yaml --input sessions.parquet --output recs.parquet

Data-derived values (catalogue size, sequence length, virtual items, side-feature sizes) are
linked from the data module into the model, never typed twice. With ``--ckpt_path``, the
vocabulary and the fitted side-feature transforms saved beside the checkpoint are used, so raw
ids and features map exactly as in training.
"""

from __future__ import annotations

import os
import sys
from importlib import import_module
from pathlib import Path

import pytorch_lightning as pl
import yaml
from pytorch_lightning.cli import LightningArgumentParser, LightningCLI

from sessrec.tasks import TopKWriter, VocabularyCheckpoint
from sessrec.tasks.callbacks import find_features, find_vocab


class SessrecCLI(LightningCLI):
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # a recipe's `model:` block without class_path configures NextItemTask, as before
        parser.set_defaults({"model": {"class_path": "sessrec.tasks.NextItemTask"}})
        # likewise a `data:` block without class_path configures SessionDataModule
        parser.set_defaults({"data": {"class_path": "sessrec.data.SessionDataModule"}})
        # links whose source the chosen data module lacks, or whose target the task lacks, are ignored
        parser.link_arguments("data.num_items", "model.init_args.num_items", apply_on="instantiate")
        # tasks without these arguments (BaselineTask has no side_features) ignore the links
        parser.link_arguments("data.num_virtual", "model.init_args.num_virtual", apply_on="instantiate")
        parser.link_arguments("data.side_info", "model.init_args.side_features", apply_on="instantiate")
        # tasks without a max_length argument (BaselineTask) ignore this link
        parser.link_arguments("data.init_args.max_length", "model.init_args.max_length", apply_on="parse")
        parser.add_lightning_class_args(TopKWriter, "scoring")
        parser.add_lightning_class_args(VocabularyCheckpoint, "vocab_checkpoint")

    def before_instantiate_classes(self) -> None:
        sub = self.subcommand
        if sub is None:
            return
        cfg = self.config[sub]
        module, _, name = cfg.data.class_path.rpartition(".")
        if hasattr(getattr(import_module(module), name), "cardinalities"):
            # ranking data (ClickoutDataModule) -> DLRMTask. Added only for such a data module: for one
            # without the attribute jsonargparse would format it in a debug message, and a
            # LightningDataModule's str() builds (and here fails on) every loader
            parser = self._subcommand_parsers[sub]
            parser.link_arguments("data.cardinalities", "model.init_args.cardinalities", apply_on="instantiate")
            parser.link_arguments("data.num_dense", "model.init_args.num_dense", apply_on="instantiate")
        if sub not in ("validate", "test", "predict"):
            return
        if sub == "predict" and cfg.get("return_predictions") is None:
            cfg["return_predictions"] = False  # stream to parquet, keep nothing in memory
        ckpt = cfg.get("ckpt_path")
        data = cfg.data.init_args
        if ckpt and "vocab_path" in data and data.get("vocab_path") is None:
            vocab = find_vocab(ckpt)
            if vocab is None and sub == "predict":
                raise FileNotFoundError(
                    f"no vocab.parquet beside {ckpt}; pass --data.vocab_path to the vocabulary of that training run"
                )
            data.vocab_path = None if vocab is None else str(vocab)
        if ckpt and "features_path" in data and data.get("features_path") is None:
            features = find_features(ckpt)
            side = data.get("side_features")
            wants = side is not None and any(side.get(k) for k in ("categorical", "continuous", "time", "position"))
            if features is None and wants and sub == "predict":
                raise FileNotFoundError(
                    f"no features.npz beside {ckpt}; pass --data.features_path to the side-feature transforms "
                    "of that training run"
                )
            data.features_path = None if features is None else str(features)


def cli(args: list[str] | None = None) -> SessrecCLI:
    """Run the CLI in-process and return it (trainer, model and data module for inspection)."""
    return SessrecCLI(
        pl.LightningModule,
        pl.LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        seed_everything_default=0,
        save_config_kwargs={"overwrite": True},
        args=args,
    )


PIPELINE_COMMANDS = ("fit", "test", "recommend")


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
    from sessrec.pipeline.batch import recommend_file
    from sessrec.pipeline.recipe import recipe_parser

    command, rest = args[0], args[1:]
    parser = recipe_parser(prog=f"sessrec {command}")
    if command == "recommend":
        parser.add_argument("--input", type=str, required=True, help="sessions (parquet/CSV): a list column or one row per event")
        parser.add_argument("--output", type=str, required=True, help="parquet of session_id, item_ids, scores")
        parser.add_argument("--k", type=int, default=20, help="recommendations per session")
        parser.add_argument("--batch_size", type=int, default=1024, help="sessions per batch (and per part file)")
        parser.add_argument("--overwrite", type=bool, default=False, help="replace an existing output")
    cfg = parser.parse_args(rest)
    recipe = parser.instantiate(cfg).pipeline
    if command == "fit":
        return recipe.fit()
    if command == "test":
        return recipe.test()
    return recommend_file(
        recipe.output, cfg.input, cfg.output, k=cfg.k, batch_size=cfg.batch_size,
        schema=recipe.data.predict_schema, overwrite=cfg.overwrite,
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


def main() -> None:
    """Console entry point ``sessrec``."""
    args = sys.argv[1:]
    if args and args[0] in PIPELINE_COMMANDS and pipeline_recipe(args):
        traceback = "--traceback" in args or bool(os.environ.get("SESSREC_TRACEBACK"))
        try:
            pipeline_cli([a for a in args if a != "--traceback"])
        except (ValueError, TypeError, RuntimeError, OSError) as err:  # OSError: missing or existing files
            if traceback:
                raise
            sys.exit(f"sessrec {args[0]}: error: {_recipe_error(err)}")
        return
    if args and args[0] == "recommend":
        sys.exit("sessrec recommend: error: --config must name a pipeline recipe (a top-level 'pipeline:' block)")
    cli()


if __name__ == "__main__":
    main()
