"""Training throughput of XLNet-MLM: full optimisation steps per second on synthetic sessions.

A step is what `NextItemTask` does in training, without Lightning around it: masking
(`MaskedItemModeling`, seeded per step) -> `model.encode` -> hidden states at the masked
positions -> `model.score` over the whole catalogue -> cross-entropy -> backward -> AdamW step.
Sessions are random item ids (seeded), lengths uniform in 2..max-len, right-aligned with 0
padding, as the loader delivers them. The median of the timed steps is reported after warm-up.

Prints one JSON line on stdout; progress goes to stderr.

Example (from the repository root):
    python benchmarks/train_throughput.py --steps 30 --threads 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from sessrec.data.vocab import NUM_SPECIAL
from sessrec.models import MaskedItemModeling, SessionModel, XLNetEncoder
from sessrec.tasks.optim import adamw


def synthetic_sessions(n: int, max_len: int, items: int, generator: torch.Generator) -> torch.Tensor:
    """(n, max_len) right-aligned random sessions: ids in [NUM_SPECIAL, items + NUM_SPECIAL), 0 = padding."""
    ids = torch.randint(NUM_SPECIAL, items + NUM_SPECIAL, (n, max_len), generator=generator)
    lengths = torch.randint(2, max_len + 1, (n, 1), generator=generator)
    padding = torch.arange(max_len).unsqueeze(0) < (max_len - lengths)  # (n, max_len)
    return ids.masked_fill(padding, 0)


def build_model(args: argparse.Namespace) -> SessionModel:
    encoder = XLNetEncoder(
        d_model=args.d_model, n_head=args.n_head, n_layer=args.n_layer, dropout=args.dropout
    )
    return SessionModel(
        num_items=args.items + NUM_SPECIAL, encoder=encoder, max_length=args.max_len + 1, dropout=args.dropout
    )


def add_model_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--n-layer", type=int, default=2)
    parser.add_argument(
        "--max-len", type=int, default=20, help="items per session (the model adds a [MASK] slot)"
    )
    parser.add_argument("--items", type=int, default=10_000, help="catalogue size (without padding and OOV)")
    parser.add_argument("--dropout", type=float, default=0.3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_flags(parser)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=30, help="timed steps (>= 20)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()
    if args.steps < 20:
        parser.error("--steps must be >= 20 for a stable median")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    model = build_model(args).train()
    objective = MaskedItemModeling()
    optimizer = adamw(model.parameters(), lr=args.lr)  # as NextItemTask: fused where supported
    gen = torch.Generator().manual_seed(args.seed)
    pool = synthetic_sessions(16 * args.batch, args.max_len, args.items, gen)  # cycled, (16 B, L)

    def step(i: int) -> tuple[float, int]:
        items = pool[(i % 16) * args.batch : (i % 16 + 1) * args.batch]  # (B, L)
        start = time.perf_counter()
        m = objective(items, torch.Generator().manual_seed(args.seed * 7919 + i))
        hidden = model.encode(m.inputs, m.masked)[m.masked]  # (N, D)
        loss = F.cross_entropy(model.score(hidden), m.targets)  # (N, V) full softmax
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        elapsed = time.perf_counter() - start
        if not torch.isfinite(loss):
            raise RuntimeError(f"loss is {loss.item()} at step {i}")
        return elapsed, int(m.targets.numel())

    for i in range(args.warmup):
        step(i)
    times, targets = [], []
    for i in range(args.warmup, args.warmup + args.steps):
        seconds, n = step(i)
        times.append(seconds)
        targets.append(n)
        print(f"step {i}: {seconds * 1e3:.1f} ms, {n} masked targets", file=sys.stderr)

    median = statistics.median(times)
    print(json.dumps({
        "benchmark": "train_throughput",
        "d_model": args.d_model, "n_head": args.n_head, "n_layer": args.n_layer, "max_len": args.max_len,
        "items": args.items, "batch_size": args.batch, "dropout": args.dropout, "threads": args.threads,
        "parameters": sum(p.numel() for p in model.parameters()),
        "timed_steps": args.steps,
        "median_masked_targets_per_step": statistics.median(targets),
        "median_step_ms": round(median * 1e3, 2),
        "step_ms_min_max": [round(min(times) * 1e3, 2), round(max(times) * 1e3, 2)],
        "steps_per_s": round(1.0 / median, 2),
        "sessions_per_s": round(args.batch / median, 1),
    }))


if __name__ == "__main__":
    main()
