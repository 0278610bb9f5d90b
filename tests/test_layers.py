"""The package's layers: saved -> data -> embeddings -> models -> tasks -> pipeline -> deploy -> cli, one way.

`metrics` and `baselines` sit beside `models` (they read data only). An import, at module level or
inside a function, from a lower layer to a higher one fails the test, and the model layers import
without Lightning.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "sessrec"
LAYER = {"saved": -1, "data": 0, "embeddings": 1, "models": 2, "metrics": 2, "baselines": 2, "tasks": 3, "pipeline": 4,
         "deploy": 5, "cli": 6}


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


def test_the_checker_sees_an_upward_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from sessrec.tasks.next_item import NextItemTask\n")
    assert imported_layers(bad) == {"tasks"}


def test_models_and_embeddings_import_without_lightning():
    code = (
        "import sys, sessrec, sessrec.data, sessrec.embeddings, sessrec.models\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pytorch_lightning', 'lightning')))\n"
        "sessrec.models.DLRM; sessrec.data.SparseFeatures\n"
        "print(sessrec.NextItemTask.__module__, sessrec.data.ClickoutDataModule.__module__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "[]"
    assert out[1] == "sessrec.tasks.next_item sessrec.data.ranking_datamodule"  # loaded when asked for
