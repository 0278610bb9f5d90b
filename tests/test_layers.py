"""The package's layers: the import-linter contracts of pyproject.toml pass, and the run-time rules behind them.

`lint-imports` checks the contracts (`[tool.importlinter]`): the layers saved -> data -> features,
embeddings -> datasets -> models, metrics, baselines -> artifacts -> tasks -> pipeline -> deploy ->
cli, the packages that must not know each other, no dataset adapter in the networks, no Lightning or
jsonargparse below tasks, no import of the top package from inside it, no circle between packages or
between the files of one package. One test runs it on this repository, and one per contract runs it
on a copy of the package given an import that breaks that contract. The contract on circles compares
the files of a package with each other, not with the package's ``__init__.py``:
`test_no_file_imports_itself_round_a_circle` follows every import. At run time: the model layers
import without Lightning, and the serving path (a saved pipeline or model directory loaded, served
and exported) imports neither Lightning nor jsonargparse.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "sessrec"


def lint_imports(root: Path, *options: str) -> subprocess.CompletedProcess:
    """``lint-imports`` (import-linter, the dev extra) on the package under `root`, with its pyproject.toml."""
    command = [str(Path(sys.executable).with_name("lint-imports")), "--no-cache", *options]
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, check=False)


def test_the_import_contracts_are_kept():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


BREAKING = [  # (contract id, files added to a copy of the package, what lint-imports must say)
    ("layers", {"data/upward.py": "def later():\n    from ..tasks import next_item  # relative, in a function\n"},
     "sessrec.data.upward -> sessrec.tasks.next_item"),
    ("layers", {"extra/__init__.py": ""}, "- sessrec.extra"),  # a package without a layer
    ("scorers-apart", {"metrics/sideways.py": "from sessrec.models.session_model import SessionModel\n"},
     "sessrec.metrics.sideways -> sessrec.models.session_model"),
    ("tables-apart-from-feature-ops", {"embeddings/ops.py": "from sessrec.features.ops import Categorify\n"},
     "sessrec.embeddings.ops -> sessrec.features.ops"),
    ("networks-without-datasets", {"models/adapter.py": "from sessrec.datasets.trivago import TrivagoSource\n"},
     "sessrec.models.adapter -> sessrec.datasets.trivago"),
    ("model-layers-without-training-stack", {"data/trainer.py": "import pytorch_lightning\n"},
     "sessrec.data.trainer -> pytorch_lightning"),
    ("no-root-imports", {"saved/root.py": "from sessrec import NextItemTask\n"}, "sessrec.saved.root -> sessrec"),
    ("acyclic", {"baselines/one.py": "from sessrec.baselines import two\n", "baselines/two.py": "from . import one\n"},
     "No cycles are allowed in sessrec.baselines."),
]


@pytest.mark.parametrize("contract, files, said", BREAKING, ids=[f"{c}-{next(iter(f))}" for c, f, _ in BREAKING])
def test_a_contract_fails_on_an_import_that_breaks_it(tmp_path, contract, files, said):
    shutil.copytree(PACKAGE, tmp_path / "sessrec", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    for name, code in files.items():
        (tmp_path / "sessrec" / name).parent.mkdir(exist_ok=True)
        (tmp_path / "sessrec" / name).write_text(code)
    result = lint_imports(tmp_path, "--contract", contract)
    assert result.returncode == 1, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 kept, 1 broken" in result.stdout and said in result.stdout, result.stdout[-4000:]


def test_the_architecture_page_shows_the_contracts():
    """docs/architecture.md prints pyproject.toml's [tool.importlinter] section, as it is."""
    toml = (ROOT / "pyproject.toml").read_text()
    lines = toml[toml.index("\n[tool.importlinter]\n") + 1:].splitlines(keepends=True)
    end = next((i for i, line in enumerate(lines) if i and line.startswith("[") and "importlinter" not in line), len(lines))
    section = "".join(lines[:end]).rstrip() + "\n"
    assert f"```toml\n{section}```" in (ROOT / "docs" / "architecture.md").read_text()


def file_circles(graph: grimp.ImportGraph) -> set[tuple[str, ...]]:
    """Every circle of imports between modules, package ``__init__`` modules included: for each import
    a -> b from which a chain leads back to a, the circle a -> b -> ... -> a."""
    found = set()
    for importer in graph.modules:
        for imported in graph.find_modules_directly_imported_by(importer) - {importer}:
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back is not None:
                found.add((importer, *back))
    return found


def test_no_file_imports_itself_round_a_circle():
    assert file_circles(grimp.build_graph("sessrec", cache_dir=None)) == set()


def test_a_circle_through_a_package_init_is_found():
    graph = grimp.ImportGraph()
    for importer, imported in [("p", "p.b"), ("p.a", "p.c"), ("p.b", "p.a"), ("p.a", "p")]:
        graph.add_import(importer=importer, imported=imported)
    assert file_circles(graph) == {
        ("p", "p.b", "p.a", "p"), ("p.b", "p.a", "p", "p.b"), ("p.a", "p", "p.b", "p.a"),
    }


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
    from sessrec.datasets.clickouts import DENSE_FEATURES
    from sessrec.embeddings import TableConfig
    from sessrec.models import DLRM, CausalLanguageModeling, GRU4RecEncoder, SessionModel
    from sessrec.pipeline import BaselineRetriever, Pipeline, SessionModelRetriever
    from sessrec.serving.recommender import load_recommender
    from sessrec.tasks import NextItemTask

    vocab = ItemVocab(pa.array(np.arange(100, 120)), np.arange(20, 0, -1))
    torch.manual_seed(0)
    model = SessionModel(len(vocab), GRU4RecEncoder(d_model=8), max_length=5).eval()
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
    dlrm = DLRM(len(DENSE_FEATURES), [TableConfig(n, 6, 4) for n in SPARSE_FEATURES], dense_layers=[4], over_layers=[4])
    dlrm = ClickRanker(dlrm, ranking).save_pretrained(tmp_path / "dlrm")
    request = [["101", "102", "103"], ["110"]]
    expected = {name: load_recommender(d).recommend(request, k=3) for name, d in directories.items()}
    code = (
        "import json, sys\n"
        "import sessrec.pipeline, sessrec.serving.server, sessrec.lifecycle.export, sessrec.serving.recommender, sessrec.lifecycle.triton\n"
        "from sessrec.lifecycle.export import export_model_dir\n"
        "from sessrec.serving.recommender import load_recommender\n"
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
    """``sessrec --help``, ``serve``'s and ``rollback``'s flags parse (jsonargparse, `sessrec.cli.parsers`)
    without Lightning or the training tasks."""
    code = (
        "import sys\n"
        "from sessrec.cli import run\n"
        "from sessrec.cli.parsers import function_command, parse\n"
        "from sessrec.serving.server import serve\n"
        "run(['--help'])\n"
        "cfg = parse(function_command(serve, 'sessrec serve'), ['--model_dir', 'd', '--port', '9', '--access_log', 'false'], owner=serve)\n"
        "print(cfg.model_dir, cfg.port, cfg.access_log, cfg.max_batch_size)\n"
        "try:\n"
        "    run(['rollback', '--model_dir', 'nowhere'])\n"
        "except FileNotFoundError as err:\n"
        "    print(err)\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'pytorch_lightning', 'lightning', 'lightning_fabric'}))\n"
        "print(sorted(m for m in sys.modules if m.startswith('sessrec.tasks')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == "usage:" and any("sessrec rollback" in line for line in out)
    assert out[-4:] == ["d 9 False 64", "nowhere: no such model directory", "[]", "[]"]


def test_serve_refuses_a_port_outside_tcp(monkeypatch, capsys):
    from sessrec.cli import main

    monkeypatch.setattr(sys, "argv", ["sessrec", "serve", "--model_dir", "nowhere", "--port", "80000"])
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
    for module in [m for m in sys.modules if m.startswith(("sessrec.serving.server", "sessrec.serving.request_metrics", "prometheus_client"))]:
        monkeypatch.delitem(sys.modules, module)
    monkeypatch.setattr(sys, "argv", ["sessrec", "serve", "--model_dir", "nowhere"])
    with pytest.raises(SystemExit) as exit_:
        main()
    message = str(exit_.value)
    assert "needs the 'deploy' extra (module 'prometheus_client' is not installed)" in message and "\n" not in message


def test_no_library_default_points_at_this_repository_data():
    """Paths to data are arguments: no file of the package names the repository's data folders."""
    found = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if "shared/data" in p.read_text()]
    assert found == []
