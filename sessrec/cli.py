"""``sessrec`` command line: LightningCLI over a task (`NextItemTask` unless the recipe names
another, e.g. ``class_path: sessrec.tasks.BaselineTask``) and a data module (`SessionDataModule`
unless the recipe names another, e.g. ``class_path: sessrec.data.ClickoutDataModule`` with
``sessrec.tasks.DLRMTask``).

    sessrec fit     --config recipes/quickstart.yaml
    sessrec test    --config recipes/xlnet_mlm_diginetica.yaml --ckpt_path runs/.../best.ckpt
    sessrec predict --config recipes/xlnet_mlm_diginetica.yaml --ckpt_path runs/.../best.ckpt \\
                    --data.predict_path sessions.parquet [--scoring.output recs.parquet]

Data-derived values (catalogue size, sequence length, virtual items, side-feature sizes) are
linked from the data module into the model, never typed twice. With ``--ckpt_path``, the
vocabulary and the fitted side-feature transforms saved beside the checkpoint are used, so raw
ids and features map exactly as in training.
"""

from __future__ import annotations

import pytorch_lightning as pl
from importlib import import_module
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


def main() -> None:
    """Console entry point ``sessrec``."""
    cli()


if __name__ == "__main__":
    main()
