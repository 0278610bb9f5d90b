"""The four-stage pipeline against its own retrievers, end to end, on a real dataset.

Fits what it needs: the stage-1 session model (``sessrec fit`` on its recipe, when its checkpoint
is missing or ``--retrain``), the kNN and co-visitation retrievers (on the training split), the
ranker (on the validation pairs' candidates), then scores the test pairs once. Prints one JSON
line per system, single retrievers first and the pipeline (the recipe's scorer) last:

- ``{"system": <retriever>}``: each retriever alone, full catalogue (its top-20 is its ranking);
  with its retrieval recall@K (K = 50, 100, 200, 500): the ceiling it gives the ranker;
- ``{"system": "candidates"}``: the merged, filtered candidate set (its recall is the pipeline's
  ceiling);
- ``{"system": "pipeline-gbdt"}`` / ``"pipeline-dlrm"``: the same candidates ranked by each scorer;
- with ``--ablations``: ``"pipeline-without-retriever-<name>"`` and ``"pipeline-without-features-<group>"``
  (``--ablation-scorer``, GBDT by default: it trains in seconds);
- last, ``{"system": "pipeline"}``: the recipe's scorer (DLRM), the figure the README quotes.

Each line has ``recall@20``, ``mrr@20``, ``ndcg@20`` (and @10) and ``seconds`` (a retriever: its
test-split scoring; a ranker: its fitting plus scoring the test candidates, which are built once
and shared by every ranker compared; stage-1 training time, when it ran, on the first lines).

Example (from the repository root):
    python benchmarks/pipeline_eval.py --dataset rsc15_100k
    python benchmarks/pipeline_eval.py --dataset diginetica --ablations features
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from sessrec.pipeline import Sessions
from sessrec.pipeline.features import CandidateFeatures
from sessrec.pipeline.pipeline import Pipeline
from sessrec.pipeline.recipe import load_recipe
from sessrec.pipeline.scoring import DLRMScorer, GBDTScorer
from sessrec.pipeline.training import candidate_rows, evaluate_rows, fit_on, list_metrics, retrieval_recall

RECIPES = {
    "rsc15_100k": "recipes/pipeline_rsc15.yaml",
    "diginetica": "recipes/pipeline_diginetica.yaml",
    "trivago": "recipes/pipeline_trivago.yaml",
}
KS = (10, 20)


def emit(record: dict) -> None:
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in record.items()}), flush=True)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def train_models(recipe, retrain: bool) -> dict[str, float]:
    """``sessrec fit`` each stage-1 model whose checkpoint is missing; seconds per model trained."""
    took = {}
    for name, spec in recipe.models.items():
        if Path(spec.checkpoint).exists() and not retrain:
            continue
        log(f"training {name}: sessrec fit --config {spec.recipe}")
        start = time.perf_counter()
        subprocess.run(["sessrec", "fit", "--config", spec.recipe], check=True,
                       stdout=subprocess.DEVNULL)
        took[name] = time.perf_counter() - start
    return took


@torch.no_grad()
def single(pipe: Pipeline, name: str, items: torch.Tensor, targets: torch.Tensor, batch: int) -> dict[str, float]:
    """A retriever alone: its own top-(max(KS) + 1) over the full catalogue is its ranking (ties against the target)."""
    retriever = pipe.stage_retrievers[name]
    totals: dict[str, float] = {}
    for lo in range(0, len(items), batch):
        top = retriever.retrieve(Sessions(items[lo : lo + batch].long()), max(KS) + 1)
        for key, value in list_metrics(top.items, top.scores, targets[lo : lo + batch], KS).items():
            totals[key] = totals.get(key, 0.0) + value
    return {k: v / len(items) for k, v in totals.items()}


def scored(pipe: Pipeline, data, scorer, test) -> dict:
    """Fit `scorer` on the ranker rows `data`, evaluate on the prepared test rows."""
    start = time.perf_counter()
    info = fit_on(pipe, data, scorer)
    metrics = evaluate_rows(pipe, test, KS)
    return {**metrics, "seconds": time.perf_counter() - start, "ranker_pairs": info["pairs"],
            "ranker_coverage": info["coverage"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", choices=sorted(RECIPES), required=True)
    parser.add_argument("--recipe", help="a pipeline recipe other than the dataset's")
    parser.add_argument("--retrain", action="store_true", help="train the stage-1 models even if checkpoints exist")
    parser.add_argument("--ablations", nargs="*", choices=["retrievers", "features"], default=None,
                        help="also each retriever and/or each feature group removed (no value: both)")
    parser.add_argument("--ablation-scorer", choices=["gbdt", "dlrm"], default="gbdt")
    parser.add_argument("--recall-ks", default="50,100,200,500")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    wall = time.perf_counter()

    recipe = load_recipe(args.recipe or RECIPES[args.dataset])
    trained = train_models(recipe, args.retrain)
    start = time.perf_counter()
    pipe = recipe.build()
    build_seconds = time.perf_counter() - start
    dm, batch = recipe.data, recipe.batch_size
    test = dm.tensors("test")
    valid = recipe.ranker_data()
    log(f"{args.dataset}: {len(valid)} validation pairs (ranker), {len(test[0])} test pairs; built in {build_seconds:.0f} s")

    ks = [int(k) for k in args.recall_ks.split(",")]
    ceilings = retrieval_recall(pipe, *test, ks, batch_size=256)
    for name in pipe.retrievers:
        start = time.perf_counter()
        metrics = single(pipe, name, *test, batch)
        extra = {"train_seconds": trained[name]} if name in trained else {}
        emit({"system": name, "dataset": args.dataset, **metrics, **{f"retrieval_{k}": v for k, v in ceilings[name].items()},
              "seconds": time.perf_counter() - start, **extra})

    start = time.perf_counter()
    data = candidate_rows(pipe, valid, batch)
    candidates_seconds = time.perf_counter() - start
    log(f"ranker rows: {tuple(data.valid.shape)}, coverage {data.coverage:.4f}, {candidates_seconds:.0f} s")
    start = time.perf_counter()
    test_rows = candidate_rows(pipe, dm.pairs("test"), batch)
    test_seconds = time.perf_counter() - start
    log(f"test rows: {tuple(test_rows.valid.shape)}, coverage {test_rows.coverage:.4f}, {test_seconds:.0f} s")

    default = recipe.scorer
    runs = [("gbdt", GBDTScorer()), ("dlrm", DLRMScorer())]
    results = {}
    for name, scorer in runs:
        if type(scorer) is type(default):
            scorer = default
        results[name] = scored(pipe, data, scorer, test_rows)
        emit({"system": f"pipeline-{name}", "dataset": args.dataset, **results[name]})

    ablations = set() if args.ablations is None else set(args.ablations or ["retrievers", "features"])
    make = GBDTScorer if args.ablation_scorer == "gbdt" else DLRMScorer
    full_features = pipe.features
    if "retrievers" in ablations:
        for name in list(pipe.retrievers):
            start = time.perf_counter()
            rest = {n: r for n, r in pipe.retrievers.items() if n != name}
            smaller = Pipeline(pipe.vocab, rest, pipe.max_length, pipe.max_candidates, pipe.history_length, pipe.filters[1:],
                               CandidateFeatures(groups=full_features.groups), None, pipe.ordering)
            smaller.features.popularity = full_features.popularity
            part = candidate_rows(smaller, valid, batch)
            metrics = scored(smaller, part, make(), candidate_rows(smaller, dm.pairs("test"), batch))
            emit({"system": f"pipeline-without-retriever-{name}", "dataset": args.dataset, "scorer": args.ablation_scorer,
                  **metrics, "seconds": time.perf_counter() - start})
    if "features" in ablations:
        for group in full_features.groups:
            if group == "ids":
                continue  # only the DLRM reads the ids, and its embedding tables need them
            groups = [g for g in full_features.groups if g != group]
            pipe.features = CandidateFeatures(groups=groups)
            pipe.features.popularity = full_features.popularity
            metrics = scored(pipe, data, make(), test_rows)
            emit({"system": f"pipeline-without-features-{group}", "dataset": args.dataset, "scorer": args.ablation_scorer, **metrics})
        pipe.features = full_features

    final = "dlrm" if isinstance(default, DLRMScorer) else "gbdt"
    emit({"system": "pipeline", "dataset": args.dataset, "scorer": type(default).__name__, **results[final],
          "candidates_seconds": candidates_seconds, "test_candidates_seconds": test_seconds, "build_seconds": build_seconds,
          "wall_seconds": time.perf_counter() - wall})


if __name__ == "__main__":
    main()
