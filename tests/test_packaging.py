"""The dependencies say what runs: every third-party import of `sessrec/` is declared (core or an extra),
nothing core is declared that the package never imports, and `docs/constraints.txt` pins versions inside
`pyproject.toml`'s ranges."""

import ast
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# installed without dependencies (docs/sharding.md): no extra can hold them
NO_DEPS = {"torchrec", "fbgemm-gpu-cpu", "tensordict"}
# not installed on a CPU machine, so their import names cannot be looked up
GPU_ONLY = {"cupy": "cupy-cuda12x", "cudf": "cudf-cu12", "dask_cuda": "dask-cuda", "dask_cudf": "dask-cudf-cu12"}
# declared for what they bring, not imported by name: jsonargparse's `signatures` extra (LightningCLI),
# safetensors (read through transformers' and torch's loaders as well as by name), scipy (torchmetrics'
# retrieval metrics), wandb (the recipes' logger, imported by Lightning)
IMPORTED_INDIRECTLY = {"jsonargparse", "scipy", "wandb"}
# namespace packages that several distributions fill: the distribution of each module imported from them
NAMESPACE_MODULES = {"google.protobuf": "protobuf"}


def requirements(group: str | None) -> dict[str, Requirement]:
    lines = PROJECT["dependencies"] if group is None else PROJECT["optional-dependencies"][group]
    reqs = [Requirement(line) for line in lines]
    return {canonicalize_name(r.name): r for r in reqs if canonicalize_name(r.name) != "sessrec"}


def imported_distributions() -> dict[str, set[str]]:
    """Distribution name -> the sessrec files importing it (top-level third-party imports only)."""
    to_dist = packages_distributions()
    found: dict[str, set[str]] = {}
    for path in (ROOT / "sessrec").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            else:
                continue
            spaced = {n: d for n in names for m, d in NAMESPACE_MODULES.items() if n == m or n.startswith(m + ".")}
            for dist in spaced.values():
                found.setdefault(canonicalize_name(dist), set()).add(str(path.relative_to(ROOT)))
            for top in {n.split(".")[0] for n in names if n not in spaced} - {"sessrec"} - set(sys.stdlib_module_names):
                dists = [GPU_ONLY[top]] if top in GPU_ONLY else to_dist.get(top, [top])
                for dist in dists:
                    found.setdefault(canonicalize_name(dist), set()).add(str(path.relative_to(ROOT)))
    return found


@pytest.mark.slow
def test_every_import_is_declared():
    declared = set(requirements(None)) | NO_DEPS
    for group in PROJECT["optional-dependencies"]:
        declared |= set(requirements(group))
    undeclared = {dist: sorted(files)[:3] for dist, files in imported_distributions().items() if dist not in declared}
    assert not undeclared


def test_every_core_dependency_is_used():
    used = set(imported_distributions()) | IMPORTED_INDIRECTLY
    assert set(requirements(None)) - used == set()


def test_dev_takes_the_pipeline_deploy_cluster_and_fast_trees_extras_whole():
    assert "sessrec[cluster,deploy,fast-trees,pipeline]" in {str(Requirement(line)).replace(" ", "") for line in PROJECT["optional-dependencies"]["dev"]}


def test_the_constraints_pin_inside_the_declared_ranges():
    pins = {}
    for line in (ROOT / "docs" / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version
    groups = [None, *PROJECT["optional-dependencies"]]
    outside = []
    for group in groups:
        for name, req in requirements(group).items():
            if req.marker is not None and not req.marker.evaluate():
                continue
            if name in GPU_ONLY.values():
                continue  # the constraints come from a CPU machine
            if name not in pins or not req.specifier.contains(pins[name], prereleases=True):
                outside.append((str(group), str(req), pins.get(name)))
    assert not outside


@pytest.mark.slow
def test_import_names_map_to_their_distributions():
    assert "pyyaml" in imported_distributions()  # sessrec/cli imports yaml, distributed as PyYAML
    # pandas only for the partitions of `sessrec prepare --engine dask` (the cluster extra)
    assert imported_distributions().get("pandas", set()) <= {"sessrec/data/prepared/cluster.py"}
