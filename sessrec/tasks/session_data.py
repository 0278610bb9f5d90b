"""`SessionDataModule`: source -> vocabulary (+ side features) -> padded tensors -> columnar loaders.

The vocabulary and the side-feature transforms are fitted on the training split only (or loaded
from `vocab_path` / `features_path`: the files of a model directory; a prepared dataset's vocabulary
is read from it, `PreparedSource`). Evaluation splits are
expanded into (prefix, next item) pairs by the chosen protocol; the prefix never contains the
target event, and a virtual (non-product) event is never a target. Reversed copies of the
training sessions (`augment_reversed`) are added to training only. Event times (`times`) are
padded like the items, built only for the batches that carry them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import rank_zero_info

from sessrec.data import frame
from sessrec.data.batch import ITEM_DTYPE
from sessrec.data.loader import SessionLoader, ranks_of, release_process_group_at_exit
from sessrec.data.pairs import EvalPairs
from sessrec.data.prepared.dataset import PreparedSource
from sessrec.data.schema import Schema
from sessrec.data.side import SideFeatures, SideInfoSpec, read_item_vectors
from sessrec.data.sources import SessionSource, SessionSplits, SyntheticSource
from sessrec.data.stream import ScoringStream
from sessrec.data.streaming import StreamedSplits, StreamingLoader, split_files
from sessrec.data.training_rows import TrainingRows
from sessrec.data.vocab import OOV, ItemVocab, vocab_difference
from sessrec.features.side_transform import SideFeatureTransform
from sessrec.saved.checkpoint import as_arrays, as_tensors
from sessrec.saved.registry import Configurable, check_integers, check_switches

Protocol = Literal["last", "all_prefixes"]


class SessionDataModule(Configurable, pl.LightningDataModule):
    """Sessions for training, evaluation and batch scoring.

    Each instance records its constructor's arguments (`Configurable`): ``sessrec fit`` writes them into
    the model directory as its ``data`` section, from which a pipeline recipe rebuilds the sessions.

    Args:
        source: where sessions come from (`SRGNNSource`, `EventLogSource`, `SyntheticSource`, ...);
            None: `SyntheticSource()`. (A default of None, not an instance: a recipe that picks another
            class must get that class's own defaults, never the settings of the default's class.)
        max_length: most recent items a model sees per session.
        batch_size: training sessions per batch.
        eval_batch_size: sessions per evaluation/scoring batch.
        eval_protocol: ``last`` (predict each held-out session's last item) or ``all_prefixes``
            (every prefix predicts its next item: the SR-GNN protocol).
        min_item_count: items seen fewer times in training map to the OOV id.
        max_vocab_size: keep at most this many most frequent items.
        shuffle_chunk: shuffle contiguous chunks of this many sessions (1 = full row shuffle).
        bucket_batches: when > 0, training batches of similar lengths, sorted within pools of this many
            batches (`SessionLoader`): a padded encoder (SASRec) then computes close to the real items
            of a batch, not its longest row's width for every row. 0: batches of shuffled rows. Refused
            with `shuffle_chunk` and `streaming`.
        pin_memory: pin batches for faster host-to-GPU copies.
        device: hold the splits on this device (e.g. ``cuda``) and cut the batches there
            (`SessionLoader`'s torch gather): no host-to-device copy per batch. None: host memory.
        streaming: read the training batches from a prepared dataset's parquet row groups
            (`StreamingLoader`: memory flat in the dataset's size, each data-parallel rank reading
            its own row groups) instead of holding the training split in memory; the source must be
            a prepared dataset (``sessrec prepare``), whose stored vocabulary is used. Validation and
            test stay in memory. Refused with `device` and `shuffle_chunk`; side features need
            their fitted transforms (`features_path`).
        shuffle_buffer: training rows the streaming loader holds for shuffling (None: 65,536); only
            with `streaming`.
        augment_reversed: add a reversed copy of every training session with two or more events
            (Booking.com, WSDM'21); validation and test are never augmented. Side features
            travel with their events (a reversed copy's ``since_prev`` is then a time to the next event).
        train_prefixes: train on every prefix of every training session, each with the event
            that follows it (SR-GNN's training pairs, kept as sequences for the objectives): a
            session of n events gives n - 1 rows, ending at each of its 2nd..nth events (the
            non-virtual ones). After reversal when both are on. Evaluation is unchanged.
        side_features: side information for the model (`SideFeatures`); none by default.
        times: give the training, evaluation and scoring batches their event times
            (`SessionBatch.times`: float64 seconds aligned with the items, 0 on padding). None: when
            the task being run asks for them (its ``uses_times``: a `NextItemTask` whose encoder
            uses event times, as `HSTUEncoder`) and the sessions have a ``timestamp`` column;
            True: always (sessions without that column are refused; the scoring stream carries
            them where the file has `predict_schema`'s timestamp column); False: never. Each event keeps
            its own time, virtual events included; a reversed training copy's times travel with
            its events (they decrease), and a training prefix has the times of its events.
            The (N, L) float64 times of a split are built the first time its batches need them.
        vocab_path: load this fitted vocabulary (a ``vocab.parquet``) instead of fitting one
            (``sessrec test/predict --model_dir`` set it to the model directory's).
        max_unknown_targets: with `vocab_path`, the largest share of an evaluation split's targets that may be
            unknown to that vocabulary (each counts as a miss); above it the split is refused, naming the share,
            as metrics of data the model was not trained for; unknown targets below it are reported.
        features_path: load these fitted side-feature transforms (a ``features.npz``) instead of fitting them.
        predict_path: sessions file to score with ``sessrec predict``.
        predict_schema: column names of `predict_path` (its ``features`` name the side-feature
            columns of an event file); the events of a session are ordered by its ``timestamp``
            column when the file has one, and kept in file order when it has none.
        seed: shuffling seed.
    """

    def __init__(
        self,
        source: SessionSource | None = None,
        max_length: int = 20,
        batch_size: int = 256,
        eval_batch_size: int = 1024,
        eval_protocol: Protocol = "last",
        min_item_count: int = 1,
        max_vocab_size: int | None = None,
        shuffle_chunk: int = 1,
        bucket_batches: int = 0,
        pin_memory: bool = False,
        device: str | None = None,
        streaming: bool = False,
        shuffle_buffer: int | None = None,
        augment_reversed: bool = False,
        train_prefixes: bool = False,
        side_features: SideFeatures = SideFeatures(),  # noqa: B008 - a config value, never mutated
        times: bool | None = None,
        vocab_path: str | None = None,
        max_unknown_targets: float = 0.5,
        features_path: str | None = None,
        predict_path: str | None = None,
        predict_schema: Schema = Schema(),  # noqa: B008 - orders events by `timestamp` when the file has it
        seed: int = 0,
    ) -> None:
        super().__init__()
        if eval_protocol not in ("last", "all_prefixes"):
            raise ValueError(f"eval_protocol must be 'last' or 'all_prefixes', got {eval_protocol!r}")
        if max_length < 2:
            raise ValueError(
                f"max_length must be >= 2 (the most recent items a model sees per session; a prefix and "
                f"its next item need two), got {max_length}"
            )
        check_integers({"batch_size": batch_size, "eval_batch_size": eval_batch_size, "min_item_count": min_item_count,
                        **({} if max_vocab_size is None else {"max_vocab_size": max_vocab_size})}, "SessionDataModule ")
        check_switches({"pin_memory": pin_memory, "streaming": streaming, "augment_reversed": augment_reversed,
                        "train_prefixes": train_prefixes}, "SessionDataModule ")
        self.source, self.max_length = SyntheticSource() if source is None else source, max_length
        self.batch_size, self.eval_batch_size, self.eval_protocol = batch_size, eval_batch_size, eval_protocol
        self.min_item_count, self.max_vocab_size = min_item_count, max_vocab_size
        self.shuffle_chunk, self.pin_memory, self.seed = shuffle_chunk, pin_memory, seed
        if device is not None and pin_memory:
            raise ValueError("pin_memory is for batches copied from the host; with device set they are cut on the device")
        self.device = device
        if shuffle_buffer is not None and not streaming:
            raise ValueError("shuffle_buffer is the streaming loader's: set streaming true, or leave shuffle_buffer null")
        if streaming and (device is not None or shuffle_chunk != 1):
            raise ValueError("streaming reads the training split batch by batch: it is not held on a device nor shuffled "
                             "in chunks; set device null and shuffle_chunk 1")
        if bucket_batches < 0 or (bucket_batches and (streaming or shuffle_chunk != 1)):
            raise ValueError(f"bucket_batches sorts the held training rows: it needs streaming false, shuffle_chunk 1 "
                             f"and a value >= 0, got {bucket_batches}")
        self.streaming, self.shuffle_buffer, self.bucket_batches = streaming, shuffle_buffer, bucket_batches
        self._on_device: dict[str, torch.Tensor] = {}  # "<split>/<tensor>" -> that tensor on `device`
        self.augment_reversed, self.side_features = augment_reversed, side_features
        self.train_prefixes, self.times = train_prefixes, times
        self.vocab_path, self.predict_path, self.predict_schema = vocab_path, predict_path, predict_schema
        if isinstance(max_unknown_targets, bool) or not isinstance(max_unknown_targets, (int, float)) or not (
                0 <= max_unknown_targets <= 1):
            raise ValueError(f"SessionDataModule max_unknown_targets must be a share in [0, 1], got {max_unknown_targets!r}")
        self.max_unknown_targets = float(max_unknown_targets)
        self.features_path = features_path
        self._splits: SessionSplits | None = None
        self._vocab: ItemVocab | None = None
        self._side: SideFeatureTransform | None = None
        self._item_vectors: dict[str, np.ndarray] | None = None
        self._tensors: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = {}
        self._features: dict[str, dict[str, torch.Tensor]] = {}
        self._train_rows: TrainingRows | None = None
        self._times: dict[str, torch.Tensor | None] = {}
        self._pair_index: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._pairs: dict[tuple[str, str, int], EvalPairs] = {}
        self.stats: dict[str, int] = {}
        self.scoring_stream: ScoringStream | None = None

    # -- fitted state ---------------------------------------------------------------------
    @property
    def splits(self) -> SessionSplits:
        if self._splits is None:
            self._splits = StreamedSplits(*self.prepared) if self.streaming else self.source.load()
            self.stats.update(self._splits.summary())
            for note in self._splits.notes:
                rank_zero_info(f"sessrec: {note}")
        return self._splits

    @property
    def vocab(self) -> ItemVocab:
        if self._vocab is None:
            if self.vocab_path is not None:
                self._vocab = ItemVocab.load(self.vocab_path)
                return self._vocab
            if self.splits.summary()["train_sessions"] == 0:  # a source that does not refuse it itself
                raise ValueError(f"{self.splits.source}: the training split holds no session, so there is no item to "
                                 f"fit the vocabulary on; check the source's split settings ({type(self.source).__name__})")
            if isinstance(self.source, PreparedSource):  # fitted by sessrec prepare, with the same settings
                self._vocab = self.source.vocab(self.min_item_count, self.max_vocab_size)
            else:
                values, _ = frame.list_offsets(self.splits.train.column(frame.ITEMS))
                virtual = frame.virtual_flags(self.splits.train)
                vocab = ItemVocab.fit(values, self.min_item_count, self.max_vocab_size, virtual=virtual)
                vocab.check_products(self.min_item_count, self.splits.source)
                self._vocab = vocab
        return self._vocab

    @property
    def prepared(self) -> tuple[Path, dict[str, Any]]:
        """The prepared dataset's directory and manifest (`streaming`); refused in one line for another source."""
        if not isinstance(self.source, PreparedSource):
            raise ValueError(
                f"streaming reads a prepared dataset (written by `sessrec prepare`, read by PreparedSource), but the "
                f"source is {type(self.source).__name__}({getattr(self.source, 'path', None) or ''}); set streaming "
                "false, or prepare it"
            )
        return Path(self.source.path), self.source.manifest

    def train_end(self) -> float | None:
        """Time (epoch seconds) of the training split's last event (`SessionSplits.train_end`); None without times."""
        return self.splits.train_end()

    @property
    def num_items(self) -> int:
        """Size of the score vector (items + padding + OOV + virtual items); linked into the model's config."""
        return len(self.vocab)

    @property
    def num_virtual(self) -> int:
        """Virtual (input-only) ids at the end of the vocabulary; linked into the model's config."""
        return self.vocab.num_virtual

    @property
    def side(self) -> SideFeatureTransform | None:
        """The fitted side-feature transforms (fitted on the training split, or loaded)."""
        if self._side is None and self.side_features.sequence_features:
            if self.features_path is not None:
                self._side = SideFeatureTransform.load(self.features_path, self.side_features)
            elif self.streaming:
                raise ValueError("streaming never holds the training split to fit the side features on: give their "
                                 "fitted transforms as --data.features_path (a features.npz, or a checkpoint)")
            else:
                self._side = SideFeatureTransform(self.side_features).fit(self.splits.train, self.splits.source)
        return self._side

    @property
    def item_vectors(self) -> dict[str, np.ndarray]:
        """Modality -> (V, M) item vectors aligned with the vocabulary (zeros where an item has none)."""
        if self._item_vectors is None:
            self._item_vectors = {}
            for name, path in self.side_features.item_vectors.items():
                table, found = read_item_vectors(path, self.vocab)
                self._item_vectors[name] = table
                self.stats[f"item_vectors_{name}_found"] = found
        return self._item_vectors

    @property
    def side_info(self) -> SideInfoSpec | None:
        """Embedding sizes of the side information; linked into the model's config (None: none)."""
        if not self.side_features.enabled:
            return None
        spec = self.side.spec if self.side is not None else SideInfoSpec()
        spec.item_vectors = {name: int(table.shape[1]) for name, table in self.item_vectors.items()}
        return spec

    # -- checkpoint state ---------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The state dicts of the fitted vocabulary and side-feature transforms, as tensors: Lightning
        saves them in every checkpoint, so a checkpoint maps raw ids and features exactly as in training."""
        state = {"vocab": as_tensors(self.vocab.state_dict())}
        if self.side is not None:
            state["features"] = as_tensors(self.side.state_dict())
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take a checkpoint's vocabulary and transforms; refused when they differ from those in use."""
        vocab = ItemVocab.empty().load_state_dict(state["vocab"], "the checkpoint's vocabulary")
        if self._vocab is not None and self._vocab != vocab:
            raise ValueError(
                f"the checkpoint's vocabulary differs from the one this data module uses ({vocab_difference(vocab, self._vocab)}): "
                "resume with the data settings of the run it continues"
            )
        self._vocab = vocab
        if "features" in state and self._side is None and self.side_features.sequence_features:
            saved = as_arrays(state["features"])
            self._side = SideFeatureTransform(self.side_features).load_state_dict(saved, "the checkpoint")

    # -- tensors --------------------------------------------------------------------------
    def file_of(self, split: str) -> str:
        """The file a split's sessions were read from, for messages: the source's file of that split where it has
        one (an event log's ``test_path``, ``valid_path``), else the splits' ``source``."""
        files = self.source.splits_of() if callable(getattr(self.source, "splits_of", None)) else []
        return next((str(path) for path, splits in files if split in splits), self.splits.source)

    def _encode(self, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        sessions = getattr(self.splits, name)
        values, offsets = frame.list_offsets(sessions.column(frame.ITEMS))
        virtual = frame.virtual_flags(sessions)
        column = getattr(getattr(self.source, "schema", None), "item_id", frame.ITEMS)  # the file's name for it
        encoded = self.vocab.encode(values, virtual=virtual, source=f"{self.file_of(name)}, column {column!r}")
        self.stats[f"{name}_unknown_items"] = encoded.num_unknown
        products = len(values) - (int(np.count_nonzero(virtual)) if virtual is not None else 0)
        if self.vocab_path is not None and products and encoded.num_unknown == products:
            raise ValueError(
                f"{self.file_of(name)}: none of the {products} items of the {name} split is in the vocabulary of "
                f"{self.vocab_path} ({self.vocab.num_products} items of type {self.vocab.raw_ids.type}, e.g. "
                f"{self.vocab.raw_ids[0].as_py()!r}; the data's first {values[0].as_py()!r}): the data and the "
                "model do not belong together"
            )
        return encoded.ids, offsets, virtual

    def tensors(self, split: str) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(items (N, L), targets (N,) or None) of a split; training keeps whole sessions.

        Training rows are the sessions, then (with `augment_reversed`) the reversed copies of
        those with two or more events; with `train_prefixes`, every prefix of those rows that
        ends at a non-virtual event after the first. Evaluation rows are (prefix, target) pairs; a target is
        never a virtual event.
        """
        if split not in self._tensors:
            self._build(split)
        return self._tensors[split]

    def sessions(self, split: str) -> torch.Tensor:
        """(N, L) whole sessions of any split, one row each in the split's order, right-aligned, their
        last `max_length` events: what retrievers index (no reversed copies, no prefixes, no pairs)."""
        if split not in ("train", "valid", "test"):
            raise ValueError(f"split must be 'train', 'valid' or 'test', got {split!r}")
        ids, offsets, _ = self._encode(split)
        return torch.from_numpy(frame.pad_sessions(ids, offsets[:-1], offsets[1:], self.max_length, ITEM_DTYPE))

    def feature_tensors(self, split: str) -> dict[str, torch.Tensor]:
        """Side features by name, each (N, L) aligned with ``tensors(split)[0]``; empty without side features."""
        if split not in self._tensors:
            self._build(split)
        return self._features[split]

    def _build(self, split: str) -> None:
        if self.num_items > np.iinfo(ITEM_DTYPE).max:
            raise ValueError(f"{self.num_items} item ids do not fit the session matrices' {ITEM_DTYPE} ids")
        ids, offsets, virtual = self._encode(split)
        flat = {}
        if self.side is not None:
            flat = self.side.transform(getattr(self.splits, split), f"{self.file_of(split)} ({split} split)")
        if len(offsets) > 1 and not (np.diff(offsets) >= 2).any():
            raise ValueError(
                f"{self.file_of(split)} ({split} split): no session has two or more events (all {len(offsets) - 1} "
                "have one), so there is nothing to train on or evaluate; check the session_id column"
            )
        if split == "train":
            rows = self._train_rows = TrainingRows.of(offsets, virtual, self.augment_reversed, self.train_prefixes)
            if self.augment_reversed:
                self.stats["train_reversed"] = rows.num_reversed
            if self.train_prefixes:
                self.stats["train_prefix_rows"] = len(rows)
            pad = lambda values, dtype=None: rows.pad(values, self.max_length, dtype)
            self._tensors[split] = (torch.from_numpy(pad(ids, ITEM_DTYPE)), None)
        else:
            session, starts, target_at = self._pair_index[split] = self._expand(split, self.eval_protocol, offsets, virtual)
            pad = lambda values, dtype=None: frame.pad_sessions(values, starts, target_at, self.max_length, dtype)
            self._check_unknown_targets(split, ids[target_at])
            self._tensors[split] = (torch.from_numpy(pad(ids, ITEM_DTYPE)), torch.from_numpy(ids[target_at]))
            self.stats[f"{split}_pairs"] = len(target_at)
        feats = {}
        for name, values in flat.items():
            padded = pad(values)
            if split != "train" and name in self.side_features.looks_ahead_features:
                padded[:, -1] = 0  # the last input event's look-ahead value would tell about the target
            feats[name] = torch.from_numpy(padded)
        self._features[split] = feats

    def _check_unknown_targets(self, split: str, targets: np.ndarray) -> None:
        """With a loaded vocabulary (`vocab_path`), refuse an evaluation split whose share of targets unknown to it
        is above `max_unknown_targets`, and report any below it: each is a miss, whatever the model ranks."""
        unknown = int(np.count_nonzero(targets == OOV))
        self.stats[f"{split}_unknown_targets"] = unknown
        if self.vocab_path is None or not unknown:
            return
        share = unknown / len(targets)
        said = (f"{self.file_of(split)} ({split} split): {unknown} of {len(targets)} targets ({share:.1%}) are unknown to "
                f"the model's vocabulary {self.vocab_path}")
        if share > self.max_unknown_targets:
            raise ValueError(f"{said}, above --data.max_unknown_targets {self.max_unknown_targets:g}: each counts as a "
                             "miss, so the metrics would not measure the model; evaluate it on data of the items it was "
                             "trained on, or raise --data.max_unknown_targets")
        rank_zero_info(f"sessrec: {said}; each counts as a miss")

    def _expand(
        self, split: str, protocol: str, offsets: np.ndarray, virtual: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(session (P,), prefix start (P,), target index (P,)) of a split's pairs under `protocol`;
        the prefix of a pair is the events ``[start, target)`` of the flat event array."""
        targetable = frame.target_flags(getattr(self.splits, split), virtual)
        session, target_at = frame.expand_prefixes(offsets, protocol, targetable)
        return session.astype(np.int64), offsets[:-1][session], target_at

    def pairs(self, split: str, protocol: Protocol | None = None, width: int | None = None) -> EvalPairs:
        """The (prefix, target) pairs of an evaluation split with the session and event times of each.

        Args:
            split: ``valid`` or ``test``.
            protocol: ``last`` or ``all_prefixes``; None: `eval_protocol`, whose items and targets
                are those of `tensors` (the same tensors).
            width: events kept of each prefix, its latest (past `max_length`, no more columns than the longest
                prefix has); None: `max_length`. A pipeline's evaluation takes its ``history_length``, the events its filters read
                of a served session.

        Returns:
            `EvalPairs` whose ``sessions`` index the split's sessions (rows of ``splits.<split>``) and
            whose ``times`` are the events' timestamps padded like the items (float64 seconds, 0 on
            padding), or None when the split's sessions carry no ``timestamp`` column.
        """
        if split not in ("valid", "test"):
            raise ValueError(f"pairs are cut from the evaluation splits 'valid' and 'test', got {split!r}")
        protocol = self.eval_protocol if protocol is None else protocol
        if protocol not in ("last", "all_prefixes"):
            raise ValueError(f"protocol must be 'last' or 'all_prefixes', got {protocol!r}")
        width = self.max_length if width is None else width
        if (split, protocol, width) not in self._pairs:
            items, targets = self.tensors(split)  # validates the split once
            if protocol == self.eval_protocol and width == self.max_length:
                session, starts, ends = self._pair_index[split]
            else:
                ids, offsets, virtual = self._encode(split)
                session, starts, ends = (self._pair_index[split] if protocol == self.eval_protocol
                                         else self._expand(split, protocol, offsets, virtual))
                columns = max(min(width, int((ends - starts).max(initial=0))), self.max_length)  # none of padding alone
                items = torch.from_numpy(frame.pad_sessions(ids, starts, ends, columns, ITEM_DTYPE))
                targets = torch.from_numpy(ids[ends])
            times = self._padded_times(split, starts, ends, items.shape[1])
            self._pairs[split, protocol, width] = EvalPairs(items, targets, torch.from_numpy(session), times)
        return self._pairs[split, protocol, width]

    def scored_pairs(self, split: str, protocol: Protocol | None = None, width: int | None = None) -> EvalPairs:
        """`pairs`, refused in one line where the split gives none: there is no metric to compute (``sessrec
        validate`` or ``test``), nor a pipeline's ranker to fit."""
        pairs = self.pairs(split, protocol, width)
        if not len(pairs):
            raise ValueError(
                f"{self.file_of(split)} ({split} split): no (prefix, next item) pair to score: its "
                f"{getattr(self.splits, split).num_rows} sessions have none (a pair needs a session of two or more "
                f"events); check the source's split settings ({type(self.source).__name__})"
            )
        return pairs

    def time_tensor(self, split: str) -> torch.Tensor | None:
        """(N, L) float64 event times in seconds aligned with ``tensors(split)[0]`` (0 on padding), or
        None when the split's sessions carry no ``timestamp`` column. Built on the first call.

        Training rows follow `tensors`: a reversed copy holds its events' times in its (reversed)
        order, a prefix row the times of its events. Evaluation rows are the prefixes of the pairs
        (``pairs(split).times``); the target's time is never among them.
        """
        if split not in self._times:
            if split == "train":
                self.tensors(split)
                assert self._train_rows is not None
                times = frame.event_times(self.splits.train)
                self._times[split] = None if times is None else torch.from_numpy(
                    self._train_rows.pad(times, self.max_length, np.float64))
            else:
                self._times[split] = self.pairs(split).times
        return self._times[split]

    def _padded_times(self, split: str, starts: np.ndarray, ends: np.ndarray, width: int) -> torch.Tensor | None:
        """Event times of the rows ``[starts, ends)`` of an evaluation split's flat events, padded like the items (their
        latest `width`)."""
        times = frame.event_times(getattr(self.splits, split))
        if times is None:
            return None
        return torch.from_numpy(frame.pad_sessions(times, starts, ends, width, np.float64))

    def _task_reads(self, what: str) -> bool:
        """The trainer's task's `what` (``uses_times``, ``needs_times``); False without a trainer or one."""
        task = self.trainer.lightning_module if self.trainer is not None else None
        return bool(getattr(task, what, False))

    def _wants_times(self) -> bool:
        """`times`, or where it is None whether the trainer's task reads event times (its ``uses_times``)."""
        return self._task_reads("uses_times") if self.times is None else self.times

    def batch_times(self, split: str) -> torch.Tensor | None:
        """The event times the batches of `split` carry (`time_tensor`), or None where `times` and the
        task leave them out; `times=True` refuses sessions without a ``timestamp`` column, and a task
        whose model was trained with times (its ``needs_times``) refuses batches without them."""
        times = self.time_tensor(split) if self._wants_times() else None
        if times is None and self.times:
            raise ValueError(
                f"{self.file_of(split)} ({split} split): times=True, but the sessions have no {frame.TIMES!r} column; "
                "read the event time column (the source's schema.timestamp) or set --data.times null"
            )
        if times is None and self._task_reads("needs_times"):
            why = "--data.times false" if self.times is False else f"the sessions have no {frame.TIMES!r} column"
            raise ValueError(
                f"{self.file_of(split)} ({split} split): the model (or a teacher it distils from) was trained with event "
                "times and these batches carry "
                f"none ({why}); read the event time column (the source's schema.timestamp) and set --data.times null"
            )
        return times

    def setup(self, stage: str | None = None) -> None:
        release_process_group_at_exit()
        wanted = {"fit": ["train", "valid"], "validate": ["valid"], "test": ["test"], None: ["train", "valid", "test"]}
        for split in wanted.get(stage, []):
            if stage in ("validate", "test"):
                self.scored_pairs(split)  # fit may go without validation; these commands score nothing else
            elif not (split == "train" and self.streaming):
                self.tensors(split)

    # -- loaders --------------------------------------------------------------------------
    def _resident(
        self, split: str
    ) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, torch.Tensor], torch.Tensor | None]:
        """A split's items, targets, features and batch times where the loaders gather them (host, or `device`)."""
        items, targets = self.tensors(split)
        features = {k: self._moved(f"{split}/feature/{k}", v) for k, v in self.feature_tensors(split).items()}
        return (self._moved(f"{split}/items", items), self._moved(f"{split}/targets", targets), features,
                self._moved(f"{split}/times", self.batch_times(split)))

    def _moved(self, key: str, tensor: torch.Tensor | None) -> torch.Tensor | None:
        """`tensor` on `device` (moved once, kept for every epoch's loaders under `key`); as is without one."""
        if tensor is None or self.device is None:
            return tensor
        if key not in self._on_device:
            self._on_device[key] = tensor.to(self.device)
        return self._on_device[key]

    def train_dataloader(self) -> SessionLoader | StreamingLoader:
        if self.streaming:
            return self._streaming_loader()
        items, _, features, times = self._resident("train")
        ranks = ranks_of(self.trainer)
        return SessionLoader(
            items, features=features, times=times, batch_size=self.batch_size, shuffle=True,
            shuffle_chunk=self.shuffle_chunk, bucket_batches=self.bucket_batches, drop_last=items.shape[0] // ranks.get("world_size", 1) > self.batch_size,
            pin_memory=self.pin_memory, seed=self.seed, **ranks,
        )

    def _streaming_loader(self) -> StreamingLoader:
        directory, manifest = self.prepared
        files = split_files(directory, manifest, "train")
        times = self._wants_times() and frame.TIMES in pq.read_schema(files[0]).names
        if self.times and not times:
            raise ValueError(f"{files[0]}: times=True, but the sessions have no {frame.TIMES!r} column; set --data.times null")
        return StreamingLoader(
            files, self.vocab, self.max_length, self.batch_size, self.shuffle_buffer or 65_536, side=self.side,
            times=times, augment_reversed=self.augment_reversed, train_prefixes=self.train_prefixes,
            pin_memory=self.pin_memory, seed=self.seed, **ranks_of(self.trainer),
        )

    def _eval_loader(self, split: str) -> SessionLoader:
        items, targets, features, times = self._resident(split)
        return SessionLoader(
            items, targets, features=features, times=times, batch_size=self.eval_batch_size,
            pin_memory=self.pin_memory, **ranks_of(self.trainer),
        )

    def val_dataloader(self) -> SessionLoader:
        return self._eval_loader("valid")

    def test_dataloader(self) -> SessionLoader:
        return self._eval_loader("test")

    def predict_dataloader(self) -> ScoringStream:
        if self.predict_path is None:
            raise ValueError("set --data.predict_path to the sessions file to score")
        self.scoring_stream = ScoringStream(
            self.predict_path, self.vocab, self.predict_schema, self.max_length, self.eval_batch_size, side=self.side,
            times=self._wants_times(), **ranks_of(self.trainer), schema_flag="--data.predict_schema",
        )
        if self._task_reads("needs_times") and not self.scoring_stream.times:
            why = "--data.times false" if self.times is False else self.scoring_stream.no_times
            raise ValueError(f"{self.predict_path}: the model was trained with event times and these sessions have none "
                             f"({why}); give them their time column (--data.predict_schema.timestamp) and set "
                             "--data.times null")
        self.scoring_stream.check_known()
        return self.scoring_stream

    def decode(self, ids: torch.Tensor) -> pa.Array:
        """Model ids -> raw item ids (flat)."""
        return self.vocab.decode(ids.detach().cpu().numpy())

