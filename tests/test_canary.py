"""A canary (`sessrec.serving.canary`, ``sessrec serve --canary``): a stable share of the sessions
answered by another version of the served directory, ended by ``promote`` or ``rollback``.

Two tiny co-visitation pipelines over one vocabulary (as in tests/test_serve.py) are versions v000001
and v000002 of one directory. Requests go through FastAPI's TestClient; the slow test serves with
``sessrec serve --workers 2`` and ends the canary from the command line while clients send requests.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from sessrec.cli import promote, rollback
from sessrec.data import SyntheticSource
from sessrec.pipeline.pipeline import Pipeline
from sessrec.pipeline.retrieval.covisitation import CoVisitation
from sessrec.saved.versions import CANARY, VersionedDirectory, canary
from sessrec.serving.app import build_app
from sessrec.serving.canary import canary_sessions, load_canary, load_canary_version
from sessrec.serving.recommender import Served
from sessrec.serving.served_log import ServedLog
from sessrec.serving.server import serve, start_canary
from sessrec.tasks import SessionDataModule

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
K = 5


@pytest.fixture(scope="module")
def data() -> SessionDataModule:
    return SessionDataModule(source=SyntheticSource(num_sessions=400, num_items=60, days=10), max_length=10)


def covisitation(data: SessionDataModule, sessions: int | None = None) -> Pipeline:
    train, _ = data.tensors("train")
    return Pipeline(data.vocab, {"covisitation": (CoVisitation().fit(train[:sessions], data.num_items), 20)},
                    max_length=10, max_candidates=20)


@pytest.fixture(scope="module")
def live(data: SessionDataModule) -> Pipeline:
    return covisitation(data)


@pytest.fixture(scope="module")
def candidate(data: SessionDataModule) -> Pipeline:
    """Another model over the same vocabulary: co-visitation of a tenth of the training sessions."""
    return covisitation(data, 40)


@pytest.fixture(scope="module")
def sessions(live: Pipeline) -> list[list[int]]:
    raw = live.vocab.raw_ids.slice(2).to_pylist()
    return [raw[i : i + 1 + i % 4] for i in range(16)]


@pytest.fixture
def model_dir(live: Pipeline, candidate: Pipeline, tmp_path: Path) -> Path:
    """v000001 (live) and v000002 (the candidate) of one directory; v000001 current."""
    root = tmp_path / "model"
    live.save_pretrained(root)
    candidate.save_pretrained(root)
    VersionedDirectory(root).rollback()
    assert VersionedDirectory(root).current_version() == "v000001"
    return root


def answers(pipe: Pipeline, sessions: list) -> list:
    return json.loads(json.dumps(pipe.recommend(sessions, k=K)))


def sample(text: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


def wait_until(condition, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


def test_a_stable_tenth_of_the_sessions_by_a_hash_of_their_ids() -> None:
    ids = [f"session-{i}" for i in range(2000)]
    chosen = canary_sessions(ids, 0.1)
    assert chosen.sum() == 187  # BLAKE2b of each id: the same count on every machine and run
    assert abs(chosen.sum() - 200) < 4 * np.sqrt(2000 * 0.1 * 0.9)  # binomial: within 4 standard deviations
    assert np.array_equal(canary_sessions(ids[::-1], 0.1), chosen[::-1])  # each id alone decides, in any request
    assert np.array_equal(canary_sessions(ids, 0.2) & chosen, chosen)  # a larger share keeps the sessions it had
    assert canary_sessions([7, "7"], 0.5).tolist() == [canary_sessions(["7"], 0.5)[0]] * 2  # ids as text
    assert not canary_sessions(None, 0.99, 3).any()  # sessions without an id: the live version


def test_both_versions_answer_their_sessions_and_the_log_and_metrics_say_which(
        model_dir, live, candidate, sessions, tmp_path) -> None:
    start_canary(model_dir, "v000002", 0.5)
    ids = [f"s{i}" for i in range(len(sessions))]
    on_canary = canary_sessions(ids, 0.5)
    assert 0 < on_canary.sum() < len(ids)
    served = Served.load(model_dir)
    app = build_app(served, model_dir=model_dir, reload_interval_s=0.05, served_log=ServedLog(tmp_path / "log"),
                    canary=load_canary(model_dir, served))
    with TestClient(app) as c:
        health = c.get("/health").json()
        alone = [c.post("/recommend", json={"session": s, "k": K, "session_ids": i}) for s, i in zip(sessions, ids)]
        again = c.post("/recommend", json={"session": sessions[3], "k": K, "session_ids": ids[3]})
        mixed = c.post("/recommend", json={"sessions": sessions, "k": K, "session_ids": ids,
                                           "times": [[1.7e9 + j for j in range(len(s))] for s in sessions]})
        anonymous = c.post("/recommend", json={"sessions": sessions, "k": K})
        metrics = c.get("/metrics").text
    assert health["version"] == "v000001" and health["canary"] == {"version": "v000002", "share": 0.5, "error": None}
    version = ["v000002" if c else "v000001" for c in on_canary]
    expected = [answers(candidate if c else live, [s])[0] for s, c in zip(sessions, on_canary)]
    assert [r.headers["x-model-version"] for r in alone] == version
    assert [r.json()["recommendations"][0] for r in alone] == expected
    assert again.headers["x-model-version"] == version[3] and again.json() == alone[3].json()
    assert mixed.headers["x-model-version"] == ",".join(version)  # one request split between the versions
    assert mixed.json()["recommendations"] == expected
    assert anonymous.headers["x-model-version"] == "v000001"
    assert anonymous.json()["recommendations"] == answers(live, sessions)
    log = pq.read_table(tmp_path / "log").to_pylist()
    split = sorted((r for r in log if r["request_id"] == mixed_id(log, len(sessions))), key=lambda r: r["session_index"])
    assert [(r["session_index"], r["session_id"], r["model_version"], r["canary"]) for r in split] == [
        (i, ids[i], version[i], bool(on_canary[i])) for i in range(len(ids))]
    assert [r["times"] for r in split] == [[1.7e9 + j for j in range(len(s))] for s in sessions]
    assert {r["k"] for r in log} == {K}  # the k each request asked for: a shorter answer is all its version had
    canary_rows = sum(r["canary"] for r in log)
    assert canary_rows == 2 * on_canary.sum() + on_canary[3]
    assert all(r["model_version"] == ("v000002" if r["canary"] else "v000001") for r in log)
    hashes = {v: json.loads((Path(model_dir) / "versions" / v / "pipeline.json").read_text())["hash"]
              for v in ("v000001", "v000002")}  # what each version's description records of itself
    assert hashes["v000001"] != hashes["v000002"] and all(r["model_hash"] == hashes[r["model_version"]] for r in log)
    n_canary = int(2 * on_canary.sum() + on_canary[3])
    assert sample(metrics, "sessrec_version_sessions_total", version="v000002", role="canary") == n_canary
    assert sample(metrics, "sessrec_version_sessions_total", version="v000001", role="live") == 3 * len(ids) + 1 - n_canary
    assert sample(metrics, "sessrec_version_request_duration_seconds_count", version="v000002", role="canary") == (
        on_canary.sum() + on_canary[3] + 1)


def mixed_id(log: list[dict], n: int) -> str:
    """The request id of the one logged request whose sessions went to both versions."""
    by_request: dict[str, set] = {}
    for r in log:
        by_request.setdefault(r["request_id"], set()).add(r["canary"])
    (found,) = [rid for rid, kinds in by_request.items() if kinds == {True, False}]
    return found


def test_promote_and_rollback_end_the_canary_without_a_failed_request(model_dir, live, candidate, sessions,
                                                                      capsys) -> None:
    """The must-show, in process: a client sends requests all along; `sessrec promote` makes the canary
    answer every session, a new canary starts, `sessrec rollback` drops it; every request is answered
    (200) by the version its header names, with that version's lists."""
    ids = [f"s{i}" for i in range(len(sessions))]
    start_canary(model_dir, "v000002", 0.5)
    served = Served.load(model_dir)
    app = build_app(served, model_dir=model_dir, reload_interval_s=0.02, canary=load_canary(model_dir, served))
    replies: list = []
    stop = threading.Event()

    def client_loop(c: TestClient) -> None:
        i = 0
        while not stop.is_set():
            j = i % len(sessions)
            reply = c.post("/recommend", json={"session": sessions[j], "k": K, "session_ids": ids[j]})
            replies.append((j, reply.status_code, reply.headers.get("x-model-version"), reply.json()))
            i += 1

    with TestClient(app) as c:
        sender = threading.Thread(target=client_loop, args=(c,))
        sender.start()
        try:
            wait_until(lambda: len(replies) > 50)
            assert promote(str(model_dir)) == "v000002"
            wait_until(lambda: c.get("/health").json()["canary"] is None)
            promoted, after_promote = c.get("/health").json(), len(replies)
            wait_until(lambda: len(replies) > after_promote + 50)
            before_canary = len(replies)
            start_canary(model_dir, "v000001", 0.5)  # the old version as the next canary
            wait_until(lambda: (c.get("/health").json()["canary"] or {}).get("version") == "v000001")
            seen = len(replies)
            wait_until(lambda: len(replies) > seen + 50)
            assert rollback(str(model_dir)) == "v000002"
            wait_until(lambda: c.get("/health").json()["canary"] is None)
            dropped, after_drop = c.get("/health").json(), len(replies)
            wait_until(lambda: len(replies) > after_drop + 50)
        finally:
            stop.set()
            sender.join(30)
        metrics = c.get("/metrics").text
    assert promoted["version"] == dropped["version"] == "v000002"
    assert [status for _, status, _, _ in replies] == [200] * len(replies)  # not one request failed
    model = {"v000001": live, "v000002": candidate}
    for j, _, version, body in replies:
        assert body["recommendations"] == answers(model[version], [sessions[j]])
    versions = [version for _, _, version, _ in replies]
    assert {"v000001", "v000002"} <= set(versions[:50])  # the first canary: both versions answer
    # the one request in flight when the server swapped finishes on the model that encoded it
    assert set(versions[after_promote + 1 : before_canary]) == {"v000002"}  # promoted: it answers every session
    assert set(versions[after_drop + 1 :]) == {"v000002"}  # the second canary dropped: the live version only
    assert sample(metrics, "sessrec_reloads_total", result="failed") == 0
    out = capsys.readouterr().out
    assert "sessrec promote: " in out and "canary v000002 promoted" in out
    assert "canary v000001 dropped; v000002 answers every session" in out
    log = [json.loads(line) for line in (model_dir / "promotions.jsonl").read_text().splitlines()]
    assert [(e["event"], e["version"], e.get("canary_ended")) for e in log[-4:]] == [
        ("canary", "v000002", None), ("promote", "v000002", "promoted"), ("canary", "v000001", None),
        ("canary_end", "v000001", "dropped")]


def test_a_canary_that_cannot_run_is_refused_in_one_line(model_dir, data, tmp_path) -> None:
    for version, share, message in [
        ("v000009", 0.1, r"model: no version 'v000009' to serve as a canary; it holds \['v000001', 'v000002'\]"),
        ("v000001", 0.1, "model: v000001 is the current version; a canary is another version, served beside it"),
        ("v000002", 0.0, "canary_share must be a fraction of the sessions strictly between 0 and 1, got 0.0"),
        ("v000002", 1, "canary_share must be a fraction of the sessions strictly between 0 and 1, got 1"),
        ("v000002", True, "canary_share must be a fraction of the sessions strictly between 0 and 1, got True"),
        ("v000002", None, "--canary v000002 needs --canary_share: the share of the sessions it answers, e.g. 0.1"),
    ]:
        with pytest.raises(ValueError, match=f"{message}$"):
            serve(model_dir, canary=version, canary_share=share)
    with pytest.raises(ValueError, match="^--canary_share 0.1 without --canary: name the version that answers that share$"):
        serve(model_dir, canary_share=0.1)
    other = SessionDataModule(source=SyntheticSource(num_sessions=300, num_items=80, days=10, seed=3), max_length=10)
    covisitation(other).save_pretrained(model_dir)  # v000003: another catalogue
    VersionedDirectory(model_dir).rollback(to="v000001")
    with pytest.raises(ValueError, match=r"^canary v000003 \(75 products\) and the live version v000001 \(58\) do not "
                                         r"share one item vocabulary: product 0 differs \(1031 against 1046\); a canary is a version "
                                         "trained on from the live one, whose vocabulary grows only at its end$"):
        serve(model_dir, canary="v000003", canary_share=0.1)
    plain = covisitation(data).save_pretrained(tmp_path / "plain")
    with pytest.raises(ValueError, match="plain: has no versions \\(no CURRENT\\); a canary is another version"):
        serve(plain, canary="v000002", canary_share=0.1)
    with pytest.raises(FileNotFoundError, match="nowhere: no such model directory"):
        serve(tmp_path / "nowhere", canary="v000002", canary_share=0.1)
    assert not (tmp_path / "nowhere").exists() and canary(model_dir) is None  # nothing recorded by a refusal
    start_canary(model_dir, "v000002", 0.1)
    with pytest.raises(ValueError, match="model: canary v000002 is running; end it first"):
        VersionedDirectory(model_dir).start_canary("v000003", 0.1)
    with pytest.raises(ValueError, match=r"plain: holds one model and no versions \(it was saved once\): nothing to promote$"):
        promote(str(tmp_path / "plain"))


@pytest.mark.parametrize(("setting", "message"), [
    ({"max_queue": 0}, "max_queue must be an integer >= 1, got 0"),
    ({"deadline_ms": -1}, "deadline_ms must be a positive number of milliseconds, got -1"),
    ({"k_max": 0}, "k_max must be an integer >= 1, got 0"),
    ({"workers": 0}, "workers must be an integer >= 1, got 0"),
    ({"threads": 0}, "threads must be an integer >= 1, got 0"),
    ({"max_batch_size": 0}, "max_batch_size must be an integer >= 1, got 0"),
    ({"max_wait_ms": -1.0}, "max_wait_ms must be a finite number >= 0, got -1.0"),
    ({"reload_interval_s": -2.0}, "reload_interval_s must be a finite number >= 0, got -2.0"),
])
def test_a_serve_refused_for_its_settings_records_no_canary(model_dir, setting: dict, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{message}$"):
        serve(model_dir, canary="v000002", canary_share=0.1, **setting)
    assert canary(model_dir) is None and not (model_dir / CANARY).exists()
    assert all(entry["event"] != "canary" for entry in VersionedDirectory(model_dir).history())


def test_a_session_id_that_is_no_text_is_a_422_naming_it(model_dir, sessions, tmp_path) -> None:
    """A lone surrogate (``"\\ud800"``, which JSON can write and UTF-8 cannot) cannot be hashed for the canary, nor
    written to the served log: it is refused with the request, as is a ``session_ids`` that is a string."""
    start_canary(model_dir, "v000002", 0.5)
    served = Served.load(model_dir)
    app = build_app(served, model_dir=model_dir, canary=load_canary(model_dir, served),
                    served_log=ServedLog(tmp_path / "log"))
    with TestClient(app) as c:
        good = c.post("/recommend", json={"session": sessions[0], "k": K, "session_ids": "s0"})
        lone = c.post("/recommend", content=b'{"session": [%d], "session_ids": ["a\\ud800"]}' % sessions[0][0])
        text = c.post("/recommend", content=b'{"sessions": [[%d]], "session_ids": "\\ud800"}' % sessions[0][0])
    assert good.status_code == 200
    assert (lone.status_code, lone.json()) == (422, {"error": "session_ids[0] must be text or an integer, got "
                                                              "'a\\ud800' (an unpaired surrogate)"})
    assert (text.status_code, text.json()) == (422, {"error": "session_ids must be a list of one id per session (1), "
                                                              "got '\\ud800'"})
    assert [r["session_id"] for r in pq.read_table(tmp_path / "log").to_pylist()] == ["s0"]


def test_a_grown_vocabulary_is_compatible_and_each_version_encodes_with_its_own(model_dir, data, sessions) -> None:
    """A canary whose vocabulary is the live one grown by new items (as ``sessrec retrain`` grows it) is served;
    a session naming a new item is read by the canary's vocabulary, and is unknown to the live version's."""
    grown, _ = data.vocab.grow(pa.array([10_000_001, 10_000_002]))
    train, _ = data.tensors("train")
    Pipeline(grown, {"covisitation": (CoVisitation().fit(train, len(grown)), 20)}, max_length=10,
             max_candidates=20).save_pretrained(model_dir)  # v000003
    VersionedDirectory(model_dir).rollback(to="v000001")
    start_canary(model_dir, "v000003", 0.5)
    ids = [f"s{i}" for i in range(16)]
    on_canary = canary_sessions(ids, 0.5)
    to_canary, to_live = ids[int(np.argmax(on_canary))], ids[int(np.argmin(on_canary))]
    session = [sessions[0][0], 10_000_001]
    served = Served.load(model_dir)
    with TestClient(build_app(served, model_dir=model_dir, canary=load_canary(model_dir, served))) as c:
        canary_reply = c.post("/recommend", json={"session": session, "k": K, "session_ids": to_canary,
                                                  "on_unknown": "error"})
        live_reply = c.post("/recommend", json={"session": session, "k": K, "session_ids": to_live,
                                                "on_unknown": "error"})
    assert canary_reply.status_code == 200 and canary_reply.headers["x-model-version"] == "v000003"
    assert live_reply.status_code == 422 and "10000001" in live_reply.json()["error"]


def test_the_canary_record_follows_the_log_after_a_crash(model_dir) -> None:
    store = VersionedDirectory(model_dir)
    store.start_canary("v000002", 0.25)
    assert canary(model_dir) == ("v000002", 0.25)
    (model_dir / CANARY).unlink()  # a crash after the log, before CANARY was written
    assert canary(model_dir) is None
    store.recover()
    assert canary(model_dir) == ("v000002", 0.25)
    assert store.start_canary("v000002", 0.25) is False  # running already: nothing logged twice
    store.promote("v000002")
    (model_dir / CANARY).write_text('{"version": "v000002", "share": 0.25, "live": "v000001"}\n')  # a promotion cut
    assert canary(model_dir) is None  # before removing it: recorded beside another live version, no canary
    store.recover()
    assert not (model_dir / CANARY).exists()
    (model_dir / CANARY).write_text("v000001")
    with pytest.raises(ValueError, match="CANARY: not a canary record .*; run sessrec rollback to drop it"):
        canary(model_dir)


def test_a_server_restarted_with_its_canary_flags_starts_while_a_retrain_holds_the_directory(model_dir) -> None:
    """A process manager restarts ``sessrec serve --canary v000002 --canary_share 0.25`` with the flags it was
    started with, while a retrain turn holds the directory's lock (for hours): the canary it names runs already,
    so there is nothing to write, but the lock was taken first and the server refused to start. Another canary, or
    another share, still needs the lock, and a record that the log does not confirm is left to the locked path."""
    start_canary(model_dir, "v000002", 0.25)
    entries = len(VersionedDirectory(model_dir).history())
    script = ("import sys, time\nfrom sessrec.saved.versions import VersionedDirectory\n"
              f"with VersionedDirectory({str(model_dir)!r}).lock():\n    print('held', flush=True)\n"
              "    sys.stdin.readline()\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                          env=env) as holder:
        try:
            assert holder.stdout.readline().strip() == "held"
            start_canary(model_dir, "v000002", 0.25)  # the restart: nothing to write
            assert len(VersionedDirectory(model_dir).history()) == entries and canary(model_dir) == ("v000002", 0.25)
            with pytest.raises(RuntimeError, match=r"model: another process \(pid \d+\) is writing this model directory"):
                start_canary(model_dir, "v000002", 0.5)
            with open(model_dir / "promotions.jsonl", "a") as log:  # a drop cut before CANARY was removed
                log.write(json.dumps({"event": "canary_end", "version": "v000002", "live": "v000001"}) + "\n")
            with pytest.raises(RuntimeError, match="is writing this model directory"):  # recover() must run first
                start_canary(model_dir, "v000002", 0.25)
        finally:
            holder.stdin.write("\n")
            holder.stdin.flush()


def test_a_server_restarted_with_the_flags_of_a_canary_promoted_since_serves_it(model_dir, caplog) -> None:
    """``sessrec serve --canary v000002 --canary_share 0.25``, then ``sessrec promote`` (the documented way to end a
    canary that does well): the server's next restart, with the flags it was started with (a process manager's
    unit), was refused ("v000002 is the current version") and could not start again. It serves v000002, which
    the flags asked for, and says the flag has no effect; a version made current otherwise is still refused."""
    start_canary(model_dir, "v000002", 0.25)
    assert promote(str(model_dir)) == "v000002"
    entries = VersionedDirectory(model_dir).history()
    with caplog.at_level("WARNING", logger="sessrec.serving.server"):
        start_canary(model_dir, "v000002", 0.25)  # the restart
    assert VersionedDirectory(model_dir).history() == entries and canary(model_dir) is None
    assert ("canary v000002 was promoted (sessrec promote) and answers every session; --canary v000002 has no effect: "
            "remove it from the command") in caplog.text
    assert VersionedDirectory(model_dir).rollback() == "v000001"
    start_canary(model_dir, "v000002", 0.25)  # a canary again after the rollback: a new one
    assert canary(model_dir) == ("v000002", 0.25)
    assert VersionedDirectory(model_dir).rollback() == "v000001" and canary(model_dir) is None  # dropped
    with pytest.raises(ValueError, match="model: v000001 is the current version; a canary is another version"):
        start_canary(model_dir, "v000001", 0.25)


def test_sessrec_promote_reads_the_directory_as_its_log_leaves_it_after_a_crash(model_dir) -> None:
    """A crash after the log recorded a promotion and before the pointer moved: the log says v000002 is current,
    the pointer v000001. `promote` brings the directory in line first (as rollback and save do), so promoting
    v000001 back is a move, and the canary the log ended is not reported as running."""
    store = VersionedDirectory(model_dir)
    store.start_canary("v000002", 0.25)
    store.log({"event": "promote", "version": "v000002", "previous": "v000001", "canary": "v000002",
               "canary_ended": "promoted"})  # the crash: the pointer and CANARY not yet moved
    assert store.current_version() == "v000001" and canary(model_dir) == ("v000002", 0.25)
    assert promote(str(model_dir), "v000001") == "v000001"
    moves = [e for e in store.history() if e.get("event") == "promote"]
    assert moves[-1]["previous"] == "v000002" and "canary" not in moves[-1]
    assert store.current_version() == "v000001" and canary(model_dir) is None


def test_a_reload_reads_one_state_and_never_keeps_a_canary_beside_another_live_version(model_dir, live,
                                                                                      monkeypatch) -> None:
    """A promotion of v000003 while canary v000002 runs beside v000001 moves the pointer, then removes ``CANARY``:
    a reload between the two serves v000003 alone, not the dropped canary beside it. A pointer move and a new
    canary between two reloads: while the new canary loads, the new live version answers every session."""
    import asyncio

    from sessrec.serving import hot_reload

    start_canary(model_dir, "v000002", 0.5)
    record = (model_dir / CANARY).read_text()
    served = Served.load(model_dir)
    holder = hot_reload.ModelHolder(served, model_dir, 0, canary=load_canary(model_dir, served))
    assert holder.canary.version == "v000002"
    live.save_pretrained(model_dir)  # v000003 current, the canary dropped
    (model_dir / CANARY).write_text(record)  # read between the pointer's move and the record's removal
    assert asyncio.run(holder.check())
    assert (holder.current.version, holder.canary, canary(model_dir)) == ("v000003", None, None)

    (model_dir / CANARY).unlink()
    start_canary(model_dir, "v000002", 0.5)
    asyncio.run(holder.check())
    assert (holder.current.version, holder.canary.version) == ("v000003", "v000002")
    assert promote(str(model_dir), "v000001") == "v000001"  # drops canary v000002
    start_canary(model_dir, "v000003", 0.25)
    seen = []

    def loading(current: Served, path: Path) -> Served:
        seen.append((holder.current.version, holder.canary))
        return load_canary_version(current, path)

    monkeypatch.setattr(hot_reload, "load_canary_version", loading)
    asyncio.run(holder.check())
    assert seen == [("v000001", None)]
    assert (holder.current.version, holder.canary.version, holder.share) == ("v000001", "v000003", 0.25)


@pytest.mark.slow
def test_sessrec_serve_with_two_workers_ends_its_canary_without_a_failed_request(model_dir, sessions, tmp_path) -> None:
    """The must-show end to end: ``sessrec serve --workers 2 --canary v000002 --canary_share 0.1``; two
    clients send requests of 60 sessions (a new connection each, so both workers answer) while ``sessrec
    promote`` ends the canary, a second canary starts and ``sessrec rollback`` drops it. No request fails;
    each session gets the version its id hashes to from either worker, every time; the served log and
    /metrics hold both versions."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "sessrec.cli"]
    server = subprocess.Popen(
        [*command, "serve", "--model_dir", str(model_dir), "--port", str(port), "--workers", "2", "--canary", "v000002",
         "--canary_share", "0.1", "--reload_interval_s", "0.2", "--served_log", str(tmp_path / "log"),
         "--access_log", "false", "--log_level", "warning",
         # shedding is tested in test_serve.py: here a loaded machine must not turn a slow answer into a 503 / 504
         "--max_queue_wait_ms", "60000", "--deadline_ms", "60000"], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    ids = [f"user-{i}" for i in range(60)]
    on_canary = canary_sessions(ids, 0.1)
    assert on_canary.sum() == 9  # of 60 (binomial: 6 ± 2.3)
    replies: list = []
    stop = threading.Event()

    def client_loop(offset: int) -> None:
        i = offset
        while not stop.is_set():
            j = i % len(ids)
            try:
                reply = httpx.post(f"{url}/recommend", json={"session": sessions[j % len(sessions)], "k": K,
                                                             "session_ids": ids[j]},
                                   timeout=10)
                replies.append((j, reply.status_code, reply.headers.get("x-model-version")))
            except httpx.TransportError as err:
                replies.append((j, type(err).__name__, None))
            i += 1

    def settle() -> int:
        """Wait two reload intervals of each worker and some requests; the index of the first reply after."""
        time.sleep(1.0)
        mark = len(replies)
        wait_until(lambda: len(replies) > mark + 60, 60)
        return mark

    try:
        wait_until(lambda: _healthy(url), 120)
        clients = [threading.Thread(target=client_loop, args=(offset,)) for offset in (0, 7)]
        for t in clients:
            t.start()
        wait_until(lambda: len(replies) > 2 * len(ids), 120)  # every session asked at least twice
        first_canary = len(replies)
        subprocess.run([*command, "promote", "--model_dir", str(model_dir)], cwd=ROOT, check=True, capture_output=True)
        promoted = settle()
        before_second = len(replies)
        start_canary(model_dir, "v000001", 0.1)  # what `sessrec serve --canary v000001` records
        second_canary = settle()
        before_rollback = len(replies)
        dropped = subprocess.run([*command, "rollback", "--model_dir", str(model_dir)], cwd=ROOT, check=True,
                                 capture_output=True, text=True).stdout
        rolled_back = settle()
        stop.set()
        for t in clients:
            t.join(30)
        metrics = httpx.get(f"{url}/metrics").text
    finally:
        stop.set()
        server.terminate()
        stderr = server.communicate(timeout=60)[1]
    assert server.returncode == 0 and "Traceback" not in stderr
    assert [status for _, status, _ in replies] == [200] * len(replies)  # not one request failed
    expected = {j: ("v000002" if on_canary[j] else "v000001") for j in range(len(ids))}
    assert all(version == expected[j] for j, _, version in replies[:first_canary])  # either worker: the same version
    assert {j for j, _, version in replies[:first_canary] if version == "v000002"} == set(np.flatnonzero(on_canary))
    assert {version for _, _, version in replies[promoted:before_second]} == {"v000002"}
    second = {j: ("v000001" if on_canary[j] else "v000002") for j in range(len(ids))}
    assert all(version == second[j] for j, _, version in replies[second_canary:before_rollback])
    assert "canary v000001 dropped; v000002 answers every session" in dropped
    assert {version for _, _, version in replies[rolled_back:]} == {"v000002"}
    log = pq.read_table(tmp_path / "log").select(["model_version", "canary"]).to_pylist()
    assert {(r["model_version"], r["canary"]) for r in log} == {("v000001", False), ("v000002", True),
                                                                 ("v000002", False), ("v000001", True)}
    assert len(log) == len(replies)
    for version, role in (("v000001", "live"), ("v000002", "canary"), ("v000002", "live"), ("v000001", "canary")):
        assert sample(metrics, "sessrec_version_sessions_total", version=version, role=role) > 0
    assert sum(sample(metrics, "sessrec_version_sessions_total", version=v, role=r)
               for v in ("v000001", "v000002") for r in ("live", "canary")) == len(replies)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=1).status_code == 200
    except httpx.TransportError:
        return False
