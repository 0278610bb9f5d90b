"""Hot reload: the model being served and its canary (`ModelHolder`), swapped while the server runs when the
model directory they come from moves its ``CURRENT`` pointer or its ``CANARY`` record.

The new version is loaded in a thread and served from the next batch on; a version that fails to load keeps the
one served and is reported by ``/health``. `sessrec.serving.app` holds one `ModelHolder` per worker process and
reads its `ModelHolder.current`, `ModelHolder.canary` and `ModelHolder.share` once per request.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
from pathlib import Path
from typing import Any

from sessrec.saved.versions import VERSIONS, served_state
from sessrec.serving.canary import load_canary_version
from sessrec.serving.recommender import Served
from sessrec.serving.request_metrics import Metrics

logger = logging.getLogger(__name__)


class ModelHolder:
    """The model being served, its canary, and their hot reload from a model directory.

    `check` reads the directory's current version and its canary as one state (`served_state`): two small
    files. When the current version is another folder than the one served, that folder is served from then
    on: the canary's model when the canary was promoted (nothing to load), else the folder loaded in a
    thread, which then answers every session (the move of the pointer ended the canary) until the canary
    the directory records, if any, is loaded. When the canary record names a version other than the canary
    served, that version is checked against the live one (`check_compatible`) and loaded in a thread; when
    it names none (the canary promoted or dropped), the live version answers every session. A load that
    fails keeps what is served, logs the error and keeps it in `error` (the live version) or
    `canary_error` (shown by `/health`); that folder is not tried again until the record moves.

    Args:
        served: the model served first.
        model_dir: the directory to follow; None: no reload.
        interval_s: seconds between two checks while the server runs; 0: no polling (`check` still works).
        metrics: where reloads are counted.
        canary: the canary served first (`load_canary`), with the share of the sessions it answers; None: none.
    """

    def __init__(self, served: Served, model_dir: str | os.PathLike | None = None, interval_s: float = 2.0,
                 metrics: Metrics | None = None, canary: tuple[Served, float] | None = None) -> None:
        if interval_s < 0:
            raise ValueError(f"reload_interval_s must be >= 0, got {interval_s}")
        self.current, self.model_dir, self.interval_s = served, model_dir, interval_s
        self.canary, self.share = canary if canary is not None else (None, 0.0)
        self.metrics = metrics if metrics is not None else Metrics()
        self.error: str | None = None
        self.canary_error: str | None = None
        self._failed: Path | None = None
        self._canary_failed: Path | None = None
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        if self.model_dir is not None and self.interval_s > 0:
            self._task = asyncio.create_task(self._poll())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.check()

    def describe_canary(self) -> dict[str, Any] | None:
        """What `/health` says of the canary: its version and share, and its last load error."""
        if self.canary is None and self.canary_error is None:
            return None
        return {"version": None if self.canary is None else self.canary.version, "share": self.share,
                "error": self.canary_error}

    async def check(self) -> bool:
        """Follow the directory's current version and canary (class docstring); True when the live model was swapped."""
        if self.model_dir is None:
            return False
        try:
            path, running = await asyncio.to_thread(served_state, self.model_dir)
        except Exception as err:  # noqa: BLE001 - a pointer being fixed by hand: keep serving, say why
            self._failed_to_load(None, err)
            return False
        swapped = await self._follow_live(path)
        await self._follow_canary(running)
        return swapped

    async def _follow_live(self, path: Path) -> bool:
        if path == self.current.path:  # (again): nothing to load, nothing wrong
            self.error = self._failed = None
            return False
        if self.canary is not None and path == self.canary.path:  # the canary promoted: it answers every session
            self.current, self.canary, self.error, self._failed = self.canary, None, None, None
            self.metrics.reloads.labels("ok").inc()
            logger.info("canary %s promoted: it answers every session", self.current.version)
            return True
        if path == self._failed:
            return False
        try:
            served = await asyncio.to_thread(Served.read, path)
        except Exception as err:  # noqa: BLE001 - any load failure keeps the served model
            self._failed_to_load(path, err)
            return False
        _freeze_loaded()
        self.current, self.canary, self.error, self._failed = served, None, None, None
        self.metrics.reloads.labels("ok").inc()
        logger.info("serving %s (version %s)", path, served.version)
        return True

    async def _follow_canary(self, running: tuple[str, float] | None) -> None:
        if running is None:
            if self.canary is not None:
                logger.info("canary %s ended: %s answers every session", self.canary.version, self.current.version)
            self.canary, self.canary_error, self._canary_failed = None, None, None
            return
        version, share = running
        if version == self.current.version:  # read as the canary was promoted: it is the live version now
            return
        path = Path(self.model_dir) / VERSIONS / version
        if self.canary is not None and self.canary.path == path:
            self.share = share
            return
        if path == self._canary_failed:
            return
        try:
            served = await asyncio.to_thread(load_canary_version, self.current, path)
        except Exception as err:  # noqa: BLE001 - the live version keeps answering every session
            message = " ".join(f"{type(err).__name__}: {err}".split())
            logger.error("canary %s not served; %s answers every session: %s", version, self.current.version, message)
            self.metrics.reloads.labels("failed").inc()
            self.canary, self.canary_error, self._canary_failed = None, message, path
            return
        _freeze_loaded()
        self.canary, self.share, self.canary_error, self._canary_failed = served, share, None, None
        self.metrics.reloads.labels("ok").inc()
        logger.info("canary %s answers %.4g of the sessions", version, share)

    def _failed_to_load(self, path: Path | None, err: Exception) -> None:
        message = " ".join(f"{type(err).__name__}: {err}".split())
        if message != self.error:
            logger.error("model reload from %s failed; still serving %s: %s", self.model_dir, self.current.path,
                         message)
            self.metrics.reloads.labels("failed").inc()
        self.error, self._failed = message, path


def _freeze_loaded() -> None:
    """A model loaded after start-up frozen with the rest, when the process froze what it loaded (`serve`)."""
    if gc.get_freeze_count():
        gc.collect(1)
        gc.freeze()
