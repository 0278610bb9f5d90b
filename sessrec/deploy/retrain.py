"""Incremental retraining with a quality gate: warm start on the next window, promote only what holds up.

One call of `retrain` is one turn of the loop that keeps a served session model fresh:

1. read the current model directory (`NextItemTask.from_pretrained`);
2. grow its vocabulary with the products first seen in the new training window (every known
   item keeps its id and learned row; new rows start from the model's initialisation);
3. train the grown model on that window (warm start), or a fresh one (``warm_start=False``);
4. evaluate the current model and the candidate on the window after it, the same
   (prefix, next item) pairs for both: an item the current model never saw counts against it;
5. promote the candidate (write it over the current model directory) only when its gate metric
   is at least the current model's minus `tolerance`;
6. append the decision, with both metrics, sizes and times, to the promotion record (JSON lines).

    sessrec retrain --config recipes/retrain_rsc15.yaml --train_from 2014-04-04 --train_until 2014-04-05 \\
                    --test_until 2014-04-06
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import ModelCheckpoint

from sessrec.data import frame
from sessrec.data.datamodule import SessionDataModule
from sessrec.data.schema import Schema
from sessrec.data.sources import SessionSource, SessionSplits, TimeWindowSource
from sessrec.tasks import NextItemTask
from sessrec.tasks.pretrained import (
    build,
    class_path,
    load_checkpoint,
    plain_hparams,
    with_more_items,
    write_directory,
)


@dataclass
class Gate:
    """When a candidate replaces the current model.

    Args:
        metric: the test metric compared (``recall@20``, ``ndcg@20``, ``mrr@20``, ...).
        tolerance: the candidate may trail the current model by this much and still be promoted
            (0: it must be at least as good).
    """

    metric: str = "recall@20"
    tolerance: float = 0.005

    def __post_init__(self) -> None:
        if self.tolerance < 0:
            raise ValueError(f"tolerance must be >= 0, got {self.tolerance}")


class LoadedSplits(SessionSource):
    """Splits already in memory, so the current model and the candidate read one load of the files."""

    def __init__(self, splits: SessionSplits) -> None:
        self.splits = splits

    def load(self) -> SessionSplits:
        return self.splits


def evaluate(task: NextItemTask, splits: SessionSplits, vocab_path: Path, batch_size: int = 1024) -> dict[str, float]:
    """Test metrics of `task` on the test split, read with the vocabulary at `vocab_path`."""
    data = SessionDataModule(LoadedSplits(splits), max_length=int(task.hparams.max_length), eval_batch_size=batch_size,
                             eval_protocol="last", vocab_path=str(vocab_path))
    trainer = pl.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    (metrics,) = trainer.test(task, datamodule=data, verbose=False)
    return {k.removeprefix("test/"): float(v) for k, v in metrics.items()}


def retrain(
    model_dir: str,
    paths: list[str],
    train_from: str,
    train_until: str,
    test_until: str,
    out: str,
    schema: Schema = Schema(),  # noqa: B008 - a config value, never mutated
    record: str | None = None,
    gate: Gate = Gate(),  # noqa: B008 - a config value, never mutated
    warm_start: bool = True,
    max_epochs: int = 3,
    lr: float | None = None,
    warmup_steps: int | None = None,
    batch_size: int = 256,
    valid_fraction: float = 0.1,
    seed: int = 0,
    promote: bool = True,
) -> dict[str, Any]:
    """Train a candidate on one window, gate it against the current model on the next, promote or not.

    Args:
        model_dir: the current model directory (`save_pretrained`); replaced when the candidate is promoted.
        paths: event files holding both windows (read together).
        train_from, train_until, test_until: the windows (see `TimeWindowSource`).
        out: folder of this candidate: its checkpoints and model directory (``out/model``).
        schema: column roles of the event files.
        record: promotion record (JSON lines) the decision is appended to; default ``<model_dir>.promotions.jsonl``.
        gate: the metric and tolerance of the promotion.
        warm_start: start from the current model's weights (grown to the new items); False trains
            the same architecture from scratch on the window, with a vocabulary of its own.
        max_epochs: training epochs on the window.
        lr: peak learning rate; default the current model's.
        warmup_steps: warm-up steps; default the current model's.
        batch_size: training sessions per batch.
        valid_fraction: latest share of the window's training sessions used for checkpoint selection.
        seed: seed of initialisation, shuffling and masking.
        promote: False evaluates and records the decision but never replaces the current model
            (a shadow run, e.g. to compare training from scratch).

    Returns:
        the decision as written to the record.
    """
    pl.seed_everything(seed, verbose=False)
    current_dir, out_dir = Path(model_dir), Path(out)
    current = NextItemTask.from_pretrained(current_dir)
    source = TimeWindowSource(paths, schema, train_from, train_until, test_until, valid_fraction=valid_fraction)
    splits = source.load()
    out_dir.mkdir(parents=True, exist_ok=True)

    values, _ = frame.list_offsets(splits.train.column(frame.ITEMS))
    if warm_start:
        vocab, old_to_new = current.vocab.grow(values)
        candidate = with_more_items(current, old_to_new, len(vocab))
    else:
        vocab = type(current.vocab).fit(values)
        candidate = build({"class_path": class_path(current), "init_args": {**plain_hparams(current), "num_items": len(vocab)}},
                          "the current model's config")
    new_items = len(vocab) - len(current.vocab) if warm_start else None
    candidate.hparams.update(
        lr=lr if lr is not None else candidate.hparams.lr,
        warmup_steps=warmup_steps if warmup_steps is not None else candidate.hparams.warmup_steps,
        seed=seed,
    )
    vocab_path = vocab.save(out_dir / "vocab.parquet")
    data = SessionDataModule(LoadedSplits(splits), max_length=int(candidate.hparams.max_length), batch_size=batch_size,
                             eval_protocol="last", vocab_path=str(vocab_path), seed=seed)
    monitor = f"val/{gate.metric}"
    best = ModelCheckpoint(dirpath=out_dir / "checkpoints", filename="best", monitor=monitor, mode="max",
                           save_top_k=1, enable_version_counter=False)
    trainer = pl.Trainer(max_epochs=max_epochs, logger=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[best], num_sanity_val_steps=0)
    started = time.perf_counter()
    trainer.fit(candidate, datamodule=data)
    train_seconds = time.perf_counter() - started
    if not best.best_model_path:
        raise RuntimeError(f"training on {train_from}..{train_until} saved no checkpoint (is {monitor!r} logged?)")
    candidate = load_checkpoint(best.best_model_path)
    candidate.attach_data(data)
    candidate.save_pretrained(out_dir / "model")

    current_metrics = evaluate(current, splits, current_dir / "vocab.parquet")
    candidate_metrics = evaluate(candidate, splits, vocab_path)
    if gate.metric not in candidate_metrics:
        raise ValueError(f"gate metric {gate.metric!r} is not among the test metrics {sorted(candidate_metrics)}")
    passed = candidate_metrics[gate.metric] >= current_metrics[gate.metric] - gate.tolerance
    promoted = passed and promote
    if promoted:
        write_directory(current_dir, lambda tmp: _copy_model(out_dir / "model", tmp))
    decision = {
        "decided_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "model_dir": str(current_dir),
        "candidate": str(out_dir / "model"),
        "train_window": [str(train_from), str(train_until)],
        "test_window": [str(train_until), str(test_until)],
        "warm_start": warm_start,
        "gate": asdict(gate),
        "current": {gate.metric: current_metrics[gate.metric], "items": len(current.vocab)},
        "candidate_metrics": {gate.metric: candidate_metrics[gate.metric], "items": len(vocab), "new_items": new_items},
        "all_candidate_metrics": candidate_metrics,
        "all_current_metrics": current_metrics,
        "train_sessions": splits.train.num_rows,
        "test_sessions": splits.test.num_rows,
        "train_seconds": round(train_seconds, 2),
        "epochs": trainer.current_epoch,
        "passed_gate": bool(passed),
        "promoted": bool(promoted),
    }
    record_path = Path(record) if record is not None else current_dir.with_name(current_dir.name + ".promotions.jsonl")
    with open(record_path, "a") as fh:
        fh.write(json.dumps(decision) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    return decision


def _copy_model(source: Path, target: Path) -> None:
    for path in source.iterdir():
        (target / path.name).write_bytes(path.read_bytes())
