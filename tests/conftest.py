"""Shared test helpers: the real public datasets live outside the repo, in ../shared/data."""

from __future__ import annotations

import os
import sys
import time
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


@pytest.fixture(autouse=True, scope="session")
def _own_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """sessrec's cache (the compiled trees, sessrec.pipeline.scoring.compiled_trees) in a folder of the run, not
    the user's, for the tests and the commands they start."""
    before = os.environ.get("SESSREC_CACHE_DIR")
    os.environ["SESSREC_CACHE_DIR"] = str(tmp_path_factory.mktemp("sessrec-cache"))
    yield
    if before is None:
        del os.environ["SESSREC_CACHE_DIR"]
    else:
        os.environ["SESSREC_CACHE_DIR"] = before


REAL_CLOCKS = time.time, time.monotonic


@pytest.fixture(autouse=True)
def _distributed_kept_whole() -> Iterator[None]:
    """Fails a test that leaves distributed broken for the rest of the process (later Dask tests of that
    process hung or failed): distributed imported while a test's clock stood in for ``time.time`` or
    ``time.monotonic`` keeps that clock (``distributed.metrics`` holds them from its import on, and its
    batched sends never fall due); and ``dask.config.set`` removes on exit every key that did not exist on
    entry, so a first ``import distributed`` inside it drops all of distributed's defaults."""
    yield
    if "distributed" in sys.modules:
        import dask
        from distributed import metrics

        assert (metrics.time, metrics.monotonic) == REAL_CLOCKS, (
            "distributed was imported under a test's clock: import it before patching time")
        assert dask.config.get("distributed.scheduler", None) is not None, (
            "distributed's configuration was dropped: import distributed before dask.config.set")


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

        with monkeypatch.context() as patch:  # sys.argv is the entry point's, not the rest of the test's
            patch.setattr("sys.argv", ["sessrec", *args])
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


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (the test command's ``-n 2``) each worker's torch takes its share of the cores, so that
    the workers together run as many threads as the machine has cores (the subprocesses a test starts keep
    torch's default)."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(workers)))
