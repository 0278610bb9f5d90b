"""Side information embedded beside the items: `SideInfoEmbedding`. Plain PyTorch.

Every input position gets its item embedding plus embeddings of its side features:

- categorical features (action type, device, position ...) from their own tables (id 0 = padding);
- continuous features (price, dwell time ...) either linearly (value x learned vector + bias)
  or as a *soft one-hot*: a softmax over K learned bins weights K learned vectors, so the
  embedding can vary non-linearly with the value;
- pre-computed item vectors per modality (text, image ...), looked up by item id, each
  L2-normalised and then passed through its own LayerNorm before it joins the others (the
  SIGIR'21 Coveo challenge lesson: modalities of different scales otherwise swamp each other).

They are aggregated by ``concat`` (item embedding and every feature embedding side by side, then
one linear projection to the model width D; its item block starts as the identity, so training
starts from the plain item model) or ``sum`` (feature embeddings summed element-wise, projected
to D and added to the item embedding). Positions that are padding or hidden ([MASK] slots, an
appended next-item slot) get no side information at all: a hidden position's features (e.g. the
price of the clicked hotel) would give its item away. A look-ahead feature (``dwell``, the time
to the next event) is also hidden where the next position is hidden, so the event before a
[MASK] slot never tells when the hidden event happened, in training as at evaluation.

Shape letters: B batch, L sequence, D model width, F feature width, K soft one-hot bins,
V items, M item-vector width.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from sessrec.data.side import SideInfoSpec
from sessrec.saved.registry import Configurable, register


@register
@dataclass
class SideInfoConfig:
    """How side information is embedded (the sizes come from the data: `SideInfoSpec`).

    Args:
        aggregation: ``concat`` (then a linear projection to D) or ``sum`` (element-wise, then
            projected to D and added to the item embedding).
        feature_dim: width F of each feature embedding.
        soft_one_hot_bins: K > 0 embeds continuous features as soft one-hot over K bins;
            0 embeds them linearly.
    """

    aggregation: Literal["concat", "sum"] = "concat"
    feature_dim: int = 16
    soft_one_hot_bins: int = 0

    def __post_init__(self) -> None:
        if self.aggregation not in ("concat", "sum"):
            raise ValueError(f"aggregation must be 'concat' or 'sum', got {self.aggregation!r}")
        if self.feature_dim < 1 or self.soft_one_hot_bins < 0:
            raise ValueError(f"need feature_dim >= 1 and soft_one_hot_bins >= 0, got {self.feature_dim}, {self.soft_one_hot_bins}")


class SoftOneHot(nn.Module):
    """(B, L) values -> (B, L, F): softmax over K bins of (value x w + b), times a (K, F) table."""

    def __init__(self, bins: int, dim: int) -> None:
        super().__init__()
        self.logits = nn.Linear(1, bins)
        self.table = nn.Parameter(torch.randn(bins, dim) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = torch.softmax(self.logits(x.unsqueeze(-1)), dim=-1)  # (B, L, K)
        return weights @ self.table


class LinearValue(nn.Module):
    """(B, L) values -> (B, L, F): value x learned vector + learned bias."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(dim) * 0.02)
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.unsqueeze(-1) * self.weight + self.bias


class ItemVectors(nn.Module):
    """Fixed pre-computed item vectors per modality -> (B, L, sum of M) normalised features.

    The (V, M) tables are buffers, saved with the model's state (a checkpoint carries them);
    fill them with `set_vectors`. Rows of padding, OOV, virtual items and items without a
    vector are zeros.
    """

    def __init__(self, num_items: int, widths: dict[str, int]) -> None:
        super().__init__()
        self.names = list(widths)
        for name, m in widths.items():
            self.register_buffer(f"table_{name}", torch.zeros(num_items, m))
        self.norms = nn.ModuleDict({name: nn.LayerNorm(m) for name, m in widths.items()})
        self.width = sum(widths.values())

    def set_vectors(self, name: str, vectors: torch.Tensor) -> None:
        """Copy (V, M) vectors of a modality in, L2-normalised per item (all-zero rows stay zero)."""
        table = getattr(self, f"table_{name}", None)
        if table is None:
            raise KeyError(f"no item-vector modality {name!r}; the model has {self.names}")
        if vectors.shape != table.shape:
            raise ValueError(f"item vectors {name!r} have shape {tuple(vectors.shape)}, the model expects {tuple(table.shape)}")
        with torch.no_grad():
            table.copy_(F.normalize(vectors.to(table), dim=-1))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        parts = [self.norms[name](getattr(self, f"table_{name}")[ids]) for name in self.names]  # (B, L, M) each
        return torch.cat(parts, dim=-1)


class SideInfoEmbedding(nn.Module, Configurable):
    """Combine item embeddings with side-feature embeddings into the encoder's input.

    Args:
        d_model: width D of the item embedding and of the output.
        num_items: V, rows of the item-vector tables.
        spec: feature names and sizes from the data (`SessionDataModule.side_info`).
        config: aggregation and feature widths.

    Examples:
        >>> spec = SideInfoSpec(categorical={"device": 5}, continuous=["price"])
        >>> side = SideInfoEmbedding(16, 100, spec)
        >>> x = torch.zeros(2, 3, 16)
        >>> feats = {"device": torch.tensor([[0, 2, 3], [2, 2, 4]]), "price": torch.zeros(2, 3)}
        >>> side(x, torch.ones(2, 3, dtype=torch.long), feats, torch.ones(2, 3, dtype=torch.bool)).shape
        torch.Size([2, 3, 16])
    """

    def __init__(self, d_model: int, num_items: int, spec: SideInfoSpec, config: SideInfoConfig = SideInfoConfig()) -> None:  # noqa: B008
        super().__init__()
        f = config.feature_dim
        self.aggregation = config.aggregation
        self.categorical = nn.ModuleDict({name: nn.Embedding(n, f, padding_idx=0) for name, n in spec.categorical.items()})
        for table in self.categorical.values():
            nn.init.normal_(table.weight, std=0.02)
            with torch.no_grad():
                table.weight[0].zero_()
        bins = config.soft_one_hot_bins
        self.continuous = nn.ModuleDict(
            {name: SoftOneHot(bins, f) if bins else LinearValue(f) for name in spec.continuous}
        )
        self.item_vectors = ItemVectors(num_items, spec.item_vectors) if spec.item_vectors else None
        vec = self.item_vectors.width if self.item_vectors is not None else 0
        n_features = len(self.categorical) + len(self.continuous)
        if self.aggregation == "concat":
            self.project = nn.Linear(d_model + n_features * f + vec, d_model)
            with torch.no_grad():  # item block = identity: training starts from the plain item model
                self.project.weight[:, :d_model].copy_(torch.eye(d_model))
                self.project.bias.zero_()
            self.vector_project = None
        else:
            self.project = nn.Linear(f, d_model)
            self.vector_project = nn.Linear(vec, f) if vec else None
        self.names = list(self.categorical) + list(self.continuous)
        self.looks_ahead = [n for n in spec.looks_ahead if n in self.names]

    def check_spec(self, spec: SideInfoSpec, source: str) -> None:
        """Refuse per-event features (`spec`, e.g. `SideFeatureTransform.spec`) that are not those the tables were
        built for: another feature, a categorical one with another number of ids, or other look-ahead features (the
        data hides their value at the last input event); one line naming `source`."""
        built = {n: t.num_embeddings for n, t in self.categorical.items()}
        given = {"continuous": sorted(spec.continuous), "categorical": sorted(spec.categorical)}
        if given != {"continuous": sorted(self.continuous), "categorical": sorted(built)}:
            raise ValueError(
                f"{source} do not match the model's: categorical {given['categorical']} and continuous "
                f"{given['continuous']} there, {sorted(built)} and {sorted(self.continuous)} in the network; "
                "score with the side_features it was trained with"
            )
        for name, size in spec.categorical.items():
            if size != built[name]:
                raise ValueError(
                    f"{source} do not match the model's: {name!r} has {size} ids there and {built[name]} in the "
                    "network; score with the side_features it was trained with"
                )
        if sorted(spec.looks_ahead) != sorted(self.looks_ahead):
            raise ValueError(
                f"{source} do not match the model's: look-ahead {sorted(spec.looks_ahead)} there, "
                f"{sorted(self.looks_ahead)} in the network; score with the side_features it was trained with"
            )

    def forward(
        self,
        item_embeddings: torch.Tensor,
        ids: torch.Tensor,
        features: dict[str, torch.Tensor] | None,
        visible: torch.Tensor,
        ahead_visible: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B, L, D) item (or [MASK]) embeddings, (B, L) ids, features (B, L) each, (B, L) bool visible -> (B, L, D).

        `visible` is False at padding and hidden positions: their side information is zeroed.
        `ahead_visible` (default: `visible`) says where the look-ahead features may be seen.
        """
        features = features or {}
        missing = [n for n in self.names if n not in features]
        if missing:
            raise ValueError(
                f"the model embeds side feature {missing[0]!r}, which the batch does not carry (it has "
                f"{sorted(features)}): train and score with the same side_features"
            )
        # zeroed by selection, not by a product: a value that is no number (a NaN at padding) is never read
        keep = visible.unsqueeze(-1)  # (B, L, 1)
        ahead = keep if ahead_visible is None else (ahead_visible & visible).unsqueeze(-1)
        parts = [self.categorical[n](features[n]) for n in self.categorical]  # (B, L, F) each
        parts += [self.continuous[n](features[n].to(item_embeddings.dtype)) for n in self.continuous]
        parts = [torch.where(ahead, p, 0.0) if n in self.looks_ahead else p for n, p in zip(self.names, parts)]
        if self.aggregation == "concat":
            if self.item_vectors is not None:
                parts.append(self.item_vectors(ids))
            side = torch.where(keep, torch.cat(parts, dim=-1), 0.0) if parts else item_embeddings[..., :0]
            return self.project(torch.cat([item_embeddings, side], dim=-1))
        total = torch.stack(parts).sum(dim=0) if parts else None  # (B, L, F)
        if self.vector_project is not None:
            vectors = self.vector_project(self.item_vectors(ids))
            total = vectors if total is None else total + vectors
        if total is None:
            return item_embeddings
        return item_embeddings + torch.where(keep, self.project(total), 0.0)
