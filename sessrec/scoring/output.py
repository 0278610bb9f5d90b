"""The file a scoring run writes (``sessrec predict``, ``sessrec recommend``): its format is its
extension, and the path is checked before anything is read or scored.

Formats (`FORMATS`, by the extension in any case):

- ``.parquet``, ``.pq``: one row per session, ``session_id``, ``item_ids`` (raw ids, best first),
  ``scores`` (float32), one row group per batch;
- ``.csv``: one row per recommendation, ``session_id``, ``rank`` (1 = best), ``item_id``, ``score``
  (CSV has no list type; `long_table`).

`OutputFile.check` refuses, in one line naming the path: another extension (``.json``, ``.txt``,
none), a directory (or a path ending in ``/``), an existing file unless overwritten, the input file
itself (by any path to it), and a place that cannot be written: a file where a folder is expected,
or a nearest existing folder that refuses a new file (tried by creating and removing one, which also
finds read-only file systems). Folders missing on the way are created when the run first writes
(``mkdir -p``, `make_folder`) and removed again by a run that is refused (`remove_made`).

`write` writes the whole file under a temporary name in its folder, fsynced and renamed into place
(`sessrec.saved.atomic.atomic_path`): a reader never sees half a file.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from sessrec.saved.atomic import atomic_path, reached_path
from sessrec.saved.versions import SAVED_MARKERS

FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv"}
SUPPORTED = "name a .parquet or .pq file (one row per session) or a .csv file (one row per recommendation)"


class OutputFile:
    """The file a run writes and the folders it created on the way.

    Args:
        path: the file, as the user gave it (a trailing ``/`` names a directory).
        flag: the option that named it, in messages (``--output``, ``--scoring.output``).
    """

    def __init__(self, path: str | os.PathLike, flag: str = "--output") -> None:
        self.named = os.fspath(path)
        self.path, self.flag = reached_path(self.named), flag
        self.made: list[Path] = []  # folders created by `make_folder`, outermost first

    @property
    def parts(self) -> Path:
        """``<output>.parts``: where a run partition by partition keeps its parts (`sessrec.scoring.PartsFolder`)."""
        return self.path.with_name(self.path.name + ".parts")

    @property
    def format(self) -> str:
        """``parquet`` or ``csv``."""
        return FORMATS[self.path.suffix.lower()]

    def check(self, overwrite: bool, inputs: Sequence[str | os.PathLike] = (),
              folders: Sequence[str | os.PathLike] = ()) -> None:
        """Refuse a path the run cannot write what its name says, before anything is read or scored.

        Args:
            overwrite: an existing file may be replaced.
            inputs: the files the run reads: the output must be none of them.
            folders: the directories the run reads (a saved pipeline): the output must be in none of them.

        Raises:
            ValueError: a directory, an extension other than `FORMATS`, one of `inputs`, a file in one of `folders`.
            FileExistsError: the file exists and `overwrite` is false.
            PermissionError: a folder on the way is a file, or the nearest existing folder refuses a new file.
        """
        where = f"{self.flag} {self.named}"
        if self.path.is_dir() or self.named.endswith(("/", os.sep)):
            raise ValueError(f"{where} is a directory; name a file in it (e.g. {self.path / 'recs.parquet'})")
        if self.path.suffix.lower() not in FORMATS:
            raise ValueError(f"{where}: unknown extension {self.path.suffix or '(none)'!r}; {SUPPORTED}")
        for given in inputs:
            same = self.path.exists() and Path(given).exists() and os.path.samefile(self.path, given)
            if same or self.path == Path(given).absolute():
                raise ValueError(f"{where} is the input file; name another file for the recommendations")
        for folder in folders:
            root = Path(os.path.realpath(folder))
            if root in self.path.parents:
                raise ValueError(f"{where} is inside {folder}, which the run reads; name a file outside it")
        if self.path.exists() and not overwrite:
            raise FileExistsError(f"{where} exists; pass {self.flag.replace('output', 'overwrite')} true to replace it")
        if self.parts.exists() and not self.parts.is_dir():
            raise FileExistsError(f"{where}: {self.parts} is a file, where the run keeps its parts; remove it or name "
                                  "another file")
        check_writable(self.path.parent, where)

    def make_folder(self) -> None:
        """Create the folders missing on the way to the file, remembering which (`remove_made`)."""
        missing = [p for p in reversed(self.path.parents) if not p.exists()]
        for folder in missing:
            folder.mkdir(exist_ok=True)
            self.made.append(folder)

    def remove_made(self) -> None:
        """Remove the folders `make_folder` created, innermost first, where they are empty."""
        for folder in reversed(self.made):
            try:
                folder.rmdir()
            except OSError:  # something else was written there meanwhile: kept
                break
        self.made = []

    def write(self, tables: Iterable[pa.Table], schema: pa.Schema) -> None:
        """Write the batches `tables` (``session_id``, ``item_ids``, ``scores``; `schema` theirs as
        written) in the file's format, one row group or block each, under a temporary name renamed
        into place when complete."""
        with atomic_path(self.path) as tmp:
            if self.format == "csv":
                with pacsv.CSVWriter(tmp, long_table(schema.empty_table()).schema) as writer:
                    for table in tables:
                        writer.write_table(long_table(table))
            else:
                with pq.ParquetWriter(tmp, schema) as writer:
                    for table in tables:
                        writer.write_table(table.cast(schema))


def check_folder(folder: str | os.PathLike, flag: str, inputs: Sequence[str | os.PathLike] = ()) -> None:
    """Refuse a folder a command writes its files into (``sessrec export --out``), before any work: a
    file, a folder that cannot be written (`check_writable`), one of `inputs` or a folder inside one
    (a model directory), and a saved model or pipeline directory (or a version's folder of one: it holds
    one of `SAVED_MARKERS`), whose ``vocab.parquet`` the files written would replace. The files it holds of
    another run are replaced; missing folders are created.

    Raises:
        ValueError: `folder` is one of `inputs` or inside one, or a saved directory.
        PermissionError: `folder` is a file or cannot be written.
    """
    where, path = f"{flag} {os.fspath(folder)}", reached_path(folder)
    if path.exists() and not path.is_dir():
        raise PermissionError(f"{where} is a file; name a folder")
    for given in inputs:
        root = reached_path(given)
        if path == root or root in path.parents or (path.exists() and os.path.samefile(path, root)):
            raise ValueError(f"{where} is inside {given}, which the command reads; name another folder")
    saved = next((name for name in SAVED_MARKERS if (path / name).exists()), None)
    if saved is not None:
        raise ValueError(f"{where} is a saved model or pipeline directory (it holds {saved}): the files written "
                         "would replace its parts; name another folder")
    check_writable(path, where)


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether writing `a` would write `b`: one path as the file system reaches it (`reached_path`), or one file."""
    first, second = reached_path(a), reached_path(b)
    return first == second or (first.exists() and second.exists() and os.path.samefile(first, second))


def check_writable(folder: Path, where: str) -> None:
    """Refuse `folder` (missing folders on the way are created later) when the nearest existing folder
    on its way is a file, or refuses a new file (tried by creating and removing one).

    Raises:
        PermissionError: one line starting with `where`.
    """
    existing = folder
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise PermissionError(f"{where}: {existing} is a file, not a folder")
    try:
        with tempfile.TemporaryFile(dir=existing, prefix=".sessrec-probe-"):
            pass
    except OSError as err:
        raise PermissionError(f"{where}: cannot write in {existing} ({err.strerror or err})") from None


def long_table(table: pa.Table) -> pa.Table:
    """One row per recommendation: ``session_id``, ``rank`` (1 = best), ``item_id``, ``score``."""
    items, scores = table.column("item_ids").combine_chunks(), table.column("scores").combine_chunks()
    parent = pc.list_parent_indices(items)
    starts = pc.take(items.offsets, parent)
    rank = pc.add(pc.subtract(pa.array(np.arange(len(parent), dtype=np.int64)), starts.cast(pa.int64())), 1)
    return pa.table({"session_id": pc.take(table.column("session_id"), parent), "rank": rank,
                     "item_id": pc.list_flatten(items), "score": pc.list_flatten(scores)})
