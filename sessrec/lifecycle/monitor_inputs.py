"""What ``sessrec monitor`` reads (`sessrec.lifecycle.monitor`), each refused in one line naming the file when it
cannot serve: the served log's rows (`read_served`: its ``served-*.parquet`` files, a damaged one named), the
reference's training vocabulary (`reference_vocab`, which must hold items the log recommended: `check_reference`)
and the positions of the events in their sessions (`event_positions`, from event files no two of which hold one
event: `check_disjoint`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from sessrec.data import frame
from sessrec.data.periods import to_seconds
from sessrec.data.readers import scan_events
from sessrec.data.schema import Schema
from sessrec.data.vocab import ItemVocab
from sessrec.saved.versions import resolve
from sessrec.scoring.output import same_file
from sessrec.serving.served_log import SCHEMA, served_files

__all__ = ["NO_VERSION", "check_disjoint", "check_reference", "event_positions", "product_ids", "read_served",
           "reference_vocab"]

NO_VERSION = "(unversioned)"  # the model_version of rows served from an unversioned directory


def read_served(directory: str, since: str | None, until: str | None, versions: list[str] | None) -> pa.Table:
    """The rows of a served log's closed files in [since, until) of the requested versions."""
    if since is not None and until is not None and to_seconds(since, "since") >= to_seconds(until, "until"):
        raise ValueError(f"since {since} is not before until {until}: the period [since, until) holds no time")
    files = served_files(directory)
    if not files:
        raise FileNotFoundError(f"{directory}: no served log files (served-*.parquet); is it the folder a ServedLog "
                                "writes, and has that log closed a file yet?")
    now = ds.field("now")
    keep = None
    if since is not None:
        keep = now >= to_seconds(since, "since")
    if until is not None:
        keep = (now < to_seconds(until, "until")) if keep is None else keep & (now < to_seconds(until, "until"))
    for f in files:
        try:
            found = pq.read_schema(f)
        except (pa.ArrowException, OSError) as err:
            raise damaged(f, err) from None
        if not found.equals(SCHEMA):
            raise ValueError(f"{f}: not a served log file; its columns are {found.names}, expected {SCHEMA.names}")
    try:
        table = ds.dataset([str(f) for f in files], schema=SCHEMA, format="parquet").to_table(filter=keep)
    except (pa.ArrowException, OSError):  # a damaged page: the file is found by reading them one at a time
        for f in files:
            try:
                ds.dataset(str(f), schema=SCHEMA, format="parquet").to_table(filter=keep)
            except (pa.ArrowException, OSError) as its:
                raise damaged(f, its) from None
        raise
    table = table.set_column(table.schema.get_field_index("model_version"), "model_version",
                             pc.fill_null(table.column("model_version"), NO_VERSION))
    period = f"between {since or 'the start'} and {until or 'the end'}"
    if table.num_rows == 0:
        raise ValueError(f"{directory}: no served rows {period}")
    if versions is not None:
        present = set(pc.unique(table.column("model_version")).to_pylist())
        for version in versions:
            if version not in present:
                raise ValueError(f"{directory}: version {version!r} has no rows {period}; "
                                 f"versions with rows: {', '.join(sorted(present))}")
        table = table.filter(pc.is_in(table.column("model_version"), pa.array(versions, pa.string())))
    check_one_model_a_version(table, files, directory)
    return table


def check_one_model_a_version(table: pa.Table, files: list[Path], directory: str) -> None:
    """Refuse served rows of one version name from two models (two `model_hash`es): servers of two model
    directories writing into one folder, whose versions are counted apart by their directories only; the
    reports would add the two models' requests up under one version. Rows of no hash (a recommender served
    without its directory) are not counted."""
    pairs = pa.table({"version": table.column("model_version"), "hash": table.column("model_hash")}).filter(
        pc.is_valid(table.column("model_hash"))).group_by(["version", "hash"]).aggregate([]).sort_by("version")
    versions = pairs.column("version").to_pylist()
    for version in dict.fromkeys(versions):
        hashes = [h for v, h in zip(versions, pairs.column("hash").to_pylist()) if v == version][:2]
        if len(hashes) > 1:
            where = [next((f.name for f in files if h in pq.read_table(f, columns=["model_hash"]).column(0).to_pylist()),
                          "?") for h in hashes]
            raise ValueError(
                f"{directory}: version {version} was served by two models ({hashes[0][:19]}... in {where[0]}, {hashes[1][:19]}... in "
                f"{where[1]}): servers of two model directories write this served log; give each its own --served-log"
            )


def damaged(path: Path, err: Exception) -> ValueError:
    """The one line of a served log file that cannot be read."""
    return ValueError(f"{path}: a served log file that cannot be read ({' '.join(str(err).split())}); a closed file is "
                      "renamed complete, so it was damaged after: move it out of the folder to monitor the others")


def reference_vocab(reference: str) -> ItemVocab:
    """The training vocabulary (with counts) of a model directory or a prepared dataset."""
    must = "reference must be a model directory (sessrec fit) or a prepared dataset folder holding vocab.parquet (sessrec prepare)"
    if Path(reference).exists() and not Path(reference).is_dir():
        raise NotADirectoryError(f"{reference}: a file, not a folder; {must}")
    if not Path(reference).exists():
        raise FileNotFoundError(f"{reference}: no such folder; {must}")
    path = resolve(reference) / "vocab.parquet"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no vocabulary; {must}")
    return ItemVocab.load(path)


def check_reference(served: pa.Table, vocab: ItemVocab, reference: str, directory: str) -> None:
    """Refuse a reference that holds none of the items recommended in the served log: not the vocabulary of the model
    served (whose products every recommendation is), but another catalogue's, against which every request would be
    unknown, the PSI undefined (a crossed ``psi_max``: a retrain for nothing) and the coverage 0."""
    recommended = served.column("recommended").combine_chunks().flatten()
    if len(recommended) and not pc.any(pc.is_in(recommended, value_set=product_ids(vocab))).as_py():
        raise ValueError(f"{reference}: none of the {len(recommended)} items recommended in the served log {directory} "
                         f"is among its vocabulary's {vocab.num_products} products (e.g. {product_ids(vocab)[0]}; "
                         f"the log's first {recommended[0]}): a reference of another catalogue than the model served; "
                         "name the served model directory")


def event_positions(paths: list[str], schema: Schema, delimiter: str | None) -> pa.Table:
    """``session_id``, ``position`` (0-based, in time order) and ``item_id`` of every event, ids as text."""
    if not paths:
        raise ValueError("monitor: paths must name at least one event file")
    for i, path in enumerate(paths):
        for earlier in paths[:i]:
            if same_file(path, earlier):
                raise ValueError(f"monitor: paths names the event file {earlier} twice ({path}): its events would be "
                                 "read twice, and every session's positions would shift")
    tables = [pa.concat_tables(list(scan_events(path, schema, delimiter))) for path in paths]
    check_disjoint(tables, paths, schema)
    events = frame.sort_events(pa.concat_tables(tables), schema)
    session = pc.cast(events.column(schema.session_id), pa.string()).combine_chunks()
    starts = np.flatnonzero(np.concatenate([[True], pc.not_equal(session[1:], session[:-1]).to_numpy(zero_copy_only=False)]))
    run_start = np.repeat(starts, np.diff(np.concatenate([starts, [len(session)]])))
    return pa.table({
        "session_id": session,
        "position": pa.array(np.arange(len(session)) - run_start, pa.int32()),
        "item_id": pc.cast(events.column(schema.item_id), pa.string()),
    })


def check_disjoint(tables: list[pa.Table], paths: list[str], schema: Schema) -> None:
    """Refuse event files of which two hold one event (the same session, item and time): exports that overlap
    would hold each of its events twice and shift the positions after it, so that a request would be judged
    on its own last event as the next one. A file's own repeated events are its sessions' and are kept."""
    if len(tables) < 2 or schema.timestamp is None:
        return
    # only a session that two files hold can have an event in both: compared alone (a few sessions a file boundary
    # cuts), not every event of the log
    sessions = [pc.unique(pc.cast(t.column(schema.session_id), pa.string())) for t in tables]
    counts = pa.concat_arrays([s.combine_chunks() if isinstance(s, pa.ChunkedArray) else s for s in sessions]).value_counts()
    shared = counts.field("values").filter(pc.greater(counts.field("counts"), 1))
    if len(shared) == 0:
        return
    keys = [schema.session_id, schema.item_id, schema.timestamp]
    parts = []
    for i, t in enumerate(tables):
        t = t.filter(pc.is_in(pc.cast(t.column(schema.session_id), pa.string()), value_set=shared))
        parts.append(pa.table({**{f"k{j}": pc.cast(t.column(key), pa.string()) for j, key in enumerate(keys)},
                               "file": pa.array(np.full(t.num_rows, i, dtype=np.int32))}))
    tagged = pa.concat_tables(parts)
    files = tagged.group_by(["k0", "k1", "k2"]).aggregate([("file", "min"), ("file", "max")])
    both = files.filter(pc.not_equal(files.column("file_min"), files.column("file_max")))
    if both.num_rows:
        first = both.slice(0, 1).to_pylist()[0]
        raise ValueError(f"{paths[first['file_max']]}: holds events that {paths[first['file_min']]} holds too "
                         f"({both.num_rows} of them, one: {schema.session_id} {first['k0']!r}, {schema.item_id} "
                         f"{first['k1']!r}, {schema.timestamp} {first['k2']!r}): event files that overlap would read "
                         "their events twice and shift every session's positions; give each event once")


def product_ids(vocab: ItemVocab) -> pa.Array:
    """The raw ids of the vocabulary's products (not its virtual keys), as text, in model-id order."""
    return pc.cast(vocab.raw_ids.slice(0, len(vocab.raw_ids) - vocab.num_virtual), pa.string())
