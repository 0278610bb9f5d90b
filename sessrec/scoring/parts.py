"""An output file written partition by partition: its parts folder, the folder's manifest, the join.

The parts of ``<output>`` lie in ``<output>.parts/``: ``part-NNNNNN.parquet`` for partition N of
the input (`sessrec.data.ScoringStream.partitions`), one row group per batch, each written under a
temporary name, fsynced and renamed when complete, so a run that is killed leaves complete parts only.
``manifest.json`` records what the parts depend on, by content: the input file's hash, the model's
or pipeline's, every setting that changes a part. A run whose manifest is the one recorded keeps
the parts there and scores only the others (it resumes); any other starts the folder over, removing
only what a run writes there (the manifest, the parts, their temporary names): a folder that holds
anything else is refused in one line naming it and one such file, before anything is scored. At the
end the parts are joined in partition order into ``<output>`` in its format (`OutputFile`; a
temporary name, renamed) and the folder is removed: every session exactly once, in input order.

One run writes an output at a time: from `PartsFolder.open` until the join, the run holds a lock on the
parts folder (``flock`` of the folder itself, released when the run ends or its process dies), and a
second run into the same output (``predict`` or ``recommend``, another model or the same) is refused in
one line naming it, rather than removing or resuming parts that the first is writing.

`PartsFolder.run` decides what a failed run leaves: one refused for its input (a `ValueError` or
`TypeError`: a bad row, a time in the wrong unit) removes the folder and the folders it created, since
a rerun of the same input would be refused again; one interrupted (killed, a worker lost, a full
disk) keeps its complete parts for the rerun that resumes from them.

The joined file does not depend on how the input was partitioned: its row groups are the parts'
row groups, one per batch, and the batches are cut the same way whatever the partitions
(`ScoringStream`), so one process and any number of workers write the same bytes on as many torch
threads each (a Dask worker scores on one; on more, a matrix product may sum in another order and a score
differ in its last bit).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from sessrec.saved.atomic import fsync_file, lock_folder, write_text
from sessrec.scoring.output import OutputFile

MANIFEST = "manifest.json"
REFUSED = (ValueError, TypeError)  # a run failed for its input: nothing of it is kept
WRITTEN = re.compile(rf"{re.escape(MANIFEST)}|\.{re.escape(MANIFEST)}\.tmp-.+|part-\d{{6,}}\.parquet(\.tmp)?")


def check_settings(k: int, batch_size: int, partition_batches: int, flags: Mapping[str, str] | None = None) -> None:
    """Refuse counts that cannot give an output, before anything is read or written.

    Args:
        flags: the command's option that gave each setting, by its argument's name (``{"k": "--k",
            "batch_size": "--batch_size", "partition_batches": "--partition_batches"}``), named in its
            message (``--batch_size 0: must be 1 or more``); None: the Python arguments
            (``batch_size must be an integer of 1 or more, got 0``).

    Raises:
        ValueError: `k`, `batch_size` or `partition_batches` not an integer of 1 or more.
    """
    check_counts({"k": k, "batch_size": batch_size, "partition_batches": partition_batches}, flags)


def check_counts(values: Mapping[str, Any], flags: Mapping[str, str] | None = None) -> None:
    """Refuse, in one line, the first of `values` (argument name -> value) that is not an integer of 1 or more:
    by the option of `flags` that gave it (``--partition_batches 0: must be 1 or more``), else (None) by its
    name as a Python argument (``partition_batches must be an integer of 1 or more, got 0``)."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            if flags is None:
                raise ValueError(f"{name} must be an integer of 1 or more, got {value!r}")
            what = "the number of recommendations per session must" if name == "k" else "must"
            raise ValueError(f"{flags[name]} {value}: {what} be 1 or more")


class PartsFolder:
    """``<output>.parts/`` of one run: which partitions are done, where each part goes, the join.

    Args:
        output: the file the parts are joined into.
        manifest: what the parts depend on, by content (JSON values).
        reusable: False where the run has no identity by content (a pipeline never saved):
            the parts of an earlier run are never kept.
        tag: the command's name in the lines printed (``[recommend]``).
    """

    def __init__(self, output: OutputFile, manifest: dict[str, Any], reusable: bool = True, tag: str = "scoring") -> None:
        self.output, self.manifest, self.reusable, self.tag = output, manifest, reusable, tag
        self.folder = output.parts
        self._lock: int | None = None  # the descriptor of the folder, locked, from `open` until `release`

    def __enter__(self) -> PartsFolder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def recorded(self) -> dict[str, Any] | None:
        """The manifest of the run that wrote the folder (None: no folder, or an unreadable manifest)."""
        try:
            found = json.loads((self.folder / MANIFEST).read_text())
        except (OSError, ValueError):
            return None
        return found if isinstance(found, dict) else None

    def open(self) -> None:
        """Lock the folder (`lock`), then keep the parts of a run with this manifest; start the folder over otherwise."""
        self.output.make_folder()
        earlier = self.folder.exists()
        self.lock()
        if earlier:
            self.check_written()
        if earlier and (not self.reusable or self.recorded() != self.manifest):
            print(f"[{self.tag}] {self.folder}: written by another model, input or settings; starting over")
            for entry in self.folder.iterdir():  # the folder itself stays: it holds the lock
                entry.unlink()
        write_text(self.folder / MANIFEST, json.dumps(self.manifest))

    def check_written(self) -> None:
        """Refuse a folder holding anything a run does not write there (`WRITTEN`: the manifest, the parts and
        their temporary names, all plain files): starting over or joining would remove it.

        Raises:
            FileExistsError: one line naming the folder and one such entry.
        """
        foreign = sorted(entry.name for entry in self.folder.iterdir()
                         if not WRITTEN.fullmatch(entry.name) or entry.is_symlink() or not entry.is_file())
        if foreign:
            raise FileExistsError(f"{self.output.flag} {self.output.named}: {self.folder} holds {foreign[0]!r}"
                                  f"{f' and {len(foreign) - 1} more' if len(foreign) > 1 else ''}, which no run wrote; "
                                  "a run removes that folder: move what it holds elsewhere, or name another output")

    def lock(self) -> None:
        """Create the folder and hold its lock until `release`; another run holding it is refused in one line."""
        if self._lock is None:
            self._lock = lock_folder(self.folder, f"{self.output.flag} {self.output.named}: another run is writing it "
                                                  f"(its parts in {self.folder}); wait for it to finish, or name another file")

    def release(self) -> None:
        """Let another run write the output (the end of the run, joined or failed)."""
        if self._lock is not None:
            os.close(self._lock)  # closing the descriptor releases its lock
            self._lock = None

    def run(self, score: Callable[[], Any]) -> Any:
        """``score()`` (what writes the parts), then nothing left of a run refused for its input: the
        folder and the folders the run created are removed on a `REFUSED` error; on any other the
        complete parts are kept (and named) for the rerun that resumes from them."""
        try:
            return score()
        except REFUSED:
            self.discard()
            raise
        except BaseException:
            if self.folder.exists():
                print(f"[{self.tag}] the parts written are kept in {self.folder}: run the same command again to "
                      "resume from them")
            raise

    def discard(self) -> None:
        """Remove the folder, then the folders the run created. Tries again while a Dask task that was
        running when the run failed still finishes a part (its rename into a removed folder fails)."""
        for _ in range(50):
            shutil.rmtree(self.folder, ignore_errors=True)
            if not self.folder.exists():
                break
            time.sleep(0.1)
        self.output.remove_made()

    def part(self, index: int) -> Path:
        return self.folder / f"part-{index:06d}.parquet"

    def done(self, index: int) -> bool:
        """Whether partition `index` has its complete part (a part is renamed into place when complete)."""
        return self.part(index).exists()

    def join(self, count: int) -> None:
        """Join parts 0 .. `count` - 1 into the output in its format (`OutputFile.write`), row group by
        row group, under a temporary name renamed when complete; then remove the folder."""
        names = [self.part(i) for i in range(count)]
        self.output.write(row_groups(pq.ParquetFile(name) for name in names), written_schema(pq.ParquetFile(names[0])))
        shutil.rmtree(self.folder)


def row_groups(files: Iterable[pq.ParquetFile]) -> Iterator[pa.Table]:
    """The row groups of `files`, file after file."""
    for file in files:
        for group in range(file.num_row_groups):
            yield file.read_row_group(group)


def write_part(path: Path, tables: Iterable[pa.Table]) -> int:
    """Write `tables` to `path`, one row group each, under a temporary name fsynced and renamed when
    complete; returns the rows written. Nothing is left at either name when a table fails. The folder
    is never created: a part of a run whose folder was removed fails."""
    tmp, writer, rows = path.with_name(path.name + ".tmp"), None, 0
    try:
        for table in tables:
            if writer is None:
                writer = pq.ParquetWriter(tmp, table.schema)
            writer.write_table(table)
            rows += table.num_rows
        if writer is None:
            raise ValueError(f"{path}: a partition without sessions")
        writer.close()
        fsync_file(tmp)
        os.replace(tmp, path)
    finally:
        if writer is not None:
            writer.close()
        tmp.unlink(missing_ok=True)
    return rows


def written_schema(file: pq.ParquetFile) -> pa.Schema:
    """The Arrow schema `file` was written with, as its ``ARROW:schema`` metadata records it: reading
    names a list's values ``element`` where the writer's table may have named them ``item``, and
    the joined file keeps the writer's names (the bytes a single process writes)."""
    stored = (file.metadata.metadata or {}).get(b"ARROW:schema")
    return file.schema_arrow if stored is None else pa.ipc.read_schema(pa.py_buffer(base64.b64decode(stored)))
