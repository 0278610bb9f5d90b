"""Stage 4 of the pipeline: business rules over the scored candidates, then the final top-k.

`Ordering.order` takes the scored (B, K) candidate matrix and returns (B, k) recommendations,
applying in this order:

1. boosts (`BoostRule`): campaign items get their score raised;
2. dedupe: an item id present twice in a row keeps only its best entry;
3. a diversity cap (`DiversityCap`): at most n items of one category;
4. the top-k by score, or a seeded softmax sample of k (`SoftmaxSampling`).

Each step is a few sorts, gathers and scatters over the whole (B, K) matrix. Without any rule,
`order` is exactly the top-k by score (ties: the earlier column first).

Scores are treated as logits throughout (what the scorers return): ``BoostRule(mode="add")``
adds to the logit, ``mode="multiply"`` multiplies the item's softmax probability within its row,
which is adding ``log(weight)`` to the logit, so it is exact for negative logits too (a plain
product would demote a boosted item whose logit is negative). `SoftmaxSampling` samples with
weight ``exp(score / temperature)``.

Shape letters: B sessions, K candidates per session, k recommendations, N table rows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from sessrec.data.columns import SchemaError, check_id
from sessrec.data.vocab import PAD, ItemVocab
from sessrec.features.backend import mix64
from sessrec.pipeline.candidates import Candidates, Recommendations, RequestSessions
from sessrec.pipeline.filters import RawItemRule, Stateless, read_item_table
from sessrec.saved.registry import Configurable, check_integers

__all__ = ["BoostRule", "DiversityCap", "Ordering", "SoftmaxSampling", "occurrence"]

NEG_INF = float("-inf")


def occurrence(groups: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """(B, K) int64: how many entries of the same group outscore each entry in its row (0 = the best).

    Sort each row by score (descending, stable), then stably by group, so that each group is a run
    in score order; an entry's index is its distance from the start of its run.

    Args:
        groups: (B, K) int64 group of each entry (an item id, a category code).
        scores: (B, K) scores; ties go to the earlier column.
    """
    by_score = torch.argsort(scores, dim=1, descending=True, stable=True)
    g = groups.gather(1, by_score)
    by_group = torch.argsort(g, dim=1, stable=True)
    g = g.gather(1, by_group)  # (B, K) groups in runs, score order within each run
    col = torch.arange(g.shape[1], device=g.device).expand_as(g)
    new_run = torch.ones_like(g, dtype=torch.bool)
    new_run[:, 1:] = g[:, 1:] != g[:, :-1]
    run_start = torch.where(new_run, col, torch.zeros_like(col)).cummax(dim=1).values
    out = torch.empty_like(groups)
    return out.scatter_(1, by_score.gather(1, by_group), col - run_start)


class BoostRule(RawItemRule):
    """Raise the scores of a campaign's items.

    Args:
        items: raw item ids, or the path of a parquet/CSV file with an `item_column` (a str is a
            path, read when the rule is bound); None: no source, the rule holds only the model ids
            that `load_state_dict` gives it.
        weight: ``add``: added to the logit; ``multiply``: factor (> 0) on the softmax probability,
            i.e. ``log(weight)`` added to the logit.
        mode: ``add`` or ``multiply`` (see the module docstring).
        item_column: id column of the file.

    Examples:
        >>> vocab = ItemVocab(pa.array([7, 9]), np.array([2, 1]))  # model ids 2, 3
        >>> rule = BoostRule([9], weight=1.0).bind(vocab)
        >>> rule.boost(torch.tensor([[2, 3]]), torch.tensor([[0.5, 0.0]])).tolist()
        [[0.5, 1.0]]
    """

    def __init__(
        self,
        items: Sequence[int | str] | str | Path | None,
        weight: float,
        mode: Literal["add", "multiply"] = "add",
        item_column: str = "item_id",
    ) -> None:
        if mode not in ("add", "multiply"):
            raise ValueError(f"BoostRule mode must be 'add' or 'multiply', got {mode!r}")
        if not math.isfinite(weight) or (mode == "multiply" and weight <= 0):
            raise ValueError(f"BoostRule weight must be finite (and > 0 with mode='multiply'), got {weight}")
        self.weight, self.mode = float(weight), mode
        self.items, self.item_column = items, item_column
        self._raw_columns = {}
        if items is not None and not isinstance(items, str | Path):
            if len(items) == 0:
                raise ValueError("BoostRule items is empty; give raw item ids or a file path")
            given = pa.table({item_column: pa.array(list(items))})
            self._raw = check_id(given, item_column, "BoostRule items").combine_chunks()

    def read_raw(self) -> tuple[pa.Array, dict[str, np.ndarray]]:
        if self.items is None:
            raise ValueError("BoostRule has no items to read (items=None): give raw item ids or a file path")
        return read_item_table(self.items, self.item_column)[0], {}

    @property
    def delta(self) -> float:
        """What the rule adds to a boosted item's logit."""
        return self.weight if self.mode == "add" else math.log(self.weight)

    def boost(self, items: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """(B, K) scores with the rule's items raised; `items` (B, K) model ids."""
        return torch.where(self.bound_rows().contains(items), scores + self.delta, scores)


class DiversityCap(RawItemRule):
    """At most `max_per_category` items of one category in the final list.

    Items absent from the table, or with a null (or NaN) category, are uncapped. The category of an
    item is the value of `category_column` (integers or strings); each item may have one row.

    Args:
        category_path: parquet or CSV file with `item_column` and `category_column`, read when
            the rule is bound; None: no source, the rule holds only the categories that
            `load_state_dict` gives it.
        max_per_category: n >= 1.
        item_column: raw item id column.
        category_column: category column.

    Raises (from `read` or `bind`):
        SchemaError: missing file or column, null item id, an item listed twice.
    """

    def __init__(
        self,
        category_path: str | None,
        max_per_category: int,
        item_column: str = "item_id",
        category_column: str = "category",
    ) -> None:
        check_integers({"max_per_category": max_per_category}, "DiversityCap ")
        self.max_per_category = max_per_category
        self.category_path, self.item_column, self.category_column = category_path, item_column, category_column

    def read_raw(self) -> tuple[pa.Array, dict[str, np.ndarray]]:
        path, item_column = self.category_path, self.item_column
        if path is None:
            raise ValueError("DiversityCap has no category file to read (category_path=None)")
        raw, table = read_item_table(path, item_column, required=(self.category_column,))
        repeats = pc.value_counts(raw)
        twice = repeats.filter(pc.greater(repeats.field("counts"), 1))
        if len(twice):
            raise SchemaError(
                f"{path}: column {item_column!r} lists item {twice[0]['values'].as_py()!r} "
                f"{twice[0]['counts'].as_py()} times; give each item one category"
            )
        column = table.column(self.category_column).combine_chunks()
        if pa.types.is_floating(column.type):  # NaN: a missing category as pandas writes it, null as the others
            column = pc.if_else(pc.is_nan(column), pa.scalar(None, column.type), column)
        codes = pc.dictionary_encode(column).indices
        has = codes.is_valid().to_numpy(zero_copy_only=False)  # null category: uncapped, not listed
        return raw.filter(pa.array(has)), {"category": codes.drop_null().to_numpy().astype(np.int64)}

    def cap(self, items: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """(B, K) bool: False on entries beyond their category's first `max_per_category` by score."""
        rows = self.bound_rows()
        if not len(rows.ids):  # no item of the table in the vocabulary: nothing is capped
            return torch.ones_like(items, dtype=torch.bool)
        row, found = rows.find(items)
        category = torch.from_numpy(rows.columns["category"]).to(items.device)[row]  # one row per item
        return ~found | (occurrence(torch.where(found, category, -1), scores) < self.max_per_category)


class SoftmaxSampling(Stateless):
    """Sample k candidates without replacement, with weight ``exp(score / temperature)``.

    Gumbel-top-k: the top-k of ``score / temperature + Gumbel noise`` is such a sample. A higher
    temperature explores more (Merlin's SoftmaxSampling multiplies by its temperature instead).
    The noise of a candidate is a function of the seed, the session's items (their ids and places
    from its end; padding and the batch around it do not count) and the candidate's id (`noise`):
    a session gets the same sample in a request, in a batch, on any worker or device and in a run
    resumed, and sessions that differ in any item get independent samples.

    Args:
        temperature: > 0; 0 or None: greedy (the top-k by score).
        seed: an integer in 0 .. 2**64 - 1; another seed, other samples.
    """

    def __init__(self, temperature: float | None = 1.0, seed: int = 0) -> None:
        if temperature is not None and not (math.isfinite(temperature) and temperature >= 0):
            raise ValueError(f"SoftmaxSampling temperature must be >= 0 or None (greedy), got {temperature}")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
            raise ValueError(f"SoftmaxSampling seed must be an integer in 0 .. 2**64 - 1 (the noise's 64 bits), got {seed!r}")
        self.temperature, self.seed = temperature, seed

    def noise(self, sessions: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """(B, K) float64 standard Gumbel noise of candidates `items` (B, K) of (B, L) right-aligned `sessions`.

        On the host, in wrapping uint64 arithmetic (`mix64`): a session's key is the sum of ``mix64(mix64(seed ^
        id) + place)`` over its items (place 1 the last), and a candidate's uniform the top 53 bits of
        ``mix64(key ^ mix64(id + seed))``, centred in its bin: in (0, 1), never 0 or 1.
        """
        seed = np.uint64(self.seed)
        ids = sessions.detach().cpu().numpy().astype(np.uint64)
        place = np.arange(ids.shape[1], 0, -1, dtype=np.uint64)  # the last item 1, whatever the padding
        with np.errstate(over="ignore"):
            per_item = np.where(ids != PAD, mix64(mix64(ids ^ seed) + place), np.uint64(0))
            key = per_item.sum(axis=1, dtype=np.uint64)  # (B,)
            bits = mix64(key[:, None] ^ mix64(items.detach().cpu().numpy().astype(np.uint64) + seed))
        uniform = ((bits >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53
        return torch.from_numpy(-np.log(-np.log(uniform)))

    def sample(self, scores: torch.Tensor, k: int, sessions: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """(B, k) columns of the sampled entries of (B, K) `scores` of candidates `items` of (B, L) `sessions`, in
        sampled order (-inf entries only when too few remain)."""
        if not self.temperature:
            return _top_columns(scores, k)
        noise = self.noise(sessions, items).to(scores.device)
        keys = scores.double() / self.temperature + noise
        over = (keys.isinf() & scores.isfinite()).any(dim=1, keepdim=True)  # score / temperature past float64
        if bool(over.any()):  # those rows by score + temperature * noise: the same order, in range
            keys = torch.where(over, scores.double() + self.temperature * noise, keys)
        return _top_columns(keys.masked_fill(scores == NEG_INF, NEG_INF), k)


def _top_columns(keys: torch.Tensor, k: int) -> torch.Tensor:
    """(B, k) columns of the k largest `keys` per row, ties to the earlier column (deterministic)."""
    return torch.sort(keys, dim=1, descending=True, stable=True).indices[:, :k]


class Ordering(Configurable):
    """Business rules and the final top-k over scored candidates (see the module docstring).

    Args:
        boosts: score boosts, applied one after another.
        diversity: cap on items per category, or None.
        sampling: softmax sampling of the final k, or None for the top-k by score.

    Examples:
        >>> c = Candidates(torch.tensor([[4, 5, 6]]), scores=torch.tensor([[0.1, 0.9, 0.5]]))
        >>> Ordering().order(RequestSessions(torch.tensor([[4]])), c, k=2).items.tolist()
        [[5, 6]]
    """

    def __init__(
        self,
        boosts: Sequence[BoostRule] = (),
        diversity: DiversityCap | None = None,
        sampling: SoftmaxSampling | None = None,
    ) -> None:
        self.boosts = list(boosts)
        self.diversity = diversity
        self.sampling = sampling

    @property
    def by_score(self) -> bool:
        """Whether the lists are served in score order (the top-k by the boosted scores); False when sampled."""
        return self.sampling is None or not self.sampling.temperature

    @property
    def rules(self) -> list[RawItemRule]:
        """The rules built from raw item ids: the boosts, then the diversity cap."""
        return [*self.boosts, *([self.diversity] if self.diversity is not None else [])]

    def bind(self, vocab: ItemVocab) -> Ordering:
        """Encode the raw ids of the boosts and the category table with `vocab`; returns self."""
        for rule in self.rules:
            rule.bind(vocab)
        return self

    def order(self, sessions: RequestSessions, candidates: Candidates, k: int) -> Recommendations:
        """The final (B, k) recommendations: model ids best first (0 where fewer remain), and their scores.

        The returned scores are the boosted ones, -inf at empty slots.
        """
        if candidates.scores is None:
            raise ValueError(
                "Ordering.order needs scored candidates (candidates.scores is None); run a scorer first"
            )
        if k < 1:
            raise ValueError(f"Ordering.order needs k >= 1, got {k}")
        items = candidates.items
        scores = candidates.scores.float().masked_fill(~candidates.valid, NEG_INF)  # (B, K)
        for rule in self.boosts:
            scores = rule.boost(items, scores)
        ordered = items.sort(dim=1).values
        if bool(((ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] != PAD)).any()):  # dedupe: one entry per item
            scores = scores.masked_fill(occurrence(items, scores) > 0, NEG_INF)
        if self.diversity is not None:
            scores = scores.masked_fill(~self.diversity.cap(items, scores), NEG_INF)
        if items.shape[1] < k:  # pad so that (B, k) can always be taken
            items = torch.nn.functional.pad(items, (0, k - items.shape[1]), value=PAD)
            scores = torch.nn.functional.pad(scores, (0, k - scores.shape[1]), value=NEG_INF)
        cols = _top_columns(scores, k) if self.sampling is None else self.sampling.sample(scores, k, sessions.items, items)
        top_scores = scores.gather(1, cols)
        top_items = items.gather(1, cols).masked_fill(top_scores == NEG_INF, PAD)
        return Recommendations(items=top_items, scores=top_scores)

    def state_dict(self) -> dict[str, Any]:
        """The encoded rows of the rules: ``boosts`` (``"0"``, ``"1"``, ... in order) and ``diversity``."""
        state: dict[str, Any] = {"boosts": {str(i): rule.state_dict() for i, rule in enumerate(self.boosts)}}
        if self.diversity is not None:
            state["diversity"] = self.diversity.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> Ordering:
        boosts = state.get("boosts", {})
        if len(boosts) != len(self.boosts):
            raise ValueError(f"the ordering's state holds {len(boosts)} boosts, its config {len(self.boosts)}")
        for i, rule in enumerate(self.boosts):
            rule.load_state_dict(boosts[str(i)])
        if (self.diversity is None) != ("diversity" not in state):
            raise ValueError("the ordering's state and its config differ in having a diversity cap")
        if self.diversity is not None:
            self.diversity.load_state_dict(state["diversity"])
        return self
