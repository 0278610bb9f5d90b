"""`TrainingRows`: the rows that a table of training sessions gives, and their padded matrices.

The one definition of the training rows, shared by the in-memory training tensors
(`SessionDataModule.tensors("train")`) and the streamed training batches (`StreamingLoader`, which
applies it to one row group at a time; every row depends on its own session only, so the rows of a
table are the rows of its parts, in their order).

A table of n sessions gives, in this order: its n sessions; with ``augment_reversed``, a reversed copy
of each session with two or more events; with ``train_prefixes``, instead of each of those rows,
every prefix of it that ends at a non-virtual event after its first (shortest first). Every row keeps
its last ``max_length`` events, right-aligned (`frame.pad_sessions`).

Shape letters: N sessions, E events, R training rows, L padded length.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sessrec.data import frame


@dataclass(frozen=True)
class TrainingRows:
    """The training rows of N sessions as ``[start, end)`` ranges over their flat events.

    Attributes:
        starts: (R,) first event of each row in ``events(values)``.
        ends: (R,) one past its last event.
        session: (R,) the session (0 .. N - 1) each row comes from.
        mirror: (E,) the gather that reverses every session in place (`frame.mirror_index`) when
            reversed copies are added, else None.
        num_reversed: reversed copies among the rows (before prefixes).
    """

    starts: np.ndarray
    ends: np.ndarray
    session: np.ndarray
    mirror: np.ndarray | None
    num_reversed: int

    @classmethod
    def of(
        cls,
        offsets: np.ndarray,
        virtual: np.ndarray | None = None,
        augment_reversed: bool = False,
        train_prefixes: bool = False,
    ) -> TrainingRows:
        """The rows of sessions with event offsets `offsets` (N + 1,) and virtual flags `virtual` (E,)."""
        starts, ends, session = offsets[:-1], offsets[1:], np.arange(len(offsets) - 1)
        mirror, num_reversed = None, 0
        if augment_reversed:
            mirror = frame.mirror_index(offsets)
            rev = np.flatnonzero(np.diff(offsets) >= 2)  # a one-event session reversed is itself
            starts = np.concatenate([starts, offsets[:-1][rev] + offsets[-1]])
            ends = np.concatenate([ends, offsets[1:][rev] + offsets[-1]])
            session = np.concatenate([session, rev])
            num_reversed = len(rev)
        rows = cls(starts, ends, session, mirror, num_reversed)
        if not train_prefixes:
            return rows
        targetable = None if virtual is None else ~rows.events(virtual)
        starts, ends, parent = frame.prefix_rows(starts, ends, targetable)
        return cls(starts, ends, session[parent], mirror, num_reversed)

    def __len__(self) -> int:
        return len(self.starts)

    def events(self, values: np.ndarray) -> np.ndarray:
        """The flat event values (E,) the rows index: `values`, followed by their reversed copy when
        reversed copies are added."""
        return values if self.mirror is None else np.concatenate([values, values[self.mirror]])

    def pad(self, values: np.ndarray, max_length: int, dtype: np.dtype | None = None) -> np.ndarray:
        """(R, L = `max_length`) padded matrix of per-event `values` (E,) (`frame.pad_sessions`)."""
        return frame.pad_sessions(self.events(values), self.starts, self.ends, max_length, dtype)
