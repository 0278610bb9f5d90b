"""XLNet-MLM through Transformers4Rec 23.12 on a Merlin dataset directory, split as `sessrec.data.MerlinSource` splits it.

Runs in a separate virtual environment with Transformers4Rec (not sessrec's), e.g. the one
tests/fixtures/merlin/make_fixtures.py describes (transformers4rec 23.12.0, merlin-core 23.8.0, NVTabular
23.8.0, torch 2.13.0+cpu)::

    /tmp/merlin-venv/bin/python benchmarks/t4r_peer.py --path tests/fixtures/merlin/t4r_tutorial
    /tmp/merlin-venv/bin/python benchmarks/t4r_peer.py --quick   # smoke run: sequence_testing, 1 epoch, width 16

The schema is read as merlin-core reads it (``.merlin/schema.json``, else ``schema.json``, else
``schema.pbtxt``, by `merlin.schema.io.tensorflow_metadata.TensorflowMetadata`) and the item column is
Merlin's ``select_by_tag(Tags.ITEM_ID)``. The parquet files are split by `MerlinSource`'s rules: files under
``train``/``valid``/``test`` folders or named so are those splits, the test files (else the valid files) being the
test set; with T4R's day folders (``1/train.parquet`` ...) only the last day's valid and test files are held
out, every earlier day's files train; a directory without a split is read in natural file order and cut at its
end, the last `test_fraction` test, the `valid_fraction` before it validation (unused here: T4R trains a fixed
number of epochs). Sessions with fewer than 2 non-padding items are dropped first, as
`MerlinSource` drops them. Only the item-id list column is used; doubles (NVTabular's ``ListSlice(pad=True)``
on CPU writes its padded lists so) are cast to int64 as `MerlinSource` reads them: given as written, T4R stops in
its embedding lookup ("Expected tensor for argument #1 'indices' to have one of the following scalar types: Long,
Int; but got torch.FloatTensor"). The model is T4R's XLNet-MLM
example: `TabularSequenceFeatures` (item embedding projected to `d_model`, masked with
`MaskedLanguageModeling`), `XLNetConfig.build`, `NextItemPredictionTask` with weight tying, trained by
`tr.Trainer`; the test set is evaluated on each session's last item (``eval_on_last_item_seq_only``), which is
sessrec's ``last`` protocol. Prints one JSON object.

`--quick` trains one epoch of a one-layer width-16 model (2 heads, batch 32) on `--path`, by default
tests/fixtures/merlin/sequence_testing. The script runs Transformers4Rec only (sessrec's side is
``sessrec fit`` on the same directory); without it, it exits 1 with one line naming the package.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--path", help="Merlin dataset directory: parquet files and their schema (required but "
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
    from merlin.schema import Tags
    from transformers4rec.torch.masking import MaskedLanguageModeling
    from transformers4rec.torch.ranking_metric import NDCGAt, RecallAt

    path = Path(args.path)
    core = merlin_schema(path)
    item = core.select_by_tag(Tags.ITEM_ID).column_names
    if len(item) != 1:
        sys.exit(f"{path}: expected one column tagged item_id (Merlin's select_by_tag), found {item}")
    schema = core.select_by_name(item)
    splits = split(path, item[0], args.valid_fraction, args.test_fraction)
    work = Path(tempfile.mkdtemp(prefix="t4r_peer_"))
    for name in ("train", "test"):
        pq.write_table(splits[name], work / f"{name}.parquet")

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
        predict_top_k=20,  # the top-k the trainer keeps of each prediction (default 100: more than a small catalogue has)
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
        "item_column": item[0],
        "sessions": {name: table.num_rows for name, table in splits.items()},
        "settings": {k: v for k, v in vars(args).items() if k not in ("path", "threads")},
        "train_seconds": round(seconds, 1),
        "test": {k.split("/")[-1]: round(float(v), 4) for k, v in metrics.items() if "_at_" in k},
    }
    print(json.dumps(out))
    os.environ.get("T4R_PEER_KEEP") or __import__("shutil").rmtree(work, ignore_errors=True)


SPLIT = re.compile(r"^(train|training|valid|validation|test)(?:[_\-.\d].*)?$")  # MerlinSource's split names


def merlin_schema(path: Path):
    """The directory's schema as merlin-core reads it (a merlin.schema.Schema)."""
    from merlin.schema.io.tensorflow_metadata import TensorflowMetadata

    if (path / ".merlin" / "schema.json").is_file():
        return TensorflowMetadata.from_json_file(path / ".merlin").to_merlin_schema()
    if (path / "schema.json").is_file():
        return TensorflowMetadata.from_json_file(path).to_merlin_schema()
    if (path / "schema.pbtxt").is_file():
        return TensorflowMetadata.from_proto_text_file(path).to_merlin_schema()
    sys.exit(f"{path}: no .merlin/schema.json, schema.json or schema.pbtxt")


def split(path: Path, item: str, valid_fraction: float, test_fraction: float) -> dict:
    """``train``, ``valid`` and ``test`` tables of the item column, split by `MerlinSource`'s rules."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    def natural(file: Path) -> list:
        return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(file))]

    def tail(table, fraction: float):
        cut = table.num_rows - round(table.num_rows * fraction)
        return table.slice(0, cut), table.slice(cut)

    names = {"train": "train", "training": "train", "valid": "valid", "validation": "valid", "test": "test"}
    found: list = []  # (file, split, day folder or None), in natural order
    for file in sorted(path.rglob("*.parquet"), key=natural):
        parts = [*file.relative_to(path).parent.parts, file.stem]
        at = next((i for i, p in enumerate(parts) if SPLIT.match(p.lower())), None)
        name = "all" if at is None else names[SPLIT.match(parts[at].lower()).group(1)]
        found.append((file, name, next((int(p) for p in parts[:at] if p.isascii() and p.isdigit()), None)))
    days = [day for _, name, day in found if name != "all" and day is not None]
    if days:  # T4R's day folders: the last day's held-out files are held out, every other file trains
        if len(days) < len(found) or not any(day == max(days) and name != "train" for _, name, day in found):
            sys.exit(f"{path}: split files outside day folders, or no valid/test file in the last day folder (MerlinSource refuses it)")
        found = [(file, name if day == max(days) else "train", day) for file, name, day in found]
    groups: dict = {}
    for file, name, _ in found:
        table = pq.ParquetFile(file).read(columns=[item], use_pandas_metadata=False)
        groups.setdefault(name, []).append(table.replace_schema_metadata(None))  # pandas' index, not read
    tables = {}
    for name, parts in groups.items():
        table = pa.concat_tables(parts, promote_options="permissive")
        column = table.column(item).combine_chunks()
        if pa.types.is_floating(column.type.value_type):  # NVTabular's padded lists: T4R embeds only integer tensors
            column = column.cast(pa.list_(pa.int64()))
            table = table.set_column(0, item, column)
        flat, parent = pc.list_flatten(column), pc.list_parent_indices(column).to_numpy()
        kept = pc.not_equal(flat, pa.scalar(0, flat.type)).to_numpy(zero_copy_only=False) if not pa.types.is_string(flat.type) else True
        counts = np.bincount(parent[kept] if kept is not True else parent, minlength=table.num_rows)
        tables[name] = table.filter(pa.array(counts >= 2))  # MerlinSource's min_length
    if "all" in tables:
        rest, test = tail(tables["all"], test_fraction)
        train, valid = tail(rest, valid_fraction / (1.0 - test_fraction))
    elif "test" in tables:
        test = tables["test"]
        train, valid = (tables["train"], tables["valid"]) if "valid" in tables else tail(tables["train"], valid_fraction)
    else:
        test = tables["valid"]
        train, valid = tail(tables["train"], valid_fraction)
    return {"train": train, "valid": valid, "test": test}


if __name__ == "__main__":
    main()
