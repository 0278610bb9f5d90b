"""Write a file under a temporary name and rename it into place: readers never see half a file."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success rename it to `path`, on failure remove it.

    Example:
        >>> with atomic_path("out.parquet") as tmp:  # doctest: +SKIP
        ...     pq.write_table(table, tmp)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # only still there when writing failed
