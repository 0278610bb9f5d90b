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

How a request is answered (`Part`): its sessions split between the versions, each part encoded and scored
by its own version, the answers merged back in the request's order (`merge_answers`), and each session's
version named in ``x-model-version`` (`version_header`).

Examples:
    >>> canary_sessions(["a", "b", 7, "7"], 0.5).tolist()
    [True, False, False, False]
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from sessrec.data.vocab import ItemVocab
from sessrec.pipeline.candidates import RequestSessions
from sessrec.pipeline.request import Request
from sessrec.saved.versions import VERSIONS
from sessrec.saved.versions import canary as canary_record
from sessrec.serving.batching import dumps
from sessrec.serving.recommender import Served, check_model_dir
from sessrec.serving.request import encode

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


def load_canary_version(live: Served, path: Path) -> Served:
    """The canary version in folder `path`, checked against the live version (`check_compatible`) and loaded."""
    if live.path is None:
        raise ValueError(f"{path}: a canary is served beside a live version read from a model directory")
    check_compatible(live.path, path)
    return Served.read(path)


def load_canary(model_dir: str | os.PathLike, live: Served) -> tuple[Served, float] | None:
    """The canary that `model_dir` records (`sessrec.saved.versions.canary`), loaded, with its share; None when none runs."""
    running = canary_record(model_dir)
    if running is None:
        return None
    return load_canary_version(live, Path(model_dir) / VERSIONS / running[0]), running[1]


@dataclass(frozen=True)
class Part:
    """The sessions of a request that one version answers: all of them, or its share when a canary runs.

    Args:
        served: the version that answers them.
        canary: it is the canary.
        request: the checked request, holding only these sessions.
        sessions: them encoded by the version's vocabulary.
        session_ids: their client ids, or None.
        index: their places in the request; None: every session of the request, in order.
    """

    served: Served
    canary: bool
    request: Request
    sessions: RequestSessions
    session_ids: list[str] | None
    index: np.ndarray | None

    @classmethod
    def encoded(cls, served: Served, canary: bool, request: Request, session_ids: list[str] | None,
                index: np.ndarray | None, arrival: float) -> Part:
        """The part of `request` at `index` (None: all of it), encoded by `served`'s vocabulary (`encode`)."""
        if index is not None:
            request, session_ids = subset(request, index), [session_ids[i] for i in index] if session_ids else None
        return cls(served, canary, request, encode(request, served.recommender, arrival), session_ids, index)


def subset(request: Request, index: np.ndarray) -> Request:
    """The request's sessions at `index`, with their times and request times."""
    times = None
    if request.times is not None:
        per_session = np.split(request.times, np.cumsum(request.lengths)[:-1])
        times = np.concatenate([per_session[i] for i in index])
    return replace(request, sessions=[request.sessions[i] for i in index],
                   now=None if request.now is None else request.now[index], times=times)


def merge_answers(parts: list[Part], answers: list[bytes]) -> bytes:
    """One answer, the sessions in the request's order, from the answers of its parts."""
    lists: list[Any] = [None] * sum(len(part.request.sessions) for part in parts)
    for part, answer in zip(parts, answers, strict=True):
        for i, found in zip(part.index, orjson.loads(answer)["recommendations"], strict=True):
            lists[i] = found
    return dumps({"recommendations": lists})


def version_header(parts: list[Part]) -> list[tuple[bytes, bytes]] | None:
    """``x-model-version``: the version that answered every session, else each session's, in order; none
    for an unversioned directory."""
    if len(parts) == 1:
        version = parts[0].served.version
        return None if version is None else [(b"x-model-version", version.encode())]
    each: list[str] = [""] * sum(len(part.request.sessions) for part in parts)
    for part in parts:
        for i in part.index:
            each[i] = str(part.served.version)
    return [(b"x-model-version", ",".join(each).encode())]
