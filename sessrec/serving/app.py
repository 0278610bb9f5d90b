"""The server's ASGI app (`build_app`): raw-id sessions in, raw ids and scores out, held under overload.

`sessrec.serving.server` serves it (``sessrec serve``), in one process or several.

Routes:
    ``POST /recommend``: ``{"sessions": [[id, ...], ...], "k": 20, "on_unknown": "oov"}`` (or one
        ``{"session": [...]}``), optionally with ``"times"`` (each session's event times in seconds,
        a list per session, from which the ranker's time features are built) and ``"now"`` (the
        request's time in seconds since the epoch, one or one per session, at which the allow/deny
        windows hold and which nothing else reads; default: each session's last event with
        ``"times"``, else its arrival) and ``"session_ids"`` (the client's id of each session, no two alike, which
        only the served log keeps, for ``sessrec monitor``'s join with the events that followed)
        -> ``{"recommendations": [{"item_ids": [...], "scores": [...]}, ...]}``, with an ``x-model-version``
        header: the version that answered every session, else each session's, in order (a canary).
    ``GET /health``: the model served (kind, version), its canary and the last reload error; 503 while shutting down.
    ``GET /metadata``: the limits, the overload settings and the batching counters (of the worker that answers).
    ``GET /metrics``: Prometheus text (requests by route and status, latency, sessions per model
        call, queue depth, requests shed; summed over the workers).

How a request goes (each refusal a one-line ``{"error": ...}``, a 404 or 405 of the routing too: `http_error`):

``POST /recommend`` is a plain ASGI route (`RecommendRoute`, taken before FastAPI's middleware
and routing by `App`); its bodies and answers are JSON through orjson.

1. **Admission** (`sessrec.serving.admission`, first thing in the route), before the body is read: past
   `Overload.max_queue` requests admitted and not yet answered, when the model is more than
   `Overload.max_queue_wait_ms` behind (the sessions waiting, at the pace of its recent calls), or
   once shutdown has begun, ``503`` with ``Retry-After``. A flood costs one small answer per request.
2. **Checks, alone**: a query string is refused (422 naming its parameter: the settings are the
   body's fields, `check_query`); the body is read (413 past `Limits.max_request_bytes`), parsed and checked
   (`parse_request`: the server's bounds, then `check_request`, the rules and messages of
   `Pipeline.recommend` too), and encoded by the model's vocabulary (``encode``: unknown ids under
   ``on_unknown="error"``, unreadable ids). A bad request fails here with a 4xx and never joins a
   batch. Bodies over 16 KiB are parsed in a worker thread, so the event loop stays free.
3. **Batching** (`Batcher`): encoded sessions wait in a queue bounded by
   `Overload.max_queued_sessions` (503 beyond); one worker joins those of concurrent requests (at
   most `max_batch_size` sessions, waiting at most `max_wait_ms`) and scores and decodes them in
   one call (``recommend_batch`` + ``decode``) on its own thread; the answers are serialised there too.
   Any failure there is the server's: 500, logged.
4. **Deadline**: a request not answered `Overload.deadline_ms` after it arrived gets ``504``; one
   whose deadline passed while it waited is dropped before it reaches the model.

`/health`, `/metadata` and `/metrics` never wait on the model: the event loop only parses small
bodies, hands work to threads and writes answers. The model can be swapped while serving
(`sessrec.serving.hot_reload`): the server follows a versioned model directory's ``CURRENT`` pointer, loads a new
version in a thread and serves it from the next batch on; requests already encoded finish on the
model that encoded them. A canary (`sessrec.serving.canary`), another version of the directory that
the directory records, answers the sessions whose ids hash below its share, loaded and followed the
same way; a request whose sessions go to both versions is split, each part encoded and scored by its
version. On shutdown the server refuses new requests (503) and answers those it
admitted before it stops. With several workers (`sessrec.serving.server.run_workers`) each process does all of this for
the connections it accepts on the one shared port.

FastAPI + uvicorn with this small batcher rather than LitServe: LitServe batches whole requests in a
separate worker process, so one bad request fails every request of its batch, and a request of
several sessions is one batch element.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import asdict
from time import perf_counter
from typing import Any

import numpy as np
import prometheus_client as prom
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.types import Receive, Scope, Send

from sessrec.pipeline.clock import short
from sessrec.serving.admission import Admission, Overload
from sessrec.serving.batching import Batcher, ServerFault, dumps
from sessrec.serving.canary import Part, canary_sessions, merge_answers, version_header
from sessrec.serving.hot_reload import ModelHolder
from sessrec.serving.recommender import Recommender, Served
from sessrec.serving.request import Limits, RequestError, check_query, parse_request
from sessrec.serving.request_metrics import MeasureRequests, Metrics
from sessrec.serving.served_log import ServedLog

logger = logging.getLogger(__name__)

INLINE_PARSE_BYTES = 16 * 1024  # bodies up to this are parsed on the event loop (well under a millisecond)


if sys.version_info >= (3, 11):

    async def _within(work: Awaitable[Response], seconds: float) -> Response:
        """`work`'s result, or TimeoutError after `seconds` (without the task that `wait_for` adds)."""
        async with asyncio.timeout(seconds):
            return await work

else:
    _within = asyncio.wait_for


class ClientLeft(Exception):
    """The client closed its connection before its request's body was read."""


class Busy(Exception):
    """A request refused with 503 after its checks: its sessions would take the queue past its bound."""


class RecommendRoute:
    """``POST /recommend`` as a plain ASGI app: counted and timed in `Metrics`, admitted by
    `Admission` (or refused with 503 before its body is read), read (413 past the byte limit),
    checked and encoded alone (`prepare`: by the live version, the canary, or each its share of the sessions),
    queued in the `Batcher`, answered by its deadline.

    Requests reach it without FastAPI's routing, middleware and request objects (`App`): the
    server's CPU per request is mostly this, the checks and the model.
    """

    def __init__(self, holder: ModelHolder, batcher: Batcher, admission: Admission, limits: Limits,
                 metrics: Metrics, parsers: list[ThreadPoolExecutor], served_log: ServedLog | None = None) -> None:
        self.holder, self.batcher, self.admission, self.limits, self.metrics = holder, batcher, admission, limits, metrics
        self.served_log = served_log
        self.overload, self.parsers = admission.overload, parsers
        self.deadline_s = self.overload.deadline_ms / 1e3
        self.busy = [(b"retry-after", str(self.overload.retry_after_s).encode())]
        self.latency = metrics.latency.labels("/recommend")
        self.counts: dict[int, Any] = {}  # status -> its counter (prometheus_client's labels() is a lookup with a lock)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        start, status = perf_counter(), 500
        try:
            status = await self.admit(scope, receive, send)
        finally:
            counter = self.counts.get(status)
            if counter is None:
                counter = self.counts[status] = self.metrics.requests.labels("/recommend", str(status))
            counter.inc()
            self.latency.observe(perf_counter() - start)

    async def admit(self, scope: Scope, receive: Receive, send: Send) -> int:
        """The request admitted and answered, or refused at arrival (see `Admission.refusal`); its status."""
        refusal = self.admission.refusal()
        if refusal is not None:
            reason, message = refusal
            self.metrics.shed.labels(reason).inc()
            return await self.error(send, 503, f"{message}; retry after {self.overload.retry_after_s} s", self.busy)
        self.admission.enter()
        try:
            return await self.answer(scope, receive, send)
        finally:
            self.admission.leave()

    async def answer(self, scope: Scope, receive: Receive, send: Send) -> int:
        arrival, start = time.time(), perf_counter()  # the request's time when it gives neither "now" nor "times"
        try:
            deadline = asyncio.get_running_loop().time() + self.deadline_s
            payload, parts = await _within(self.recommend(scope, receive, deadline, arrival), self.deadline_s)
        except RequestError as err:
            return await self.error(send, err.status, err.message)
        except Busy as err:
            self.metrics.shed.labels("queued_sessions_full").inc()
            return await self.error(send, 503, f"{err}; retry after {self.overload.retry_after_s} s", self.busy)
        except asyncio.TimeoutError:
            self.metrics.shed.labels("deadline").inc()
            return await self.error(send, 504, f"no answer within the deadline of {self.overload.deadline_ms:g} ms; "
                                    "the server is overloaded, retry later")
        except ClientLeft:  # the client left while sending its body: nobody to answer
            return await _send(send, 499, b"")
        except ServerFault:  # logged where it happened
            return await self.error(send, 500, "internal error while recommending; see the server log")
        except Exception:
            logger.exception("internal error while preparing a request")
            return await self.error(send, 500, "internal error while recommending; see the server log")
        took = perf_counter() - start
        for part in parts:
            labels = (part.served.version or "unversioned", "canary" if part.canary else "live")
            self.metrics.version_sessions.labels(*labels).inc(len(part.request.sessions))
            self.metrics.version_latency.labels(*labels).observe(took)
        return await _send(send, 200, payload, version_header(parts))

    async def recommend(self, scope: Scope, receive: Receive, deadline: float,
                        arrival: float) -> tuple[bytes, list[Part]]:
        """The JSON answer of the request whose body `receive` gives, and the parts of it each version answered."""
        check_query(scope.get("query_string", b""))  # the settings are the body's: a query parameter would go unread
        body = await _read_body(scope, receive, self.limits.max_request_bytes)
        holder = self.holder
        live, canary, share = holder.current, holder.canary, holder.share
        if len(body) <= INLINE_PARSE_BYTES:
            parts = self.prepare(body, live, canary, share, arrival)
        else:
            parts = await asyncio.get_running_loop().run_in_executor(
                self.parsers[0], self.prepare, body, live, canary, share, arrival)
        size = sum(len(part.sessions) for part in parts)
        if self.batcher.queued_sessions + size > self.overload.max_queued_sessions:
            raise Busy(f"the server is busy: {self.batcher.queued_sessions} sessions are waiting for the model")
        answers = [self.batcher.submit(part.sessions, part.request.k, part.served.recommender, deadline) for part in parts]
        results = [await answers[0]] if len(parts) == 1 else await asyncio.gather(*answers)
        if self.served_log is not None:  # every part answered: the request's rows, none of a 504 or a 500
            request_id = _request_id(scope)
            for part, (_, lists) in zip(parts, results, strict=True):
                self.record(request_id, part, lists)
        if len(parts) == 1:
            return results[0][0], parts
        return merge_answers(parts, [body for body, _ in results]), parts

    def prepare(self, body: bytes, live: Served, canary: Served | None, share: float, arrival: float) -> list[Part]:
        """The request parsed and checked alone (`parse_request`), its sessions split between the live version and the
        canary (`canary_sessions`), and each part encoded by its version's vocabulary (`encode`)."""
        request, session_ids = parse_request(body, self.limits)
        to_canary = None if canary is None else canary_sessions(session_ids, share, len(request.sessions))
        if to_canary is None or not to_canary.any():
            return [Part.encoded(live, False, request, session_ids, None, arrival)]
        if to_canary.all():
            return [Part.encoded(canary, True, request, session_ids, None, arrival)]
        return [Part.encoded(served, on_canary, request, session_ids, np.flatnonzero(to_canary == on_canary), arrival)
                for served, on_canary in ((live, False), (canary, True))]

    def record(self, request_id: str, part: Part, lists: list[dict[str, Any]]) -> None:
        """One part of an answered request into the served log (`ServedLog.record` only buffers the rows; its
        thread writes them); a failure is logged and never fails the request."""
        assert self.served_log is not None
        checked, now = part.request, part.sessions.now
        try:
            times = None
            if checked.times is not None:
                times = [t.tolist() for t in np.split(checked.times, np.cumsum(checked.lengths)[:-1])]
            self.served_log.record(request_id, checked.sessions, lists, model_version=part.served.version,
                                   now=None if now is None else now.tolist(), times=times, session_ids=part.session_ids,
                                   canary=part.canary, session_index=None if part.index is None else part.index.tolist(),
                                   k=checked.k, model_hash=part.served.model_hash)
        except Exception:  # the log never fails a request
            logger.exception("the served log failed to record a request")

    @staticmethod
    async def error(send: Send, status: int, message: str, headers: list[tuple[bytes, bytes]] | None = None) -> int:
        return await _send(send, status, dumps({"error": message}), headers)


def _request_id(scope: Scope) -> str:
    """The request's ``X-Request-Id`` header, else a new random id."""
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id":
            return value.decode("latin-1")[:128]
    return uuid.uuid4().hex


async def _send(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> int:
    """Answer `status` with a JSON `body`; returns `status`."""
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": head + headers if headers else head})
    await send({"type": "http.response.body", "body": body})
    return status


async def _read_body(scope: Scope, receive: Receive, max_bytes: int) -> bytes:
    """The body, refused with 413 as soon as it passes `max_bytes` (declared or received: chunked
    bodies too), and with 415 before it is read when it is compressed (a Content-Encoding other than
    identity, which the parser would call invalid JSON); `ClientLeft` when the client disconnects first."""
    for name, value in scope["headers"]:
        if name == b"content-length" and value.isdigit() and int(value) > max_bytes:
            raise RequestError(413, f"body of {int(value)} bytes; the limit is {max_bytes} bytes")
        if name == b"content-encoding" and value.strip().lower() not in (b"", b"identity"):
            raise RequestError(415, f"Content-Encoding {short(value.decode('latin-1'))} is not read: send the JSON "
                                    "body uncompressed")
    message = await receive()
    chunks, size = [], 0
    while True:
        if message["type"] == "http.disconnect":
            raise ClientLeft
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > max_bytes:
            raise RequestError(413, f"body over {max_bytes} bytes; the limit is {max_bytes} bytes")
        if not message.get("more_body", False):
            return b"".join(chunks) + chunk if chunks else chunk
        chunks.append(chunk)
        message = await receive()


class App(FastAPI):
    """FastAPI with ``POST /recommend`` taken straight to its `RecommendRoute`, before FastAPI's
    middleware and routing; the other routes and the lifespan are FastAPI's."""

    recommend_route: RecommendRoute

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/recommend" and scope["method"] == "POST":
            await self.recommend_route(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)


ROUTES = "POST /recommend, GET /health, GET /metadata, GET /metrics"


async def http_error(request: Request, error: Exception) -> Response:
    """A 404 or 405 of FastAPI's routing as every refusal of the server: a one-line ``{"error": ...}`` naming the
    method and the path (a 405 keeps its ``Allow`` header)."""
    assert isinstance(error, HTTPException)
    asked = f"{request.method} {request.url.path[:80]}"
    if error.status_code == 404:
        message = f"no route {asked}; the routes are {ROUTES}"
    elif error.status_code == 405:
        allowed = (error.headers or {}).get("Allow", "")
        message = f"method {request.method} is not allowed on {request.url.path}: use {allowed}; the routes are {ROUTES}"
    else:
        message = f"{asked}: {error.detail}"
    return JSONResponse({"error": message}, status_code=error.status_code, headers=error.headers)


def check_bounds(limits: Limits, overload: Overload) -> None:
    """Refuse a queue of sessions smaller than the largest request: a request of more sessions than
    `Overload.max_queued_sessions` would be answered 503 (busy, retry) every time it is sent."""
    if overload.max_queued_sessions < limits.max_sessions_per_request:
        raise ValueError(
            f"max_queued_sessions ({overload.max_queued_sessions}) must be at least max_sessions_per_request "
            f"({limits.max_sessions_per_request}): a request of more sessions than the queue holds would be refused as "
            "busy every time it is sent")


def build_app(
    model: Recommender | Served,
    max_batch_size: int = 64,
    max_wait_ms: float = 2.0,
    limits: Limits | None = None,
    overload: Overload | None = None,
    model_dir: str | os.PathLike | None = None,
    reload_interval_s: float = 2.0,
    served_log: ServedLog | None = None,
    canary: tuple[Served, float] | None = None,
) -> App:
    """The ASGI app serving `model` (see the module docstring for the routes).

    Args:
        model: the recommender (``encode``, ``recommend_batch``, ``decode``), or a `Served` one that
            says which directory and version it was read from.
        max_batch_size: most sessions per model call.
        max_wait_ms: longest wait for more requests after the first of a batch.
        limits: bounds on one request (defaults: `Limits()`).
        overload: queue bounds and deadline (defaults: `Overload()`); its ``max_queued_sessions`` at least
            the limits' ``max_sessions_per_request`` (`check_bounds`).
        model_dir: the model directory to follow for hot reload (its ``CURRENT`` pointer); None: no reload.
        reload_interval_s: seconds between two reads of the pointer; 0: never read.
        served_log: where each answered request's sessions and lists are appended (closed at shutdown).
        canary: another version of `model_dir` and the share of the sessions it answers (`load_canary`:
            the canary the directory records); the directory's record is followed from then on
            (`ModelHolder`). None: the live version answers every session until the directory records a canary.

    Returns:
        The app (FastAPI, with ``POST /recommend`` on a path of its own: `App`); its parts are on
        ``app.state`` (``batcher``, ``holder``, ``admission``, ``metrics``); its lifespan starts them,
        and at shutdown refuses new requests and answers the admitted ones before it stops them.
    """
    limits = limits if limits is not None else Limits()
    overload = overload if overload is not None else Overload()
    check_bounds(limits, overload)
    served = model if isinstance(model, Served) else Served(model)
    metrics = Metrics()
    batcher = Batcher(max_batch_size, max_wait_ms, metrics)
    holder = ModelHolder(served, model_dir, reload_interval_s, metrics, canary)
    admission = Admission(overload, batcher, metrics)
    parsers: list[ThreadPoolExecutor] = []  # the threads that parse large bodies, while the app runs

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        parsers.append(ThreadPoolExecutor(2, thread_name_prefix="sessrec-parse"))
        admission.open()
        await batcher.start()
        await holder.start()
        try:
            yield
        finally:  # every admitted request ends by its deadline
            if not await admission.drain(overload.deadline_ms / 1e3 + 5.0):
                logger.error("shutdown: %d requests still unanswered after their deadline", admission.admitted)
            await holder.stop()
            await batcher.stop()
            parsers.pop().shutdown(wait=False, cancel_futures=True)
            if served_log is not None:
                served_log.close()

    app = App(title="sessrec", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(MeasureRequests, metrics=metrics)
    app.state.batcher, app.state.holder, app.state.admission, app.state.metrics = batcher, holder, admission, metrics
    app.recommend_route = RecommendRoute(holder, batcher, admission, limits, metrics, parsers, served_log)
    # POST /recommend never reaches FastAPI (`App`); the route answers its other methods with 405
    app.add_route("/recommend", app.recommend_route, methods=["POST"])
    app.add_exception_handler(HTTPException, http_error)

    @app.get("/health")
    async def health() -> Response:
        body = {"status": "shutting_down" if admission.draining else "ok", **holder.current.describe(),
                "reload_error": holder.error, "canary": holder.describe_canary()}
        return JSONResponse(body, status_code=503 if admission.draining else 200)

    @app.get("/metadata")
    async def metadata() -> dict[str, Any]:
        batching = {"max_batch_size": max_batch_size, "max_wait_ms": max_wait_ms, **batcher.stats.summary()}
        queue = {"admitted": admission.admitted, "queued_requests": batcher.queued_requests,
                 "queued_sessions": batcher.queued_sessions}
        return {**holder.current.describe(), "canary": holder.describe_canary(), "limits": asdict(limits), "overload": asdict(overload),
                "queue": queue, "batching": batching, "worker_pid": os.getpid()}

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        if served_log is not None:
            metrics.served_rows.labels("written").set(served_log.rows_written)
            metrics.served_rows.labels("dropped").set(served_log.rows_dropped)
        return Response(metrics.text(), media_type=prom.CONTENT_TYPE_LATEST)

    return app
