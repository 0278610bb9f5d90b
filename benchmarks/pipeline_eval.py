"""The four-stage pipeline against its own retrievers, end to end, on a real dataset, over seeds.

Fits what it needs: the stage-1 session model (``sessrec fit`` on its recipe ``recipes/<name>.yaml``,
which writes the model directory ``runs/<name>/model`` the pipeline recipe names, when that directory
is missing or ``--retrain``), the kNN and co-visitation retrievers (on the training split), the
ranker (on the validation pairs' candidates), then scores the test pairs once. Prints one JSON
line per system, single retrievers first and the pipeline (the recipe's scorer) last:

- ``{"system": <retriever>}``: each retriever alone, full catalogue (its top-20 is its ranking);
  with its retrieval recall@K (K = 50, 100, 200, 500): the ceiling it gives the ranker;
- ``{"system": "pipeline-gbdt"}`` / ``"pipeline-dlrm"``: the same candidates ranked by each scorer.
  With a `BlendScorer` in the recipe (the default), these are its members, each fitted once and
  evaluated alone (the first LightGBM member is ``pipeline-gbdt``), then ``"pipeline-blend"``: the
  blend of those fitted members (``--blend-weights 2,1,1,0,0``: also ``"pipeline-blend[2,1,1,0,0]"``,
  the same fitted members with those weights, e.g. a subset of them; ``--shortlists 50``: also
  ``"pipeline-blend[shortlist 50]"``, the blend as a cascade). With one scorer in the recipe:
  the recipe's with its settings, the other with its defaults (a scorer of another class adds
  ``"pipeline-<its class, lower case>"``);
- with ``--ablations``: ``"pipeline-without-retriever-<name>"`` and ``"pipeline-without-features-<group>"``
  (``--ablation-scorer``, GBDT by default: it trains in seconds), a group only where the data has its
  columns (no ``time`` without event times) and never the ``ids``;
- last, ``{"system": "pipeline"}``: the recipe's scorer, the figure the README quotes, with the
  candidate recall, the peak resident memory (``peak_rss_mb`` of this process, ``peak_rss_children_mb``
  of the largest stage-1 training it ran) and ``wall_seconds``, the end-to-end time of the run
  (stage-1 training included when it ran: ``stage1_seconds``).

With the recipe's ``refit_retrievers``, the kNN and co-visitation retrievers are fitted again on the
training and validation sessions once the ranker's rows are built (as ``sessrec fit`` saves the
pipeline): the retrievers-alone lines and the test candidates come from them, and ``--ablations
retrievers`` (which builds the ranker's rows again) is refused.

Each line has ``recall@20``, ``mrr@20``, ``ndcg@20`` (and @10) and ``seconds`` (a retriever: its
test-split scoring; a ranker: its fitting plus scoring the test candidates, which are built once
and shared by every ranker compared), and the seeds it ran with (``stage1_seed``, ``ranker_seed``; a
session model's line: that model's own stage-1 seed).

Seeds. ``--seeds N`` runs N times, run i with stage-1 seed i (``sessrec fit --seed_everything i``,
its model directory ``runs/<stage-1 recipe>_seed<i>/model``; the recipe's own seed keeps the
pipeline recipe's model directory; a pipeline recipe whose models name their ``seed``, e.g. one stage-1
recipe twice with seeds 0 and 1, has its models' seeds shifted by their span times i: 2i and 2i + 1)
and ranker seed i (the scorers' ``seed``: their early-stopping split,
initial weights and shuffling; a blend's member j with config seed c_j gets c_j + n * i, n members,
so its LightGBM members keep distinct seeds). ``--stage1-seeds 0`` keeps one stage-1 model for every run and
varies the ranker seed only (when stage 1 cannot be retrained N times in the budget). The kNN and
co-visitation retrievers depend on no seed: they are fitted for each stage-1 model, but their lines
are printed once. Each run prints its lines as above; then one line per system with the mean over
the runs and the sample standard deviation (``<metric>_std``), ``"seeds"`` (the lines averaged) and
which seeds varied (``"varied"``); the last line is the recipe's scorer's (``"system": "pipeline"``).
Ablations run on the first run only.

Example (from the repository root):
    python benchmarks/pipeline_eval.py --dataset rsc15_100k
    python benchmarks/pipeline_eval.py --dataset diginetica --ablations features
    python benchmarks/pipeline_eval.py --dataset diginetica --seeds 3
    python benchmarks/pipeline_eval.py --dataset tmall --seeds 3 --stage1-seeds 0
    python benchmarks/pipeline_eval.py --quick   # seconds: synthetic sessions, an untrained tiny XLNet, in a temporary folder
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import re
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import yaml

from sessrec.cli.parsers import load_recipe
from sessrec.pipeline import RequestSessions
from sessrec.pipeline.candidate_features import CandidateFeatures, group_of
from sessrec.pipeline.pipeline import Pipeline
from sessrec.pipeline.scoring import BlendScorer, DLRMScorer, GBDTScorer, Scorer
from sessrec.pipeline_training.fitting import (
    RankerData,
    candidate_rows,
    evaluate_rows,
    fit_on,
    list_metrics,
    retrieval_recall,
)
from sessrec.pipeline_training.recipe import ModelRetrieval, PipelineRecipe
from sessrec.saved.registry import config_of

RECIPES = {
    "rsc15_100k": "recipes/pipeline_rsc15.yaml",
    "diginetica": "recipes/pipeline_diginetica.yaml",
    "trivago": "recipes/pipeline_trivago.yaml",
    "yoochoose164": "recipes/pipeline_yoochoose164.yaml",
    "tmall": "recipes/pipeline_tmall.yaml",
    "nowplaying": "recipes/pipeline_nowplaying.yaml",
}
KS = (10, 20)
QUICK_SOURCE = {"num_sessions": 1500, "num_items": 150, "days": 10}  # --quick: the sizes of tests/test_benchmarks.py
QUICK_GBDT = {"max_rounds": 10, "threads": 1, "min_data_in_leaf": 5}
SEED_KEYS = ("stage1_seed", "ranker_seed")


def emit(record: dict) -> None:
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in record.items()}), flush=True)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------- seeds
def seed_plan(seeds: int, stage1_seeds: list[int] | None) -> list[tuple[int, int]]:
    """(stage-1 seed, ranker seed) of each run: ranker seeds 0..N-1, stage-1 seeds the same unless given
    (one value: every run; N values: one per run)."""
    if seeds < 1:
        raise SystemExit(f"--seeds must be >= 1, got {seeds}")
    ranker = list(range(seeds))
    if stage1_seeds is None:
        return list(zip(ranker, ranker))
    if len(stage1_seeds) == 1:
        return [(stage1_seeds[0], s) for s in ranker]
    if len(stage1_seeds) != seeds:
        raise SystemExit(f"--stage1-seeds takes one seed or one per run ({seeds}), got {len(stage1_seeds)}")
    return list(zip(stage1_seeds, ranker))


def recipe_seed(stage1: dict) -> int | None:
    """The seed a stage-1 recipe trains with (``seed_everything``; the CLI's default is 0)."""
    seed = stage1.get("seed_everything", 0)
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else None


def stage1_recipe(model_dir: str) -> Path:
    """The stage-1 recipe that writes a model directory ``runs/<recipe>/model`` (or ``runs/<recipe>_seed<s>/model``,
    a seeded run of it): ``recipes/<recipe>.yaml``."""
    found = re.fullmatch(r"runs/(.+?)(_seed\d+)?/model", str(model_dir))
    recipe = Path("recipes") / f"{found.group(1)}.yaml" if found else None
    if recipe is None or not recipe.is_file():
        raise SystemExit(f"{model_dir}: not runs/<recipe>/model of a stage-1 recipe recipes/<recipe>.yaml; seeded runs "
                         "train that recipe")
    return recipe


def model_dir_of(model_dir: str, seed: int, own: int) -> Path:
    """Where the stage-1 model of `seed` is: the pipeline recipe's model directory for its model's own seed
    (`own`), else ``runs/<stage-1 recipe>_seed<seed>/model``."""
    if seed == own:
        return Path(model_dir)
    return Path("runs") / f"{stage1_recipe(model_dir).stem}_seed{seed}" / "model"


def model_seeds(specs: dict[str, ModelRetrieval], run_seed: int) -> dict[str, tuple[int, Path]]:
    """(stage-1 seed, model directory) of each model in the run of stage-1 seed `run_seed`: each model's own
    seed (its ``seed``, else its recipe's) plus `run_seed` times the span of those seeds, so that no
    two runs share a model's seed."""
    own = {}
    for name, spec in specs.items():
        recipe = stage1_recipe(spec.model_dir)
        own[name] = spec.seed if spec.seed is not None else recipe_seed(yaml.safe_load(recipe.read_text()) or {})
        if own[name] is None:
            raise SystemExit(f"{recipe}: seed_everything must be an integer for seeded runs (model {name!r})")
    trained_as: dict[tuple[Path, int], list[str]] = {}
    for name, spec in specs.items():
        trained_as.setdefault((stage1_recipe(spec.model_dir), own[name]), []).append(name)
    for (_, seed), names in trained_as.items():
        if len(names) > 1:
            raise SystemExit(f"models {sorted(names)} are one stage-1 recipe with one seed ({seed}): "
                             "give each its own `seed` (a seed ensemble) or keep one")
    span = max(own.values()) - min(own.values()) + 1 if own else 1
    out = {}
    for name, spec in specs.items():
        seed = own[name] + span * run_seed
        out[name] = (seed, model_dir_of(spec.model_dir, seed, own[name]))
    return out


def seed_overlay(stage1: dict, recipe: str, seed: int, dirpath: Path) -> dict[str, Any]:
    """A config stacked on a stage-1 recipe: `seed`, its ModelCheckpoint writing to `dirpath` (wherever
    the recipe lists it: the whole callback list is given, since a later file replaces lists), and
    for a seed other than the recipe's own, its logger writing beside that folder."""
    trainer = stage1.get("trainer") or {}
    callbacks = copy.deepcopy(trainer.get("callbacks") or [])
    checkpoints = [c for c in callbacks if isinstance(c, dict) and str(c.get("class_path", "")).endswith("ModelCheckpoint")]
    if len(checkpoints) != 1:
        raise SystemExit(f"{recipe}: trainer.callbacks must name one ModelCheckpoint (found {len(checkpoints)}); "
                         "the seeds write their checkpoints through it")
    checkpoints[0].setdefault("init_args", {})["dirpath"] = str(dirpath)
    overlay: dict[str, Any] = {"seed_everything": seed, "trainer": {"callbacks": callbacks}}
    logger = copy.deepcopy(trainer.get("logger"))
    if seed != recipe_seed(stage1) and isinstance(logger, dict) and "save_dir" in (logger.get("init_args") or {}):
        logger["init_args"]["save_dir"] = str(dirpath.parent)
        overlay["trainer"]["logger"] = logger
    return overlay


def quick_recipe(work: Path) -> str:
    """``--quick`` (also ``ranker_memory.py --quick``): in `work`, a pipeline recipe ``quick.yaml`` on synthetic
    sessions (`QUICK_SOURCE`) with one tiny XLNet (d_model 16, one layer), co-visitation and a 10-round GBDT, and
    that XLNet's model directory ``runs/quick_stage1/model`` written untrained (its stage-1 recipe beside it, in
    ``recipes/``), so nothing is trained and the rest runs as on a real dataset. Paths are relative to `work`."""
    from sessrec.data import SyntheticSource
    from sessrec.models import XLNetEncoder
    from sessrec.tasks import NextItemTask, SessionDataModule

    encoder = {"class_path": "sessrec.models.XLNetEncoder", "init_args": {"d_model": 16, "n_head": 2, "n_layer": 1}}
    data = {"source": {"class_path": "sessrec.data.SyntheticSource", "init_args": QUICK_SOURCE}, "max_length": 8}
    (work / "recipes").mkdir(parents=True, exist_ok=True)
    (work / "recipes" / "quick_stage1.yaml").write_text(yaml.safe_dump({
        "seed_everything": 0, "trainer": {"max_epochs": 1, "logger": False, "callbacks": [
            {"class_path": "pytorch_lightning.callbacks.ModelCheckpoint",
             "init_args": {"dirpath": "runs/quick_stage1/checkpoints", "monitor": "val/mrr@20", "filename": "best"}}]},
        "model": {"encoder": encoder}, "data": data}))
    dm = SessionDataModule(source=SyntheticSource(**QUICK_SOURCE), max_length=8)
    torch.manual_seed(0)
    task = NextItemTask(num_items=dm.num_items, max_length=8, encoder=XLNetEncoder(d_model=16, n_head=2, n_layer=1))
    task.vocab = dm.vocab
    task.recommender().save_pretrained(work / "runs" / "quick_stage1" / "model")
    pipeline = {"data": data, "models": {"xlnet": {"model_dir": "runs/quick_stage1/model", "k": 20}},
                "covisitation": {}, "covisitation_k": 20, "max_candidates": 30, "output": "runs/quick_pipeline",
                "scorer": {"class_path": "sessrec.pipeline.scoring.GBDTScorer", "init_args": QUICK_GBDT}}
    (work / "quick.yaml").write_text(yaml.safe_dump({"pipeline": pipeline}))
    return "quick.yaml"


def quick_folder(name: str) -> Path:
    """A temporary folder for a ``--quick`` run, removed when the process ends."""
    import atexit
    import shutil

    work = Path(tempfile.mkdtemp(prefix=f"{name}_quick_"))
    atexit.register(shutil.rmtree, work, True)
    return work


def train_models(recipe: PipelineRecipe, seeds: list[int], retrain: bool, extra: list[str]) -> dict[tuple[str, int], float]:
    """``sessrec fit`` each stage-1 model of each run seed whose model directory is missing (or all with
    `retrain`); its checkpoints go to ``checkpoints`` beside the model directory, which ``sessrec fit``
    writes there. Seconds per (model, run seed) trained."""
    took = {}
    for run_seed in seeds:
        for name, (seed, model_dir) in model_seeds(recipe.models, run_seed).items():
            if model_dir.exists() and not retrain:
                continue
            stage1_path = stage1_recipe(recipe.models[name].model_dir)
            stage1 = yaml.safe_load(stage1_path.read_text()) or {}
            checkpoints = model_dir.parent / "checkpoints"
            checkpoints.mkdir(parents=True, exist_ok=True)
            overlay = model_dir.parent / f"seed{seed}.yaml"
            overlay.write_text(yaml.safe_dump(seed_overlay(stage1, str(stage1_path), seed, checkpoints)))
            command = [sys.executable, "-m", "sessrec.cli", "fit", "--config", str(stage1_path), "--config", str(overlay), *extra]
            log(f"training {name} (seed {seed}): {shlex.join(command)}")
            start = time.perf_counter()
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
            took[(name, run_seed)] = time.perf_counter() - start
            if not model_dir.exists():
                raise SystemExit(f"{stage1_path} (seed {seed}) wrote no {model_dir}: sessrec fit writes the model "
                                 "directory beside its checkpoints folder")
    return took


def seeded(scorer: Scorer, seed: int) -> Scorer:
    """A fresh, unfitted copy of `scorer` with `seed` (when it takes one); a blend's members with
    their own seeds shifted by ``len(members) * seed``."""
    if isinstance(scorer, BlendScorer):
        n = len(scorer.scorers)
        members = []
        for member in scorer.scorers:
            config = config_of(member)["init_args"]
            members.append(type(member)(**{**config, **({"seed": config["seed"] + n * seed} if "seed" in config else {})}))
        return BlendScorer(members, scorer.weights, scorer.shortlist)
    config = config_of(scorer)["init_args"]
    return type(scorer)(**{**config, **({"seed": seed} if "seed" in config else {})})


def member_name(scorer: Scorer, taken: set[str]) -> str:
    """``gbdt``/``dlrm`` for the first member of each class, ``<class>-<j>`` for the next ones."""
    base = {GBDTScorer: "gbdt", DLRMScorer: "dlrm"}.get(type(scorer), type(scorer).__name__.lower())
    name, j = base, 1
    while name in taken:
        name, j = f"{base}-{j}", j + 1
    return name


def peak_rss_mb(who: int) -> float:
    """Peak resident memory (MiB) of this process (RUSAGE_SELF) or of its largest waited-for child (RUSAGE_CHILDREN)."""
    peak = resource.getrusage(who).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB on Linux


def summary(records: list[dict], system: str, varied: list[str]) -> dict:
    """Mean and sample standard deviation (``<key>_std``; 0 for one line) of every number of `records`."""
    out: dict[str, Any] = {"system": system, "dataset": records[0]["dataset"]}
    if "scorer" in records[0]:
        out["scorer"] = records[0]["scorer"]
    for key, value in records[0].items():
        if key in SEED_KEYS or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        values = [float(r[key]) for r in records if key in r]
        out[key] = statistics.fmean(values)
        out[f"{key}_std"] = statistics.stdev(values) if len(values) > 1 else 0.0
    out["seeds"] = len(records)
    for key in SEED_KEYS:
        if any(key in r for r in records):
            out[f"{key}s"] = [r[key] for r in records if key in r]
    out["varied"] = varied
    return out


# ---------------------------------------------------------------------------------------- scoring
@torch.no_grad()
def single(pipe: Pipeline, name: str, items: torch.Tensor, targets: torch.Tensor, batch: int) -> dict[str, float]:
    """A retriever alone: its own top-(max(KS) + 1) over the full catalogue is its ranking (ties against the target)."""
    retriever = pipe.stage_retrievers[name]
    totals: dict[str, float] = {}
    for lo in range(0, len(items), batch):
        top = retriever.retrieve(RequestSessions(items[lo : lo + batch].long()).to(pipe.device), max(KS) + 1)
        target = targets[lo : lo + batch].to(pipe.device)
        for key, value in list_metrics(top.items, top.scores, target, KS).items():
            totals[key] = totals.get(key, 0.0) + value
    return {k: v / len(items) for k, v in totals.items()}


def scored(pipe: Pipeline, data, scorer, test) -> dict:
    """Fit `scorer` on the ranker rows `data`, evaluate on the prepared test rows."""
    start = time.perf_counter()
    info = fit_on(pipe, data, scorer)
    metrics = evaluate_rows(pipe, test, KS)
    return {**metrics, "seconds": time.perf_counter() - start, "ranker_pairs": info["pairs"],
            "ranker_coverage": info["coverage"]}


def blended(pipe: Pipeline, data, blend: BlendScorer, test, reweighted: Sequence[list[float]] = (),
            shortlists: Sequence[int] = ()) -> dict[str, dict]:
    """Each member of `blend` fitted and evaluated alone (by `member_name`), then ``blend``: the
    members as fitted, blended; its ``seconds`` the members' fits and its own scoring. Each weight
    list of `reweighted` adds ``blend[w1,w2,...]``: the same fitted members with those weights; each
    of `shortlists` ``blend[shortlist N]``: the same blend with its later members on the first one's N best."""
    results: dict[str, dict] = {}
    for member in blend.scorers:
        results[member_name(member, set(results))] = scored(pipe, data, member, test)
    fitted = sum(r["seconds"] for r in results.values())
    first = next(iter(results.values()))
    variants = [("blend", blend.weights, blend.shortlist),
                *((f"blend[{','.join(f'{w:g}' for w in ws)}]", ws, blend.shortlist) for ws in reweighted),
                *((f"blend[shortlist {n}]", blend.weights, n) for n in shortlists)]
    for name, weights, shortlist in variants:
        start = time.perf_counter()
        pipe.scorer = BlendScorer(blend.scorers, weights, shortlist)
        metrics = evaluate_rows(pipe, test, KS)
        results[name] = {**metrics, "seconds": fitted + time.perf_counter() - start, "ranker_pairs": first["ranker_pairs"],
                         "ranker_coverage": first["ranker_coverage"]}
    pipe.scorer = blend
    return results


def weight_lists(texts: list[str], scorer: Scorer, parser: argparse.ArgumentParser) -> list[list[float]]:
    """``--blend-weights``: each text a comma-separated weight per member of the recipe's blend."""
    if texts and not isinstance(scorer, BlendScorer):
        parser.error(f"--blend-weights reweights a BlendScorer's members; the recipe's scorer is {type(scorer).__name__}")
    out = []
    for text in texts:
        try:
            weights = [float(w) for w in text.split(",")]
        except ValueError:
            parser.error(f"--blend-weights {text!r}: give numbers separated by commas, e.g. 1,1,0")
        try:
            BlendScorer(scorer.scorers, weights)
        except ValueError as err:
            parser.error(f"--blend-weights {text!r}: {err}")
        out.append(weights)
    return out


def ablated_groups(groups: list[str], data: RankerData) -> list[str]:
    """The feature groups an ablation removes: each with a column on this data (time needs event times,
    which the SR-GNN files lack), except the ids, which the DLRM's embedding tables need. The target
    encodings are computed from the labels, so they exist on every dataset."""
    present = {group_of(name) for name in data.raw} | {"encodings"}
    skipped = [g for g in groups if g != "ids" and g not in present]
    if skipped:
        log(f"features: no ablation of {skipped}, which have no column on this data")
    return [g for g in groups if g != "ids" and g in present]


def ablations(pipe: Pipeline, which: set[str], make, data, test_rows, valid, test, batch: int, record: dict) -> None:
    """Each retriever and/or feature group removed, ranked by a fresh scorer from `make()`."""
    full_features = pipe.features
    if "retrievers" in which:
        for name in list(pipe.retrievers):
            start = time.perf_counter()
            rest = {n: r for n, r in pipe.retrievers.items() if n != name}
            covisitation = any(hasattr(r, "anchored_weights") for r, _ in rest.values())  # its group needs one
            groups = [g for g in full_features.groups if covisitation or g != "covisitation"]
            smaller = Pipeline(pipe.vocab, rest, pipe.max_length, pipe.max_candidates, pipe.history_length, pipe.filters[1:],
                               CandidateFeatures(groups=groups), None, pipe.ordering, pipe.device)
            smaller.features.popularity = full_features.popularity
            part = candidate_rows(smaller, valid, batch)
            metrics = scored(smaller, part, make(), candidate_rows(smaller, test, batch))
            emit({"system": f"pipeline-without-retriever-{name}", **record, **metrics, "seconds": time.perf_counter() - start})
    if "features" in which:
        for group in ablated_groups(full_features.groups, data):
            pipe.features = CandidateFeatures(groups=[g for g in full_features.groups if g != group])
            pipe.features.popularity = full_features.popularity
            emit({"system": f"pipeline-without-features-{group}", **record, **scored(pipe, data, make(), test_rows)})
        pipe.features = full_features


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", choices=sorted(RECIPES), help="the dataset (its recipes/pipeline_<dataset>.yaml)")
    parser.add_argument("--recipe", help="a pipeline recipe other than the dataset's (the lines name its file when no --dataset)")
    parser.add_argument("--retrain", action="store_true", help="train the stage-1 models even if their model directories exist")
    parser.add_argument("--seeds", type=int, default=1, help="runs, with stage-1 and ranker seeds 0..N-1 (default 1)")
    parser.add_argument("--stage1-seeds", type=int, nargs="+", default=None,
                        help="stage-1 seeds: one for every run (only the ranker seed varies) or one per run")
    parser.add_argument("--stage1-args", default="", help="extra flags of every stage-1 `sessrec fit` (one quoted string)")
    parser.add_argument("--device", help="where the pipeline runs (default: the recipe's, else its session model's)")
    parser.add_argument("--ablations", nargs="*", choices=["retrievers", "features"], default=None,
                        help="also each retriever and/or each feature group removed (no value: both), on the first run")
    parser.add_argument("--ablation-scorer", choices=["gbdt", "dlrm"], default="gbdt")
    parser.add_argument("--recall-ks", default="50,100,200,500")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--blend-weights", nargs="+", default=[], metavar="W1,W2,...",
                        help="also the recipe's blend with these member weights, its members fitted once (one list each)")
    parser.add_argument("--shortlists", type=int, nargs="+", default=[], metavar="N",
                        help="also the recipe's blend with its later members on the first member's N best candidates "
                             "(BlendScorer shortlist), its members fitted once (one line each)")
    parser.add_argument("--quick", action="store_true",
                        help="seconds, for CI: synthetic sessions, an untrained tiny XLNet (quick_recipe), recall@10/20, "
                             "1 thread, all in a temporary folder")
    args = parser.parse_args()
    if args.quick:
        if args.dataset or args.recipe:
            parser.error("--quick brings its own synthetic recipe: no --dataset or --recipe")
        work = quick_folder("pipeline_eval")
        args.recipe = str(work / quick_recipe(work))
        args.recall_ks, args.threads = "10,20", 1
        os.chdir(work)  # the recipe's runs/ and recipes/ paths are relative to it
    if not (args.dataset or args.recipe):
        parser.error("give --dataset (or --recipe)")
    torch.set_num_threads(args.threads)
    wall = time.perf_counter()
    dataset = args.dataset or Path(args.recipe).stem

    path = args.recipe or RECIPES[args.dataset]
    if not Path(path).is_file():
        parser.error(f"{path}: no such pipeline recipe")
    recipe = load_recipe(path, ["--pipeline.device", args.device] if args.device else [])
    reweighted = weight_lists(args.blend_weights, recipe.scorer, parser)  # refused before any training
    if args.shortlists and not isinstance(recipe.scorer, BlendScorer):
        parser.error(f"--shortlists is a setting of a BlendScorer; the recipe's scorer is {type(recipe.scorer).__name__}")
    for n in args.shortlists:
        if n < 1:
            parser.error(f"--shortlists: each N must be 1 or more, got {n}")
    runs = seed_plan(args.seeds, args.stage1_seeds)
    varied = [name for name, i in (("stage1", 0), ("ranker", 1)) if len({run[i] for run in runs}) > 1]
    stage1_seeds = sorted({s for s, _ in runs})
    trained = train_models(recipe, stage1_seeds, args.retrain, shlex.split(args.stage1_args))
    specs = dict(recipe.models)
    first = model_seeds(specs, stage1_seeds[0])  # the sessions are read from model directories trained above
    recipe.models = {n: dataclasses.replace(s, model_dir=str(first[n][1]), seed=first[n][0]) for n, s in specs.items()}
    dm, batch = recipe.data, recipe.batch_size
    test = dm.pairs("test")
    valid = recipe.ranker_data()
    ks = [int(k) for k in args.recall_ks.split(",")]
    which = set() if args.ablations is None else set(args.ablations or ["retrievers", "features"])
    if "retrievers" in which and recipe.refit_retrievers:
        parser.error(f"{path}: --ablations retrievers builds the ranker's rows again, from retrievers that "
                     "refit_retrievers has fitted on the validation sessions; use --ablations features")
    make_ablation = GBDTScorer if args.ablation_scorer == "gbdt" else DLRMScorer
    scorers = {"gbdt": GBDTScorer(), "dlrm": DLRMScorer()}  # both compared, the recipe's with its settings
    final = next((name for name, s in scorers.items() if type(s) is type(recipe.scorer)), type(recipe.scorer).__name__.lower())
    scorers[final] = recipe.scorer
    if isinstance(recipe.scorer, BlendScorer):  # its members are the single rankers compared
        final, scorers = "blend", {}
    lines: dict[str, list[dict]] = {}

    def record(line: dict, show: bool = True) -> None:
        lines.setdefault(line["system"], []).append(line)
        if show:
            emit(line)

    for stage1_seed in stage1_seeds:
        stage1 = model_seeds(specs, stage1_seed)
        recipe.models = {n: dataclasses.replace(s, model_dir=str(stage1[n][1]), seed=stage1[n][0]) for n, s in specs.items()}
        start = time.perf_counter()
        pipe = recipe.build()
        build_seconds = time.perf_counter() - start
        log(f"{dataset} (stage-1 seed {stage1_seed}): {len(valid)} validation pairs (ranker), {len(test)} test pairs; "
            f"built on {pipe.device} in {build_seconds:.0f} s")
        start = time.perf_counter()
        data = candidate_rows(pipe, valid, batch)
        candidates_seconds = time.perf_counter() - start
        log(f"ranker rows: {tuple(data.valid.shape)}, coverage {data.coverage:.4f}, {candidates_seconds:.0f} s")
        if recipe.refit_retrievers:  # as `sessrec fit` saves it: the ranker's rows first, then the fresher index
            start = time.perf_counter()
            recipe.refit(pipe)
            log(f"kNN and co-visitation fitted again on the training and validation sessions in {time.perf_counter() - start:.0f} s")
        names = [n for n in pipe.retrievers if n in specs or stage1_seed == stage1_seeds[0]]  # seed-free ones once
        view = copy.copy(pipe)
        view.retrievers = {n: pipe.retrievers[n] for n in names}
        ceilings = retrieval_recall(view, test.items, test.targets, ks, batch_size=256)
        for name in names:
            start = time.perf_counter()
            metrics = single(pipe, name, test.items, test.targets, batch)
            extra = {"train_seconds": trained[(name, stage1_seed)]} if (name, stage1_seed) in trained else {}
            seeds = {"stage1_seed": stage1[name][0]} if name in specs else {}
            record({"system": name, "dataset": dataset, **metrics, **{f"retrieval_{k}": v for k, v in ceilings[name].items()},
                    "seconds": time.perf_counter() - start, **extra, **seeds})

        start = time.perf_counter()
        test_rows = candidate_rows(pipe, test, batch)
        test_seconds = time.perf_counter() - start
        log(f"test rows: {tuple(test_rows.valid.shape)}, coverage {test_rows.coverage:.4f}, {test_seconds:.0f} s")

        for ranker_seed in [r for s, r in runs if s == stage1_seed]:
            seeds = {"stage1_seed": stage1_seed, "ranker_seed": ranker_seed}
            results = {}
            for name, base in scorers.items():
                results[name] = scored(pipe, data, seeded(base, ranker_seed), test_rows)
            if isinstance(recipe.scorer, BlendScorer):
                results.update(blended(pipe, data, seeded(recipe.scorer, ranker_seed), test_rows, reweighted, args.shortlists))
            for name, metrics in results.items():
                record({"system": f"pipeline-{name}", "dataset": dataset, **metrics, **seeds})
            if which and (stage1_seed, ranker_seed) == runs[0]:
                ablations(pipe, which, lambda seed=ranker_seed: seeded(make_ablation(), seed), data, test_rows, valid, test, batch,
                          {"dataset": dataset, "scorer": args.ablation_scorer, **seeds})
            record({"system": "pipeline", "dataset": dataset, "scorer": type(recipe.scorer).__name__, **results[final],
                    "candidates_seconds": candidates_seconds, "test_candidates_seconds": test_seconds,
                    "build_seconds": build_seconds, **seeds}, show=len(runs) > 1)  # one run: printed last, below
        device = str(pipe.device)
        del pipe, data, test_rows  # before the next stage-1 model's rows are built

    last = lines.pop("pipeline")
    end = {"stage1_seconds": sum(trained.values()), "stage1_trained": len(trained),
           "peak_rss_mb": peak_rss_mb(resource.RUSAGE_SELF), "peak_rss_children_mb": peak_rss_mb(resource.RUSAGE_CHILDREN),
           "device": device}
    if len(runs) == 1:
        emit({**last[0], **end, "wall_seconds": time.perf_counter() - wall})
        return
    for system, records in lines.items():
        if not system.startswith("pipeline-without-"):
            emit(summary(records, system, varied))
    emit({**summary(last, "pipeline", varied), **end, "wall_seconds": time.perf_counter() - wall})


if __name__ == "__main__":
    main()
