"""Where the partitions of a scoring run are scored: this process, or the workers of a Dask cluster.

`Engine` ``local`` calls the job on each pending partition here: in order, or with ``workers`` given,
that many partitions at a time on threads of this process, each on one torch thread (the tensor work,
onnxruntime and the trees release the interpreter; the workers share the one model or pipeline read,
where Dask's processes read one each). ``dask`` submits one
task per pending partition (``client.map``) to a Dask cluster: the one at ``scheduler``, else a
`distributed.LocalCluster` of ``workers`` processes with one thread each, started for the run and
closed after it. `Engine.started` connects (or starts the cluster) before the run reads or writes
anything, so an unreachable scheduler leaves nothing behind. Dask does the scheduling: placement, a
task moved when its worker dies (up to Dask's ``distributed.scheduler.allowed-failures`` times),
results gathered. A job writes its own
part (`sessrec.scoring.parts`) and returns a small record; the workers read the input and write
the parts at the paths the driver gives, so a cluster of several machines needs a file system
they share. The local cluster's workers start without Dask's ``MALLOC_TRIM_THRESHOLD_``
(`scoring_environ`); start the workers of a cluster of your own without it too.

A job loads its model or pipeline directory with `load_once`: once per process, kept for the next
partitions that process scores, so a worker reads the directory once whatever the number of
partitions (a worker that died and was restarted reads it again).
"""

from __future__ import annotations

import logging
import sys
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

ENGINES = ("local", "dask")
DEFAULT_WORKERS = 2

_lock = threading.Lock()
_loaded: dict[tuple[str, str], Any] = {}  # (directory, content hash) -> what it holds: one at a time


def load_once(directory: str, identity: str, load: Callable[[str], Any]) -> tuple[Any, bool]:
    """``load(directory)``, read once by this process and kept while the runs ask for the same
    directory and content hash `identity` (a worker keeps one loaded directory: another replaces
    it); returns it and whether it was read now."""
    key = (directory, identity)
    with _lock:  # a worker of several threads reads it once too
        if key not in _loaded:
            _loaded.clear()
            _loaded[key] = load(directory)
            return _loaded[key], True
        return _loaded[key], False


def forget_loaded() -> None:
    """Drop what `load_once` keeps in this process (a local run's model, once the run is over)."""
    with _lock:
        _loaded.clear()


def worker_name() -> str:
    """The Dask worker running this code (its address), or ``local`` outside one (a process that has not
    imported distributed is no Dask worker: a local run does not import it)."""
    if "distributed" not in sys.modules:
        return "local"
    from distributed import get_worker

    try:
        return str(get_worker().address)
    except ValueError:
        return "local"


@dataclass(frozen=True)
class Engine:
    """How the partitions are scored.

    Args:
        engine: ``local`` (this process) or ``dask`` (one task per partition on a Dask cluster).
        scheduler: with ``dask``, the address of a running scheduler (``tcp://host:8786``); None:
            a local cluster of `workers` processes.
        workers: with ``dask`` and no `scheduler`, the processes of the local cluster (one thread
            each; None: 2); with ``local``, the partitions scored at once, each on a thread of this
            process and one torch thread (torch's thread count is 1 for the run and restored after;
            None: one partition at a time on torch's threads).

    Raises:
        ValueError: an unknown engine, a scheduler without ``dask``, workers with a scheduler (its
            cluster has its own), workers below 1.
    """

    engine: Literal["local", "dask"] = "local"
    scheduler: str | None = None
    workers: int | None = None

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"--engine {self.engine!r}: unknown engine; the engines are {', '.join(ENGINES)}")
        if self.engine == "local" and self.scheduler is not None:
            raise ValueError("--scheduler needs --engine dask (the local engine scores in this process)")
        if self.scheduler is not None and self.workers is not None:
            raise ValueError(f"--workers {self.workers} with --scheduler {self.scheduler}: the cluster there has its own "
                             "workers; give one or the other")
        if self.workers is not None and (isinstance(self.workers, bool) or self.workers < 1):
            raise ValueError(f"--workers {self.workers}: must be 1 or more")

    def describe(self) -> str:
        """``this process`` (``on 2 threads``), ``a local Dask cluster of 2 workers`` or ``the Dask cluster at ADDRESS``."""
        if self.engine == "local":
            return "this process" if self.workers is None else f"this process on {self.workers} threads"
        if self.scheduler is not None:
            return f"the Dask cluster at {self.scheduler}"
        return f"a local Dask cluster of {self.workers or DEFAULT_WORKERS} workers"

    @contextmanager
    def started(self) -> Iterator[Runner]:
        """A `Runner` on this engine: for ``dask``, connected to the scheduler (or a local cluster started)
        before anything is read or written, closed after.

        Raises:
            OSError: the scheduler cannot be reached (one line naming its address).
        """
        if self.engine == "local":
            try:
                yield Runner(None, self.workers)
            finally:
                forget_loaded()
            return
        import dask
        from distributed import LocalCluster

        cluster = None
        if self.scheduler is None:
            with dask.config.set({"distributed.nanny.pre-spawn-environ": scoring_environ()}):
                # the workers log no task's failure: it reaches this process as the task's exception (one line, the
                # traceback with --traceback), which their ERROR record would precede with the worker's traceback
                cluster = LocalCluster(n_workers=self.workers or DEFAULT_WORKERS, threads_per_worker=1, processes=True,
                                       dashboard_address=":0", silence_logs=logging.CRITICAL)
        try:
            client = _connect(self.scheduler if cluster is None else cluster.scheduler_address)
            try:
                yield Runner(client)
            finally:
                client.close()
        finally:
            if cluster is not None:
                cluster.close()


class Runner:
    """Runs a job on partitions: here (`client` None; on `threads` threads of this process, each on one
    torch thread, when given) or on the Dask cluster of `client`."""

    def __init__(self, client: Any | None, threads: int | None = None) -> None:
        self.client = client
        self.threads = threads

    def run(self, job: Callable[[int, tuple[int, int]], dict], pending: Sequence[tuple[int, tuple[int, int]]],
            where: str) -> list[dict]:
        """``job(index, rows)`` for every pending partition; their records, in partition order.

        `where` names the parts folder in the line that a dead worker gives: what a rerun resumes from.

        An exception a job raises (a bad row of the input) reaches the caller as it was raised.

        Raises:
            RuntimeError: a worker died while scoring a partition more often than Dask retries it.
        """
        if self.client is None:
            if self.threads is None:
                return [job(index, rows) for index, rows in pending]
            return _on_threads(job, pending, self.threads)
        if not pending:
            return []
        from distributed.scheduler import KilledWorker

        indices, run = [index for index, _ in pending], uuid.uuid4().hex[:8]
        futures = self.client.map(job, indices, [rows for _, rows in pending],
                                  key=[f"sessrec-partition-{index}-{run}" for index in indices])
        try:
            return self.client.gather(futures)
        except KilledWorker as err:
            raise RuntimeError(
                f"a Dask worker died while scoring {err.task!r} (more often than Dask retries it); the parts written "
                f"are kept in {where}: run the same command again to resume from them"
            ) from err
        finally:
            self.client.cancel(futures)


def _on_threads(job: Callable[[int, tuple[int, int]], dict], pending: Sequence[tuple[int, tuple[int, int]]],
                threads: int) -> list[dict]:
    """``job(index, rows)`` for every pending partition, `threads` at a time on threads of this process, torch on
    one thread (restored after): each partition's floats are those of a one-thread worker's. The first
    exception in partition order is raised once the running jobs have ended (the others are not started)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="sessrec-partition")
    try:
        futures = [pool.submit(job, index, rows) for index, rows in pending]
        return [future.result() for future in futures]
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        torch.set_num_threads(before)


def scoring_environ() -> dict[str, Any]:
    """Dask's ``distributed.nanny.pre-spawn-environ`` (the variables its workers start with) without
    ``MALLOC_TRIM_THRESHOLD_``: set, it makes glibc hand every large torch temporary back to the system
    and fault it in again, which made a worker score 2.8x slower (docs/pipeline.md, "Across workers: measured")."""
    import dask

    environ = dask.config.get("distributed.nanny.pre-spawn-environ", default={}) or {}
    return {key: value for key, value in environ.items() if key != "MALLOC_TRIM_THRESHOLD_"}


def _connect(address: str) -> Any:
    """A client of the scheduler at `address`; one line naming it when it cannot be reached."""
    import dask
    from distributed import Client

    try:
        return Client(address, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as err:
        waited = dask.config.get("distributed.comm.timeouts.connect")
        raise OSError(f"--scheduler {address}: cannot reach a Dask scheduler there (waited {waited}, dask's "
                      f"distributed.comm.timeouts.connect): {' '.join(str(err).split()) or type(err).__name__}") from err
