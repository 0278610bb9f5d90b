"""`CandidateFeatures`: the ranker's view of each (session, candidate) pair.

Groups (each can be switched off, for ablations):

- ``retrievers``: every retriever's score of every candidate (not only of the ones it
  retrieved), its reciprocal rank in that retriever's list (0 = not retrieved) and how many
  retrievers returned it;
- ``popularity``: the item's training count and its count in the most recent part of training,
  both log-normalised (`LogNormalize`, fitted on the ranker's rows);
- ``session``: repeat behaviour: how often the candidate occurs in the session, 1 / (1 +
  its distance from the end) (0 if absent), whether it is the last item;
- ``covisitation``: co-visitation weight of the candidate with the last item and with the last
  three items (needs a `CoVisitation` retriever);
- ``context``: session length and the share of distinct items;
- ``time``: the session's duration and the hour and weekday of its last event (`CyclicTime`), both
  from the event times (`RequestSessions.times`), never from the time the session is served at
  (`RequestSessions.now`, which only the allow/deny windows read): the same session gets the same
  features whenever and wherever it is scored. Built when the ranker's rows carry times; a ranker
  fitted with them refuses sessions without;
- ``encodings``: out-of-fold target encoding of the candidate item (`TargetEncoding`, folded by
  the session each row was cut from, so that the prefixes of one session share a fold) and its
  count among the ranker's candidate rows (`CountEncoding`);
- ``ids``: sparse ids for the DLRM tables: the candidate, the last item, and their hashed cross
  (`HashedCross`).

The feature-engineering ops are fitted on the ranker's training rows only (`fit`) and saved with
the pipeline: the constructor arguments are the config (`Configurable`), the training counts,
the fitted ops (with their config: which ops exist depends on the data) and the feature names
are the state (`state_dict`). Raw columns and labels are given either as (B, K) grids or as (M,)
columns over the filled slots only (row-major, M = ``candidates.valid.sum()``), the compact form
the ranker's rows are kept in. `fit` fits the ops on such rows and returns the outputs whose
training values differ from `transform`'s (the out-of-fold target encoding), (M,) each; handed
back to `transform` (``fitted``) for any subset of those rows, they give exactly the features
`fit_transform` gives, so the training rows' features can be built a few at a time. Shape
letters: B sessions, L positions, K candidates, F dense features, M filled slots. The raw columns and the features are built on the candidates' device;
the fitted ops run on the host (numpy), their outputs are moved back.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from sessrec.data.vocab import NUM_SPECIAL, PAD
from sessrec.features import (
    CountEncoding,
    CyclicTime,
    FeatureOp,
    FeaturePipeline,
    HashedCross,
    LogNormalize,
    TargetEncoding,
)
from sessrec.pipeline.candidates import Candidates, RequestSessions
from sessrec.pipeline.retrieval.retriever import Retriever
from sessrec.saved.registry import Configurable, instantiate

GROUPS = ("retrievers", "popularity", "session", "covisitation", "context", "time", "encodings", "ids")
DURATION = "session_duration"  # the raw column that needs the event times
CYCLIC = ("time_hour_", "time_weekday_")  # the outputs of the CyclicTime op ``time``: of the last event time
PER_SESSION_ROWS = 2048  # candidate rows from which `transform` computes the last event's hour and weekday per session
ITEM_COLUMNS = ("item", "popularity", "recent_popularity")  # the columns of a frame row that its candidate alone decides


def group_of(column: str) -> str:
    """The feature group of a raw column (see the module docstring)."""
    if column in ("popularity", "recent_popularity"):
        return "popularity"
    if column.startswith("seen_") or column == "is_last":
        return "session"
    if column.startswith("covis_"):
        return "covisitation"
    if column == DURATION:
        return "time"
    if column.startswith("session_"):
        return "context"
    return "retrievers"  # <name>_score, <name>_rrank, sources


@dataclass
class RankingInputs:
    """What a scorer reads: dense (B, K, F) float32 features, sparse (B, K) ids by name, valid (B, K),
    `groups` (B,) int64, the session each row was cut from (None when unknown: every row its own),
    which a scorer's held-out rows for early stopping are split by, and the `cardinality` of each
    sparse feature that has a known range (its ids lie in ``[0, n)``)."""

    dense: torch.Tensor
    sparse: dict[str, torch.Tensor]
    valid: torch.Tensor
    names: list[str]
    groups: torch.Tensor | None = None
    cardinality: dict[str, int] = field(default_factory=dict)


def _slots(values: torch.Tensor | np.ndarray, valid: torch.Tensor) -> torch.Tensor:
    """(M,) values of the filled slots: a (B, K) grid masked by `valid`, or (M,) values as they are."""
    values = values if isinstance(values, torch.Tensor) else torch.from_numpy(np.asarray(values))
    if values.dim() == 1:
        if values.shape[0] != int(valid.sum()):
            raise ValueError(f"a column over the filled slots has {values.shape[0]} values for {int(valid.sum())} slots")
        return values
    return values[valid]


def _seen(items: torch.Tensor, cand: torch.Tensor, ordered: torch.Tensor, where: torch.Tensor) -> dict[str, torch.Tensor]:
    """The ``session`` group's repeat columns (B, K) of candidates `cand` in sessions `items` (B, L), whose rows
    sorted are `ordered` at positions `where`: how often the candidate occurs, 1 / (1 + its distance from the end),
    the sum of its positions' closeness to the end (position / L); 0 where absent.

    A candidate's comparison with its session's L positions is that of any position holding the same item, so each
    column is reduced over the (B, L, L) comparisons of the sessions with themselves, as over (B, K, L) candidates
    (the same rows, summed in the same order: the same floats), and gathered at a position of the candidate."""
    b, width = items.shape
    k = cand.shape[1]
    at = torch.searchsorted(ordered, cand).clamp_(max=width - 1)
    found = ordered.gather(1, at) == cand
    at = where.gather(1, at)  # (B, K) a position holding the candidate (where found)
    eq = items.unsqueeze(1) == items.unsqueeze(2)  # (B, L, L): row p, the session's positions holding item p
    position, closeness = _positions(width, items.device)
    # whole numbers below 2^24 throughout: the count, the last position and 1 + the distance are exact in float32
    last = (eq * position).amax(dim=2)  # the latest position holding the item: width = the last event
    stats = torch.stack([eq.sum(dim=2, dtype=torch.float32), (width + 1.0 - last).reciprocal(), (eq * closeness).sum(dim=2)])
    seen = torch.where(found, stats.gather(2, at.expand(3, b, k)), 0.0)  # (3, B, K)
    return dict(zip(("seen_count", "seen_recency", "seen_weight"), seen.unbind(0)))


@functools.lru_cache(maxsize=16)
def _positions(width: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(L,) float32 positions 1 .. L of a session of `width` L, and their closeness to its end, position / L (the
    last one 1), on `device`: the same for every request."""
    with torch.inference_mode(False):
        position = torch.arange(1, width + 1, device=device)
        return position.float(), position.float() / width


class CandidateFeatures(Configurable):
    """Build the ranking features of a candidate matrix.

    Args:
        groups: feature groups to build (see the module docstring); None: every group the ranker's rows can
            give (``covisitation`` needs a retriever with co-visitation weights, ``time`` rows with event
            times). A group listed here that the rows cannot give is refused at `fit`.
        recent_fraction: the most recent fraction of training sessions counted for recent popularity.
        cross_buckets: buckets of the hashed (last item, candidate) cross.
        target_folds: folds of the out-of-fold target encoding.
    """

    def __init__(
        self,
        groups: list[str] | None = None,
        recent_fraction: float = 0.1,
        cross_buckets: int = 1 << 18,
        target_folds: int = 5,
    ) -> None:
        self.listed = groups is not None  # groups given: each one must be built
        groups = list(GROUPS) if groups is None else groups
        unknown = sorted(set(groups) - set(GROUPS))
        if unknown:
            raise ValueError(f"unknown feature groups {unknown}; known: {list(GROUPS)}")
        if not 0 < recent_fraction <= 1:
            raise ValueError(f"recent_fraction must be in (0, 1], got {recent_fraction}")
        self.groups, self.recent_fraction = list(groups), recent_fraction
        self.cross_buckets, self.target_folds = cross_buckets, target_folds
        self.popularity: np.ndarray | None = None  # (V, 2) training count, recent count
        self.ops: FeaturePipeline | None = None
        self.names: list[str] | None = None
        self._tables: tuple[Any, Any, dict[str, np.ndarray]] = (None, None, {})  # (ops, popularity, their `item_tables`)
        self._order: tuple[Any, torch.Tensor | None] = (None, None)  # `_rows`' last (order, names, device) and rows
        self._time_names: tuple[list[str] | None, list[str]] = (None, [])  # `time_names` of these `names`

    # -- statistics of the training sessions ----------------------------------------------------
    def fit_statistics(self, sessions: np.ndarray | torch.Tensor, num_items: int) -> CandidateFeatures:
        """Item counts from (N, L) training sessions in time order (the last rows are the most recent)."""
        sessions = np.asarray(sessions.numpy() if isinstance(sessions, torch.Tensor) else sessions)
        recent = sessions[int(len(sessions) * (1 - self.recent_fraction)) :]
        count = lambda s: np.bincount(s[s >= NUM_SPECIAL].ravel(), minlength=num_items)[:num_items]  # noqa: E731
        self.popularity = np.stack([count(sessions), count(recent)], axis=1).astype(np.float64)
        return self

    # -- raw columns ----------------------------------------------------------------------------
    def raw(self, sessions: RequestSessions, candidates: Candidates, retrievers: dict[str, Retriever],
            groups: Collection[str] | None = None) -> dict[str, torch.Tensor]:
        """(B, K) raw columns of every enabled group (of `groups` only, when given), before the fitted ops
        (computed batch by batch)."""
        groups = self.groups if groups is None else [group for group in self.groups if group in groups]
        items, cand = sessions.items, candidates.items
        b, k = cand.shape
        device = cand.device
        cols: dict[str, torch.Tensor] = {}
        last = items[:, -1:].expand(b, k)
        if "retrievers" in groups:
            zeros = torch.zeros(b, k, device=device)
            for name, retriever in retrievers.items():
                cols[f"{name}_score"] = retriever.score(sessions, cand)
            if retrievers:  # every retriever's reciprocal ranks at once
                rank = torch.stack([candidates.features.get(f"{name}_rank", zeros) for name in retrievers])  # (R, B, K)
                rrank = torch.where(rank > 0, rank.clamp(min=1).reciprocal(), 0.0)
                cols.update({f"{name}_rrank": each for name, each in zip(retrievers, rrank)})
            cols["sources"] = candidates.features.get("sources", zeros)
        if "popularity" in groups:
            if self.popularity is None:
                raise RuntimeError("CandidateFeatures: call fit_statistics(training sessions) first")
            pop = torch.from_numpy(self.popularity).to(device)[cand.clamp(max=len(self.popularity) - 1)]  # (B, K, 2)
            cols["popularity"], cols["recent_popularity"] = pop[..., 0], pop[..., 1]
        ordered = where = None  # each session's items sorted, and their positions: read by two groups
        if "session" in groups or "context" in groups:
            ordered, where = torch.sort(items, dim=1)
        if "session" in groups:
            cols.update(_seen(items, cand, ordered, where))
            cols["is_last"] = (cand == last).float()
        if "covisitation" in groups:
            covis = next((r for r in retrievers.values() if hasattr(r, "anchored_weights")), None)
            if covis is not None:
                back = min(3, items.shape[1])  # the last three items, not rows: one lookup for all of them
                weights = covis.anchored_weights(items[:, -back:].flip(1), cand)  # (B, back, K): last item first
                cols["covis_last"] = weights[:, 0]
                # sum_i 0.5^i W[item i back, candidate], added in that order; a weight times a power of two is exact
                # (the weights are no subnormals), so each add's `alpha` gives the rounding of a product added
                total = weights[:, 0].clone()
                for i in range(1, back):
                    total.add_(weights[:, i], alpha=0.5**i)
                cols["covis_last3"] = total
        real = items != PAD
        if "context" in groups:
            length = real.sum(dim=1, keepdim=True).float()
            # `ordered`: padding first; a row without any has one change fewer
            distinct = ((ordered.diff(dim=1) != 0).sum(dim=1, keepdim=True) + (ordered[:, :1] != PAD)).float()
            cols["session_length"] = torch.log1p(length).expand(b, k)
            cols["session_distinct"] = (distinct / length.clamp(min=1)).expand(b, k)
        if "time" in groups and sessions.times is not None:
            first = torch.where(real, sessions.times, torch.full_like(sessions.times, float("inf"))).amin(dim=1)
            span = (sessions.times[:, -1] - first).clamp(min=0)
            cols[DURATION] = torch.log1p(span).float().unsqueeze(1).expand(b, k)
        return cols

    def _frame(
        self, sessions: RequestSessions, candidates: Candidates, raw: dict[str, torch.Tensor], labels: torch.Tensor | None,
        groups: torch.Tensor | None = None, use_time: bool = False,
    ) -> dict[str, np.ndarray]:
        """One row per valid candidate: the columns the ops read (``session``: `groups`, else the row;
        ``timestamp``: the session's last event time with `use_time`, when the sessions carry times)."""
        valid = candidates.valid.cpu().numpy()
        b = valid.shape[0]
        if groups is not None and groups.shape != (b,):
            raise ValueError(f"groups has shape {tuple(groups.shape)}, expected ({b},): one session per row")
        row = np.nonzero(valid)[0]  # (M,) the row of each filled slot, row-major like `valid`
        per_row = lambda values: values.cpu().numpy()[row]  # noqa: E731 - (B,) -> (M,)
        frame = {
            "item": candidates.items.cpu().numpy()[valid],
            "last_item": per_row(sessions.items[:, -1]),
            "session": row if groups is None else per_row(groups.long()),
        }
        if labels is not None:
            frame["label"] = _slots(labels, candidates.valid).double().cpu().numpy()
        for name in ("popularity", "recent_popularity"):
            if name in raw:
                frame[name] = _slots(raw[name], candidates.valid).double().cpu().numpy()
        if use_time and sessions.times is not None:
            frame["timestamp"] = per_row(sessions.times[:, -1].double())  # right-aligned: the last event
        return frame

    def _ops(self, has_time: bool) -> FeaturePipeline:
        ops: dict[str, Any] = {}
        if "popularity" in self.groups:
            ops["popularity_log"] = LogNormalize("popularity")
            ops["recent_popularity_log"] = LogNormalize("recent_popularity")
        if "time" in self.groups and has_time:
            ops["time"] = CyclicTime("timestamp")
        if "encodings" in self.groups:
            ops["item_target"] = TargetEncoding("item", "label", fold_by="session", n_folds=self.target_folds)
            ops["item_candidate_count"] = CountEncoding("item")
        if "ids" in self.groups:
            ops["cross"] = HashedCross(["last_item", "item"], self.cross_buckets)
        return FeaturePipeline(ops)

    # -- the verbs ------------------------------------------------------------------------------
    def fit(
        self, sessions: RequestSessions, candidates: Candidates, raw: dict[str, torch.Tensor], labels: torch.Tensor,
        groups: torch.Tensor | None = None,
    ) -> dict[str, np.ndarray]:
        """Fit the ops on these (training) rows, one frame row per filled slot; set the feature `names`.

        Args:
            raw: `raw` columns of these candidates (computed in batches by the caller), (B, K) or (M,).
            labels: 1 where the candidate is the session's next item, (B, K) or (M,).
            groups: (B,) the session each row was cut from (the target encoding's folds); None:
                every row is its own session.

        Returns:
            the outputs that differ from what `transform` gives these rows (the out-of-fold target
            encoding), (M,) float32 each: hand them to `transform` (``fitted``) to build these rows'
            features a few at a time.
        """
        fitted, raw, _ = self._fit(sessions, candidates, raw, labels, groups)
        self.names = self._names(raw, fitted)
        return {name: np.asarray(fitted[name], dtype=np.float32) for name in self._out_of_fold()}

    def fit_transform(
        self, sessions: RequestSessions, candidates: Candidates, raw: dict[str, torch.Tensor], labels: torch.Tensor,
        groups: torch.Tensor | None = None,
    ) -> RankingInputs:
        """`fit`, and return these rows' features (target encoding out of fold) as one (B, K, F) grid.

        Args: as `fit`; ``groups`` is also the returned `RankingInputs.groups`.
        """
        fitted, raw, frame = self._fit(sessions, candidates, raw, labels, groups)
        out = self._assemble(candidates, raw, fitted, frame)
        self.names = out.names
        out.groups = None if groups is None else groups.long()
        return out

    def _fit(
        self, sessions: RequestSessions, candidates: Candidates, raw: dict[str, torch.Tensor], labels: torch.Tensor,
        groups: torch.Tensor | None,
    ) -> tuple[dict[str, Any], dict[str, torch.Tensor], dict[str, np.ndarray]]:
        """The fitted ops' outputs on these rows, the raw columns of the enabled groups, and the frame."""
        raw = {name: value for name, value in raw.items() if group_of(name) in self.groups}
        frame = self._frame(sessions, candidates, raw, labels, groups, use_time="time" in self.groups)
        unbuilt = {group: why for group, why in (
            ("covisitation", "no retriever gives co-visitation weights (a pipeline recipe's covisitation: block)"
             if not any(group_of(name) == "covisitation" for name in raw) else None),
            ("time", "the ranker's rows carry no event times" if "timestamp" not in frame else None),
        ) if why is not None and group in self.groups}
        if unbuilt and self.listed:
            raise ValueError(f"features.groups lists {sorted(unbuilt)}, which the ranker's rows cannot give: "
                             + "; ".join(f"{group}: {why}" for group, why in unbuilt.items())
                             + "; leave them out (or the groups out: every group the rows can give)")
        self.groups = [group for group in self.groups if group not in unbuilt]
        self.ops = self._ops("timestamp" in frame)
        return (self.ops.fit_transform(frame) if self.ops.ops else {}), raw, frame

    def _out_of_fold(self) -> list[str]:
        """The outputs of the ops whose `fit_transform` is not `transform` of the fitted op (target encoding)."""
        return [name for name, op in self.ops.ops.items() if type(op).fit_transform is not FeatureOp.fit_transform]

    def transform(
        self, sessions: RequestSessions, candidates: Candidates, retrievers: dict[str, Retriever],
        raw: dict[str, torch.Tensor] | None = None, fitted: dict[str, np.ndarray | torch.Tensor] | None = None,
    ) -> RankingInputs:
        """Features of any candidates with the fitted ops.

        Args:
            raw: precomputed raw columns, (B, K) or (M,); None: computed here.
            fitted: (M,) outputs of ops to take instead of the ops' `transform`: the slice of `fit`'s
                out-of-fold outputs for these slots, when these are training rows.
        """
        if self.ops is None or self.names is None:
            raise RuntimeError("CandidateFeatures is not fitted: fit the pipeline's ranker first")
        tables = self.gathered_tables(candidates)
        if raw is None:  # the popularity counts are read only by the ops whose outputs the tables give
            raw = self.raw(sessions, candidates, retrievers, [g for g in self.groups if not (tables and g == "popularity")])
        missing = self._missing_times(sessions)
        if missing:
            raise ValueError(missing)
        # the time features are built when the ranker was fitted with them, whatever times the sessions carry
        raw = {n: v for n, v in raw.items() if group_of(n) in self.groups and (n != DURATION or DURATION in self.names)}
        frame = self._frame(sessions, candidates, raw, None, use_time="time" in self.ops.ops)
        timed = [name for name, op in self.ops.ops.items() if isinstance(op, CyclicTime) and op.timestamp == "timestamp"]
        timed = timed if "timestamp" in frame and len(frame["session"]) >= PER_SESSION_ROWS else []
        computed = self.ops.transform(frame, skip=list(tables) + timed) if self.ops.ops else {}
        computed.update({name: table[frame["item"]] for name, table in tables.items()})  # the candidate-decided outputs
        if timed:  # of each session's last event time: computed once for each session with a candidate, then spread
            has = np.zeros(len(sessions), dtype=bool)
            has[frame["session"]] = True
            last = sessions.times[:, -1].double().cpu().numpy()[has]
            at = (np.cumsum(has) - 1)[frame["session"]]  # (M,) each row's session among those with a candidate
            once = self.ops.transform({"timestamp": last}, skip=[name for name in self.ops.ops if name not in timed])
            computed.update({name: values[at] for name, values in once.items()})
        unknown = sorted(set(fitted or {}) - set(computed))
        if unknown:
            raise ValueError(f"fitted outputs {unknown} are not outputs of the feature ops {sorted(computed)}")
        computed.update(fitted or {})
        out = self._assemble(candidates, raw, computed, frame)
        if out.names != self.names:
            raise ValueError(f"features {out.names} differ from the fitted ones {self.names}")
        return out

    def gathered_tables(self, candidates: Candidates) -> dict[str, np.ndarray]:
        """The `item_tables` that `transform` gathers the outputs of `candidates` from: all of them when the
        candidates hold a filled slot and no id beyond the counted ones, else none (the ops run)."""
        items = candidates.items
        tables = self.item_tables()
        if not tables or not bool((items != PAD).any()) or int(items.max()) >= len(self.popularity):
            return {}
        return tables

    def item_tables(self) -> dict[str, np.ndarray]:
        """The outputs of the fitted ops that read only columns the candidate decides (`ITEM_COLUMNS`: the
        popularity logs, the item's target and count encodings) for every item id, (V,) each: computed once by
        the ops themselves on a frame of all V ids, so that `transform` gathers each candidate's value instead of
        running them (the same values: each row's output depends on that row alone). {} before `fit_statistics`."""
        if self._tables[0] is not self.ops or self._tables[1] is not self.popularity:
            tables: dict[str, np.ndarray] = {}
            names = [name for name, op in (self.ops.ops.items() if self.ops is not None else ())
                     if getattr(op, "column", None) in ITEM_COLUMNS]
            if names and self.popularity is not None and self.ops.fitted:
                v = len(self.popularity)
                frame = {"item": np.arange(v, dtype=np.int64), "popularity": self.popularity[:, 0],
                         "recent_popularity": self.popularity[:, 1]}
                tables = self.ops.transform(frame, skip=[name for name in self.ops.ops if name not in names])
            self._tables = (self.ops, self.popularity, tables)
        return self._tables[2]

    @property
    def time_names(self) -> list[str]:
        """The fitted features that read the sessions' event times: ``session_duration`` and the
        `CyclicTime` op's outputs (``time_hour_*``, ``time_weekday_*``, of the last event)."""
        if self._time_names[0] is not self.names:  # read several times a request: found once per `names`
            self._time_names = (self.names, [n for n in self.names or () if n == DURATION or n.startswith(CYCLIC)])
        return self._time_names[1]

    def _missing_times(self, sessions: RequestSessions) -> str | None:
        """What the fitted features need of the sessions' times and these sessions lack, in one line (None: nothing)."""
        if not self.time_names or sessions.times is not None:
            return None
        return (f"the ranker was fitted with time features: {self.time_names} need the event times "
                "(RequestSessions.times), which these sessions do not carry; give the sessions their times, or fit "
                "the ranker without the 'time' feature group")

    @staticmethod
    def _dense_columns(raw: dict[str, Any], fitted: dict[str, Any]) -> dict[str, Any]:
        """The dense columns by name: the raw ones the ops do not replace, and the ops' outputs but the cross's ids."""
        columns: dict[str, Any] = {n: v for n, v in raw.items() if n not in ("popularity", "recent_popularity")}
        columns.update({n: v for n, v in fitted.items() if n != "cross"})
        return columns

    def _names(self, raw: dict[str, Any], fitted: dict[str, Any]) -> list[str]:
        """The dense feature names, in their column order."""
        return sorted(self._dense_columns(raw, fitted))

    def _assemble(self, candidates: Candidates, raw: dict[str, torch.Tensor], fitted: dict[str, Any], frame: dict) -> RankingInputs:
        """The scorer's grids: the dense columns written into one (B, K, F) tensor, 0 at empty slots."""
        valid = candidates.valid
        b, k = valid.shape
        columns = self._dense_columns(raw, fitted)
        names = sorted(columns)
        # column-major: the (B, K) grids stacked into the first rows of one (F, B K) block, the empty slots zeroed at
        # once, the (M,) columns (the host's as one matrix) written at the filled slots of the other rows, and the
        # block transposed once, its rows taken in name order
        kinds: dict[int, list[str]] = {2: [], 1: [], 0: []}  # (B, K) grids, (M,) tensors, (M,) host columns
        for n in names:
            kinds[columns[n].dim() if isinstance(columns[n], torch.Tensor) else 0].append(n)
        grids, slots, host = kinds[2], kinds[1], kinds[0]
        m = int(valid.sum())
        for name in slots + host:
            if len(columns[name]) != m:
                raise ValueError(f"a column over the filled slots has {len(columns[name])} values for {m} slots")
        block = torch.empty(len(names), b * k, device=valid.device)
        if grids:
            f32 = lambda c: c if c.dtype == torch.float32 else c.to(torch.float32)  # noqa: E731
            torch.stack([f32(columns[n]) for n in grids], out=block[: len(grids)].view(len(grids), b, k))
        if m < b * k:
            block.masked_fill_(~valid.reshape(-1), 0.0)
        filled = valid.reshape(-1).nonzero().squeeze(1)  # (M,) the filled slots' positions in the flattened grid

        def grid(values: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
            out = torch.zeros(b * k, dtype=dtype, device=valid.device)
            out.index_copy_(0, filled, torch.as_tensor(np.asarray(values), device="cpu").to(valid.device, dtype))
            return out.view(b, k)

        if slots or host:
            parts = [torch.stack([columns[n].to(valid.device, torch.float32) for n in slots])] if slots else []
            if host:
                matrix = np.empty((len(host), m), dtype=np.float32)
                for i, name in enumerate(host):
                    matrix[i] = np.asarray(columns[name])
                parts.append(torch.from_numpy(matrix).to(valid.device))
            block[len(grids) :].index_copy_(1, filled, parts[0] if len(parts) == 1 else torch.cat(parts))
        order = grids + slots + host
        if order == names:
            dense = block.t().contiguous().view(b, k, len(names))
        else:
            dense = block.t().index_select(1, self._rows(order, names, valid.device)).view(b, k, len(names))
        sparse: dict[str, torch.Tensor] = {}
        cardinality: dict[str, int] = {}
        if "cross" in fitted:
            sparse["cross"] = grid(fitted["cross"], torch.long)
            cardinality["cross"] = self.cross_buckets
        if "ids" in self.groups:
            sparse["item"] = candidates.items.clone()
            sparse["last_item"] = grid(frame["last_item"], torch.long)
            if self.popularity is not None:  # counted over the vocabulary: one row per item id
                cardinality["item"] = cardinality["last_item"] = len(self.popularity)
        return RankingInputs(dense=dense, sparse=sparse, valid=valid, names=names, cardinality=cardinality)

    def _rows(self, order: list[str], names: list[str], device: torch.device) -> torch.Tensor:
        """(F,) the rows of a block whose columns come in `order` that give them in `names`' order (kept for the
        next call, whose columns come in the same order)."""
        key = (tuple(order), tuple(names), device)
        if self._order[0] != key:
            at = {name: i for i, name in enumerate(order)}
            self._order = (key, torch.tensor([at[n] for n in names], device=device))
        return self._order[1]

    # -- saving ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``names`` (the fitted feature names, or None), ``popularity`` (V, 2) when counted, and ``ops``
        (the fitted ops' `FeaturePipeline.state_dict`, with their config) once fitted."""
        state: dict[str, Any] = {"names": self.names}
        if self.popularity is not None:
            state["popularity"] = self.popularity
        if self.ops is not None and self.ops.fitted:
            state["ops"] = self.ops.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> CandidateFeatures:
        """Take a `state_dict`; the ops are rebuilt from the config it holds (registered classes only).

        Raises:
            ConfigError: the ops' config does not resolve (located under ``ops.config``).
        """
        names = state.get("names")
        self.names = None if names is None else [str(n) for n in names]
        popularity = state.get("popularity")
        self.popularity = None if popularity is None else np.asarray(popularity, dtype=np.float64)
        self.ops = None
        if "ops" in state:
            if not isinstance(state["ops"], Mapping):
                raise ValueError(f"the features' state: 'ops' must be a feature pipeline's state dict, got {type(state['ops']).__name__}")
            ops = instantiate(state["ops"].get("config"), expected=FeaturePipeline, source="state", key="ops.config")
            self.ops = ops.load_state_dict(state["ops"], "the features' state")
            self.item_tables()  # here, not in the first request
        return self
