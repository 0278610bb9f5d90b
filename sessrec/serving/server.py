"""``sessrec serve``: the app of `sessrec.serving.app` (routes, admission, batching, deadlines, hot
reload) served by uvicorn, in this process or in several worker processes that share one listening
socket (`run_workers`), each with its own model, batcher and queue bounds; `/metrics` sums them.
On SIGTERM or SIGINT each server refuses new requests (`DrainingServer`) and answers those it admitted.

Example (then ``curl -s localhost:8000/recommend -d '{"session": [214536502, 214536500], "k": 5}'``):
    >>> from sessrec.serving.server import serve
    >>> serve("runs/pipeline_rsc15/pipeline", port=8000)  # doctest: +SKIP
"""

from __future__ import annotations

import gc
import logging
import math
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import tempfile
import threading
import time
from dataclasses import dataclass

import torch
import uvicorn
from fastapi import FastAPI

from sessrec.saved.registry import check_integers
from sessrec.saved.versions import VersionedDirectory, check_share, resolve
from sessrec.scoring.output import check_folder
from sessrec.serving.admission import Overload
from sessrec.serving.app import build_app, check_bounds
from sessrec.serving.canary import check_compatible, load_canary
from sessrec.serving.recommender import Served, check_model_dir
from sessrec.serving.request import Limits
from sessrec.serving.request_metrics import MULTIPROCESS_DIR
from sessrec.serving.served_log import ServedLog

logger = logging.getLogger(__name__)
PARENT_CHECK_S = 1.0  # how often a worker checks that the server that started it is alive


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
    max_queue: int = 128,
    max_queued_sessions: int = 8192,
    max_queue_wait_ms: float = 500.0,
    deadline_ms: float = 1000.0,
    retry_after_s: int = 1,
    reload_interval_s: float = 2.0,
    log_level: str = "info",
    access_log: bool = True,
    workers: int = 1,
    threads: int | None = None,
    served_log: str | None = None,
    canary: str | None = None,
    canary_share: float | None = None,
) -> None:
    """Load the recommender saved in `model_dir` and serve it over HTTP until interrupted.

    Args:
        model_dir: a saved pipeline (``pipeline.json``) or session model directory (``config.json``),
            or a versioned one (``CURRENT`` naming a folder of ``versions/``), followed as its pointer moves.
        host: address to bind; loopback only by default, ``0.0.0.0`` to accept other machines.
        port: TCP port.
        max_batch_size: most sessions scored in one model call (dynamic batching).
        max_wait_ms: longest wait for more requests after the first of a batch (adds at most this to latency).
        max_request_bytes: largest request body (413 beyond).
        max_items_per_session: most item ids per session (413 beyond).
        max_sessions_per_request: most sessions per request (413 beyond).
        k_max: largest ``k`` a request may ask for (422 beyond).
        max_queue: most requests admitted and not yet answered (503 beyond, before the body is read).
        max_queued_sessions: most sessions waiting for the model (503 beyond).
        max_queue_wait_ms: 503 before the body is read while the model is further behind than this
            (the sessions waiting, at the pace of its recent calls); at most `deadline_ms`.
        deadline_ms: a request not answered within this gets 504 (and is never scored once past it).
        retry_after_s: the Retry-After of a 503, in seconds.
        reload_interval_s: seconds between two reads of the model directory's ``CURRENT``; 0: no reload.
        log_level: uvicorn's log level.
        access_log: log one line per request.
        workers: processes serving on the one port, each with its own model, batcher, queue bounds
            and metrics (`run_workers`); about one per core that the server may use.
        threads: torch threads of each worker; default: torch's own with one worker, the process's
            torch threads shared among several (at least one each).
        served_log: a folder where what each request got is appended (`ServedLog`: rotating parquet
            files, one series a worker, written off the request path), for ``sessrec monitor``.
        canary: another version of `model_dir` (``v000002``) to answer `canary_share` of the sessions beside the
            current one, chosen by a hash of their ``session_ids`` (`sessrec.serving.canary`; sessions without
            an id get the current version). Recorded in the directory (``CANARY``), so every worker and a
            restarted server serve the same canary; ``sessrec promote`` makes it current for every session,
            ``sessrec rollback`` drops it. A directory that records a canary is served with it without this flag.
        canary_share: the share of the sessions the canary answers, strictly between 0 and 1 (e.g. 0.1).

    Raises:
        PermissionError: a `served_log` that is a file or a folder that cannot be written.
        ValueError: a `port` outside 0..65535, a setting out of its range (a `max_queued_sessions` below
            `max_sessions_per_request` too), a `served_log` inside `model_dir`, a
            canary that the directory does not hold, that is its current version or another kind or item vocabulary
            (`check_compatible`), or a share outside (0, 1), before anything is served; the canary is recorded
            only once every setting is accepted.
    """
    if not 0 <= port <= 65535:
        raise ValueError(f"--port {port} is not a TCP port (0 to 65535)")
    if canary is None and canary_share is not None:
        raise ValueError(f"--canary_share {canary_share} without --canary: name the version that answers that share")
    check_integers({"workers": workers, "max_batch_size": max_batch_size, **({} if threads is None else {"threads": threads})})
    for name, value in (("max_wait_ms", max_wait_ms), ("reload_interval_s", reload_interval_s)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    if served_log is not None:
        check_folder(served_log, "--served_log", [model_dir])
    if workers > 1 and threads is None:
        threads = max(1, torch.get_num_threads() // workers)
    limits = Limits(max_request_bytes, max_sessions_per_request, max_items_per_session, k_max)
    overload = Overload(max_queue, max_queued_sessions, max_queue_wait_ms, deadline_ms, retry_after_s)
    check_bounds(limits, overload)
    worker = Worker(model_dir, host, port, threads, max_batch_size, max_wait_ms, limits, overload, reload_interval_s,
                    log_level, access_log, served_log)
    if canary is not None:  # recorded in the directory once every setting is accepted
        start_canary(model_dir, canary, canary_share)
    if workers == 1:
        worker.run()
    else:
        run_workers(worker, workers)


@dataclass(frozen=True)
class Worker:
    """One server process: its model loaded, its app built and served by uvicorn (`DrainingServer`).

    The arguments are `serve`'s; `threads`: torch threads (None: torch's default).
    """

    model_dir: str | os.PathLike
    host: str
    port: int
    threads: int | None
    max_batch_size: int
    max_wait_ms: float
    limits: Limits
    overload: Overload
    reload_interval_s: float
    log_level: str
    access_log: bool
    served_log: str | None = None

    def run(self, sock: socket.socket | None = None, parent: int | None = None) -> None:
        """Serve until shutdown, on `sock` (a listening socket shared with other workers) or on a
        socket of its own bound to `host`:`port`; `parent`: the pid of the server that started this
        worker, whose end shuts the worker down (`stop_with_parent`)."""
        if parent is not None:
            stop_with_parent(parent)
        if self.threads is not None:
            torch.set_num_threads(self.threads)
        live = Served.load(self.model_dir)  # a model refused at load leaves no served log folder behind
        canary = load_canary(self.model_dir, live)
        log = None if self.served_log is None else ServedLog(self.served_log)
        app = build_app(live, self.max_batch_size, self.max_wait_ms, self.limits, self.overload, self.model_dir,
                        self.reload_interval_s, log, canary)
        # The model, torch and the libraries are half a million objects that live as long as the process:
        # frozen, the cyclic garbage collector stops scanning them, and a full collection no longer stalls
        # the event loop (and /health) for hundreds of milliseconds in the middle of a flood.
        gc.collect()
        gc.freeze()
        config = uvicorn.Config(app, host=self.host, port=self.port, log_level=self.log_level,
                                access_log=self.access_log)
        if sock is None:
            DrainingServer(config, app).run()
        else:
            DrainingServer(config, app).run(sockets=[sock])


def stop_with_parent(parent: int, interval_s: float = PARENT_CHECK_S) -> threading.Thread:
    """Start a daemon thread that sends this process SIGTERM (the shutdown that answers what was admitted)
    once it is no longer the child of `parent`: a worker does not outlive a server killed by SIGKILL,
    which the server cannot pass on, and keep its port from the server a process manager starts next."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval_s)
        logger.warning("sessrec serve: the server (pid %d) is gone; worker %d shuts down", parent, os.getpid())
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=watch, name="sessrec-parent-watch", daemon=True)
    thread.start()
    return thread


def start_canary(model_dir: str | os.PathLike, version: str, share: float | None) -> None:
    """Record `version` as the canary of `model_dir` answering `share` of the sessions
    (`VersionedDirectory.start_canary`), once `check_compatible` accepts it beside the current version."""
    if share is None:
        raise ValueError(f"--canary {version} needs --canary_share: the share of the sessions it answers, e.g. 0.1")
    store = VersionedDirectory(model_dir)
    check_share(share)
    if store.promoted_canary(version):  # a restart with the flags of a canary promoted since: serve what is current
        logger.warning("canary %s was promoted (sessrec promote) and answers every session; --canary %s has no effect: "
                       "remove it from the command", version, version)
        return
    current = store.current_version()
    if current is not None and version in store.versions() and version != current:
        check_compatible(store.path(current), store.path(version))
    if store.start_canary(version, share):
        logger.info("canary %s answers %.4g of the sessions beside %s", version, share, current)


def run_workers(worker: Worker, count: int) -> None:
    """`count` processes running `worker`, sharing one listening socket (the kernel hands each new
    connection to one of them), until SIGTERM or SIGINT, which each worker gets and shuts down on
    as one server does (the server closes its copy of the socket then: new connections are refused). A worker that exits on its own stops the others, and the server exits with
    an error naming it (a process manager restarts it); a server that is killed outright stops its
    workers through their `stop_with_parent` watch, within `PARENT_CHECK_S`.

    Raises:
        SystemExit: a worker exited on its own (its model failed to load, or it crashed).
    """
    check_model_dir(resolve(worker.model_dir))  # a directory that holds no model: refused before any worker starts
    sock = uvicorn.Config(None, host=worker.host, port=worker.port, log_level=worker.log_level).bind_socket()
    spawn = multiprocessing.get_context("spawn")  # fresh interpreters: no torch threads or locks forked mid-use
    processes = [spawn.Process(target=worker.run, args=(sock, os.getpid()), name=f"sessrec-serve-{i}") for i in range(count)]
    stopping = []
    shared = tempfile.TemporaryDirectory(prefix="sessrec-metrics-")  # the workers' metrics, summed by /metrics
    os.environ[MULTIPROCESS_DIR] = shared.name  # read by each worker's prometheus_client, which it imports itself

    def stop(signum: int, frame: object) -> None:
        stopping.append(signum)
        for process in processes:
            if process.pid is not None and process.exitcode is None:
                os.kill(process.pid, signal.SIGTERM)
        # each worker closes its copy of the socket as it shuts down: once this one is closed too, a new
        # connection is refused rather than queued where nobody accepts it, and reset when the server exits
        sock.close()

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for process in processes:
            process.start()
        logger.info("serving with %d workers (pids %s)", count, ", ".join(str(p.pid) for p in processes))
        ended = multiprocessing.connection.wait([p.sentinel for p in processes])
        if not stopping:
            failed = next(p for p in processes if p.sentinel in ended)
            failed.join()
            stop(signal.SIGTERM, None)
            for process in processes:
                process.join()
            raise SystemExit(f"sessrec serve: worker {failed.pid} exited with code {failed.exitcode}; "
                             "the other workers were stopped")
        for process in processes:
            process.join()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()
        del os.environ[MULTIPROCESS_DIR]
        shared.cleanup()


class DrainingServer(uvicorn.Server):
    """uvicorn's server, which makes the app refuse new requests (503) as soon as shutdown begins;
    uvicorn then waits for the requests in flight, and the app's lifespan for those it admitted."""

    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self.app = app

    async def shutdown(self, sockets: list | None = None) -> None:
        self.app.state.admission.draining = True
        await super().shutdown(sockets)
