"""Recipes compose, and every combination the documentation names runs.

- Every data fragment goes with every model fragment: the pair parses, with the data fragment's
  source and the model fragment's network or baseline (`test_pair_parses`).
- Every combination that README.md, recipes/README.md or docs/*.md names (data + model fragments,
  a tuned baseline, a full recipe, or a ``<model>_<dataset>`` name) runs through the real CLI with
  ``--trainer.fast_dev_run true``: neural models ``fit`` (one training and one validation batch),
  baselines ``test`` (fitted, one test batch ranked) (`test_documented_fast_dev_run`). Each data and
  each model fragment is among them at least once.

Recipes name their data as ``../shared/data/...`` relative to the working directory. The tests
run in a scratch directory whose ``../shared`` points at the real one, so nothing is written
into the repository; a combination whose dataset is absent is skipped.
"""

import contextlib
import copy
import dataclasses
import io
import itertools
import os
import re
import shlex
from pathlib import Path

import pytest
import torch
import yaml

from sessrec.cli import cli as main

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
RECIPES = ROOT / "recipes"
DATA = {p.stem: p for p in sorted((RECIPES / "data").glob("*.yaml"))}
MODELS = {p.stem: p for p in sorted((RECIPES / "model").glob("*.yaml"))}
TUNED = {p.stem: p for p in sorted((RECIPES / "tuned").glob("*.yaml"))}
FULL = {p.stem: p for p in sorted(RECIPES.glob("*.yaml"))}
PIPELINES = [p for p in FULL.values() if p.stem.startswith("pipeline_")]
RETRAINING = [p for p in FULL.values() if p.stem.startswith("retrain_")]  # `sessrec retrain` configs (tests/test_lifecycle.py)
ENSEMBLES = [p for p in FULL.values() if "sessrec.tasks.EnsembleTask" in p.read_text()]  # of trained members (tests/test_ensemble.py)
DISTILLED = [p for p in FULL.values() if "distillation:" in p.read_text()]  # of trained teachers (tests/test_distillation.py)
DOCS = [ROOT / "README.md", RECIPES / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
VOCAB_KEYS = ("source", "min_item_count", "max_vocab_size")  # what decides the vocabulary


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


def is_baseline(path: Path) -> bool:
    return "sessrec.tasks.BaselineTask" in path.read_text()


def objective(model: str) -> str:
    return str(load(MODELS[model])["model"].get("objective"))


# -- what the documentation names ------------------------------------------------------------------

FULL_SOFTMAX_DATA = {"rsc15", "trivago"}  # the causal models' loss there (recipes/README.md, "Models")
CAUSAL = {m for m in MODELS if not is_baseline(MODELS[m]) and "CausalLanguageModeling" in objective(m)}
REAL = [d for d in DATA if "../shared/data/" in DATA[d].read_text()]
VARIANTS = {m for m in MODELS if any(m.startswith(f"{base}_") for base in MODELS)}  # xlnet_mlm_sampled
NAMED_RUNS = {  # runs the documentation names that are a full recipe plus flags (recipes/xlnet_mlm_trivago.yaml)
    "xlnet_mlm_trivago_virtual": "--config recipes/xlnet_mlm_trivago.yaml --data.source.init_args.virtual_items true",
}
FRAGMENT = re.compile(r"(?:recipes/)?(data|model|tuned)/(\w+)\.yaml")
FLAG = re.compile(r"--((?:model|data)\.[\w.]+)[ =]([^\s`|\\]+)")


def composed(data: str, model: str, *flags: str) -> tuple[str, ...]:
    """The arguments of a data + model pair: its tuned baseline values, and the loss of its dataset."""
    args = ["--config", f"recipes/data/{data}.yaml", "--config", f"recipes/model/{model}.yaml"]
    if f"{model}_{data}" in TUNED:
        args += ["--config", f"recipes/tuned/{model}_{data}.yaml"]
    if data in FULL_SOFTMAX_DATA and model in CAUSAL and "--model.loss" not in flags:
        args += ["--model.loss", "FullSoftmax"]
    return tuple(args) + flags


def named(stem: str) -> tuple[str, ...] | None:
    """The arguments a recipe name in the documentation stands for (None: not a recipe)."""
    if stem in FULL:
        return ("--config", f"recipes/{stem}.yaml")
    if stem in NAMED_RUNS:
        return tuple(shlex.split(NAMED_RUNS[stem]))
    if stem in TUNED:
        model, _, data = stem.partition("_")
        return composed(data, model)
    for model, data in itertools.product(MODELS, DATA):
        if stem == f"{model}_{data}":
            return composed(data, model)
        base, _, variant = model.rpartition("_")  # xlnet_mlm_sampled: `xlnet_mlm_<dataset>_sampled`
        if base and stem == f"{base}_{data}_{variant}":
            return composed(data, model)
    return None


def braces(text: str) -> list[str]:
    """``{a,b}_{x,y}.yaml`` spelled out."""
    match = re.search(r"\{([^{}]*)\}", text)
    if not match:
        return [text]
    return [out for part in match.group(1).split(",") for out in braces(text[: match.start()] + part + text[match.end():])]


def documented() -> dict[tuple[str, ...], str]:
    """Every combination the documentation names: its CLI arguments -> where it is named."""
    found: dict[tuple[str, ...], str] = {}
    for doc in DOCS:
        # a brace list broken over two lines is one list
        text = re.sub(r"\{([^{}]*)\}", lambda m: "{" + re.sub(r"\s+", "", m.group(1)) + "}", doc.read_text())
        for number, line in enumerate(text.splitlines(), 1):
            where = f"{doc.relative_to(ROOT)}:{number}"
            # data + model (+ tuned) fragments, with the model/data flags that follow them on the line
            refs = list(FRAGMENT.finditer(line))
            starts = [i for i, r in enumerate(refs) if r.group(1) == "data"]
            for k, i in enumerate(starts):
                group = refs[i: starts[k + 1] if k + 1 < len(starts) else len(refs)]
                models = [r.group(2) for r in group if r.group(1) == "model"]
                if not models:
                    continue
                end = refs[starts[k + 1]].start() if k + 1 < len(starts) else len(line)
                flags = [f for m in FLAG.finditer(line[group[-1].end(): end])
                         if not m.group(1).endswith("path") and "/" not in m.group(2) for f in (f"--{m.group(1)}", m.group(2))]
                args = composed(group[0].group(2), models[0], *flags)
                found.setdefault(args, where)
            for r in refs:
                if r.group(1) == "tuned":
                    found.setdefault(named(r.group(2)), where)
            # a full recipe with the model/data flags that follow it on the line
            for m in re.finditer(r"--config recipes/(\w+)\.yaml((?:\s+--(?:model|data)\.[\w.]+[ =][^\s`|\\]+)+)", line):
                if m.group(1) in FULL:
                    found.setdefault(("--config", f"recipes/{m.group(1)}.yaml", *m.group(2).split()), where)
            # recipe names: `name.yaml`, `{a,b}_{c,d}.yaml`, a backticked bare `name`
            rest = FRAGMENT.sub(" ", line)
            for token in re.findall(r"[\w{},]+\.yaml", rest) + re.findall(r"`(\w+)`", rest):
                for stem in braces(token.removesuffix(".yaml")):
                    args = named(stem)
                    if args is not None:
                        found.setdefault(args, where)
        # tables by recipe prefix: `<prefix>dataset.yaml` in a section, a column of `model_` prefixes
        for section in re.split(r"\n#+ ", text):
            datasets = re.findall(r"<prefix>(\w+)\.yaml", section)
            prefixes = [p for p in re.findall(r"`(\w+)_`", section) if p in MODELS]
            for data, model in itertools.product(datasets, prefixes):
                found.setdefault(named(f"{model}_{data}"), f"{doc.relative_to(ROOT)}: {model}_ x {data}")
    found.pop(None, None)
    return found


def runnable(args: tuple[str, ...]) -> bool:
    configs = [ROOT / args[i + 1] for i, a in enumerate(args) if a == "--config"]
    return not any(p in PIPELINES or p in RETRAINING or p in ENSEMBLES or p in DISTILLED for p in configs)


def cases() -> dict[tuple[str, ...], str]:
    """The documented combinations: those the documentation spells out, and every model of the zoo on
    every real dataset (docs/results.md tables them model by dataset); then each data and each model
    fragment that none of them uses."""
    out = {args: where for args, where in documented().items() if runnable(args)}
    for model, data in itertools.product(MODELS, REAL):
        if model not in VARIANTS:
            out.setdefault(named(f"{model}_{data}"), "docs/results.md: the model-by-dataset tables")
    used = " ".join(" ".join(a) for a in out)
    for model in MODELS:
        if f"model/{model}.yaml" not in used:
            out[composed("synthetic", model)] = "each model fragment"
    for data in DATA:
        if f"data/{data}.yaml" not in used:
            out[composed(data, "xlnet_mlm")] = "each data fragment"
    return dict(sorted(out.items()))


CASES = cases()


def case_id(args: tuple[str, ...]) -> str:
    return "+".join(Path(a).stem for a in args if a.endswith(".yaml")) + "".join(
        f"[{a.rpartition('.')[2]}={b}]" for a, b in itertools.pairwise(args) if a.startswith("--") and a != "--config")


def paths(args: tuple[str, ...]) -> list[Path]:
    return [ROOT / args[i + 1] for i, a in enumerate(args) if a == "--config"]


# -- the layout ------------------------------------------------------------------------------------


def test_fragments_and_full_recipes():
    assert {"amazon_beauty", "diginetica", "nowplaying", "rsc15", "synthetic", "tmall", "trivago", "yoochoose164"} <= set(DATA)
    neural = {"xlnet_mlm", "xlnet_mlm_sampled", "xlnet_plm", "bert_mlm", "electra_rtd", "gpt2_clm", "sasrec", "gru4rec"}
    assert neural | {"popularity", "vsknn", "stan"} <= set(MODELS)
    assert {"quickstart", "xlnet_mlm_diginetica", "xlnet_mlm_rsc15", "xlnet_mlm_trivago_reversal", "dlrm_trivago",
            "dlrm_trivago_daily", "xlnet_mlm_rsc15_daily"} <= set(FULL)
    for path in DATA.values():  # a data fragment: data, trainer and schedule, no network
        block = load(path)
        assert {"data", "trainer", "model"} <= set(block), path.name
        assert not {"encoder", "objective", "loss", "class_path", "init_args"} & set(block["model"]), path.name
        assert block["trainer"]["callbacks"][-1]["class_path"].endswith("ModelCheckpoint"), path.name
        assert "dirpath" not in block["trainer"]["callbacks"][-1]["init_args"], path.name  # one folder per run
    for name, path in MODELS.items():  # a model fragment: the network or a baseline, no data
        block = load(path)
        assert "data" not in block and set(block) <= {"model", "trainer"}, name
        assert ("encoder" in block["model"]) != is_baseline(path), name
    for name, path in TUNED.items():  # a tuned overlay: one baseline's values for one dataset
        model, _, data = name.partition("_")
        assert model in MODELS and data in DATA and is_baseline(MODELS[model]), name
        assert set(load(path)) == {"model"} and set(load(path)["model"]["init_args"]) == {"baseline"}, name


def test_a_recipe_with_a_time_cap_anneals_within_it():
    """A recipe that the trainer's `max_time` can stop decays its learning rate over a time budget that
    ends before the cap (so a run stopped by the cap has annealed); a recipe without a cap follows its steps."""
    capped = 0
    for path in [*DATA.values(), *FULL.values()]:
        recipe = load(path)
        model = recipe.get("model") or {}
        if "DLRMTask" in str(model.get("class_path")):  # DLRMTask has a learning rate, no schedule
            continue
        settings = model.get("init_args", model)
        assert not {"lr", "warmup_steps", "scheduler", "schedule_seconds", "ks"} & set(settings), path.name
        cap = (recipe.get("trainer") or {}).get("max_time")
        seconds = (settings.get("schedule") or {}).get("seconds")
        if cap is None:
            assert seconds is None, f"{path.name}: a time budget without a time cap"
            continue
        days, hours, minutes, secs = (int(part) for part in str(cap).split(":"))
        limit = ((days * 24 + hours) * 60 + minutes) * 60 + secs
        assert seconds is not None and 0 < seconds <= limit - 120, f"{path.name}: schedule.seconds {seconds} for a cap of {limit} s"
        capped += 1
    assert capped >= 8  # the SR-GNN, GCE-GNN, rsc15 and Amazon fragments and the pipelines' stage-1 recipes


def test_recipes_readme_lists_every_fragment_and_full_recipe():
    text = (RECIPES / "README.md").read_text()
    listed = {f"{kind}/{name}" for kind, name in FRAGMENT.findall(text)}
    listed |= {f"tuned/{s}" for t in re.findall(r"`([\w{},]+)\.yaml`", text) for s in braces(t)}
    assert {f"data/{d}" for d in DATA} <= listed
    assert {f"model/{m}" for m in MODELS} <= listed
    assert {f"tuned/{t}" for t in TUNED} <= listed
    spelled = {s for t in re.findall(r"`([\w{},]+)\.yaml`", text) for s in braces(t)}
    assert set(FULL) <= spelled, set(FULL) - spelled


def test_documented_recipe_paths_resolve():
    """Every `recipes/...yaml` path in the documentation is a file, or the name of a run (`<model>_<dataset>`)
    that data and model fragments make."""
    missing = []
    for doc in DOCS:
        for rel in re.findall(r"recipes/[\w/]+\.yaml", doc.read_text()):
            if not (ROOT / rel).exists() and not (rel.count("/") == 1 and named(Path(rel).stem)):
                missing.append(f"{doc.name}: {rel}")
    assert not missing


# -- every data x model pair parses ----------------------------------------------------------------


def printed(args: list[str]) -> dict:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), pytest.raises(SystemExit) as done:
        main(args)
    assert done.value.code in (0, None)
    return yaml.safe_load(buf.getvalue())


def holds(actual, expected) -> bool:
    """`actual` has every key of `expected` with the same value (numbers compared as numbers)."""
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(k in actual and holds(actual[k], v) for k, v in expected.items())
    return actual == expected


def unless_overridden(block: dict, args: tuple[str, ...]) -> dict:
    """A data fragment's `model` block without the values that the command's `--model.a.b value` flags replace."""
    out = copy.deepcopy(block)
    for flag in (a for a in args if a.startswith("--model.")):
        *parents, key = [k for k in flag.removeprefix("--model.").split(".") if k != "init_args"]
        node = out
        for k in parents:
            node = node.get(k) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(key, None)
    return out


def flag_value(cfg: dict, flag: str) -> object:
    """The value at a `--model.a.b` / `--data.a.b` flag's path in the merged config (through `init_args` levels)."""
    node = cfg
    for k in flag.removeprefix("--").split("."):
        if isinstance(node, dict) and k not in node and "init_args" in node:
            node = node["init_args"]
        node = node[k]
    return node


def check_config(cfg: dict, args: tuple[str, ...]) -> None:
    """The merged config holds what each stacked file says, and the flags after them."""
    files = paths(args)
    data = next((p for p in files if p.parent.name == "data"), None)
    model = next((p for p in files if p.parent.name == "model"), None)
    if data is not None:
        source = load(data)["data"]["source"]
        assert cfg["data"]["init_args"]["source"]["class_path"] == source["class_path"]
        assert holds(cfg["data"]["init_args"]["source"]["init_args"], source["init_args"])
        assert cfg["trainer"]["max_epochs"] == (None if model and is_baseline(model) else load(data)["trainer"]["max_epochs"])
    if model is not None:
        block = load(model)["model"]
        if is_baseline(model):
            assert cfg["model"]["class_path"] == "sessrec.tasks.BaselineTask"
            assert cfg["model"]["init_args"]["baseline"]["class_path"] == block["init_args"]["baseline"]["class_path"]
            assert not {"optimization", "schedule"} & set(cfg["model"]["init_args"]) and cfg["trainer"]["callbacks"] is None
            if data is not None:  # the evaluation of the dataset is kept
                evaluation = cfg["model"]["init_args"]["evaluation"]
                assert holds(evaluation, load(data)["model"]["evaluation"])
                assert evaluation["exclude_seen"] == load(data)["model"]["evaluation"].get("exclude_seen", False)
        else:
            assert cfg["model"]["class_path"].endswith("NextItemTask")
            assert cfg["model"]["init_args"]["encoder"]["class_path"] == block["encoder"]["class_path"]
            assert holds(cfg["model"]["init_args"], unless_overridden(load(data)["model"], args) if data is not None else {})
    for flag, value in itertools.pairwise(args):  # the flags after the files, as given
        if flag.startswith(("--model.", "--data.")):
            actual, expected = flag_value(cfg, flag), yaml.safe_load(value)
            if isinstance(actual, dict) and "class_path" in actual:  # a class given by name, short or dotted
                actual, expected = actual["class_path"].rsplit(".", 1)[-1], str(expected).rsplit(".", 1)[-1]
            assert actual == expected, (flag, value)
    for tuned in (p for p in files if p.parent.name == "tuned"):
        values = load(tuned)["model"]["init_args"]["baseline"]["init_args"]
        assert holds(cfg["model"]["init_args"]["baseline"]["init_args"], values)


PAIRS = [composed(d, m) for d, m in itertools.product(DATA, MODELS)]
RUN_PAIRS = {tuple(p.stem for p in paths(args) if p.parent.name in ("data", "model")) for args in CASES}


@pytest.mark.slow
@pytest.mark.parametrize(
    "args", [a for a in PAIRS if tuple(p.stem for p in paths(a)[:2]) not in RUN_PAIRS], ids=case_id
)
def test_pair_parses(args, monkeypatch):
    """A pair that no documented run covers still parses into the config both fragments describe."""
    monkeypatch.chdir(ROOT)
    sub = "test" if is_baseline(paths(args)[1]) else "fit"
    check_config(printed([sub, *args, "--print_config"]), args)


def test_the_documentation_names_combinations():
    names = {case_id(a) for a in documented()}
    assert "diginetica+sasrec" in names  # README: train a model on a real dataset
    assert "rsc15+vsknn+vsknn_rsc15" in names  # a tuned baseline
    assert "rsc15+sasrec[loss=FullSoftmax]" in names  # a flag after the fragments
    assert "quickstart" in names and "xlnet_mlm_diginetica" in names


# -- every documented combination runs -------------------------------------------------------------


@pytest.fixture(scope="module")
def sources_read_once():
    """The combinations of one dataset read the same sessions: the first reads the files (every source's `load` runs
    once per dataset and process), the others take a copy of its splits (tables are immutable)."""
    from sessrec.data.sources import SessionSource
    from sessrec.saved.registry import class_path, config_of

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    read = {}

    def once(load):
        def memo(self):
            key = (class_path(self), repr(config_of(self)))
            if key not in read:
                read[key] = load(self)
            return dataclasses.replace(read[key])
        return memo

    with pytest.MonkeyPatch.context() as patch:
        for cls in {c for c in subclasses(SessionSource) if "load" in c.__dict__}:
            patch.setattr(cls, "load", once(cls.__dict__["load"]))
        yield


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    if SHARED.exists():
        (tmp_path / "shared").symlink_to(SHARED)
    (work / "tests").mkdir()
    (work / "tests" / "fixtures").symlink_to(ROOT / "tests" / "fixtures")  # data a fragment names by default (data/merlin.yaml)
    monkeypatch.chdir(work)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    return work


@pytest.mark.slow
@pytest.mark.parametrize("args", list(CASES), ids=case_id)
def test_documented_fast_dev_run(args, scratch, sources_read_once):
    files = paths(args)
    for path in files:
        for rel in re.findall(r"\.\./shared/data/[\w.\-/]+", path.read_text()):
            if not (scratch / rel).exists():
                pytest.skip(f"{rel} is not available here (named in {CASES[args]})")
    argv = [str(ROOT / a) if a.startswith("recipes/") else a for a in args]
    # one training and one validation batch, of a few sessions: each part runs once, at the recipe's widths
    small = [a for flag in ("--data.batch_size", "--data.eval_batch_size") if flag not in args for a in (flag, "16")]
    fast = [*argv, "--trainer.fast_dev_run", "true", "--trainer.enable_progress_bar", "false", *small]
    baseline = any(is_baseline(p) for p in files)
    sub = "test" if baseline else "fit"
    cli = main([sub, *fast])
    check_config(cli.config[sub].as_dict(), args)
    if "--model.loss" in args:
        assert type(cli.model.loss).__name__ == args[args.index("--model.loss") + 1].rsplit(".", 1)[-1]
    assert cli.trainer.state.finished
    if baseline:
        assert 0 <= cli.trainer.callback_metrics["test/recall@20"] <= 1
        return
    loss = cli.trainer.callback_metrics["train/loss"]
    assert torch.isfinite(loss) and loss > 0
    assert "val/recall@20" in cli.trainer.callback_metrics
    assert not any(Path(os.getcwd()).rglob("*.ckpt"))


# -- combinations refused in one line ---------------------------------------------------------------


def test_side_info_settings_on_data_without_side_features_are_refused(scratch, sessrec_main):
    """`model.side_info` says how side features are embedded; a data fragment that gives none (no
    `data.side_features`) trained the items alone with exit 0, the setting dropped."""
    args = composed("synthetic", "sasrec", "--model.side_info.feature_dim", "8", "--data.source.init_args.num_sessions",
                    "300", "--trainer.max_steps", "1", "--trainer.limit_val_batches", "1")
    message = sessrec_main("fit", *[str(ROOT / a) if a.startswith("recipes/") else a for a in args])
    assert message == ("sessrec fit: error: model.side_info (feature_dim 8) sets how side features are embedded, and "
                       "the data gives none: add them (--data.side_features.*) or drop model.side_info "
                       "(--traceback for details)")
    assert not (scratch / "runs").exists()


@pytest.mark.slow
def test_the_merlin_fragments_side_feature_flags_run_on_its_default_data(scratch):
    """recipes/data/merlin.yaml's header gives the flags that add side features; on the fragment's own data (T4R's
    sequence_testing) they named columns it does not have ('category-list'), refused at the first run."""
    header = " ".join(line.lstrip("# ") for line in DATA["merlin"].read_text().splitlines() if line.startswith("#"))
    found = re.findall(r"(--(?:data\.side_features|model\.side_info)\.\w+)\s+(?:'(\[[^\]]*\])'|(\d+))", header)
    flags = {flag: listed or number for flag, listed, number in found}
    assert set(flags) == {"--data.side_features.categorical", "--data.side_features.continuous",
                          "--data.side_features.normalized", "--model.side_info.feature_dim"}
    run = main(["fit", "--config", str(DATA["merlin"]), "--config", str(MODELS["xlnet_mlm"]), *itertools.chain(*flags.items()),
                "--trainer.fast_dev_run", "true", "--trainer.enable_progress_bar", "false"])
    side = run.datamodule.side_features
    assert side.categorical == yaml.safe_load(flags["--data.side_features.categorical"])
    assert side.normalized == side.continuous == yaml.safe_load(flags["--data.side_features.continuous"])
    assert run.model.model.side_info is not None and run.trainer.state.finished


# -- pipelines --------------------------------------------------------------------------------------


@pytest.mark.parametrize("recipe", PIPELINES, ids=lambda p: p.stem)
def test_pipeline_recipe_parses_and_shares_its_models_vocabulary(recipe, monkeypatch):
    """A pipeline recipe is typed-checked, each model is the model directory its stage-1 recipe's ``sessrec fit``
    writes (``runs/<recipe>/model``, beside the recipe's checkpoints; a model of another stage-1 seed where
    pipeline_eval.py writes it), and the pipeline has no data block of its own: its sessions are the data section
    of the first model directory, the stage-1 recipe's data block, and every other model's stage-1 recipe reads
    the same sessions with the same vocabulary (what the pipeline checks of their model directories).

    Running it needs the stage-1 model directories: tests/test_pipeline.py runs the same code on a tiny
    pipeline; benchmarks/pipeline_eval.py runs these recipes.
    """
    import dataclasses
    import re

    from sessrec.cli.parsers import load_recipe
    from sessrec.pipeline_training.recipe import BATCH_ONLY, ModelRetrieval

    monkeypatch.chdir(ROOT)
    spec = load(recipe)["pipeline"]
    parsed = load_recipe(recipe)
    assert parsed.models or parsed.baselines
    assert "data" not in spec and parsed._data is None  # read from the first model directory on first use
    first = None
    for name, model in spec.get("models", {}).items():
        assert set(model) <= {f.name for f in dataclasses.fields(ModelRetrieval)}, name
        assert model["runtime"] == "onnxruntime", name  # the query's graph, saved with the pipeline
        found = re.fullmatch(r"runs/(.+?)(_seed(\d+))?/model", model["model_dir"])
        assert found, (name, model["model_dir"])
        trained = load(ROOT / "recipes" / f"{found.group(1)}.yaml")
        first = trained["data"] if first is None else first
        assert {k: trained["data"].get(k) for k in VOCAB_KEYS} == {k: first.get(k) for k in VOCAB_KEYS}, name
        sessions = {k: v for k, v in trained["data"].items() if k not in BATCH_ONLY}
        assert sessions == {k: v for k, v in first.items() if k not in BATCH_ONLY}, name
        own = trained.get("seed_everything", 0)
        seed = model.get("seed", own)
        assert (found.group(3) is None) == (seed == own) and (found.group(3) is None or int(found.group(3)) == seed), name
        callbacks = trained["trainer"]["callbacks"]
        dirpath = next(c["init_args"]["dirpath"] for c in callbacks if c["class_path"].endswith("ModelCheckpoint"))
        assert dirpath == f"runs/{found.group(1)}/checkpoints", name  # sessrec fit writes the model directory beside it


SESSION_DATA = [p for p in [*DATA.values(), *FULL.values()]
                if isinstance(load(p).get("data"), dict) and "class_path" not in load(p)["data"]]


@pytest.mark.parametrize("recipe", SESSION_DATA, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_a_recipes_data_module_is_built_again_from_what_sessrec_fit_records(recipe):
    """The data module of each recipe's data block (of every source: synthetic, SR-GNN, event log, user
    sequences, Merlin, trivago), as ``sessrec fit`` records it in a model directory (its constructor's
    arguments, as JSON), is built again by the registry alone, and records the same arguments."""
    import json

    from jsonargparse import ArgumentParser

    from sessrec.saved.registry import config_of, instantiate
    from sessrec.tasks import SessionDataModule

    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(SessionDataModule, "data")
    dm = parser.instantiate(parser.parse_object({"data": load(recipe)["data"]})).data
    section = json.loads(json.dumps(config_of(dm)))
    built = instantiate(section, expected=SessionDataModule, source=str(recipe), key="data")
    assert type(built.source) is type(dm.source) and config_of(built) == section
