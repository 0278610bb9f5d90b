"""A ranking model's sparse module, chosen by a typed config: `FusedTables`, `DynamicTables`, `HybridTables`, `TorchRecTables`.

Each config builds, from the tables, a module that maps `SparseFeatures` to the pooled embedding of
every feature, stacked: (B, F, D), in the tables' feature order. All four modules expose what a
`sessrec.models.DLRM`, its export (`sessrec.lifecycle.export`) and TorchRec's sharding read:

- ``embedding_dim`` (D), ``feature_names`` (the F features in output order), ``table_of``
  (feature -> table name) and ``pooling`` (table name -> ``sum`` / ``mean``);
- ``table_weight(name)``: the (rows, D) weights of a table, row i for id i.

=================  =========================  ===============================================================
config             module                     the tables
=================  =========================  ===============================================================
`FusedTables`      `SparseArch`               one fused weight per width; ``optimizer`` ``none``: parameters of
                                              the dense optimizer, else updated in backward (SGD, row-wise Adagrad)
`DynamicTables`    `DynamicSparseArch`        grow with new ids, evict the least used rows past ``max_rows``
                                              (what `sessrec.lifecycle.retrain.retrain_dlrm` warm-starts)
`HybridTables`     `HybridSparseArch`         the ``num_hot`` first ids of each table on the model's device,
                                              the rest in host memory (`HybridEmbeddingBag`)
`TorchRecTables`   `TorchRecSparseArch`       TorchRec's ``EmbeddingBagCollection`` (the ``torchrec`` extra),
                                              which `sessrec.tasks.TorchRecStrategy` shards
=================  =========================  ===============================================================

A config is a frozen dataclass, so a saved model records it as plain data
(`sessrec.saved.registry.config_of`) and a recipe gives it as
``sparse: {class_path: sessrec.embeddings.HybridTables, init_args: {num_hot: 100000}}``.

Shape letters: B batch, F features, D embedding width.

Examples:
    >>> tables = [TableConfig("city", 10, 4), TableConfig("tags", 7, 4, pooling="mean")]
    >>> arch = HybridTables(num_hot=3).build(tables, seed=0)
    >>> arch(SparseFeatures.from_dense({"city": torch.tensor([1, 9]), "tags": torch.tensor([[0, 6], [2, -1]])})).shape
    torch.Size([2, 2, 4])
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from sessrec.embeddings.config import TableConfig
from sessrec.embeddings.dynamic import DynamicEmbeddingBag
from sessrec.embeddings.fused import FusedEmbeddingBagCollection, seeded_generator
from sessrec.embeddings.hybrid import HybridEmbeddingBag
from sessrec.embeddings.jagged import SparseFeatures
from sessrec.embeddings.sharding import embedding_bag_collection, pooled_features, to_keyed_jagged_tensor
from sessrec.saved.registry import check_integers, instantiate, register


def one_width(tables: Sequence[TableConfig]) -> int:
    """The embedding width D shared by all `tables` (the interactions multiply the features' vectors)."""
    dims = {t.embedding_dim for t in tables}
    if len(dims) != 1:
        raise ValueError(f"DLRM needs one embedding width for all tables (the dot interaction), got {sorted(dims)}")
    return dims.pop()


class _Stacked(nn.Module):
    """What the four modules share: the tables' features, their tables and poolings, and the forward of
    the modules with one bag module per table (``tables``: table name -> module(values, offsets, weights))."""

    bounded = True  # whether a table's ids end at its rows (a growing table takes any id)

    def __init__(self, tables: Sequence[TableConfig]) -> None:
        super().__init__()
        self.embedding_dim = one_width(tables)
        self.feature_names = [f for t in tables for f in t.features]
        self.table_of = {f: t.name for t in tables for f in t.features}
        self.pooling = {t.name: t.pooling for t in tables}
        self.table_rows = {t.name: t.num_embeddings for t in tables}

    def _check(self, features: SparseFeatures) -> None:
        """Refuse features these tables do not look up, missing ones and, with ``bounded`` tables, an id past its
        table's rows, naming the feature, the table and the id."""
        unknown = [k for k in features.keys if k not in self.table_of]
        if unknown:
            raise ValueError(f"unknown feature keys {unknown}; these tables look up {list(self.feature_names)}")
        missing = [f for f in self.feature_names if f not in features.keys]
        if missing:
            raise ValueError(f"features {missing} are missing from the batch (got {list(features.keys)})")
        if self.bounded and features.values.numel():
            rows = torch.tensor([self.table_rows[self.table_of[k]] for k in features.keys], device=features.values.device)
            limit = torch.repeat_interleave(rows, features.feature_lengths(), output_size=features.values.numel())  # (T,)
            bad = (features.values >= limit).nonzero()
            if bad.numel():
                first = int(bad[0, 0])
                key = features.keys[bisect_right(features.feature_lengths().cumsum(0).tolist(), first)]
                table = self.table_of[key]
                raise ValueError(
                    f"feature {key!r}: id {int(features.values[first])} out of range for table {table!r} with "
                    f"{self.table_rows[table]} rows (ids must be 0..{self.table_rows[table] - 1})"
                )

    def forward(self, features: SparseFeatures) -> torch.Tensor:
        """(B, F, D): each feature pooled by its table's bag module, one call per feature."""
        self._check(features)
        b = features.batch_size
        lengths = features.lengths.view(len(features.keys), b)  # (F, B)
        per_feature = lengths.sum(dim=1).tolist()
        values = torch.split(features.values, per_feature)
        weights = torch.split(features.weights, per_feature) if features.weights is not None else None
        pooled = []
        for name in self.feature_names:
            k = features.keys.index(name)
            offsets = torch.cumsum(lengths[k], 0) - lengths[k]  # (B,) start of each bag
            table = self.tables[self.table_of[name]]
            pooled.append(table(values[k], offsets, None if weights is None else weights[k]))
        return torch.stack(pooled, dim=1)  # (B, F, D)


class SparseArch(_Stacked):
    """Pooled embeddings of every sparse feature, stacked, from one `FusedEmbeddingBagCollection`.

    Args:
        tables: the tables (all of width D); features are stacked in the tables' feature order.
        optimizer: the collection's fused optimizer (``none``: tables are ordinary parameters).
        lr: the fused optimizer's learning rate.
        sparse_gradient: with ``none``, the tables' gradients are sparse (the rows a batch looked up).
        pad_to_bytes: the collection's row padding.
        seed: seeds the tables' initial weights.
    """

    def __init__(
        self,
        tables: Sequence[TableConfig],
        optimizer: Literal["none", "sgd", "adagrad_rowwise"] = "none",
        lr: float = 0.01,
        pad_to_bytes: int | None = 16,
        seed: int | None = None,
        sparse_gradient: bool = False,
    ) -> None:
        super().__init__(tables)
        self.collection = FusedEmbeddingBagCollection(
            tables, pad_to_bytes=pad_to_bytes, optimizer=optimizer, sparse_gradient=sparse_gradient, lr=lr, seed=seed
        )
        self.feature_names = self.collection.feature_names

    def table_weight(self, name: str) -> torch.Tensor:
        """(num_embeddings, D) rows of table `name`, row i for id i (a view of the fused weight)."""
        return self.collection.table_weight(name)

    def forward(self, features: SparseFeatures) -> torch.Tensor:
        pooled = self.collection(features)
        return torch.stack([pooled[f] for f in self.feature_names], dim=1)  # (B, F, D)


class DynamicSparseArch(_Stacked):
    """Tables that grow: one `DynamicEmbeddingBag` per table, keyed by the ids themselves.

    An id a table has not seen gets a row the first time training looks it up (the learned rows
    stay as they are, the new one starts from the table's seeded initialisation); past `max_rows`
    rows the least used ones are evicted and reused. In eval mode an unseen id adds nothing to its
    bag. This is what lets a trained DLRM be retrained on a catalogue that has grown since
    (`sessrec.lifecycle.retrain`) with no rebuild of its tables.

    Args:
        tables: the tables (all of width D); ``num_embeddings`` is each table's initial capacity.
        optimizer: the fused optimizer applied in backward (``sgd`` or ``adagrad_rowwise``).
        lr: its learning rate.
        max_rows: the most rows a table grows to (at least every table's ``num_embeddings``).
        seed: seeds the tables' row initialisation (table i with ``seed + i``).
    """

    bounded = False

    def __init__(
        self,
        tables: Sequence[TableConfig],
        optimizer: Literal["sgd", "adagrad_rowwise"] = "adagrad_rowwise",
        lr: float = 0.01,
        max_rows: int = 1 << 20,
        seed: int | None = None,
    ) -> None:
        super().__init__(tables)
        if optimizer not in ("sgd", "adagrad_rowwise"):
            raise ValueError(f"growing tables are updated by the fused optimizer: use sgd or adagrad_rowwise, got {optimizer!r}")
        for t in tables:
            if t.num_embeddings > max_rows:
                raise ValueError(f"table {t.name!r} starts with {t.num_embeddings} rows, more than max_rows={max_rows}; "
                                 f"raise max_rows to at least {t.num_embeddings}")
        self.tables = nn.ModuleDict({
            t.name: DynamicEmbeddingBag(
                self.embedding_dim, initial_capacity=t.num_embeddings, max_capacity=max_rows,
                pooling=t.pooling, optimizer=optimizer, lr=lr, seed=None if seed is None else seed + i,
            )
            for i, t in enumerate(tables)
        })

    @torch.no_grad()
    def table_weight(self, name: str) -> torch.Tensor:
        """(K, D) rows of table `name` by id, as a fixed table: row i for id i, zeros for an id the
        table never met (absent, as in eval mode), and a last zero row for every id beyond."""
        table = self.tables[name]
        size = int(table.sorted_keys.max()) + 2 if table.num_keys else 1
        rows = table.weight.new_zeros(size, self.embedding_dim)
        rows[table.sorted_keys] = table.weight[table.sorted_rows]
        return rows


class HybridSparseArch(_Stacked):
    """Tables split between the model's device and host memory: one `HybridEmbeddingBag` per table.

    The `num_hot` first ids of each table (all its rows when it has fewer) live on the model's
    device, the others in host memory, where their part of each bag is pooled; only the (B, D)
    pooled cold part crosses to the device. A vocabulary numbers ids by decreasing training count
    (`sessrec.data.ItemVocab`), so the first ids are the most frequent. The tables are ordinary
    parameters of the dense optimizer, and the outputs and gradients are those of one table
    holding all rows (`FusedTables` with ``optimizer: none``).

    Args:
        tables: the tables (all of width D); features are stacked in the tables' feature order.
        num_hot: rows of each table kept on the device.
        seed: seeds the tables' initial weights (table i with ``seed + i``).
    """

    def __init__(self, tables: Sequence[TableConfig], num_hot: int, seed: int | None = None) -> None:
        super().__init__(tables)
        self.tables = nn.ModuleDict({
            t.name: HybridEmbeddingBag(t.num_embeddings, t.embedding_dim, min(num_hot, t.num_embeddings),
                                       pooling=t.pooling, seed=None if seed is None else seed + i)
            for i, t in enumerate(tables)
        })

    def table_weight(self, name: str) -> torch.Tensor:
        """(num_embeddings, D) rows of table `name` in id order (a copy gathered from both parts)."""
        return self.tables[name].full_weight()


class TorchRecSparseArch(_Stacked):
    """The tables in TorchRec's ``EmbeddingBagCollection``: the tables TorchRec can shard.

    The tables are ordinary parameters (the dense optimizer updates them) and start from the
    same seeded draw as `SparseArch`'s (uniform in +-sqrt(1 / rows), table by table), so the two
    train alike. Ids with per-id weights are refused (the collection is unweighted). `shard_model` / `sessrec.tasks.TorchRecStrategy` replace the collection by its
    sharded version; the forward reads the pooled output by feature name, which a sharded
    collection reorders.

    Args:
        tables: the tables (all of width D); features are stacked in the tables' feature order.
        seed: seeds the tables' initial weights.
    """

    def __init__(self, tables: Sequence[TableConfig], seed: int | None = None) -> None:
        super().__init__(tables)
        with torch.random.fork_rng(devices=[]):  # TorchRec's own init draws from the global generator
            self.collection = embedding_bag_collection(tables)
        generator = seeded_generator(seed)
        with torch.no_grad():
            for t in tables:
                bound = (1.0 / t.num_embeddings) ** 0.5
                self.collection.embedding_bags[t.name].weight.uniform_(-bound, bound, generator=generator)

    def table_weight(self, name: str) -> torch.Tensor:
        """(num_embeddings, D) rows of table `name` (of the unsharded collection)."""
        return self.collection.embedding_bags[name].weight

    def forward(self, features: SparseFeatures) -> torch.Tensor:
        self._check(features)
        if features.weights is not None:  # the unweighted collection would pool the ids as if unweighted
            raise ValueError(
                f"TorchRecTables take no per-id weights; the batch has weights for {list(features.keys)} "
                "(use FusedTables, DynamicTables or HybridTables for weighted ids)"
            )
        pooled = pooled_features(self.collection(to_keyed_jagged_tensor(features)), self.feature_names)  # (B, F D)
        return pooled.view(-1, len(self.feature_names), self.embedding_dim)  # (B, F, D)


# -- the configs -------------------------------------------------------------------------------------
class SparseTables:
    """The base of the sparse-module configs: ``build(tables, seed)`` gives the module."""

    fused_update = False  # whether backward updates the tables itself (the dense optimizer never sees them)

    def build(self, tables: Sequence[TableConfig], seed: int | None = None) -> nn.Module:
        """The module holding `tables` (seeded by `seed`): `SparseFeatures` -> (B, F, D)."""
        raise NotImplementedError

    @classmethod
    def of(cls, value: SparseTables | dict[str, Any]) -> SparseTables:
        """`value` as a config: an instance as it is, or the ``{"class_path", "init_args"}`` a saved model holds."""
        if isinstance(value, SparseTables):
            return value
        if isinstance(value, dict) and "class_path" in value:
            return instantiate(value, expected=SparseTables, source="the sparse setting", key="sparse")
        raise TypeError(f"sparse must be FusedTables, DynamicTables, HybridTables or TorchRecTables, got {value!r}")


@register
@dataclass(frozen=True)
class FusedTables(SparseTables):
    """All tables of one width in one fused weight (`SparseArch`, `FusedEmbeddingBagCollection`).

    Args:
        optimizer: ``none``: the tables are parameters of the dense optimizer; ``sgd`` or
            ``adagrad_rowwise``: backward updates the rows it touched (data-parallel training
            then refuses it: each process's tables would drift apart).
        lr: the learning rate of that update.
        pad_to_bytes: rows padded to a multiple of this many bytes.
        sparse_gradient: with ``none``, the tables' gradients are sparse tensors of the rows each batch
            looked up, for an optimizer of sparse gradients (``torch.optim.SparseAdam``).
    """

    optimizer: Literal["none", "sgd", "adagrad_rowwise"] = "none"
    lr: float = 0.01
    pad_to_bytes: int | None = 16
    sparse_gradient: bool = False

    def __post_init__(self) -> None:
        if self.optimizer not in ("none", "sgd", "adagrad_rowwise"):
            raise ValueError(f"FusedTables optimizer must be 'none', 'sgd' or 'adagrad_rowwise', got {self.optimizer!r}")
        if self.sparse_gradient and self.optimizer != "none":
            raise ValueError(f"FusedTables sparse_gradient needs optimizer 'none' (an outer optimizer), got {self.optimizer!r}")

    @property
    def fused_update(self) -> bool:  # type: ignore[override]
        return self.optimizer != "none"

    def build(self, tables: Sequence[TableConfig], seed: int | None = None) -> SparseArch:
        return SparseArch(tables, self.optimizer, self.lr, self.pad_to_bytes, seed, self.sparse_gradient)


@register
@dataclass(frozen=True)
class DynamicTables(SparseTables):
    """Tables that grow with new ids and evict the least used rows (`DynamicSparseArch`).

    Args:
        optimizer: the update backward applies: ``sgd`` or ``adagrad_rowwise``.
        lr: its learning rate.
        max_rows: the most rows a table grows to.
    """

    optimizer: Literal["sgd", "adagrad_rowwise"] = "adagrad_rowwise"
    lr: float = 0.01
    max_rows: int = 1 << 20
    fused_update = True

    def build(self, tables: Sequence[TableConfig], seed: int | None = None) -> DynamicSparseArch:
        return DynamicSparseArch(tables, self.optimizer, self.lr, self.max_rows, seed)


@register
@dataclass(frozen=True)
class HybridTables(SparseTables):
    """The first `num_hot` ids of each table on the model's device, the rest in host memory (`HybridSparseArch`).

    Args:
        num_hot: rows of each table kept on the device (a table with fewer keeps all of them there).
    """

    num_hot: int

    def __post_init__(self) -> None:
        check_integers({"num_hot": self.num_hot}, "HybridTables ", minimum=0)

    def build(self, tables: Sequence[TableConfig], seed: int | None = None) -> HybridSparseArch:
        return HybridSparseArch(tables, self.num_hot, seed)


@register
@dataclass(frozen=True)
class TorchRecTables(SparseTables):
    """The tables in TorchRec's ``EmbeddingBagCollection`` (`TorchRecSparseArch`; the ``torchrec`` extra),
    updated by the dense optimizer, which `sessrec.tasks.TorchRecStrategy` shards across processes."""

    def build(self, tables: Sequence[TableConfig], seed: int | None = None) -> TorchRecSparseArch:
        return TorchRecSparseArch(tables, seed)
