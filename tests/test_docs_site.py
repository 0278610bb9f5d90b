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


def library_modules(package: Path) -> list[str]:
    """Dotted names of a package's modules with their own API entry: not ``__init__`` (a package is
    documented through its modules), not ``__main__``."""
    names = []
    for path in sorted(package.rglob("*.py")):
        if path.name in ("__init__.py", "__main__.py"):
            continue
        names.append(".".join(path.relative_to(ROOT).with_suffix("").parts))
    return names


def api_pages() -> dict[str, str]:
    """docs/api/<package>.md as they must read: the package's docstring summary, then one entry per module."""
    pages = {}
    for package in sorted(p for p in (ROOT / "sessrec").iterdir() if (p / "__init__.py").exists()):
        text = (package / "__init__.py").read_text()
        summary = text.split('"""')[1].strip().split("\n\n")[0].replace("\n", " ") if text.lstrip().startswith('"""') else ""
        entries = "".join(f"::: {name}\n\n" for name in library_modules(package))
        pages[package.name] = f"# `sessrec.{package.name}`\n\n{summary}\n\n{entries}".rstrip("\n") + "\n"
    for module in sorted((ROOT / "sessrec").glob("*.py")):
        if module.name != "__init__.py":
            pages[module.stem] = f"# `sessrec.{module.stem}`\n\n::: sessrec.{module.stem}\n"
    return pages


def test_the_api_pages_list_every_module():
    """Regenerate with ``python tests/test_docs_site.py`` after adding, moving or removing a module."""
    written = {p.stem: p.read_text() for p in API.glob("*.md")}
    assert written == api_pages()


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


if __name__ == "__main__":
    for old in API.glob("*.md"):
        old.unlink()
    for name, text in api_pages().items():
        (API / f"{name}.md").write_text(text)
