"""Training-step time of XLNet-MLM with the full softmax vs. sampled losses at a large catalogue.

A step is the training step of `NextItemTask` without Lightning: the objective's
`training_output` (masking, `model.encode`, hidden states at the target positions) -> loss ->
backward -> AdamW step. `--encoder xlnet` trains XLNet with masked item modelling (the model
of `train_throughput.py`); `--encoder sasrec` trains the SDPA SASRec encoder with causal LM
(every position predicts its next item, so about 2.5x more targets per batch). The losses compared
are those of `sessrec.tasks.losses`: `FullSoftmax` (every target against all V items) and
`SampledSoftmax` with shared uniform negatives, popularity negatives, in-batch negatives and
the mix. Steps of all losses are interleaved (A, B, C, ..., A, B, C, ...) on the same seeded
synthetic batches so that machine noise hits them alike; medians are compared.

Prints one JSON line per loss on stdout (with its speed-up over the full softmax); progress
goes to stderr.

Example (from the repository root):
    python benchmarks/sampled_softmax.py --items 50000 --steps 20 --threads 1
    python benchmarks/sampled_softmax.py --items 50000 --steps 20 --threads 1 --encoder sasrec
    python benchmarks/sampled_softmax.py --quick
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
from train_throughput import add_model_flags, build_model, synthetic_sessions

from sessrec.data.vocab import NUM_SPECIAL
from sessrec.models import CausalLanguageModeling, MaskedItemModeling, SASRecEncoder, SessionModel
from sessrec.tasks.losses import FullSoftmax, SampledSoftmax
from sessrec.tasks.optim import adamw


def zipf_counts(items: int, exponent: float = 1.0) -> torch.Tensor:
    """(items + NUM_SPECIAL,) Zipf-like training counts, as the popularity sampler would see them."""
    ranks = torch.arange(1, items + 1, dtype=torch.float64)
    return torch.cat([torch.zeros(NUM_SPECIAL, dtype=torch.float64), 1e6 / ranks.pow(exponent)])


def build(args: argparse.Namespace) -> SessionModel:
    """The XLNet model of `train_throughput.py`, or the same sizes on `SASRecEncoder`."""
    if args.encoder == "xlnet":
        return build_model(args)
    encoder = SASRecEncoder(d_model=args.d_model, n_head=args.n_head, n_layer=args.n_layer, dropout=args.dropout)
    return SessionModel(num_items=args.items + NUM_SPECIAL, encoder=encoder, max_length=args.max_len, dropout=args.dropout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_flags(parser)
    parser.set_defaults(items=50_000, dropout=0.1)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--mask-prob", type=float, default=0.2)
    parser.add_argument("--samples", type=int, default=1024, help="shared negatives per batch")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per loss")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--encoder", choices=["xlnet", "sasrec"], default="xlnet")
    parser.add_argument("--quick", action="store_true",
                        help="smoke size: 2000 items, batch 32, 64 samples, d_model 16, 2 heads, 1 layer, max-len 8, "
                             "3 steps, 1 warm-up")
    args = parser.parse_args()
    if args.quick:
        args.items, args.batch, args.samples, args.max_len = 2000, 32, 64, 8
        args.d_model, args.n_head, args.n_layer, args.steps, args.warmup = 16, 2, 1, 3, 1
    torch.set_num_threads(args.threads)
    counts = zipf_counts(args.items)

    losses = {
        "full_softmax": FullSoftmax(),
        "sampled_uniform": SampledSoftmax(negatives="sampled", num_samples=args.samples),
        "sampled_popularity": SampledSoftmax(negatives="sampled", num_samples=args.samples, sampler="popularity"),
        "in_batch": SampledSoftmax(negatives="in_batch"),
        "mixed": SampledSoftmax(negatives="mixed", num_samples=args.samples),
    }
    setups = {}
    for name, loss in losses.items():
        if isinstance(loss, SampledSoftmax):
            loss.set_item_counts(counts)
        torch.manual_seed(args.seed)
        model = build(args).train()
        setups[name] = (model, adamw(model.parameters(), lr=1e-3), loss, [])
    if args.encoder == "xlnet":
        objective = MaskedItemModeling(mask_prob=args.mask_prob, last_item_prob=0.0)
    else:
        objective = CausalLanguageModeling()
    objective.bind(setups["full_softmax"][0])
    gen = torch.Generator().manual_seed(args.seed)
    targets_per_step = []

    for step in range(args.warmup + args.steps):
        items = synthetic_sessions(args.batch, args.max_len, args.items, gen)
        for name, (model, opt, loss, times) in setups.items():
            start = time.perf_counter()
            out = objective.training_output(model, items, torch.Generator().manual_seed(step))  # same masks for all
            value = loss(model, out.hidden, out.targets, torch.Generator().manual_seed(step))
            opt.zero_grad(set_to_none=True)
            value.backward()
            opt.step()
            elapsed = time.perf_counter() - start
            if step >= args.warmup:
                times.append(elapsed)
        targets_per_step.append(int(out.targets.numel()))
        print(f"step {step}: " + " ".join(f"{n}={s[3][-1] * 1e3:.0f}ms" for n, s in setups.items() if s[3]), file=sys.stderr)

    full_ms = statistics.median(setups["full_softmax"][3]) * 1e3
    for name, (model, _opt, _loss, times) in setups.items():
        ms = statistics.median(times) * 1e3
        print(json.dumps({
            "benchmark": "sampled_softmax",
            "loss": name,
            "encoder": args.encoder,
            "items": args.items,
            "d_model": args.d_model,
            "n_layer": args.n_layer,
            "batch_size": args.batch,
            "samples": args.samples if "sampled" in name or name == "mixed" else 0,
            "median_targets_per_step": statistics.median(targets_per_step),
            "threads": args.threads,
            "timed_steps": len(times),
            "median_step_ms": round(ms, 2),
            "step_ms_min_max": [round(min(times) * 1e3, 2), round(max(times) * 1e3, 2)],
            "speedup_vs_full": round(full_ms / ms, 1),
        }))


if __name__ == "__main__":
    main()
