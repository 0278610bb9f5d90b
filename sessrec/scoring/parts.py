"""An output file written partition by partition: its parts folder, the folder's manifest, the join.

The parts of ``<output>`` lie in ``<output>.parts/``: ``part-NNNNNN.parquet`` for partition N of
the input (`sessrec.data.ScoringStream.partitions`), one row group per batch, each written under a
temporary name and renamed when complete, so a run that is killed leaves complete parts only.
``manifest.json`` records what the parts depend on, by content: the input file's hash, the model's
or pipeline's, every setting that changes a part. A run whose manifest is the one recorded keeps
the parts there and scores only the others (it resumes); any other starts the folder over. At the
end the parts are joined in partition order into ``<output>`` (a temporary name, renamed) and
the folder is removed: every session exactly once, in input order.

The joined file does not depend on how the input was partitioned: its row groups are the parts'
row groups, one per batch, and the batches are cut the same way whatever the partitions
(`ScoringStream`), so one process and any number of workers write the same bytes.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from sessrec.saved.atomic import write_text

OUTPUT_SUFFIXES = (".parquet", ".csv")
MANIFEST = "manifest.json"


def check_output(output: Path, k: int, batch_size: int, suffixes: tuple[str, ...] = OUTPUT_SUFFIXES) -> None:
    """Refuse settings that cannot give an output, before anything is read or written.

    Raises:
        ValueError: `k` or `batch_size` below 1, `output` a directory, or a suffix other than `suffixes`.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"--k {k}: the number of recommendations per session must be 1 or more")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"--batch_size {batch_size}: must be 1 or more")
    if output.is_dir():
        raise ValueError(f"--output {output} is a directory; name a file in it (e.g. {output / 'recs.parquet'})")
    if output.suffix.lower() not in suffixes:
        kinds = ("a .parquet file (session_id, item_ids, scores)" if suffix == ".parquet" else
                 "a .csv file (one row per recommendation: session_id, rank, item_id, score)" for suffix in suffixes)
        raise ValueError(f"--output {output}: unknown suffix {output.suffix or '(none)'!r}; name {' or '.join(kinds)}")


class PartsFolder:
    """``<output>.parts/`` of one run: which partitions are done, where each part goes, the join.

    Args:
        output: the file the parts are joined into.
        manifest: what the parts depend on, by content (JSON values).
        reusable: False where the run has no identity by content (a pipeline never saved):
            the parts of an earlier run are never kept.
        tag: the command's name in the lines printed (``[recommend]``).
    """

    def __init__(self, output: Path, manifest: dict[str, Any], reusable: bool = True, tag: str = "scoring") -> None:
        self.output, self.manifest, self.reusable, self.tag = output, manifest, reusable, tag
        self.folder = output.with_name(output.name + ".parts")

    def recorded(self) -> dict[str, Any] | None:
        """The manifest of the run that wrote the folder (None: no folder, or an unreadable manifest)."""
        try:
            found = json.loads((self.folder / MANIFEST).read_text())
        except (OSError, ValueError):
            return None
        return found if isinstance(found, dict) else None

    def open(self) -> None:
        """Keep the parts of a run with this manifest; start the folder over otherwise."""
        if self.folder.exists() and (not self.reusable or self.recorded() != self.manifest):
            print(f"[{self.tag}] {self.folder}: written by another model, input or settings; starting over")
            shutil.rmtree(self.folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        write_text(self.folder / MANIFEST, json.dumps(self.manifest))

    def part(self, index: int) -> Path:
        return self.folder / f"part-{index:06d}.parquet"

    def done(self, index: int) -> bool:
        """Whether partition `index` has its complete part (a part is renamed into place when complete)."""
        return self.part(index).exists()

    def join(self, count: int) -> None:
        """Join parts 0 .. `count` - 1 into the output (parquet row group by row group; CSV one row per
        recommendation), under a temporary name renamed when complete; then remove the folder."""
        names = [self.part(i) for i in range(count)]
        tmp = self.output.with_name(f".{self.output.name}.tmp")
        try:
            if self.output.suffix.lower() == ".csv":
                with pacsv.CSVWriter(tmp, _long(pq.read_table(names[0]).slice(0, 0)).schema) as writer:
                    for name in names:
                        writer.write_table(_long(pq.read_table(name)))
            else:
                schema = written_schema(pq.ParquetFile(names[0]))
                with pq.ParquetWriter(tmp, schema) as writer:
                    for name in names:
                        part = pq.ParquetFile(name)
                        for group in range(part.num_row_groups):
                            writer.write_table(part.read_row_group(group).cast(schema))
            os.replace(tmp, self.output)
        finally:
            tmp.unlink(missing_ok=True)  # only still there when joining failed
        shutil.rmtree(self.folder)


def write_part(path: Path, tables: Iterable[pa.Table]) -> int:
    """Write `tables` to `path`, one row group each, under a temporary name renamed when complete;
    returns the rows written. Nothing is left at either name when a table fails."""
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


def _long(table: pa.Table) -> pa.Table:
    """One row per recommendation: ``session_id``, ``rank`` (1 = best), ``item_id``, ``score``."""
    items, scores = table.column("item_ids").combine_chunks(), table.column("scores").combine_chunks()
    parent = pc.list_parent_indices(items)
    starts = pc.take(items.offsets, parent)
    rank = pc.add(pc.subtract(pa.array(np.arange(len(parent), dtype=np.int64)), starts.cast(pa.int64())), 1)
    return pa.table({"session_id": pc.take(table.column("session_id"), parent), "rank": rank,
                     "item_id": pc.list_flatten(items), "score": pc.list_flatten(scores)})
