"""DLRM training throughput on synthetic Criteo-like data: sessrec vs TorchRec's DLRM, same sizes.

A step: forward (bottom MLP, 26 table lookups, dot interaction, top MLP) -> BCE -> backward ->
optimizer step. Adam (lr 1e-3) on the MLPs in every variant; the tables differ:

- ``sessrec_fused_rowwise_adagrad``: `sessrec.models.DLRM` with the embedding core's fused
  row-wise Adagrad (rows updated inside backward, no table-sized gradient): the DLRMTask default.
- ``sessrec_dense_adagrad``: `sessrec.models.DLRM` with tables as plain parameters and
  `torch.optim.Adagrad` (a dense, table-sized gradient and update every step).
- ``torchrec_dense_adagrad``: `torchrec.models.dlrm.DLRM` over an `EmbeddingBagCollection`, tables in
  `torch.optim.Adagrad` (skipped when ``import torchrec`` fails).

Variants are timed in turn inside each repeat (interleaved, so machine noise hits all alike),
after warm-up; each repeat times `--steps` steps over pre-built batches. One JSON line per variant
(median samples/s over repeats, and the ratio to the TorchRec variant when present), then a
summary line.

Example (from the repository root):
    python benchmarks/dlrm.py --batch 2048 --steps 10 --repeats 5
    python benchmarks/dlrm.py --quick   # smoke size: 4 tables of 100-1000 rows, batch 256, 2 steps x 2 repeats
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from sessrec.datasets.criteo import generate_criteo
from sessrec.embeddings import FusedTables, TableConfig, to_keyed_jagged_tensor
from sessrec.models.dlrm import DLRM


def cardinalities(n: int, low: float, high: float, seed: int) -> list[int]:
    """`n` table sizes, log-uniform in [low, high]."""
    rng = np.random.default_rng(seed)
    return [int(c) for c in np.exp(rng.uniform(np.log(low), np.log(high), n))]


def training_step(opts: list[torch.optim.Optimizer], logits: Callable[[tuple], torch.Tensor]) -> Callable:
    """One BCE training step over a batch ``(dense, sparse, labels, kjt)`` with every optimizer in `opts`."""

    def step(batch: tuple) -> None:
        loss = F.binary_cross_entropy_with_logits(logits(batch), batch[2])
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        loss.backward()
        for opt in opts:
            opt.step()

    return step


def sessrec_step(args: argparse.Namespace, cards: list[int], keys: tuple[str, ...], fused: bool) -> Callable:
    torch.manual_seed(args.seed)
    tables = [TableConfig(k, c, args.dim) for k, c in zip(keys, cards)]
    model = DLRM(13, tables, args.dense_layers, args.over_layers,
                 sparse=FusedTables(optimizer="adagrad_rowwise" if fused else "none", lr=0.01), seed=args.seed)
    table_params = list(model.sparse_arch.parameters())
    ids = {id(p) for p in table_params}
    opts = [torch.optim.Adam([p for p in model.parameters() if id(p) not in ids], lr=1e-3)]
    if table_params:
        opts.append(torch.optim.Adagrad(table_params, lr=0.01))

    return training_step(opts, lambda batch: model(batch[0], batch[1]))


def torchrec_step(args: argparse.Namespace, cards: list[int], keys: tuple[str, ...]) -> Callable:
    from torchrec.models.dlrm import DLRM as TorchRecDLRM
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    torch.manual_seed(args.seed)
    configs = [EmbeddingBagConfig(name=f"t_{k}", embedding_dim=args.dim, num_embeddings=c, feature_names=[k])
               for k, c in zip(keys, cards)]
    ebc = EmbeddingBagCollection(tables=configs, device=torch.device("cpu"))
    model = TorchRecDLRM(ebc, 13, list(args.dense_layers), [*args.over_layers, 1])
    table_params = list(ebc.parameters())
    ids = {id(p) for p in table_params}
    opts = [torch.optim.Adam([p for p in model.parameters() if id(p) not in ids], lr=1e-3),
            torch.optim.Adagrad(table_params, lr=0.01)]

    return training_step(opts, lambda batch: model(batch[0], batch[3]).squeeze(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per variant per repeat")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--tables", type=int, default=26)
    parser.add_argument("--min-rows", type=float, default=1e3)
    parser.add_argument("--max-rows", type=float, default=1e5)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--multi-hot", type=int, default=1)
    parser.add_argument("--dense-layers", type=lambda s: [int(x) for x in s.split(",")], default=[64, 16])
    parser.add_argument("--over-layers", type=lambda s: [int(x) for x in s.split(",")], default=[128, 64])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true",
                        help="smoke size (4 tables of 100-1000 rows, batch 256, 2 steps x 2 repeats, 1 warm-up); overrides those")
    args = parser.parse_args()
    if args.quick:
        args.batch, args.steps, args.repeats, args.warmup = 256, 2, 2, 1
        args.tables, args.min_rows, args.max_rows = 4, 1e2, 1e3
    torch.set_num_threads(args.threads)

    cards = cardinalities(args.tables, args.min_rows, args.max_rows, args.seed)
    n_batches = args.steps + args.warmup
    data = generate_criteo(args.batch * n_batches, cards, multi_hot=args.multi_hot, seed=args.seed)
    try:
        import torchrec  # noqa: F401
        has_torchrec = True
    except Exception as err:  # noqa: BLE001 - any import failure means "not installed here"
        has_torchrec = False
        print(json.dumps({"bench": "dlrm_train", "variant": "torchrec_dense_adagrad", "skipped": repr(err)}), flush=True)
    batches = []
    for i in range(n_batches):
        dense, sparse, labels = data.batch(i * args.batch, (i + 1) * args.batch)
        kjt = to_keyed_jagged_tensor(sparse) if has_torchrec else None
        batches.append((dense, sparse, labels, kjt))

    variants = {
        "sessrec_fused_rowwise_adagrad": sessrec_step(args, cards, data.keys, fused=True),
        "sessrec_dense_adagrad": sessrec_step(args, cards, data.keys, fused=False),
    }
    if has_torchrec:
        variants["torchrec_dense_adagrad"] = torchrec_step(args, cards, data.keys)
    for name, step in variants.items():
        for batch in batches[: args.warmup]:
            step(batch)
        print(f"warmed up {name}", file=sys.stderr)

    rates: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(args.repeats):
        for name, step in variants.items():
            start = time.perf_counter()
            for batch in batches[args.warmup:]:
                step(batch)
            rates[name].append(args.steps * args.batch / (time.perf_counter() - start))
        print(f"repeat {r + 1}/{args.repeats}", file=sys.stderr)

    base = statistics.median(rates["torchrec_dense_adagrad"]) if "torchrec_dense_adagrad" in rates else None
    config = {"batch": args.batch, "tables": args.tables, "rows": f"{args.min_rows:g}-{args.max_rows:g} log-uniform",
              "total_rows": sum(cards), "dim": args.dim, "multi_hot": args.multi_hot,
              "dense_layers": args.dense_layers, "over_layers": args.over_layers, "threads": args.threads}
    summary = {}
    for name, values in rates.items():
        median = statistics.median(values)
        line = {"bench": "dlrm_train", "variant": name, "samples_per_s": round(median),
                "min": round(min(values)), "max": round(max(values)), **config}
        if base is not None:
            line["vs_torchrec"] = round(median / base, 2)
        summary[name] = round(median)
        print(json.dumps(line), flush=True)
    print(json.dumps({"bench": "dlrm_train_summary", "samples_per_s": summary, "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    main()
