"""What a model directory serves: raw-id sessions in, raw-id recommendations out.

`load_recommender` reads either saved thing a server serves: a pipeline directory
(``pipeline.json``, `Pipeline.save_pretrained`) or a session model's model directory
(``config.json``, which ``sessrec fit`` writes; `SessionRecommender.from_pretrained`, without
Lightning, served by `SessionModelService`), and returns a `Recommender`. Its work comes in three
steps, so that a server can check each request alone and score many at once:

- ``encode(request, arrival)``: one request, checked (`check_request`, the same rules and messages
  for the server and the Python entry points), raw ids -> `RequestSessions` of model ids, with its
  event times and the times its sessions are served at (`sessrec.pipeline.clock.request_now`: the
  request's ``now``, else each session's last event, else `arrival`); raises ValueError / TypeError
  for what needs the model to see (an id the vocabulary cannot read, an unknown id under
  ``on_unknown="error"``, no times for a ranker fitted with time features);
- ``recommend_batch(sessions, k)``: the top-`k` model ids and scores of encoded sessions, those of
  several requests joined by `join_sessions`;
- ``decode(recommendations)``: per session ``{"item_ids": [...], "scores": [...]}`` in raw ids.

``recommend(sessions, k, on_unknown, now, times)`` checks the request and runs the three in a row. A model directory that is
versioned (a ``CURRENT`` file naming one of ``versions/<name>/``) is read at its current version
(`sessrec.saved.versions.resolve`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from sessrec.artifacts import ClickRanker, artifact_class_of
from sessrec.artifacts.model_directory import EXPORT_DESCRIPTION, exported_not_saved
from sessrec.artifacts.session_recommender import SessionRecommender
from sessrec.data.vocab import ItemVocab, decode_dicts
from sessrec.models.session_model import top_recommendable
from sessrec.pipeline import clock
from sessrec.pipeline.candidates import Recommendations, RequestSessions
from sessrec.pipeline.pipeline import Pipeline
from sessrec.pipeline.request import Request, check_request, encode_raw
from sessrec.saved.directory import recorded_hash
from sessrec.saved.versions import resolve, version_of


class Recommender(Protocol):
    """What the server and batch scoring call (see the module docstring); `Pipeline` is one."""

    vocab: ItemVocab

    def encode(self, request: Request, arrival: float | None = None) -> RequestSessions: ...

    def recommend_batch(self, sessions: RequestSessions, k: int = 20) -> Recommendations: ...

    def decode(self, recs: Recommendations) -> list[dict[str, list]]: ...


class SessionModelService:
    """A trained session model over its vocabulary: the full catalogue scored, the top `k` returned.

    Args:
        recommender: the trained model with its objective, vocabulary and inference settings
            (`SessionRecommender.from_pretrained`); its network is put in eval mode.
    """

    def __init__(self, recommender: SessionRecommender) -> None:
        if not isinstance(recommender, SessionRecommender):
            raise TypeError(f"SessionModelService serves a SessionRecommender, got {type(recommender).__name__}")
        if recommender.model.side_info is not None:
            raise ValueError(
                "this session model reads side features, which a request of item ids does not carry; "
                "serve it through sessrec predict with an event file instead"
            )
        recommender.model.eval()
        self.recommender, self.model, self.vocab = recommender, recommender.model, recommender.vocab
        self.inference = recommender.inference
        self.max_length = self.inference.max_length

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike) -> SessionModelService:
        """The service of a model directory (`SessionRecommender.from_pretrained`)."""
        return cls(SessionRecommender.from_pretrained(directory))

    def encode(self, request: Request, arrival: float | None = None) -> RequestSessions:
        """A checked request's raw-id sessions -> `RequestSessions` of right-aligned model ids (the last
        `max_length` events), with their event times and request times as `Pipeline.encode` gives them;
        the network reads the event times where its encoder does (`HSTUEncoder`), never the request time; a
        request without them for a model trained with them is a ValueError."""
        items = encode_raw(self.vocab, request.sessions, self.max_length, request.on_unknown)
        if request.times is None and self.model.needs_times:
            raise ValueError("this model was trained with event times: give the request's times, per session a list of "
                             "seconds since the epoch, one per item id")
        stamps = None if request.times is None else clock.pad_times(request.times, request.lengths, items.shape[1])
        return RequestSessions(items, times=stamps, now=clock.request_now(request.now, len(items), stamps, arrival))

    @torch.no_grad()
    def recommend_batch(self, sessions: RequestSessions, k: int = 20) -> Recommendations:
        """The `k` best-scored products (B, k) of encoded sessions, best first; an encoder that reads
        event times (`HSTUEncoder`) gets the sessions' times where the request carries them."""
        features = self.model.batch_features(sessions)  # {EVENT_TIMES: times} for such an encoder, else None
        scores = self.recommender.scores(sessions.items, features)
        items, values = top_recommendable(scores, k, int(self.model.recommendable.sum()))
        return Recommendations(items, values.float())

    def decode(self, recs: Recommendations) -> list[dict[str, list]]:
        """Per session ``{"item_ids": [...], "scores": [...]}`` (raw ids, best first)."""
        return decode_dicts(self.vocab, recs.items, recs.scores)

    @torch.inference_mode()  # lists out: no tensor outlives the call
    def recommend(
        self,
        sessions: Sequence[Sequence[Any]],
        k: int = 20,
        on_unknown: str = "oov",
        now: float | Sequence[float] | None = None,
        times: Sequence[Sequence[float]] | None = None,
    ) -> list[dict[str, list]]:
        """Per session ``{"item_ids": [...], "scores": [...]}``: the `k` best-scored products, best first.

        The arguments are `Pipeline.recommend`'s, checked alike (`check_request`, the server's messages).
        """
        request = check_request(sessions, k, on_unknown, now, times)
        return self.decode(self.recommend_batch(self.encode(request), request.k))


def join_sessions(parts: Sequence[RequestSessions]) -> RequestSessions:
    """The encoded sessions of several requests as one batch, in order.

    Each part's ``items`` (and ``history``, its whole-session ids, where one part has it; ``times``,
    its event times, where every part has them) is left-padded to the widest part: the ids stay
    right-aligned and padding is id 0 (time 0), which every stage ignores. Each session keeps its
    request time (``now``). Event times given by only some of the requests are dropped; the server's
    `Batcher` never joins such requests, since a session model whose encoder reads times (HSTU) scores
    a session without them otherwise.

    Raises:
        ValueError: some parts have a request time and others none (a part built by hand without
            one: every ``encode`` sets it).
    """
    if not parts:
        raise ValueError("join_sessions needs at least one part")
    timed = [p.now is not None for p in parts]
    if any(timed) and not all(timed):
        raise ValueError("join_sessions: some parts have a request time (now) and others none; encode every request")
    if len(parts) == 1:
        return parts[0]
    items = _left_pad_cat([p.items for p in parts])
    times = _left_pad_cat([p.times for p in parts]) if all(p.times is not None for p in parts) else None
    now = torch.cat([p.now for p in parts]) if all(timed) else None
    history = None
    if any(p.history is not None for p in parts):
        history = _left_pad_cat([p.items if p.history is None else p.history for p in parts])
    return RequestSessions(items, times=times, now=now, history=history)


def _left_pad_cat(tensors: list[torch.Tensor]) -> torch.Tensor:
    width = max(t.shape[1] for t in tensors)
    return torch.cat([F.pad(t, (width - t.shape[1], 0)) for t in tensors])


def check_model_dir(directory: Path) -> Path:
    """The file that says what `directory` holds (``pipeline.json``, else ``config.json``);
    FileNotFoundError naming the directory when it holds neither."""
    for name in ("pipeline.json", "config.json"):
        if (directory / name).exists():
            return directory / name
    if (directory / EXPORT_DESCRIPTION).is_file():
        raise FileNotFoundError(exported_not_saved(directory))
    raise FileNotFoundError(
        f"{directory}: neither a saved pipeline (pipeline.json) nor a model directory (config.json); "
        "sessrec fit writes one beside the best checkpoint (runs/<name>/model)"
    )


def load_recommender(directory: str | os.PathLike) -> Pipeline | SessionModelService:
    """The recommender saved in `directory` (at its current version when it is versioned): a
    pipeline or a session model, by the file that describes it."""
    directory = resolve(directory)
    described = check_model_dir(directory)
    if described.name == "pipeline.json":
        return Pipeline.from_pretrained(directory)
    if is_click_ranker(described):
        raise ValueError(f"{described}: holds a click ranker (a DLRM that scores the candidates it is given), "
                         "which the server does not serve: it answers sessions with a session model's or a pipeline's "
                         "next items; score clicks with ClickRanker.from_pretrained")
    return SessionModelService.from_pretrained(directory)


def is_click_ranker(config: Path) -> bool:
    """Whether the model directory's `config` describes a click ranker (`artifact_class_of`), read without the
    checks of its parts that loading makes; a file that does not read as a JSON object is left to the loader's
    one-line refusal."""
    try:
        described = json.loads(config.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(described, dict) and "model" in described and artifact_class_of(described) is ClickRanker


@dataclass(frozen=True)
class Served:
    """A recommender and where it was read from.

    Args:
        recommender: the model.
        path: the directory it was read from (a version's folder in a versioned model directory).
        version: the version's name when `path` is a version's folder (`version_of`), else None.
        model_hash: the content hash that `path`'s description records (`sessrec.saved.directory.recorded_hash`):
            which model answered, whatever its version's name (the served log records it); None without a `path`.
    """

    recommender: Recommender
    path: Path | None = None
    version: str | None = None
    model_hash: str | None = None

    @classmethod
    def load(cls, model_dir: str | os.PathLike) -> Served:
        """The recommender of `model_dir` at its current version (`sessrec.saved.versions.resolve`)."""
        return cls.read(resolve(model_dir))

    @classmethod
    def read(cls, path: Path) -> Served:
        """The recommender saved in folder `path` (a directory without versions or a version's folder), its version
        and the content hash its description records (read before the folder is loaded, which checks it)."""
        model_hash = recorded_hash(path)
        return cls(load_recommender(path), path, version_of(path), model_hash)

    def describe(self) -> dict[str, Any]:
        """What `/health` reports: the recommender's kind, its vocabulary size where it has one, and the version."""
        info: dict[str, Any] = {"kind": type(self.recommender).__name__, "version": self.version}
        vocab = getattr(self.recommender, "vocab", None)
        if vocab is not None:
            info["vocabulary_size"] = len(vocab)
            info["items"] = int(getattr(vocab, "num_products", len(vocab)))
        return info
