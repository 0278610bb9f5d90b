"""Peak resident memory of the ranker's rows and of each scorer's fit on them, on a real dataset.

Each step runs in its own process, so that each peak (``ru_maxrss``) is that step's:

- ``{"stage": "rows"}``: the pipeline built from the dataset's recipe (its retrievers fitted or
  loaded), then `fitting.candidate_rows` of the ranker's validation pairs (the first ``--pairs``
  of them when given), saved to ``--rows`` (reused when that file exists: ``"reused": true``);
- ``{"stage": "fit", "scorer": ...}``: the rows loaded, then `fitting.fit_on` with the scorer
  (``gbdt``: `GBDTScorer` with ``--threads``; ``dlrm``: `DLRMScorer` with ``--dlrm-epochs``;
  ``blend``: the recipe's default `BlendScorer`), its features built ``--chunk`` pairs at a time.
  The process holds the data module and one retriever (the co-visitation, else the first kNN
  baseline: the pipeline the fit needs), not every retriever.

Each line has ``peak_rss_mb`` (the step's process), ``seconds`` and the sizes (``pairs``,
``slots``: filled candidate slots); a fit line also ``loaded_rss_mb`` (the peak once the rows are
loaded, before the fit). Run from the repository root, with the stage-1 checkpoints of the recipe
in place (``benchmarks/pipeline_eval.py`` trains missing ones).

Example:
    OMP_NUM_THREADS=1 python benchmarks/ranker_memory.py --dataset yoochoose164
    python benchmarks/ranker_memory.py --dataset diginetica --scorers gbdt --chunk 1024
    python benchmarks/ranker_memory.py --quick   # seconds: pipeline_eval.py's synthetic recipe, 100 pairs, chunk 64
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from sessrec.cli.parsers import load_recipe
from sessrec.pipeline.scoring import BlendScorer, DLRMScorer, GBDTScorer, Scorer
from sessrec.pipeline_training import fitting

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipeline_eval import RECIPES, quick_folder, quick_recipe  # noqa: E402 - the datasets' pipeline recipes, one list for both scripts


def peak_mb() -> float:
    """This process's peak resident memory in MB (Linux reports ru_maxrss in KB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rows_stage(args: argparse.Namespace) -> dict:
    """Build the pipeline and the ranker's rows; save them with the fitted feature statistics."""
    start = time.perf_counter()
    recipe = load_recipe(args.recipe)
    pipe = recipe.build()
    pairs = recipe.ranker_data()
    if args.pairs:
        pairs = pairs.take(slice(0, args.pairs))
    data = fitting.candidate_rows(pipe, pairs, recipe.batch_size)
    torch.save({"data": data, "features": pipe.features}, args.rows)
    return {"stage": "rows", "pairs": len(data), "slots": int(data.valid.sum()), "candidates": data.valid.shape[1],
            "peak_rss_mb": round(peak_mb()), "seconds": round(time.perf_counter() - start, 1)}


def scorer_of(name: str, args: argparse.Namespace) -> Scorer:
    if name == "gbdt":
        return GBDTScorer(threads=args.threads)
    if name == "dlrm":
        return DLRMScorer(max_epochs=args.dlrm_epochs)
    return BlendScorer()


def fit_stage(args: argparse.Namespace) -> dict:
    """Load the rows and fit one scorer on them, their features built `args.chunk` pairs at a time."""
    recipe = load_recipe(args.recipe)
    light = {"covisitation"} if recipe.covisitation is not None else {next(iter(recipe.baselines))}
    pipe = recipe.build(light)  # the data module and one retriever: the rows carry every retriever's columns
    saved = torch.load(args.rows, weights_only=False)
    data, pipe.features = saved["data"], saved["features"]
    loaded = peak_mb()
    start = time.perf_counter()
    info = fitting.fit_on(pipe, data, scorer_of(args.scorer, args), chunk=args.chunk)
    return {"stage": "fit", "scorer": args.scorer, "chunk": args.chunk, "pairs": len(data), "slots": int(data.valid.sum()),
            "features": len(info["features"]), "loaded_rss_mb": round(loaded), "peak_rss_mb": round(peak_mb()),
            "seconds": round(time.perf_counter() - start, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", choices=sorted(RECIPES), default="yoochoose164")
    parser.add_argument("--recipe", help="a pipeline recipe other than the dataset's")
    parser.add_argument("--pairs", type=int, default=0, help="the first N validation pairs only (0: all)")
    parser.add_argument("--chunk", type=int, default=fitting.CHUNK, help="pairs whose features a fit builds at once")
    parser.add_argument("--scorers", nargs="+", choices=["gbdt", "dlrm", "blend"], default=["gbdt", "dlrm"])
    parser.add_argument("--threads", type=int, default=1, help="LightGBM threads")
    parser.add_argument("--dlrm-epochs", type=int, default=2)
    parser.add_argument("--rows", help="where the rows are saved between the steps (default: a temporary file)")
    parser.add_argument("--quick", action="store_true",
                        help="seconds, for CI: pipeline_eval.py's synthetic recipe and untrained tiny XLNet (in a temporary "
                             "folder), 100 pairs, chunk 64, 1 DLRM epoch")
    parser.add_argument("--stage", choices=["rows", "fit"], help=argparse.SUPPRESS)
    parser.add_argument("--scorer", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        work = quick_folder("ranker_memory")
        args.recipe = str(work / quick_recipe(work))
        args.pairs, args.chunk, args.dlrm_epochs = 100, 64, 1
        os.chdir(work)  # the recipe's paths are relative to it; the steps' processes start there
    args.recipe = args.recipe or RECIPES[args.dataset]
    torch.set_num_threads(1)
    if args.stage == "rows":
        print(json.dumps(rows_stage(args)))
        return
    if args.stage == "fit":
        print(json.dumps(fit_stage(args)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        rows = Path(args.rows or Path(tmp) / "rows.pt")
        common = [sys.executable, __file__, "--recipe", args.recipe, "--rows", str(rows), "--chunk", str(args.chunk),
                  "--threads", str(args.threads), "--dlrm-epochs", str(args.dlrm_epochs), "--pairs", str(args.pairs)]
        if rows.exists():
            print(json.dumps({"stage": "rows", "reused": True, "rows": str(rows)}), flush=True)
        else:
            subprocess.run([*common, "--stage", "rows"], check=True)
        for name in args.scorers:
            subprocess.run([*common, "--stage", "fit", "--scorer", name], check=True)


if __name__ == "__main__":
    main()
