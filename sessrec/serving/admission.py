"""Admission control: a request to ``POST /recommend`` refused with 503 as it arrives, before its body is read,
when the server has as much work as it can answer in time, or is shutting down.

`Overload` holds the bounds: requests admitted and not yet answered, sessions waiting for the model, how far
behind the model may be, the deadline and the ``Retry-After`` of a 503. `Admission` counts the requests
admitted and not yet answered, says why one arriving now is refused (`Admission.refusal`), and at shutdown
refuses every new one and waits until the admitted ones are answered (`Admission.drain`).
`sessrec.serving.app.RecommendRoute` asks `Admission` first, for every request; the route itself holds the
bounds that apply later: 503 for a checked request whose sessions would take the queue past
`Overload.max_queued_sessions`, 504 past `Overload.deadline_ms`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from sessrec.saved.registry import check_integers
from sessrec.serving.batching import Batcher
from sessrec.serving.request_metrics import Metrics


@dataclass(frozen=True)
class Overload:
    """How much work the server takes on, and how long a request may take.

    Each bound refuses a request with 503 at once, which is cheaper for both sides than a request
    that waits and times out (504). `max_queue_wait_ms` adapts to the model's speed; the two
    counts are hard caps on memory and on work in flight.

    Args:
        max_queue: most requests admitted and not yet answered; a request beyond gets 503 before
            its body is read.
        max_queued_sessions: most sessions encoded and waiting for the model; a request that would
            pass it gets 503 (before its body is read once the bound is reached).
        max_queue_wait_ms: a request arriving while the sessions queued and being scored would take
            the model longer than this (at the pace of its recent calls) gets 503 before its body
            is read; at most `deadline_ms`, and about half of it leaves room for the request's own call.
        deadline_ms: a request not answered this long after it arrived gets 504; one whose deadline
            passed while queued never reaches the model.
        retry_after_s: the ``Retry-After`` header of a 503, in seconds.
    """

    max_queue: int = 128
    max_queued_sessions: int = 8192
    max_queue_wait_ms: float = 500.0
    deadline_ms: float = 1000.0
    retry_after_s: int = 1

    def __post_init__(self) -> None:
        check_integers({"max_queue": self.max_queue, "max_queued_sessions": self.max_queued_sessions,
                        "retry_after_s": self.retry_after_s})
        for name in ("max_queue_wait_ms", "deadline_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} must be a positive number of milliseconds, got {value!r}")
        if self.max_queue_wait_ms > self.deadline_ms:
            raise ValueError(f"max_queue_wait_ms ({self.max_queue_wait_ms:g}) must be at most deadline_ms "
                             f"({self.deadline_ms:g}): a request admitted behind more work would miss its deadline")


class Admission:
    """Counts the requests admitted and not yet answered, and refuses a request at arrival when the
    server has enough (see `Overload`) or is shutting down.

    Args:
        overload: the bounds.
        batcher: whose pace says how far behind the model is.
        metrics: where the admitted requests are counted.
    """

    def __init__(self, overload: Overload, batcher: Batcher, metrics: Metrics) -> None:
        self.overload, self.batcher, self.metrics = overload, batcher, metrics
        self.admitted, self.draining = 0, False
        self._idle = asyncio.Event()
        self._idle.set()

    def open(self) -> None:
        """Admit requests (again): the app's lifespan calls it at start-up."""
        self.draining = False

    def refusal(self) -> tuple[str, str] | None:
        """Why a request arriving now is refused, as (reason, one-line message), or None to admit it.

        Reasons: ``shutting_down``, ``queue_full`` (`Overload.max_queue`), ``queued_sessions_full``
        (`Overload.max_queued_sessions` reached), ``model_behind`` (`Overload.max_queue_wait_ms`).
        """
        if self.draining:
            return "shutting_down", "the server is shutting down"
        if self.admitted >= self.overload.max_queue:
            return "queue_full", f"the server is busy: {self.admitted} requests in progress"
        if self.batcher.queued_sessions >= self.overload.max_queued_sessions:
            return "queued_sessions_full", f"the server is busy: {self.batcher.queued_sessions} sessions are waiting"
        behind_ms = self.batcher.expected_wait() * 1e3
        if behind_ms > self.overload.max_queue_wait_ms:
            return "model_behind", f"the server is busy: the model is about {behind_ms:.0f} ms behind"
        return None

    def enter(self) -> None:
        self.admitted += 1
        self._idle.clear()
        self.metrics.admitted.set(self.admitted)

    def leave(self) -> None:
        self.admitted -= 1
        self.metrics.admitted.set(self.admitted)
        if self.admitted == 0:
            self._idle.set()

    async def drain(self, timeout_s: float) -> bool:
        """Refuse new requests from now on and wait until the admitted ones are answered; False on timeout."""
        self.draining = True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except asyncio.TimeoutError:
            return False
        return True
