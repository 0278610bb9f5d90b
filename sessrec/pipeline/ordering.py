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
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from sessrec.data.schema import SchemaError, check_id
from sessrec.data.vocab import PAD, ItemVocab
from sessrec.pipeline.candidates import Candidates, Recommendations, Sessions
from sessrec.pipeline.filters import ConfigState, RawItemRule, read_item_table

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
        items: raw item ids, or the path of a parquet/CSV file with an `item_column` (a str is a path).
        weight: ``add``: added to the logit; ``multiply``: factor (> 0) on the softmax probability,
            i.e. ``log(weight)`` added to the logit.
        mode: ``add`` or ``multiply`` (see the module docstring).
        item_column: id column of the file.

    Example:
        >>> vocab = ItemVocab(pa.array([7, 9]), np.array([2, 1]))  # model ids 2, 3
        >>> rule = BoostRule([9], weight=1.0).bind(vocab)
        >>> rule.boost(torch.tensor([[2, 3]]), torch.tensor([[0.5, 0.0]])).tolist()
        [[0.5, 1.0]]
    """

    settings = ("weight", "mode")

    def __init__(
        self,
        items: Sequence[int | str] | str | Path,
        weight: float,
        mode: Literal["add", "multiply"] = "add",
        item_column: str = "item_id",
    ) -> None:
        if mode not in ("add", "multiply"):
            raise ValueError(f"BoostRule mode must be 'add' or 'multiply', got {mode!r}")
        if not math.isfinite(weight) or (mode == "multiply" and weight <= 0):
            raise ValueError(f"BoostRule weight must be finite (and > 0 with mode='multiply'), got {weight}")
        self.weight, self.mode = float(weight), mode
        if isinstance(items, str | Path):
            self._raw = read_item_table(items, item_column)[0]
        elif len(items) == 0:
            raise ValueError("BoostRule items is empty; give raw item ids or a file path")
        else:
            given = pa.table({item_column: pa.array(list(items))})
            self._raw = check_id(given, item_column, "BoostRule items").combine_chunks()
        self._raw_columns = {}

    @property
    def delta(self) -> float:
        """What the rule adds to a boosted item's logit."""
        return self.weight if self.mode == "add" else math.log(self.weight)

    def boost(self, items: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """(B, K) scores with the rule's items raised; `items` (B, K) model ids."""
        return torch.where(self.bound_rows().contains(items), scores + self.delta, scores)


class DiversityCap(RawItemRule):
    """At most `max_per_category` items of one category in the final list.

    Items absent from the table, or with a null category, are uncapped. The category of an
    item is the value of `category_column` (integers or strings); each item may have one row.

    Args:
        category_path: parquet or CSV file with `item_column` and `category_column`.
        max_per_category: n >= 1.
        item_column: raw item id column.
        category_column: category column.

    Raises:
        SchemaError: missing file or column, null item id, an item listed twice.
    """

    settings = ("max_per_category",)

    def __init__(
        self,
        category_path: str,
        max_per_category: int,
        item_column: str = "item_id",
        category_column: str = "category",
    ) -> None:
        if max_per_category < 1:
            raise ValueError(f"DiversityCap max_per_category must be >= 1, got {max_per_category}")
        self.max_per_category = max_per_category
        raw, table = read_item_table(category_path, item_column, required=(category_column,))
        repeats = pc.value_counts(raw)
        twice = repeats.filter(pc.greater(repeats.field("counts"), 1))
        if len(twice):
            raise SchemaError(
                f"{category_path}: column {item_column!r} lists item {twice[0]['values'].as_py()!r} "
                f"{twice[0]['counts'].as_py()} times; give each item one category"
            )
        codes = pc.dictionary_encode(table.column(category_column).combine_chunks()).indices
        has = codes.is_valid().to_numpy(zero_copy_only=False)  # null category: uncapped, not listed
        self._raw = raw.filter(pa.array(has))
        self._raw_columns = {"category": codes.drop_null().to_numpy().astype(np.int64)}

    def cap(self, items: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """(B, K) bool: False on entries beyond their category's first `max_per_category` by score."""
        rows = self.bound_rows()
        row, found = rows.find(items)
        category = torch.from_numpy(rows.columns["category"]).to(items.device)[row]  # one row per item
        return ~found | (occurrence(torch.where(found, category, -1), scores) < self.max_per_category)


class SoftmaxSampling(ConfigState):
    """Sample k candidates without replacement, with weight ``exp(score / temperature)``.

    Gumbel-top-k: the top-k of ``score / temperature + Gumbel noise`` is such a sample. A higher
    temperature explores more (Merlin's SoftmaxSampling multiplies by its temperature instead).
    The noise comes from a generator seeded once here, which advances with each call: two
    samplers with the same seed give the same sequence of samples.

    Args:
        temperature: > 0; 0 or None: greedy (the top-k by score).
        seed: seed of the generator.
    """

    def __init__(self, temperature: float | None = 1.0, seed: int = 0) -> None:
        if temperature is not None and not (math.isfinite(temperature) and temperature >= 0):
            raise ValueError(f"SoftmaxSampling temperature must be >= 0 or None (greedy), got {temperature}")
        self.temperature, self.seed = temperature, seed
        self._generator = torch.Generator().manual_seed(seed)

    def sample(self, scores: torch.Tensor, k: int) -> torch.Tensor:
        """(B, k) columns of the sampled entries, in sampled order (-inf entries only when too few remain)."""
        if not self.temperature:
            return _top_columns(scores, k)
        noise = torch.empty(scores.shape, dtype=torch.float64).exponential_(generator=self._generator)
        keys = scores.double() / self.temperature - noise.log().to(scores.device)  # -log(Exp(1)) ~ Gumbel
        return _top_columns(keys.masked_fill(scores == NEG_INF, NEG_INF), k)


def _top_columns(keys: torch.Tensor, k: int) -> torch.Tensor:
    """(B, k) columns of the k largest `keys` per row, ties to the earlier column (deterministic)."""
    return torch.sort(keys, dim=1, descending=True, stable=True).indices[:, :k]


class Ordering:
    """Business rules and the final top-k over scored candidates (see the module docstring).

    Args:
        boosts: score boosts, applied one after another.
        diversity: cap on items per category, or None.
        sampling: softmax sampling of the final k, or None for the top-k by score.

    Example:
        >>> c = Candidates(torch.tensor([[4, 5, 6]]), scores=torch.tensor([[0.1, 0.9, 0.5]]))
        >>> Ordering().order(Sessions(torch.tensor([[4]])), c, k=2).items.tolist()
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

    def bind(self, vocab: ItemVocab) -> Ordering:
        """Encode the raw ids of the boosts and the category table with `vocab`; returns self."""
        for rule in [*self.boosts, self.diversity]:
            if rule is not None:
                rule.bind(vocab)
        return self

    def order(self, sessions: Sessions, candidates: Candidates, k: int) -> Recommendations:
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
        scores = scores.masked_fill(occurrence(items, scores) > 0, NEG_INF)  # dedupe: one entry per item
        if self.diversity is not None:
            scores = scores.masked_fill(~self.diversity.cap(items, scores), NEG_INF)
        if items.shape[1] < k:  # pad so that (B, k) can always be taken
            items = torch.nn.functional.pad(items, (0, k - items.shape[1]), value=PAD)
            scores = torch.nn.functional.pad(scores, (0, k - scores.shape[1]), value=NEG_INF)
        cols = _top_columns(scores, k) if self.sampling is None else self.sampling.sample(scores, k)
        top_scores = scores.gather(1, cols)
        top_items = items.gather(1, cols).masked_fill(top_scores == NEG_INF, PAD)
        return Recommendations(items=top_items, scores=top_scores)

    def state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """JSON-able settings and named arrays (boost sets and categories as model ids)."""
        config: dict[str, Any] = {"boosts": [], "diversity": None, "sampling": None}
        arrays: dict[str, np.ndarray] = {}
        for i, rule in enumerate(self.boosts):
            rule_config, rule_arrays = rule.state()
            config["boosts"].append(rule_config)
            arrays.update(_prefixed(f"boosts.{i}", rule_arrays))
        if self.diversity is not None:
            config["diversity"], rule_arrays = self.diversity.state()
            arrays.update(_prefixed("diversity", rule_arrays))
        if self.sampling is not None:
            config["sampling"] = self.sampling.state()[0]
        return config, arrays

    @classmethod
    def from_state(cls, config: dict[str, Any], arrays: dict[str, np.ndarray]) -> Ordering:
        boosts = [
            BoostRule.from_state(c, _part(arrays, f"boosts.{i}")) for i, c in enumerate(config["boosts"])
        ]
        diversity = None
        if config["diversity"] is not None:
            diversity = DiversityCap.from_state(config["diversity"], _part(arrays, "diversity"))
        sampling = None if config["sampling"] is None else SoftmaxSampling.from_state(config["sampling"], {})
        return cls(boosts, diversity, sampling)


def _prefixed(name: str, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {f"{name}.{key}": value for key, value in arrays.items()}


def _part(arrays: dict[str, np.ndarray], name: str) -> dict[str, np.ndarray]:
    """The arrays saved under `name` by `_prefixed`, with their own names."""
    return {key[len(name) + 1 :]: value for key, value in arrays.items() if key.startswith(f"{name}.")}
