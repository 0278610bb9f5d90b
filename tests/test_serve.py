"""The HTTP server (`sessrec.serving.server`) on a tiny co-visitation pipeline, in process.

The pipeline: `SyntheticSource` sessions (60 items, int64 raw ids), a `CoVisitation` retriever
fitted on the training split, no ranker. Requests go through FastAPI's TestClient (the app's
lifespan runs the batcher); concurrent requests come from threads. `Gate` wraps a recommender so
that its model calls wait for the test (a busy or stuck model) and are recorded. The tests of
worker processes start a real uvicorn server on a free loopback port; the load benchmark's smoke run
(benchmarks/serve_load.py on the same pipeline) is in tests/test_benchmarks_serving.py.
"""

from __future__ import annotations

import inspect
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import torch
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from sessrec.data import SyntheticSource
from sessrec.models import CausalLanguageModeling, HSTUEncoder, MaskedItemModeling, XLNetEncoder
from sessrec.pipeline.pipeline import Pipeline
from sessrec.pipeline.request import check_request
from sessrec.pipeline.retrieval.covisitation import CoVisitation
from sessrec.saved.atomic import write_text
from sessrec.saved.versions import resolve
from sessrec.serving import app as serving_app
from sessrec.serving import server
from sessrec.serving.admission import Overload
from sessrec.serving.app import build_app
from sessrec.serving.batching import Pace
from sessrec.serving.recommender import Served, SessionModelService, join_sessions
from sessrec.serving.request import Limits
from sessrec.serving.server import serve
from sessrec.tasks import NextItemTask, SessionDataModule

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
K = 5
UNKNOWN = 99_999_999  # a raw id the vocabulary does not hold


@pytest.fixture(scope="module")
def data() -> SessionDataModule:
    return SessionDataModule(source=SyntheticSource(num_sessions=400, num_items=60, days=10), max_length=10)


@pytest.fixture(scope="module")
def pipe(data: SessionDataModule) -> Pipeline:
    train, _ = data.tensors("train")
    return Pipeline(data.vocab, {"covisitation": (CoVisitation().fit(train, data.num_items), 20)}, max_length=10,
                    max_candidates=20)


@pytest.fixture(scope="module")
def other_pipe(data: SessionDataModule) -> Pipeline:
    """Another model over the same vocabulary: co-visitation of a tenth of the training sessions."""
    train, _ = data.tensors("train")
    return Pipeline(data.vocab, {"covisitation": (CoVisitation().fit(train[:40], data.num_items), 20)},
                    max_length=10, max_candidates=20)


@pytest.fixture(scope="module")
def sessions(pipe: Pipeline) -> list[list[int]]:
    raw = pipe.vocab.raw_ids.slice(2).to_pylist()
    return [raw[i : i + 1 + i % 4] for i in range(16)]


@pytest.fixture(scope="module")
def client(pipe: Pipeline) -> Iterator[TestClient]:
    with TestClient(build_app(pipe, max_batch_size=8, max_wait_ms=1.0)) as c:
        yield c


class Gate:
    """A recommender whose model calls wait until `release` is set; `calls` records the sessions of each."""

    def __init__(self, inner: Pipeline) -> None:
        self.inner, self.vocab = inner, inner.vocab
        self.release, self.entered = threading.Event(), threading.Event()
        self.calls: list[int] = []

    def encode(self, request, arrival=None):
        return self.inner.encode(request, arrival)

    def recommend_batch(self, sessions, k=20):
        self.calls.append(len(sessions))
        self.entered.set()
        if not self.release.wait(20):
            raise RuntimeError("the test never released the gate")
        return self.inner.recommend_batch(sessions, k)

    def decode(self, recs):
        return self.inner.decode(recs)


def post_concurrently(client: TestClient, bodies: list[dict]) -> list:
    """POST every body from its own thread, all released together."""
    replies: list = [None] * len(bodies)
    barrier = threading.Barrier(len(bodies))

    def send(i: int) -> None:
        barrier.wait()
        replies[i] = client.post("/recommend", json=bodies[i])

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return replies


class InFlight:
    """POST bodies from background threads, one after another admitted (the app counts them)."""

    def __init__(self, client: TestClient) -> None:
        self.client, self.replies, self.threads = client, {}, []

    def post(self, name: str, body: dict, admitted: int) -> None:
        def send() -> None:
            self.replies[name] = self.client.post("/recommend", json=body)

        self.threads.append(threading.Thread(target=send))
        self.threads[-1].start()
        wait_until(lambda: self.client.app.state.admission.admitted >= admitted)

    def join(self) -> dict:
        for t in self.threads:
            t.join(30)
        return self.replies


def wait_until(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.005)


def expected(pipe: Pipeline, sessions: list, k: int = K) -> list:
    return json.loads(json.dumps(pipe.recommend(sessions, k=k)))


def test_recommend_returns_the_pipelines_raw_ids_and_scores(client, pipe, sessions) -> None:
    reply = client.post("/recommend", json={"sessions": sessions[:4], "k": K})
    assert reply.status_code == 200
    assert reply.json()["recommendations"] == pipe.recommend(sessions[:4], k=K)
    one = client.post("/recommend", json={"session": [str(i) for i in sessions[5]]})  # ids as strings, k = 20
    assert one.json()["recommendations"] == pipe.recommend([sessions[5]], k=20)
    unknown = client.post("/recommend", json={"session": [UNKNOWN, sessions[0][0]], "k": K})
    assert unknown.json()["recommendations"] == pipe.recommend([[UNKNOWN, sessions[0][0]]], k=K)  # scored as OOV
    big = [sessions[i % 16] * 50 for i in range(40)]  # a body over 16 KiB: parsed in a worker thread
    reply = client.post("/recommend", json={"sessions": big, "k": K})
    assert len(reply.request.content) > serving_app.INLINE_PARSE_BYTES
    assert reply.json()["recommendations"] == pipe.recommend(big, k=K)


def test_health_and_metadata_say_what_is_served(client, pipe) -> None:
    assert client.get("/health").json() == {"status": "ok", "kind": "Pipeline", "vocabulary_size": len(pipe.vocab),
                                            "items": pipe.vocab.num_products, "version": None, "reload_error": None,
                                            "canary": None}
    meta = client.get("/metadata").json()
    assert meta["limits"] == {"max_request_bytes": 1 << 20, "max_sessions_per_request": 256,
                              "max_items_per_session": 1000, "k_max": 100}
    assert meta["overload"] == {"max_queue": 128, "max_queued_sessions": 8192, "max_queue_wait_ms": 500.0,
                                "deadline_ms": 1000.0, "retry_after_s": 1}
    assert meta["queue"] == {"admitted": 0, "queued_requests": 0, "queued_sessions": 0}
    assert meta["batching"]["max_batch_size"] == 8


def test_concurrent_requests_share_model_calls(pipe, sessions) -> None:
    bodies = [{"session": s, "k": K} for s in sessions[:12]] + [{"sessions": sessions[12:16], "k": K}]
    with TestClient(build_app(pipe, max_batch_size=8, max_wait_ms=300.0)) as c:
        replies = post_concurrently(c, bodies)
        batching = c.get("/metadata").json()["batching"]
    for body, reply in zip(bodies, replies):
        assert reply.status_code == 200
        assert reply.json()["recommendations"] == pipe.recommend(body.get("sessions", [body.get("session")]), k=K)
    assert batching["requests"] == 13 and batching["sessions"] == 16
    assert 1 < batching["max_sessions_per_call"] <= 8  # several requests in one call, never above the maximum
    assert batching["model_calls"] < 13


def test_a_bad_request_fails_alone_and_the_model_is_called_once_for_the_others(pipe, sessions) -> None:
    gate = Gate(pipe)
    gate.release.set()
    bodies = [{"session": sessions[0], "k": K, "on_unknown": "error"},
              {"session": [sessions[1][0], UNKNOWN], "k": K, "on_unknown": "error"},
              {"session": sessions[2], "k": K, "on_unknown": "error"},
              {"session": [sessions[3][0], 1.5], "k": K}]
    with TestClient(build_app(gate, max_wait_ms=300.0)) as c:
        replies = post_concurrently(c, bodies)
    assert [r.status_code for r in replies] == [200, 422, 200, 422]
    assert replies[1].json() == {"error": f"item id {UNKNOWN} is not in the model's vocabulary"}
    assert replies[3].json() == {"error": "session 0: item ids must be strings or integers, got 1.5"}
    assert replies[0].json()["recommendations"] == pipe.recommend([sessions[0]], k=K)
    assert replies[2].json()["recommendations"] == pipe.recommend([sessions[2]], k=K)
    assert gate.calls == [2]  # one model call, for the two good requests only


@pytest.mark.parametrize(
    "body, status, message",
    [
        (b'{"sessions": [[1, 2]', 400, "body is not valid JSON"),
        (b"\xff\xfe", 400, "body is not valid JSON"),
        (b"[[1, 2]]", 422, "body must be a JSON object, got list"),
        (b'{"session": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", 400, "body nests arrays or objects too deeply"),
        (b'{"sessions": "abc"}', 422, "sessions must be a non-empty list of sessions, each a list of item ids, got str"),
        (b'{"sessions": []}', 422, "sessions must be a non-empty list of sessions, each a list of item ids, got an empty"),
        (b'{"sessions": [1031]}', 422, "session 0 must be a list of item ids, got int"),
        (b'{"session": [1031], "sessions": [[1031]]}', 422, 'give either "sessions"'),
        (b'{"session": [1031], "kk": 3}', 422, "unknown field(s) ['kk']"),
        (b'{"session": [1031], "k": "5"}', 422, "k must be an integer of 1 or more, got '5'"),
        (b'{"session": [1031], "k": 0}', 422, "k must be an integer of 1 or more, got 0"),
        (b'{"session": [1031], "k": true}', 422, "k must be an integer of 1 or more, got True"),
        (b'{"session": [1031], "k": 2.5}', 422, "k must be an integer of 1 or more, got 2.5"),
        (b'{"session": [1031], "k": 101}', 422, "k 101 is more than this server's limit of 100 (k_max)"),
        (b'{"session": [1031], "on_unknown": "skip"}', 422, 'on_unknown must be "oov" or "error"'),
        (b'{"session": [1031, 1.5]}', 422, "session 0: item ids must be strings or integers, got 1.5"),
        (b'{"session": [null]}', 422, "item ids must be strings or integers, got None"),
        (b'{"session": [[1031]]}', 422, "item ids must be strings or integers, got [1031]"),
        (b'{"session": [1031, 100000000000000000000000]}', 422, "item id 100000000000000000000000 does not fit"),
        (b'{"session": [-100000000000000000000000]}', 422, "item id -100000000000000000000000 does not fit"),
        (b'{"session": [-9999999999999999999]}', 422, "item id -9999999999999999999 does not fit"),  # 19 digits
        (b'{"session": [1031], "now": NaN}', 422, "now nan is not a time in seconds since the epoch: not a number"),
        (b'{"session": ["not-an-id"]}', 422, "cannot be read as the vocabulary's int64 ids"),
        (b'{"sessions": [[1031], []]}', 422, "session 1 is empty"),
        (json.dumps({"session": [1031] * 10_000}).encode(), 413, "session 0 has 10000 items; the limit is 1000"),
        (json.dumps({"sessions": [[1031]] * 300}).encode(), 413, "300 sessions in one request; the limit is 256"),
        (b'{"session": [1031, 99999999], "on_unknown": "error"}', 422, "item id 99999999 is not in the model's"),
    ],
)
def test_malformed_requests_get_a_4xx_naming_the_problem(client, body: bytes, status: int, message: str) -> None:
    reply = client.post("/recommend", content=body, headers={"content-type": "application/json"})
    assert reply.status_code == status
    assert message in reply.json()["error"]
    assert "\n" not in reply.json()["error"]
    assert client.get("/health").status_code == 200


def test_body_over_the_byte_limit_is_413_with_or_without_content_length(pipe) -> None:
    body = json.dumps({"session": [1031] * 400}).encode()  # 2,413 bytes
    with TestClient(build_app(pipe, limits=Limits(max_request_bytes=2000))) as c:
        declared = c.post("/recommend", content=body)
        chunked = c.post("/recommend", content=iter([body[:1000], body[1000:]]))  # no Content-Length
        small = c.post("/recommend", json={"session": [1031]})
        assert c.get("/health").status_code == 200
    assert "content-length" not in chunked.request.headers
    assert (declared.status_code, chunked.status_code, small.status_code) == (413, 413, 200)
    assert declared.json()["error"] == f"body of {len(body)} bytes; the limit is 2000 bytes"
    assert chunked.json()["error"] == "body over 2000 bytes; the limit is 2000 bytes"


def test_a_full_queue_answers_503_with_retry_after_at_once(pipe, sessions) -> None:
    gate = Gate(pipe)
    app = build_app(gate, max_wait_ms=0.0, overload=Overload(max_queue=2, retry_after_s=3))
    with TestClient(app) as c:
        flight = InFlight(c)
        flight.post("scored", {"session": sessions[0], "k": K}, admitted=1)
        assert gate.entered.wait(10)  # the model holds the first request
        flight.post("queued", {"session": sessions[1], "k": K}, admitted=2)
        start = time.perf_counter()
        refused = c.post("/recommend", content=b"not even JSON: never read")
        took = time.perf_counter() - start
        gate.release.set()
        replies = flight.join()
    assert refused.status_code == 503 and refused.headers["retry-after"] == "3"
    assert refused.json() == {"error": "the server is busy: 2 requests in progress; retry after 3 s"}
    assert took < 1.0
    assert replies["scored"].status_code == replies["queued"].status_code == 200
    assert replies["queued"].json()["recommendations"] == pipe.recommend([sessions[1]], k=K)


def test_queued_sessions_past_their_bound_get_503(pipe, sessions) -> None:
    gate = Gate(pipe)
    app = build_app(gate, max_wait_ms=0.0, limits=Limits(max_sessions_per_request=4),
                    overload=Overload(max_queued_sessions=4))
    with TestClient(app) as c:
        flight = InFlight(c)
        flight.post("scored", {"session": sessions[0], "k": K}, admitted=1)
        assert gate.entered.wait(10)
        flight.post("queued", {"sessions": sessions[1:4], "k": K}, admitted=2)
        wait_until(lambda: c.app.state.batcher.queued_sessions == 3)
        refused = c.post("/recommend", json={"sessions": sessions[4:6], "k": K})  # 3 + 2 > 4
        fits = threading.Thread(target=lambda: flight.replies.update(fits=c.post("/recommend", json={
            "session": sessions[6], "k": K})))
        fits.start()
        wait_until(lambda: c.app.state.batcher.queued_sessions == 4)
        full = c.post("/recommend", content=b"never read")  # the bound is reached: refused at arrival
        gate.release.set()
        fits.join(30)
        replies = flight.join()
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert refused.json()["error"] == ("the server is busy: 3 sessions are waiting for the model; "
                                       "retry after 1 s")
    assert full.status_code == 503
    assert full.json()["error"] == "the server is busy: 4 sessions are waiting; retry after 1 s"
    assert [replies[name].status_code for name in ("scored", "queued", "fits")] == [200, 200, 200]


def test_a_request_arriving_while_the_model_is_far_behind_gets_503(pipe, sessions) -> None:
    gate = Gate(pipe)
    with TestClient(build_app(gate, max_wait_ms=0.0, overload=Overload(max_queue_wait_ms=500))) as c:
        flight = InFlight(c)
        flight.post("scored", {"sessions": sessions[:2], "k": K}, admitted=1)
        assert gate.entered.wait(10)
        c.app.state.batcher.pace.add(2, 0.6)  # as if recent calls took 0.3 s a session: the 2 ahead take 600 ms
        refused = c.post("/recommend", content=b"never read")
        gate.release.set()
        replies = flight.join()
        idle = c.post("/recommend", json={"session": sessions[2], "k": K})  # nothing ahead: admitted
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert refused.json() == {"error": "the server is busy: the model is about 600 ms behind; retry after 1 s"}
    assert replies["scored"].status_code == idle.status_code == 200
    assert gate.calls == [2, 1]


def test_the_pace_of_the_model_separates_the_overhead_of_a_call_from_its_sessions() -> None:
    pace = Pace(decay=0.9)
    assert pace.fit() is None and pace.seconds(100, 2) == 0.0
    pace.add(4, 0.02)
    assert pace.fit() == pytest.approx((0.0, 0.005))  # one size of call: the ratio
    for _ in range(10):  # small calls (mostly overhead), then full batches
        pace.add(1, 0.005)
        pace.add(64, 0.02)
    overhead, per_session = pace.fit()
    assert overhead == pytest.approx(0.0048, abs=5e-4) and per_session == pytest.approx(0.000238, rel=0.05)
    assert pace.seconds(512, 8) == pytest.approx(8 * overhead + 512 * per_session)  # ~0.16 s, not 512 * 5 ms
    with pytest.raises(ValueError, match="decay must be in"):
        Pace(decay=1.0)


def test_past_its_deadline_a_request_gets_504_and_never_reaches_the_model(pipe, sessions) -> None:
    gate = Gate(pipe)
    app = build_app(gate, max_wait_ms=0.0, overload=Overload(max_queue_wait_ms=300, deadline_ms=300))
    with TestClient(app) as c:
        flight = InFlight(c)
        flight.post("stuck", {"session": sessions[0], "k": K}, admitted=1)
        assert gate.entered.wait(10)
        flight.post("queued", {"sessions": sessions[1:3], "k": K}, admitted=2)
        wait_until(lambda: c.app.state.admission.admitted == 0)  # both answered 504 while the model is stuck
        gate.release.set()
        after = c.post("/recommend", json={"session": sessions[3], "k": K})
        metrics = c.get("/metrics").text
        replies = flight.join()
    for name in ("stuck", "queued"):
        assert replies[name].status_code == 504
        assert replies[name].json() == {"error": "no answer within the deadline of 300 ms; the server is overloaded, "
                                                 "retry later"}
    assert after.status_code == 200
    assert gate.calls == [1, 1]  # the stuck request, then the one after: the queued two sessions were dropped
    assert sample(metrics, "sessrec_expired_in_queue_total") == 1
    assert sample(metrics, "sessrec_shed_total", reason="deadline") == 2


def test_a_request_answered_504_or_500_leaves_no_row_in_the_served_log(pipe, sessions, tmp_path) -> None:
    """The model call of "stuck" outlives its deadline: its client gets 504, and the lists computed after it are
    no answer anyone saw; a model call that fails is a 500. The served log keeps the request answered 200 alone."""
    import pyarrow.parquet as pq

    from sessrec.serving.served_log import ServedLog, served_files

    gate, log = Gate(pipe), ServedLog(tmp_path / "log")
    app = build_app(gate, max_wait_ms=0.0, overload=Overload(max_queue_wait_ms=300, deadline_ms=300), served_log=log)
    with TestClient(app) as c:
        flight = InFlight(c)
        flight.post("stuck", {"session": sessions[0], "k": K, "session_ids": ["late"]}, admitted=1)
        assert gate.entered.wait(10)
        wait_until(lambda: c.app.state.admission.admitted == 0)  # answered 504 while the model is stuck
        gate.release.set()
        after = c.post("/recommend", json={"session": sessions[3], "k": K, "session_ids": ["on-time"]})
        assert flight.join()["stuck"].status_code == 504 and after.status_code == 200
    with TestClient(build_app(Broken(pipe, RuntimeError("a bug")), served_log=ServedLog(tmp_path / "broken"))) as c:
        assert c.post("/recommend", json={"session": sessions[3], "session_ids": ["failed"]}).status_code == 500
    assert gate.calls == [1, 1]
    rows = pq.read_table(served_files(tmp_path / "log")).to_pylist()
    assert [r["session_id"] for r in rows] == ["on-time"]
    assert rows[0]["recommended"] == [str(i) for i in after.json()["recommendations"][0]["item_ids"]]
    assert served_files(tmp_path / "broken") == []


class Broken:
    """A recommender that fails in its model call as a server bug would."""

    def __init__(self, inner: Pipeline, error: Exception) -> None:
        self.inner, self.vocab, self.error = inner, inner.vocab, error

    def encode(self, request, arrival=None):
        return self.inner.encode(request, arrival)

    def recommend_batch(self, sessions, k=20):
        raise self.error

    def decode(self, recs):
        return self.inner.decode(recs)


class NaNScores(Broken):
    """A recommender whose model call scores its first item NaN."""

    def recommend_batch(self, sessions, k=20):
        recs = self.inner.recommend_batch(sessions, k)
        recs.scores[:, 0] = float("nan")
        return recs


def test_a_nan_score_is_a_server_fault_not_a_null_in_the_answer(pipe, caplog) -> None:
    with TestClient(build_app(NaNScores(pipe, None))) as c:
        reply = c.post("/recommend", json={"session": [1031]})
        wrong_method = c.get("/recommend")
    assert reply.status_code == 500
    assert reply.json() == {"error": "internal error while recommending; see the server log"}
    assert "the recommender scored an item NaN or infinite" in caplog.text
    assert wrong_method.status_code == 405 and wrong_method.headers["allow"] == "POST"


@pytest.mark.parametrize("error", [RuntimeError("index file truncated"), ValueError("index file truncated")])
def test_a_server_fault_is_a_generic_500_logged_and_the_server_stays_up(pipe, error, caplog) -> None:
    with TestClient(build_app(Broken(pipe, error))) as c:
        reply = c.post("/recommend", json={"session": [1031]})
        bad = c.post("/recommend", json={"session": [1031, UNKNOWN], "on_unknown": "error"})
        assert c.get("/health").json()["status"] == "ok"
    assert reply.status_code == 500  # a ValueError inside the model call is the server's fault too
    assert reply.json() == {"error": "internal error while recommending; see the server log"}
    assert bad.status_code == 422  # the request's own fault, found before the model
    assert "index file truncated" in caplog.text


def test_health_and_metrics_answer_while_the_model_is_stuck(pipe, sessions) -> None:
    gate = Gate(pipe)
    with TestClient(build_app(gate, max_wait_ms=0.0, overload=Overload(deadline_ms=20_000))) as c:
        flight = InFlight(c)
        flight.post("stuck", {"session": sessions[0], "k": K}, admitted=1)
        assert gate.entered.wait(10)
        start = time.perf_counter()
        health = c.get("/health")
        metrics = c.get("/metrics")
        took = time.perf_counter() - start
        gate.release.set()
        replies = flight.join()
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert sample(metrics.text, "sessrec_admitted_requests") == 1
    assert took < 1.0
    assert replies["stuck"].status_code == 200


def test_draining_refuses_new_requests_and_answers_the_queued_ones(pipe, sessions) -> None:
    gate = Gate(pipe)
    with TestClient(build_app(gate, max_wait_ms=0.0)) as c:
        flight = InFlight(c)
        flight.post("scored", {"session": sessions[0], "k": K}, admitted=1)
        assert gate.entered.wait(10)
        flight.post("queued-1", {"session": sessions[1], "k": K}, admitted=2)
        flight.post("queued-2", {"sessions": sessions[2:4], "k": K}, admitted=3)
        drained: list[bool] = []  # what the lifespan's shutdown runs first
        draining = threading.Thread(target=lambda: drained.append(c.portal.call(c.app.state.admission.drain, 30)))
        draining.start()
        wait_until(lambda: c.app.state.admission.draining)
        refused = c.post("/recommend", json={"session": sessions[4], "k": K})
        health = c.get("/health")
        assert draining.is_alive()  # waiting for the admitted requests
        gate.release.set()
        draining.join(30)
        replies = flight.join()
    assert drained == [True]
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert refused.json() == {"error": "the server is shutting down; retry after 1 s"}
    assert health.status_code == 503 and health.json()["status"] == "shutting_down"
    assert [replies[n].status_code for n in ("scored", "queued-1", "queued-2")] == [200, 200, 200]
    assert replies["queued-2"].json()["recommendations"] == pipe.recommend(sessions[2:4], k=K)


@contextmanager
def uvicorn_serving(app) -> Iterator[tuple[str, server.DrainingServer, threading.Thread]]:
    """`app` under `DrainingServer` on a free loopback port, in a thread: (url, server, thread)."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    running = server.DrainingServer(uvicorn.Config(app, log_level="warning"), app)
    thread = threading.Thread(target=running.run, kwargs={"sockets": [sock]})
    thread.start()
    try:
        wait_until(lambda: running.started)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", running, thread
    finally:
        running.should_exit = True
        thread.join(30)


def test_uvicorn_shutdown_answers_the_admitted_requests_before_it_stops(pipe, sessions) -> None:
    gate = Gate(pipe)
    app = build_app(gate, max_wait_ms=0.0)
    replies: dict = {}
    with uvicorn_serving(app) as (url, running, serving):

        def send(name: str, body: dict) -> None:
            replies[name] = httpx.post(f"{url}/recommend", json=body, timeout=30)

        threads = [threading.Thread(target=send, args=("scored", {"session": sessions[0], "k": K}))]
        threads[0].start()
        assert gate.entered.wait(10)
        threads.append(threading.Thread(target=send, args=("queued", {"sessions": sessions[1:3], "k": K})))
        threads[1].start()
        wait_until(lambda: app.state.admission.admitted == 2)
        running.should_exit = True  # what SIGTERM does
        wait_until(lambda: app.state.admission.draining)
        with pytest.raises(httpx.ConnectError):  # no new connection once shutdown has begun
            httpx.get(f"{url}/health", timeout=5)
        assert serving.is_alive()
        gate.release.set()
        for t in threads:
            t.join(30)
        serving.join(30)
        assert not serving.is_alive()
    assert replies["scored"].status_code == replies["queued"].status_code == 200
    assert replies["queued"].json()["recommendations"] == pipe.recommend(sessions[1:3], k=K)


def test_a_client_that_leaves_mid_body_is_not_a_server_error(pipe, caplog) -> None:
    app = build_app(pipe)
    with uvicorn_serving(app) as (url, _, _):
        with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1]))) as sock:
            sock.sendall(b"POST /recommend HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"session\"")
            wait_until(lambda: app.state.admission.admitted == 1)
        wait_until(lambda: app.state.admission.admitted == 0)
        metrics = httpx.get(f"{url}/metrics").text
    assert sample(metrics, "sessrec_requests_total", route="/recommend", status="499") == 1
    assert "internal error" not in caplog.text


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one sample of a Prometheus text exposition (parsed by prometheus_client)."""
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    raise KeyError(f"no sample {name} {labels}")


def test_metrics_count_requests_by_route_and_status_and_sessions_per_call(pipe, sessions) -> None:
    bodies = [{"session": s, "k": K} for s in sessions[:6]] + [{"session": [UNKNOWN], "on_unknown": "error"}]
    with TestClient(build_app(pipe, max_batch_size=8, max_wait_ms=300.0)) as c:
        post_concurrently(c, bodies)
        c.get("/health")
        c.get("/nowhere")
        reply = c.get("/metrics")
        batching = c.get("/metadata").json()["batching"]
    assert reply.headers["content-type"].startswith("text/plain")
    text = reply.text
    assert sample(text, "sessrec_requests_total", route="/recommend", status="200") == 6
    assert sample(text, "sessrec_requests_total", route="/recommend", status="422") == 1
    assert sample(text, "sessrec_requests_total", route="/health", status="200") == 1
    assert sample(text, "sessrec_requests_total", route="other", status="404") == 1
    assert sample(text, "sessrec_request_duration_seconds_count", route="/recommend") == 7
    assert sample(text, "sessrec_batch_sessions_count") == batching["model_calls"]
    assert sample(text, "sessrec_batch_sessions_sum") == 6 == batching["sessions"]
    assert sample(text, "sessrec_model_call_seconds_count") == batching["model_calls"]
    assert sample(text, "sessrec_model_call_seconds_sum") > 0
    assert sample(text, "sessrec_queue_requests") == sample(text, "sessrec_queue_sessions") == 0
    assert sample(text, "sessrec_admitted_requests") == 0


def versioned(root: Path, name: str, pipe: Pipeline) -> Path:
    """Save `pipe` as version `name` of the versioned directory `root` and point ``CURRENT`` at it."""
    pipe.save_pretrained(root / "versions" / name)
    write_text(root / "CURRENT", f"{name}\n")  # renamed into place, as a promotion does: a reloader never reads it half-written
    return root / "versions" / name


def test_hot_reload_follows_the_pointer_and_in_flight_requests_finish_on_their_model(
    pipe, other_pipe, sessions, tmp_path: Path
) -> None:
    probe = sessions[5]
    assert expected(pipe, [probe]) != expected(other_pipe, [probe])  # the two versions answer differently
    first = versioned(tmp_path / "model", "v000001", pipe)
    gate = Gate(Pipeline.from_pretrained(first))
    app = build_app(Served(gate, first, "v000001"), max_wait_ms=0.0, model_dir=tmp_path / "model",
                    reload_interval_s=0.05)
    with TestClient(app) as c:
        assert c.get("/health").json()["version"] == "v000001"
        flight = InFlight(c)
        flight.post("in-model", {"session": probe, "k": K}, admitted=1)
        assert gate.entered.wait(10)
        flight.post("queued", {"session": probe, "k": K}, admitted=2)  # encoded by version 1
        versioned(tmp_path / "model", "v000002", other_pipe)
        wait_until(lambda: c.get("/health").json()["version"] == "v000002")
        flight.post("after", {"session": probe, "k": K}, admitted=3)  # encoded by version 2
        gate.release.set()
        replies = flight.join()
        (tmp_path / "model" / "versions" / "v000003").mkdir()  # a version that cannot be loaded
        write_text(tmp_path / "model" / "CURRENT", "v000003\n")
        wait_until(lambda: c.get("/health").json()["reload_error"] is not None)
        health = c.get("/health").json()
        still = c.post("/recommend", json={"session": probe, "k": K})
        metrics = c.get("/metrics").text
        write_text(tmp_path / "model" / "CURRENT", "v000002\n")  # the pointer back on the version served
        wait_until(lambda: c.get("/health").json()["reload_error"] is None)
        assert c.get("/health").json()["version"] == "v000002"
    assert replies["in-model"].json()["recommendations"] == expected(pipe, [probe])
    assert replies["queued"].json()["recommendations"] == expected(pipe, [probe])
    assert replies["after"].json()["recommendations"] == expected(other_pipe, [probe])
    assert gate.calls == [1, 1]  # version 1 scored its two requests; version 2 is not gated
    assert health["version"] == "v000002" and health["status"] == "ok"
    assert health["reload_error"].startswith("FileNotFoundError: ") and "v000003" in health["reload_error"]
    assert still.json()["recommendations"] == expected(other_pipe, [probe])
    assert sample(metrics, "sessrec_reloads_total", result="ok") == 1
    assert sample(metrics, "sessrec_reloads_total", result="failed") == 1


def test_resolve_reads_the_current_version_pointer(pipe, tmp_path: Path) -> None:
    plain = pipe.save_pretrained(tmp_path / "plain")
    assert resolve(plain) == plain
    assert Served.load(plain).version is None
    root = tmp_path / "versioned"
    version = versioned(root, "v000007", pipe)
    assert resolve(root) == version
    assert Served.load(root).version == "v000007"
    (root / "CURRENT").write_text("../plain\n")
    with pytest.raises(ValueError, match="names version '../plain', not a version of the form v000001"):
        resolve(root)
    (root / "CURRENT").write_text("v000008")
    with pytest.raises(FileNotFoundError, match="names version v000008, which .* does not hold"):
        resolve(root)


def test_a_version_folder_served_by_itself_is_named_by_its_version(pipe, sessions, tmp_path: Path) -> None:
    """``--model_dir runs/x/model/versions/v000002`` pins a version: /health, the answer's header and the served
    log name it, as they do when the pointer names it."""
    import pyarrow.parquet as pq

    from sessrec.serving.served_log import ServedLog, served_files

    root = tmp_path / "model"
    pipe.save_pretrained(root)
    pipe.save_pretrained(root)  # v000002 current
    (root / "CURRENT").write_text("v000001\n")
    pinned = root / "versions" / "v000002"
    served = Served.load(pinned)
    assert (served.path, served.version) == (pinned, "v000002")
    app = build_app(served, model_dir=pinned, reload_interval_s=0.05, served_log=ServedLog(tmp_path / "log"))
    with TestClient(app) as c:
        time.sleep(0.2)  # a few reads of the pinned folder: nothing to reload
        assert c.get("/health").json()["version"] == "v000002"
        reply = c.post("/recommend", json={"session": sessions[0], "k": K, "session_ids": ["s"]})
    assert reply.headers["x-model-version"] == "v000002"
    assert pq.read_table(served_files(tmp_path / "log")).column("model_version").to_pylist() == ["v000002"]


def test_a_session_model_is_served_in_mixed_batches_as_alone(data) -> None:
    torch.manual_seed(0)
    task = NextItemTask(num_items=data.num_items, max_length=10, encoder=XLNetEncoder(d_model=16, n_head=2, n_layer=1),
                        objective=MaskedItemModeling())
    task.vocab = data.vocab
    model = SessionModelService(task.recommender())
    raw = data.vocab.raw_ids.slice(2).to_pylist()
    parts = [[raw[:3], raw[5:6]], [raw[10:22]], [raw[30:32]]]  # widths 3, 10 (the last 10 of 12) and 2
    joined = join_sessions([model.encode(check_request(p)) for p in parts])
    assert joined.items.shape == (4, 10)
    batched = model.decode(model.recommend_batch(joined, 5))
    alone = [r for p in parts for r in model.recommend(p, k=5)]
    assert [r["item_ids"] for r in batched] == [r["item_ids"] for r in alone]
    for b, a in zip(batched, alone):
        assert b["scores"] == pytest.approx(a["scores"], abs=1e-5)
    with pytest.raises(ValueError, match="is not in the model's vocabulary"):
        model.recommend([[UNKNOWN]], on_unknown="error")


def test_a_session_with_times_batched_with_sessions_without_is_scored_with_its_times(data) -> None:
    torch.manual_seed(0)
    task = NextItemTask(num_items=data.num_items, max_length=10, encoder=HSTUEncoder(d_model=16, n_head=2, n_layer=1),
                        objective=CausalLanguageModeling())
    task.vocab = data.vocab
    with torch.no_grad():  # an untrained HSTU's time biases are 0: make its answer depend on the event times
        for name, parameter in task.model.named_parameters():
            if name.endswith("time_bias"):
                parameter.normal_(0.0, 3.0)
    model = SessionModelService(task.recommender())
    raw = data.vocab.raw_ids.slice(2).to_pylist()
    timed = {"session": raw[:3], "times": [1.7e9, 1.7e9 + 3600, 1.7e9 + 90_000], "k": K}
    bodies = [timed] + [{"session": raw[i : i + 2], "k": K} for i in range(5, 11)]
    with TestClient(build_app(model, max_batch_size=8, max_wait_ms=300.0)) as c:
        replies = post_concurrently(c, bodies)
        assert c.get("/metadata").json()["batching"]["model_calls"] < len(bodies)  # the untimed ones batched
    alone = model.recommend([timed["session"]], k=K, times=[timed["times"]])
    assert alone != model.recommend([timed["session"]], k=K)  # the times change the answer
    expected = [alone] + [model.recommend([body["session"]], k=K) for body in bodies[1:]]
    for reply, (want,) in zip(replies, expected):
        (got,) = reply.json()["recommendations"]
        assert got["item_ids"] == want["item_ids"]
        assert got["scores"] == pytest.approx(want["scores"], abs=1e-5)


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="k_max must be an integer >= 1, got 0"):
        Limits(k_max=0)
    with pytest.raises(ValueError, match="max_queue must be an integer >= 1, got 0"):
        Overload(max_queue=0)
    with pytest.raises(ValueError, match="deadline_ms must be a positive number of milliseconds, got -1"):
        Overload(deadline_ms=-1)
    with pytest.raises(ValueError, match=r"max_queue_wait_ms \(2000\) must be at most deadline_ms \(1000\)"):
        Overload(max_queue_wait_ms=2000)


def test_a_queue_smaller_than_a_request_is_refused_before_serving(pipe, tmp_path: Path) -> None:
    """A request of more sessions than the queue holds would get 503 "busy, retry" every time."""
    message = (r"^max_queued_sessions \(4\) must be at least max_sessions_per_request \(256\): a request of more "
               r"sessions than the queue holds would be refused as busy every time it is sent$")
    with pytest.raises(ValueError, match=message):
        build_app(pipe, overload=Overload(max_queued_sessions=4))
    with pytest.raises(ValueError, match=message):  # before the model is loaded or a worker starts
        serve(tmp_path / "nowhere", max_queued_sessions=4, workers=2)
    build_app(pipe, limits=Limits(max_sessions_per_request=4), overload=Overload(max_queued_sessions=4))


def test_serve_binds_loopback_unless_told(pipe, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert inspect.signature(serve).parameters["host"].default == "127.0.0.1"
    calls = []
    monkeypatch.setattr(server.DrainingServer, "run", lambda self: calls.append(self.config))
    directory = pipe.save_pretrained(tmp_path / "pipeline")
    serve(directory, port=8123)
    serve(directory, host="0.0.0.0", port=8124)
    assert [(c.host, c.port) for c in calls] == [("127.0.0.1", 8123), ("0.0.0.0", 8124)]
    with pytest.raises(FileNotFoundError, match="neither a saved pipeline"):
        serve(tmp_path)
    with pytest.raises(FileNotFoundError, match="neither a saved pipeline"):  # before any worker starts
        serve(tmp_path, workers=2)
    with pytest.raises(ValueError, match="workers must be an integer >= 1, got 0"):
        serve(directory, workers=0)
    assert serving_app.Served(pipe).describe() == {"kind": "Pipeline", "version": None, "vocabulary_size": len(pipe.vocab),
                                              "items": pipe.vocab.num_products}


def test_a_served_log_folder_that_cannot_be_written_is_refused_in_one_line_before_any_worker(
        pipe, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "run_workers", lambda worker, count: pytest.fail("a worker was started"))
    monkeypatch.setattr(server.Worker, "run", lambda self: pytest.fail("the model was loaded"))
    directory = pipe.save_pretrained(tmp_path / "pipeline")
    (tmp_path / "file").write_text("")
    for workers in (1, 2):
        with pytest.raises(PermissionError, match=f"^--served_log {tmp_path / 'file'} is a file; name a folder$"):
            serve(directory, served_log=str(tmp_path / "file"), workers=workers)
        with pytest.raises(PermissionError, match=f"^--served_log {tmp_path / 'file' / 'log'}: {tmp_path / 'file'} is a "
                                                  "file, not a folder$"):
            serve(directory, served_log=str(tmp_path / "file" / "log"), workers=workers)
        with pytest.raises(ValueError, match=f"^--served_log {directory / 'log'} is inside {directory}, which the command "
                                             "reads; name another folder$"):
            serve(directory, served_log=str(directory / "log"), workers=workers)
    assert not (directory / "log").exists()


@pytest.mark.slow
def test_workers_share_one_port_sum_their_metrics_and_stop_together(pipe, sessions, tmp_path: Path) -> None:
    """``serve(workers=2)``: two processes answer on one port, /metrics counts the requests of both,
    SIGTERM stops both (exit 0); a worker that dies stops the server with a message naming it; a server
    killed outright (SIGKILL) leaves no worker behind, nor its port taken."""
    directory = pipe.save_pretrained(tmp_path / "pipeline")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code = ("import torch; torch.set_num_threads(1)\nfrom sessrec.serving.server import serve\n"
            f"serve({str(directory)!r}, port={port}, workers=2, log_level='warning', access_log=False)\n")
    url = f"http://127.0.0.1:{port}"

    def start() -> tuple[subprocess.Popen, list[int]]:
        running = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stderr=subprocess.PIPE, text=True)
        wait_until(lambda: healthy(url), timeout_s=120)
        children = Path(f"/proc/{running.pid}/task/{running.pid}/children").read_text().split()
        return running, [int(pid) for pid in children]

    running, children = start()
    workers = {pid for pid in children if "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text()}
    assert len(workers) == 2
    pids, statuses = set(), []
    for i in range(40):  # a new connection each: the kernel hands them to either worker
        with httpx.Client(base_url=url) as client:
            statuses.append(client.post("/recommend", json={"session": sessions[i % 16], "k": K}).status_code)
            pids.add(client.get("/metadata").json()["worker_pid"])
    metrics = httpx.get(f"{url}/metrics").text
    assert statuses == [200] * 40 and pids <= workers
    assert sample(metrics, "sessrec_requests_total", route="/recommend", status="200") == 40  # both workers' counts
    assert sample(metrics, "sessrec_batch_sessions_sum") == 40
    running.terminate()
    assert "Traceback" not in running.communicate(timeout=60)[1] and running.returncode == 0
    assert not any(Path(f"/proc/{pid}").exists() for pid in workers)

    running, children = start()
    worker = next(pid for pid in children if "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text())
    os.kill(worker, signal.SIGKILL)
    stderr = running.communicate(timeout=60)[1]
    assert running.returncode == 1
    assert stderr.strip().endswith(f"sessrec serve: worker {worker} exited with code -9; the other workers were stopped")

    running, children = start()  # the server killed outright: its workers stop by themselves and free the port
    workers = {pid for pid in children if "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text()}
    running.kill()
    running.communicate(timeout=60)
    wait_until(lambda: not any(alive(pid) for pid in workers), timeout_s=60)
    with socket.socket() as again:
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        again.bind(("127.0.0.1", port))


@pytest.mark.slow
def test_workers_shutting_down_refuse_new_connections_and_answer_the_admitted_ones(pipe, sessions, tmp_path) -> None:
    """On SIGTERM the server closes its own copy of the shared listening socket, as each worker closes its own:
    a connection made while the workers answer their admitted requests is refused (the client may go
    elsewhere), not accepted into a backlog that nobody serves and reset once the server exits."""
    directory = pipe.save_pretrained(tmp_path / "pipeline")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code = ("import torch; torch.set_num_threads(1)\nfrom sessrec.serving.server import serve\n"
            f"serve({str(directory)!r}, port={port}, workers=2, log_level='warning', access_log=False, "
            "max_wait_ms=3000.0, max_queue_wait_ms=4000.0, deadline_ms=8000.0)\n")  # a request waits 3 s in its batch
    url = f"http://127.0.0.1:{port}"
    running = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    wait_until(lambda: healthy(url), timeout_s=120)
    replies = []
    admitted = threading.Thread(target=lambda: replies.append(httpx.post(f"{url}/recommend", timeout=30, json={
        "session": sessions[0], "k": K})))
    admitted.start()
    time.sleep(1.0)
    running.terminate()
    time.sleep(1.0)  # the workers stopped accepting; the admitted request waits in its batch
    with socket.socket() as late:
        late.settimeout(5)
        with pytest.raises(ConnectionRefusedError):
            late.connect(("127.0.0.1", port))
    admitted.join(30)
    assert "Traceback" not in running.communicate(timeout=60)[1] and running.returncode == 0
    assert [r.status_code for r in replies] == [200]


def alive(pid: int) -> bool:
    """Whether process `pid` runs (an exited one not yet reaped, a zombie, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def test_a_served_log_keeps_what_each_request_got_and_refuses_bad_session_ids(pipe, sessions, tmp_path) -> None:
    import pyarrow.parquet as pq

    from sessrec.serving.served_log import ServedLog

    with TestClient(build_app(pipe, served_log=ServedLog(tmp_path / "log"))) as c:
        reply = c.post("/recommend", json={"sessions": sessions[:2], "k": 3, "session_ids": ["a", 7]},
                       headers={"X-Request-Id": "req-1"})
        one = c.post("/recommend", json={"session": sessions[2], "k": 2, "session_ids": "s3"})
        short = c.post("/recommend", json={"sessions": sessions[:2], "k": 3, "session_ids": ["a"]})
        typed = c.post("/recommend", json={"sessions": sessions[:1], "k": 3, "session_ids": [1.5]})
    assert reply.status_code == one.status_code == 200
    assert (short.status_code, short.json()["error"]) == (422, "session_ids must be a list of one id per session (2), "
                                                                "got ['a']")
    assert (typed.status_code, typed.json()["error"]) == (422, "session_ids[0] must be a string or an integer, got 1.5")
    log = pq.read_table(tmp_path / "log").sort_by("served_at").to_pylist()  # closed with the app
    assert [(r["request_id"], r["session_index"], r["session_id"]) for r in log[:2]] == [("req-1", 0, "a"),
                                                                                         ("req-1", 1, "7")]
    assert log[2]["session_id"] == "s3" and len(log[2]["request_id"]) == 32  # a random id without X-Request-Id
    answered = reply.json()["recommendations"] + one.json()["recommendations"]
    assert [r["recommended"] for r in log] == [[str(i) for i in a["item_ids"]] for a in answered]
    assert [r["items"] for r in log] == [[str(i) for i in s] for s in sessions[:3]]


def test_an_int_id_given_as_text_is_read_only_as_the_model_writes_it(pipe, sessions, tmp_path) -> None:
    """``"01050"`` is not read as 1050, as ``"+1050"`` and ``" 1050"`` are not: each is a 422 naming the session, the
    position and the id, so that the served log stores only ids the event logs and `sessrec monitor` match."""
    import pyarrow.parquet as pq

    from sessrec.serving.served_log import ServedLog

    first, second = sessions[1]  # two ids
    with TestClient(build_app(pipe, served_log=ServedLog(tmp_path / "log"))) as c:
        refused = {text: c.post("/recommend", json={"sessions": [[str(first)], [str(first), text]], "k": 3})
                   for text in (f"0{second}", f"+{second}", f" {second}", f"{second} ")}
        canonical = c.post("/recommend", json={"session": [str(first), str(second)], "k": 3})
    for text, reply in refused.items():
        assert (reply.status_code, reply.json()["error"]) == (
            422, f"session 1, position 1: item id {text!r} is not written as the model's int64 ids are (no leading "
                 f"zeros, '+' or spaces): give {str(second)!r} or {second}")
    assert canonical.status_code == 200
    assert canonical.json()["recommendations"] == pipe.recommend([[first, second]], k=3)
    log = pq.read_table(tmp_path / "log").to_pylist()
    assert [r["items"] for r in log] == [[str(first), str(second)]]  # the refused requests left no rows


def test_a_query_parameter_on_recommend_is_refused_naming_it(client, sessions) -> None:
    """``/recommend?k=3`` would answer with the body's k (20) and no word: it is a 422 naming the parameter and
    the body's field it belongs in."""
    reply = client.post("/recommend?k=3", json={"session": sessions[1]})
    assert (reply.status_code, reply.json()["error"]) == (
        422, "query parameter 'k' of POST /recommend?k=3 is not read: the settings are fields of the JSON body "
             "(\"k\": 3); the fields are ['k', 'now', 'on_unknown', 'session', 'session_ids', 'sessions', 'times']")
    flag = client.post("/recommend?debug", json={"session": sessions[1]})
    assert flag.status_code == 422 and flag.json()["error"].startswith("query parameter 'debug' of POST /recommend?debug")
    assert client.post("/recommend", json={"session": sessions[1], "k": 3}).status_code == 200
