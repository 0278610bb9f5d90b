"""Callbacks: the metrics of every validation, progress of prediction, the last checkpoint; write top-K predictions.

`TopKWriter` streams one parquet row group per batch to a temporary file and writes the output (in
the format its extension names) under a temporary name renamed into place when scoring ends, so a
failed run leaves nothing at the output path.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from weakref import proxy

import pyarrow.parquet as pq
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import BasePredictionWriter, ModelCheckpoint
from pytorch_lightning.utilities import rank_zero_info

from sessrec.saved.atomic import atomic_path
from sessrec.scoring.output import OutputFile
from sessrec.scoring.parts import written_schema
from sessrec.scoring.predict import topk_table


class MetricHistory(pl.Callback):
    """The logged metrics (names with a ``/``) at the end of each validation, by global step: what
    ``sessrec fit`` prints for the checkpoint it keeps, which need not be the last epoch's."""

    def __init__(self) -> None:
        self.at_step: dict[int, dict[str, float]] = {}

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            metrics = trainer.callback_metrics.items()
            self.at_step[trainer.global_step] = {k: float(v) for k, v in metrics if "/" in k}


class PredictProgress(pl.Callback):
    """``sessrec predict``'s progress: a line every `interval` seconds (process 0's batches) and one at the end
    (every process's), with the batches and sessions scored and the rate. The sessions come as a stream whose length is not
    known in advance, where a progress bar shows ``1/-- 0.00it/s``.

    Args:
        interval: seconds between two lines.
    """

    def __init__(self, interval: float = 30.0) -> None:
        self.interval = interval
        self.batches = self.sessions = 0
        self.start = self.last = 0.0

    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.batches = self.sessions = 0
        self.start = self.last = time.perf_counter()

    def on_predict_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self.batches += 1
        self.sessions += len(batch) if hasattr(batch, "__len__") else 0
        if time.perf_counter() - self.last >= self.interval:
            self.last = time.perf_counter()
            self._line(trainer)

    def on_predict_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.world_size > 1:  # every process's batches and sessions: the lines between are process 0's
            counts = trainer.strategy.reduce(torch.tensor([self.batches, self.sessions], dtype=torch.float64,
                                                          device=pl_module.device), reduce_op="sum")
            self.batches, self.sessions = (int(c) for c in counts.tolist())
        self._line(trainer, "done: ")

    def _line(self, trainer: pl.Trainer, head: str = "") -> None:
        if trainer.is_global_zero:
            seconds = time.perf_counter() - self.start
            rate = self.sessions / seconds if seconds > 0 else 0.0
            print(f"[predict] {head}{self.batches} batches, {self.sessions} sessions in {seconds:.0f} s "
                  f"({rate:.0f} sessions/s)", flush=True)


class LastCheckpoint(ModelCheckpoint):
    """``last.ckpt`` beside the run's other checkpoints, for ``sessrec fit --ckpt_path .../last.ckpt``.

    Written at the end of every epoch and every `every_n_train_steps` steps within one (0: at
    epoch ends only), each time under a temporary name and then renamed over the previous one,
    so a run killed at any moment (SIGKILL included) leaves a complete ``last.ckpt``. It holds
    the optimizer, schedule, loop and loader positions: the resumed run continues the same
    schedule over the same batches.

    Args:
        every_n_train_steps: also save after this many training steps (0: only at epoch ends).
        dirpath: folder of ``last.ckpt``; by default the run's checkpoint folder.
    """

    def __init__(self, every_n_train_steps: int = 200, dirpath: str | None = None) -> None:
        if every_n_train_steps < 0:
            raise ValueError(f"every_n_train_steps must be >= 0, got {every_n_train_steps}")
        super().__init__(
            dirpath=dirpath, filename="last", monitor=None, save_top_k=1, every_n_train_steps=every_n_train_steps or None,
            save_on_train_epoch_end=True, enable_version_counter=False,
        )

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)  # saves only without every_n_train_steps (Lightning: one or the other)
        if self._every_n_train_steps >= 1 and not self._should_skip_saving_checkpoint(trainer):
            self._save_topk_checkpoint(trainer, self._monitor_candidates(trainer))

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.dirpath is None:  # beside the recipe's own checkpoints, when they name a folder
            folders = [cb.dirpath for cb in trainer.checkpoint_callbacks if cb is not self and cb.dirpath]
            self.dirpath = folders[0] if folders else None
        super().setup(trainer, pl_module, stage)

    def _save_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        tmp = f"{filepath}.tmp"
        trainer.save_checkpoint(tmp, self.save_weights_only)
        self._last_global_step_saved = trainer.global_step
        self._last_checkpoint_saved = filepath
        if trainer.is_global_zero:
            os.replace(tmp, filepath)
            for logger in trainer.loggers:
                logger.after_save_checkpoint(proxy(self))

    def _remove_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        if Path(filepath).name != "last.ckpt":  # the one file is replaced in place, never removed
            super()._remove_checkpoint(trainer, filepath)


class TopKWriter(BasePredictionWriter):
    """Write ``session_id``, ``item_ids`` (raw top-K) and ``scores`` per session, in the format the
    output's extension names (`sessrec.scoring.OutputFile`: ``.parquet``/``.pq``, or ``.csv`` with
    one row per recommendation).

    The output is checked (`check`) before the data module or the model is built (``sessrec
    predict`` calls it first) and again when scoring starts. Each process writes its batches (one
    parquet row group each) to a part file beside the output (first removing one a killed run left
    under that name: a process may score no batch); when scoring ends, rank 0 joins the
    parts into the input's order (batch i was scored by rank i mod world size) under a temporary
    name renamed into place (a single parquet part is itself renamed). A failed run removes its
    parts and the folders it created.

    Args:
        output: the file to write; defaults to ``<predict_path stem>.recs.parquet`` beside the input.
        overwrite: replace an existing output (refused otherwise, before any scoring).
    """

    def __init__(self, output: str | None = None, overwrite: bool = False) -> None:
        super().__init__(write_interval="batch")
        self.output, self.overwrite = output, overwrite
        self._writer: pq.ParquetWriter | None = None
        self._tmp: Path | None = None
        self._out: OutputFile | None = None

    def target(self, predict_path: str | Path) -> str:
        """The file written for the sessions of `predict_path`: `output` as given, else
        ``<stem>.recs.parquet`` beside it."""
        if self.output is not None:
            return self.output
        src = Path(predict_path)
        stem = src.name.split(".")[0]
        return str(src.with_name(f"{stem}.recs.parquet"))

    def check(self, predict_path: str | Path | None, folders: Sequence[str | Path] = ()) -> OutputFile:
        """The output for the sessions of `predict_path`, refused in one line when it cannot be written
        as named (`OutputFile.check`: a directory, another extension, the input, a file inside one of
        `folders` (the model directory the run reads), an existing file without `overwrite`, a folder
        that cannot be written)."""
        if predict_path is None:
            raise ValueError("set --data.predict_path to the sessions file to score")
        out = OutputFile(self.target(predict_path), "--scoring.output")
        out.check(self.overwrite, [predict_path], folders)
        return out

    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._out = self.check(trainer.datamodule.predict_path)
        self._out.make_folder()
        self._tmp = self._part(trainer.global_rank, trainer.world_size)
        self._tmp.unlink(missing_ok=True)  # a killed run's: this rank may score no batch, and rank 0 joins what exists
        self._writer = None

    def _part(self, rank: int, world_size: int) -> Path:
        target = self._out.path
        return target.with_name(f".{target.name}.part-{rank}-of-{world_size}")

    def write_on_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, prediction: Any, batch_indices: Any,
        batch: Any, batch_idx: int, dataloader_idx: int,
    ) -> None:
        table = topk_table(batch.keys, trainer.datamodule.vocab, prediction.items, prediction.scores)
        if self._writer is None:
            self._writer = pq.ParquetWriter(self._tmp, table.schema)
        self._writer.write_table(table)

    def on_predict_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        trainer.strategy.barrier("TopKWriter parts")
        if trainer.is_global_zero:
            parts = [self._part(r, trainer.world_size) for r in range(trainer.world_size)]
            written = [part for part in parts if part.exists()]
            if not written:
                raise ValueError(f"{trainer.datamodule.predict_path}: no sessions to score")
            if len(written) == 1 and self._out.format == "parquet":  # one process (or one with batches): the output
                with atomic_path(self._out.path) as tmp:
                    os.replace(written[0], tmp)
            else:
                files = [pq.ParquetFile(part) for part in written]
                groups = (f.read_row_group(group) for group in range(max(f.num_row_groups for f in files))
                          for f in files if group < f.num_row_groups)  # batch i is rank i mod world's
                self._out.write(groups, written_schema(files[0]))
            for part in parts:
                part.unlink(missing_ok=True)
            stream = trainer.datamodule.scoring_stream
            rank_zero_info(
                f"sessrec predict: wrote {stream.num_sessions} sessions to {self._out.path}; "
                f"{stream.num_unknown} of {stream.num_items} input items were unknown to the model (scored as OOV)"
            )
        trainer.strategy.barrier("TopKWriter output")

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._tmp is not None:
            self._tmp.unlink(missing_ok=True)
        if self._out is not None:
            self._out.remove_made()
