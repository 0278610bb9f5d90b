"""Trained session models loaded as the members of an `EnsembleTask` or the teachers of a distillation.

`load_member` takes the model directory that ``sessrec fit`` writes (a `SessionRecommender`) without
running code from it; `check_vocabulary` and `check_same_vocabulary` refuse members trained on
another vocabulary than the data's or each other's. This module sits below `sessrec.tasks.next_item`,
which loads its teachers through it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from sessrec.artifacts import SessionRecommender
from sessrec.data.vocab import ItemVocab


def check_vocabulary(name: str, held: ItemVocab, vocab: ItemVocab, found: str) -> None:
    """Refuse a member (or teacher) whose vocabulary `held` is not the data module's `vocab`, whose
    fingerprint is `found` (compared by content: the same ids must be the same items)."""
    if held.fingerprint() != found:
        raise ValueError(
            f"{name}: was trained on another vocabulary than the data module's ({len(held)} against {len(vocab)} "
            "ids, or the same ids for other items): use it with the data it was trained on"
        )


def check_same_vocabulary(members: Sequence[SessionRecommender], names: Sequence[str]) -> None:
    """Refuse members trained on different vocabularies (compared by content), naming the first that differs."""
    first = members[0].vocab.fingerprint()
    for name, member in zip(names[1:], members[1:]):
        found = member.vocab.fingerprint()
        if found != first:
            raise ValueError(
                f"{name}: was trained on another vocabulary than {names[0]} (fingerprint {found[:19]}... against "
                f"{first[:19]}...): the same id would be different items"
            )


def load_member(path: str | os.PathLike) -> SessionRecommender:
    """The trained session model of a model directory (``runs/<name>/model``); a checkpoint file or
    anything else is refused in one line naming `path`."""
    where = Path(path)
    if where.is_file():
        raise ValueError(
            f"{path}: a file, where an ensemble member or teacher is the model directory that sessrec fit writes "
            "(runs/<name>/model); checkpoints only resume fit"
        )
    if not where.exists():
        raise FileNotFoundError(f"{path}: no such model directory (sessrec fit writes runs/<name>/model)")
    return SessionRecommender.from_pretrained(where)
