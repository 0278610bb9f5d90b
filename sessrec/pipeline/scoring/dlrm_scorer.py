"""`DLRMScorer`: the library's `DLRM` (embedding core + dot or DCNv2 interaction) as the ranker.

Dense inputs are the candidate features, each also taken relative to its session (minus the
session's best and mean candidate value: what a listwise ranker compares), then scaled with
statistics of the ranker's training rows: rank-Gauss (each feature through its empirical
quantiles to a standard normal, so heavy-tailed scores and counts are spread evenly) or plain
standardisation. A column with one value among those rows carries nothing and is left out of the
network's inputs: the differences of a feature that a session's candidates share (its length, the
hour of its last event) are 0 for every candidate. Sparse inputs are the candidate id, the last item (one shared item table) and
the hashed (last item, candidate) cross.

Id rows. Each table has row 0 for every id that the ranker's training rows do not hold at least
`min_count` times (an item or a cross it never saw, at fit and at score time) and one row per
kept id. The ids are looked up over the whole vocabulary (`RankingInputs.cardinality`: the
items of the data, the cross's hash buckets), so no unseen id shares a seen one's row. During
training each id is replaced by row 0 with probability `id_dropout`: row 0 learns what an unseen
id is worth, and the network cannot lean on the ids of the few thousand ranker sessions alone.

Training is listwise: a softmax over each session's candidates with the next item as the target
(the quantity MRR rewards), early-stopped on held-out sessions' MRR@20, the best epoch's
weights kept. The network runs on the valid slots only (no padded grid), and the tables get
sparse gradients updated by `torch.optim.SparseAdam`: each step touches the rows its batch looked
up, not the whole tables.

Shape letters: B sessions, K candidates, F dense features, G = F or 3F after the session-relative
columns, C of them kept (those that vary), Q quantiles, D embedding width, S kept ids of a table.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F

from sessrec.embeddings import FusedTables, TableConfig
from sessrec.embeddings.jagged import SparseFeatures
from sessrec.models.dlrm import DLRM
from sessrec.pipeline.candidate_features import RankingInputs
from sessrec.pipeline.scoring.rank_gauss import RankGauss
from sessrec.pipeline.scoring.scorer import (
    RankerRows,
    Scorer,
    check_dense,
    early_stopping_split,
    mrr_of,
    slot_positions,
    true_positions,
)
from sessrec.saved.registry import check_integers, check_numbers

TABLES = {"item": ("item", "last_item"), "cross": ("cross",)}  # table -> the sparse features looked up in it
QUANTILES = 256
SCALING_ROWS = 200_000  # candidate rows (of whole training sessions) the scaling is fitted on
PART_SESSIONS = 32  # sessions scaled and scored at once: 6,400 rows of 200 candidates, whose temporaries stay in the cache


class IdRows:
    """The rows of one embedding table: row 0 for every id not kept, rows 1..S for the kept ids (ascending).

    Args:
        kept: (S,) int64 ascending ids that have their own row.
        vocabulary: ids lie in ``[0, vocabulary)``; a larger id has not been kept either and gets row 0.

    Examples:
        >>> rows = IdRows(torch.tensor([3, 7]), vocabulary=10)
        >>> rows(torch.tensor([7, 3, 5, 0, 12])).tolist(), rows.size
        ([2, 1, 0, 0, 0], 3)
    """

    def __init__(self, kept: torch.Tensor, vocabulary: int) -> None:
        kept = kept.long().cpu()
        if len(kept) and (int(kept.min()) < 0 or int(kept.max()) >= vocabulary):
            raise ValueError(f"kept ids must lie in [0, {vocabulary}), got {int(kept.min())}..{int(kept.max())}")
        self.kept, self.vocabulary = kept, int(vocabulary)
        self.lookup = torch.zeros(self.vocabulary + 1, dtype=torch.long)  # the last entry: ids past the vocabulary
        self.lookup[kept] = torch.arange(1, len(kept) + 1)

    @classmethod
    def fit(cls, ids: torch.Tensor, vocabulary: int, min_count: int) -> IdRows:
        """Keep the ids that occur at least `min_count` times among `ids` (the training rows' ids)."""
        counts = torch.bincount(ids.long().cpu(), minlength=vocabulary)
        return cls(torch.nonzero(counts >= min_count).squeeze(1), vocabulary)

    @property
    def size(self) -> int:
        """Rows of the table: the kept ids and row 0."""
        return len(self.kept) + 1

    def to(self, device: torch.device | str) -> IdRows:
        """Keep the lookup on `device` (where the ids it maps live); returns self."""
        self.lookup = self.lookup.to(device)
        return self

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lookup.index_select(0, ids.clamp(0, self.vocabulary).reshape(-1)).view(ids.shape)


def _slots(valid: torch.Tensor) -> torch.Tensor:
    """(M,) positions of the True slots of (B, K) `valid` in the flattened grid, row-major: what a boolean
    index reads, searched once for the dense inputs and every sparse feature."""
    return true_positions(valid)


def session_relative(dense: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """(B, K, F) -> (B, K, 3F): each feature, minus its session's largest and mean value over the valid candidates.

    The mean is summed in float64, where the sum of a session's float32 values is exact unless they lie about
    2^21 apart in magnitude: it does not depend on the order of the candidates, and a feature that every
    candidate of a session shares (its length, its time) is exactly 0 apart from its mean. Summed in float32,
    that difference is rounding noise of a few 1e-7, which the rank-Gauss scaling spreads over the whole normal
    range, so the scores moved with the order the candidates came in and with the device. The largest value is
    taken by ``max`` (0.36x ``amax``'s time over the candidate axis of a part's (32, 200, 26) grid, on one thread).
    """
    mask = valid.unsqueeze(2)
    best = dense.masked_fill(~mask, float("-inf")).max(dim=1, keepdim=True).values
    best = torch.where(torch.isfinite(best), best, torch.zeros_like(best))  # a session without candidates
    total = dense.masked_fill(~mask, 0).sum(dim=1, keepdim=True, dtype=torch.float64)
    mean = (total / mask.sum(dim=1, keepdim=True).clamp(min=1)).to(dense.dtype)
    return torch.cat([dense, dense - best, dense - mean], dim=2)


class ScaledRows:
    """The valid slots of sessions of a `RankerRows`, their dense inputs scaled once by a `DLRMScorer` whose
    scaling is fitted (`DLRMScorer._dense`: session-relative columns, rank-Gauss): (M_s, G) float32 and
    the (M_s,) sparse ids, so that every epoch of a fit gathers its batches' slots instead of building
    and scaling them again. `flat` gives the slots of sessions among `sessions` (indices of the source's
    sessions).
    """

    def __init__(self, scorer: DLRMScorer, source: RankerRows, sessions: torch.Tensor) -> None:
        self.valid = source.valid
        self.position = torch.full((len(source),), -1, dtype=torch.long, device=source.device)
        self.position[sessions] = torch.arange(len(sessions), device=source.device)
        dense: list[torch.Tensor] = []
        sparse: dict[str, list[torch.Tensor]] = {}
        for lo in range(0, len(sessions), source.chunk):
            part = source.inputs(sessions[lo : lo + source.chunk])
            dense.append(scorer._dense(part))
            for name, ids in part.sparse.items():
                sparse.setdefault(name, []).append(ids[part.valid])
        self.dense = torch.cat(dense) if dense else torch.zeros(0, len(scorer.columns), device=source.device)
        self.sparse = {name: torch.cat(parts) for name, parts in sparse.items()}
        counts = source.valid[sessions].sum(dim=1)
        self.offsets = torch.cat([torch.zeros(1, dtype=torch.long, device=counts.device), counts.cumsum(0)])

    def flat(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """(R, K) valid slots of sessions `rows`, and the (M_r, G) scaled dense inputs and (M_r,) ids of
        those slots, session by session in row-major order."""
        at = self.position[rows]
        if len(at) and int(at.min()) < 0:
            raise IndexError("ScaledRows holds the scaled inputs of the sessions it was built for only")
        slots = slot_positions(self.offsets, at)
        return self.valid[rows], self.dense[slots], {name: ids[slots] for name, ids in self.sparse.items()}


class DLRMScorer(Scorer):
    """Listwise-trained DLRM over the candidates.

    Args:
        embedding_dim: D, width of every table.
        dense_layers: bottom MLP (its last width is set to D).
        over_layers: top MLP hidden widths.
        interaction: ``dot`` or ``dcn``.
        sparse: the id features embedded: ``item`` (the candidate and the last item, one shared
            table) and ``cross`` (their hashed pair); ``item`` is required.
        min_count: an id with fewer occurrences among the training rows gets the unseen row.
        id_dropout: probability that a training lookup is replaced by the unseen row.
        scaling: ``rank_gauss`` or ``standard`` (mean and standard deviation) for the dense features.
        relative: add each dense feature minus its session's largest and mean value.
        lr: Adam learning rate (`SparseAdam` for the tables, which updates the rows a batch looked up only).
        weight_decay: Adam weight decay of the dense layers (the tables have none).
        batch_sessions: sessions per training step (each with all its K candidates).
        max_epochs: epochs at most.
        patience: epochs without a better held-out MRR@20 before stopping.
        stop_fraction: share of the ranker's sessions held out for early stopping.
        seed: seeds the split, the weights, the id dropout and the shuffling.
    """

    def __init__(
        self,
        embedding_dim: int = 32,
        dense_layers: tuple[int, ...] = (128,),
        over_layers: tuple[int, ...] = (128, 64),
        interaction: Literal["dot", "dcn"] = "dot",
        sparse: tuple[str, ...] = ("item", "cross"),
        min_count: int = 1,
        id_dropout: float = 0.5,
        scaling: Literal["rank_gauss", "standard"] = "rank_gauss",
        relative: bool = True,
        lr: float = 2e-3,
        weight_decay: float = 1e-6,
        batch_sessions: int = 128,
        max_epochs: int = 30,
        patience: int = 3,
        stop_fraction: float = 0.15,
        seed: int = 0,
    ) -> None:
        unknown = sorted(set(sparse) - set(TABLES))
        if unknown or "item" not in sparse:
            raise ValueError(f"DLRMScorer sparse must hold 'item' and may hold 'cross', got {list(sparse)}")
        if scaling not in ("rank_gauss", "standard"):
            raise ValueError(f"DLRMScorer scaling must be 'rank_gauss' or 'standard', got {scaling!r}")
        if interaction not in ("dot", "dcn"):
            raise ValueError(f"DLRMScorer interaction must be 'dot' or 'dcn', got {interaction!r}")
        check_integers({"embedding_dim": embedding_dim, "min_count": min_count, "batch_sessions": batch_sessions,
                        "max_epochs": max_epochs, "patience": patience,
                        **{f"dense_layers[{i}]": n for i, n in enumerate(dense_layers)},
                        **{f"over_layers[{i}]": n for i, n in enumerate(over_layers)}}, "DLRMScorer ")
        check_integers({"seed": seed}, "DLRMScorer ", minimum=0)
        check_numbers("DLRMScorer", {"id_dropout": (id_dropout, "rate"), "lr": (lr, "positive"),
                                     "weight_decay": (weight_decay, "non-negative"), "stop_fraction": (stop_fraction, "fraction")})
        self.config = {
            "embedding_dim": embedding_dim, "dense_layers": list(dense_layers), "over_layers": list(over_layers),
            "interaction": interaction, "sparse": list(sparse), "min_count": min_count, "id_dropout": id_dropout,
            "scaling": scaling, "relative": relative, "lr": lr, "weight_decay": weight_decay,
            "batch_sessions": batch_sessions, "max_epochs": max_epochs, "patience": patience,
            "stop_fraction": stop_fraction, "seed": seed,
        }
        self.network: DLRM | None = None
        self.columns = torch.zeros(0, dtype=torch.long)  # (C,) the columns of the G that vary among the training rows
        self.mean: torch.Tensor | None = None  # (C,)
        self.std: torch.Tensor | None = None  # (C,)
        self.quantiles: torch.Tensor | None = None  # (C, Q) with rank_gauss scaling
        self._scale: tuple[torch.Tensor, RankGauss] | None = None  # (the quantiles, their RankGauss)
        self.rows: dict[str, IdRows] = {}
        self.num_dense = 0  # F, the features read
        self.history: list[float] = []

    # -- the network's inputs -------------------------------------------------------------------
    def _build(self, sparse_gradient: bool = False) -> DLRM:
        """The network; `sparse_gradient`: its tables get sparse gradients (training, `SparseAdam`)."""
        c = self.config
        d = c["embedding_dim"]
        tables = [TableConfig(name, self.rows[name].size, d, feature_names=TABLES[name]) for name in self.rows]
        torch.manual_seed(c["seed"])
        return DLRM(
            len(self.columns), tables, dense_layers=[*c["dense_layers"], d], over_layers=c["over_layers"],
            interaction=c["interaction"], sparse=FusedTables(sparse_gradient=sparse_gradient), seed=c["seed"],
        )

    def _dense(self, inputs: RankingInputs) -> torch.Tensor:
        """(M, C) scaled dense inputs of the M valid slots of these sessions in row-major order (what the
        network reads), `_scaled` `PART_SESSIONS` sessions at a time."""
        parts = [dense for *_, dense in self._parts(inputs)]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _parts(self, inputs: RankingInputs) -> Iterator[tuple[slice, torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Each part of `PART_SESSIONS` sessions: its slice of the sessions, its (b, K) valid slots, their
        positions (`_slots`) and their (m, C) scaled dense inputs (`_scaled`)."""
        for lo in range(0, max(len(inputs.valid), 1), PART_SESSIONS):
            part = slice(lo, lo + PART_SESSIONS)
            valid = inputs.valid[part]
            slots = _slots(valid)
            yield part, valid, slots, self._scaled(inputs.dense[part], valid, slots)

    def _scaled(self, dense: torch.Tensor, valid: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """(M, C) scaled dense inputs of the M `valid` (B, K) slots of (B, K, F) `dense`, whose positions in
        the flattened grid are `slots` (`_slots`): the kept `columns` of the G."""
        if dense.shape[2] != self.num_dense:
            raise ValueError(f"DLRMScorer was fitted on {self.num_dense} dense features, got {dense.shape[2]}")
        grid = session_relative(dense, valid) if self.config["relative"] else dense
        rows = grid.reshape(-1, grid.shape[2]).index_select(0, slots).index_select(1, self.columns)  # (M, C)
        return self._rank_gauss()(rows) if self.quantiles is not None else (rows - self.mean) / self.std

    def _rank_gauss(self) -> RankGauss:
        """The `RankGauss` of the quantiles, built once per quantile table."""
        if self._scale is None or self._scale[0] is not self.quantiles:
            self._scale = (self.quantiles, RankGauss(self.quantiles))
        return self._scale[1]

    def _ids(self, sparse: Mapping[str, torch.Tensor], dropout: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """Table rows (M,) of each sparse feature's (M,) ids; with `dropout`, each replaced by row 0 at the id_dropout rate."""
        out = {}
        for table, features in TABLES.items():
            if table not in self.rows:
                continue
            for name in features:
                ids = sparse[name]
                if ids.numel() and int(ids.min()) < 0:
                    raise ValueError(f"sparse feature {name!r} holds a negative id ({int(ids.min())})")
                looked = self.rows[table](ids)
                if dropout is not None:
                    drop = (torch.rand(looked.shape, generator=dropout) < self.config["id_dropout"]).to(looked.device)
                    looked = looked.masked_fill(drop, 0)
                out[name] = looked
        return out

    def _logits(self, valid: torch.Tensor, dense: torch.Tensor, sparse: Mapping[str, torch.Tensor],
                dropout: torch.Generator | None = None) -> torch.Tensor:
        """(B, K) logits of the candidates of B sessions, -inf at empty slots, from the (M, G) scaled dense
        inputs and the (M,) ids of their M `valid` slots in row-major order (the network sees the valid
        slots only); `dropout`: the id dropout's generator. Without autograd (scoring) the rows are
        gathered by `DLRM.forward_one_id`, the same logits as the bag path training needs."""
        ids = self._ids(sparse, dropout)
        if torch.is_grad_enabled():
            flat = self.network(dense, SparseFeatures.from_dense(ids))  # (M,)
        else:
            flat = self.network.forward_one_id(dense, ids)
        return torch.full(valid.shape, float("-inf"), dtype=flat.dtype, device=flat.device).masked_scatter(valid, flat)

    # -- the verbs ------------------------------------------------------------------------------
    def _fit_inputs(self, source: RankerRows, train: torch.Tensor) -> None:
        """The id rows and the dense scaling, from the training sessions' valid rows only (read a chunk at a time)."""
        c = self.config
        names = self._sparse_names(source)
        if "item" not in names:
            raise ValueError("DLRMScorer embeds the candidate and last item ids: keep the 'ids' feature group")
        if "cross" in c["sparse"] and "cross" not in names:
            raise ValueError("DLRMScorer sparse holds 'cross' but the inputs have no 'cross' ids: keep the 'ids' feature group")
        check_dense(self, source)
        tables = [t for t in TABLES if t in c["sparse"]]
        ids: dict[str, list[torch.Tensor]] = {table: [] for table in tables}
        for lo in range(0, len(train), source.chunk):
            part = source.inputs(train[lo : lo + source.chunk])
            for table in tables:
                ids[table] += [part.sparse[name][part.valid] for name in TABLES[table]]
        self.rows = {}
        for table in tables:
            found = torch.cat([i.reshape(-1) for i in ids.pop(table)]) if train.numel() else torch.zeros(0, dtype=torch.long)
            sizes = {source.cardinality[name] for name in TABLES[table] if name in source.cardinality}
            if len(sizes) > 1:
                raise ValueError(f"the features of table {table!r} ({list(TABLES[table])}) have different cardinalities {sorted(sizes)}")
            vocabulary = sizes.pop() if sizes else (int(found.max()) + 1 if len(found) else 1)
            if len(found) and (int(found.min()) < 0 or int(found.max()) >= vocabulary):
                raise ValueError(f"table {table!r}: ids {int(found.min())}..{int(found.max())} lie outside its cardinality {vocabulary}")
            self.rows[table] = IdRows.fit(found, vocabulary, c["min_count"]).to(source.device)
        self.num_dense = len(source.names)
        self.quantiles, self.mean, self.std = None, torch.zeros(0), torch.ones(0)
        # the scaling's statistics: a seeded sample of the training sessions, about SCALING_ROWS candidate rows
        sample = train[torch.randperm(len(train), generator=torch.Generator().manual_seed(c["seed"])).to(train.device)]
        sample = sample[: max(1, SCALING_ROWS // max(1, source.valid.shape[1]))].sort().values
        parts = []
        for lo in range(0, len(sample), source.chunk):
            part = source.inputs(sample[lo : lo + source.chunk])
            dense = session_relative(part.dense, part.valid) if c["relative"] else part.dense
            parts.append(dense[part.valid])
        rows = torch.cat(parts)  # (rows, G)
        varies = (rows != rows[:1]).any(dim=0) if len(rows) else torch.ones(rows.shape[1], dtype=torch.bool)
        if not bool(varies.any()):  # nothing varies: every column kept, a network needs an input
            varies[:] = True
        self.columns = torch.nonzero(varies).squeeze(1).to(rows.device)
        rows = rows[:, self.columns]  # (rows, C)
        if c["scaling"] == "rank_gauss":
            levels = torch.linspace(0, 1, QUANTILES, dtype=torch.float64, device=rows.device)
            self.quantiles = torch.quantile(rows.double(), levels, dim=0).T.float().contiguous()  # (C, Q)
        else:
            self.mean, self.std = rows.mean(dim=0), rows.std(dim=0).clamp(min=1e-6)

    @staticmethod
    def _sparse_names(source: RankerRows) -> set[str]:
        """The sparse features of the rows (read from their first session)."""
        return set(source.inputs(torch.zeros(1, dtype=torch.long, device=source.device)).sparse) if len(source) else set()

    def fit(self, inputs: RankingInputs | RankerRows, labels: torch.Tensor) -> DLRMScorer:
        """Fit on the sessions with a positive, their inputs read and scaled once (`ScaledRows`), then gathered per batch."""
        c = self.config
        source = RankerRows.of(inputs)
        train, stop = early_stopping_split(labels, c["stop_fraction"], c["seed"], source.groups)
        train, stop = train.to(labels.device), stop.to(labels.device)
        self._fit_inputs(source, train)
        scaled = ScaledRows(self, source, torch.cat([train, stop]))
        self.network = self._build(sparse_gradient=True).to(source.device)  # trains where its rows are
        tables = list(self.network.sparse_arch.parameters())
        dense = [p for name, p in self.network.named_parameters() if not name.startswith("sparse_arch.")]
        optimizers = (torch.optim.SparseAdam(tables, lr=c["lr"]),
                      torch.optim.Adam(dense, lr=c["lr"], weight_decay=c["weight_decay"]))
        target = labels.argmax(dim=1)
        gen = torch.Generator().manual_seed(c["seed"])
        dropout = torch.Generator().manual_seed(c["seed"] + 1) if c["id_dropout"] > 0 else None
        best, best_state, waited = -1.0, None, 0
        self.history = []
        for _ in range(c["max_epochs"]):
            self.network.train()
            order = train[torch.randperm(len(train), generator=gen).to(train.device)]
            for lo in range(0, len(order), c["batch_sessions"]):
                batch = order[lo : lo + c["batch_sessions"]]
                loss = F.cross_entropy(self._logits(*scaled.flat(batch), dropout), target[batch])
                for opt in optimizers:
                    opt.zero_grad()
                loss.backward()
                for opt in optimizers:
                    opt.step()
            value = mrr_of(self._score_scaled(scaled, stop), labels[stop])
            self.history.append(value)
            if value > best:
                best, waited = value, 0
                best_state = {k: v.detach().clone() for k, v in self.network.state_dict().items()}
            else:
                waited += 1
                if waited >= c["patience"]:
                    break
        self.network.load_state_dict(best_state)
        self.network.eval()
        return self

    @torch.inference_mode()
    def _score_scaled(self, scaled: ScaledRows, rows: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
        """(len(rows), K) logits of sessions `rows` of `scaled`, `chunk` sessions per forward pass."""
        self.network.eval()
        parts = [self._logits(*scaled.flat(rows[lo : lo + chunk])) for lo in range(0, len(rows), chunk)]
        return torch.cat(parts) if parts else torch.zeros(0, scaled.valid.shape[1], device=scaled.valid.device)

    @torch.no_grad()
    def score(self, inputs: RankingInputs) -> torch.Tensor:
        if self.network is None:
            raise RuntimeError("DLRMScorer is not fitted")
        if self.network.training:  # fit and load leave it in eval mode: a request skips walking the modules
            self.network.eval()
        parts = [  # each part scaled and scored while in the cache
            self._logits(valid, dense, {name: ids[part].reshape(-1).index_select(0, slots) for name, ids in inputs.sparse.items()})
            for part, valid, slots, dense in self._parts(inputs)
        ]
        return (parts[0] if len(parts) == 1 else torch.cat(parts)).float()

    def to(self, device: torch.device | str) -> DLRMScorer:
        """Move the network, the id rows and the scaling to `device`; returns self."""
        if self.network is not None:
            self.network.to(device)
            self.mean, self.std, self.columns = self.mean.to(device), self.std.to(device), self.columns.to(device)
            if self.quantiles is not None:
                self.quantiles = self.quantiles.to(device)
            self.rows = {name: rows.to(device) for name, rows in self.rows.items()}
        return self

    # -- saving ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``weights`` of the network; ``ids`` (each table's kept ids, ascending) and ``vocabulary`` (each
        table's id range); ``columns`` (C,), the network's inputs among the G; the scaling of those: ``quantiles``
        (C, Q) or ``mean`` and ``std`` (C,); the table ``sizes``, ``num_dense`` (F) and the early-stopping
        ``history`` (held-out MRR@20 per epoch)."""
        if self.network is None:
            raise RuntimeError("DLRMScorer is not fitted: nothing to save")
        state = {"weights": {k: v.detach().cpu().numpy() for k, v in self.network.state_dict().items()},
                 "ids": {name: rows.kept.numpy() for name, rows in self.rows.items()},
                 "vocabulary": {name: rows.vocabulary for name, rows in self.rows.items()},
                 "sizes": {name: rows.size for name, rows in self.rows.items()},
                 "columns": self.columns.cpu().numpy(), "num_dense": self.num_dense, "history": list(self.history)}
        if self.quantiles is not None:
            state["quantiles"] = self.quantiles.cpu().numpy()
        else:
            state["mean"], state["std"] = self.mean.cpu().numpy(), self.std.cpu().numpy()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> DLRMScorer:
        """Take a `state_dict` of a scorer of the same config.

        Raises:
            ValueError: a state without the id rows (written before tables had an unseen row: its
                unseen ids shared a seen id's row), or one whose tables or scaling differ from the config.
        """
        if "ids" not in state or "vocabulary" not in state:
            raise ValueError("this DLRMScorer state has no id rows ('ids', 'vocabulary'): it was saved before every table "
                             "had a row for unseen ids; fit the ranker again (sessrec fit on the pipeline recipe)")
        tables = [t for t in TABLES if t in self.config["sparse"]]  # the order the network stacks them in
        if sorted(state["ids"]) != sorted(tables):
            raise ValueError(f"the DLRMScorer state holds tables {sorted(state['ids'])}, its config embeds {tables}")
        self.rows = {name: IdRows(torch.from_numpy(np.array(state["ids"][name], dtype=np.int64)), int(state["vocabulary"][name]))
                     for name in tables}
        self.num_dense = int(state["num_dense"])
        self.history = [float(v) for v in state.get("history", [])]
        if (self.config["scaling"] == "rank_gauss") != ("quantiles" in state):
            raise ValueError(f"the DLRMScorer state's scaling does not match its config's {self.config['scaling']!r}")
        if "columns" not in state:
            raise ValueError("this DLRMScorer state does not say which columns its network reads ('columns'): fit the "
                             "ranker again (sessrec fit on the pipeline recipe)")
        self.columns = torch.from_numpy(np.array(state["columns"], dtype=np.int64)).reshape(-1)
        width = self.num_dense * (3 if self.config["relative"] else 1)
        if not len(self.columns) or int(self.columns.min()) < 0 or int(self.columns.max()) >= width or \
                bool((self.columns.diff() <= 0).any()):
            raise ValueError(f"the DLRMScorer state's columns must be ascending indices of its {width} inputs, got "
                             f"{self.columns.tolist()[:8]}")
        self.quantiles, self.mean, self.std = None, torch.zeros(0), torch.ones(0)
        if "quantiles" in state:
            self.quantiles = torch.from_numpy(np.array(state["quantiles"], dtype=np.float32))
        else:
            self.mean = torch.from_numpy(np.array(state["mean"], dtype=np.float32))
            self.std = torch.from_numpy(np.array(state["std"], dtype=np.float32))
        scaled = len(self.quantiles if self.quantiles is not None else self.mean)
        if scaled != len(self.columns):
            raise ValueError(f"the DLRMScorer state scales {scaled} columns and reads {len(self.columns)}")
        self.network = self._build()
        self.network.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state["weights"].items()})
        self.network.eval()
        if self.quantiles is not None:  # the scaling's tables are built at load, not by the first request
            self._rank_gauss()
        return self
