"""The modules an export traces: a trained model as one function of plain tensors.

`NextItemScorer` is a `SessionRecommender`'s next-item scoring (items [, side features, event times] -> scores [and
the K best]), `ExportedClickScorer` a `ClickRanker`'s DLRM (dense and padded sparse ids -> logits). Each names its
inputs and outputs (`TensorSpec`: what ``model.json`` lists), builds example inputs for a trace and a check on
another shape, and describes how a server builds its inputs. `sessrec.lifecycle.export` writes and checks the files.

Shape letters: B batch, L session length, V items (incl. padding and OOV), K top-k,
Dd dense features, H ids per sample of one sparse feature.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import nn

from sessrec.artifacts import ClickRanker, SessionRecommender
from sessrec.artifacts.click_ranker import check_parts
from sessrec.artifacts.model_directory import VOCAB
from sessrec.data.vocab import NUM_SPECIAL, OOV, PAD
from sessrec.datasets.clickouts import DENSE_FEATURES
from sessrec.embeddings import SparseFeatures
from sessrec.embeddings.sparse_arch import DynamicSparseArch
from sessrec.models.objective import EVENT_TIMES, latest
from sessrec.models.onnx_graph import example_items, example_times
from sessrec.models.session_model import next_item_scores, top_recommendable


@dataclass
class TensorSpec:
    """One input or output of an exported model: name, NumPy dtype name, shape (ints and axis names)."""

    name: str
    dtype: str
    shape: list[int | str]



class NextItemScorer(nn.Module):
    """A trained `SessionModel` as one function: items (B, L) [, side features, event times (B, L) each] -> scores.

    Sessions are right-aligned model ids (0 = padding), cut to their latest ``inference.max_length``
    items and read the way the model was trained to read them, as `SessionRecommender.scores` reads
    them: ``model(items, objective, features)``, then `exclude_seen` when its inference settings
    ask for it. Outputs: ``scores`` (B, V), -inf for padding, OOV, virtual (and excluded) items;
    with `top_k`, also ``top_scores`` (B, K) and ``top_items`` (B, K) model ids, best first (`top_recommendable`,
    as served: a session with fewer than K recommendable items, its own excluded, gets id 0 past the last, scored -inf).

    Side features are extra inputs, one (B, L) tensor per feature after ``items``, in
    `feature_names` order: int64 ids for categorical features, float32 for continuous ones.
    Item vectors are tables inside the model and need no input. A model whose encoder reads event
    times (`HSTUEncoder`: ``uses_times``) takes them as the last input, ``event_times``: (B, L) float64
    seconds aligned with the items (padding's are not read), as served models read a request's.

    Args:
        recommender: the trained model (its network shared, not copied) with its objective and
            inference settings.
        top_k: also return the K best items (clipped to the recommendable ones); None: scores only.
        exclude_seen: never score an item of the input session (default: the inference settings').
    """

    def __init__(self, recommender: SessionRecommender, top_k: int | None = None, exclude_seen: bool | None = None) -> None:
        super().__init__()
        if not isinstance(recommender, SessionRecommender):
            raise TypeError(f"NextItemScorer exports a SessionRecommender, got {type(recommender).__name__}")
        if top_k is not None and (isinstance(top_k, bool) or not hasattr(top_k, "__index__") or top_k < 1):
            raise ValueError(f"top_k must be an integer of 1 or more, or None (scores only), got {top_k!r}")
        model = recommender.model
        self.model = model
        # a plain attribute, not a submodule: RTD's generator is training-only and stays out of the file
        object.__setattr__(self, "objective", recommender.objective)
        self.exclude_seen = recommender.inference.exclude_seen if exclude_seen is None else exclude_seen
        self.max_length = recommender.inference.max_length  # items read, as served (at most the network's)
        self.recommendable = int(self.model.recommendable.sum())
        self.top_k = None if top_k is None else min(int(top_k), self.recommendable)
        side = self.model.side_info
        self.categorical = list(side.categorical) if side is not None else []
        self.continuous = list(side.continuous) if side is not None else []
        self.times = model.uses_times

    @property
    def feature_names(self) -> list[str]:
        """The inputs after ``items``: side features, then ``event_times`` for a model that reads them."""
        return [*self.categorical, *self.continuous, *([EVENT_TIMES] if self.times else [])]

    def forward(self, items: torch.Tensor, *features: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        if len(features) != len(self.feature_names):
            raise ValueError(f"expected the inputs items, {', '.join(self.feature_names)}; got {1 + len(features)} tensors")
        side = dict(zip(self.feature_names, features)) if self.feature_names else None
        items, side = latest(items, side, self.max_length)
        scores = next_item_scores(self.model, self.objective, items, side, self.exclude_seen)  # (B, V)
        if self.top_k is None:
            return scores
        items, values = top_recommendable(scores, self.top_k, self.recommendable)  # (B, K)
        return scores, values, items

    def inputs(self) -> list[TensorSpec]:
        return [
            TensorSpec("items", "int64", ["batch", "length"]),
            *(TensorSpec(n, "int64", ["batch", "length"]) for n in self.categorical),
            *(TensorSpec(n, "float32", ["batch", "length"]) for n in self.continuous),
            *([TensorSpec(EVENT_TIMES, "float64", ["batch", "length"])] if self.times else []),
        ]

    def outputs(self) -> list[TensorSpec]:
        scores = TensorSpec("scores", "float32", ["batch", self.model.num_items])
        if self.top_k is None:
            return [scores]
        return [scores, TensorSpec("top_scores", "float32", ["batch", self.top_k]),
                TensorSpec("top_items", "int64", ["batch", self.top_k])]

    def example(self, batch: int, length: int, seed: int, unusual: bool = False) -> tuple[torch.Tensor, ...]:
        """Right-aligned sessions (B, L) of random items with left padding (and their side features); `unusual`: the
        last session fills all L columns and its item before the last is unknown (OOV), as requests may bring them."""
        g = torch.Generator().manual_seed(seed)
        model, device = self.model, self.model.item_embedding.weight.device
        items = example_items(model.recommendable, batch, length, g)  # (B, L)
        if unusual:
            items[-1] = example_items(model.recommendable, length, length, g)[-1]  # L items
            items[-1, -2] = OOV
        side = model.side_info
        cats = [torch.randint(1, side.categorical[n].num_embeddings, (batch, length), generator=g) for n in self.categorical]
        conts = [torch.randn(batch, length, generator=g) for _ in self.continuous]
        times = [example_times(batch, length, g)] if self.times else []
        return tuple(t.to(device) for t in (items, *cats, *conts, *times))

    def describe(self) -> dict[str, object]:
        return {
            "encoder": type(self.model.encoder).__name__,
            "objective": type(self.objective).__name__,
            "exclude_seen": self.exclude_seen,
            "num_items": self.model.num_items,
            "max_length": self.max_length,  # items read; the [MASK] slot is added inside
            "items": "right-aligned model ids, 0 = padding; longer sessions keep their latest items",
            "scores": "-inf for padding, OOV, virtual and excluded items",
            **({"top_items": "best first; 0 (padding, scored -inf) past the last item a session can be recommended"}
               if self.top_k is not None else {}),
            **({EVENT_TIMES: "event times in seconds (float64), aligned with items; padding's are not read"}
               if self.times else {}),
        }


class ExportedClickScorer(nn.Module):
    """A trained click ranker's `DLRM` as one function: dense (B, Dd) and ids (B, H) per sparse feature -> logits (B,).

    The inputs are those of a click-out row (`sessrec.datasets.clickouts`): ``dense`` holds `DENSE_FEATURES`
    in that order, and each sparse feature's ids are the ranker's vocabulary's (`describe`: ``ids_from_vocab``).
    The ids of each sparse feature come as a padded matrix, -1 (any negative) marking an absent id (the
    convention of `SparseFeatures.from_dense`); H may differ between features and calls (a
    one-hot feature is (B, 1)). An id at or past the number of ids the vocabulary gives the feature is the
    unseen id 1, as ``sessrec test`` reads a value the vocabulary lacks. The tables are pooled here by a
    gather and a masked sum (or mean)
    instead of the model's `SparseArch`: its jagged `SparseFeatures` path reads the ids' counts on
    the host to check and chunk them, which neither exporter can trace (torch.export stops on a
    data-dependent size; torch.jit.trace on the fused optimizer's autograd anchor), while a padded
    id matrix is what a server receives anyway. The dense MLP, interaction and top MLP are the
    model's own.

    Args:
        ranker: the trained model (its network shared, not copied) and its vocabulary.

    Raises:
        ValueError: the DLRM and the vocabulary do not belong together (`check_parts`).
    """

    def __init__(self, ranker: ClickRanker) -> None:
        super().__init__()
        if not isinstance(ranker, ClickRanker):
            raise TypeError(f"ExportedClickScorer exports a ClickRanker, got {type(ranker).__name__}")
        self.model = ranker.model
        arch = self.model.sparse_arch
        check_parts(self.model, ranker.vocab)
        self.feature_names = list(arch.feature_names)
        self.sizes = [ranker.vocab.cardinalities[f] for f in self.feature_names]  # ids of each feature
        self.tables = [arch.table_of[f] for f in self.feature_names]
        self.mean = [arch.pooling[t] == "mean" for t in self.tables]
        # every table as rows by id (the fused weight's views, or a growing table's rows laid out by id),
        # detached: tables that are parameters (FusedTables with optimizer none, HybridTables) are constants of the exported file
        self.weights = {name: arch.table_weight(name).detach() for name in dict.fromkeys(self.tables)}
        # a growing table's ids it met, by id: one it never met is absent, adding nothing to a bag nor counting for a mean
        self.met = {name: _met(arch.tables[name], self.weights[name].shape[0]) for name in self.weights} \
            if isinstance(arch, DynamicSparseArch) else {}

    def pooled(self, ids: torch.Tensor, table: str, mean: bool, size: int) -> torch.Tensor:
        """(B, H) ids, negative = absent, `size` ids in the vocabulary -> (B, D) pooled rows of `table`; an empty
        bag gives zeros. An id a growing table never met is absent too (as the table reads it in eval)."""
        weight = self.weights[table]  # (N, D)
        known = torch.where(ids < size, ids, torch.full_like(ids, OOV))  # past the vocabulary: an unseen value
        rows = known.clamp(min=0, max=weight.shape[0] - 1)  # absent ids read row 0 (masked out)
        present = ids >= 0  # (B, H)
        if table in self.met:  # never met (the last row: every id past the largest met): absent
            present = present & self.met[table][rows]
        summed = (weight[rows] * present.unsqueeze(-1)).sum(dim=1)  # (B, D)
        return summed / present.sum(dim=1, keepdim=True).clamp(min=1) if mean else summed

    def forward(self, dense: torch.Tensor, *ids: torch.Tensor) -> torch.Tensor:
        model = self.model
        x = model.dense_arch(dense)  # (B, D)
        e = torch.stack([self.pooled(i, t, m, n) for i, t, m, n in zip(ids, self.tables, self.mean, self.sizes)], dim=1)
        return model.over_arch(model.interaction(x, e.to(x.dtype)))  # (B,)

    def inputs(self) -> list[TensorSpec]:
        return [TensorSpec("dense", "float32", ["batch", self.model.num_dense]),
                *(TensorSpec(n, "int64", ["batch", _axis("ids", n)]) for n in self.feature_names)]

    def outputs(self) -> list[TensorSpec]:
        return [TensorSpec("logits", "float32", ["batch"])]

    def example(self, batch: int, hot: int, seed: int) -> tuple[torch.Tensor, ...]:
        """Random dense features (B, Dd) and ids (B, `hot`) per feature within its vocabulary, some of them absent (-1);
        for a growing table, the first bag holds an id it met and one it never met (when it has both), so that a check
        on this batch sees how they pool together."""
        g = torch.Generator().manual_seed(seed)
        device = self.model.over_arch.mlp[0].weight.device
        ids = []
        for size, table in zip(self.sizes, self.tables):
            x = torch.randint(0, size, (batch, hot), generator=g)
            x = x.masked_fill(torch.rand(batch, hot, generator=g) < 0.3, -1)
            if table in self.met and hot >= 2:
                met = self.met[table][:size].cpu()
                known, unknown = met.nonzero().squeeze(1), (~met).nonzero().squeeze(1)
                if known.numel() and unknown.numel():
                    x[0, :2] = torch.stack([known[0], unknown[0]])
            ids.append(x)
        return tuple(t.to(device) for t in (torch.randn(batch, self.model.num_dense, generator=g), *ids))

    def eager(self, dense: torch.Tensor, *ids: torch.Tensor) -> torch.Tensor:
        """The model's own forward on the same inputs (through `SparseFeatures`): the reference."""
        return self.model(dense, SparseFeatures.from_dense(dict(zip(self.feature_names, ids))))

    def describe(self) -> dict[str, object]:
        return {
            "interaction": type(self.model.interaction).__name__,
            "dense_features": list(DENSE_FEATURES),  # the columns of `dense`, in order (docs/deploy.md says how)
            "ids": "one (B, H) int64 matrix per sparse feature, -1 = absent; H may vary",
            "ids_from_vocab": {  # a raw value -> its id: the i-th row (0-based) of its feature in the file is id i + first
                "file": VOCAB, "feature_column": "feature", "raw_column": "raw_id", "first": NUM_SPECIAL,
                "unseen": OOV, "padding": PAD, "absent": -1,
                "sizes": dict(zip(self.feature_names, self.sizes)),  # ids per feature; an id past them reads as unseen
            },
            "logits": "click logits (apply a sigmoid for probabilities)",
        }


def _met(table: nn.Module, rows: int) -> torch.Tensor:
    """(rows,) whether a growing table (`DynamicEmbeddingBag`) met each id, by id: the layout of `table_weight`."""
    met = torch.zeros(rows, dtype=torch.bool, device=table.sorted_keys.device)
    met[table.sorted_keys] = True
    return met


def _axis(prefix: str, name: str) -> str:
    """A symbolic axis name that is a Python identifier (torch.export's ``Dim`` needs one)."""
    return f"{prefix}_{re.sub(r'[^0-9a-zA-Z_]', '_', name)}"
