"""Training throughput of the session encoders: full optimisation steps per second on synthetic sessions.

A step is what `NextItemTask` does in training, without Lightning around it: masking
(`MaskedItemModeling`, seeded per step) -> `model.encode` -> hidden states at the masked
positions -> the task's default loss (`FullSoftmax`: cross-entropy over the whole catalogue) -> backward
-> AdamW step.
Sessions are random item ids (seeded), lengths uniform in 2..max-len, right-aligned with 0
padding, as the loader delivers them. The median of the timed steps is reported after warm-up.

Prints one JSON line on stdout; progress goes to stderr.

With ``--peer transformers4rec`` the same step of Transformers4Rec 23.12's XLNet-MLM (its README
model: `TabularSequenceFeatures` with an item table and MLM masking, `MLPBlock`, `TransformerBlock`
over HF's XLNet, `NextItemPredictionTask` with weight tying over the whole catalogue; same
d_model, heads, layers, max length, catalogue, dropout; `torch.optim.AdamW` at the same lr) runs
model-only (a dict of item-id tensors in, loss out, backward, optimizer step; no data loader), in
turn with ours step by step on the same sessions, left-aligned as T4R expects. Its MLM draws each
item with ``mlm_probability`` and then forces one more target per session, so by default that
probability is set to give as many targets per step as ours (both medians are printed). The JSON
then carries both medians, both sessions/s and ``ratio`` = ours / peer sessions/s. T4R 23.12 needs
``transformers<4.31`` and the merlin packages: install it in a separate virtualenv.

``--encoders`` times several encoders in turn, step by step, on the same sessions at the same width:
``xlnet_mlm`` (masked-item modelling), ``sasrec``, ``hstu`` (its jagged path) and ``hstu_padded``
(next item at every position), each with a full softmax; the record is the first's, and
``compared`` holds the others' medians and step time over the first's.

``--profile`` runs extra steps under `torch.profiler` after the timed ones and prints the ops with
the most self CPU time (per step, with their share) to stderr, for ours and, with ``--peer``, the peer.

Example (from the repository root):
    python benchmarks/train_throughput.py --steps 30 --threads 1
    python benchmarks/train_throughput.py --steps 30 --threads 1 --max-len 50 --encoders hstu hstu_padded sasrec xlnet_mlm
    python benchmarks/train_throughput.py --steps 30 --threads 1 --peer transformers4rec --profile
    python benchmarks/train_throughput.py --quick
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from sessrec.data.vocab import NUM_SPECIAL
from sessrec.models import (
    CausalLanguageModeling,
    HSTUEncoder,
    MaskedItemModeling,
    Objective,
    SASRecEncoder,
    SessionModel,
    XLNetEncoder,
)
from sessrec.tasks.losses import FullSoftmax
from sessrec.tasks.optim import adamw


def synthetic_sessions(n: int, max_len: int, items: int, generator: torch.Generator) -> torch.Tensor:
    """(n, max_len) right-aligned random sessions: ids in [NUM_SPECIAL, items + NUM_SPECIAL), 0 = padding."""
    ids = torch.randint(NUM_SPECIAL, items + NUM_SPECIAL, (n, max_len), generator=generator)
    lengths = torch.randint(2, max_len + 1, (n, 1), generator=generator)
    padding = torch.arange(max_len).unsqueeze(0) < (max_len - lengths)  # (n, max_len)
    return ids.masked_fill(padding, 0)


# the encoders `--encoders` compares: (B, L, D) -> (B, L, D) at the model flags' width, and the objective each trains with
ENCODERS = {
    "xlnet_mlm": (lambda a: XLNetEncoder(d_model=a.d_model, n_head=a.n_head, n_layer=a.n_layer, dropout=a.dropout),
                  MaskedItemModeling),
    "sasrec": (lambda a: SASRecEncoder(d_model=a.d_model, n_head=a.n_head, n_layer=a.n_layer, dropout=a.dropout),
               CausalLanguageModeling),
    "hstu": (lambda a: HSTUEncoder(d_model=a.d_model, n_head=a.n_head, n_layer=a.n_layer, dropout=a.dropout,
                                   jagged=True), CausalLanguageModeling),
    "hstu_padded": (lambda a: HSTUEncoder(d_model=a.d_model, n_head=a.n_head, n_layer=a.n_layer, dropout=a.dropout,
                                          jagged=False), CausalLanguageModeling),
}


def build_model(args: argparse.Namespace, encoder: str = "xlnet_mlm") -> SessionModel:
    """The `SessionModel` of the model flags around one of `ENCODERS`."""
    return SessionModel(
        num_items=args.items + NUM_SPECIAL, encoder=ENCODERS[encoder][0](args), max_length=args.max_len,
        dropout=args.dropout,
    )


def objective_of(encoder: str) -> Objective:
    """The training objective `encoder` is compared with."""
    return ENCODERS[encoder][1]()


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


def left_aligned(items: torch.Tensor) -> torch.Tensor:
    """(B, L) right-aligned sessions -> the same items first, padding (0) after them."""
    width = items.shape[1]
    shift = width - (items != 0).sum(dim=1, keepdim=True)  # (B, 1) leading padding
    return items.gather(1, (torch.arange(width)[None, :] + shift) % width)


class TransformersForRecPeer:
    """Transformers4Rec 23.12's XLNet-MLM at our sizes, trained model-only: ``step(items)``.

    Args:
        args: the model flags (`add_model_flags`) and ``lr``.
        mlm_probability: T4R's per-item masking probability.
    """

    def __init__(self, args: argparse.Namespace, mlm_probability: float) -> None:
        try:
            import transformers4rec
            import transformers4rec.torch as tr
            from merlin.schema import ColumnSchema, Schema, Tags
        except ImportError as exc:
            raise SystemExit(
                f"--peer transformers4rec: Transformers4Rec 23.12 does not import here ({exc}); "
                "install it in its own virtualenv (it needs transformers<4.31 and merlin packages)"
            ) from None
        num_items = args.items + NUM_SPECIAL  # ids 0 (padding) .. V - 1: T4R's table gets V rows, as ours
        item = ColumnSchema(  # merlin-core's schema: T4R deep-copies it (merlin_standard_lib's does not copy on Python 3.11)
            "item_id", tags=[Tags.ITEM_ID, Tags.LIST, Tags.CATEGORICAL], dtype="int64", is_list=True,
            properties={"domain": {"min": 0, "max": num_items - 1, "name": "item_id"},
                        "value_count": {"min": 0, "max": args.max_len}},
        )
        inputs = tr.TabularSequenceFeatures.from_schema(
            Schema([item]), max_sequence_length=args.max_len, d_output=args.d_model, masking="mlm",
            mlm_probability=mlm_probability,
        )
        config = tr.XLNetConfig.build(
            d_model=args.d_model, n_head=args.n_head, n_layer=args.n_layer, total_seq_length=args.max_len,
            dropout=args.dropout,
        )
        body = tr.SequentialBlock(inputs, tr.MLPBlock([args.d_model]), tr.TransformerBlock(config, masking=inputs.masking))
        self.model = tr.Model(tr.Head(body, tr.NextItemPredictionTask(weight_tying=True), inputs=inputs)).train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=args.lr)
        self.version = transformers4rec.__version__

    def step(self, items: torch.Tensor) -> tuple[torch.Tensor, int]:
        """One training step on (B, L) left-aligned sessions -> (loss, number of masked targets)."""
        out = self.model({"item_id": items}, training=True)
        self.optimizer.zero_grad(set_to_none=True)
        out["loss"].backward()
        self.optimizer.step()
        return out["loss"].detach(), int(out["labels"].numel())


def matched_mlm_probability(objective: MaskedItemModeling, batches: list[tuple[torch.Tensor, torch.Generator]]) -> float:
    """The T4R masking probability p that gives as many targets per session as `objective` on `batches`.

    T4R's MLM keeps a Bernoulli(p) draw over the n items of a session and adds one random item
    when none of them was drawn there: 1 + p (n - 1) targets on average, set equal to ours.
    """
    sessions = sum(len(items) for items, _ in batches)
    ours = sum(int(objective(items, gen).targets.numel()) for items, gen in batches) / sessions
    mean_length = sum(int((items != 0).sum()) for items, _ in batches) / sessions
    return min(max((ours - 1.0) / (mean_length - 1.0), 0.01), 1.0)


def print_profile(name: str, step, steps: int, top: int = 14) -> None:
    """Run `step(i)` `steps` times under torch.profiler; print the ops with most self CPU time to stderr."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(steps):
            step(i)
    events = [e for e in prof.key_averages() if e.key.startswith("aten::") or "Backward" in e.key or "Optimizer" in e.key]
    total = sum(e.self_cpu_time_total for e in prof.key_averages())  # microseconds, all steps
    print(f"profile {name}: {total / 1e3 / steps:.1f} ms self CPU per step ({steps} steps); top ops by self CPU:", file=sys.stderr)
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:top]:
        print(
            f"  {e.key[:44]:44s} {e.self_cpu_time_total / 1e3 / steps:7.2f} ms {100 * e.self_cpu_time_total / total:5.1f}%"
            f" {e.count / steps:6.1f} calls/step",
            file=sys.stderr,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_flags(parser)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=30, help="timed steps (>= 20)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--peer", choices=["transformers4rec"], default=None,
                        help="also time Transformers4Rec's XLNet-MLM step, alternating with ours")
    parser.add_argument("--peer-mlm-probability", type=float, default=None,
                        help="T4R's masking probability (default: as many targets per step as ours)")
    parser.add_argument("--profile", action="store_true", help="profile extra steps; top ops to stderr")
    parser.add_argument("--encoders", nargs="+", choices=sorted(ENCODERS), default=["xlnet_mlm"],
                        help="encoders timed in turn, step by step, on the same sessions (the first is the record's)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke size: batch 16, 300 items, d_model 16, 2 heads, 1 layer, max-len 8, 20 steps, 1 warm-up")
    args = parser.parse_args()
    if args.quick:
        args.batch, args.items, args.d_model, args.n_head, args.n_layer, args.max_len = 16, 300, 16, 2, 1, 8
        args.steps, args.warmup = 20, 1
    if args.steps < 20:
        parser.error("--steps must be >= 20 for a stable median")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    runs = {}  # encoder -> (model, objective, optimizer), each seeded alike
    for name in dict.fromkeys(args.encoders):
        torch.manual_seed(args.seed)
        model = build_model(args, name).train()
        runs[name] = (model, objective_of(name), adamw(model.parameters(), lr=args.lr))  # as NextItemTask
    first = args.encoders[0]
    model, objective = runs[first][0], runs[first][1]
    gen = torch.Generator().manual_seed(args.seed)
    pool = synthetic_sessions(16 * args.batch, args.max_len, args.items, gen)  # cycled, (16 B, L)

    def batch(i: int, sessions: torch.Tensor) -> torch.Tensor:
        return sessions[(i % 16) * args.batch : (i % 16 + 1) * args.batch]  # (B, L)

    def masking_generator(i: int) -> torch.Generator:
        return torch.Generator().manual_seed(args.seed * 7919 + i)

    peer, peer_pool, mlm_probability = None, None, args.peer_mlm_probability
    if args.peer:
        if first != "xlnet_mlm":
            parser.error("--peer transformers4rec compares XLNet-MLM: the first of --encoders must be xlnet_mlm")
        if mlm_probability is None:
            mlm_probability = matched_mlm_probability(objective, [(batch(i, pool), masking_generator(i)) for i in range(16)])
        peer = TransformersForRecPeer(args, mlm_probability)
        peer_pool = left_aligned(pool)

    full_softmax = FullSoftmax()

    def step(i: int, name: str = first) -> tuple[float, int]:
        items = batch(i, pool)
        net, task, optimizer = runs[name]
        start = time.perf_counter()
        m = task(items, masking_generator(i))
        hidden = net.encode(m.inputs, m.masked)[m.read]  # (N, D)
        loss = full_softmax(net, hidden, m.targets)  # over the (N, V) scores
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        elapsed = time.perf_counter() - start
        if not torch.isfinite(loss):
            raise RuntimeError(f"{name}: loss is {loss.item()} at step {i}")
        return elapsed, int(m.targets.numel())

    def peer_step(i: int) -> tuple[float, int]:
        items = batch(i, peer_pool)
        start = time.perf_counter()
        loss, n = peer.step(items)
        elapsed = time.perf_counter() - start
        if not torch.isfinite(loss):
            raise RuntimeError(f"peer loss is {loss.item()} at step {i}")
        return elapsed, n

    others = [name for name in runs if name != first]
    for i in range(args.warmup):
        for name in runs:
            step(i, name)
        if peer:
            peer_step(i)
    times, targets, peer_times, peer_targets = [], [], [], []
    compared = {name: ([], []) for name in others}  # seconds, targets per step
    for i in range(args.warmup, args.warmup + args.steps):
        seconds, n = step(i)
        times.append(seconds)
        targets.append(n)
        line = f"step {i}: {seconds * 1e3:.1f} ms, {n} targets"
        for name in others:
            other_seconds, other_n = step(i, name)
            compared[name][0].append(other_seconds)
            compared[name][1].append(other_n)
            line += f"; {name} {other_seconds * 1e3:.1f} ms, {other_n} targets"
        if peer:
            seconds, n = peer_step(i)
            peer_times.append(seconds)
            peer_targets.append(n)
            line += f"; peer {seconds * 1e3:.1f} ms, {n} masked targets"
        print(line, file=sys.stderr)

    if args.profile:
        after = args.warmup + args.steps
        print_profile("sessrec", lambda i: step(after + i), 10)
        if peer:
            print_profile("transformers4rec", lambda i: peer_step(after + i), 10)

    median = statistics.median(times)
    record = {
        "benchmark": "train_throughput",
        "encoder": first,
        "d_model": args.d_model, "n_head": args.n_head, "n_layer": args.n_layer, "max_len": args.max_len,
        "items": args.items, "batch_size": args.batch, "dropout": args.dropout, "threads": args.threads,
        "parameters": sum(p.numel() for p in model.parameters()),
        "timed_steps": args.steps,
        "median_masked_targets_per_step": statistics.median(targets),
        "median_step_ms": round(median * 1e3, 2),
        "step_ms_min_max": [round(min(times) * 1e3, 2), round(max(times) * 1e3, 2)],
        "steps_per_s": round(1.0 / median, 2),
        "sessions_per_s": round(args.batch / median, 1),
    }
    if peer:
        peer_median = statistics.median(peer_times)
        record.update({
            "peer": f"transformers4rec {peer.version}",
            "peer_mlm_probability": round(mlm_probability, 4),
            "peer_parameters": sum(p.numel() for p in peer.model.parameters()),
            "peer_median_masked_targets_per_step": statistics.median(peer_targets),
            "peer_median_step_ms": round(peer_median * 1e3, 2),
            "peer_step_ms_min_max": [round(min(peer_times) * 1e3, 2), round(max(peer_times) * 1e3, 2)],
            "peer_sessions_per_s": round(args.batch / peer_median, 1),
            "ratio": round(peer_median / median, 3),  # ours sessions/s over the peer's
        })
    if others:
        record["compared"] = {
            name: {
                "parameters": sum(p.numel() for p in runs[name][0].parameters()),
                "median_targets_per_step": statistics.median(n),
                "median_step_ms": round(statistics.median(seconds) * 1e3, 2),
                "sessions_per_s": round(args.batch / statistics.median(seconds), 1),
                "step_time_over_first": round(statistics.median(seconds) / median, 3),
            }
            for name, (seconds, n) in compared.items()
        }
    print(json.dumps(record))


if __name__ == "__main__":
    main()
