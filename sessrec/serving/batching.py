"""Dynamic batching of encoded sessions: the requests waiting for the model, and the model calls.

Requests arrive here already checked and encoded (`sessrec.serving.request.prepare`); the batcher
joins the sessions of concurrent ones, scores and decodes them in one call on its own thread, and
hands each request its JSON answer. A failure in that call is the server's (`ServerFault`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import orjson
import torch

from sessrec.data.vocab import NUM_SPECIAL
from sessrec.pipeline.candidates import Recommendations, RequestSessions
from sessrec.saved.registry import check_integers
from sessrec.serving.recommender import Recommender, join_sessions
from sessrec.serving.request_metrics import Metrics

logger = logging.getLogger(__name__)


class ServerFault(Exception):
    """A failure of the server's own (logged where it happened), answered with a generic 500."""


@dataclass
class _Job:
    sessions: RequestSessions
    size: int  # sessions
    k: int
    recommender: Recommender  # the model whose vocabulary encoded them, which scores them
    deadline: float  # event-loop time
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


class Pace:
    """How long the model takes: seconds per call as ``overhead + per_session * sessions``, fitted by
    least squares over the recent calls (each call's weight decays by `decay` per later call).

    A single seconds-per-session ratio would carry the cost of small calls (mostly fixed overhead)
    into the estimate for a queue that will be scored in full batches: after a quiet spell the
    server would refuse a burst it can take. With calls of one size only, the overhead is not
    separable and the ratio is used.

    Args:
        decay: weight kept by each past call when a new one is added, in (0, 1).
    """

    def __init__(self, decay: float = 0.9) -> None:
        if not 0 < decay < 1:
            raise ValueError(f"decay must be in (0, 1), got {decay}")
        self.decay = decay
        self._w = self._n = self._t = self._nn = self._nt = 0.0  # decayed sums of 1, n, t, n², n·t

    def add(self, sessions: int, seconds: float) -> None:
        """Record one model call of `sessions` sessions that took `seconds`."""
        d, n, t = self.decay, float(sessions), seconds
        self._w, self._n, self._t = d * self._w + 1, d * self._n + n, d * self._t + t
        self._nn, self._nt = d * self._nn + n * n, d * self._nt + n * t

    def fit(self) -> tuple[float, float] | None:
        """(overhead seconds per call, seconds per session), or None before the first call."""
        if self._w == 0:
            return None
        mean_n, mean_t = self._n / self._w, self._t / self._w
        var_n = self._nn / self._w - mean_n**2
        if var_n > 1e-9 * max(mean_n**2, 1.0):
            per_session = (self._nt / self._w - mean_n * mean_t) / var_n
            overhead = mean_t - per_session * mean_n
            if per_session >= 0 and overhead >= 0:
                return overhead, per_session
        return 0.0, mean_t / mean_n

    def seconds(self, sessions: int, calls: int) -> float:
        """The expected time of `calls` model calls scoring `sessions` sessions in all (0 before any call)."""
        fitted = self.fit()
        if fitted is None or sessions == 0:
            return 0.0
        overhead, per_session = fitted
        return calls * overhead + sessions * per_session


class Batcher:
    """Dynamic batching of encoded sessions: those of concurrent requests scored in one model call.

    One worker task takes the first waiting request, then more until `max_batch_size` sessions or
    `max_wait_ms` after the first; requests with the same ``k`` encoded by the same model, either all
    with event times or all without (`join_sessions` would drop the times of a mixed batch, which an
    encoder that reads them, HSTU, scores otherwise), share one ``recommend_batch`` + ``decode`` call, run on the batcher's own thread, which also writes each
    request's JSON answer. A request whose deadline has passed (or whose client went away) is
    dropped before the call. The time of the recent calls (`Pace`) gives `expected_wait`, how long
    a request arriving now would wait before its own call.

    Args:
        max_batch_size: most sessions per model call (a larger request runs alone).
        max_wait_ms: longest wait for more requests after the first of a batch.
        metrics: where the queue depth and the sessions per call are counted.
    """

    def __init__(self, max_batch_size: int = 64, max_wait_ms: float = 2.0, metrics: Metrics | None = None) -> None:
        check_integers({"max_batch_size": max_batch_size})
        if isinstance(max_wait_ms, bool) or not isinstance(max_wait_ms, (int, float)) or not 0 <= max_wait_ms < math.inf:
            raise ValueError(f"max_wait_ms must be a finite number >= 0, got {max_wait_ms!r}")
        self.max_batch_size, self.max_wait = max_batch_size, max_wait_ms / 1e3
        self.metrics = metrics if metrics is not None else Metrics()
        self.stats = BatchStats()
        self.queued_requests = self.queued_sessions = self.scoring_sessions = 0
        self.pace = Pace()
        self._queue: asyncio.Queue[_Job] | None = None
        self._held: _Job | None = None  # taken from the queue but too large for the batch being built
        self._task: asyncio.Task | None = None
        self._thread: ThreadPoolExecutor | None = None

    async def start(self) -> None:
        self._queue = asyncio.Queue()
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="sessrec-model")
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._thread is not None:
            self._thread.shutdown(wait=False, cancel_futures=True)
            self._thread = None

    def submit(self, sessions: RequestSessions, k: int, recommender: Recommender, deadline: float) -> asyncio.Future:
        """Queue one request's encoded sessions; the future gets its JSON answer (bytes) and its decoded lists
        (what a served log records once the request is answered: `ServedLog.record`)."""
        if self._queue is None:
            raise RuntimeError("the batcher is not started: run the app under its lifespan (uvicorn, TestClient)")
        future = asyncio.get_running_loop().create_future()
        self.stats.requests += 1
        self._queue.put_nowait(_Job(sessions, len(sessions), k, recommender, deadline, future))
        self._count(1, len(sessions))
        return future

    def expected_wait(self) -> float:
        """Seconds until the sessions queued and being scored are done, at the pace of the recent calls.

        0 when nothing is waiting (or before the first call): a slow call never shuts out a request
        that would find the model free, and the next calls correct the pace.
        """
        sessions = self.queued_sessions + self.scoring_sessions
        calls = min(self.queued_requests, math.ceil(self.queued_sessions / self.max_batch_size))
        return self.pace.seconds(sessions, calls + (self.scoring_sessions > 0))

    def _count(self, requests: int, sessions: int) -> None:
        self.queued_requests += requests
        self.queued_sessions += sessions
        self.metrics.queued_requests.set(self.queued_requests)
        self.metrics.queued_sessions.set(self.queued_sessions)

    async def _take(self, timeout: float | None) -> _Job:
        """The next queued job: wait for it (None), at most `timeout` seconds, or not at all (<= 0)."""
        assert self._queue is not None
        if timeout is None:
            return await self._queue.get()
        if timeout <= 0:
            return self._queue.get_nowait()
        return await asyncio.wait_for(self._queue.get(), timeout)

    async def _next_batch(self) -> list[_Job]:
        first = self._held or await self._take(None)
        self._held, batch, size = None, [first], first.size
        loop = asyncio.get_running_loop()
        until = loop.time() + self.max_wait
        while size < self.max_batch_size:
            try:
                job = await self._take(until - loop.time())
            except (asyncio.QueueEmpty, asyncio.TimeoutError):
                break
            if size + job.size > self.max_batch_size:
                self._held = job  # still counted as queued: it opens the next batch
                break
            batch.append(job)
            size += job.size
        self._count(-len(batch), -size)
        return batch

    async def _run(self) -> None:
        while True:
            batch = await self._next_batch()
            groups: dict[tuple[int, int, bool], list[_Job]] = {}
            for job in batch:
                groups.setdefault((id(job.recommender), job.k, job.sessions.times is not None), []).append(job)
            for jobs in groups.values():
                await self._score(jobs)

    async def _score(self, jobs: list[_Job]) -> None:
        now = asyncio.get_running_loop().time()
        live = []
        for job in jobs:
            if job.future.done() or now >= job.deadline:  # timed out (504) or the client went away
                _resolve(job.future, exception=asyncio.TimeoutError())
                self.metrics.expired_in_queue.inc()
            else:
                live.append(job)
        if not live:
            return
        size = sum(job.size for job in live)
        assert self._thread is not None
        self.scoring_sessions, start = size, time.perf_counter()
        try:
            answers = await asyncio.get_running_loop().run_in_executor(self._thread, _score_call, live)
        except Exception:  # the requests were checked and encoded alone: any failure here is the server's
            logger.exception("the model failed on a batch of %d sessions from %d requests", size, len(live))
            for job in live:
                _resolve(job.future, exception=ServerFault())
            return
        finally:
            self.scoring_sessions = 0
            self.stats.calls[size] += 1
            self.metrics.batch_sessions.observe(size)
        took = time.perf_counter() - start
        self.pace.add(size, took)
        self.metrics.call_seconds.observe(took)
        for job, answer in zip(live, answers):
            _resolve(job.future, result=answer)


@torch.inference_mode()  # answers leave as bytes: no tensor of the call outlives it (7% of a request's time against no_grad)
def _score_call(jobs: list[_Job]) -> list[tuple[bytes, list[dict[str, Any]]]]:
    """One model call for `jobs` (same model, same k): each request's JSON answer and its decoded lists."""
    recommender = jobs[0].recommender
    recs = recommender.recommend_batch(join_sessions([job.sessions for job in jobs]), jobs[0].k)
    _check_finite(recs)
    out = recommender.decode(recs)
    size = sum(job.size for job in jobs)
    if len(out) != size:
        raise RuntimeError(f"the recommender returned {len(out)} lists for {size} sessions")
    answers, start = [], 0
    for job in jobs:
        lists = out[start : start + job.size]
        answers.append((dumps({"recommendations": lists}), lists))
        start += job.size
    return answers


def _check_finite(recs: Recommendations) -> None:
    """Refuse (a server fault) a NaN or infinite score among the items an answer lists (orjson,
    which writes the answers, would write it as null)."""
    if not bool(torch.isfinite(recs.scores[recs.items >= NUM_SPECIAL]).all()):
        raise ValueError("the recommender scored an item NaN or infinite")


def dumps(content: Any) -> bytes:
    """JSON bytes as the server answers them (compact, UTF-8; orjson)."""
    return orjson.dumps(content)


def _resolve(future: asyncio.Future, result: Any = None, exception: BaseException | None = None) -> None:
    if future.done():
        return
    if exception is not None:
        future.set_exception(exception)
    else:
        future.set_result(result)
