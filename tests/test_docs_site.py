"""The documentation site: every module has its API page, every relative link in the docs and the
README points at a file that exists, and `mkdocs build --strict` (guides plus the API reference
rendered from the docstrings) passes without a warning."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
API = ROOT / "docs" / "api"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def library_modules() -> set[str]:
    """Dotted names of sessrec's modules with their own API entry: packages' __init__ files are
    documented through their modules; ``__main__`` runs the command line; a module whose whole body
    is a deprecated re-export (it says so in its first docstring line) is left out."""
    names = set()
    for path in (ROOT / "sessrec").rglob("*.py"):
        if path.name in ("__init__.py", "__main__.py"):
            continue
        first = path.read_text().lstrip('"\n ').splitlines()[0] if path.read_text().strip() else ""
        if first.startswith("Deprecated"):
            continue
        names.add(".".join(path.relative_to(ROOT).with_suffix("").parts))
    return names


def api_modules() -> set[str]:
    return {m for page in API.glob("*.md") for m in re.findall(r"^::: (\S+)", page.read_text(), flags=re.M)}


def test_every_module_has_an_api_entry_and_every_entry_a_module():
    assert api_modules() == library_modules()


@pytest.mark.parametrize("page", sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]), ids=lambda p: p.name)
def test_relative_links_point_at_files_that_exist(page):
    missing = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a URL or an anchor on the same page
        path = target.split("#")[0]
        if not (page.parent / path).exists():
            missing.append(target)
    assert not missing


@pytest.mark.slow
def test_the_site_builds_without_a_warning(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "site" / "api" / "models" / "index.html").exists()
