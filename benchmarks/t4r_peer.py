"""XLNet-MLM through Transformers4Rec 23.12 on a Merlin dataset, split as `sessrec.data.MerlinSource` splits it.

Runs in a separate virtual environment with Transformers4Rec (not sessrec's), e.g.::

    python3 -m venv /work/t4r-venv && /work/t4r-venv/bin/pip install torch==2.13.0
    /work/t4r-venv/bin/pip install "transformers4rec[pytorch]==23.12.0" "transformers==4.30.2" "torch==2.13.0"
    /work/t4r-venv/bin/python benchmarks/t4r_peer.py --path tests/fixtures/merlin/sequence_testing
    /work/t4r-venv/bin/python benchmarks/t4r_peer.py --quick   # smoke run: that fixture, 1 epoch, width 16

(23.12 installs with numpy<2, pandas 1.5, pyarrow<15 and dask 2023.5: pin them with ``--no-deps`` if pip
picked newer ones; docs/migrating-from-transformers4rec.md lists the versions used.)

The directory's one parquet file is split as `MerlinSource` splits a directory without a split: sessions in
file order, the last `test_fraction` test, the `valid_fraction` before them validation (unused here: T4R
trains a fixed number of epochs), the rest training. Only the item-id list column is used. The model is
T4R's XLNet-MLM example: `TabularSequenceFeatures` (item embedding projected to `d_model`, masked with
`MaskedLanguageModeling`), `XLNetConfig.build`, `NextItemPredictionTask` with weight tying, trained by
`tr.Trainer`; the test set is evaluated on each session's last item (``eval_on_last_item_seq_only``),
which is sessrec's ``last`` protocol. Prints one JSON object.

`--quick` trains one epoch of a one-layer width-16 model (2 heads, batch 32) on `--path`, by default
tests/fixtures/merlin/sequence_testing. The script runs Transformers4Rec only (sessrec's side is
``sessrec fit`` on the same directory); without it, it exits 1 with one line naming the package.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--path", help="Merlin dataset directory: one parquet file and schema.json (required but "
                        "with --quick: tests/fixtures/merlin/sequence_testing)")
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--n-layer", type=int, default=1)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--max-length", type=int, default=20)
    parser.add_argument("--mlm-probability", type=float, default=0.3)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.001)
    parser.add_argument("--valid-fraction", type=float, default=0.1)
    parser.add_argument("--test-fraction", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 epoch, d_model 16, 2 heads, batch 32")
    args = parser.parse_args()
    if args.quick:
        args.epochs, args.d_model, args.n_head, args.n_layer, args.batch_size = 1, 16, 2, 1, 32
        args.path = args.path or str(Path(__file__).resolve().parents[1] / "tests/fixtures/merlin/sequence_testing")
    if args.path is None:
        parser.error("--path is required (or --quick)")

    import pyarrow.parquet as pq
    import torch

    torch.set_num_threads(args.threads)
    try:
        import transformers4rec.torch as tr
    except ImportError as err:
        sys.exit(f"t4r_peer.py needs transformers4rec (Transformers4Rec 23.12, its own virtualenv): {err}")
    from merlin_standard_lib import Schema
    from transformers4rec.torch.masking import MaskedLanguageModeling
    from transformers4rec.torch.ranking_metric import NDCGAt, RecallAt

    path = Path(args.path)
    files = sorted(path.glob("*.parquet"))
    if len(files) != 1:
        sys.exit(f"{path}: expected one parquet file, found {len(files)}")
    schema = Schema().from_json(str(path / "schema.json"))
    item = schema.select_by_tag(["item_id"]).column_names
    if len(item) != 1:
        sys.exit(f"{path / 'schema.json'}: expected one column tagged item_id, found {item}")
    schema = schema.select_by_name(item)
    table = pq.read_table(files[0], columns=item)
    n_test = int(round(table.num_rows * args.test_fraction))
    n_valid = int(round((table.num_rows - n_test) * args.valid_fraction / (1.0 - args.test_fraction)))
    n_train = table.num_rows - n_test - n_valid
    work = Path(tempfile.mkdtemp(prefix="t4r_peer_"))
    pq.write_table(table.slice(0, n_train), work / "train.parquet")
    pq.write_table(table.slice(n_train + n_valid), work / "test.parquet")

    inputs = tr.TabularSequenceFeatures.from_schema(
        schema,
        max_sequence_length=args.max_length,
        d_output=args.d_model,
        masking=MaskedLanguageModeling(hidden_size=args.d_model, padding_idx=0, mlm_probability=args.mlm_probability),
    )
    transformer = tr.XLNetConfig.build(
        d_model=args.d_model, n_head=args.n_head, n_layer=args.n_layer, total_seq_length=args.max_length, dropout=args.dropout
    )
    task = tr.NextItemPredictionTask(
        weight_tying=True, metrics=[NDCGAt(top_ks=[10, 20], labels_onehot=True), RecallAt(top_ks=[10, 20], labels_onehot=True)]
    )
    model = transformer.to_torch_model(inputs, task)
    training = tr.trainer.T4RecTrainingArguments(
        output_dir=str(work / "out"),
        max_sequence_length=args.max_length,
        data_loader_engine="pyarrow",
        num_train_epochs=args.epochs,
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=256,
        learning_rate=args.lr,
        lr_scheduler_type="linear",
        warmup_steps=0,
        weight_decay=0.0,
        dataloader_drop_last=False,
        report_to=[],
        save_strategy="no",
        logging_steps=10_000,
        seed=args.seed,
        no_cuda=True,
        disable_tqdm=True,
    )
    trainer = tr.Trainer(model=model, args=training, schema=schema, compute_metrics=True)
    trainer.train_dataset_or_path = str(work / "train.parquet")
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    trainer.eval_dataset_or_path = str(work / "test.parquet")
    metrics = trainer.evaluate(metric_key_prefix="test")
    out = {
        "library": "transformers4rec " + getattr(tr, "__version__", "23.12"),
        "dataset": str(path),
        "sessions": {"train": n_train, "valid": n_valid, "test": table.num_rows - n_train - n_valid},
        "settings": {k: v for k, v in vars(args).items() if k not in ("path", "threads")},
        "train_seconds": round(seconds, 1),
        "test": {k.split("/")[-1]: round(float(v), 4) for k, v in metrics.items() if "_at_" in k},
    }
    print(json.dumps(out))
    os.environ.get("T4R_PEER_KEEP") or __import__("shutil").rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
