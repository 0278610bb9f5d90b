"""Embedding lookups: 26 separate `nn.EmbeddingBag` vs sessrec's fused core vs TorchRec, and memcpy.

Setup: 26 tables with log-uniform cardinalities in [1e3, 1e6] (seeded), width 64 fp32,
batch 4096, every feature 1-hot or 10-hot. Ids follow a power law (P(rank r) ~ r^-alpha, alpha 1.05,
drawn by the inverse CDF of the continuous law, seeded) and the ranks are scattered over the table
by a fixed odd multiplier, so hot rows are not neighbours.

Contenders, built from the same table sizes and timed on the same batches:

- ``separate``: 26 `nn.EmbeddingBag(mode="sum", sparse=True)`, one call per table on per-table
  (ids, offsets) prepared in advance (their split is not timed), one `torch.optim.SGD` (or
  `torch.optim.Adagrad`) over the 26 weights. Sparse gradients are the fairest standard setup: a
  dense gradient would write a full 1 GB table gradient every step.
- ``fused``: `FusedEmbeddingBagCollection` on the same batch as one `SparseFeatures`, with its
  fused optimizer (``sgd``, or ``adagrad_rowwise`` against torch's element-wise sparse Adagrad:
  different state, same access pattern). Forward includes the id range check. Its SGD update is
  the TorchInductor-compiled scatter (compiled during warm-up) unless ``--eager-update``.
- ``torchrec``: TorchRec's unsharded `EmbeddingBagCollection` on a `KeyedJaggedTensor`, forward
  only (if ``import torchrec`` works); it has no fused or sparse optimizer.
- ``torchrec_fused``: for the training step, TorchRec's `FusedEmbeddingBagCollection` (FBGEMM's CPU
  table-batched embeddings with the update fused into backward; SGD, or TorchRec's `RowWiseAdagrad`,
  the same algorithm as ours), when it imports. A reference point, not our implementation.
- ``memcpy``: ``dst.copy_(src)`` of a buffer (512 MB by default) far larger than the caches.

Allocator: with ``--malloc retain`` (the default) glibc is asked at start-up to keep freed memory
(`retain_freed_memory`, what `DLRMTask` does when fitting), for every contender alike. With
``--malloc default`` glibc hands freed memory back to the kernel and each contender pays page
faults that depend on where the heap's free blocks happen to lie: the same code measured from
1.1x to 2.2x between processes.

Forward is timed under ``torch.no_grad()``; the training step is forward, ``sum`` of the pooled
outputs as the loss, backward, and the optimizer step. Each measurement is the mean over
``--iters`` calls; measurements alternate between contenders (A, B, C, A, B, C, ...) and medians are
compared, because the machine is shared and noisy. Wall-clock times are the headline figures;
the thread's CPU time is recorded too (``*_cpu_ms``, ``*_cpu`` ratios), since on a loaded machine
the wall clock also counts time spent waiting for a core.

Bandwidth: ``rows_GBps`` is the bytes of the embedding rows gathered (ids x stored width x 4) per
second of forward, the same byte count for every contender (the pooled outputs written are not
counted; with power-law ids many rows repeat and come from the cache, so this is not DRAM traffic).
``memcpy_GBps`` counts read + write (2 x buffer bytes per copy, the STREAM convention);
``memcpy_copy_GBps`` counts the buffer once. The fraction in the JSON is against the read + write
figure (the stricter of the two), and uses wall-clock medians for both.

Padding: the same comparison runs the fused core with width 62 (248 bytes, not a multiple of 16),
padded to 64 (``pad_to_bytes=16``) and unpadded (``pad_to_bytes=0``).

Prints one JSON line per comparison on stdout; progress goes to stderr.

Example (from the repository root):
    python benchmarks/embedding.py --threads 1 --repeats 5
    python benchmarks/embedding.py --quick
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable

import torch
from torch import nn

from sessrec.embeddings import (
    FusedEmbeddingBagCollection,
    SparseFeatures,
    TableConfig,
    retain_freed_memory,
    to_embedding_bag_configs,
    to_keyed_jagged_tensor,
)


def table_sizes(n: int, low: float, high: float, seed: int) -> list[int]:
    """``n`` log-uniform cardinalities in [low, high]."""
    g = torch.Generator().manual_seed(seed)
    exponents = torch.empty(n, dtype=torch.float64).uniform_(torch.tensor(low).log10().item(), torch.tensor(high).log10().item(), generator=g)
    return [round(10 ** e) for e in exponents.tolist()]


def power_law_ids(rows: int, count: int, alpha: float, g: torch.Generator) -> torch.Tensor:
    """(count,) ids in [0, rows): rank r with P ~ r^-alpha, ranks scattered by an odd multiplier."""
    u = torch.rand(count, generator=g, dtype=torch.float64)
    top = float(rows + 1) ** (1 - alpha)
    ranks = ((top - 1) * u + 1) ** (1 / (1 - alpha)) - 1  # continuous inverse CDF on [0, rows)
    ranks = ranks.long().clamp(max=rows - 1)
    return (ranks * 2654435761) % rows


def make_batch(sizes: list[int], batch: int, hot: int, alpha: float, seed: int):
    """One batch: `SparseFeatures` for the fused core and per-table (ids, offsets) for the bags."""
    g = torch.Generator().manual_seed(seed)
    per_table = [power_law_ids(rows, batch * hot, alpha, g) for rows in sizes]
    offsets = torch.arange(0, batch * hot, hot)
    keys = tuple(f"t{i}" for i in range(len(sizes)))
    features = SparseFeatures(keys, torch.cat(per_table), torch.full((len(sizes) * batch,), hot, dtype=torch.long))
    return features, [(ids, offsets) for ids in per_table]


def timed(fn: Callable[[], object], iters: int) -> tuple[float, float]:
    """Wall-clock and this thread's CPU seconds per call, averaged over ``iters`` calls.

    The cyclic garbage collector is run before and paused during the calls: a full collection of
    the process's objects (tens of ms) would otherwise land in whichever call happens to trigger it.
    `interleave` freezes what its warm-up leaves alive, so that this collection scans only the objects
    made since (a full one takes about 0.2 s once torch's compiler is loaded).
    """
    gc.collect()
    gc.disable()
    try:
        start, cpu = time.perf_counter(), time.thread_time()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - start) / iters, (time.thread_time() - cpu) / iters
    finally:
        gc.enable()


def interleave(contenders: dict[str, Callable[[], object]], args: argparse.Namespace, label: str) -> dict[str, list[float]]:
    """Warm up, then time the contenders alternately; wall seconds per call, per contender.

    CPU seconds go to ``name + "_cpu"``: on a shared machine the wall clock also counts the time the
    thread waited for a core, the CPU time does not (both still share caches and memory bandwidth).
    """
    for fn in contenders.values():
        for _ in range(args.warmup):
            fn()
    times: dict[str, list[float]] = {k: [] for name in contenders for k in (name, f"{name}_cpu")}
    gc.collect()
    gc.freeze()  # the modules, the compiled kernels and the contenders' tables: out of every measurement's collection
    try:
        for r in range(args.repeats):
            for name, fn in contenders.items():
                wall, cpu = timed(fn, args.iters)
                times[name].append(wall)
                times[f"{name}_cpu"].append(cpu)
                print(f"{label} repeat {r} {name}: {wall * 1e3:.2f} ms ({cpu * 1e3:.2f} ms CPU)", file=sys.stderr)
    finally:
        gc.unfreeze()  # the comparison's tables can go when it returns, even from a reference cycle
    return times


def median_ms(xs: list[float]) -> float:
    return round(statistics.median(xs) * 1e3, 3)


def ratio(slow: list[float], fast: list[float]) -> tuple[float, list[float]]:
    """Median ratio slow / fast and the per-pair range."""
    pairs = [a / b for a, b in zip(slow, fast)]
    return round(statistics.median(slow) / statistics.median(fast), 2), [round(min(pairs), 2), round(max(pairs), 2)]


def torchrec_forward(sizes: list[int], dim: int, features: SparseFeatures) -> Callable[[], object] | None:
    """TorchRec's unsharded EmbeddingBagCollection forward, or None when torchrec does not import."""
    try:
        import torchrec
    except Exception as error:  # noqa: BLE001  optional: any import failure (missing, fbgemm mismatch) skips it
        print(f"torchrec not available ({type(error).__name__}: {error}); skipped", file=sys.stderr)
        return None
    configs = to_embedding_bag_configs([TableConfig(k, n, dim) for k, n in zip(features.keys, sizes)])
    ebc = torchrec.EmbeddingBagCollection(tables=configs, device=torch.device("cpu"))
    kjt = to_keyed_jagged_tensor(features)

    def run():
        with torch.no_grad():
            return ebc(kjt).values()

    return run


def torchrec_fused_step(sizes: list[int], dim: int, features: SparseFeatures, opt: str, lr: float) -> Callable[[], object] | None:
    """A training step of TorchRec's fused-optimizer `FusedEmbeddingBagCollection` (FBGEMM's CPU
    table-batched embeddings; SGD, or row-wise Adagrad like ours), or None when torchrec does not import."""
    try:
        from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection as TorchRecFused
        from torchrec.optim import RowWiseAdagrad
    except Exception as error:  # noqa: BLE001  optional: any import failure (missing, fbgemm mismatch) skips it
        print(f"torchrec fused EBC not available ({type(error).__name__}: {error}); skipped", file=sys.stderr)
        return None
    configs = to_embedding_bag_configs([TableConfig(k, n, dim) for k, n in zip(features.keys, sizes)])
    optimizer = RowWiseAdagrad if opt == "adagrad" else torch.optim.SGD
    ebc = TorchRecFused(configs, optimizer_type=optimizer, optimizer_kwargs={"lr": lr}, device=torch.device("cpu"))
    kjt = to_keyed_jagged_tensor(features)

    def run():
        ebc(kjt).values().sum().backward()  # the update runs in backward, as in ours

    return run


def compare_forward(sizes: list[int], hot: int, args: argparse.Namespace) -> dict:
    """Forward of the three contenders and memcpy, interleaved; the JSON record."""
    features, per_table = make_batch(sizes, args.batch, hot, args.alpha, args.seed + hot)
    tables = [TableConfig(k, n, args.dim) for k, n in zip(features.keys, sizes)]
    torch.manual_seed(args.seed)
    bags = nn.ModuleList(nn.EmbeddingBag(n, args.dim, mode="sum", sparse=True) for n in sizes)
    fused = FusedEmbeddingBagCollection(tables, optimizer="sgd", lr=args.lr, seed=args.seed)
    src = torch.ones(args.memcpy_mb * 2**20 // 4)
    dst = torch.empty_like(src)

    def separate_forward():
        with torch.no_grad():
            return [bag(ids, offsets) for bag, (ids, offsets) in zip(bags, per_table)]

    def fused_forward():
        with torch.no_grad():
            return fused(features)

    contenders = {"separate": separate_forward, "fused": fused_forward}
    tr = torchrec_forward(sizes, args.dim, features)
    if tr is not None:
        contenders["torchrec"] = tr
    contenders["memcpy"] = lambda: dst.copy_(src)
    times = interleave(contenders, args, f"{hot}-hot forward")
    row_bytes = features.values.numel() * fused.widths[0] * 4
    memcpy_rw = 2 * src.numel() * 4 / statistics.median(times["memcpy"]) / 1e9
    speedup, spread = ratio(times["separate"], times["fused"])
    record = {
        "benchmark": "embedding", "pass": "forward", "hot": hot, "tables": len(sizes), "rows": sum(sizes),
        "dim": args.dim, "batch_size": args.batch, "alpha": args.alpha, "threads": args.threads, "malloc": args.malloc,
        "repeats": args.repeats, "iters": args.iters,
        **{f"{name}_ms": median_ms(t) for name, t in times.items() if not name.startswith("memcpy")},
        "fused_speedup_vs_separate": speedup, "fused_speedup_min_max": spread,
        "fused_speedup_vs_separate_cpu": ratio(times["separate_cpu"], times["fused_cpu"])[0],
        "rows_MB": round(row_bytes / 1e6, 1),
        "memcpy_GBps": round(memcpy_rw, 2), "memcpy_copy_GBps": round(memcpy_rw / 2, 2),
    }
    for name in ("separate", "fused", "torchrec"):
        if name in times:
            gbps = row_bytes / statistics.median(times[name]) / 1e9
            record[f"{name}_rows_GBps"] = round(gbps, 2)
            record[f"{name}_fraction_of_memcpy"] = round(gbps / memcpy_rw, 3)
    if "torchrec" in times:
        record["fused_speedup_vs_torchrec"] = ratio(times["torchrec"], times["fused"])[0]
    return record


def compare_step(sizes: list[int], hot: int, opt: str, args: argparse.Namespace) -> dict:
    """Forward + backward + optimizer step, separate bags vs fused core, interleaved; the JSON record."""
    features, per_table = make_batch(sizes, args.batch, hot, args.alpha, args.seed + hot)
    tables = [TableConfig(k, n, args.dim) for k, n in zip(features.keys, sizes)]
    torch.manual_seed(args.seed)
    bags = nn.ModuleList(nn.EmbeddingBag(n, args.dim, mode="sum", sparse=True) for n in sizes)
    fused_opt = "adagrad_rowwise" if opt == "adagrad" else "sgd"
    fused = FusedEmbeddingBagCollection(tables, optimizer=fused_opt, lr=args.lr, seed=args.seed,
                                        compile_update=not args.eager_update)
    optim_class = torch.optim.Adagrad if opt == "adagrad" else torch.optim.SGD
    outer = optim_class(bags.parameters(), lr=args.lr)

    def separate_step():
        outer.zero_grad(set_to_none=True)
        sum(bag(ids, offsets).sum() for bag, (ids, offsets) in zip(bags, per_table)).backward()
        outer.step()

    def fused_step():
        sum(o.sum() for o in fused(features).values()).backward()

    contenders = {"separate": separate_step, "fused": fused_step}
    tr = torchrec_fused_step(sizes, args.dim, features, opt, args.lr)
    if tr is not None:
        contenders["torchrec_fused"] = tr
    times = interleave(contenders, args, f"{hot}-hot train {opt}")
    speedup, spread = ratio(times["separate"], times["fused"])
    extra = {} if tr is None else {
        "torchrec_fused_ms": median_ms(times["torchrec_fused"]),
        "torchrec_fused_optimizer": "adagrad_rowwise" if opt == "adagrad" else "sgd",
        "fused_speedup_vs_torchrec_fused": ratio(times["torchrec_fused"], times["fused"])[0],
    }
    return {
        "benchmark": "embedding", "pass": "forward_backward_step", "hot": hot, "optimizer": opt,
        "fused_optimizer": fused_opt, "compiled_update": fused_opt == "sgd" and not args.eager_update,
        "tables": len(sizes), "rows": sum(sizes), "dim": args.dim,
        "batch_size": args.batch, "threads": args.threads, "malloc": args.malloc, "repeats": args.repeats, "iters": args.iters,
        "separate_ms": median_ms(times["separate"]), "fused_ms": median_ms(times["fused"]),
        "fused_speedup_vs_separate": speedup, "fused_speedup_min_max": spread,
        "separate_cpu_ms": median_ms(times["separate_cpu"]), "fused_cpu_ms": median_ms(times["fused_cpu"]),
        "fused_speedup_vs_separate_cpu": ratio(times["separate_cpu"], times["fused_cpu"])[0],
        **extra,
    }


def compare_padding(sizes: list[int], hot: int, args: argparse.Namespace) -> dict:
    """Fused core at width 62: padded to 64 (16 bytes) vs unpadded, forward and SGD step."""
    features, _ = make_batch(sizes, args.batch, hot, args.alpha, args.seed + hot)
    tables = [TableConfig(k, n, 62) for k, n in zip(features.keys, sizes)]
    padded = FusedEmbeddingBagCollection(tables, pad_to_bytes=16, optimizer="sgd", lr=args.lr, seed=args.seed)
    plain = FusedEmbeddingBagCollection(tables, pad_to_bytes=0, optimizer="sgd", lr=args.lr, seed=args.seed)

    def forward(model):
        with torch.no_grad():
            return model(features)

    def step(model):
        sum(o.sum() for o in model(features).values()).backward()

    fwd = interleave({"padded": lambda: forward(padded), "unpadded": lambda: forward(plain)}, args, f"{hot}-hot pad fwd")
    trn = interleave({"padded": lambda: step(padded), "unpadded": lambda: step(plain)}, args, f"{hot}-hot pad step")
    return {
        "benchmark": "embedding", "pass": "padding", "hot": hot, "dim": 62, "padded_width": padded.widths[0],
        "unpadded_width": plain.widths[0], "batch_size": args.batch, "threads": args.threads, "malloc": args.malloc, "repeats": args.repeats,
        "forward_padded_ms": median_ms(fwd["padded"]), "forward_unpadded_ms": median_ms(fwd["unpadded"]),
        "forward_unpadded_over_padded": ratio(fwd["unpadded"], fwd["padded"])[0],
        "step_padded_ms": median_ms(trn["padded"]), "step_unpadded_ms": median_ms(trn["unpadded"]),
        "step_unpadded_over_padded": ratio(trn["unpadded"], trn["padded"])[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, default=26)
    parser.add_argument("--min-rows", type=float, default=1e3)
    parser.add_argument("--max-rows", type=float, default=1e6)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--hot", type=int, nargs="+", default=[1, 10], help="ids per feature and sample")
    parser.add_argument("--alpha", type=float, default=1.05, help="power-law exponent of the ids")
    parser.add_argument("--optimizers", nargs="+", default=["sgd", "adagrad"], choices=["sgd", "adagrad"])
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--memcpy-mb", type=int, default=512, help="memcpy buffer size")
    parser.add_argument("--no-padding", action="store_true", help="skip the width-62 padding comparison")
    parser.add_argument("--repeats", type=int, default=5, help="timed measurements of each contender")
    parser.add_argument("--iters", type=int, default=5, help="calls per measurement")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls of each contender")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eager-update", action="store_true", help="the fused SGD step without the compiled scatter")
    parser.add_argument("--malloc", choices=["retain", "default"], default="retain",
                        help="retain: glibc keeps freed memory (retain_freed_memory, as DLRMTask does) for every "
                             "contender; default: glibc's own trimming, whose page faults depend on the heap's layout")
    parser.add_argument("--quick", action="store_true", help="tiny smoke size (4 tables <= 1e4 rows, batch 256)")
    args = parser.parse_args()
    if args.quick:
        args.tables, args.max_rows, args.batch, args.memcpy_mb = 4, 1e4, 256, 16
        args.repeats, args.iters, args.warmup = 2, 2, 1
    if args.repeats < 1 or args.iters < 1:
        parser.error("--repeats and --iters must be >= 1")
    torch.set_num_threads(args.threads)
    if args.malloc == "retain" and not retain_freed_memory():
        print("glibc did not accept retain_freed_memory: running with the default allocator", file=sys.stderr)
        args.malloc = "default"
    sizes = table_sizes(args.tables, args.min_rows, args.max_rows, args.seed)
    print(f"{args.tables} tables, {sum(sizes):,} rows, {sum(sizes) * args.dim * 4 / 1e9:.2f} GB each copy", file=sys.stderr)
    for hot in args.hot:  # each comparison builds its own tables, freed when it returns
        print(json.dumps(compare_forward(sizes, hot, args)), flush=True)
        for opt in args.optimizers:
            print(json.dumps(compare_step(sizes, hot, opt, args)), flush=True)
    if not args.no_padding:
        for hot in args.hot:
            print(json.dumps(compare_padding(sizes, hot, args)), flush=True)


if __name__ == "__main__":
    main()
