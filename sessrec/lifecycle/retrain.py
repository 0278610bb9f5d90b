"""Incremental retraining with a quality gate: warm start on the next window, promote only what holds up.

One call of `retrain` is one turn of the loop that keeps a served session model fresh:

1. lock the model directory (`VersionedDirectory`: one turn at a time) and read its current version; the
   candidate's folder (``--out``) is locked too once the turn writes it (`writing_candidate`);
2. grow the current model's vocabulary with the products first seen in the new training window
   (every known item keeps its id and learned row; new rows start from the model's initialisation);
3. train the grown model on that window (warm start), or a fresh one (``warm_start=False``); a window
   that ends before the current model's training data (``train_end`` in its directory) is refused
   unless asked to backfill, and so is a warm start on a window whose training sessions hold no event
   after that data (the same sessions trained on again), and so is a test window that does not start after the training data of
   every model compared (`sessrec.lifecycle.gate.check_unseen`), and so is a test window of fewer test
   pairs than the gate's ``min_pairs`` (counted before training: such a turn could only be refused);
4. evaluate the candidate, the current model and the best model promoted so far on the window
   after it, pair by pair on the same (prefix, next item) pairs (`sessrec.lifecycle.paired_ranks`): an item
   a model never saw counts against it;
5. decide with the `Gate` (`sessrec.lifecycle.gate`): a paired bootstrap against the current model and
   against the best promoted, so small losses cannot add up turn after turn;
6. promote a passing candidate as a new version of the model directory, or not, and append the
   whole decision to the directory's log (``promotions.jsonl``, fsynced before the pointer moves).
   The log's latest ``best`` names the anchor of the next turn.

    sessrec retrain --config recipes/retrain_rsc15.yaml --train_from 2014-04-04 --train_until 2014-04-05 \\
                    --test_until 2014-04-06
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytorch_lightning as pl
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.utilities.exceptions import SIGTERMException

from sessrec.artifacts import ClickRanker, SessionRecommender
from sessrec.artifacts.model_directory import CONFIG, VOCAB, read_model_directory, read_train_end
from sessrec.data import frame
from sessrec.data.periods import iso, to_seconds
from sessrec.data.schema import Schema
from sessrec.data.sources import SessionSource, SessionSplits, TimeWindowSource
from sessrec.data.vocab import ItemVocab
from sessrec.embeddings import DynamicTables
from sessrec.lifecycle.gate import Gate, check_unseen
from sessrec.lifecycle.paired_ranks import PairRanks, aligned, clickout_ranks, next_item_ranks, protocol_pairs
from sessrec.saved.atomic import lock_folder, remove_created
from sessrec.saved.registry import class_path, config_of
from sessrec.saved.versions import VersionedDirectory, resolve
from sessrec.tasks import NextItemTask
from sessrec.tasks.checkpointing import best_of_run, build, plain_hparams, with_more_items
from sessrec.tasks.session_data import SessionDataModule

PROTOCOL = "last"  # the test pairs a turn compares: each test session's last item


class LoadedSplits(SessionSource):
    """Splits already in memory, so every model evaluated reads one load of the files."""

    def __init__(self, splits: SessionSplits) -> None:
        self.splits = splits

    def load(self) -> SessionSplits:
        return self.splits


@dataclass(frozen=True)
class Standing:
    """Where a model directory stands before a turn: its current version and the best promoted so far.

    Args:
        current: the current version's name; None for a plain directory (one model, no versions yet).
        best: the best promoted so far, as the log's latest ``best`` names it among the versions of the
            promotion history (`VersionedDirectory.line`: a version a rollback walked back from is no
            longer anyone's best); None when none is named (the current model is then the best).
    """

    current: str | None
    best: str | None

    @classmethod
    def read(cls, store: VersionedDirectory) -> Standing:
        line = set(store.line())
        named = [entry["best"] for entry in store.history() if entry.get("best") in line]
        return cls(store.current_version(), named[-1] if named else None)

    def best_apart(self, store: VersionedDirectory) -> Path | None:
        """The best promoted version's folder when it is not the current version and still exists, else None."""
        if self.best is None or self.best == self.current or not store.path(self.best).is_dir():
            return None
        return store.path(self.best)


@contextmanager
def turn(model_dir: str, keep: int) -> Iterator[tuple[VersionedDirectory, Standing, Path]]:
    """Hold the model directory for one turn: the directory's lock taken and the directory recovered
    after a crash; yields the store, where it stands and the current version's folder."""
    root = Path(model_dir)
    resolve(root)  # a missing model directory is an error here, before the lock would create it
    store = VersionedDirectory(root, keep=keep)
    with store.lock():
        store.recover()
        yield store, Standing.read(store), resolve(root)


def retrain(
    model_dir: str,
    paths: list[str],
    train_from: str,
    train_until: str,
    test_until: str,
    out: str,
    schema: Schema = Schema(),  # noqa: B008 - a config value, never mutated
    gate: Gate = Gate(),  # noqa: B008 - a config value, never mutated
    warm_start: bool = True,
    max_epochs: int = 3,
    lr: float | None = None,
    warmup_steps: int | None = None,
    batch_size: int = 256,
    valid_fraction: float = 0.1,
    seed: int = 0,
    promote: bool = True,
    keep: int = 5,
    test_from: str | None = None,
    backfill: bool = False,
) -> dict[str, Any]:
    """Train a candidate on one window, gate it on the next against the current and the best model, promote or not.

    Args:
        model_dir: the model directory of a trained session model (``runs/<name>/model``, which ``sessrec
            fit`` writes; versioned once a candidate is promoted into it). A DLRM's directory is retrained by
            `retrain_dlrm`, with other options (``--path``, ``--end``, ...): ``sessrec retrain --model_dir
            <its directory> --help`` lists them. A model that reads side features is refused: the windows'
            sessions are read without them.
        paths: event files holding both windows (read together).
        train_from: start of the training window (see `TimeWindowSource`).
        train_until: end of the training window, and start of the test window unless `test_from` says.
            It must be after the current model's training data ends (``train_end`` in its directory)
            unless `backfill`.
        test_until: end of the test window.
        out: folder of this candidate: its checkpoints and model directory (``out/model``).
        schema: column roles of the event files.
        gate: the per-pair metric, tolerance, confidence and minimum test size of the promotion (`Gate`).
        warm_start: start from the current model's weights (grown to the new items); False trains
            the same architecture from scratch on the window, with a vocabulary of its own. Either way the
            candidate reads event times only if the current model does (an HSTU trained without them does not).
        max_epochs: training epochs on the window.
        lr: peak learning rate (``optimization.lr``); default `Optimization`'s (a model directory holds
            no training settings).
        warmup_steps: warm-up steps (``schedule.warmup_steps``); default `Schedule`'s.
        batch_size: training sessions per batch.
        valid_fraction: latest share of the window's training sessions used for checkpoint selection.
        seed: seed of initialisation, shuffling and masking.
        promote: False evaluates and logs the decision but never promotes (a shadow run, e.g. to
            compare training from scratch).
        keep: versions of `model_dir` kept besides the current one, the one before it and the best.
        test_from: start of the test window, at or after `train_until` (None: `train_until`). It must be
            after the training data of the current model and of the best promoted ends: the gate never
            compares on sessions a compared model trained on.
        backfill: train on a window that ends before the current model's training data does, or warm-start on
            training sessions that end with it (its test window, from `test_from`, must still start after it).

    Returns:
        the decision as the model directory's log holds it (``promotions.jsonl``).
    """
    out_dir = check_candidate(out, max_epochs)
    with turn(model_dir, keep) as (store, standing, current_path), ExitStack() as held:
        served = SessionRecommender.from_pretrained(current_path)
        if served.model.side_info is not None and served.model.side_info.names:
            raise ValueError(f"{current_path}: the model reads side features {served.model.side_info.names}, which sessrec "
                             "retrain does not give its candidate; train a new model on the window with sessrec fit and "
                             "the recipe's side_features")
        source = TimeWindowSource(paths, schema, train_from, train_until, test_until, valid_fraction=valid_fraction,
                                  test_from=test_from)
        best_path = standing.best_apart(store)
        check_window(current_path, served.train_end, best_path, backfill,
                     ("the training window", to_seconds(train_until, "train_until"), False),
                     ("the test window (--test_from, default --train_until)", source.bounds[2]))
        current = NextItemTask.from_recommender(served)
        check_gate_metric(gate, current.evaluation.ks)
        splits = source.load()
        if warm_start and not backfill:
            check_new_data(f"the training window's training sessions ({train_from} .. {train_until})", "sessions",
                           splits.train_end(), served.train_end, current_path)
        check_min_pairs(gate, len(protocol_pairs(splits.test, PROTOCOL).session), "the test window's sessions (their last items)",
                        f"{train_until if test_from is None else test_from} .. {test_until}", "--test_until")
        check_catalogue(splits.test, current.vocab, current_path / VOCAB, ", ".join(map(str, paths)),
                        f"{train_until if test_from is None else test_from} .. {test_until}")
        held.enter_context(writing_candidate(out_dir, max_epochs))

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
        vocab_path = vocab.save(out_dir / VOCAB)
        # a model trained without event times (HSTU with --data.times false) has a candidate trained without them too
        data = SessionDataModule(LoadedSplits(splits), max_length=int(candidate.hparams.max_length), batch_size=batch_size,
                                 eval_protocol=PROTOCOL, vocab_path=str(vocab_path), seed=seed,
                                 times=None if current.uses_times else False)
        candidate, train_seconds, epochs = fit_candidate(candidate, data, out_dir, f"val/{gate.metric}", max_epochs)

        return settle(store, standing, gate, {
            "candidate": lambda: pair_ranks(candidate, splits, vocab_path),
            "current": lambda: pair_ranks(current, splits, current_path / VOCAB),
            **({} if best_path is None else {"best": lambda: pair_ranks(
                NextItemTask.from_recommender(SessionRecommender.from_pretrained(best_path)), splits, best_path / VOCAB)}),
        }, out_dir / "model", promote, {
            "train_window": [str(train_from), str(train_until)],
            "test_window": [str(train_until if test_from is None else test_from), str(test_until)],
            "current_train_end": iso(served.train_end),
            "backfill": backfill,
            "warm_start": warm_start,
            "current_items": len(current.vocab),
            "candidate_items": len(vocab),
            "new_items": new_items,
            "train_sessions": splits.train.num_rows,
            "test_sessions": splits.test.num_rows,
            "train_seconds": round(train_seconds, 2),
            "epochs": epochs,
        })


def pair_ranks(task: NextItemTask, splits: SessionSplits, vocab_file: Path) -> PairRanks:
    """The rank of each test session's last item under `task`, read with its vocabulary `vocab_file` and, when its
    encoder reads them, with the sessions' event times (as ``trainer.test`` gives them)."""
    # every compared model ranks the same pairs: an item it never saw is its miss, which the gate is there to weigh
    pairs = SessionDataModule(LoadedSplits(splits), max_length=int(task.hparams.max_length), eval_protocol=PROTOCOL,
                              vocab_path=str(vocab_file), times=task.uses_times or None, max_unknown_targets=1.0)
    return next_item_ranks(task, pairs)


def check_window(current_path: Path, served_end: float | None, best_path: Path | None, backfill: bool,
                 train: tuple[str, float, bool], test: tuple[str, float]) -> None:
    """Refuse, before anything is trained, a turn that goes back in time: a training window ending at or before
    the current model's training data (unless `backfill`), or a test window that a compared model trained on.

    Args:
        served_end: the current model's ``train_end`` (None: not recorded, refused).
        best_path: the best promoted version's folder when it is another version, else None.
        train: the training window in words, its end (epoch seconds) and whether the end is in it: it goes
            back in time when it cannot hold an event at or after the current model's ``train_end``.
        test: the test window in words and its start.
    """
    config = str(current_path / CONFIG)
    trained = [("the current model", served_end, config)]
    if best_path is not None:
        trained.append(("the best promoted", read_train_end(read_model_directory(best_path)[1], str(best_path / CONFIG)),
                        str(best_path / CONFIG)))
    (window, until, closed), (test_window, test_from) = train, test
    if served_end is not None and (until < served_end or until == served_end and not closed) and not backfill:
        raise ValueError(f"{window} ends {iso(until)}, before reaching the last event the current model trained on "
                         f"({iso(served_end)}, train_end in {config}): retrain on a later window, or pass --backfill true "
                         "to train on an older one")
    check_unseen(test_window, test_from, trained)


def check_new_data(window: str, what: str, data_end: float, served_end: float, current_path: Path) -> None:
    """Refuse a warm start on training data that ends at or before the current model's ``train_end`` (`data_end`,
    `served_end`): it holds nothing the model has not trained on, and would train it again on the same `what`."""
    if data_end <= served_end:
        raise ValueError(f"{window} end {iso(data_end)}, not after the last event the current model trained on "
                         f"({iso(served_end)}, train_end in {current_path / CONFIG}): a warm start would train it again "
                         f"on {what} it trained on; retrain on a later window, or pass --backfill true")


def settle(
    store: VersionedDirectory, standing: Standing, gate: Gate, evaluations: dict[str, Callable[[], PairRanks]],
    candidate_dir: Path, promote: bool, facts: dict[str, Any],
) -> dict[str, Any]:
    """Evaluate the models pair by pair, decide with `gate`, promote the candidate as a new version or
    not, and log the decision in the model directory; returns the log's entry.

    Args:
        evaluations: ``candidate``, ``current`` and, when the best promoted is another version,
            ``best``: each computes that model's `PairRanks` on the same test pairs.
        candidate_dir: the candidate's model directory, copied into the new version when promoted.
    """
    started = time.perf_counter()
    ranks = {name: rank_pairs() for name, rank_pairs in evaluations.items()}
    aligned({f"the {name} model": r for name, r in ranks.items()})  # the same pairs in the same order, or ValueError
    values = {name: r.values(gate.metric) for name, r in ranks.items()}
    best_compared = standing.best if "best" in ranks else None
    decision = gate.decide(
        values["candidate"], values["current"], values.get("best"),
        current_name=_label("the current model", standing.current), best_name=_label("the best promoted", best_compared),
    )
    record = {
        "event": "decision",
        "model_dir": str(store.root),
        "candidate": str(candidate_dir),
        "current_version": standing.current,
        "best_compared": best_compared,
        "gate": asdict(gate),
        "metrics": {name: r.metrics for name, r in ranks.items()},
        **asdict(decision),
        **facts,
        "evaluate_seconds": round(time.perf_counter() - started, 2),
        "promoted": False,
    }
    anchor = best_compared or standing.current  # the best after a decision that moves nothing
    if decision.passed and promote:
        version = store.add(lambda folder: _copy_model(resolve(candidate_dir), folder))
        current = standing.current or store.versions()[0]  # a plain directory's model became the first version
        store.promote(version, {**record, "promoted": True, "best": version if decision.new_best else anchor or current})
    else:
        store.log({**record, "best": anchor})
    return store.history()[-1]


def summary(decision: dict[str, Any]) -> str:
    """A logged decision in one line: the verdict, the reason, the training time and the candidate's folder."""
    if decision["promoted"]:
        verdict = f"promoted as {decision['version']}" + (" (the new best)" if decision["new_best"] else "")
    else:
        verdict = "passed, not promoted (a shadow run)" if decision["passed"] else "rejected"
    return (f"{verdict}: {decision['reason']}; {decision['train_seconds']:.0f} s of training; "
            f"candidate in {decision['candidate']}")


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
    try:
        trainer.fit(candidate, datamodule=data)
    except SIGTERMException:  # Lightning's stop on SIGTERM is an exit of status 0: this turn did not finish
        raise RuntimeError(f"stopped by SIGTERM at step {trainer.global_step} of the candidate's training: nothing was "
                           "gated or promoted; run the turn again") from None
    seconds = time.perf_counter() - started
    if not best.best_model_path:
        raise RuntimeError(f"training saved no checkpoint (is {monitor!r} logged?)")
    trained = best_of_run(candidate, best.best_model_path, data)
    artifact = trained.recommender() if isinstance(trained, NextItemTask) else trained.ranker()
    artifact.train_end = data.train_end()  # the next turn never goes back before it
    artifact.save_pretrained(out_dir / "model")
    return trained, seconds, trainer.current_epoch


def check_candidate(out: str, max_epochs: int) -> Path:
    """The candidate's folder `out`, checked before any work, with `max_epochs`: refused in one line when it is a
    file or holds anything (another candidate's run: its checkpoint would be overwritten; each turn takes a new
    folder), or when `max_epochs` trains nothing."""
    if isinstance(max_epochs, bool) or not isinstance(max_epochs, int) or max_epochs < 1:
        raise ValueError(f"max_epochs must be an integer >= 1, got {max_epochs!r}: a candidate of no epoch is its initial weights")
    folder = Path(out)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise FileExistsError(f"out {folder}: {'is a file' if not folder.is_dir() else 'holds another run'}; give each "
                              "candidate a new folder (e.g. runs/<name>/candidates/<date>)")
    return folder


@contextmanager
def writing_candidate(out_dir: Path, max_epochs: int) -> Iterator[None]:
    """Create the candidate's folder and hold it for the turn (`lock_folder`): another turn writing its candidate there
    (two model directories retrained with one ``--out``) is refused in one line, and so is a folder that another turn
    wrote into after `check_candidate` read it; its vocabulary and ``best.ckpt`` would be taken for this turn's.
    A turn that fails (stopped by SIGTERM, refused, an error) removes what it wrote there, and the folders it
    created, so that the same turn can be run again into the same folder."""
    missing = [p for p in (out_dir, *out_dir.parents) if not p.exists()]
    fd = lock_folder(out_dir, f"out {out_dir}: another sessrec retrain is writing its candidate here; give each "
                              "candidate a new folder (e.g. runs/<name>/candidates/<date>)")
    try:
        check_candidate(str(out_dir), max_epochs)
        try:
            yield
        except BaseException:
            for entry in out_dir.iterdir():  # all this turn's: the folder was empty, and is locked by it
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
            remove_created(missing)
            raise
    finally:
        os.close(fd)


def check_gate_metric(gate: Gate, ks: list[int]) -> None:
    """Refuse a gate metric the candidate's validation does not compute: one at a cut-off other than its `ks`
    (the current model's), or ``mrr`` without a cut-off (the click ranker's)."""
    name, at, k = gate.metric.partition("@")
    if not at:
        raise ValueError(f"gate metric {gate.metric}: a session model's validation computes recall, ndcg and mrr at "
                         f"{', '.join(map(str, ks))} (the current model's evaluation ks), not {gate.metric} without a "
                         f"cut-off (a click ranker's); gate on one of those, e.g. {gate.metric}@{ks[-1]}")
    if int(k) not in ks:
        raise ValueError(f"gate metric {gate.metric}: the candidate's validation computes {name} at "
                         f"{', '.join(map(str, ks))} (the current model's evaluation ks); gate on one of those")


def check_catalogue(test: pa.Table, vocab: ItemVocab, vocab_file: Path, source: str, window: str) -> None:
    """Refuse, before the candidate trains, a test window none of whose items the current model knows: events of
    another catalogue, on which the current model cannot be evaluated (`pair_ranks` refuses it), so the turn
    could only end in that refusal, after training and with its candidate's folder written."""
    values, _ = frame.list_offsets(test.column(frame.ITEMS))
    virtual = frame.virtual_flags(test)
    products = len(values) - (int(np.count_nonzero(virtual)) if virtual is not None else 0)
    if products and vocab.encode(values, virtual=virtual, source=source).num_unknown == products:
        raise ValueError(f"{source}: none of the {products} items of the test window ({window}) is in the current "
                         f"model's vocabulary {vocab_file} ({vocab.num_products} items of type {vocab.raw_ids.type}, "
                         f"e.g. {vocab.raw_ids[0].as_py()!r}; the window's first {values[0].as_py()!r}): the events and "
                         "the model do not belong together; nothing was trained")


def check_min_pairs(gate: Gate, pairs: int, what: str, window: str, widen: str) -> None:
    """Refuse, before training, a gate that needs more test pairs than the test window holds: its decision could
    only be a refusal."""
    if pairs < gate.min_pairs:
        raise ValueError(f"gate min_pairs {gate.min_pairs}: the test window ({window}) holds {pairs} test pairs ({what}), "
                         f"and the gate refuses a candidate on fewer, so this turn could only be refused; lower "
                         f"--gate.min_pairs or widen the test window ({widen})")


def retrain_dlrm(
    model_dir: str,
    path: str,
    end: str,
    out: str,
    test_hours: float = 8.0,
    valid_hours: float = 4.0,
    train_hours: float | None = None,
    gate: Gate = Gate("mrr", 0.005),  # noqa: B008 - a config value, never mutated
    max_epochs: int = 1,
    lr: float | None = None,
    batch_size: int = 4096,
    seed: int = 0,
    promote: bool = True,
    keep: int = 5,
    backfill: bool = False,
) -> dict[str, Any]:
    """The same turn for a DLRM on click-outs: warm start on the hours before `end`, gate on the last ones.

    The DLRM must have growing tables (``sparse: DynamicTables``): the vocabulary grows by the
    window's new hotels, cities and filters (`RankingVocab.grow`, known values keep their ids) and
    each table inserts rows for the new ids as training meets them, its learned rows untouched
    (`DynamicSparseArch`). The gate compares the reciprocal rank of each clicked hotel within its
    click-out's list (``mrr``) or whether it is in the top k (``recall@k``), click-out by click-out.

    Args:
        model_dir: the DLRM model directory (versioned once a candidate is promoted into it).
        path: the click-out log (`ClickoutDataModule`).
        end: the end of the window (ISO date/time UTC or epoch seconds): the test period is the
            `test_hours` before it, validation the `valid_hours` before that.
        out: folder of this candidate.
        train_hours: train on this many hours before validation (None: everything before it).
        gate: the promotion test, as `retrain`'s (here on ``mrr`` or ``recall@k`` of click-outs).
        max_epochs: training epochs of the candidate.
        lr: the DLRM's learning rate; None: `Optimization`'s (a model directory holds no training settings).
        batch_size: training rows per batch.
        seed: seeds the candidate's training.
        promote: promote a candidate that passes the gate (False: decide and report only).
        keep: versions of `model_dir` kept besides the current one, the one before it and the best.
        backfill: train on click-outs that end before the current model's training data does, or on training
            click-outs that end with it (its test hours must still start after it: the gate never compares on
            click-outs a compared model trained on).
    """
    from sessrec.tasks import DLRMTask
    from sessrec.tasks.clickout_data import ClickoutDataModule

    out_dir = check_candidate(out, max_epochs)
    with turn(model_dir, keep) as (store, standing, current_path), ExitStack() as held:
        served = ClickRanker.from_pretrained(current_path)
        stop = to_seconds(end, "end")
        check_window(current_path, served.train_end, standing.best_apart(store), backfill,
                     ("the training window (before the --valid_hours and --test_hours that end at --end)",
                      stop - (test_hours + valid_hours) * 3600.0, True),
                     ("the test window (the --test_hours before --end)", stop - test_hours * 3600.0))
        current = DLRMTask.from_ranker(served)
        logged = current.metrics["val"].names  # what the candidate's validation logs: its checkpoint is chosen by one
        if gate.metric not in logged:
            raise ValueError(f"gate metric {gate.metric}: the click ranker's validation computes {', '.join(logged)} (the "
                             "current model's evaluation ks); gate on one of those")
        if not isinstance(current.sparse, DynamicTables):
            raise ValueError(
                f"{current_path}: this DLRM has fixed tables ({type(current.sparse).__name__}); retraining grows them, so train "
                "it with --model.sparse.class_path sessrec.embeddings.DynamicTables"
            )
        window = {"test_hours": test_hours, "valid_hours": valid_hours, "batch_size": batch_size, "seed": seed,
                  "end": end, "train_hours": train_hours, "min_count": 1}
        old = ClickoutDataModule(path, vocab_path=str(current_path / VOCAB), **window)
        trained_on = old.training_rows()  # refused here, before anything is written, when the window has none
        if not backfill:
            check_new_data(f"the training window's training click-outs (before {iso(stop - (test_hours + valid_hours) * 3600.0)})",
                           "click-outs", old.train_end(), served.train_end, current_path)
        clicked = int((old.rows["test"].column("label").to_numpy(zero_copy_only=False) > 0.5).sum())  # clickout_ranks' pairs
        check_min_pairs(gate, clicked, "clicked rows of the test hours' click-outs", f"the {test_hours:g} hours before {end}",
                        "--test_hours")
        held.enter_context(writing_candidate(out_dir, max_epochs))
        vocab_path = current.vocab.grow(trained_on).save(out_dir / VOCAB)
        new = ClickoutDataModule(path, vocab_path=str(vocab_path), **window)
        pl.seed_everything(seed, verbose=False)
        candidate = DLRMTask.from_ranker(ClickRanker.from_pretrained(current_path)).train()
        if lr is not None:
            candidate.hparams.optimization = config_of(replace(candidate.optimization, lr=lr))
        candidate, seconds, epochs = fit_candidate(candidate, new, out_dir, f"val/{gate.metric}", max_epochs)

        def best_ranks(folder: Path) -> PairRanks:
            return clickout_ranks(DLRMTask.from_ranker(ClickRanker.from_pretrained(folder)),
                                  ClickoutDataModule(path, vocab_path=str(folder / VOCAB), **window))

        best_path = standing.best_apart(store)
        return settle(store, standing, gate, {
            "candidate": lambda: clickout_ranks(candidate, new),
            "current": lambda: clickout_ranks(current, old),
            **({} if best_path is None else {"best": lambda: best_ranks(best_path)}),
        }, out_dir / "model", promote, {
            "window_end": str(end), "current_train_end": iso(served.train_end), "backfill": backfill, "test_hours": test_hours, "valid_hours": valid_hours, "train_hours": train_hours,
            "current_ids": current.vocab.cardinalities, "candidate_ids": new.vocab.cardinalities,
            "rows_in_tables": {name: int(t.num_keys) for name, t in candidate.model.sparse_arch.tables.items()},
            "train_rows": new.rows["train"].num_rows, "test_rows": new.rows["test"].num_rows,
            "train_seconds": round(seconds, 2), "epochs": epochs,
        })


def _label(role: str, version: str | None) -> str:
    """A model in the decision's words: ``the current model (v000004)``, ``the best promoted (v000002)``."""
    return f"{role} ({version})" if version is not None else role


def _copy_model(source: Path, target: Path) -> None:
    for path in source.iterdir():
        if path.is_file():
            shutil.copy2(path, target / path.name)
