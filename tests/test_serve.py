"""The HTTP server (`sessrec.deploy.server`) on a tiny co-visitation pipeline, in process.

The pipeline: `SyntheticSource` sessions (60 items, int64 raw ids), a `CoVisitation` retriever
fitted on the training split, no ranker. Requests go through FastAPI's TestClient (the app's
lifespan runs the batcher); concurrent requests come from threads. The benchmark script's smoke
run starts a real uvicorn server on a free loopback port.
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient

from sessrec.data import SessionDataModule, SyntheticSource
from sessrec.deploy import server
from sessrec.deploy.server import Limits, build_app, serve
from sessrec.pipeline.pipeline import Pipeline
from sessrec.pipeline.retrieval.covisitation import CoVisitation

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
K = 5
UNKNOWN = 99_999_999  # a raw id the vocabulary does not hold


@pytest.fixture(scope="module")
def pipe() -> Pipeline:
    dm = SessionDataModule(source=SyntheticSource(num_sessions=400, num_items=60, days=10), max_length=10)
    train, _ = dm.tensors("train")
    return Pipeline(dm.vocab, {"covisitation": (CoVisitation().fit(train, dm.num_items), 20)}, max_length=10,
                    max_candidates=20)


@pytest.fixture(scope="module")
def sessions(pipe: Pipeline) -> list[list[int]]:
    raw = pipe.vocab.raw_ids.slice(2).to_pylist()
    return [raw[i : i + 1 + i % 4] for i in range(16)]


@pytest.fixture(scope="module")
def client(pipe: Pipeline) -> Iterator[TestClient]:
    with TestClient(build_app(pipe, max_batch_size=8, max_wait_ms=1.0)) as c:
        yield c


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


def test_recommend_returns_the_pipelines_raw_ids_and_scores(client, pipe, sessions) -> None:
    reply = client.post("/recommend", json={"sessions": sessions[:4], "k": K})
    assert reply.status_code == 200
    assert reply.json()["recommendations"] == pipe.recommend(sessions[:4], k=K)
    one = client.post("/recommend", json={"session": [str(i) for i in sessions[5]]})  # ids as strings, k = 20
    assert one.json()["recommendations"] == pipe.recommend([sessions[5]], k=20)
    unknown = client.post("/recommend", json={"session": [UNKNOWN, sessions[0][0]], "k": K})
    assert unknown.json()["recommendations"] == pipe.recommend([[UNKNOWN, sessions[0][0]]], k=K)  # scored as OOV


def test_health_and_metadata_say_what_is_served(client, pipe) -> None:
    assert client.get("/health").json() == {"status": "ok", "kind": "Pipeline", "vocabulary_size": len(pipe.vocab),
                                            "items": pipe.vocab.num_products}
    meta = client.get("/metadata").json()
    assert meta["limits"] == {"max_request_bytes": 1 << 20, "max_sessions_per_request": 256,
                              "max_items_per_session": 1000, "k_max": 100}
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


def test_a_bad_request_in_a_batch_fails_alone(pipe, sessions) -> None:
    bodies = [{"session": sessions[0], "k": K, "on_unknown": "error"},
              {"session": [sessions[1][0], UNKNOWN], "k": K, "on_unknown": "error"},
              {"session": sessions[2], "k": K, "on_unknown": "error"}]
    with TestClient(build_app(pipe, max_wait_ms=300.0)) as c:
        replies = post_concurrently(c, bodies)
        batching = c.get("/metadata").json()["batching"]
    assert [r.status_code for r in replies] == [200, 422, 200]
    assert batching["max_sessions_per_call"] == 3  # the shared call failed, then each request ran alone
    assert replies[1].json() == {"error": f"item id {UNKNOWN} is not in the model's vocabulary"}
    assert replies[2].json()["recommendations"] == pipe.recommend([sessions[2]], k=K)


@pytest.mark.parametrize(
    "body, status, message",
    [
        (b'{"sessions": [[1, 2]', 400, "body is not valid JSON"),
        (b"\xff\xfe", 400, "body is not valid JSON"),
        (b"[[1, 2]]", 422, "body must be a JSON object, got list"),
        (b'{"sessions": "abc"}', 422, '"sessions" must be a non-empty list'),
        (b'{"sessions": []}', 422, '"sessions" must be a non-empty list'),
        (b'{"sessions": [1031]}', 422, "session 0 must be a list of item ids, got int"),
        (b'{"session": [1031], "sessions": [[1031]]}', 422, 'give either "sessions"'),
        (b'{"session": [1031], "kk": 3}', 422, "unknown field(s) ['kk']"),
        (b'{"session": [1031], "k": "5"}', 422, '"k" must be an integer in [1, 100], got \'5\''),
        (b'{"session": [1031], "k": 0}', 422, '"k" must be an integer in [1, 100], got 0'),
        (b'{"session": [1031], "k": true}', 422, '"k" must be an integer'),
        (b'{"session": [1031], "k": 101}', 422, '"k" must be an integer in [1, 100], got 101'),
        (b'{"session": [1031], "on_unknown": "skip"}', 422, '"on_unknown" must be "oov" or "error"'),
        (b'{"session": [1031, 1.5]}', 422, "session 0: item ids must be strings or integers, got 1.5"),
        (b'{"session": [null]}', 422, "item ids must be strings or integers, got None"),
        (b'{"session": [[1031]]}', 422, "item ids must be strings or integers, got [1031]"),
        (b'{"session": [1031, 100000000000000000000000]}', 422, "item id 100000000000000000000000 does not fit"),
        (b'{"session": [-100000000000000000000000]}', 422, "item id -100000000000000000000000 does not fit"),
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


class Broken:
    """A recommender that fails as a server bug would."""

    def recommend(self, sessions, k=20, on_unknown="oov"):
        raise RuntimeError("index file truncated")


def test_a_server_error_is_a_generic_500_logged_and_the_server_stays_up(caplog) -> None:
    with TestClient(build_app(Broken())) as c:
        reply = c.post("/recommend", json={"session": [1]})
        assert c.get("/health").json() == {"status": "ok", "kind": "Broken"}
    assert reply.status_code == 500
    assert reply.json() == {"error": "internal error while recommending; see the server log"}
    assert "index file truncated" in caplog.text


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="k_max must be a positive integer, got 0"):
        Limits(k_max=0)


def test_serve_binds_loopback_unless_told(pipe, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import uvicorn

    assert inspect.signature(serve).parameters["host"].default == "127.0.0.1"
    calls = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: calls.append(kwargs))
    directory = pipe.save(tmp_path / "pipeline")
    serve(directory, port=8123)
    serve(directory, host="0.0.0.0", port=8124)
    assert [(c["host"], c["port"]) for c in calls] == [("127.0.0.1", 8123), ("0.0.0.0", 8124)]
    with pytest.raises(FileNotFoundError, match="neither a saved pipeline"):
        serve(tmp_path)
    assert server.describe(pipe)["kind"] == "Pipeline"


def test_load_benchmark_quick_run(pipe, tmp_path: Path) -> None:
    directory = pipe.save(tmp_path / "pipeline")
    done = subprocess.run(
        [sys.executable, "benchmarks/serve_load.py", "--model-dir", str(directory), "--data", str(tmp_path / "none"),
         "--concurrency", "1", "4", "--requests", "20", "--warmup", "2", "--seconds", "20"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r.get("concurrency") for r in records] == [1, 4, None]
    for r in records[:2]:
        assert r["requests"] == 20 and r["errors"] == 0 and r["p99_ms"] >= r["p50_ms"] > 0
    bad = records[2]
    assert bad["all_4xx"] and bad["server_alive"] and bad["health_after"] == 200
    assert bad["statuses"]["body_over_limit_chunked"] == 413 and bad["statuses"]["broken_json"] == 400
