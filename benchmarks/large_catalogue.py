"""Large catalogues: vocabulary, sampled-softmax training, full-catalogue evaluation and ANN retrieval
at 1M-10M items: seconds and bytes per item, and what breaks first.

Each measurement runs in its own process (one at a time), so that its peak resident memory is its
own: the peak is reset (``/proc/self/clear_refs``) just before the measured work, after the inputs
are built, and read back (``VmHWM``) after it; ``*_bytes_per_item`` divide the rise by the items.

Parts (``--parts``):

- ``vocab``: `ItemVocab.fit` on a synthetic event log (every item once, plus Zipf(1.05) draws: ``--events-per-item``
  events an item in all; 50M at 10M items) with int64 raw ids and with string raw ids (``"item" + digits``);
  then `encode` of a batch of events (the hashed path), `encode` of a 20-id request (the sorted-keys
  path: its first call sorts the keys), `decode`, `save` and `load` (file size).
- ``train``: one training step of `NextItemTask` as Lightning runs it (``training_step``, backward,
  the optimizer of ``configure_optimizers``: fused AdamW over every parameter): a 1-layer SASRec encoder,
  d 64, causal LM, `SampledSoftmax` with 1,024 shared uniform negatives, batch 256, length 20. Times
  forward (objective + loss), backward and the optimizer step separately, and the sampler alone
  (``loss.columns``). Memory: the model, and the rise to the peak over the steps (gradient and AdamW moments).
- ``head_lookups``: the same step with the tied head's lookups as the library makes them
  (`SessionModel.item_rows`, sparse lookup gradients summed into the table's one dense gradient)
  and as dense ``index_select`` lookups (a (V, D) gradient buffer per lookup), interleaved step by step on the
  same batches and dropout masks (the gradients are equal: tests/test_models.py checks them).
- ``eval``: one `NextItemTask` test step (full-catalogue scores, loss, ranks of the targets) at
  ``--eval-batch`` sessions, and the serving top-k (`next_item_scores` + ``topk``) of one session.
  Memory per score: the peak rise / (batch x items).
- ``ann``: `FaissIndex("ivf")` and `ExactIndex` over ``--items`` clustered vectors (``ann_index.py``'s data,
  d 64 + the bias column): build seconds, the memory the built index keeps, one-query latency, recall@k
  against exact.
  ``--hnsw-items`` caps the HNSW build, which takes minutes per million vectors on one thread.

A measurement whose estimated peak exceeds ``--memory-gb`` is not run at that size: the record says
``"skipped"`` with the estimate, and docs/catalogues.md extrapolates from the sizes measured.

Prints one JSON line per (part, size); progress goes to stderr.

Example (from the repository root):
    python benchmarks/large_catalogue.py --items 1000000 3000000 10000000 --memory-gb 8
    python benchmarks/large_catalogue.py --quick
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

GB = 1e9


# -- memory ------------------------------------------------------------------------------------------
def _status(field: str) -> int:
    """Bytes of a ``/proc/self/status`` field (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


class Peak:
    """Peak resident memory of a block above the resident memory at its start (bytes)."""

    def __enter__(self) -> Peak:  # noqa: PYI034  (typing.Self: Python 3.11)
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
        self.start = _status("VmRSS")
        return self

    def __exit__(self, *exc: object) -> None:
        self.rise = _status("VmHWM") - self.start
        self.kept = _status("VmRSS") - self.start


def timed(fn, repeats: int, *call_args: object) -> tuple[float, object]:
    """Median seconds of `repeats` calls ``fn(*call_args)`` and the last result."""
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn(*call_args)
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


# -- data --------------------------------------------------------------------------------------------
def zipf_ranks(items: int, count: int, alpha: float, rng: np.random.Generator) -> np.ndarray:
    """(count,) ranks in [0, items) with P(rank r) ~ (r + 1)^-alpha (inverse CDF of the continuous law)."""
    u = rng.random(count)
    top = float(items + 1) ** (1 - alpha)
    return np.minimum(((top - 1) * u + 1) ** (1 / (1 - alpha)) - 1, items - 1).astype(np.int64)


def raw_ids(ranks: np.ndarray, kind: str) -> pa.Array:
    """Raw ids of ranks, scattered (an odd multiplier modulo 2^40): int64, or ``"item" + digits``."""
    ids = pa.array((ranks * 2654435761) % (1 << 40))
    return ids if kind == "int64" else pc.binary_join_element_wise("item", pc.cast(ids, pa.string()), "")


def event_log(items: int, per_item: int, seed: int) -> np.ndarray:
    """(items * per_item,) ranks: every item once, then Zipf(1.05) draws, shuffled."""
    rng = np.random.default_rng(seed)
    ranks = np.concatenate([np.arange(items), zipf_ranks(items, items * (per_item - 1), 1.05, rng)])
    rng.shuffle(ranks)
    return ranks


# -- parts -------------------------------------------------------------------------------------------
def vocab_part(args: argparse.Namespace) -> list[dict]:
    from sessrec.data.vocab import ItemVocab

    n = args.items
    ranks = event_log(n, args.events_per_item, args.seed)
    batch_ranks = ranks[: args.encode_batch]
    request_ranks = ranks[-20:]
    records = []
    for kind in ("int64", "string"):
        events = raw_ids(ranks, kind)
        with Peak() as fit_mem:
            start = time.perf_counter()
            vocab = ItemVocab.fit(events)
            fit_s = time.perf_counter() - start
        del events
        assert vocab.num_products == n, (vocab.num_products, n)
        batch = raw_ids(batch_ranks, kind)
        request = raw_ids(request_ranks, kind)
        encode_s, encoded = timed(vocab.encode, args.repeats, batch)
        with Peak() as first_mem:
            start = time.perf_counter()
            vocab.encode(request)  # sorts the keys once
            first_s = time.perf_counter() - start
        request_s, _ = timed(vocab.encode, 20, request)
        decode_s, decoded = timed(vocab.decode, args.repeats, encoded.ids)
        assert decoded.equals(batch)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "vocab.parquet"
            save_s, _ = timed(vocab.save, 1, path)
            size = path.stat().st_size
            with Peak() as load_mem:
                start = time.perf_counter()
                loaded = ItemVocab.load(path)
                load_s = time.perf_counter() - start
            assert loaded == vocab
        held = vocab.raw_ids.nbytes + vocab.counts.nbytes
        records.append({
            "part": "vocab", "raw_ids": kind, "items": n, "events": len(ranks),
            "fit_s": round(fit_s, 2), "fit_peak_gb": round(fit_mem.rise / GB, 3),
            "fit_peak_bytes_per_event": round(fit_mem.rise / len(ranks), 1),
            "vocab_bytes_per_item": round(held / n, 1),
            f"encode_{len(batch)}_s": round(encode_s, 3), "encode_events_per_s": round(len(batch) / encode_s),
            "encode_request_first_s": round(first_s, 3),
            "encode_request_first_bytes_per_item": round(first_mem.rise / n, 1),
            "encode_request_ms": round(request_s * 1e3, 3),
            f"decode_{len(batch)}_s": round(decode_s, 3),
            "save_s": round(save_s, 2), "file_bytes_per_item": round(size / n, 1),
            "load_s": round(load_s, 2), "load_peak_bytes_per_item": round(load_mem.rise / n, 1),
        })
    return records


def build_task(args: argparse.Namespace, items: int):
    from sessrec.data.vocab import NUM_SPECIAL
    from sessrec.models import CausalLanguageModeling, SASRecEncoder
    from sessrec.tasks.losses import SampledSoftmax
    from sessrec.tasks.next_item import NextItemTask

    torch.manual_seed(args.seed)
    encoder = SASRecEncoder(d_model=args.dim, n_head=2, n_layer=1, dropout=0.1)
    task = NextItemTask(num_items=items + NUM_SPECIAL, max_length=args.max_len, encoder=encoder,
                        objective=CausalLanguageModeling(), loss=SampledSoftmax(num_samples=args.samples))
    return task


def sessions(args: argparse.Namespace, items: int, count: int, seed: int) -> torch.Tensor:
    """(count, max_len) right-aligned sessions of Zipf items (model ids), lengths 2..max_len."""
    from sessrec.data.vocab import NUM_SPECIAL

    rng = np.random.default_rng(seed)
    ids = torch.from_numpy(zipf_ranks(items, count * args.max_len, 1.05, rng).reshape(count, args.max_len) + NUM_SPECIAL)
    lengths = torch.from_numpy(rng.integers(2, args.max_len + 1, (count, 1)))
    return ids.masked_fill(torch.arange(args.max_len)[None, :] < args.max_len - lengths, 0)


def training_setup(args: argparse.Namespace, n: int):
    """A `NextItemTask` with its loss's item counts set (what setup does) and its optimizer, in train mode."""
    task = build_task(args, n)
    counts = torch.cat([torch.zeros(2, dtype=torch.float64), 1e6 / torch.arange(1, n + 1, dtype=torch.float64)])
    task.loss.set_item_counts(counts)
    opt = task.configure_optimizers()["optimizer"]  # the library's AdamW (fused) over every parameter
    return task.train(), opt


def train_step(task, opt, batch, step: int) -> tuple[float, float, float, str]:
    """One step as Lightning runs it: seconds of forward (objective + loss), backward and optimizer, and
    the layout of the item table's gradient."""
    t0 = time.perf_counter()
    loss = task.training_step(batch, step)
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    layout = "sparse" if task.model.item_embedding.weight.grad.is_sparse else "dense"
    opt.step()
    opt.zero_grad(set_to_none=True)
    return t1 - t0, t2 - t1, time.perf_counter() - t2, layout


def train_part(args: argparse.Namespace) -> list[dict]:
    import sessrec.tasks.next_item  # noqa: F401  imported before the memory baseline
    from sessrec.data.batch import SessionBatch

    n = args.items
    base = _status("VmRSS")
    task, opt = training_setup(args, n)
    model_bytes = _status("VmRSS") - base
    params = sum(p.numel() for p in task.parameters())
    batches = [SessionBatch(sessions(args, n, args.batch, args.seed + s)) for s in range(args.warmup + args.steps)]
    phases: dict[str, list[float]] = {"forward": [], "backward": [], "optimizer": [], "sampler": []}
    with Peak() as mem:
        for step, batch in enumerate(batches):
            *times, layout = train_step(task, opt, batch, step)
            targets = batch.items[:, 1:][batch.items[:, 1:] != 0].long()
            start = time.perf_counter()
            task.loss.columns(task.model, targets, torch.Generator().manual_seed(step))
            times.append(time.perf_counter() - start)
            if step >= args.warmup:
                for name, seconds in zip(phases, times):
                    phases[name].append(seconds)
            print(f"train {n}: step {step} {sum(times[:3]):.2f}s", file=sys.stderr)
    ms = {name: round(statistics.median(v) * 1e3, 1) for name, v in phases.items()}
    table = task.model.item_embedding.weight
    return [{
        "part": "train", "items": n, "dim": args.dim, "n_layer": 1, "batch": args.batch, "max_len": args.max_len,
        "samples": args.samples, "optimizer": type(opt).__name__, "fused": bool(opt.defaults.get("fused")),
        "timed_steps": len(phases["forward"]),
        "step_ms": round(ms["forward"] + ms["backward"] + ms["optimizer"], 1),
        **{f"{name}_ms": v for name, v in ms.items()},
        "parameters": params, "table_bytes_per_item": table.element_size() * table.shape[1],
        "model_bytes_per_item": round(model_bytes / n, 1),
        "training_peak_rise_bytes_per_item": round(mem.rise / n, 1),
        "model_plus_training_peak_gb": round((model_bytes + mem.rise) / GB, 2),
        "item_grad_layout": layout,
    }]


def head_lookups_part(args: argparse.Namespace) -> list[dict]:
    """The training step with the library's head lookups (`SessionModel.item_rows`: sparse lookup gradients)
    against dense ``index_select`` lookups of the same rows (one (V, D) gradient buffer each), interleaved."""
    from sessrec.data.batch import SessionBatch

    n = args.items
    library, library_opt = training_setup(args, n)
    dense, dense_opt = training_setup(args, n)
    table = dense.model.item_embedding.weight
    dense.model.item_rows = lambda ids: table.index_select(0, ids)
    times: dict[str, list[float]] = {"library": [], "dense_lookups": []}
    for step in range(args.warmup + args.steps):
        batch = SessionBatch(sessions(args, n, args.batch, args.seed + step))
        for name, (task, opt) in (("library", (library, library_opt)), ("dense_lookups", (dense, dense_opt))):
            torch.manual_seed(args.seed + step)  # the same dropout masks for both
            seconds = sum(train_step(task, opt, batch, step)[:3])
            if step >= args.warmup:
                times[name].append(seconds)
        print(f"head lookups {n}: step {step} " + " ".join(f"{k}={v[-1]:.2f}s" for k, v in times.items() if v),
              file=sys.stderr)
    ms = {name: statistics.median(v) * 1e3 for name, v in times.items()}
    pairs = [d / s for s, d in zip(times["library"], times["dense_lookups"])]
    return [{
        "part": "head_lookups", "items": n, "dim": args.dim, "batch": args.batch, "samples": args.samples,
        "timed_steps": args.steps, "library_step_ms": round(ms["library"], 1),
        "dense_lookups_step_ms": round(ms["dense_lookups"], 1),
        "speedup": round(ms["dense_lookups"] / ms["library"], 2), "speedup_min_max": [round(min(pairs), 2), round(max(pairs), 2)],
    }]


def eval_part(args: argparse.Namespace) -> list[dict]:
    from sessrec.data.batch import SessionBatch
    from sessrec.models.session_model import next_item_scores

    n = args.items
    task = build_task(args, n).eval()
    items = sessions(args, n, args.eval_batch + 1, args.seed)
    batch = SessionBatch(items[:-1, :-1].contiguous(), targets=items[:-1, -1].long())
    one = items[-1:, :-1].contiguous()
    with torch.no_grad():
        task._step(batch, "test")  # warm-up
        with Peak() as mem:
            step_s, _ = timed(lambda: task._step(batch, "test"), args.repeats)
        with Peak() as top_mem:
            top_s, _ = timed(lambda: next_item_scores(task.model, task.objective, one).topk(20, dim=1), args.repeats)
    task.metrics["test"].reset()
    scores = args.eval_batch * (n + 2)
    return [{
        "part": "eval", "items": n, "dim": args.dim, "eval_batch": args.eval_batch,
        "test_step_s": round(step_s, 3), "test_step_ms_per_session": round(step_s * 1e3 / args.eval_batch, 2),
        "test_step_peak_gb": round(mem.rise / GB, 3), "peak_bytes_per_score": round(mem.rise / scores, 2),
        "default_eval_batch_1024_gb": round(mem.rise / scores * 1024 * (n + 2) / GB, 1),
        "serve_top20_one_session_ms": round(top_s * 1e3, 2),
        "serve_peak_bytes_per_item": round(top_mem.rise / n, 2),
    }]


def ann_part(args: argparse.Namespace) -> list[dict]:
    import faiss
    from ann_index import cluster_queries, clustered_items, set_recall

    from sessrec.pipeline.retrieval.index import ExactIndex, FaissIndex

    faiss.omp_set_num_threads(1)
    n, k = args.items, args.k
    vectors, centres = clustered_items(n, args.dim, min(2000, n), 1.0, args.seed)
    ids = np.arange(n, dtype=np.int64) + 2
    queries = cluster_queries(centres, args.queries, 1.0, args.seed)
    exact = ExactIndex().build(vectors, ids)  # a view of `vectors`: no copy
    exact_s, (_, truth) = timed(exact.search, 1, queries, k)
    one_exact = statistics.median(timed(exact.search, 1, queries[i:i + 1], k)[0] for i in range(5))
    records = []
    kinds = ["ivf"] + (["hnsw"] if n <= args.hnsw_items else [])
    for kind in kinds:
        settings = {"nprobe": 32} if kind == "ivf" else {"ef_search": 384}
        with Peak() as mem:
            start = time.perf_counter()
            index = FaissIndex(kind, seed=args.seed, **settings).build(vectors, ids)
            build_s = time.perf_counter() - start
        for i in range(5):
            index.search(queries[i:i + 1], k)
        times, found = [], []
        for i in range(len(queries)):
            s, out = timed(index.search, 1, queries[i:i + 1], k)
            times.append(s)
            found.append(out[1])
        records.append({
            "part": "ann", "index": f"faiss-{kind}", "items": n, "vector_width": args.dim + 1, "k": k,
            "queries": args.queries, **({"nlist": index.num_lists} if kind == "ivf" else {"hnsw_m": 32, "ef_construction": 80}),
            **settings, "build_s": round(build_s, 1), "build_peak_bytes_per_item": round(mem.rise / n, 1),
            "index_resident_bytes_per_item": round(mem.kept / n, 1), "table_bytes_per_item": vectors.itemsize * vectors.shape[1],
            "ann_ms_per_query": round(statistics.median(times) * 1e3, 3),
            "exact_ms_per_query": round(one_exact * 1e3, 2), "exact_batch_ms_per_query": round(exact_s * 1e3 / len(queries), 2),
            "recall@k": round(set_recall(torch.cat(found), truth), 4), "faiss": faiss.__version__,
        })
        del index
    return records


PARTS = {"vocab": vocab_part, "train": train_part, "head_lookups": head_lookups_part, "eval": eval_part, "ann": ann_part}


def estimate_gb(part: str, items: int, args: argparse.Namespace) -> float:
    """A generous estimate of one measurement's peak (GB), to skip what would not fit in `--memory-gb`."""
    per_item = {
        "vocab": 40.0 * args.events_per_item + 150,  # string events, value counts, the sorted keys
        "train": args.dim * 4 * 4 + 120,  # table, gradient, two AdamW moments; counts, bias, masks
        "head_lookups": 2 * (args.dim * 4 * 5 + 120),  # two trainings, one more (V, D) gradient buffer in one
        "eval": args.dim * 4 + 4 * 5 * args.eval_batch + 40,  # table; about five (B, V) float32 buffers
        "ann": (args.dim + 1) * 4 * 2 + 16 + (8 * 32 + (args.dim + 1) * 4 if items <= args.hnsw_items else 0),
    }[part]
    return items * per_item / GB + 0.5


def run_one(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*self.trainer. reference is not registered")  # self.log outside a Trainer
    for record in PARTS[args.one](args):
        print(json.dumps({"benchmark": "large_catalogue", **record, "threads": 1, "torch": torch.__version__}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--parts", nargs="+", choices=list(PARTS), default=list(PARTS))
    parser.add_argument("--memory-gb", type=float, default=8.0, help="skip a measurement whose estimated peak exceeds this")
    parser.add_argument("--events-per-item", type=int, default=5)
    parser.add_argument("--encode-batch", type=int, default=1_000_000, help="events per encode/decode batch")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--max-len", type=int, default=20)
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=3, help="timed training steps")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--eval-batch", type=int, default=16, help="sessions per full-catalogue test step")
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--hnsw-items", type=int, default=1_000_000, help="largest catalogue the HNSW index is built for")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="25k items, 2 steps, 20 queries: seconds")
    parser.add_argument("--one", choices=list(PARTS), help=argparse.SUPPRESS)  # the child process of one measurement
    args = parser.parse_args()
    if args.quick:
        # 25k items: the HNSW build, the longest part, takes seconds; still 39 training vectors per IVF list (632), FAISS's minimum
        args.items, args.steps, args.queries, args.encode_batch = [25_000], 2, 20, 100_000
        args.hnsw_items, args.repeats = 25_000, 2
    if args.one:
        (args.items,) = args.items
        run_one(args)
        return
    for part in args.parts:
        for items in args.items:
            need = estimate_gb(part, items, args)
            if need > args.memory_gb:
                print(json.dumps({"benchmark": "large_catalogue", "part": part, "items": items,
                                  "skipped": f"estimated peak {need:.1f} GB > --memory-gb {args.memory_gb}"}), flush=True)
                continue
            print(f"{part} at {items:,} items (estimated peak {need:.1f} GB)", file=sys.stderr)
            settings = vars(args) | {"items": items}
            flags = [f"--{key.replace('_', '-')}={value}" for key, value in settings.items()
                     if key not in ("parts", "one", "quick", "items") and value is not None]
            done = subprocess.run([sys.executable, __file__, "--one", part, "--items", str(items), *flags],
                                  stdout=subprocess.PIPE, check=False, text=True, env=os.environ)
            if done.returncode != 0:
                sys.exit(f"large_catalogue: {part} at {items} items failed (exit {done.returncode})")
            sys.stdout.write(done.stdout)
            sys.stdout.flush()


if __name__ == "__main__":
    main()
