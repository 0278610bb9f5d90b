"""Progress of a long command as lines on stdout: one when each stage starts and ends, one as each
of its steps ends (`Stages.note`), and one a `Stages.interval` while a stage runs, so that a step of
minutes never leaves the terminal silent."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class Stages:
    """The numbered stages of one command (``[fit 2/4] fitting the ranker ...``).

    Args:
        command: the command's name, the prefix of every line (``fit``).
        total: the number of stages.
        interval: seconds between two ``still running`` lines of one stage.

    Examples:
        >>> stages = Stages("fit", 2, interval=60)
        >>> with stages.stage("reading the data"):
        ...     pass
        [fit 1/2] reading the data ...
        [fit 1/2] reading the data: done in 0 s
        >>> with stages.stage("fitting"):
        ...     stages.note("features: 0 s")
        [fit 2/2] fitting ...
        [fit 2/2] fitting: features: 0 s
        [fit 2/2] fitting: done in 0 s
    """

    def __init__(self, command: str, total: int, interval: float = 60.0) -> None:
        self.command, self.total, self.interval = command, total, interval
        self.done = 0
        self.head = f"[{command}]"  # the running stage's prefix

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Announce `name`, print a line every `interval` seconds while it runs, and its time at the end."""
        self.done += 1
        head = self.head = f"[{self.command} {self.done}/{self.total}] {name}"
        print(f"{head} ...", flush=True)
        start, stop = time.perf_counter(), threading.Event()

        def beat() -> None:
            while not stop.wait(self.interval):
                print(f"{head}: still running ({time.perf_counter() - start:.0f} s)", flush=True)

        thread = threading.Thread(target=beat, name=f"sessrec-{self.command}-progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
        print(f"{head}: done in {time.perf_counter() - start:.0f} s", flush=True)

    def note(self, text: str) -> None:
        """One line under the running stage (a step of it has ended)."""
        print(f"{self.head}: {text}", flush=True)
