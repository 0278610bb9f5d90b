"""The server's Prometheus metrics (``GET /metrics``), in a registry of its own, and the ASGI
middleware that counts and times every request.

Under several workers (`sessrec.serving.server.run_workers`, which sets ``PROMETHEUS_MULTIPROC_DIR``
for them), each worker writes its values to files of that folder (prometheus_client's multiprocess
mode) and ``GET /metrics``, whichever worker answers it, shows the sum over the workers.
"""

from __future__ import annotations

import os
import time

import prometheus_client as prom
from prometheus_client import multiprocess
from starlette.types import ASGIApp, Message, Receive, Scope, Send

MULTIPROCESS_DIR = "PROMETHEUS_MULTIPROC_DIR"
ROUTES = ("/recommend", "/health", "/metadata", "/metrics")  # any other path is counted as "other"


class Metrics:
    """The server's Prometheus metrics, in a registry of its own (not the process-wide one)."""

    def __init__(self) -> None:
        self.registry = prom.CollectorRegistry()
        self.shared = os.environ.get(MULTIPROCESS_DIR)  # the folder the workers' values are written to, if any
        r = self.registry
        self.requests = prom.Counter("sessrec_requests", "HTTP requests answered, by route and status code",
                                     ["route", "status"], registry=r)
        self.latency = prom.Histogram(
            "sessrec_request_duration_seconds", "Time from a request's arrival to its answer, by route", ["route"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0), registry=r)
        self.batch_sessions = prom.Histogram(
            "sessrec_batch_sessions", "Sessions scored per model call",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024), registry=r)
        self.call_seconds = prom.Histogram(
            "sessrec_model_call_seconds", "Time of each model call (scoring, decoding and the JSON answers)",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5), registry=r)
        self.admitted = prom.Gauge("sessrec_admitted_requests",
                                   "Requests admitted and not yet answered (bounded by max_queue)", registry=r,
                                   multiprocess_mode="livesum")
        self.queued_requests = prom.Gauge("sessrec_queue_requests", "Requests encoded and waiting for the model",
                                          registry=r, multiprocess_mode="livesum")
        self.queued_sessions = prom.Gauge("sessrec_queue_sessions", "Sessions encoded and waiting for the model",
                                          registry=r, multiprocess_mode="livesum")
        self.shed = prom.Counter(
            "sessrec_shed", "Requests refused or dropped for load: queue_full, model_behind, "
            "queued_sessions_full, shutting_down (503), deadline (504)", ["reason"], registry=r)
        self.expired_in_queue = prom.Counter(
            "sessrec_expired_in_queue", "Requests dropped before the model because their deadline had passed",
            registry=r)
        self.reloads = prom.Counter("sessrec_reloads", "Model reloads, by result (ok, failed)", ["result"],
                                    registry=r)
        self.version_sessions = prom.Counter(
            "sessrec_version_sessions", "Sessions answered, by the model version that answered them and its role "
            "(live, canary)", ["version", "role"], registry=r)
        self.version_latency = prom.Histogram(
            "sessrec_version_request_duration_seconds", "Time from a /recommend request's arrival to its answer, by "
            "the model version that answered it and its role (a request split between two versions counts in both)",
            ["version", "role"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0), registry=r)
        self.served_rows = prom.Gauge(
            "sessrec_served_log_rows", "Rows of the served log (--served_log), by outcome: written to its files, or "
            "dropped because its buffer was full", ["outcome"], registry=r, multiprocess_mode="livesum")

    def text(self) -> bytes:
        """The Prometheus text: of this process, or summed over the workers that share `shared`."""
        if self.shared is None:
            return prom.generate_latest(self.registry)
        registry = prom.CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, self.shared)
        return prom.generate_latest(registry)


class MeasureRequests:
    """ASGI middleware: every HTTP request counted by route and status, and timed, in `Metrics`."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = scope["path"] if scope["path"] in ROUTES else "other"
        start, status = time.perf_counter(), 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            self.metrics.requests.labels(route, str(status)).inc()
            self.metrics.latency.labels(route).observe(time.perf_counter() - start)
