"""Trained session models loaded as the members of an `EnsembleTask` or the teachers of a distillation.

`load_member` takes a ``sessrec fit`` checkpoint or a model directory without running code from
it; `check_vocabulary` refuses a member trained on another vocabulary than the data's. A task
that trains a `SessionModel` is recognised by its ``NETWORK`` (`Pretrained.NETWORK`), so this
module sits below `sessrec.tasks.next_item`, which loads its teachers through it.
"""

from __future__ import annotations

import os
from pathlib import Path

from sessrec.data.vocab import ItemVocab
from sessrec.models.pretrained import load_pretrained
from sessrec.models.session_model import SessionModel
from sessrec.tasks.pretrained import load_checkpoint


def check_vocabulary(name: str, member: SessionModel, vocab: ItemVocab, found: str) -> None:
    """Refuse a loaded member (or teacher) trained on another vocabulary than the data module's `vocab`,
    whose fingerprint is `found` (compared by content: the same ids must be the same items)."""
    held = getattr(member, "vocab", None)
    if held is None:
        raise ValueError(f"{name}: holds no vocabulary, so its ids cannot be checked against the data's")
    if held.fingerprint() != found:
        raise ValueError(
            f"{name}: was trained on another vocabulary than the data module's ({len(held)} against {len(vocab)} "
            "ids, or the same ids for other items): use it with the data it was trained on"
        )


def load_member(path: str | os.PathLike) -> SessionModel:
    """The trained network of a ``sessrec fit`` checkpoint or a model directory, with its objective,
    vocabulary and inference settings attached; anything else is refused in one line naming `path`."""
    where = Path(path)
    if not where.exists():
        raise FileNotFoundError(f"{path}: no such checkpoint or model directory (ensemble member)")
    if where.is_dir():
        network = load_pretrained(where)
    else:
        task = load_checkpoint(where)
        if getattr(type(task), "NETWORK", None) is not SessionModel:  # NextItemTask (and its subclasses)
            raise ValueError(f"{path}: holds a {type(task).__name__}, not a trained session model (NextItemTask)")
        network = task.network()
    if not isinstance(network, SessionModel):
        raise TypeError(f"{path}: holds a {type(network).__name__}, not a session model")
    return network.eval()

