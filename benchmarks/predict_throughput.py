"""Batch-scoring throughput of XLNet-MLM: top-20 recommendations per second at several batch sizes.

Same model and synthetic sessions as `train_throughput.py`, in eval mode under
`torch.inference_mode()`: `model(items)` (a [MASK] slot after each session, scores over the
whole catalogue) then `.topk(20)`, which is what `NextItemTask.predict_step` does. Batch sizes
are measured in turn (round-robin over repeats) and each reports the median after warm-up.

Prints one JSON line on stdout; progress goes to stderr.

Example (from the repository root):
    python benchmarks/predict_throughput.py --batches 256 1024 --threads 1
    python benchmarks/predict_throughput.py --quick
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
from train_throughput import add_model_flags, build_model, synthetic_sessions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_flags(parser)
    parser.add_argument("--batches", type=int, nargs="+", default=[256, 1024], help="batch sizes to measure")
    parser.add_argument("--top-k", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=20, help="timed batches per batch size")
    parser.add_argument("--warmup", type=int, default=3, help="untimed batches per batch size first")
    parser.add_argument("--quick", action="store_true",
                        help="smoke size: batches 16 64, 300 items, d_model 16, 2 heads, 1 layer, max-len 8, 3 repeats")
    args = parser.parse_args()
    if args.quick:
        args.batches, args.items, args.d_model, args.n_head, args.n_layer, args.max_len = [16, 64], 300, 16, 2, 1, 8
        args.repeats, args.warmup = 3, 1
    if args.repeats < 1 or min(args.batches) < 1:
        parser.error("--repeats and every --batches value must be >= 1")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    model = build_model(args).eval()
    gen = torch.Generator().manual_seed(args.seed)
    sessions = {b: synthetic_sessions(b, args.max_len, args.items, gen) for b in args.batches}  # (B, L) each
    times: dict[int, list[float]] = {b: [] for b in args.batches}

    def score(items: torch.Tensor) -> float:
        start = time.perf_counter()
        top = model(items).topk(args.top_k, dim=1)  # (B, V) -> (B, K)
        elapsed = time.perf_counter() - start
        assert top.indices.shape == (items.shape[0], args.top_k) and bool((top.indices >= 2).all())
        return elapsed

    with torch.inference_mode():
        for b in args.batches:
            for _ in range(args.warmup):
                score(sessions[b])
        for r in range(args.repeats):
            for b in args.batches:  # round-robin, so drift of the shared machine hits every size
                times[b].append(score(sessions[b]))
            shown = ", ".join(f"B={b} {times[b][-1] * 1e3:.1f} ms" for b in args.batches)
            print(f"repeat {r}: {shown}", file=sys.stderr)

    results = []
    for b in args.batches:
        median = statistics.median(times[b])
        results.append({
            "batch_size": b,
            "median_batch_ms": round(median * 1e3, 2),
            "batch_ms_min_max": [round(min(times[b]) * 1e3, 2), round(max(times[b]) * 1e3, 2)],
            "sessions_per_s": round(b / median, 1),
        })
    print(json.dumps({
        "benchmark": "predict_throughput",
        "d_model": args.d_model, "n_head": args.n_head, "n_layer": args.n_layer, "max_len": args.max_len,
        "items": args.items, "top_k": args.top_k, "threads": args.threads, "repeats": args.repeats,
        "results": results,
    }))


if __name__ == "__main__":
    main()
