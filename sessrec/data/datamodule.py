"""`SessionDataModule`: source -> vocabulary -> padded tensors -> columnar loaders.

The vocabulary is fitted on the training split only (or loaded from `vocab_path`, as written
beside a checkpoint). Evaluation splits are expanded into (prefix, next item) pairs by the
chosen protocol; the prefix never contains the target event.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import pyarrow as pa
import pytorch_lightning as pl
import torch

from sessrec.data import frame
from sessrec.data.loader import SessionLoader
from sessrec.data.schema import Schema
from sessrec.data.sources import SessionSource, SessionSplits, SyntheticSource
from sessrec.data.stream import ScoringStream
from sessrec.data.vocab import ItemVocab

Protocol = Literal["last", "all_prefixes"]


class SessionDataModule(pl.LightningDataModule):
    """Sessions for training, evaluation and batch scoring.

    Args:
        source: where sessions come from (`SRGNNSource`, `EventLogSource`, `SyntheticSource`, ...).
        max_length: most recent items a model sees per session.
        batch_size: training sessions per batch.
        eval_batch_size: sessions per evaluation/scoring batch.
        eval_protocol: ``last`` (predict each held-out session's last item) or ``all_prefixes``
            (every prefix predicts its next item: the SR-GNN protocol).
        min_item_count: items seen fewer times in training map to the OOV id.
        max_vocab_size: keep at most this many most frequent items.
        shuffle_chunk: shuffle contiguous chunks of this many sessions (1 = full row shuffle).
        pin_memory: pin batches for faster host-to-GPU copies.
        vocab_path: load this fitted vocabulary instead of fitting one (scoring with a checkpoint).
        predict_path: sessions file to score with ``sessrec predict``.
        predict_schema: column names of `predict_path`.
        seed: shuffling seed.
    """

    def __init__(
        self,
        source: SessionSource = SyntheticSource(),
        max_length: int = 20,
        batch_size: int = 256,
        eval_batch_size: int = 1024,
        eval_protocol: Protocol = "last",
        min_item_count: int = 1,
        max_vocab_size: int | None = None,
        shuffle_chunk: int = 1,
        pin_memory: bool = False,
        vocab_path: str | None = None,
        predict_path: str | None = None,
        predict_schema: Schema = Schema(timestamp=None),
        seed: int = 0,
    ) -> None:
        super().__init__()
        if eval_protocol not in ("last", "all_prefixes"):
            raise ValueError(f"eval_protocol must be 'last' or 'all_prefixes', got {eval_protocol!r}")
        if max_length < 2:
            raise ValueError(f"max_length must be >= 2, got {max_length}")
        self.source, self.max_length = source, max_length
        self.batch_size, self.eval_batch_size, self.eval_protocol = batch_size, eval_batch_size, eval_protocol
        self.min_item_count, self.max_vocab_size = min_item_count, max_vocab_size
        self.shuffle_chunk, self.pin_memory, self.seed = shuffle_chunk, pin_memory, seed
        self.vocab_path, self.predict_path, self.predict_schema = vocab_path, predict_path, predict_schema
        self._splits: SessionSplits | None = None
        self._vocab: ItemVocab | None = None
        self._tensors: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = {}
        self.stats: dict[str, int] = {}
        self.scoring_stream: ScoringStream | None = None

    # -- fitted state ---------------------------------------------------------------------
    @property
    def splits(self) -> SessionSplits:
        if self._splits is None:
            self._splits = self.source.load()
            self.stats.update(self._splits.summary())
        return self._splits

    @property
    def vocab(self) -> ItemVocab:
        if self._vocab is None:
            if self.vocab_path is not None:
                self._vocab = ItemVocab.load(self.vocab_path)
            else:
                values, _ = frame.list_offsets(self.splits.train.column(frame.ITEMS))
                self._vocab = ItemVocab.fit(values, self.min_item_count, self.max_vocab_size)
        return self._vocab

    @property
    def num_items(self) -> int:
        """Size of the score vector (items + padding + OOV); linked into the model's config."""
        return len(self.vocab)

    # -- tensors --------------------------------------------------------------------------
    def _encode(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        values, offsets = frame.list_offsets(getattr(self.splits, name).column(frame.ITEMS))
        encoded = self.vocab.encode(values)
        self.stats[f"{name}_unknown_items"] = encoded.num_unknown
        return encoded.ids, offsets

    def tensors(self, split: str) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(items (N, L), targets (N,) or None) of a split; training keeps whole sessions."""
        if split not in self._tensors:
            ids, offsets = self._encode(split)
            if split == "train":
                items = frame.pad_sessions(ids, offsets[:-1], offsets[1:], self.max_length)
                self._tensors[split] = (torch.from_numpy(items), None)
            else:
                session, target_at = frame.expand_prefixes(offsets, self.eval_protocol)
                items = frame.pad_sessions(ids, offsets[:-1][session], target_at, self.max_length)
                self._tensors[split] = (torch.from_numpy(items), torch.from_numpy(ids[target_at]))
                self.stats[f"{split}_pairs"] = len(target_at)
        return self._tensors[split]

    def setup(self, stage: str | None = None) -> None:
        wanted = {"fit": ["train", "valid"], "validate": ["valid"], "test": ["test"], None: ["train", "valid", "test"]}
        for split in wanted.get(stage, []):
            self.tensors(split)

    # -- loaders --------------------------------------------------------------------------
    def train_dataloader(self) -> SessionLoader:
        items, _ = self.tensors("train")
        return SessionLoader(
            items, batch_size=self.batch_size, shuffle=True, shuffle_chunk=self.shuffle_chunk,
            drop_last=items.shape[0] > self.batch_size, pin_memory=self.pin_memory, seed=self.seed,
        )

    def _eval_loader(self, split: str) -> SessionLoader:
        items, targets = self.tensors(split)
        return SessionLoader(items, targets, batch_size=self.eval_batch_size, pin_memory=self.pin_memory)

    def val_dataloader(self) -> SessionLoader:
        return self._eval_loader("valid")

    def test_dataloader(self) -> SessionLoader:
        return self._eval_loader("test")

    def predict_dataloader(self) -> ScoringStream:
        if self.predict_path is None:
            raise ValueError("set --data.predict_path to the sessions file to score")
        self.scoring_stream = ScoringStream(
            self.predict_path, self.vocab, self.predict_schema, self.max_length, self.eval_batch_size
        )
        return self.scoring_stream

    def decode(self, ids: torch.Tensor) -> pa.Array:
        """Model ids -> raw item ids (flat)."""
        return self.vocab.decode(ids.detach().cpu().numpy())
