"""Online latency of `Pipeline.recommend`: one request (one session) at a time, one thread, raw ids in and out.

The pipeline has the DIGINETICA recipe's sizes: about 43,000 items (a synthetic log whose
training split holds about as many distinct items and sessions as DIGINETICA's), an XLNet-MLM retriever (d = 64, one
layer, exact blocked top-K or FAISS HNSW), V-SKNN and STAN with the DIGINETICA settings,
co-visitation, 200 merged candidates, and the default ranker (`BlendScorer`: a DLRM and two LightGBM
rankers; ``--ranker dlrm``: the DLRM alone). Weights are random and the ranker is fitted on 2,000
validation pairs (the DLRM for one epoch): latency does not depend on training, but on the size of the
trees (``trees`` in the JSON). Requests are validation sessions of the synthetic log with their event
times, timed one by one after a warm-up (`--requests`), reported as p50/p99 ms; then offline throughput
(`recommend_batch` at batch `--batch`, sessions/s). ``--profile`` also runs every request stage by stage
through the pipeline's parts (encode, each retriever, merge and filters, features, each ranker member,
the blend, ordering, decode; the same lists as `recommend`, checked) and prints p50/p99 ms per stage
(and the p50 of the process's CPU time, the figure to read on a loaded machine), and the batch the same
way three times (``batch_stages_us_per_session``: the median µs of each stage per session at `--batch`).
``--shortlist N`` times the blend as a cascade beside it (its trees score the DLRM's N best
candidates of each request: `BlendScorer(shortlist=N)`), the two alternated request by request and
batch by batch in this process, with the share of requests whose lists differ. The XLNet retriever's
query runs in onnxruntime (``--runtime``, `SessionModelRetriever`'s runtime: its ONNX graph, exported at
build); ``--runtimes`` times it in eager PyTorch beside it, alternated the same way.
``--batch-threads 2 4`` also times the batch on that many torch threads (offline scoring on several cores:
the tensor stages and the trees use them, the kNN retrievers' NumPy work one). ``--offline-workers N`` (default 2) times the offline path a user runs, `recommend_file` (``sessrec recommend``) of
`--offline-sessions` validation sessions written as a parquet file of events with their times, at batch `--batch`
in partitions of one batch: in this process on one thread, and on N threads of it (``--workers N``: each partition
on one torch thread), alternated three times after a warm-up of each; the two output files must be the same bytes.
``--pipeline DIR`` saves the built pipeline there and loads it on later runs. With ``--ann`` it also runs
`ann_index.py`'s FAISS-against-exact comparison at `--ann-items` (default 1M) items.

Example (from the repository root):
    python benchmarks/pipeline_latency.py --profile        # p50_ms, p99_ms, sessions_per_s; per stage
    python benchmarks/pipeline_latency.py --ann            # + FAISS vs exact at 1M items
    python benchmarks/pipeline_latency.py --shortlist 50   # + the blend's trees on the DLRM's 50 best only
    python benchmarks/pipeline_latency.py --runtimes       # + the XLNet query in PyTorch instead of onnxruntime
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from sessrec.baselines import STAN, VSKNN
from sessrec.data import SyntheticSource
from sessrec.models import XLNetEncoder
from sessrec.pipeline.candidate_features import CandidateFeatures
from sessrec.pipeline.candidates import Candidates
from sessrec.pipeline.offline import recommend_file
from sessrec.pipeline.pipeline import Pipeline
from sessrec.pipeline.request import check_request
from sessrec.pipeline.retrieval.baseline_retriever import BaselineRetriever
from sessrec.pipeline.retrieval.covisitation import CoVisitation
from sessrec.pipeline.retrieval.index import ExactIndex, FaissIndex
from sessrec.pipeline.retrieval.session_model_retriever import SessionModelRetriever
from sessrec.pipeline.scoring import BlendScorer, DLRMScorer, GBDTScorer
from sessrec.pipeline.scoring.gbdt_scorer import HostRows
from sessrec.pipeline_training.fitting import fit_ranker
from sessrec.tasks import NextItemTask, SessionDataModule

QUICK_TREES = {"max_rounds": 10, "threads": 1}  # --quick: each LightGBM member boosted 10 rounds at most, on one thread


def data(args: argparse.Namespace) -> SessionDataModule:
    return SessionDataModule(
        source=SyntheticSource(num_sessions=args.sessions, num_items=args.items, num_clusters=200, days=28.0, seed=0),
        max_length=20,
    )


def build(args: argparse.Namespace, dm: SessionDataModule) -> Pipeline:
    train, _ = dm.tensors("train")
    torch.manual_seed(0)
    task = NextItemTask(num_items=dm.num_items, max_length=20, score_scale=16.0,
                        encoder=XLNetEncoder(d_model=64, n_head=4, n_layer=1))
    index = FaissIndex("hnsw") if args.index == "hnsw" else ExactIndex()
    retrievers = {
        "xlnet": (SessionModelRetriever(task.model, task.objective, index, args.runtime), 100),
        "vsknn": (BaselineRetriever(VSKNN(k=500, sample_size=5000, weighting="quadratic", weighting_score="div",
                                          idf_weighting=5)).fit(train, dm.num_items), 100),
        "stan": (BaselineRetriever(STAN(k=500, sample_size=10000, lambda_1=1.225, lambda_2=26000, lambda_3=4.9)).fit(
            train, dm.num_items), 100),
        "covisitation": (CoVisitation().fit(train.numpy(), dm.num_items), 100),
    }
    features = CandidateFeatures().fit_statistics(train, dm.num_items)
    pipe = Pipeline(dm.vocab, retrievers, max_length=20, max_candidates=200, features=features)
    dlrm = DLRMScorer(max_epochs=1)
    trees = QUICK_TREES if args.quick else {}
    scorer = dlrm if args.ranker == "dlrm" else BlendScorer([dlrm, GBDTScorer(**trees), GBDTScorer(seed=1, **trees)])
    fit_ranker(pipe, dm.pairs("valid").take(slice(0, 2000)), scorer)
    return pipe


def pipeline(args: argparse.Namespace, dm: SessionDataModule) -> Pipeline:
    """The built pipeline, or the one saved in ``--pipeline`` (built and saved there first when it holds none)."""
    if args.pipeline is not None and (Path(args.pipeline) / "pipeline.json").exists():
        return Pipeline.from_pretrained(args.pipeline)
    pipe = build(args, dm)
    if args.pipeline is not None:
        pipe.save_pretrained(args.pipeline)
    return pipe


def raw_requests(dm: SessionDataModule, n: int) -> tuple[list[list[int]], list[list[float]]]:
    """`n` validation sessions as raw-id lists and their event times (what a request carries; the
    ranker reads its time features from them). An out-of-vocabulary id is sent as the first item's."""
    pairs = dm.pairs("valid")
    rows, stamps = pairs.items[:n].numpy(), pairs.times[:n].numpy()
    keep = rows != 0
    raw = np.array(dm.vocab.decode(np.where(rows >= 2, rows, 2).ravel()).to_pylist(), dtype=object).reshape(rows.shape)
    return [r[k].tolist() for r, k in zip(raw, keep)], [t[k].tolist() for t, k in zip(stamps, keep)]


def recommend_in_stages(pipe: Pipeline, sessions, k: int, lap) -> object:
    """`Pipeline.recommend_batch` of encoded `sessions` up to the ordering (not decoded), `lap(name)`
    called after each stage: each retriever, merge and filters, features, each ranker member, the blend,
    the ordering (``score`` for a pipeline without a ranker). Also `serve_load.py --model-batches`."""
    found = {}
    for name, (retriever, width) in pipe.retrievers.items():
        found[name] = retriever.retrieve(sessions, width)
        lap(f"retrieve_{name}")
    cands = pipe.select(sessions, found)
    lap("merge_filters")
    if pipe.scorer is None:
        cands = pipe.score(sessions, cands)
        lap("score")
    else:
        inputs = pipe.ranking_inputs(sessions, cands)
        lap("features")
        blend = pipe.scorer if isinstance(pipe.scorer, BlendScorer) else None
        valid, scores, rows = inputs.valid, [], None
        for i, member in enumerate(blend.scorers if blend else [pipe.scorer]):
            rows = HostRows.of(inputs, rows)  # the tree members' host rows, prepared once as in `BlendScorer.score`
            scores.append(BlendScorer.member_score(member, inputs, rows))
            lap(f"rank_{i}_{type(member).__name__}")
            if blend and i == 0:  # a shortlist: the other members score the first one's best candidates only
                inputs = blend.narrow(inputs, scores[0])
        if blend:
            scores = [blend.combine(scores, valid)]
            lap("blend")
        cands = Candidates(cands.items, cands.features, scores[0].masked_fill(~cands.valid, float("-inf")))
    recs = pipe.ordering.order(sessions, cands, min(k, pipe.max_candidates))
    lap("ordering")
    return recs


def staged(pipe: Pipeline, sessions: list[list], stamps: list[list[float]], k: int, clock: dict[str, list[float]],
           cpu: dict[str, list[float]]) -> list[dict]:
    """`Pipeline.recommend` of `sessions` run stage by stage through the pipeline's parts, each stage's
    milliseconds appended to `clock` (wall) and `cpu` (the process's CPU time) under its name."""
    mark = [time.perf_counter(), time.process_time()]

    def lap(name: str) -> None:
        now = [time.perf_counter(), time.process_time()]
        clock[name].append((now[0] - mark[0]) * 1e3)
        cpu[name].append((now[1] - mark[1]) * 1e3)
        mark[:] = now

    request = check_request(sessions, k, times=stamps)
    sessions = pipe.encode(request).to(pipe.device)
    lap("encode")
    recs = recommend_in_stages(pipe, sessions, request.k, lap)
    out = pipe.decode(recs)
    lap("decode")
    return out


def percentiles(ms: list[float], cpu: list[float]) -> dict[str, float]:
    return {"p50_ms": round(float(np.percentile(ms, 50)), 3), "p99_ms": round(float(np.percentile(ms, 99)), 3),
            "cpu_p50_ms": round(float(np.percentile(cpu, 50)), 3)}


def in_runtime(entry: tuple[SessionModelRetriever, int], runtime: str) -> tuple[SessionModelRetriever, int]:
    """(retriever, width) with the retriever's query in `runtime`: itself, or one on the same model and index."""
    retriever, width = entry
    if retriever.runtime == runtime:
        return entry
    return SessionModelRetriever(retriever.model, retriever.objective, retriever.index, runtime), width


def trees(pipe: Pipeline) -> list[int]:
    """Trees of each LightGBM member of the ranker."""
    members = pipe.scorer.scorers if isinstance(pipe.scorer, BlendScorer) else [pipe.scorer]
    return [m.best_round for m in members if isinstance(m, GBDTScorer)]


def offline(pipe: Pipeline, dm: SessionDataModule, args: argparse.Namespace, rounds: int = 3) -> dict:
    """`recommend_file` of `args.offline_sessions` validation sessions (one row per event, with their times) at batch
    `args.batch`, partitions of one batch, in this process on one thread and on `args.offline_workers` threads,
    alternated `rounds` times after one warm-up run of each: sessions/s of each (the median run) and whether the
    two files are the same bytes."""
    sessions, stamps = raw_requests(dm, args.offline_sessions)
    workers = {"one_thread": None, f"{args.offline_workers}_threads": args.offline_workers}
    seconds: dict[str, list[float]] = {name: [] for name in workers}
    with tempfile.TemporaryDirectory() as folder:
        events = Path(folder) / "sessions.parquet"
        pq.write_table(pa.table({"session_id": np.repeat(np.arange(len(sessions)), [len(s) for s in sessions]),
                                 "item_id": np.concatenate(sessions).astype(np.int64),
                                 "timestamp": np.concatenate(stamps)}), events)
        for round_ in range(rounds + 1):
            for name, n in workers.items():
                start = time.perf_counter()
                with contextlib.redirect_stdout(sys.stderr):  # its progress lines; the JSON goes to stdout
                    recommend_file(pipe, events, Path(folder) / f"{name}.parquet", k=args.k, batch_size=args.batch,
                                   partition_batches=1, overwrite=True, workers=n)
                if round_:  # the first round warms up
                    seconds[name].append(time.perf_counter() - start)
        files = [(Path(folder) / f"{name}.parquet").read_bytes() for name in workers]
    return {"sessions": len(sessions), "batch": args.batch, "same_bytes": files[0] == files[1],
            **{f"{name}_sessions_per_s": round(len(sessions) / float(np.median(s)), 1) for name, s in seconds.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=56_000, help="catalogue of the synthetic log (56,000: about 43,000 seen in training, as DIGINETICA)")
    parser.add_argument("--sessions", type=int, default=200_000)
    parser.add_argument("--index", choices=["exact", "hnsw"], default="exact")
    parser.add_argument("--ranker", choices=["blend", "dlrm"], default="blend", help="the default BlendScorer, or the DLRM alone")
    parser.add_argument("--pipeline", default=None, help="folder to save the built pipeline in, and to load it from when it holds one")
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--profile", action="store_true", help="also time every stage of each request")
    parser.add_argument("--ann", action="store_true", help="also FAISS vs exact (benchmarks/ann_index.py)")
    parser.add_argument("--ann-items", type=int, default=1_000_000)
    parser.add_argument("--shortlist", type=int, help="also the blend with its trees on the DLRM's N best candidates, alternated")
    parser.add_argument("--runtime", choices=["torch", "onnxruntime"], default="onnxruntime",
                        help="where the XLNet retriever's query runs (SessionModelRetriever's runtime)")
    parser.add_argument("--runtimes", action="store_true", help="also the XLNet query in the other runtime, alternated")
    parser.add_argument("--batch-threads", type=int, nargs="*", default=[],
                        help="also the offline batch on these torch thread counts (the trees' too), after the one-thread figure")
    parser.add_argument("--offline-workers", type=int, default=2,
                        help="also recommend_file of --offline-sessions on one thread and on this many threads (0: not)")
    parser.add_argument("--offline-sessions", type=int, default=4096)
    parser.add_argument("--quick", action="store_true", help="a small smoke run (5,000 items; LightGBM members of 10 rounds at most)")
    args = parser.parse_args()
    if any(n < 1 for n in args.batch_threads):
        parser.error(f"--batch-threads: thread counts of 1 or more, got {args.batch_threads}")
    if args.offline_workers < 0 or args.offline_sessions < 1:
        parser.error(f"--offline-workers 0 or more and --offline-sessions 1 or more, got {args.offline_workers} and "
                     f"{args.offline_sessions}")
    if args.quick:
        args.items, args.sessions, args.requests, args.warmup, args.batch = 5_000, 20_000, 30, 5, 64
        args.offline_sessions = 256
    torch.set_num_threads(1)

    start = time.perf_counter()
    dm = data(args)
    pipe = pipeline(args, dm)
    xlnet = pipe.retrievers["xlnet"] = in_runtime(pipe.retrievers["xlnet"], args.runtime)
    print(f"built in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    scorers = {"": (pipe.scorer, xlnet)}  # each variant's ranker and XLNet retriever
    if args.shortlist is not None:
        if not isinstance(pipe.scorer, BlendScorer):
            parser.error("--shortlist is a setting of the blend ranker: not with --ranker dlrm")
        scorers["shortlist"] = (BlendScorer(pipe.scorer.scorers, pipe.scorer.weights, shortlist=args.shortlist), xlnet)
    other = "torch" if args.runtime == "onnxruntime" else "onnxruntime"
    if args.runtimes:
        scorers["runtime"] = (pipe.scorer, in_runtime(xlnet, other))

    def on(name: str) -> Pipeline:
        """The pipeline as variant `name` ("": as built or saved, the query in `--runtime`; "shortlist": the ranker as a
        cascade; "runtime": the query in the other runtime)."""
        pipe.scorer, pipe.retrievers["xlnet"] = scorers[name]
        return pipe

    sessions, stamps = raw_requests(dm, args.warmup + args.requests)
    clock: dict[str, list[float]] = defaultdict(list)
    cpu: dict[str, list[float]] = defaultdict(list)
    times: dict[str, list[float]] = {name: [] for name in scorers}
    lists: dict[str, list] = {name: [] for name in scorers}
    with torch.inference_mode():
        for session, stamp in zip(sessions[: args.warmup], stamps[: args.warmup]):
            for name in scorers:
                on(name).recommend([session], k=args.k, times=[stamp])
        for session, stamp in zip(sessions[args.warmup :], stamps[args.warmup :]):
            for name in scorers:  # alternated request by request
                t = time.perf_counter()
                out = on(name).recommend([session], k=args.k, times=[stamp])
                times[name].append((time.perf_counter() - t) * 1e3)
                lists[name].append(out[0]["item_ids"])
                assert len(out[0]["item_ids"]) > 0
            if args.profile:  # the same request again, stage by stage: the same list
                parts = staged(on(""), [session], [stamp], args.k, clock, cpu)
                assert parts[0]["item_ids"] == lists[""][-1], "the staged run differs from recommend"
                for laps in (clock, cpu):
                    laps["total"].append(sum(laps[name][-1] for name in laps if name != "total"))
        many, their_times = raw_requests(dm, args.batch)
        seconds = dict.fromkeys(scorers, 0.0)
        for name in scorers:  # warm-up at this batch size
            on(name).recommend_batch(pipe.encode(check_request(many, times=their_times)), args.k)
        rounds = 3
        for _ in range(rounds):
            for name in scorers:
                t = time.perf_counter()
                on(name).recommend_batch(pipe.encode(check_request(many, times=their_times)), args.k)
                seconds[name] += time.perf_counter() - t
        threaded = {}  # thread count -> sessions/s of the first variant's batch on that many threads
        for n in args.batch_threads:
            torch.set_num_threads(n)
            on("").recommend_batch(pipe.encode(check_request(many, times=their_times)), args.k)  # warm-up
            t = time.perf_counter()
            for _ in range(rounds):
                on("").recommend_batch(pipe.encode(check_request(many, times=their_times)), args.k)
            threaded[n] = round(rounds * args.batch / (time.perf_counter() - t), 1)
        torch.set_num_threads(1)
        batch_clock: dict[str, list[float]] = defaultdict(list)
        if args.profile:  # the batch again, stage by stage, three times
            for _ in range(rounds):
                staged(on(""), many, their_times, args.k, batch_clock, defaultdict(list))
        on("")

    def timing(ms: list[float], total_s: float) -> dict:
        ms = np.array(ms)
        return {"p50_ms": round(float(np.percentile(ms, 50)), 2), "p90_ms": round(float(np.percentile(ms, 90)), 2),
                "p99_ms": round(float(np.percentile(ms, 99)), 2), "mean_ms": round(float(ms.mean()), 2),
                "sessions_per_s": round(rounds * args.batch / total_s, 1)}

    record = {
        "system": f"pipeline-{args.index}", "items": int(pipe.vocab.num_products), "candidates": pipe.max_candidates,
        "retrievers": list(pipe.retrievers), "scorer": type(pipe.scorer).__name__, "trees": trees(pipe), "threads": 1,
        "runtime": args.runtime,
        "requests": len(times[""]), **timing(times[""], seconds[""]), "batch": args.batch,
        "load_average": round(os.getloadavg()[0], 2),
    }
    def beside(name: str) -> dict:
        """Variant `name`'s timings, their ratios to the first variant's, and the share of lists that differ."""
        them = timing(times[name], seconds[name])
        return {**them, "p50_ratio": round(them["p50_ms"] / record["p50_ms"], 3),
                "p99_ratio": round(them["p99_ms"] / record["p99_ms"], 3),
                "sessions_per_s_ratio": round(them["sessions_per_s"] / record["sessions_per_s"], 3),
                "lists_differ": round(float(np.mean([a != b for a, b in zip(lists[""], lists[name])])), 3)}

    if threaded:
        record["sessions_per_s_on_threads"] = threaded
    if args.shortlist is not None:
        record["shortlist"] = {"n": args.shortlist, **beside("shortlist")}
    if args.runtimes:
        record["other_runtime"] = {"runtime": other, **beside("runtime")}
    if args.profile:
        record["stages"] = {name: percentiles(ms, cpu[name]) for name, ms in clock.items()}
        record["batch_stages_us_per_session"] = {name: round(float(np.median(ms)) * 1e3 / args.batch, 1)
                                                 for name, ms in batch_clock.items()}
    if args.offline_workers:
        record["offline"] = offline(on(""), dm, args)
    print(json.dumps(record), flush=True)
    if args.ann:
        sys.path.insert(0, str(Path(__file__).parent))
        from ann_index import ann_vs_exact

        for kind in ("hnsw", "ivf"):
            print(json.dumps(ann_vs_exact(num_items=args.ann_items, kind=kind)), flush=True)


if __name__ == "__main__":
    main()
