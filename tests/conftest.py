"""Shared test helpers: the real public datasets live outside the repo, in ../shared/data."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(autouse=True, scope="session")
def _no_command_line() -> Iterator[None]:
    """sys.argv without pytest's own arguments: a test or fixture that runs the CLI in-process gives it its
    arguments (``cli([...])``), and LightningCLI warns when it sees both those and a command line."""
    argv = sys.argv[:]
    del sys.argv[1:]
    yield
    sys.argv[:] = argv


@pytest.fixture(scope="session")
def shared_data() -> Callable[[str], Path]:
    """``shared_data("rsc15_100k")`` is that dataset's folder; the test is skipped when it is absent."""

    def folder(name: str) -> Path:
        path = SHARED_DATA / name
        if not path.is_dir():
            pytest.skip(f"dataset folder {path} is absent")
        return path

    return folder


@pytest.fixture
def sessrec_main(monkeypatch: pytest.MonkeyPatch) -> Callable[..., str]:
    """``sessrec_main(*args)`` runs the ``sessrec`` entry point and returns the one-line error it exits
    with ("" when it succeeds); a multi-line message or a traceback fails the test."""

    def run(*args: str) -> str:
        from sessrec.cli import main

        monkeypatch.setattr("sys.argv", ["sessrec", *args])
        try:
            main()
        except SystemExit as exit:
            message = str(exit.code)
            assert "\n" not in message and "Traceback" not in message
            return message
        return ""

    return run


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``gpu`` run only where CUDA is available; their CPU twins always run."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def pipeline_version_2() -> Callable[[Path, Path], Path]:
    """``pipeline_version_2(saved, target)`` writes the pipeline saved in `saved` (format version 3) to
    `target` in the layout of format version 2: each stage as ``kind`` (its class name), its settings
    (``config``, each stage's own layout) and one ``.safetensors`` file of arrays, the fitted feature
    ops in a version 1 ``features.npz``, the parts hashed."""
    return write_version_2


def write_version_2(saved: Path, target: Path) -> Path:
    import json
    import shutil

    from safetensors.numpy import load_file, save_file

    from sessrec.saved.directory import describe, write_description

    spec = json.loads((saved / "pipeline.json").read_text())
    target.mkdir(parents=True)
    shutil.copy(saved / "vocab.parquet", target / "vocab.parquet")
    old = {k: v for k, v in spec.items() if k not in ("parts", "retrievers", "filters", "features", "scorer", "ordering")}
    old["version"] = 2

    def stage(entry: dict, with_kind: bool = True) -> dict:
        name = entry["config"]["class_path"].rpartition(".")[2]
        args, state = entry["config"]["init_args"], entry["state"]
        arrays = load_file(str(saved / entry["arrays"]))
        config, arrays = _version_2_stage(name, args, state, arrays, target)
        save_file(arrays, str(target / entry["arrays"]))
        out = {"kind": name} if with_kind else {}
        return {**out, "config": config, "arrays": entry["arrays"]}

    old["retrievers"] = [{"name": r["name"], "k": r["k"], **stage(r)} for r in spec["retrievers"]]
    old["filters"] = [stage(f) for f in spec["filters"]]
    old["features"] = stage(spec["features"], with_kind=False)
    if "scorer" in spec:
        old["scorer"] = stage(spec["scorer"])
    old["ordering"] = stage(spec["ordering"], with_kind=False)
    parts = [p.name for p in target.iterdir()]
    write_description(target, "pipeline.json", describe(target, old, parts))
    return target


def _version_2_stage(name: str, args: dict, state: dict, arrays: dict, target: Path) -> tuple[dict, dict]:
    """A stage's version 2 settings and arrays, from its version 3 config, plain state and arrays."""
    import io
    import json

    import numpy as np

    if name == "SessionModelRetriever":
        index = args["index"]
        settings = {"type": index["class_path"].rpartition(".")[2], **index["init_args"]}
        return {"network": args["model"], "objective": args["objective"], "index": settings}, arrays
    if name == "BaselineRetriever":
        return {"baseline": args["baseline"], "num_items": state["num_items"], "chunk": args["chunk"]}, arrays
    if name == "CoVisitation":
        return {**args, "num_items": state["num_items"]}, arrays
    if name == "SeenItemsFilter":
        return dict(args), arrays
    if name == "ItemTableFilter":
        return {"mode": args["mode"], "path": args["path"], "num_unknown": state["num_unknown"]}, arrays
    if name == "CandidateFeatures":
        ops = {k[len("ops/ops/"):]: v for k, v in arrays.items() if k.startswith("ops/ops/")}
        if "ops" in state:
            configs = state["ops"]["config"]["init_args"]["ops"]
            spec = [{"name": op, "op": c["class_path"].rpartition(".")[2], "config": c["init_args"]} for op, c in configs.items()]
            header = json.dumps({"format": "sessrec.features", "version": 1, "ops": spec}, sort_keys=True)
            files = {"__pipeline__": np.frombuffer(header.encode(), np.uint8)}
            for i, op in enumerate(configs):
                files.update({f"{i}/{k[len(op) + 1:]}": v for k, v in ops.items() if k.startswith(f"{op}/")})
            buffer = io.BytesIO()
            np.savez(buffer, **files)
            (target / "features.npz").write_bytes(buffer.getvalue())
        kept = {k: v for k, v in arrays.items() if not k.startswith("ops/")}
        return {**args, "names": state["names"]}, kept
    if name == "DLRMScorer":
        return {"config": args, **state}, arrays
    if name == "GBDTScorer":
        params = {"objective": "lambdarank", "metric": "ndcg", "eval_at": [20], "num_leaves": args["num_leaves"],
                  "learning_rate": args["learning_rate"], "min_data_in_leaf": args["min_data_in_leaf"],
                  "feature_fraction": args["feature_fraction"], "bagging_fraction": 0.8, "bagging_freq": 1,
                  "lambdarank_truncation_level": 30, "num_threads": args["threads"], "seed": args["seed"],
                  "deterministic": True, "verbosity": -1}
        config = {"params": params, "best_round": state["best_round"], "max_rounds": args["max_rounds"],
                  "early_stopping": args["early_stopping"], "stop_fraction": args["stop_fraction"], "seed": args["seed"]}
        return config, arrays
    if name == "Ordering":
        boosts = [{"weight": b["init_args"]["weight"], "mode": b["init_args"]["mode"],
                   "num_unknown": state["boosts"][str(i)]["num_unknown"]} for i, b in enumerate(args["boosts"])]
        diversity = args["diversity"] and {"max_per_category": args["diversity"]["init_args"]["max_per_category"],
                                           "num_unknown": state["diversity"]["num_unknown"]}
        sampling = args["sampling"] and args["sampling"]["init_args"]
        renamed = {k.replace("/", "."): v for k, v in arrays.items()}
        return {"boosts": boosts, "diversity": diversity, "sampling": sampling}, renamed
    raise ValueError(f"no version 2 layout for a {name}")
