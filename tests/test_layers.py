"""The package's layers: saved -> data, features -> embeddings -> datasets -> models -> artifacts -> tasks
-> pipeline -> deploy -> cli, one way.

`features` sits beside `data` (feature ops encode with data's vocabulary; data's side information
is built from feature ops); `metrics` and `baselines` sit beside `models` (they read data only).
An import, at module level or inside a function, from a lower layer to a higher one fails the
test, and so does an import of a dataset adapter by a network (`sessrec.models` holds no
vocabulary); the model layers import without Lightning, and the serving path (a saved pipeline or
model directory loaded, served and exported) imports neither Lightning nor jsonargparse. The table is
printed in docs/architecture.md.
"""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "sessrec"
LAYER = {"saved": -1, "data": 0, "features": 0, "embeddings": 1, "datasets": 2, "models": 3, "metrics": 3, "baselines": 3,
         "artifacts": 4, "tasks": 5, "pipeline": 6, "deploy": 7, "cli": 8}


def imported_layers(path: Path) -> set[str]:
    """The sessrec sub-packages that `path` imports, anywhere in the file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
        names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
        found |= {n.split(".")[1] for n in names if n.startswith("sessrec.")}
    return found


def test_every_sub_package_has_a_layer():
    packages = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir() if not p.name.startswith("__")}
    assert packages == set(LAYER)


@pytest.mark.parametrize("layer", sorted(LAYER, key=LAYER.get))
def test_imports_run_one_way(layer):
    files = [PACKAGE / f"{layer}.py"] if (PACKAGE / f"{layer}.py").exists() else sorted((PACKAGE / layer).rglob("*.py"))
    upward = {
        f"{path.relative_to(PACKAGE)} imports sessrec.{other}"
        for path in files for other in imported_layers(path) if LAYER[other] > LAYER[layer]
    }
    assert not upward


def test_networks_import_no_dataset_adapter():
    found = {str(path.relative_to(PACKAGE)) for path in sorted((PACKAGE / "models").rglob("*.py"))
             if "datasets" in imported_layers(path)}
    assert not found


def test_the_checker_sees_an_upward_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from sessrec.tasks.next_item import NextItemTask\n")
    assert imported_layers(bad) == {"tasks"}


@pytest.mark.slow
def test_models_and_embeddings_import_without_lightning():
    code = (
        "import sys, sessrec, sessrec.data, sessrec.features, sessrec.embeddings, sessrec.datasets, sessrec.models\n"
        "import sessrec.metrics, sessrec.baselines\n"
        "sessrec.models.DLRM; sessrec.embeddings.SparseFeatures; sessrec.data.SRGNNSource; sessrec.data.SideFeatures\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pytorch_lightning', 'lightning')))\n"
        "print(sessrec.NextItemTask.__module__, sessrec.SessionDataModule.__module__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "[]"
    assert out[1] == "sessrec.tasks.next_item sessrec.tasks.session_data"  # loaded when asked for


TRAINING_STACK = ("pytorch_lightning", "lightning", "lightning_fabric", "jsonargparse")


@pytest.mark.slow
def test_the_serving_path_imports_no_training_stack(tmp_path):
    """In a fresh interpreter: the serving modules import, and model directories (written from a network
    and from a task) and a pipeline load, recommend and export, without Lightning, jsonargparse or sessrec.tasks."""
    import numpy as np
    import pyarrow as pa
    import torch

    from sessrec.artifacts import ClickRanker, Inference, SessionRecommender
    from sessrec.baselines import Popularity
    from sessrec.data import ItemVocab
    from sessrec.datasets.clickout_rows import CLICKS, SPARSE_FEATURES, RankingVocab
    from sessrec.deploy.recommender import load_recommender
    from sessrec.embeddings import TableConfig
    from sessrec.models import DLRM, CausalLanguageModeling, GRU4RecEncoder, SessionModel
    from sessrec.pipeline import BaselineRetriever, Pipeline, SessionModelRetriever
    from sessrec.tasks import NextItemTask

    vocab = ItemVocab(pa.array(np.arange(100, 120)), np.arange(20, 0, -1))
    torch.manual_seed(0)
    model = SessionModel(len(vocab), GRU4RecEncoder(d_model=8), max_length=6).eval()
    task = NextItemTask(num_items=len(vocab), max_length=5, encoder=GRU4RecEncoder(d_model=8), objective=CausalLanguageModeling())
    task.vocab = vocab
    sessions = torch.tensor([[0, 2, 3, 4], [5, 6, 7, 8]])
    retrievers = {"model": (SessionModelRetriever(model), 5),
                  "pop": (BaselineRetriever(Popularity()).fit(sessions, len(vocab)), 5)}
    ranking = RankingVocab({n: ItemVocab(pa.array([f"{n}{i}" for i in range(4)]), np.ones(4, dtype=np.int64))
                            for n in (*SPARSE_FEATURES, CLICKS)})
    directories = {
        "network": SessionRecommender(model, CausalLanguageModeling(), vocab, Inference(5)).save_pretrained(tmp_path / "network"),
        "task": task.recommender().save_pretrained(tmp_path / "task"),
        "pipeline": Pipeline(vocab, retrievers, max_length=5).save_pretrained(tmp_path / "pipeline"),
    }
    dlrm = DLRM(2, [TableConfig("city", 4, 4)], dense_layers=[4], over_layers=[4])
    dlrm = ClickRanker(dlrm, ranking).save_pretrained(tmp_path / "dlrm")
    request = [["101", "102", "103"], ["110"]]
    expected = {name: load_recommender(d).recommend(request, k=3) for name, d in directories.items()}
    code = (
        "import json, sys\n"
        "import sessrec.pipeline, sessrec.deploy.server, sessrec.deploy.export, sessrec.deploy.recommender, sessrec.deploy.triton\n"
        "from sessrec.deploy.export import export_model_dir\n"
        "from sessrec.deploy.recommender import load_recommender\n"
        f"directories, dlrm, out = {json.dumps({k: str(v) for k, v in directories.items()})}, {str(dlrm)!r}, {str(tmp_path / 'out')!r}\n"
        f"recs = {{name: load_recommender(d).recommend({request!r}, k=3) for name, d in directories.items()}}\n"
        "export_model_dir(dlrm, out, 'torchscript')\n"
        f"loaded = sorted(m for m in sys.modules if m.split('.')[0] in {TRAINING_STACK!r} or m.startswith('sessrec.tasks'))\n"
        "print(json.dumps({'loaded': loaded, 'recs': recs}))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout.strip().split("\n")[-1])
    assert got["loaded"] == []
    assert got["recs"] == json.loads(json.dumps(expected))
    assert (tmp_path / "out" / "model.pt").exists()


@pytest.mark.slow
def test_the_serving_commands_start_without_the_training_stack():
    """``sessrec --help``, ``serve``'s and ``rollback``'s flags parse without Lightning or jsonargparse."""
    code = (
        "import sys\n"
        "from sessrec.cli import function_parser, run\n"
        "from sessrec.deploy.server import serve\n"
        "run(['--help'])\n"
        "cfg = function_parser(serve, 'sessrec serve').parse_args(['--model-dir', 'd', '--port', '9', '--access_log', 'false'])\n"
        "print(cfg.model_dir, cfg.port, cfg.access_log, cfg.max_batch_size)\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'pytorch_lightning', 'lightning', 'lightning_fabric', 'jsonargparse'}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == "usage:" and any("sessrec rollback" in line for line in out)
    assert out[-2] == "d 9 False 64"
    assert out[-1] == "[]"


def test_serve_refuses_a_port_outside_tcp(monkeypatch, capsys):
    from sessrec.cli import main

    monkeypatch.setattr(sys, "argv", ["sessrec", "serve", "--model-dir", "nowhere", "--port", "80000"])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert "--port 80000 is not a TCP port" in str(exit_.value)


def test_a_command_whose_extra_is_missing_says_which_extra(monkeypatch):
    import builtins

    from sessrec.cli import main

    real_import = builtins.__import__

    def without_prometheus(name, *args, **kwargs):
        if name.partition(".")[0] == "prometheus_client":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_prometheus)
    for module in [m for m in sys.modules if m.startswith(("sessrec.deploy.server", "sessrec.deploy.request_metrics", "prometheus_client"))]:
        monkeypatch.delitem(sys.modules, module)
    monkeypatch.setattr(sys, "argv", ["sessrec", "serve", "--model-dir", "nowhere"])
    with pytest.raises(SystemExit) as exit_:
        main()
    message = str(exit_.value)
    assert "needs the 'deploy' extra (module 'prometheus_client' is not installed)" in message and "\n" not in message


def test_the_architecture_page_shows_this_table():
    """docs/architecture.md prints the LAYER table above, as it is."""
    import re

    block = re.search(r"^LAYER = \{.*?\}\n", Path(__file__).read_text(), re.S | re.M).group(0)
    assert block in (PACKAGE.parent / "docs" / "architecture.md").read_text()


def test_no_library_default_points_at_this_repository_data():
    """Paths to data are arguments: no file of the package names the repository's data folders."""
    found = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if "shared/data" in p.read_text()]
    assert found == []
