"""The rankers side by side on one dataset's candidate rows, several seeds: which scorer the recipes default to.

Builds the pipeline of the dataset's recipe (its stage-1 checkpoint must exist: see
``benchmarks/pipeline_eval.py``), its ranker rows (the validation pairs' candidates) and its test
rows once, caching them under ``--cache`` (``torch.save``; delete the file when the retrievers
change), then fits each scorer with each seed on the ranker rows (`fit_on`) and scores the test
rows exactly as `evaluate_rows` does. Prints one JSON line per (scorer, seed), then one per scorer
with the mean and standard deviation over the seeds.

Scorers: ``gbdt`` (`GBDTScorer`), ``dlrm`` (`DLRMScorer`), ``blend`` (`BlendScorer`: a DLRM and two
LightGBM rankers, `PipelineRecipe`'s default), each with its defaults and the run's seed (the blend's
LightGBM rankers: seeds 2s and 2s + 1).

Example (from the repository root):
    python benchmarks/ranker_eval.py --dataset rsc15_100k --seeds 3
    python benchmarks/ranker_eval.py --dataset diginetica --seeds 3 --scorers gbdt,blend
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from sessrec.pipeline.recipe import load_recipe
from sessrec.pipeline.scoring import BlendScorer, DLRMScorer, GBDTScorer, Scorer
from sessrec.pipeline.training import candidate_rows, evaluate_rows, fit_on

RECIPES = {
    "rsc15_100k": "recipes/pipeline_rsc15.yaml",
    "diginetica": "recipes/pipeline_diginetica.yaml",
    "trivago": "recipes/pipeline_trivago.yaml",
}
KS = (10, 20)


def make(name: str, seed: int, threads: int) -> Scorer:
    if name == "gbdt":
        return GBDTScorer(threads=threads, seed=seed)
    if name == "dlrm":
        return DLRMScorer(seed=seed)
    if name == "blend":  # the default blend's members, seeds 2s and 2s + 1 for the two LightGBM rankers
        return BlendScorer([DLRMScorer(seed=seed), GBDTScorer(threads=threads, seed=2 * seed),
                            GBDTScorer(threads=threads, seed=2 * seed + 1)])
    raise ValueError(f"unknown scorer {name!r}: gbdt, dlrm or blend")


def emit(record: dict) -> None:
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in record.items()}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", choices=sorted(RECIPES), required=True)
    parser.add_argument("--recipe", help="a pipeline recipe other than the dataset's")
    parser.add_argument("--override", nargs="*", default=[], help="recipe overrides, e.g. --pipeline.models.xlnet.checkpoint PATH")
    parser.add_argument("--scorers", default="gbdt,dlrm,blend")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--cache", default="runs/ranker_rows", help="folder of the cached candidate rows")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    recipe = load_recipe(args.recipe or RECIPES[args.dataset], args.override)
    pipe = recipe.build()
    cache = Path(args.cache) / f"{args.dataset}.pt"
    if cache.exists():
        rows = torch.load(cache, weights_only=False)
    else:
        start = time.perf_counter()
        rows = {"data": candidate_rows(pipe, *recipe.ranker_data(), recipe.batch_size),
                "test": candidate_rows(pipe, *recipe.data.tensors("test"), recipe.batch_size)}
        cache.parent.mkdir(parents=True, exist_ok=True)
        torch.save(rows, cache)
        print(f"candidate rows built in {time.perf_counter() - start:.0f} s, cached to {cache}", file=sys.stderr)

    for name in args.scorers.split(","):
        found = []
        for seed in range(args.seeds):
            start = time.perf_counter()
            fit_on(pipe, rows["data"], make(name, seed, args.threads))
            metrics = evaluate_rows(pipe, rows["test"], KS)
            found.append(metrics)
            emit({"dataset": args.dataset, "scorer": name, "seed": seed, **metrics, "seconds": time.perf_counter() - start})
        summary = {"dataset": args.dataset, "scorer": name, "seeds": args.seeds}
        for key in ("recall@20", "mrr@20", "ndcg@20"):
            values = [m[key] for m in found]
            summary[key] = statistics.mean(values)
            summary[f"{key}_std"] = statistics.pstdev(values)
        emit(summary)


if __name__ == "__main__":
    main()
