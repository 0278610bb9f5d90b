"""A canary: another version of the served directory answering a stable share of the sessions.

Which sessions (`canary_sessions`): those whose client session id (the request's ``session_ids``, as
text) hashes below the share. The hash is BLAKE2b of the id's UTF-8 bytes, 8 bytes read as an unsigned
integer, so a session goes to the same version in every request, in every worker process and after a
restart; the integer id ``7`` and the string ``"7"`` are one session. A session without an id is
always answered by the live version: ``sessrec monitor`` cannot join it with the events that followed,
so it could not count toward the comparison, and drawing its version at random would move the session
between versions from one request to the next.

Which versions may be compared (`check_compatible`): the canary answers the requests the live version
answers, so both must be of one kind (two pipelines or two session models) over one item vocabulary:
raw ids of the same type, and the same products in the same order, or one list the other's grown by
new items at its end (what ``sessrec retrain`` grows a vocabulary by). A model of another catalogue, or
whose vocabulary was rebuilt in another order, is refused; compare such a model offline with the
retraining gate. Each version encodes its own sessions with its own vocabulary.

Examples:
    >>> canary_sessions(["a", "b", 7, "7"], 0.5).tolist()
    [True, False, False, False]
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sessrec.data.vocab import ItemVocab
from sessrec.serving.recommender import check_model_dir

KINDS = {"pipeline.json": "a pipeline", "config.json": "a session model"}


def session_draws(session_ids: Sequence[str | int]) -> np.ndarray:
    """(B,) uint64 hash of each session id as text (BLAKE2b, 8 bytes, big-endian)."""
    digests = b"".join(hashlib.blake2b(str(s).encode(), digest_size=8).digest() for s in session_ids)
    return np.frombuffer(digests, dtype=">u8").astype(np.uint64)


def canary_sessions(session_ids: Sequence[str | int] | None, share: float, sessions: int | None = None) -> np.ndarray:
    """(B,) True for the sessions the canary answers: those whose id hashes below `share` of the hash
    range; all False without ids (`sessions` of them)."""
    if session_ids is None:
        return np.zeros(sessions or 0, dtype=bool)
    return session_draws(session_ids) < np.uint64(min(int(share * 2.0**64), 2**64 - 1))


def check_compatible(live: Path, canary: Path) -> None:
    """Refuse in one line a canary version that cannot answer the live version's requests (module docstring).

    Args:
        live: the live version's folder.
        canary: the canary version's folder.
    """
    kinds = [KINDS[check_model_dir(path).name] for path in (live, canary)]
    if kinds[0] != kinds[1]:
        raise ValueError(f"canary {canary.name} is {kinds[1]} and the live version {live.name} is {kinds[0]}: "
                         "a canary answers the live version's requests, so it must be of its kind")
    ids = [_products(ItemVocab.load(path / "vocab.parquet")) for path in (live, canary)]
    if ids[0].type != ids[1].type:
        raise ValueError(f"canary {canary.name} reads {ids[1].type} item ids and the live version {live.name} "
                         f"reads {ids[0].type}: they serve different catalogues")
    shorter, longer = sorted(ids, key=len)
    if not longer.slice(0, len(shorter)).equals(shorter):
        same = _first_difference(ids[0], ids[1])
        raise ValueError(f"canary {canary.name} ({len(ids[1])} products) and the live version {live.name} "
                         f"({len(ids[0])}) do not share one item vocabulary: product {same} differs "
                         f"({ids[0][same].as_py()!r} against {ids[1][same].as_py()!r}); a canary is a version "
                         "trained on from the live one, whose vocabulary grows only at its end")


def _products(vocab: ItemVocab) -> pa.Array:
    """The vocabulary's products (not its virtual keys), in model-id order."""
    return vocab.raw_ids.slice(0, len(vocab.raw_ids) - vocab.num_virtual)


def _first_difference(a: pa.Array, b: pa.Array) -> int:
    n = min(len(a), len(b))
    equal = np.asarray(pc.equal(a.slice(0, n), b.slice(0, n)).to_numpy(zero_copy_only=False))
    return int(np.argmin(equal))
