"""Approximate (FAISS HNSW / IVF) against exact maximum-inner-product top-k: recall and latency.

Data (seeded): ``--items`` item vectors of width ``--dim`` around ``--centroids`` random unit
centroids plus Gaussian noise of norm about ``--noise`` (1.0: as far from its centroid as the
centroid is from the origin, so clusters overlap), normalised, with a bias column appended
(0.1 x standard normal, the output bias the session-model retriever folds in): vectors are
(N, dim + 1). Queries sit near the items' clusters: a random centroid plus the same noise,
scaled to norm 4, with 1 in the bias column.

Contenders, built from the same table: ``ExactIndex`` (blocked matrix product, the ground truth)
and ``FaissIndex`` of ``--kind`` (``hnsw``, ``ivf`` or ``both``). Latency is the online case: one
query at a time on one thread, exact and ANN alternating per query after a warm-up, medians over
queries (``*_ms_per_query``; the machine is shared and noisy). Batched figures (all queries in
one call) are reported as ``*_batch_ms_per_query``. ``recall@k`` is the mean over queries of
|ANN top-k n exact top-k| / k.

Defaults were tuned on the 1M-item, k=200 run (one thread): HNSW M 32, efConstruction 80 builds in
about 3.5 min, and efSearch 384 reaches recall@200 0.965 (200: 0.951, 768: 0.981 at 2.3x the
time); IVF with 4 sqrt(N) = 4000 lists trains in about 25 s on a 64-per-list sample, and nprobe 32
reaches 0.980 (64: 0.987 at 1.6x the time). docs/benchmarks.md is the place for quoted numbers.

Prints one JSON line per index kind on stdout; progress goes to stderr.

Example (from the repository root):
    python benchmarks/ann_index.py --kind both
    python benchmarks/ann_index.py --quick
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import faiss
import numpy as np
import torch

from sessrec.pipeline.retrieval.index import ExactIndex, FaissIndex


def clustered_items(
    num_items: int, dim: int, centroids: int, noise: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """(N, dim + 1) float32 item vectors with a bias column, and the (C, dim) unit centroids."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((centroids, dim), dtype=np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    items = rng.standard_normal((num_items, dim), dtype=np.float32)
    items *= np.float32(noise / np.sqrt(dim))  # noise of norm about `noise` around a unit centroid
    items += centres[rng.integers(0, centroids, num_items)]
    items /= np.linalg.norm(items, axis=1, keepdims=True)
    bias = np.float32(0.1) * rng.standard_normal((num_items, 1), dtype=np.float32)
    return np.hstack([items, bias]), centres


def cluster_queries(centres: np.ndarray, count: int, noise: float, seed: int) -> torch.Tensor:
    """(count, dim + 1) queries near random centroids, norm 4, with 1 in the bias column."""
    rng = np.random.default_rng(seed + 1)
    dim = centres.shape[1]
    jitter = rng.standard_normal((count, dim), dtype=np.float32) * np.float32(noise / np.sqrt(dim))
    q = centres[rng.integers(0, len(centres), count)] + jitter
    q *= np.float32(4.0) / np.linalg.norm(q, axis=1, keepdims=True)
    return torch.from_numpy(np.hstack([q, np.ones((count, 1), dtype=np.float32)]))


def set_recall(found: torch.Tensor, truth: torch.Tensor) -> float:
    """Mean over rows of |found n truth| / k for (B, k) id matrices (ids unique within a row)."""
    hits = (found.unsqueeze(2) == truth.unsqueeze(1)).any(dim=2)  # (B, k)
    return float(hits.float().sum(dim=1).div(truth.shape[1]).mean())


def ann_vs_exact(
    num_items: int = 1_000_000,
    dim: int = 64,
    k: int = 200,
    queries: int = 200,
    kind: str = "hnsw",
    seed: int = 0,
    centroids: int = 2000,
    noise: float = 1.0,
    hnsw_m: int = 32,
    ef_construction: int = 80,
    ef_search: int = 384,
    nlist: int | None = None,
    nprobe: int = 32,
    warmup: int = 10,
) -> dict:
    """Build both indexes on the same clustered table, measure recall@k and latency; the JSON record."""
    vectors, centres = clustered_items(num_items, dim, min(centroids, num_items), noise, seed)
    ids = np.arange(num_items, dtype=np.int64) + 2  # model ids start after padding and OOV
    q = cluster_queries(centres, queries, noise, seed)

    exact = ExactIndex().build(vectors, ids)
    print(f"{kind}: building over {vectors.shape}", file=sys.stderr)
    start = time.perf_counter()
    ann = FaissIndex(kind, hnsw_m=hnsw_m, ef_construction=ef_construction, ef_search=ef_search, nlist=nlist,
                     nprobe=nprobe, seed=seed).build(vectors, ids)
    build_s = time.perf_counter() - start
    print(f"{kind}: built in {build_s:.1f}s", file=sys.stderr)

    for row in range(min(warmup, queries)):
        exact.search(q[row:row + 1], k)
        ann.search(q[row:row + 1], k)
    times: dict[str, list[float]] = {"exact": [], "ann": []}
    found = []
    for row in range(queries):  # batch 1, alternating
        start = time.perf_counter()
        exact.search(q[row:row + 1], k)
        times["exact"].append(time.perf_counter() - start)
        start = time.perf_counter()
        found.append(ann.search(q[row:row + 1], k)[1])
        times["ann"].append(time.perf_counter() - start)
    start = time.perf_counter()
    truth = exact.search(q, k)[1]
    exact_batch = time.perf_counter() - start
    start = time.perf_counter()
    batch_found = ann.search(q, k)[1]
    ann_batch = time.perf_counter() - start

    exact_ms = statistics.median(times["exact"]) * 1e3
    ann_ms = statistics.median(times["ann"]) * 1e3
    settings = (
        {"hnsw_m": hnsw_m, "ef_construction": ef_construction, "ef_search": ef_search} if kind == "hnsw"
        else {"nlist": ann.num_lists, "nprobe": nprobe}
    )
    return {
        "benchmark": "ann_index",
        "system": f"faiss-{kind}",
        "items": num_items,
        "dim": dim,
        "vector_width": dim + 1,
        "k": k,
        "queries": queries,
        "recall@k": round(set_recall(torch.cat(found), truth), 4),
        "batch_recall@k": round(set_recall(batch_found, truth), 4),
        "exact_ms_per_query": round(exact_ms, 3),
        "ann_ms_per_query": round(ann_ms, 3),
        "speedup": round(exact_ms / ann_ms, 1),
        "exact_batch_ms_per_query": round(exact_batch * 1e3 / queries, 3),
        "ann_batch_ms_per_query": round(ann_batch * 1e3 / queries, 3),
        "build_s": round(build_s, 1),
        **settings,
        "centroids": min(centroids, num_items),
        "noise": noise,
        "threads": 1,
        "seed": seed,
        "faiss": faiss.__version__,
        "torch": torch.__version__,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=64, help="model width (vectors get one more: the bias)")
    parser.add_argument("--k", type=int, default=200)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--kind", choices=["hnsw", "ivf", "both"], default="both")
    parser.add_argument("--centroids", type=int, default=2000)
    parser.add_argument("--noise", type=float, default=1.0, help="noise norm around the unit centroids")
    parser.add_argument("--hnsw-m", type=int, default=32)
    parser.add_argument("--ef-construction", type=int, default=80)
    parser.add_argument("--ef-search", type=int, default=384)
    parser.add_argument("--nlist", type=int, default=None, help="IVF lists (default: about 4 sqrt(N))")
    parser.add_argument("--nprobe", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="smoke run: 20k items, 50 queries, k 100")
    args = parser.parse_args()
    if args.quick:
        args.items, args.queries, args.k, args.centroids = 20_000, 50, 100, 200
    torch.set_num_threads(1)
    faiss.omp_set_num_threads(1)
    for kind in (["hnsw", "ivf"] if args.kind == "both" else [args.kind]):
        record = ann_vs_exact(
            args.items, args.dim, args.k, args.queries, kind, args.seed,
            centroids=args.centroids, noise=args.noise,
            hnsw_m=args.hnsw_m, ef_construction=args.ef_construction, ef_search=args.ef_search,
            nlist=args.nlist, nprobe=args.nprobe,
        )
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
