"""`Pipeline`: retrieval -> filtering -> scoring -> ordering, one object offline and online.

The pipeline composes its stages and holds no ranking logic of its own: it encodes raw ids,
asks every retriever for its top-K, merges them (`merge`), applies the filters, builds the
features, scores and orders. ``sessrec recommend`` calls the same `recommend_batch` over chunks
of a file that `recommend` calls for one request.

`recommend` checks a request as the server does (`check_request`, the same messages). Time
(`sessrec.pipeline.clock`): the ranker's time features are built from the sessions' event times
(``times``, `RequestSessions.times`), never from a clock, and a ranker fitted with them refuses
sessions without them; the request time (``now``) only opens and closes the validity windows of the
allow and deny tables: the caller's, else each session's last event, else the wall clock at the call.

The pipeline runs on one device (`Pipeline.device`, by default its session model's): each batch
of sessions is moved there, the stages return their tensors there (those that compute on the
host, kNN, co-visitation and LightGBM, move their results), and `decode` brings the lists back.

Saved as one directory (`save_pretrained` / `from_pretrained`): ``pipeline.json``,
``vocab.parquet`` and one ``.safetensors`` file per stage. Every stage is described by its
constructor config (``config``: ``{"class_path", "init_args"}``, `sessrec.saved.registry.config_of`)
and holds its `state_dict` (model weights, indexes, co-visitation matrix, training sessions of
the kNN retrievers, fitted feature ops, the ranker): its arrays in the stage's ``.safetensors``
file under their path in the state (``weights/model.item_embedding.weight``), its plain values in
``pipeline.json`` (``state``). Loading builds each stage from its config, then calls its
``load_state_dict``. ``pipeline.json`` is written last and records the content hash of every
other file, the vocabulary's fingerprint and its own content hash, so a part from another run or
an edited ``pipeline.json`` is refused when loaded;
saving again into the same directory adds a version (`sessrec.saved.versions`). Loading builds
only registered classes (`sessrec.saved.registry`) and unpickles nothing; a pipeline of another
format version is refused in one line (fit it again with ``sessrec fit``).

Shape letters: B sessions, L positions, K candidates, k recommendations.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch
import torch.nn.functional as F

from sessrec.data.times import PLAUSIBLE_SECONDS
from sessrec.data.vocab import PAD, ItemVocab, decode_dicts, decode_lists
from sessrec.pipeline import clock
from sessrec.pipeline.candidate_features import CandidateFeatures, RankingInputs
from sessrec.pipeline.candidates import Candidates, Recommendations, RequestSessions, Retrieved, merge
from sessrec.pipeline.filters import ItemTableFilter, NonProductFilter, SeenItemsFilter
from sessrec.pipeline.ordering import Ordering
from sessrec.pipeline.request import Request, check_request, encode_raw
from sessrec.pipeline.retrieval.baseline_retriever import BaselineRetriever  # noqa: F401 - registered; pipeline.json names it
from sessrec.pipeline.retrieval.covisitation import CoVisitation  # noqa: F401 - registered; pipeline.json names it
from sessrec.pipeline.retrieval.retriever import Retriever
from sessrec.pipeline.retrieval.session_model_retriever import SessionModelRetriever
from sessrec.pipeline.scoring import DLRMScorer, GBDTScorer, Scorer  # noqa: F401 - registered; pipeline.json names it
from sessrec.saved import versions
from sessrec.saved.atomic import digest
from sessrec.saved.directory import (
    check_vocabulary,
    describe,
    read_description,
    vocabulary_record,
    write_description,
)
from sessrec.saved.registry import ConfigError, check_integers, check_saveable, config_of, instantiate

FORMAT, VERSION = "sessrec.pipeline", 4
HISTORY_LENGTH = 200  # events of a session kept for the filters of everything seen, by default
AnyFilter = SeenItemsFilter | NonProductFilter | ItemTableFilter
SEP = "/"  # joins the keys of a state's nested dicts into the names of its arrays
TIMES_CHECKED = "times_checked"  # `RequestSessions.cache` key: `Pipeline.check_times` held the batch's event times


class Pipeline:
    """The four stages over one vocabulary.

    Args:
        vocab: raw ids <-> model ids, shared by every stage.
        retrievers: name -> (retriever, K it contributes).
        max_length: most recent events of a session that the stages see.
        history_length: most recent events kept for the filters of everything seen (>= max_length, and >= the
            window of a `SeenItemsFilter`).
        max_candidates: merged candidates kept per session (by agreement of the retrievers).
        filters: applied in order after the merge (a `NonProductFilter` always runs first).
        features: the ranking features.
        scorer: the ranker; None scores by the first retriever's score alone.
        ordering: business rules of the final list.
        device: where the stages run: sessions are moved there, the session models' weights, the
            exact index and the ranker's network live there, and every result is on it. None: the
            device of the first `SessionModelRetriever`'s model, else the CPU.
    """

    def __init__(
        self,
        vocab: ItemVocab,
        retrievers: dict[str, tuple[Retriever, int]],
        max_length: int = 20,
        max_candidates: int = 200,
        history_length: int = HISTORY_LENGTH,
        filters: Sequence[AnyFilter] = (),
        features: CandidateFeatures | None = None,
        scorer: Scorer | None = None,
        ordering: Ordering | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        if not retrievers:
            raise ValueError("a pipeline needs at least one retriever")
        for name, (_, k) in retrievers.items():
            if not isinstance(name, str) or not name or any(c in name for c in "/\\\0"):
                raise ValueError(f"retriever name {name!r}: a retriever is saved as retriever-<name>.safetensors: give a "
                                 "non-empty name without '/' or '\\'")
            check_integers({"K": k}, f"retriever {name!r}: ")
        self.vocab, self.retrievers = vocab, dict(retrievers)
        for retriever, _ in self.retrievers.values():  # their top-K: products only (the virtual ids would be filtered)
            retriever.products = len(vocab) - vocab.num_virtual
        check_integers({"max_length": max_length, "max_candidates": max_candidates, "history_length": history_length})
        if history_length < max_length:
            raise ValueError(f"history_length ({history_length}) must be >= max_length ({max_length})")
        self.max_length, self.max_candidates, self.history_length = max_length, max_candidates, history_length
        for f in filters:
            if isinstance(f, SeenItemsFilter) and f.window is not None and f.window > history_length:
                raise ValueError(f"SeenItemsFilter window {f.window} is more than the {history_length} events the pipeline "
                                 f"keeps of a session (history_length): give history_length >= {f.window}")
        self.filters = [NonProductFilter(len(vocab), vocab.num_virtual), *filters]
        for f in self.filters:
            if hasattr(f, "bind"):
                f.bind(vocab)
        self.features = features if features is not None else CandidateFeatures()
        self.ordering = ordering if ordering is not None else Ordering()
        self.ordering.bind(vocab)
        self._scorer = scorer
        self.to(device if device is not None else model_device(self.retrievers))

    content_hash: str | None = None  # of the saved directory it was loaded from (None: never saved)

    @property
    def scorer(self) -> Scorer | None:
        """The ranker (None: the first retriever's score); a scorer set here moves to the pipeline's device."""
        return self._scorer

    @scorer.setter
    def scorer(self, scorer: Scorer | None) -> None:
        self._scorer = scorer if scorer is None else scorer.to(self.device)

    def to(self, device: torch.device | str) -> Pipeline:
        """Run on `device` from now on: the retrievers' and the ranker's tensors move there; returns self."""
        self.device = resolve_device(device)
        for retriever, _ in self.retrievers.values():
            retriever.to(self.device)
        self.scorer = self._scorer
        return self

    @property
    def stage_retrievers(self) -> dict[str, Retriever]:
        return {name: r for name, (r, _) in self.retrievers.items()}

    # -- stages 1 and 2 -------------------------------------------------------------------------
    @torch.no_grad()
    def candidates(self, sessions: RequestSessions) -> Candidates:
        """Merged, filtered candidates (B, max_candidates) on the pipeline's device; empty slots hold 0."""
        sessions = sessions.to(self.device)
        return self.select(sessions, self.retrieve(sessions))

    @torch.no_grad()
    def retrieve(self, sessions: RequestSessions) -> dict[str, Retrieved]:
        """Each retriever's top-K of `sessions` (on the pipeline's device), by name."""
        return {name: r.retrieve(sessions, k) for name, (r, k) in self.retrievers.items()}

    @torch.no_grad()
    def select(self, sessions: RequestSessions, found: Mapping[str, Retrieved]) -> Candidates:
        """The retrievers' lists (`retrieve`) merged, filtered and laid out (B, max_candidates); empty slots hold 0."""
        cands = merge(dict(found))
        for f in self.filters:
            cands = f.apply(sessions, cands)
        return cands.compact(self.max_candidates)

    # -- stages 3 and 4 -------------------------------------------------------------------------
    @torch.no_grad()
    def score(self, sessions: RequestSessions, cands: Candidates) -> Candidates:
        """The candidates with scores: the ranker's, or the first retriever's score without a ranker."""
        sessions = sessions.to(self.device)
        if self.scorer is None:
            name, (first, _) = next(iter(self.retrievers.items()))
            scores = first.score(sessions, cands.items).float()
        else:
            scores = self.scorer.score(self.ranking_inputs(sessions, cands))
        return Candidates(cands.items, cands.features, scores.masked_fill(~cands.valid, float("-inf")))

    @torch.no_grad()
    def ranking_inputs(self, sessions: RequestSessions, cands: Candidates) -> RankingInputs:
        """The ranker's features of the candidates (`CandidateFeatures.transform`), built once for every
        member of the ranker; sessions without event times are refused when the ranker reads them. The
        sessions keep their times whatever the ranker reads: a retriever whose score is a feature may read
        them (an HSTU trained with times), and a ranker fitted without time features builds none from them."""
        sessions = sessions.to(self.device)
        if self.time_features and sessions.times is None:
            raise ValueError(self.missing_times("RequestSessions.times"))
        if not sessions.cache.get(TIMES_CHECKED):  # sessions of `encode` were checked there
            self.check_times(sessions.items, sessions.times)
        return self.features.transform(sessions, cands, self.stage_retrievers)

    @property
    def time_features(self) -> list[str]:
        """The ranker's features that need each session's event times (``session_duration``, the
        ``time_*`` hour and weekday); [] when it reads none, or without a ranker."""
        return self.features.time_names if self.scorer is not None else []

    def check_times(self, items: torch.Tensor, times: torch.Tensor | None) -> None:
        """Refuse event times outside 1990..2100 (`PLAUSIBLE_SECONDS`) for a ranker that reads the hour and weekday
        of absolute times (its time features): times from another origin (seconds since a session's start) would
        give it hours and weekdays that never happened. (B, L) `times` beside (B, L) `items` (padding ignored)."""
        if not self.time_features or times is None:
            return
        real = times[items != PAD]
        if not len(real):
            return
        low, high = PLAUSIBLE_SECONDS
        lo, hi = float(real.min()), float(real.max())
        if lo < low or hi >= high:
            bad = lo if lo < low else hi
            raise ValueError(
                f"event time {bad:.0f} is not in 1990..2100 in seconds since the epoch: the pipeline's ranker reads the "
                f"hour and weekday of each session's times ({', '.join(self.time_features)}); give the events' times "
                "in seconds since the epoch"
            )

    @property
    def timed_retrievers(self) -> list[str]:
        """The retrievers whose session model was trained with event times (their ``needs_times``): they refuse
        sessions without them."""
        return [name for name, (r, _) in self.retrievers.items() if getattr(r, "needs_times", False)]

    def missing_times(self, field: str) -> str:
        """The one-line refusal of sessions without event times, naming the `field` that gives them."""
        if self.time_features:
            shown = ", ".join(self.time_features)
            return f"the pipeline's ranker was fitted with time features ({shown}): give every session's event times ({field})"
        shown = ", ".join(self.timed_retrievers)
        return f"the pipeline's retrievers {shown} were trained with event times: give every session's event times ({field})"

    @torch.no_grad()
    def recommend_batch(self, sessions: RequestSessions, k: int = 20) -> Recommendations:
        """Top-`k` model ids and scores (B, min(k, max_candidates)) of a batch of encoded sessions, on the
        pipeline's device: no more than the candidates are ever recommended."""
        sessions = sessions.to(self.device)
        cands = self.score(sessions, self.candidates(sessions))
        return self.ordering.order(sessions, cands, min(k, self.max_candidates))

    def wrap(self, items: torch.Tensor, times: torch.Tensor | None = None, now: torch.Tensor | None = None,
             name: Callable[[int], str] = "session {}".format) -> RequestSessions:
        """`RequestSessions` of right-aligned model ids of any width: the stages see the last `max_length`
        columns (left-padded to it), the filters of everything seen up to `history_length`.

        Args:
            items: (B, W) right-aligned model ids.
            times: (B, W) event times in seconds aligned with `items` (0 on padding), or None.
            now: (B,) request times in seconds. None: each session's last event time when `times`
                is given, else no time, so that every row of an allow/deny table holds: the
                caller's choice; `encode`, `recommend` and ``sessrec recommend`` always give one.
            name: how a refusal names row ``i``.

        Raises:
            ValueError: a session served at a time of another frame than an allow/deny table's windows
                (`ItemTableFilter.check_frame`).
        """
        items = items.long()
        width = items.shape[1]

        def window(t: torch.Tensor) -> torch.Tensor:
            return t[:, -self.max_length :] if width >= self.max_length else F.pad(t, (self.max_length - width, 0))

        if times is not None and times.shape != items.shape:
            raise ValueError(f"times has shape {tuple(times.shape)}, items {tuple(items.shape)}: give one time per item")
        sessions = RequestSessions(window(items), times=None if times is None else window(times.double()), now=now,
                                   history=items[:, -self.history_length :] if width > self.max_length else None)
        if sessions.now is not None:
            for table in self.filters:
                if isinstance(table, ItemTableFilter):
                    table.check_frame(sessions.now, name)
        return sessions

    def encode(self, request: Request, arrival: float | None = None) -> RequestSessions:
        """A checked request's raw-id sessions -> `RequestSessions` (right-aligned, the last `max_length`
        events), with their event times and the times they are served at (`clock.request_now`).

        Args:
            request: the request, checked (`check_request`).
            arrival: the clock's reading at the request, its ``now`` when it gives neither ``now``
                nor ``times``; None: `time.time()`.

        Raises:
            ValueError: an unknown id under ``on_unknown="error"``, or no ``times`` for a ranker
                fitted with time features or a retriever trained with event times.
            TypeError: ids the vocabulary cannot read (``"x"`` for an int64 vocabulary, mixed types).
        """
        items = encode_raw(self.vocab, request.sessions, self.history_length, request.on_unknown)
        stamps = None if request.times is None else clock.pad_times(request.times, request.lengths, items.shape[1])
        if stamps is None and (self.time_features or self.timed_retrievers):
            raise ValueError(self.missing_times("times: per session a list of seconds since the epoch, one per item id"))
        self.check_times(items, stamps)
        sessions = self.wrap(items, stamps, clock.request_now(request.now, len(items), stamps, arrival))
        if self.time_features:
            sessions.cache[TIMES_CHECKED] = True
        return sessions

    @torch.inference_mode()  # lists out: no tensor outlives the call
    def recommend(
        self,
        sessions: Sequence[Sequence[Any]],
        k: int = 20,
        on_unknown: str = "oov",
        now: float | Sequence[float] | None = None,
        times: Sequence[Sequence[float]] | None = None,
    ) -> list[dict[str, list]]:
        """Recommend for raw-id sessions (one request): per session ``{"item_ids": [...], "scores": [...]}``.

        Checked as the server checks a request (`check_request`), with the same messages.

        Args:
            sessions: each session's raw item ids, oldest first.
            k: recommendations per session.
            on_unknown: ``oov`` scores unknown ids as the out-of-vocabulary item; ``error`` refuses them.
            now: when the request is served, in seconds since the epoch (one for all sessions, or
                one per session): the allow/deny tables' validity windows hold at it, and nothing
                else reads it. None: each session's last event with `times`, else the wall clock at
                the call (``time.time()``).
            times: per session its events' times in seconds since the epoch, oldest first, one
                per item id: the ranker's time features (hour and weekday of the last event, session
                duration) are built from them, and a ranker fitted with them refuses a request without.

        Raises:
            ValueError: a request `check_request` refuses, or one `encode` refuses.
            TypeError: see `encode`.
        """
        request = check_request(sessions, k, on_unknown, now, times)
        return self.decode(self.recommend_batch(self.encode(request), request.k))

    def decode_lists(self, recs: Recommendations) -> tuple[pa.ListArray, pa.ListArray]:
        """(B,) lists of raw ids and of their float32 scores, best first; empty slots (id 0) dropped."""
        return decode_lists(self.vocab, recs.items, recs.scores)

    def decode(self, recs: Recommendations) -> list[dict[str, list]]:
        """Per session ``{"item_ids": [...], "scores": [...]}`` (raw ids, best first)."""
        return decode_dicts(self.vocab, recs.items, recs.scores)

    # -- saving ---------------------------------------------------------------------------------
    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        """Write the pipeline to `directory` (a new version of a saved one); returns the folder written.

        Every part is written under a temporary name and ``pipeline.json`` last, so a reader never
        sees half a pipeline.
        """
        from safetensors.numpy import save_file

        def write(tmp: Path) -> None:
            def stage(obj: Any, name: str) -> dict[str, Any]:
                plain, arrays = split_state(obj.state_dict())
                # np.require keeps a 0-d array 0-d (np.ascontiguousarray makes it (1,), which loads into no model)
                save_file({k: np.require(v, requirements="C") for k, v in arrays.items()}, str(tmp / f"{name}.safetensors"))
                return {"config": config_of(obj), "state": plain, "arrays": f"{name}.safetensors"}

            spec: dict[str, Any] = {"format": FORMAT, "version": VERSION, "max_length": self.max_length,
                                    "max_candidates": self.max_candidates, "history_length": self.history_length}
            spec["retrievers"] = [{"name": name, "k": k, **stage(r, f"retriever-{name}")}
                                  for name, (r, k) in self.retrievers.items()]
            # the NonProductFilter is rebuilt from the vocabulary
            spec["filters"] = [stage(f, f"filter-{i}") for i, f in enumerate(self.filters[1:])]
            spec["features"] = stage(self.features, "features")
            if self.scorer is not None:
                spec["scorer"] = stage(self.scorer, "scorer")
            spec["ordering"] = stage(self.ordering, "ordering")
            self.vocab.save(tmp / "vocab.parquet")
            spec["vocab"] = vocabulary_record(self.vocab)
            check_saveable(spec, str(Path(directory) / "pipeline.json"))
            parts = [p.name for p in tmp.iterdir() if p.name != "pipeline.json"]
            write_description(tmp, "pipeline.json", describe(tmp, spec, parts))

        return versions.write_directory(directory, write)

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, device: torch.device | str | None = None) -> Pipeline:
        """The pipeline a directory written by `save_pretrained` holds (its current version), on
        `device` (None: the CPU, where the saved weights load).

        Raises:
            ConfigError: a stage's config names a class that is not registered, or not of the
                stage's kind (one line naming ``pipeline.json`` and the key).
            ValueError: a part that does not belong (content hash, vocabulary), or a stage whose
                state does not load (one line naming ``pipeline.json`` and the stage).
        """
        directory = versions.resolve(directory)
        if not (directory / "pipeline.json").exists():
            raise FileNotFoundError(f"{directory}: not a saved pipeline (no pipeline.json); run sessrec fit on a pipeline recipe")
        spec = read_description(directory, "pipeline.json", FORMAT, VERSION, "pipeline",
                                "fit the pipeline again with sessrec fit --config <pipeline recipe>")
        vocab = ItemVocab.load(directory / "vocab.parquet")
        check_vocabulary(vocab, spec, directory / "vocab.parquet", what="pipeline")
        stages = _Stages(directory)
        retrievers = {}
        for i, r in enumerate(_entries(spec, "retrievers", stages.source)):
            retrievers[r["name"]] = (stages.load(Retriever, r, f"retrievers[{i}]"), int(r["k"]))
        filters = [stages.load(AnyFilter, f, f"filters[{i}]") for i, f in enumerate(_entries(spec, "filters", stages.source))]
        features = stages.load(CandidateFeatures, spec["features"], "features")
        scorer = stages.load(Scorer, spec["scorer"], "scorer") if "scorer" in spec else None
        ordering = stages.load(Ordering, spec["ordering"], "ordering")
        pipeline = cls(vocab, retrievers, spec["max_length"], spec["max_candidates"], spec["history_length"], filters,
                       features, scorer, ordering, device)
        pipeline.content_hash = digest(directory / "pipeline.json")  # the description records every part's hash
        return pipeline


class _Stages:
    """Builds the stages of one saved pipeline: each from its config, then `load_state_dict`."""

    def __init__(self, directory: Path) -> None:
        self.directory, self.source = directory, str(directory / "pipeline.json")

    def arrays(self, entry: Mapping[str, Any], key: str) -> dict[str, np.ndarray]:
        from safetensors.numpy import load_file

        name = entry.get("arrays")
        if not isinstance(name, str) or Path(name).name != name or not (self.directory / name).is_file():
            raise FileNotFoundError(f"{self.source}: {key}.arrays: {name!r} is not a file of the saved pipeline")
        return load_file(str(self.directory / name))

    def load(self, base: Any, entry: Any, key: str) -> Any:
        """The stage of `entry` (at `key` of ``pipeline.json``), a registered `base` class."""
        if not isinstance(entry, Mapping):
            raise ConfigError(self.source, key, f"expected a mapping that describes the stage, got {type(entry).__name__}")
        try:
            config, state = entry.get("config"), join_state(entry.get("state", {}), self.arrays(entry, key))
        except ValueError as err:
            raise ValueError(f"{self.source}: {key}: {err}") from None
        if not isinstance(state, dict):
            raise ConfigError(self.source, f"{key}.state", f"expected a mapping of the stage's state, got {type(state).__name__}")
        stage = instantiate(config, expected=base, source=self.source, key=f"{key}.config")
        try:
            return stage.load_state_dict(state)
        except ConfigError as err:
            raise err.within(self.source, f"{key}.state") from None
        except (KeyError, ValueError, TypeError, RuntimeError) as err:
            problem = " ".join(str(err).split()) or type(err).__name__
            raise ValueError(f"{self.source}: {key}: the saved state does not load into the {type(stage).__name__} ({problem})") from None


def _entries(spec: dict[str, Any], name: str, source: str) -> list[Any]:
    entries = spec.get(name)
    if not isinstance(entries, list):
        raise ConfigError(source, name, f"expected a list of stages, got {type(entries).__name__}")
    return entries


def split_state(state: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A state dict as (its plain values, its arrays by path): every numpy array leaves the nested
    dicts and is named by its keys joined with ``/``; what stays is JSON-able.

    Raises:
        ValueError: a key that is not a string or holds ``/``, an array inside a list, or a value
            that is neither an array nor JSON-able.
    """
    arrays: dict[str, np.ndarray] = {}

    def walk(node: Any, path: tuple[str, ...]) -> Any:
        if isinstance(node, np.ndarray):
            arrays[SEP.join(path)] = node
            return _ARRAY
        if isinstance(node, Mapping):
            out = {}
            for k, v in node.items():
                if not isinstance(k, str) or SEP in k or not k:
                    raise ValueError(f"state key {SEP.join((*path, str(k)))!r}: keys are non-empty strings without {SEP!r}")
                value = walk(v, (*path, k))
                if value is not _ARRAY:
                    out[k] = value
            return out
        if isinstance(node, (list, tuple)):
            items = [walk(v, (*path, str(i))) for i, v in enumerate(node)]
            if any(v is _ARRAY for v in items):
                raise ValueError(f"state key {SEP.join(path)!r}: arrays go in dicts, not lists")
            return items
        if isinstance(node, np.generic):
            return node.item()
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        raise ValueError(f"state key {SEP.join(path)!r}: a {type(node).__name__} is neither a numpy array nor a plain value")

    return walk(state, ()), arrays


_ARRAY = object()  # a value that `split_state` moved to the arrays


def join_state(plain: Any, arrays: Mapping[str, np.ndarray]) -> Any:
    """The state dict that `split_state` split: `arrays` put back at their paths in (a copy of) `plain`."""
    state = copy.deepcopy(plain)
    for name, value in arrays.items():
        *parents, last = name.split(SEP)
        node = state
        for part in parents:
            if not isinstance(node, dict):
                raise ValueError(f"array {name!r} has no place in the saved state")  # noqa: TRY004 - a file's content
            node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ValueError(f"array {name!r} has no place in the saved state")  # noqa: TRY004 - a file's content
        node[last] = value
    return state


def resolve_device(device: torch.device | str) -> torch.device:
    """`device` as tensors report it (``cuda`` -> ``cuda:0``, the current CUDA device)."""
    return torch.empty(0, device=device).device


def model_device(retrievers: Mapping[str, tuple[Retriever, int]]) -> torch.device:
    """The device of the first session model's weights among `retrievers`; the CPU without one."""
    for retriever, _ in retrievers.values():
        if isinstance(retriever, SessionModelRetriever):
            return retriever.device
    return torch.device("cpu")
