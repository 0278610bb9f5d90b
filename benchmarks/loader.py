"""Training-batch throughput: sessrec's columnar `SessionLoader` vs. a per-item torch `Dataset`.

Both sides iterate the same padded (N, L) training tensor of a real dataset (SR-GNN diginetica by
default) in shuffled batches of the same size and touch every batch (sum of the item ids). The
sessrec side is `SessionDataModule.train_dataloader()` as training uses it (one row gather per
batch, trimmed to the longest session); the baseline is the textbook `Dataset.__getitem__` that
returns one padded row, batched by `DataLoader(shuffle=True)` with the default collate and no
workers. Measurements alternate (A, B, A, B, ...) and the medians are compared, because the
machine is shared and noisy.

The per-item loader costs about a microsecond per session whatever the batch size; the columnar
loader costs about twenty microseconds per batch (a gather, a slice, a small object) whatever the
number of sessions in it. The ratio therefore grows with the batch size, so it is reported for
each `--batch` given; 512 is the training batch size of the recipes.

Prints one JSON line per batch size on stdout; progress goes to stderr.

Example (from the repository root):
    python benchmarks/loader.py --threads 1 --repeats 5 --batch 256 512 1024
    python benchmarks/loader.py --quick   # smoke size: 2,000 synthetic sessions, batch 64 and 128, 5 batches x 2 repeats
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Iterable

import torch
from torch.utils.data import DataLoader, Dataset

from sessrec.data import SRGNNSource, SyntheticSource
from sessrec.tasks import SessionDataModule


class PaddedRowDataset(Dataset):
    """The per-item baseline: `__getitem__` returns one padded (L,) row of the same tensor."""

    def __init__(self, items: torch.Tensor) -> None:
        self.items = items

    def __len__(self) -> int:
        return self.items.shape[0]

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.items[i]


def time_epoch(batches: Iterable, max_batches: int) -> tuple[float, int]:
    """Seconds to draw up to `max_batches` batches (0 = the whole epoch) and the sessions seen."""
    sessions, total = 0, 0
    start = time.perf_counter()
    for n, batch in enumerate(batches):
        items = batch.items if hasattr(batch, "items") else batch  # SessionBatch or (B, L) tensor
        total += int(items.sum())  # touch the batch
        sessions += items.shape[0]
        if max_batches and n + 1 >= max_batches:
            break
    elapsed = time.perf_counter() - start
    assert total > 0 and sessions > 0
    return elapsed, sessions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=None,
                        help="SR-GNN dataset folder, or 'synthetic' (SyntheticSource, 2,000 sessions); "
                             "default ../shared/data/diginetica_srgnn (synthetic with --quick)")
    parser.add_argument("--max-length", type=int, default=20)
    parser.add_argument("--batch", type=int, nargs="+", default=[256, 512], help="batch sizes to compare at")
    parser.add_argument("--batches", type=int, default=0, help="batches per measurement; 0 = a full epoch")
    parser.add_argument("--repeats", type=int, default=5, help="timed measurements of each loader")
    parser.add_argument("--warmup", type=int, default=1, help="untimed epochs (or --batches) of each loader")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true",
                        help="smoke size (synthetic data unless --data, batch 64 and 128, 5 batches x 2 repeats); overrides those")
    args = parser.parse_args()
    if args.quick:
        args.data = args.data or "synthetic"
        args.batch, args.batches, args.repeats, args.warmup = [64, 128], 5, 2, 1
    args.data = args.data or "../shared/data/diginetica_srgnn"
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    t0 = time.perf_counter()
    source = SyntheticSource(num_sessions=2_000, num_items=500, seed=args.seed) if args.data == "synthetic" else SRGNNSource(args.data)
    dm = SessionDataModule(source=source, max_length=args.max_length, seed=args.seed)
    items, _ = dm.tensors("train")  # (N, L)
    seconds = time.perf_counter() - t0
    print(f"loaded {tuple(items.shape)} training sessions in {seconds:.1f}s", file=sys.stderr)
    for batch_size in args.batch:
        print(json.dumps(compare(dm, items, batch_size, args)))


def compare(dm: SessionDataModule, items: torch.Tensor, batch_size: int, args: argparse.Namespace) -> dict:
    """Interleaved timing of both loaders at one batch size; the JSON record."""
    dm.batch_size = batch_size
    sessrec_loader = dm.train_dataloader()  # shuffled; drops the last incomplete batch
    torch_loader = DataLoader(
        PaddedRowDataset(items), batch_size=batch_size, shuffle=True, num_workers=0,
        drop_last=sessrec_loader.drop_last,
    )
    runs = {"sessrec": (sessrec_loader, []), "torch_dataset": (torch_loader, [])}

    for _ in range(args.warmup):
        for loader, _rates in runs.values():
            time_epoch(loader, args.batches)
    for r in range(args.repeats):
        for name, (loader, rates) in runs.items():  # interleaved: A, B, A, B, ...
            seconds, sessions = time_epoch(loader, args.batches)
            rates.append(sessions / seconds)
            print(f"batch {batch_size} repeat {r} {name}: {sessions} sessions in {seconds:.3f}s", file=sys.stderr)

    sessrec_rate = statistics.median(runs["sessrec"][1])
    torch_rate = statistics.median(runs["torch_dataset"][1])
    ratios = [a / b for a, b in zip(runs["sessrec"][1], runs["torch_dataset"][1])]
    return {
        "benchmark": "loader",
        "dataset": args.data.rstrip("/").split("/")[-1],
        "sessions": int(items.shape[0]),
        "max_length": args.max_length,
        "batch_size": batch_size,
        "batches_per_measurement": args.batches or len(sessrec_loader),
        "repeats": args.repeats,
        "threads": args.threads,
        "sessrec_sessions_per_s": round(sessrec_rate),
        "torch_dataset_sessions_per_s": round(torch_rate),
        "ratio": round(sessrec_rate / torch_rate, 1),
        "ratio_min_max": [round(min(ratios), 1), round(max(ratios), 1)],
    }


if __name__ == "__main__":
    main()
