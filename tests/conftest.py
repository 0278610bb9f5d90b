"""Shared test helpers: the real public datasets live outside the repo, in ../shared/data."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Callable[[str], Path]:
    """``shared_data("rsc15_100k")`` is that dataset's folder; the test is skipped when it is absent."""

    def folder(name: str) -> Path:
        path = SHARED_DATA / name
        if not path.is_dir():
            pytest.skip(f"dataset folder {path} is absent")
        return path

    return folder
