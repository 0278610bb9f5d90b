"""``sessrec prepare``: a source's sessions, splits and vocabulary computed once and written as a prepared
dataset (`PreparedWriter`), which `PreparedSource` reads for ``fit``, ``test`` and ``predict``.

Engines (`prepare`'s ``engine``), all giving the same files, byte for byte:

- ``memory``: the source's own ``load()`` and `ItemVocab.fit`, in memory; any source.
- ``local``: an event log (`EventLogSource`) prepared partition by partition on this machine within a
  memory budget (`LocalEngine`, the plan of `sessrec.data.prepared.plan`).
- ``dask``: the same plan on a Dask cluster (`DaskEngine`): pandas partitions on CPUs, cuDF partitions
  on GPUs.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Literal

from sessrec.data import frame
from sessrec.data.columns import no_such
from sessrec.data.prepared.dataset import Layout, PreparedSource, PreparedWriter, read_manifest
from sessrec.data.prepared.plan import COUNT_PEAK_PER_ROW, CountFold
from sessrec.data.schema import SchemaError
from sessrec.data.sources import EventLogSource, SessionSource
from sessrec.data.vocab import ItemVocab
from sessrec.saved.registry import config_of

__all__ = ["Layout", "PreparedSource", "PreparedWriter", "parse_bytes", "prepare", "read_manifest"]

Engine = Literal["memory", "local", "dask"]
_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "kib": 2**10, "m": 1e6, "mb": 1e6, "mib": 2**20,
          "g": 1e9, "gb": 1e9, "gib": 2**30, "t": 1e12, "tb": 1e12, "tib": 2**40}


def parse_bytes(value: str | int) -> int:
    """``4GiB``, ``500MB``, ``2e9`` or an integer, as bytes."""
    if isinstance(value, int):
        return value
    match = re.fullmatch(r"\s*([0-9.eE+]+)\s*([A-Za-z]*)\s*", str(value))
    try:
        size = float(match.group(1)) * _UNITS[match.group(2).lower()] if match is not None else math.nan
    except (ValueError, KeyError):  # '1e', '1.2.3', an unknown unit
        size = math.nan
    if not math.isfinite(size):  # also '1e999'
        raise ValueError(f"memory_budget: {value!r} is not a size (e.g. 4GiB, 500MB, 2000000000)")
    return int(size)


def prepare(
    source: SessionSource,
    out: str,
    engine: Engine = "local",
    memory_budget: str = "4GiB",
    workers: int = 2,
    partitions: int | None = None,
    scheduler: str | None = None,
    backend: Literal["pandas", "cudf"] = "pandas",
    min_item_count: int = 1,
    max_vocab_size: int | None = None,
    part_sessions: int = 1_000_000,
    row_group_sessions: int = 65_536,
    overwrite: bool = False,
) -> Path:
    """Prepare a source's sessions once: splits in parquet parts, the vocabulary and a manifest with hashes.

    Args:
        source: the sessions' source (a data recipe's ``data.source``).
        out: the prepared dataset's directory (written under a temporary name, then renamed).
        engine: ``memory`` (the source's ``load()``, any source), ``local`` (an event log, partition by
            partition within `memory_budget`) or ``dask`` (the same plan on a Dask cluster).
        memory_budget: peak memory of the ``local`` engine, and of each ``dask`` worker of a local cluster.
        workers: ``local``: threads; ``dask``: workers of the local cluster started when `scheduler` is None.
        partitions: ``local``, ``dask``: hash partitions of the events; None: enough for the budget (with the
            ``memory`` engine, refused unless None).
        scheduler: ``dask``: address of a running Dask scheduler (``tcp://host:8786``); None: a local cluster
            (refused with another engine).
        backend: ``dask``: ``pandas`` partitions on CPUs or ``cudf`` partitions on GPUs (dask-cudf; ``cudf`` is
            refused with another engine).
        min_item_count: the vocabulary's minimum training count (the data module's ``min_item_count``).
        max_vocab_size: the vocabulary's size limit (the data module's ``max_vocab_size``).
        part_sessions: sessions in each part file.
        row_group_sessions: sessions in each parquet row group.
        overwrite: replace an existing dataset at `out`.

    Returns:
        The dataset's directory.
    """
    if engine not in ("memory", "local", "dask"):
        raise ValueError(f"engine must be 'memory', 'local' or 'dask', got {engine!r}")
    if engine != "memory" and not isinstance(source, EventLogSource):
        raise ValueError(
            f"engine {engine!r} prepares an event log (sessrec.data.EventLogSource) partition by partition; "
            f"{type(source).__name__} is prepared whole: use --engine memory"
        )
    if engine == "memory" and partitions is not None:
        raise ValueError(f"--partitions {partitions} needs --engine local or dask (the memory engine loads the source "
                         "whole, in no partitions)")
    if engine != "dask" and (scheduler is not None or backend != "pandas"):
        given = f"--scheduler {scheduler}" if scheduler is not None else f"--backend {backend}"
        raise ValueError(f"{given} needs --engine dask (the {engine} engine runs in this process)")
    if max_vocab_size is not None and max_vocab_size < 1:
        raise ValueError(f"max_vocab_size must be >= 1, or None for no limit; got {max_vocab_size}")
    budget = parse_bytes(memory_budget)
    layout = Layout(part_sessions, row_group_sessions)
    # an event log is read partition by partition while the dataset is written: its files must outlive the old dataset
    reads = [source.path, source.test_path, source.valid_path] if isinstance(source, EventLogSource) else []
    for read in (r for r in reads if r is not None and not Path(r).is_file()):
        if Path(read).exists():
            raise SchemaError(f"{read}: is a folder, expected a CSV/TSV or parquet file")
        raise no_such(read)
    writer = PreparedWriter(out, layout, overwrite=overwrite, inputs=[r for r in reads if r is not None])
    try:
        if engine == "memory":
            vocab = _prepare_in_memory(source, writer, min_item_count, max_vocab_size)
        else:
            if engine == "local":
                from sessrec.data.prepared.local import LocalEngine

                runner = LocalEngine(budget, workers, partitions)
            else:
                from sessrec.data.prepared.cluster import DaskEngine

                runner = DaskEngine(budget, workers, partitions, scheduler, backend)
            counts = CountFold(min(4_000_000, budget // 8 // COUNT_PEAK_PER_ROW))  # an eighth of the budget
            for result in runner.run(source, writer.directory, layout):
                counts.add(result)
                writer.add(result.written.name.partition("/")[0], result.written)
            vocab = counts.vocab(min_item_count, max_vocab_size)
        vocab.check_products(min_item_count, str(getattr(source, "path", type(source).__name__)))
        settings = {"min_item_count": min_item_count, "max_vocab_size": max_vocab_size}
        return writer.finish(vocab, config_of(source), settings)
    except BaseException:
        writer.abort()
        raise


def _prepare_in_memory(source: SessionSource, writer: PreparedWriter, min_count: int, max_size: int | None) -> ItemVocab:
    splits = source.load()
    values, _ = frame.list_offsets(splits.train.column(frame.ITEMS))
    virtual = None
    if frame.VIRTUAL in splits.train.column_names:
        virtual = frame.list_offsets(splits.train.column(frame.VIRTUAL))[0].to_numpy(zero_copy_only=False).astype(bool)
    for split in ("train", "valid", "test"):
        writer.write_split(split, getattr(splits, split))
    return ItemVocab.fit(values, min_count, max_size, virtual=virtual)
