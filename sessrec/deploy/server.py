"""HTTP server for a recommender: raw-id sessions in, raw ids and scores out, with dynamic batching.

``POST /recommend`` takes ``{"sessions": [[id, ...], ...], "k": 20, "on_unknown": "oov"}`` (or one
``{"session": [...]}``) and answers ``{"recommendations": [{"item_ids": [...], "scores": [...]}, ...]}``;
``GET /health`` says what is loaded; ``GET /metadata`` adds the limits and the batching counters.

The server is thin: the request is parsed and checked at the edge (every refusal is a 4xx with a
one-line ``{"error": ...}``), and the model is called in one place, `Batcher`, which gathers the
sessions of concurrent requests into one ``recommend`` call (at most `max_batch_size` sessions,
waiting at most `max_wait_ms` after the first) and runs it in a worker thread, so the event loop
keeps accepting requests while torch computes. FastAPI + uvicorn with this small batcher rather
than LitServe: LitServe batches whole requests in a separate worker process, so one bad request
fails every request of its batch, a request of several sessions is one batch element, and the
batch counters would have to cross a process boundary.

Any object with ``recommend(sessions, k, on_unknown) -> [{"item_ids", "scores"}]`` can be served
(`Recommender`); `Pipeline` is one.

Example (then ``curl -s localhost:8000/recommend -d '{"session": [214536502, 214536500], "k": 5}'``):
    >>> from sessrec.deploy.server import serve
    >>> serve("runs/pipeline_rsc15/pipeline", port=8000)  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from sessrec.deploy.recommender import load_recommender

logger = logging.getLogger(__name__)

OnUnknown = Literal["oov", "error"]
_FIELDS = {"session", "sessions", "k", "on_unknown"}
_INT64_MAX = 2**63 - 1


class Recommender(Protocol):
    """What the server wraps: raw-id sessions -> per session ``{"item_ids": [...], "scores": [...]}``."""

    def recommend(self, sessions: Sequence[Sequence[Any]], k: int = 20, on_unknown: str = "oov") -> list[dict]: ...


@dataclass(frozen=True)
class Limits:
    """Bounds on one request, checked before it reaches the model.

    Args:
        max_request_bytes: largest body, counted on the bytes received (with or without Content-Length).
        max_sessions_per_request: most sessions in one request.
        max_items_per_session: most item ids in one session (the model reads only the most recent ones).
        k_max: largest ``k``.
    """

    max_request_bytes: int = 1 << 20
    max_sessions_per_request: int = 256
    max_items_per_session: int = 1_000
    k_max: int = 100

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")


class RequestError(Exception):
    """A request refused with an HTTP status and a one-line message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


@dataclass
class Query:
    """One parsed request: its sessions and settings."""

    sessions: list[list[Any]]
    k: int = 20
    on_unknown: OnUnknown = "oov"


def parse_request(body: bytes, limits: Limits) -> Query:
    """Check a ``/recommend`` body and return its `Query`; raise `RequestError` naming the problem."""
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError is a ValueError
        raise RequestError(400, f"body is not valid JSON: {err}") from None
    if not isinstance(payload, dict):
        raise RequestError(422, f"body must be a JSON object, got {type(payload).__name__}")
    unknown = sorted(set(payload) - _FIELDS)
    if unknown:
        raise RequestError(422, f"unknown field(s) {unknown}; the fields are {sorted(_FIELDS)}")
    if ("session" in payload) == ("sessions" in payload):
        raise RequestError(422, 'give either "sessions" (a list of sessions) or "session" (one list of item ids)')
    sessions = payload["sessions"] if "sessions" in payload else [payload["session"]]
    if not isinstance(sessions, list) or not sessions:
        raise RequestError(422, '"sessions" must be a non-empty list of sessions, each a list of item ids')
    if len(sessions) > limits.max_sessions_per_request:
        raise RequestError(
            413, f"{len(sessions)} sessions in one request; the limit is {limits.max_sessions_per_request}"
        )
    for row, session in enumerate(sessions):
        _check_session(row, session, limits)
    k = payload.get("k", 20)
    if type(k) is not int or not 1 <= k <= limits.k_max:
        raise RequestError(422, f'"k" must be an integer in [1, {limits.k_max}], got {k!r}')
    on_unknown = payload.get("on_unknown", "oov")
    if on_unknown not in ("oov", "error"):
        raise RequestError(422, f'"on_unknown" must be "oov" or "error", got {on_unknown!r}')
    return Query(sessions, k, on_unknown)


def _check_session(row: int, session: Any, limits: Limits) -> None:
    if not isinstance(session, list):
        raise RequestError(422, f"session {row} must be a list of item ids, got {type(session).__name__}")
    if not session:
        raise RequestError(422, f"session {row} is empty: give at least one item id")
    if len(session) > limits.max_items_per_session:
        raise RequestError(
            413, f"session {row} has {len(session)} items; the limit is {limits.max_items_per_session} per session"
        )
    kinds = {type(item) for item in session}
    if not kinds <= {str, int}:  # bool and float are not ids; the vocabulary casts str <-> int itself
        bad = next(item for item in session if type(item) not in (str, int))
        raise RequestError(422, f"session {row}: item ids must be strings or integers, got {bad!r}")
    if int in kinds:
        ints = [item for item in session if type(item) is int]
        low, high = min(ints), max(ints)
        if low < -_INT64_MAX - 1 or high > _INT64_MAX:
            bad = high if high > _INT64_MAX else low
            raise RequestError(422, f"session {row}: item id {bad} does not fit in a 64-bit integer")


@dataclass
class _Job:
    query: Query
    future: asyncio.Future


@dataclass
class BatchStats:
    """Counters of the model calls: how many sessions each call scored (proves the batching)."""

    requests: int = 0
    calls: Counter = field(default_factory=Counter)  # sessions per call -> number of calls

    def summary(self) -> dict[str, Any]:
        calls = sum(self.calls.values())
        sessions = sum(size * n for size, n in self.calls.items())
        return {
            "requests": self.requests,
            "model_calls": calls,
            "sessions": sessions,
            "mean_sessions_per_call": round(sessions / calls, 3) if calls else 0.0,
            "max_sessions_per_call": max(self.calls, default=0),
            "sessions_per_call": {str(size): n for size, n in sorted(self.calls.items())},
        }


class Batcher:
    """Dynamic batching: the sessions of concurrent requests scored in one ``recommend`` call.

    One worker task takes the first waiting request, then more until `max_batch_size` sessions or
    `max_wait_ms` after the first; requests with the same ``k`` and ``on_unknown`` share one call,
    run in a thread. When a shared call fails on a client error (ValueError / TypeError), each request
    of it is run alone, so only the faulty one is refused, with a message about its own sessions.

    Args:
        recommender: the model.
        max_batch_size: most sessions per model call (a larger request runs alone).
        max_wait_ms: longest wait for more requests after the first of a batch.
    """

    def __init__(self, recommender: Recommender, max_batch_size: int = 64, max_wait_ms: float = 2.0) -> None:
        if max_batch_size < 1 or max_wait_ms < 0:
            raise ValueError(f"max_batch_size must be >= 1 and max_wait_ms >= 0, got {max_batch_size}, {max_wait_ms}")
        self.recommender, self.max_batch_size, self.max_wait = recommender, max_batch_size, max_wait_ms / 1e3
        self.stats = BatchStats()
        self._queue: asyncio.Queue[_Job] | None = None
        self._held: _Job | None = None  # taken from the queue but too large for the batch being built
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        self._queue = asyncio.Queue()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def submit(self, query: Query) -> list[dict]:
        """The recommendations of one request, scored with whatever else is waiting."""
        if self._queue is None:
            raise RuntimeError("the batcher is not started: run the app under its lifespan (uvicorn, TestClient)")
        future = asyncio.get_running_loop().create_future()
        self.stats.requests += 1
        await self._queue.put(_Job(query, future))
        return await future

    async def _next_batch(self) -> list[_Job]:
        assert self._queue is not None
        first = self._held or await self._queue.get()
        self._held, batch, size = None, [first], len(first.query.sessions)
        deadline = asyncio.get_running_loop().time() + self.max_wait
        while size < self.max_batch_size:
            timeout = deadline - asyncio.get_running_loop().time()
            try:
                job = self._queue.get_nowait() if timeout <= 0 else await asyncio.wait_for(self._queue.get(), timeout)
            except (asyncio.QueueEmpty, asyncio.TimeoutError):
                break
            if size + len(job.query.sessions) > self.max_batch_size:
                self._held = job
                break
            batch.append(job)
            size += len(job.query.sessions)
        return batch

    async def _run(self) -> None:
        while True:
            batch = await self._next_batch()
            groups: dict[tuple[int, str], list[_Job]] = {}
            for job in batch:
                groups.setdefault((job.query.k, job.query.on_unknown), []).append(job)
            for jobs in groups.values():
                await self._score(jobs)

    async def _score(self, jobs: list[_Job]) -> None:
        jobs = [job for job in jobs if not job.future.done()]  # a client that went away
        if not jobs:
            return
        k, on_unknown = jobs[0].query.k, jobs[0].query.on_unknown
        sessions = [s for job in jobs for s in job.query.sessions]
        try:
            out = await asyncio.to_thread(self.recommender.recommend, sessions, k, on_unknown)
            if len(out) != len(sessions):
                raise RuntimeError(f"the recommender returned {len(out)} lists for {len(sessions)} sessions")
        except (ValueError, TypeError) as err:
            if len(jobs) > 1:
                for job in jobs:
                    await self._score([job])
                return
            _resolve(jobs[0].future, exception=RequestError(422, str(err)))
            return
        except Exception as err:  # any other failure is the server's: logged, 500
            logger.exception("recommend failed on a batch of %d sessions", len(sessions))
            for job in jobs:
                _resolve(job.future, exception=err)
            return
        finally:
            self.stats.calls[len(sessions)] += 1
        start = 0
        for job in jobs:
            end = start + len(job.query.sessions)
            _resolve(job.future, result=out[start:end])
            start = end


def _resolve(future: asyncio.Future, result: Any = None, exception: BaseException | None = None) -> None:
    if future.done():
        return
    if exception is not None:
        future.set_exception(exception)
    else:
        future.set_result(result)


async def _read_body(request: Request, max_bytes: int) -> bytes:
    """The body, refused with 413 as soon as it passes `max_bytes` (declared or received: chunked bodies too)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise RequestError(413, f"body of {int(declared)} bytes; the limit is {max_bytes} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise RequestError(413, f"body over {max_bytes} bytes; the limit is {max_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def describe(recommender: Recommender) -> dict[str, Any]:
    """What `/health` reports of a recommender: its kind and, where it has one, its vocabulary size."""
    info: dict[str, Any] = {"kind": type(recommender).__name__}
    vocab = getattr(recommender, "vocab", None)
    if vocab is not None:
        info["vocabulary_size"] = len(vocab)
        info["items"] = int(getattr(vocab, "num_products", len(vocab)))
    return info


def build_app(
    recommender: Recommender,
    max_batch_size: int = 64,
    max_wait_ms: float = 2.0,
    limits: Limits | None = None,
    info: dict[str, Any] | None = None,
) -> FastAPI:
    """The ASGI app serving `recommender` (see the module docstring for the routes).

    Args:
        recommender: any object with ``recommend(sessions, k, on_unknown)``.
        max_batch_size: most sessions per model call.
        max_wait_ms: longest wait for more requests after the first of a batch.
        limits: bounds on one request (defaults: `Limits()`).
        info: what `/health` reports; defaults to `describe(recommender)`.

    Returns:
        The FastAPI app; the batcher runs under its lifespan (`app.state.batcher`).
    """
    limits = limits if limits is not None else Limits()
    info = info if info is not None else describe(recommender)
    batcher = Batcher(recommender, max_batch_size, max_wait_ms)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await batcher.start()
        yield
        await batcher.stop()

    app = FastAPI(title="sessrec", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.batcher = batcher

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", **info}

    @app.get("/metadata")
    async def metadata() -> dict[str, Any]:
        batching = {"max_batch_size": max_batch_size, "max_wait_ms": max_wait_ms, **batcher.stats.summary()}
        return {**info, "limits": asdict(limits), "batching": batching}

    @app.post("/recommend")
    async def recommend(request: Request) -> JSONResponse:
        try:
            query = parse_request(await _read_body(request, limits.max_request_bytes), limits)
            recommendations = await batcher.submit(query)
        except RequestError as err:
            return JSONResponse({"error": err.message}, status_code=err.status)
        except Exception:  # noqa: BLE001 - logged where it happened (Batcher._score)
            return JSONResponse({"error": "internal error while recommending; see the server log"}, status_code=500)
        return JSONResponse({"recommendations": recommendations})

    return app


def serve(
    model_dir: str | os.PathLike,
    host: str = "127.0.0.1",
    port: int = 8000,
    max_batch_size: int = 64,
    max_wait_ms: float = 2.0,
    max_request_bytes: int = 1 << 20,
    max_items_per_session: int = 1_000,
    max_sessions_per_request: int = 256,
    k_max: int = 100,
    log_level: str = "info",
    access_log: bool = True,
) -> None:
    """Load the recommender saved in `model_dir` and serve it over HTTP until interrupted.

    Args:
        model_dir: a saved pipeline (``pipeline.json``) or session model directory (``config.json``).
        host: address to bind; loopback only by default, ``0.0.0.0`` to accept other machines.
        port: TCP port.
        max_batch_size: most sessions scored in one model call (dynamic batching).
        max_wait_ms: longest wait for more requests after the first of a batch (adds at most this to latency).
        max_request_bytes: largest request body (413 beyond).
        max_items_per_session: most item ids per session (413 beyond).
        max_sessions_per_request: most sessions per request (413 beyond).
        k_max: largest ``k`` a request may ask for (422 beyond).
        log_level: uvicorn's log level.
        access_log: log one line per request.
    """
    import uvicorn

    limits = Limits(max_request_bytes, max_sessions_per_request, max_items_per_session, k_max)
    app = build_app(load_recommender(model_dir), max_batch_size, max_wait_ms, limits)
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=access_log)
