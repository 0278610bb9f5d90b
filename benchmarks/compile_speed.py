"""torch.compile of a session model's encoder against eager PyTorch: the training step, interleaved.

Two copies of the same model (same seed, same weights) run the XLNet-MLM training step of
`train_throughput.py` (masking, encoder, full-softmax cross-entropy, backward, AdamW) in turn on
the same batches: one eager, one with ``model.encoder.compile()`` (TorchInductor; the item table,
masking and loss stay eager). Batches come at the loader's varying widths (trimmed to the longest
session in the batch, `--widths`), as in training, so recompilation for new shapes is part of what
is measured after warm-up (``dynamic=None``: torch marks a dimension dynamic once it has changed).
One JSON line: median step ms of each, and eager / compiled (above 1: compiled is faster).

    python benchmarks/compile_speed.py [--encoder xlnet|sasrec|gpt2] [--steps 30] [--threads 1]
    python benchmarks/compile_speed.py --quick
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from sessrec.data.vocab import NUM_SPECIAL
from sessrec.models import (
    CausalLanguageModeling,
    GPT2Encoder,
    MaskedItemModeling,
    SASRecEncoder,
    SessionModel,
    XLNetEncoder,
)
from sessrec.tasks.optim import adamw

ENCODERS = {
    "xlnet": (lambda a: XLNetEncoder(d_model=a.d_model, n_head=4, n_layer=2, dropout=0.1), MaskedItemModeling),
    "sasrec": (lambda a: SASRecEncoder(d_model=a.d_model, n_head=4, n_layer=2, dropout=0.1), CausalLanguageModeling),
    "gpt2": (lambda a: GPT2Encoder(d_model=a.d_model, n_head=4, n_layer=2, dropout=0.1), CausalLanguageModeling),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--encoder", choices=sorted(ENCODERS), default="xlnet")
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--widths", type=int, nargs="+", default=[12, 16, 20], help="batch widths, cycled")
    parser.add_argument("--steps", type=int, default=30, help="timed steps of each")
    parser.add_argument("--warmup", type=int, default=6, help="untimed steps of each (compilation happens here)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true",
                        help="smoke size: d_model 16, 300 items, batch 16, widths 8, 3 steps, 2 warm-up (one compilation)")
    args = parser.parse_args()
    if args.quick:
        args.d_model, args.items, args.batch, args.widths, args.steps, args.warmup = 16, 300, 16, [8], 3, 2
        import torch._inductor.config

        torch._inductor.config.compile_threads = 1  # no pool of compile workers to start for one small graph
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    build, objective_type = ENCODERS[args.encoder]
    eager = SessionModel(num_items=args.items + NUM_SPECIAL, encoder=build(args), max_length=max(args.widths)).train()
    compiled = copy.deepcopy(eager)
    compiled.encoder.compile()
    objective = objective_type()
    runs = {"eager": (eager, adamw(eager.parameters(), lr=1e-3)), "compiled": (compiled, adamw(compiled.parameters(), lr=1e-3))}
    gen = torch.Generator().manual_seed(0)

    def batch(i: int) -> torch.Tensor:
        width = args.widths[i % len(args.widths)]
        ids = torch.randint(NUM_SPECIAL, args.items + NUM_SPECIAL, (args.batch, width), generator=gen)
        lengths = torch.randint(2, width + 1, (args.batch, 1), generator=gen)
        lengths[0] = width  # the batch is trimmed to its longest session
        return ids.masked_fill(torch.arange(width).unsqueeze(0) < width - lengths, 0)

    def step(model: SessionModel, optimizer: torch.optim.Optimizer, items: torch.Tensor, i: int) -> float:
        start = time.perf_counter()
        out = objective.training_output(model, items, torch.Generator().manual_seed(i))
        loss = F.cross_entropy(model.score(out.hidden), out.targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return time.perf_counter() - start

    times: dict[str, list[float]] = {name: [] for name in runs}
    started = time.perf_counter()
    for i in range(args.warmup + args.steps):
        items = batch(i)
        for name, (model, optimizer) in runs.items():
            seconds = step(model, optimizer, items, i)
            if i >= args.warmup:
                times[name].append(seconds)
        print(f"step {i}: " + " ".join(f"{n} {t[-1] * 1e3:.1f} ms" for n, t in times.items() if t), file=sys.stderr)
    median = {name: statistics.median(t) for name, t in times.items()}
    print(json.dumps({
        "benchmark": "compile_speed", "encoder": args.encoder, "d_model": args.d_model, "items": args.items,
        "batch_size": args.batch, "widths": args.widths, "threads": args.threads, "timed_steps": args.steps,
        "eager_step_ms": round(median["eager"] * 1e3, 2), "compiled_step_ms": round(median["compiled"] * 1e3, 2),
        "eager_over_compiled": round(median["eager"] / median["compiled"], 3),
        "wall_s_including_compilation": round(time.perf_counter() - started, 1),
    }))


if __name__ == "__main__":
    main()
