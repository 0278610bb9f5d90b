"""The served log: rotation by rows and by minutes, a full buffer dropping and counting, close flushing,
files that pyarrow reads with the documented schema, and no half file in the readers' view after a kill."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sessrec.serving.served_log import SCHEMA, ServedLog, served_files

REPO = Path(__file__).resolve().parents[1]


def one(i: int) -> tuple[list[list], list[dict]]:
    """A request of one session (items i, "x"i) answered by two items."""
    return [[i, f"x{i}"]], [{"item_ids": [i + 1, "y"], "scores": [0.5, 0.25]}]


def first_lost_then_kept(log, folder: Path) -> None:
    """Record a row whose file fails (dropped and counted), then one that is written; only the second is read back."""
    log.record("lost", *one(0))
    deadline = time.monotonic() + 10
    while log.rows_dropped == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    log.record("kept", *one(1))
    log.close()
    assert (log.rows_written, log.rows_dropped) == (1, 1)
    assert read(folder).column("request_id").to_pylist() == ["kept"]
    assert not list(folder.glob(".*.tmp"))



def read(directory: Path) -> pa.Table:
    return pa.concat_tables([pq.read_table(f) for f in served_files(directory)])


def test_rows_schema_and_rotation_by_rows(tmp_path: Path) -> None:
    log = ServedLog(tmp_path, max_rows=3, max_minutes=60)
    for i in range(7):
        sessions, results = one(i)
        assert log.record(f"r{i}", sessions, results, model_version="v000002", now=[1.7e9 + i],
                          times=[[1.7e9 + i - 1, 1.7e9 + i]], session_ids=[f"s{i}"], served_at=1.8e9)
    log.close()
    files = served_files(tmp_path)
    assert [pq.read_metadata(f).num_rows for f in files] == [3, 3, 1]
    assert not list(tmp_path.glob(".*.tmp"))
    table = read(tmp_path)
    assert table.schema == SCHEMA
    assert table.column("request_id").to_pylist() == [f"r{i}" for i in range(7)]
    row = table.slice(4, 1).to_pylist()[0]
    assert row["items"] == ["4", "x4"] and row["times"] == [1.7e9 + 3, 1.7e9 + 4]
    assert row["recommended"] == ["5", "y"] and row["scores"] == [0.5, 0.25]
    assert (row["session_id"], row["model_version"], row["now"], row["n_events"]) == ("s4", "v000002", 1.7e9 + 4, 2)
    assert row["served_at"].timestamp() == 1.8e9
    assert (log.rows_written, log.rows_dropped, log.files_closed) == (7, 0, 3)


def test_a_request_of_several_sessions_keeps_their_last_events(tmp_path: Path) -> None:
    with ServedLog(tmp_path, max_events=2) as log:
        log.record("r", [[1, 2, 3], ["a"]], [{"item_ids": [9], "scores": [1.0]}, {"item_ids": [8], "scores": [2.0]}],
                   served_at=1.7e9)
    table = read(tmp_path)
    assert table.column("session_index").to_pylist() == [0, 1]
    assert table.column("items").to_pylist() == [["2", "3"], ["a"]]
    assert table.column("n_events").to_pylist() == [3, 1]
    assert table.column("now").to_pylist() == [1.7e9, 1.7e9]  # no request time: the time served
    assert table.column("times").to_pylist() == [None, None]
    assert table.column("session_id").to_pylist() == [None, None]


def test_two_logs_of_one_process_in_one_second_keep_each_others_files(tmp_path: Path, monkeypatch) -> None:
    """A server restarted in its process (an app built again) logs into the same folder: its first file must not
    replace the first file of the log before it, which has the same UTC start and pid."""
    from sessrec.serving import served_log

    monkeypatch.setattr(served_log.time, "strftime", lambda fmt, t=None: "20240101T000000Z")
    for i in range(2):
        with ServedLog(tmp_path) as log:
            log.record(f"r{i}", *one(i), served_at=1.7e9)
    assert read(tmp_path).column("request_id").to_pylist() == ["r0", "r1"]


def test_servers_of_one_pid_on_two_hosts_sharing_the_folder_keep_each_others_rows(tmp_path: Path, monkeypatch) -> None:
    """Two containers, each running the server as pid 1, log into one shared folder: their first files open in the
    same second with the same pid and count. Both wrote one ``.tmp`` file, which the second truncated, and renamed it
    to one name: a file that no reader could open (its 3 rows counted written) and a writer thread dead of the
    missing ``.tmp``. Each file now has a name of its own."""
    import itertools

    from sessrec.serving import served_log

    monkeypatch.setattr(served_log.time, "strftime", lambda fmt, t=None: "20240101T000000Z")
    logs = []
    for host in ("a", "b"):  # the other host's process counts its files from 0 too
        monkeypatch.setattr(served_log, "_SERIAL", itertools.count())
        logs.append(ServedLog(tmp_path, flush_rows=1, max_minutes=60))
        logs[-1].record(f"{host}1", *one(0))
        deadline = time.monotonic() + 10
        while logs[-1].rows_written < 1 and time.monotonic() < deadline:
            time.sleep(0.01)  # both files open before either closes
    logs[0].record("a2", *one(1))
    for log in logs:
        log.close()
    assert sorted(read(tmp_path).column("request_id").to_pylist()) == ["a1", "a2", "b1"]
    assert len(served_files(tmp_path)) == 2 and not list(tmp_path.glob(".*.tmp"))


def test_rotation_by_minutes_closes_a_file_of_a_quiet_log(tmp_path: Path) -> None:
    log = ServedLog(tmp_path, max_minutes=0.002)  # 0.12 s
    log.record("r0", *one(0))
    deadline = time.monotonic() + 10
    while not served_files(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [pq.read_metadata(f).num_rows for f in served_files(tmp_path)] == [1]  # closed without close()
    log.record("r1", *one(1))
    log.close()
    assert [pq.read_metadata(f).num_rows for f in served_files(tmp_path)] == [1, 1]


def test_a_full_buffer_drops_the_request_and_counts_its_rows(tmp_path: Path) -> None:
    log = ServedLog(tmp_path, buffer_rows=3, flush_rows=3, max_minutes=60)  # the thread waits for 3 rows
    two = [[1], [2]], [{"item_ids": [3], "scores": [1.0]}] * 2
    assert log.record("a", *two)
    assert not log.record("b", *two)  # 2 + 2 rows > 3: refused whole, at once
    assert log.rows_dropped == 2
    assert log.record("c", *one(5))  # 3 rows: the thread drains them
    log.close()
    assert read(tmp_path).column("request_id").to_pylist() == ["a", "a", "c"]
    assert (log.rows_written, log.rows_dropped) == (3, 2)
    with pytest.raises(RuntimeError, match="closed"):
        log.record("d", *one(6))


def test_bad_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_rows must be an integer of 1 or more, got 0"):
        ServedLog(tmp_path, max_rows=0)
    with pytest.raises(ValueError, match=r"flush_rows \(5\) must be at most buffer_rows \(4\)"):
        ServedLog(tmp_path, buffer_rows=4, flush_rows=5)
    with ServedLog(tmp_path) as log, pytest.raises(ValueError, match="2 sessions but 1 results"):
        log.record("r", [[1], [2]], [{"item_ids": [3], "scores": [1.0]}])


def test_a_writer_killed_mid_file_leaves_no_half_file_in_the_readers_view(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import time
        from sessrec.serving.served_log import ServedLog
        log = ServedLog({str(tmp_path)!r}, max_rows=5, flush_rows=1, max_minutes=60)
        for i in range(12):
            log.record(f"r{{i}}", [[i]], [{{"item_ids": [i], "scores": [1.0]}}])
        while log.rows_written < 12:
            time.sleep(0.01)
        print("written", flush=True)
        time.sleep(60)
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env) as proc:
        try:
            assert proc.stdout.readline().strip() == "written"
        finally:
            os.kill(proc.pid, signal.SIGKILL)
    assert [pq.read_metadata(f).num_rows for f in served_files(tmp_path)] == [5, 5]  # the open file is not among them
    half = list(tmp_path.glob(".served-*.parquet.tmp"))
    assert len(half) == 1
    with pytest.raises((pa.ArrowInvalid, OSError)):
        pq.read_table(half[0])  # its footer was never written
    assert read(tmp_path).column("request_id").to_pylist() == [f"r{i}" for i in range(10)]


def test_a_failing_disk_drops_and_counts_rows_and_the_log_goes_on(tmp_path: Path, monkeypatch) -> None:
    from sessrec.serving import served_log

    real, calls = served_log.pq.ParquetWriter, []

    def writer(path, schema):  # the first file cannot be opened: a full disk
        calls.append(path)
        if len(calls) == 1:
            raise OSError(28, "No space left on device")
        return real(path, schema)

    monkeypatch.setattr(served_log.pq, "ParquetWriter", writer)
    log = ServedLog(tmp_path, flush_rows=1, max_minutes=60)
    first_lost_then_kept(log, tmp_path)


@pytest.mark.parametrize("failing", ["close", "replace"])
def test_a_file_that_cannot_be_closed_drops_and_counts_its_rows_and_the_log_goes_on(tmp_path: Path, monkeypatch,
                                                                                   failing: str) -> None:
    """A file closed on the clock whose footer cannot be written (a full disk) or whose rename fails: the writer
    thread died of the OSError, so every later row was lost while rows_written still counted the first file's and
    rows_dropped stayed 0 (what /metrics shows), and the ``.tmp`` file stayed."""
    from sessrec.serving import served_log

    calls = []
    if failing == "replace":
        real = served_log.os.replace

        def replace(a, b):
            calls.append(a)
            if len(calls) == 1:
                raise OSError(5, "Input/output error")
            return real(a, b)

        monkeypatch.setattr(served_log.os, "replace", replace)
    else:
        real = served_log.pq.ParquetWriter

        class Writer(real):
            def close(self) -> None:
                calls.append(self)
                if len(calls) == 1:
                    raise OSError(28, "No space left on device")
                super().close()

        monkeypatch.setattr(served_log.pq, "ParquetWriter", Writer)
    log = ServedLog(tmp_path, flush_rows=1, max_minutes=0.002)  # closed on the clock after 0.12 s
    first_lost_then_kept(log, tmp_path)


def test_a_log_whose_folder_was_removed_makes_it_again(tmp_path: Path) -> None:
    """A clean-up removed the served log's folder while the server ran: every later row was dropped (the writer
    could not open a file), until the server restarted. The next file makes the folder again."""
    import shutil

    log = ServedLog(tmp_path / "log", flush_rows=1, max_minutes=60)
    shutil.rmtree(tmp_path / "log")  # removed after the log was opened, before its next file
    log.record("after", *one(1))
    log.close()
    assert (log.rows_written, log.rows_dropped) == (1, 0)
    assert read(tmp_path / "log").column("request_id").to_pylist() == ["after"]


def test_ids_are_kept_as_given_however_long_and_with_trailing_nuls(tmp_path: Path) -> None:
    """A request's text is written as it came: a trailing NUL kept (``"s\\x00"`` is not the session ``"s"``), and
    a long id among many short ones costs its own length only (numpy's fixed-width text padded them all to it: 45 s
    and 7.7 GB for one id of 100,000 characters among 20,000)."""
    long_id = "q" * 20_000
    with ServedLog(tmp_path, max_events=5_000) as log:
        log.record("r", [["a\x00", "\x00", 7], [long_id] + ["b"] * 4_999],
                   [{"item_ids": ["c\x00", 3], "scores": [1.0, 0.5]}, {"item_ids": [1], "scores": [1.0]}],
                   session_ids=["s\x00", long_id], served_at=1.7e9)
    row, other = read(tmp_path).to_pylist()
    assert (row["items"], row["recommended"], row["session_id"]) == (["a\x00", "\x00", "7"], ["c\x00", "3"], "s\x00")
    assert other["session_id"] == long_id and other["items"][0] == long_id and len(other["items"]) == 5_000
