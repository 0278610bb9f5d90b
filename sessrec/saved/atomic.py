"""Write a file under a temporary name and rename it into place: readers never see half a file.

`ParquetFile` gives an object that is one table its parquet file, on disk and in memory.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq


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


class ParquetFile:
    """Mixin of an object that is one table (`to_table` / `from_table`): `save` and `load` it as a
    parquet file (written atomically), `to_bytes` and `from_bytes` the same file in memory (what a
    checkpoint carries)."""

    def to_table(self) -> pa.Table:
        raise NotImplementedError

    @classmethod
    def from_table(cls, table: pa.Table, source: str | os.PathLike) -> Any:
        """The object `table` holds; `source` names it in errors."""
        raise NotImplementedError

    def save(self, path: str | os.PathLike) -> Path:
        with atomic_path(path) as tmp:
            pq.write_table(self.to_table(), tmp)
        return Path(path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Any:
        return cls.from_table(pq.read_table(path), path)

    def to_bytes(self) -> bytes:
        sink = pa.BufferOutputStream()
        pq.write_table(self.to_table(), sink)
        return sink.getvalue().to_pybytes()

    @classmethod
    def from_bytes(cls, data: bytes, source: str | os.PathLike) -> Any:
        return cls.from_table(pq.read_table(pa.BufferReader(data)), source)
