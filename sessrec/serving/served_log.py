"""`ServedLog`: what each request got, appended to rotating parquet files off the request path.

A server calls `ServedLog.record` once per answered request; the call puts the request's rows in a
bounded in-memory buffer and returns at once. One background thread drains the buffer into the open
file of the log's directory, which it closes and renames when it holds `max_rows` rows or
`max_minutes` after its first row came in (whichever comes first), and opens the next on the next rows:
a row is in a closed file `max_minutes` after its request at the latest. A file is written as
``.served-<...>.parquet.tmp`` and renamed to ``served-<UTC start>-<pid>-<n>-<random>.parquet`` (`n` counts the
files the process opened, over all its logs; `random`, 8 hex digits, sets apart the files of servers on other hosts
that share the folder, whose pid and count may be this one's: containers each run as pid 1) when closed (fsynced
first), so a reader that takes ``served-*.parquet`` (`served_files`) never sees half a file; a writer killed
mid-file leaves only its ``.tmp`` file, which readers ignore.

A full buffer drops the rows of the request that would overflow it and counts them
(``rows_dropped``): logging never blocks nor fails a request. A disk that fails a write, or the closing of a
file (its footer, its rename), drops and counts the rows of the open file, and the next rows start a new file
(in the folder, made again if a clean-up removed it). ``rows_written`` counts the
rows in closed or open files; both counters are plain ints a ``/metrics`` endpoint reads. `close` writes
what the buffer holds, closes the file and stops the thread.

One row per session of a request (`SCHEMA`):

| column | type | what it holds |
|---|---|---|
| ``request_id`` | `string` | the request's id (the server's, or the client's) |
| ``session_index`` | `int32` | the session's place in its request (0-based) |
| ``session_id`` | `string`, nullable | the client's id of the session, which `sessrec monitor` joins with the event log's session column |
| ``model_version`` | `string`, nullable | the version served (null: an unversioned directory) |
| ``model_hash`` | `string`, nullable | the content hash its directory's description records (`Served.model_hash`): the model that answered, whatever its version's name; null for a recommender served without its directory |
| ``canary`` | `bool` | the session was answered by the server's canary (`sessrec.serving.canary`), not its live version |
| ``served_at`` | `timestamp[us, UTC]` | when the answer was given (wall clock) |
| ``now`` | `float64` | the request's time in seconds since the epoch (its ``now``, else its last event's time, else its arrival: `RequestSessions.now`) |
| ``n_events`` | `int32` | events the request carried for the session |
| ``items`` | `list<string>` | its last `max_events` item ids, oldest first; raw ids as text (integers in decimal) |
| ``times`` | `list<float64>`, nullable | their times in seconds, where the request gave times |
| ``recommended`` | `list<string>` | the item ids returned, best first, as text |
| ``scores`` | `list<float32>` | their scores |
| ``k`` | `int32`, nullable | the ``k`` the request asked for: an answer shorter than it holds every item the version had for the session |

Examples:
    >>> import tempfile
    >>> with ServedLog(tempfile.mkdtemp()) as log:
    ...     log.record("r1", [["a", 7]], [{"item_ids": [3, "b"], "scores": [0.9, 0.5]}], "v000001", session_ids=["s1"])
    True
    >>> log.rows_written, pq.read_table(served_files(log.directory)[0]).column("items").to_pylist()
    (1, [['a', '7']])
"""

from __future__ import annotations

import itertools
import logging
import os
import secrets
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from sessrec.saved.atomic import fsync_dir, fsync_file, normal_modes

__all__ = ["SCHEMA", "ServedLog", "served_files"]

logger = logging.getLogger(__name__)

SCHEMA = pa.schema([
    ("request_id", pa.string()),
    ("session_index", pa.int32()),
    ("session_id", pa.string()),
    ("model_version", pa.string()),
    ("model_hash", pa.string()),
    ("canary", pa.bool_()),
    ("served_at", pa.timestamp("us", tz="UTC")),
    ("now", pa.float64()),
    ("n_events", pa.int32()),
    ("items", pa.list_(pa.string())),
    ("times", pa.list_(pa.float64())),
    ("recommended", pa.list_(pa.string())),
    ("scores", pa.list_(pa.float32())),
    ("k", pa.int32()),
])
PATTERN = "served-*.parquet"
_SERIAL = itertools.count()  # the <n> of a file's name, one count for every log of the process: two logs of one
# process (a server's app built again) that open a file in the same second never give it one name


def served_files(directory: str | os.PathLike) -> list[Path]:
    """The closed files of a served log's directory, oldest first (their names start with their UTC start time)."""
    return sorted(Path(directory).glob(PATTERN))


class ServedLog:
    """Rows of what was served, buffered and written to rotating parquet files by one background thread.

    Args:
        directory: the folder of the files (created).
        max_rows: rows per file; the file is closed and renamed when it holds them.
        max_minutes: minutes after its first row came in that a file is closed, rows or not: a reader
            sees a quiet server's rows that much later at most.
        buffer_rows: rows the buffer holds at most; a request whose rows do not fit is dropped and counted.
        max_events: the last events of each session that a row keeps.
        flush_rows: rows the thread gathers before writing a row group (fewer when the buffer drains).
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        max_rows: int = 100_000,
        max_minutes: float = 10.0,
        buffer_rows: int = 10_000,
        max_events: int = 20,
        flush_rows: int = 1_000,
    ) -> None:
        for name, value in (("max_rows", max_rows), ("buffer_rows", buffer_rows), ("max_events", max_events),
                            ("flush_rows", flush_rows)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ServedLog: {name} must be an integer of 1 or more, got {value!r}")
        if flush_rows > buffer_rows:
            raise ValueError(f"ServedLog: flush_rows ({flush_rows}) must be at most buffer_rows ({buffer_rows}), or the "
                             "thread would only write on the clock")
        if not max_minutes > 0:
            raise ValueError(f"ServedLog: max_minutes must be more than 0, got {max_minutes!r}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_rows, self.max_seconds = max_rows, 60.0 * max_minutes
        self.buffer_rows, self.max_events, self.flush_rows = buffer_rows, max_events, flush_rows
        self.rows_written = 0  # rows in files (closed or open)
        self.rows_dropped = 0  # rows refused by a full buffer, or lost to a failed write
        self.files_closed = 0
        self._pending: list[dict[str, Any]] = []  # one entry per request: its columns
        self._pending_rows = 0
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._closing = False
        self._writer: pq.ParquetWriter | None = None
        self._tmp: Path | None = None
        self._final: Path | None = None
        self._opened = 0.0  # monotonic time the open file was opened
        self._file_rows = 0
        self._thread = threading.Thread(target=self._run, name="served-log", daemon=True)
        self._thread.start()

    def record(
        self,
        request_id: str,
        sessions: Sequence[Sequence[Any]],
        results: Sequence[dict[str, Sequence[Any]]],
        model_version: str | None = None,
        now: Sequence[float] | None = None,
        times: Sequence[Sequence[float]] | None = None,
        session_ids: Sequence[str | None] | None = None,
        served_at: float | None = None,
        canary: bool = False,
        session_index: Sequence[int] | None = None,
        k: int | None = None,
        model_hash: str | None = None,
    ) -> bool:
        """Buffer the rows of one answered request; False when the buffer is full (its rows counted as dropped).

        Args:
            request_id: the request's id.
            sessions: each session's raw item ids, oldest first (the request's ``sessions``).
            results: per session ``{"item_ids": [...], "scores": [...]}`` (what `Recommender.decode` returns).
            model_version: the version that answered.
            now: per session the request's time in seconds (`RequestSessions.now`); None: `served_at`.
            times: per session its events' times (the request's ``times``), or None.
            session_ids: per session the client's session id, or None.
            served_at: seconds since the epoch of the answer; default the time of this call.
            canary: the sessions were answered by the canary version.
            session_index: each session's place in its request (the request's sessions split between the
                live and the canary version); default 0, 1, ...
            k: the number of items the request asked for (None: not known).
            model_hash: the content hash of the model that answered (`Served.model_hash`).
        """
        n = len(sessions)
        if len(results) != n:
            raise ValueError(f"ServedLog.record: {n} sessions but {len(results)} results")
        entry = {"request_id": request_id, "sessions": sessions, "results": results, "model_version": model_version,
                 "model_hash": model_hash,
                 "now": now, "times": times, "session_ids": session_ids, "canary": canary,
                 "session_index": range(n) if session_index is None else session_index, "k": k,
                 "served_at": time.time() if served_at is None else served_at, "arrived": time.monotonic()}
        with self._lock:
            if self._closing:
                raise RuntimeError(f"ServedLog {self.directory}: closed")
            if self._pending_rows + n > self.buffer_rows:
                self.rows_dropped += n
                return False
            self._pending.append(entry)
            self._pending_rows += n
            if self._pending_rows >= self.flush_rows:
                self._wake.notify()
        return True

    def close(self) -> None:
        """Write the buffered rows, close and rename the open file, stop the thread (idempotent)."""
        with self._lock:
            self._closing = True
            self._wake.notify()
        self._thread.join()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # the background thread

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._closing and self._pending_rows < self.flush_rows:
                    self._wake.wait(timeout=self._wait_s())
                entries, self._pending, self._pending_rows = self._pending, [], 0
                closing = self._closing
            if entries:
                self._write(entries)
            if self._writer is not None and (closing or time.monotonic() - self._opened >= self.max_seconds):
                self._rotate()
            if closing:
                return

    def _wait_s(self) -> float:
        """Seconds until the open file is due to close (or a full period when none is open)."""
        if self._writer is None:
            return self.max_seconds
        return max(0.0, self.max_seconds - (time.monotonic() - self._opened))

    def _write(self, entries: list[dict[str, Any]]) -> None:
        try:
            table = self._table(entries)
        except Exception:  # a malformed request must not stop the log: its rows are counted as lost
            logger.exception("served log: rows that cannot be written, dropped")
            with self._lock:
                self.rows_dropped += sum(len(e["sessions"]) for e in entries)
            return
        start, arrived = 0, entries[0]["arrived"]
        try:
            while start < table.num_rows:
                if self._writer is None:
                    self._open(arrived)  # due max_minutes after its first row came in
                    arrived = time.monotonic()
                part = table.slice(start, self.max_rows - self._file_rows)
                self._writer.write_table(part)
                self._file_rows += part.num_rows
                start += part.num_rows
                with self._lock:
                    self.rows_written += part.num_rows
                if self._file_rows >= self.max_rows:
                    self._rotate()
        except OSError:  # a full or failing disk: these rows are lost, the open file is abandoned, the log goes on
            logger.exception("served log: cannot write to %s; rows dropped", self.directory)
            with self._lock:
                self.rows_dropped += table.num_rows - start
            self._abandon()

    def _open(self, since: float) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)  # a folder removed meanwhile (a clean-up) is made again
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        name = f"served-{stamp}-{os.getpid()}-{next(_SERIAL):06d}-{secrets.token_hex(4)}.parquet"
        self._final = self.directory / name
        self._tmp = self.directory / f".{name}.tmp"
        self._writer = pq.ParquetWriter(self._tmp, SCHEMA)
        self._opened, self._file_rows = since, 0

    def _abandon(self) -> None:
        """Drop the open file; its rows move from ``rows_written`` to ``rows_dropped``."""
        with self._lock:
            self.rows_written -= self._file_rows
            self.rows_dropped += self._file_rows
        self._file_rows = 0
        if self._writer is not None:
            try:
                self._writer.close()
            except OSError:
                pass
            self._tmp.unlink(missing_ok=True)
            self._writer = None

    def _rotate(self) -> None:
        """Close the open file and rename it into the readers' view; a file that cannot be closed (its footer not
        written to a full disk, a failing rename) is abandoned like a failed write (`_abandon`), and the thread goes
        on with the next rows."""
        try:
            self._writer.close()
            normal_modes(self._tmp)
            fsync_file(self._tmp)
            os.replace(self._tmp, self._final)
        except OSError:
            logger.exception("served log: cannot close %s; its rows dropped", self._tmp)
            self._abandon()
            return
        self._writer = None
        self.files_closed += 1
        try:
            fsync_dir(self.directory)
        except OSError:  # the file is in place and complete; only its name's durability is in doubt
            logger.exception("served log: cannot fsync %s", self.directory)

    def _table(self, entries: list[dict[str, Any]]) -> pa.Table:
        """The rows of `entries` as one table of `SCHEMA`."""
        counts = np.array([len(e["sessions"]) for e in entries], dtype=np.int64)
        sessions = [s for e in entries for s in e["sessions"]]
        results = [r for e in entries for r in e["results"]]
        keep = self.max_events

        def per_session(key: str) -> list:
            return [v for e in entries for v in (e[key] if e[key] is not None else [None] * len(e["sessions"]))]

        served_at = np.repeat([e["served_at"] for e in entries], counts)
        now = np.array([np.nan if v is None else float(v) for v in per_session("now")])
        now = np.where(np.isnan(now), served_at, now)
        times = per_session("times")
        timed = np.array([t is not None for t in times])
        columns = {
            "request_id": np.repeat(np.array([str(e["request_id"]) for e in entries], dtype=object), counts),
            "session_index": np.fromiter(itertools.chain.from_iterable(e["session_index"] for e in entries),
                                         dtype=np.int32, count=len(sessions)),
            "session_id": _text(per_session("session_ids")),
            "model_version": np.repeat(np.array([e["model_version"] for e in entries], dtype=object), counts),
            "model_hash": np.repeat(np.array([e["model_hash"] for e in entries], dtype=object), counts),
            "canary": np.repeat(np.array([e["canary"] for e in entries], dtype=bool), counts),
            "served_at": pa.array((served_at * 1e6).astype(np.int64), pa.timestamp("us", tz="UTC")),
            "now": now,
            "n_events": np.array([len(s) for s in sessions], dtype=np.int32),
            "items": _lists([s[-keep:] for s in sessions], pa.string()),
            "times": _lists([t[-keep:] if t is not None else () for t in times], pa.float64(), valid=timed),
            "recommended": _lists([r["item_ids"] for r in results], pa.string()),
            "scores": _lists([r["scores"] for r in results], pa.float32()),
            "k": pa.array(np.repeat(np.array([e["k"] for e in entries], dtype=object), counts), pa.int32()),
        }
        return pa.table({name: columns[name] if isinstance(columns[name], pa.Array)
                         else pa.array(columns[name], SCHEMA.field(name).type) for name in SCHEMA.names}, schema=SCHEMA)


def _text(values: list[Any]) -> pa.Array:
    """Strings of ids (integers or strings, mixed), None kept as null; each string as it is (numpy's fixed-width
    text would pad every id to the longest and drop trailing NULs)."""
    return pa.array([v if v is None or type(v) is str else str(v) for v in values], pa.string())


def _lists(lists: list[Sequence[Any]], kind: pa.DataType, valid: np.ndarray | None = None) -> pa.ListArray:
    """A list array of `kind` from Python lists, flattened in one pass; raw ids (integers or strings, mixed) as text."""
    lengths = np.fromiter(map(len, lists), dtype=np.int32, count=len(lists))
    flat = list(itertools.chain.from_iterable(lists))
    values = _text(flat) if pa.types.is_string(kind) else pa.array(np.array(flat, dtype=np.float64), kind)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    mask = None if valid is None else pa.array(~valid)
    return pa.ListArray.from_arrays(pa.array(offsets), values, mask=mask)
