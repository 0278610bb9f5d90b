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
import shutil
import time
from dataclasses import asdict, dataclass, replace
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
    config_of,
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


def test_metrics(task: pl.LightningModule, data: pl.LightningDataModule) -> dict[str, float]:
    """`task`'s own test metrics on `data`'s test split (``recall@20``, ``mrr``, ...; no reference rankers)."""
    trainer = pl.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    (metrics,) = trainer.test(task, datamodule=data, verbose=False)
    return {k.removeprefix("test/"): float(v) for k, v in metrics.items() if k.count("/") == 1}


def evaluate(task: NextItemTask, splits: SessionSplits, vocab_path: Path, batch_size: int = 1024) -> dict[str, float]:
    """Test metrics of `task` on the test split, read with the vocabulary at `vocab_path`."""
    data = SessionDataModule(LoadedSplits(splits), max_length=int(task.hparams.max_length), eval_batch_size=batch_size,
                             eval_protocol="last", vocab_path=str(vocab_path))
    return test_metrics(task, data)


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
        lr: peak learning rate (``optimization.lr``); default the current model's.
        warmup_steps: warm-up steps (``schedule.warmup_steps``); default the current model's.
        batch_size: training sessions per batch.
        valid_fraction: latest share of the window's training sessions used for checkpoint selection.
        seed: seed of initialisation, shuffling and masking.
        promote: False evaluates and records the decision but never replaces the current model
            (a shadow run, e.g. to compare training from scratch).

    Returns:
        the decision as written to the record.
    """
    current_dir, out_dir = Path(model_dir), Path(out)
    current = NextItemTask.from_pretrained(current_dir)
    source = TimeWindowSource(paths, schema, train_from, train_until, test_until, valid_fraction=valid_fraction)
    splits = source.load()
    out_dir.mkdir(parents=True, exist_ok=True)

    values, _ = frame.list_offsets(splits.train.column(frame.ITEMS))
    pl.seed_everything(seed, verbose=False)  # here: the candidate's draws do not depend on the current model's size
    if warm_start:
        vocab, old_to_new = current.vocab.grow(values)
        candidate = with_more_items(current, old_to_new, len(vocab))
    else:
        vocab = type(current.vocab).fit(values)
        candidate = build({"class_path": class_path(current), "init_args": {**plain_hparams(current), "num_items": len(vocab)}},
                          "the current model's config")
    new_items = len(vocab) - len(current.vocab) if warm_start else None
    optimization, schedule = candidate.optimization, candidate.schedule
    candidate.hparams.update(
        optimization=config_of(optimization if lr is None else replace(optimization, lr=lr)),
        schedule=config_of(schedule if warmup_steps is None else replace(schedule, warmup_steps=warmup_steps)),
        seed=seed,
    )
    vocab_path = vocab.save(out_dir / "vocab.parquet")
    data = SessionDataModule(LoadedSplits(splits), max_length=int(candidate.hparams.max_length), batch_size=batch_size,
                             eval_protocol="last", vocab_path=str(vocab_path), seed=seed)
    candidate, train_seconds, epochs = fit_candidate(candidate, data, out_dir, f"val/{gate.metric}", max_epochs)

    current_metrics = evaluate(current, splits, current_dir / "vocab.parquet")
    candidate_metrics = evaluate(candidate, splits, vocab_path)
    return decide(current_dir, out_dir, gate, current_metrics, candidate_metrics, promote, record, {
        "train_window": [str(train_from), str(train_until)],
        "test_window": [str(train_until), str(test_until)],
        "warm_start": warm_start,
        "current_items": len(current.vocab),
        "candidate_items": len(vocab),
        "new_items": new_items,
        "train_sessions": splits.train.num_rows,
        "test_sessions": splits.test.num_rows,
        "train_seconds": round(train_seconds, 2),
        "epochs": epochs,
    })


def decide(
    current_dir: Path, out_dir: Path, gate: Gate, current_metrics: dict[str, float], candidate_metrics: dict[str, float],
    promote: bool, record: str | None, facts: dict[str, Any],
) -> dict[str, Any]:
    """Apply the gate, promote (replace the current model directory by ``out_dir/model``) or not, and
    append the decision to the promotion record (fsynced: a decision is never lost to a crash)."""
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
        "gate": asdict(gate),
        "current": current_metrics,
        "candidate_metrics": candidate_metrics,
        **facts,
        "passed_gate": bool(passed),
        "promoted": bool(promoted),
    }
    record_path = Path(record) if record is not None else current_dir.with_name(current_dir.name + ".promotions.jsonl")
    with open(record_path, "a") as fh:
        fh.write(json.dumps(decision) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    return decision


def fit_candidate(
    candidate: pl.LightningModule, data: pl.LightningDataModule, out_dir: Path, monitor: str, max_epochs: int
) -> tuple[pl.LightningModule, float, int]:
    """Train `candidate`, keep its best checkpoint by `monitor`, write its model directory ``out_dir/model``.

    Returns the best candidate (from its checkpoint), the training seconds and the epochs run.
    """
    best = ModelCheckpoint(dirpath=out_dir / "checkpoints", filename="best", monitor=monitor, mode="max",
                           save_top_k=1, enable_version_counter=False)
    trainer = pl.Trainer(max_epochs=max_epochs, logger=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[best], num_sanity_val_steps=0)
    started = time.perf_counter()
    trainer.fit(candidate, datamodule=data)
    seconds = time.perf_counter() - started
    if not best.best_model_path:
        raise RuntimeError(f"training saved no checkpoint (is {monitor!r} logged?)")
    trained = load_checkpoint(best.best_model_path)
    trained.attach_data(data)
    trained.save_pretrained(out_dir / "model")
    return trained, seconds, trainer.current_epoch


def retrain_dlrm(
    model_dir: str,
    path: str,
    end: str,
    out: str,
    test_hours: float = 8.0,
    valid_hours: float = 4.0,
    train_hours: float | None = None,
    record: str | None = None,
    gate: Gate = Gate("mrr", 0.005),  # noqa: B008 - a config value, never mutated
    max_epochs: int = 1,
    lr: float | None = None,
    batch_size: int = 4096,
    seed: int = 0,
    promote: bool = True,
) -> dict[str, Any]:
    """The same turn for a DLRM on click-outs: warm start on the hours before `end`, gate on the last ones.

    The DLRM must have growing tables (``dynamic_tables: true``): the vocabulary grows by the
    window's new hotels, cities and filters (`RankingVocab.grow`, known values keep their ids) and
    each table inserts rows for the new ids as training meets them, its learned rows untouched
    (`DynamicSparseArch`).

    Args:
        model_dir: the current DLRM model directory; replaced when the candidate is promoted.
        path: the click-out log (`ClickoutDataModule`).
        end: the end of the window (ISO date/time UTC or epoch seconds): the test period is the
            `test_hours` before it, validation the `valid_hours` before that.
        out: folder of this candidate.
        train_hours: train on this many hours before validation (None: everything before it).
        record, gate, max_epochs, lr, batch_size, seed, promote: as `retrain` (the gate on ``mrr``).
    """
    from sessrec.data.ranking_datamodule import ClickoutDataModule
    from sessrec.tasks import DLRMTask

    current_dir, out_dir = Path(model_dir), Path(out)
    current = DLRMTask.from_pretrained(current_dir)
    if not current.hparams.get("dynamic_tables"):
        raise ValueError(
            f"{current_dir}: this DLRM has fixed tables; retraining grows them, so train it with --model.dynamic_tables true"
        )
    window = dict(test_hours=test_hours, valid_hours=valid_hours, batch_size=batch_size, seed=seed, end=end,
                  train_hours=train_hours, min_count=1)
    old = ClickoutDataModule(path, vocab_path=str(current_dir / "vocab.parquet"), **window)
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab_path = current.vocab.grow(old.rows["train"]).save(out_dir / "vocab.parquet")
    new = ClickoutDataModule(path, vocab_path=str(vocab_path), **window)
    pl.seed_everything(seed, verbose=False)
    candidate = DLRMTask.from_pretrained(current_dir).train()
    if lr is not None:
        candidate.hparams.lr = lr
    candidate, seconds, epochs = fit_candidate(candidate, new, out_dir, f"val/{gate.metric}", max_epochs)

    grown = new.vocab.cardinalities
    return decide(current_dir, out_dir, gate, test_metrics(current, old), test_metrics(candidate, new), promote, record, {
        "window_end": str(end), "test_hours": test_hours, "valid_hours": valid_hours, "train_hours": train_hours,
        "current_ids": current.vocab.cardinalities, "candidate_ids": grown,
        "rows_in_tables": {name: int(t.num_keys) for name, t in candidate.model.sparse_arch.tables.items()},
        "train_rows": new.rows["train"].num_rows, "test_rows": new.rows["test"].num_rows,
        "train_seconds": round(seconds, 2), "epochs": epochs,
    })


def _copy_model(source: Path, target: Path) -> None:
    for path in source.iterdir():
        shutil.copy2(path, target / path.name)
