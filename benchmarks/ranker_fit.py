"""Seconds of each step of the ranker's fit, and the metrics it reaches, with all negatives and with sampled ones.

The pipeline of a recipe is built (stage-1 models loaded, kNN and co-visitation fitted), the candidate
rows of the ranker's validation pairs and of the test pairs are built once, then the recipe's ranker is
fitted on the validation rows once per ``--negatives`` setting (`fitting.fit_on`: the feature ops, the
features built once, each member of the blend in turn), the settings interleaved over ``--repeats``.
Each fit prints one JSON line: ``negatives`` (null: every candidate), ``rows`` (the slots the rankers
read), ``steps`` (seconds of each step), ``fit_seconds``, the test split's Recall/MRR/NDCG@k of the
pipeline so fitted (`fitting.evaluate_rows`), its validation figures (the ranker's own training pairs:
optimistic), and the load average when it ended (the machine may be shared). A first line
(``"stage": "rows"``) gives the seconds of building the pipeline and the rows. ``--member N`` fits the
blend's N-th member alone instead; ``--seed-offsets`` repeats every fit with each ranker's seed moved by
each offset (0: the recipe's seeds), which gives a setting's spread over seeds on the same rows.

Example:
    python benchmarks/ranker_fit.py --dataset rsc15_100k --negatives all 50 20
    python benchmarks/ranker_fit.py --dataset rsc15_100k --negatives all --member 0 --seed-offsets 0 1 2  # the DLRM alone
    python benchmarks/ranker_fit.py --quick   # seconds: pipeline_eval.py's synthetic recipe, a small blend
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import os
import sys
import time
from pathlib import Path

import torch

from sessrec.cli.parsers import load_recipe
from sessrec.pipeline.scoring import BlendScorer, DLRMScorer, GBDTScorer, Scorer
from sessrec.pipeline_training import fitting
from sessrec.pipeline_training.recipe import ranker_width
from sessrec.saved.registry import config_of, instantiate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipeline_eval import KS, QUICK_GBDT, RECIPES, quick_folder, quick_recipe  # noqa: E402 - the datasets' recipes


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


def rounded(values: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 4) for k, v in values.items()}


def reseeded(scorer: Scorer, offset: int) -> Scorer:
    """A new `scorer` of the same config with every ``seed`` in it (a blend's members' too) moved by `offset`."""
    def move(config):
        if isinstance(config, dict):
            return {k: (v + offset if k == "seed" and isinstance(v, int) else move(v)) for k, v in config.items()}
        return [move(v) for v in config] if isinstance(config, list) else config
    return instantiate(move(config_of(scorer)), expected=Scorer, source="ranker_fit", key="scorer")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", choices=sorted(RECIPES), default="rsc15_100k")
    parser.add_argument("--recipe", help="a pipeline recipe other than the dataset's")
    parser.add_argument("--negatives", nargs="+", default=["all", "50"],
                        help="negatives per pair the rankers train on, one fit each (all: every candidate)")
    parser.add_argument("--repeats", type=int, default=1, help="fits of each setting, the settings interleaved")
    parser.add_argument("--member", type=int, help="fit this member of the recipe's blend alone (0: the first)")
    parser.add_argument("--seed-offsets", type=int, nargs="+", default=[0],
                        help="each fit once per offset, every seed of the ranker moved by it (0: the recipe's)")
    parser.add_argument("--quick", action="store_true",
                        help="seconds, for CI: pipeline_eval.py's synthetic recipe (untrained tiny XLNet, in a temporary "
                             "folder), a blend of a 1-epoch DLRM and two 10-round LightGBM, all negatives and 10")
    args = parser.parse_args()
    settings = [None if n == "all" else int(n) for n in args.negatives]
    if args.quick:
        settings = [None, 10]  # of the 30 candidates
        work = quick_folder("ranker_fit")
        args.recipe = str(work / quick_recipe(work))
        os.chdir(work)  # the recipe's paths are relative to it
    recipe = load_recipe(args.recipe or RECIPES[args.dataset])
    scorer = recipe.scorer
    if args.quick:
        scorer = BlendScorer([DLRMScorer(max_epochs=1), GBDTScorer(**QUICK_GBDT), GBDTScorer(**QUICK_GBDT, seed=1)])
    if args.member is not None:
        members = scorer.scorers if isinstance(scorer, BlendScorer) else [scorer]
        if not 0 <= args.member < len(members):
            parser.error(f"--member {args.member}: the ranker has {len(members)} member(s)")
        scorer = members[args.member]
    start = time.perf_counter()
    pipe = recipe.build()
    built = time.perf_counter() - start
    data = fitting.candidate_rows(pipe, recipe.ranker_data(ranker_width(pipe)), recipe.batch_size)
    wide = pipe.history_length  # evaluated as sessrec test evaluates: the seen filter reads that much
    valid_rows = fitting.candidate_rows(pipe, recipe.data.pairs("valid", width=wide), recipe.batch_size)
    test_rows = fitting.candidate_rows(pipe, recipe.data.pairs("test", width=wide), recipe.batch_size)
    emit({"stage": "rows", "recipe": args.recipe or RECIPES[args.dataset], "build_seconds": round(built, 1),
          "rows_seconds": round(time.perf_counter() - start - built, 1), "pairs": len(data), "slots": int(data.valid.sum()),
          "threads": torch.get_num_threads(), "quick": args.quick})
    features = copy.deepcopy(pipe.features)  # as built: each fit fits its own ops
    for repeat, offset, negatives in itertools.product(range(args.repeats), args.seed_offsets, settings):
        pipe.features = copy.deepcopy(features)
        began = time.perf_counter()
        info = fitting.fit_on(pipe, data, reseeded(scorer, offset), negatives=negatives)
        seconds = time.perf_counter() - began
        emit({"stage": "fit", "scorer": type(scorer).__name__, "negatives": negatives, "repeat": repeat,
              "seed_offset": offset, "pairs": info["pairs"], "rows": info["rows"], "features": len(info["features"]),
              "steps": rounded(info["steps"]), "fit_seconds": round(seconds, 1),
              "test": rounded(fitting.evaluate_rows(pipe, test_rows, KS)),
              "valid": rounded(fitting.evaluate_rows(pipe, valid_rows, KS)),
              "load_average": round(os.getloadavg()[0], 2)})

if __name__ == "__main__":
    main()
