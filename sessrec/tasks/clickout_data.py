"""`ClickoutDataModule`: trivago click-outs as ranking rows for `DLRMTask`, split by click-out time.

The rows, their vocabulary, tensors and loader are in `sessrec.datasets.clickout_rows`; this module adds the
Lightning data module that builds them from the raw log (the only Lightning import of the ranking data).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytorch_lightning as pl

from sessrec.data.loader import ranks_of, release_process_group_at_exit
from sessrec.data.periods import iso, to_seconds
from sessrec.data.readers import read_table
from sessrec.data.vocab import vocab_difference
from sessrec.datasets.clickout_rows import RankingLoader, RankingTensors, RankingVocab, encode_rows
from sessrec.datasets.clickouts import DENSE_FEATURES, SPLITS, build_clickout_rows, split_by_time
from sessrec.saved.checkpoint import as_tensors
from sessrec.saved.registry import Configurable, check_integers


class ClickoutDataModule(Configurable, pl.LightningDataModule):
    """trivago click-outs as ranking rows, split by time; see the module docstring for the features.

    Args:
        path: the trivago log (parquet or CSV with the challenge's columns).
        test_hours: click-outs in this final period of the log are the test set.
        valid_hours: the period before it, for validation.
        min_count: hotels and cities shown fewer times in training get the unseen id.
        batch_size: training rows per batch.
        eval_batch_size: about this many rows per evaluation batch (whole click-outs).
        session_scores: optional file of session-model scores (``session_id``, ``step``,
            ``item_id``, ``score``) used as a dense feature.
        vocab_path: load this fitted vocabulary instead of fitting one (a model directory's ``vocab.parquet``).
        seed: shuffling seed.
        end: the end of the log to use (ISO date/time, UTC, or epoch seconds; None: its last event):
            events after it are dropped, so the test period is the `test_hours` before it. Rolling
            it forward gives the successive windows of retraining.
        train_hours: train on the click-outs of this many hours before validation only (None: all).

    Examples:
        >>> dm = ClickoutDataModule("trivago_val_100k.parquet.snappy")  # doctest: +SKIP
        >>> dm.setup("fit"); batch = next(iter(dm.train_dataloader()))  # doctest: +SKIP
    """

    def __init__(
        self,
        path: str,
        test_hours: float = 8.0,
        valid_hours: float = 8.0,
        min_count: int = 2,
        batch_size: int = 4096,
        eval_batch_size: int = 16384,
        session_scores: str | None = None,
        vocab_path: str | None = None,
        seed: int = 0,
        end: str | float | None = None,
        train_hours: float | None = None,
    ) -> None:
        super().__init__()
        if test_hours <= 0 or valid_hours <= 0 or min_count < 1:
            raise ValueError(
                f"need test_hours > 0, valid_hours > 0 and min_count >= 1; got {test_hours}, {valid_hours}, {min_count}"
            )
        check_integers({"batch_size": batch_size, "eval_batch_size": eval_batch_size}, "ClickoutDataModule ")
        self.path, self.test_hours, self.valid_hours, self.min_count = path, test_hours, valid_hours, min_count
        self.batch_size, self.eval_batch_size, self.seed = batch_size, eval_batch_size, seed
        self.session_scores, self.vocab_path = session_scores, vocab_path
        self.end = None if end is None else to_seconds(end, "end")
        if train_hours is not None and train_hours <= 0:
            raise ValueError(f"train_hours must be positive or None, got {train_hours}")
        self.train_hours = train_hours
        self._rows: dict[str, pa.Table] | None = None
        self._end_of_log = 0.0  # the end of the test period, set with the rows
        self._vocab: RankingVocab | None = None
        self._tensors: dict[str, RankingTensors] = {}
        self.stats: dict[str, int] = {}

    def __str__(self) -> str:  # LightningDataModule's builds every loader
        return f"{type(self).__name__}(path={self.path!r})"

    @property
    def rows(self) -> dict[str, pa.Table]:
        """Raw rows of each split (``train``, ``valid``, ``test``)."""
        if self._rows is None:
            raw = read_table(Path(self.path))
            if self.end is not None:
                late = pc.greater_equal(raw.column("timestamp").cast(pa.float64()), self.end).fill_null(False)
                raw = raw.filter(pc.invert(late))  # an event of no time stays, for `build_clickout_rows` to refuse
            scores = None if self.session_scores is None else read_table(Path(self.session_scores))
            rows = build_clickout_rows(raw, str(self.path), scores, str(self.session_scores))
            end = self.end if self.end is not None else (pc.max(raw.column("timestamp")).as_py() if raw.num_rows else 0)
            self._end_of_log = float(end)
            split = split_by_time(rows, float(end), self.test_hours, self.valid_hours)
            if self.train_hours is not None:
                start = float(end) - (self.test_hours + self.valid_hours + self.train_hours) * 3600.0
                times = rows.column("timestamp").to_numpy(zero_copy_only=False).astype(np.float64)
                split = np.where((split == 0) & (times <= start), -1, split)  # before the training window
            self._rows = {name: rows.filter(pa.array(split == k)) for k, name in enumerate(SPLITS)}
            for name, part in self._rows.items():
                self.stats[f"{name}_rows"] = part.num_rows
                self.stats[f"{name}_clickouts"] = len(np.unique(part.column("query").to_numpy()))
        return self._rows

    def training_rows(self) -> pa.Table:
        """The training split's rows; refused when it is empty (evaluating a saved model's vocabulary needs none)."""
        if self.rows["train"].num_rows == 0:
            raise ValueError(self._no_clickouts("train"))
        return self.rows["train"]

    def train_end(self) -> float:
        """Time (epoch seconds) of the last training click-out: the end of what a model trained here has seen."""
        return float(pc.max(self.training_rows().column("timestamp").cast(pa.float64())).as_py())

    def check_unseen(self, split: str, train_end: float, model: str) -> None:
        """Refuse to evaluate `model`, trained on click-outs until `train_end` (epoch seconds), on a `split` that
        holds a click-out at or before it: one it may have learned."""
        first = pc.min(self.rows[split].column("timestamp").cast(pa.float64())).as_py()
        if first is not None and first <= train_end:
            raise ValueError(
                f"{self.path}: the {'test' if split == 'test' else 'validation'} split starts with a click-out at "
                f"{iso(first)}, not after the last one {model} trained on ({iso(train_end)}): it would be scored on "
                "click-outs it learned; evaluate it on a later period (set end, test_hours and valid_hours)"
            )

    @property
    def vocab(self) -> RankingVocab:
        if self._vocab is None:
            if self.vocab_path is not None:
                self._vocab = RankingVocab.load(self.vocab_path)
            else:
                self._vocab = RankingVocab.fit(self.training_rows(), self.min_count)
        return self._vocab

    def state_dict(self) -> dict[str, Any]:
        """The fitted vocabulary's state dict, as tensors; Lightning saves it in every checkpoint."""
        return {"vocab": as_tensors(self.vocab.state_dict())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take a checkpoint's vocabulary; refused when a feature's differs from the one in use (its ids, the values
        they stand for, or their counts: another log or window), as `SessionDataModule.load_state_dict` refuses."""
        vocab = RankingVocab.empty().load_state_dict(state["vocab"], "the checkpoint's ranking vocabulary")
        if self._vocab is not None:
            for name, saved in vocab.vocabs.items():
                if saved != self._vocab.vocabs[name]:
                    raise ValueError(
                        f"the checkpoint's ranking vocabulary differs from the one this data module uses ({self.path}): "
                        f"feature {name!r}: {vocab_difference(saved, self._vocab.vocabs[name])}; resume with the data "
                        "settings of the run it continues"
                    )
        self._vocab = vocab

    @property
    def cardinalities(self) -> dict[str, int]:
        """Table rows per sparse feature; linked into the model's config."""
        return self.vocab.cardinalities

    @property
    def num_dense(self) -> int:
        """Dense features per row; linked into the model's config."""
        return len(DENSE_FEATURES)

    def tensors(self, split: str) -> RankingTensors:
        """A split's rows encoded; with `vocab_path`, refused when none of its shown hotels is in that vocabulary (of
        one hotel or more): the vocabulary and the log do not belong together (every hotel would be read as unseen)."""
        if split not in self._tensors:
            rows = self.rows[split]
            hotels = self.vocab.vocabs["hotel"] if self.vocab_path is not None else None
            if hotels is not None and hotels.num_products and rows.num_rows:
                if hotels.encode(rows.column("hotel").combine_chunks()).num_unknown == rows.num_rows:
                    raise ValueError(
                        f"{self.path}: none of the {rows.num_rows} shown hotels of the {split} split is in the vocabulary "
                        f"of {self.vocab_path} ({hotels.num_products} hotels, e.g. {hotels.raw_ids[0].as_py()!r}; the "
                        f"log's first {rows.column('hotel')[0].as_py()!r}): the log and the vocabulary do not belong together"
                    )
            self._tensors[split] = encode_rows(rows, self.vocab)
        return self._tensors[split]

    def setup(self, stage: str | None = None) -> None:
        release_process_group_at_exit()
        wanted = {"fit": ("train", "valid"), "validate": ("valid",), "test": ("test",)}.get(stage or "", SPLITS)
        for split in wanted:
            if self.rows[split].num_rows == 0:
                raise ValueError(self._no_clickouts(split))
            self.tensors(split)

    def _no_clickouts(self, split: str) -> str:
        """Why `split` is empty: its period and that of the click-outs read."""
        if split == "train":
            return f"{self.path}: no click-outs before the last {self.test_hours + self.valid_hours} hours"
        stop = self._end_of_log - (self.test_hours * 3600.0 if split == "valid" else 0.0)
        start = stop - (self.test_hours if split == "test" else self.valid_hours) * 3600.0
        times = pa.concat_tables(self.rows.values()).column("timestamp").cast(pa.float64())
        read = (f"the log's click-outs run from {iso(pc.min(times).as_py())} to {iso(pc.max(times).as_py())}: set end, "
                "test_hours and valid_hours to periods of the log") if len(times) else "the log holds no click-out"
        return (f"{self.path}: no click-outs in the {'test' if split == 'test' else 'validation'} split (after {iso(start)}, "
                f"until {iso(stop)}); {read}")

    def train_dataloader(self) -> RankingLoader:
        return RankingLoader(self.tensors("train"), self.batch_size, shuffle=True, seed=self.seed, **ranks_of(self.trainer))

    def val_dataloader(self) -> RankingLoader:
        return RankingLoader(self.tensors("valid"), self.eval_batch_size, **ranks_of(self.trainer))

    def test_dataloader(self) -> RankingLoader:
        return RankingLoader(self.tensors("test"), self.eval_batch_size, **ranks_of(self.trainer))
