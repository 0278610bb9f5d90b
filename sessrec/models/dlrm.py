"""DLRM (Naumov et al., 2019) from named parts, with DCNv2 (Wang et al., 2021) as the alternative interaction.

    dense (B, Dd) --DenseArch--> (B, D) --+
                                          +--InteractionArch (dot) or DCNv2Arch (cross)--> OverArch --> (B,) logit
    sparse ids --SparseArch--> (B, F, D) -+

`SparseArch` wraps the embedding core (`sessrec.embeddings.FusedEmbeddingBagCollection`), so all
tables of one width are looked up in one call and, with a fused optimizer, updated in backward.
`TorchRecSparseArch` holds the same tables in TorchRec's ``EmbeddingBagCollection`` instead
(the ``torchrec`` extra), which TorchRec's planner and ``DistributedModelParallel`` shard across
processes (`sessrec.tasks.TorchRecStrategy` does it in a Lightning run).

Shape letters: B batch, Dd dense input features, D embedding width (= the bottom MLP's output),
F sparse features, I interaction output width, H hidden width.

A `DLRM` saves itself with its vocabulary (``model.save_pretrained(directory, vocab)``, a
`RankingVocab`) and loads back with ``DLRM.from_pretrained(directory)`` (`sessrec.models.pretrained`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from sessrec.datasets.clickout_rows import RankingVocab
from sessrec.embeddings import FusedEmbeddingBagCollection, SparseFeatures, TableConfig
from sessrec.embeddings.dynamic import DynamicEmbeddingBag
from sessrec.embeddings.sharding import embedding_bag_collection, pooled_features, to_keyed_jagged_tensor
from sessrec.models.pretrained import (
    NETWORK,
    WEIGHTS,
    PretrainedNetwork,
    load_into,
    load_vocab,
    load_weights,
    under,
    with_prefix,
    write_model_directory,
)
from sessrec.saved.registry import Configurable, config_of, instantiate


def _mlp(in_features: int, layer_sizes: Sequence[int], last_activation: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, out in enumerate(layer_sizes):
        layers.append(nn.Linear(in_features, out))
        if last_activation or i < len(layer_sizes) - 1:
            layers.append(nn.ReLU())
        in_features = out
    return nn.Sequential(*layers)


class DenseArch(nn.Module):
    """Bottom MLP: (B, Dd) dense features -> (B, D), ReLU after every layer.

    Args:
        in_features: Dd.
        layer_sizes: widths of the layers; the last is D (must equal the embedding width).
    """

    def __init__(self, in_features: int, layer_sizes: Sequence[int]) -> None:
        super().__init__()
        if in_features < 1 or not layer_sizes or min(layer_sizes) < 1:
            raise ValueError(f"DenseArch needs in_features >= 1 and positive layer sizes, got {in_features}, {list(layer_sizes)}")
        self.mlp = _mlp(in_features, layer_sizes)

    def forward(self, dense: torch.Tensor) -> torch.Tensor:
        return self.mlp(dense)


def one_width(tables: Sequence[TableConfig]) -> int:
    """The embedding width D shared by all `tables` (the interactions multiply the features' vectors)."""
    dims = {t.embedding_dim for t in tables}
    if len(dims) != 1:
        raise ValueError(f"DLRM needs one embedding width for all tables (the dot interaction), got {sorted(dims)}")
    return dims.pop()


class SparseArch(nn.Module):
    """Pooled embeddings of every sparse feature, stacked: `SparseFeatures` -> (B, F, D).

    Args:
        tables: the tables (all of width D); features are stacked in the tables' feature order.
        optimizer: the embedding core's fused optimizer (``none``: tables are ordinary parameters).
        lr: the fused optimizer's learning rate.
        pad_to_bytes: the core's row padding.
        seed: seeds the tables' initial weights.
    """

    def __init__(
        self,
        tables: Sequence[TableConfig],
        optimizer: Literal["none", "sgd", "adagrad_rowwise"] = "none",
        lr: float = 0.01,
        pad_to_bytes: int | None = 16,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        self.embedding_dim = one_width(tables)
        self.collection = FusedEmbeddingBagCollection(tables, pad_to_bytes=pad_to_bytes, optimizer=optimizer, lr=lr, seed=seed)
        self.feature_names = self.collection.feature_names
        self.table_of = {f: t.name for t in tables for f in t.features}
        self.pooling = {t.name: t.pooling for t in tables}

    def table_weight(self, name: str) -> torch.Tensor:
        """(num_embeddings, D) rows of table `name`, row i for id i (a view of the fused weight)."""
        return self.collection.table_weight(name)

    def forward(self, features: SparseFeatures) -> torch.Tensor:
        pooled = self.collection(features)
        return torch.stack([pooled[f] for f in self.feature_names], dim=1)  # (B, F, D)


class TorchRecSparseArch(nn.Module):
    """`SparseArch` on TorchRec's ``EmbeddingBagCollection``: the tables TorchRec can shard.

    The tables are ordinary parameters (the dense optimizer updates them) and start from the
    same seeded draw as `SparseArch`'s (uniform in +-sqrt(1 / rows), table by table), so the two
    backends train alike. `shard_model` / `sessrec.tasks.TorchRecStrategy` replace the collection by
    its sharded version; the forward reads the pooled output by feature name, which a sharded
    collection reorders.

    Args:
        tables: the tables (all of width D); features are stacked in the tables' feature order.
        seed: seeds the tables' initial weights.
    """

    def __init__(self, tables: Sequence[TableConfig], seed: int | None = None) -> None:
        super().__init__()
        self.embedding_dim = one_width(tables)
        with torch.random.fork_rng(devices=[]):  # TorchRec's own init draws from the global generator
            self.collection = embedding_bag_collection(tables)
        self.feature_names = [f for t in tables for f in t.features]
        self.table_of = {f: t.name for t in tables for f in t.features}
        self.pooling = {t.name: t.pooling for t in tables}
        generator = torch.Generator()
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(seed)
        with torch.no_grad():
            for t in tables:
                bound = (1.0 / t.num_embeddings) ** 0.5
                self.collection.embedding_bags[t.name].weight.uniform_(-bound, bound, generator=generator)

    def table_weight(self, name: str) -> torch.Tensor:
        """(num_embeddings, D) rows of table `name` (of the unsharded collection)."""
        return self.collection.embedding_bags[name].weight

    def forward(self, features: SparseFeatures) -> torch.Tensor:
        pooled = pooled_features(self.collection(to_keyed_jagged_tensor(features)), self.feature_names)  # (B, F D)
        return pooled.view(-1, len(self.feature_names), self.embedding_dim)  # (B, F, D)


class DynamicSparseArch(nn.Module):
    """`SparseArch` on tables that grow: one `DynamicEmbeddingBag` per table, keyed by the ids themselves.

    An id a table has not seen gets a row the first time training looks it up (the learned rows
    stay as they are, the new one starts from the table's seeded initialisation); past `max_rows`
    rows the least used ones are evicted and reused. In eval mode an unseen id adds nothing to its
    bag. This is what lets a trained DLRM be retrained on a catalogue that has grown since
    (`sessrec.deploy.retrain`) with no rebuild of its tables.

    Args:
        tables: the tables (all of width D); ``num_embeddings`` is each table's initial capacity.
        optimizer: the fused optimizer applied in backward (``sgd`` or ``adagrad_rowwise``).
        lr: its learning rate.
        max_rows: the most rows a table grows to.
        seed: seeds the tables' row initialisation (table i with ``seed + i``).
    """

    def __init__(
        self,
        tables: Sequence[TableConfig],
        optimizer: Literal["sgd", "adagrad_rowwise"] = "adagrad_rowwise",
        lr: float = 0.01,
        max_rows: int = 1 << 20,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        if optimizer not in ("sgd", "adagrad_rowwise"):
            raise ValueError(f"growing tables are updated by the fused optimizer: use sgd or adagrad_rowwise, got {optimizer!r}")
        self.embedding_dim = one_width(tables)
        self.tables = nn.ModuleDict({
            t.name: DynamicEmbeddingBag(
                self.embedding_dim, initial_capacity=t.num_embeddings, max_capacity=max(max_rows, t.num_embeddings),
                pooling=t.pooling, optimizer=optimizer, lr=lr, seed=None if seed is None else seed + i,
            )
            for i, t in enumerate(tables)
        })
        self.table_of = {f: t.name for t in tables for f in t.features}
        self.pooling = {t.name: t.pooling for t in tables}
        self.feature_names = [f for t in tables for f in t.features]

    @torch.no_grad()
    def table_weight(self, name: str) -> torch.Tensor:
        """(K, D) rows of table `name` by id, as a fixed table: row i for id i, zeros for an id the
        table never met (absent, as in eval mode), and a last zero row for every id beyond."""
        table = self.tables[name]
        size = int(table.sorted_keys.max()) + 2 if table.num_keys else 1
        rows = table.weight.new_zeros(size, self.embedding_dim)
        rows[table.sorted_keys] = table.weight[table.sorted_rows]
        return rows

    def forward(self, features: SparseFeatures) -> torch.Tensor:
        b = features.batch_size
        lengths = features.lengths.view(len(features.keys), b)  # (F, B)
        per_feature = lengths.sum(dim=1).tolist()
        values = torch.split(features.values, per_feature)
        weights = torch.split(features.weights, per_feature) if features.weights is not None else None
        pooled = []
        for name in self.feature_names:
            k = features.keys.index(name)
            offsets = torch.cumsum(lengths[k], 0) - lengths[k]  # (B,) start of each bag
            pooled.append(self.tables[self.table_of[name]](values[k], offsets, None if weights is None else weights[k]))
        return torch.stack(pooled, dim=1)  # (B, F, D)


class InteractionArch(nn.Module):
    """Pairwise dot products of the dense vector and the F embeddings (upper triangle, no diagonal).

    Output (B, D + (F + 1) F / 2): the dense vector, then the dots of pairs (i < j) of
    ``[dense, e_1, ..., e_F]`` in row-major order.

    Examples:
        >>> arch = InteractionArch(num_sparse_features=2)
        >>> arch(torch.tensor([[1., 2.]]), torch.tensor([[[3., 4.], [0., 1.]]])).tolist()
        [[1.0, 2.0, 11.0, 2.0, 4.0]]
    """

    def __init__(self, num_sparse_features: int) -> None:
        super().__init__()
        n = num_sparse_features + 1
        rows, cols = torch.triu_indices(n, n, offset=1)
        self.register_buffer("rows", rows, persistent=False)
        self.register_buffer("cols", cols, persistent=False)

    def output_width(self, embedding_dim: int) -> int:
        return embedding_dim + self.rows.numel()

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        stacked = torch.cat([dense.unsqueeze(1), sparse], dim=1)  # (B, F + 1, D)
        dots = torch.bmm(stacked, stacked.transpose(1, 2))  # (B, F + 1, F + 1)
        return torch.cat([dense, dots[:, self.rows, self.cols]], dim=1)  # (B, I)


class DCNv2Arch(nn.Module):
    """DCNv2 low-rank cross layers over ``x0 = [dense, e_1, ..., e_F]`` flattened to (B, (F + 1) D).

    Each layer: ``x_{l+1} = x0 * (U_l (V_l x_l) + b_l) + x_l`` with V_l (rank x width) and
    U_l (width x rank). Output (B, (F + 1) D).

    Args:
        num_sparse_features: F.
        embedding_dim: D.
        num_layers: cross layers.
        rank: low rank of each layer's weight.
    """

    def __init__(self, num_sparse_features: int, embedding_dim: int, num_layers: int = 2, rank: int = 16) -> None:
        super().__init__()
        if num_layers < 1 or rank < 1:
            raise ValueError(f"DCNv2 needs num_layers >= 1 and rank >= 1, got {num_layers}, {rank}")
        width = (num_sparse_features + 1) * embedding_dim
        self.down = nn.ModuleList(nn.Linear(width, rank, bias=False) for _ in range(num_layers))
        self.up = nn.ModuleList(nn.Linear(rank, width) for _ in range(num_layers))
        self.width = width

    def output_width(self, embedding_dim: int) -> int:
        return self.width

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        x0 = torch.cat([dense.unsqueeze(1), sparse], dim=1).flatten(1)  # (B, (F + 1) D)
        x = x0
        for down, up in zip(self.down, self.up):
            x = x0 * up(down(x)) + x
        return x


class OverArch(nn.Module):
    """Top MLP: (B, I) -> (B,) logits; ReLU between layers, the last layer (width 1) linear.

    Args:
        in_features: I.
        layer_sizes: hidden widths before the final (H -> 1) layer.
    """

    def __init__(self, in_features: int, layer_sizes: Sequence[int]) -> None:
        super().__init__()
        self.mlp = _mlp(in_features, [*layer_sizes, 1], last_activation=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x).squeeze(1)


class DLRM(nn.Module, PretrainedNetwork, Configurable):
    """DLRM: bottom MLP on dense features, embeddings of sparse ones, an interaction and a top MLP.

    Args:
        num_dense: Dd, dense features per sample.
        tables: embedding tables (one width D for all).
        dense_layers: bottom MLP widths; the last must be D.
        over_layers: top MLP hidden widths (a final layer to one logit is added).
        interaction: ``dot`` (pairwise dots, `InteractionArch`) or ``dcn`` (`DCNv2Arch`).
        dcn_layers: DCNv2 cross layers.
        dcn_rank: DCNv2 low rank.
        embedding_optimizer: the embedding core's fused optimizer (``none``: tables are parameters
            for the dense optimizer).
        embedding_lr: its learning rate.
        pad_to_bytes: the core's row padding.
        seed: seeds the tables' initial weights (the MLPs follow torch's global seed).
        dynamic_tables: tables that grow with new ids and evict the least used rows
            (`DynamicSparseArch`), for retraining on a growing catalogue.
        max_rows: the most rows a growing table holds.
        sparse_backend: ``fused``: the embedding core (`SparseArch`, or `DynamicSparseArch`);
            ``torchrec``: TorchRec's ``EmbeddingBagCollection`` (`TorchRecSparseArch`), which can be
            sharded; its tables are parameters of the dense optimizer (``embedding_optimizer: none``).

    Examples:
        >>> model = DLRM(2, [TableConfig("city", 10, 4)], dense_layers=[8, 4], over_layers=[8])
        >>> model(torch.randn(3, 2), SparseFeatures.from_dense({"city": torch.tensor([1, 2, 3])})).shape
        torch.Size([3])
    """

    def __init__(
        self,
        num_dense: int,
        tables: Sequence[TableConfig],
        dense_layers: Sequence[int] = (64, 16),
        over_layers: Sequence[int] = (128, 64),
        interaction: Literal["dot", "dcn"] = "dot",
        dcn_layers: int = 2,
        dcn_rank: int = 16,
        embedding_optimizer: Literal["none", "sgd", "adagrad_rowwise"] = "none",
        embedding_lr: float = 0.01,
        pad_to_bytes: int | None = 16,
        seed: int | None = None,
        dynamic_tables: bool = False,
        max_rows: int = 1 << 20,
        sparse_backend: Literal["fused", "torchrec"] = "fused",
    ) -> None:
        super().__init__()
        if sparse_backend == "torchrec":
            if embedding_optimizer != "none" or dynamic_tables:
                raise ValueError(
                    "sparse_backend 'torchrec' trains its tables with the dense optimizer: set embedding_optimizer: none "
                    f"and dynamic_tables: false (got {embedding_optimizer!r}, {dynamic_tables})"
                )
            self.sparse_arch = TorchRecSparseArch(tables, seed)
        elif sparse_backend != "fused":
            raise ValueError(f"sparse_backend must be 'fused' or 'torchrec', got {sparse_backend!r}")
        elif dynamic_tables:
            self.sparse_arch = DynamicSparseArch(tables, embedding_optimizer, embedding_lr, max_rows, seed)
        else:
            self.sparse_arch = SparseArch(tables, embedding_optimizer, embedding_lr, pad_to_bytes, seed)
        d = self.sparse_arch.embedding_dim
        if not dense_layers or dense_layers[-1] != d:
            raise ValueError(
                f"the bottom MLP must end at the embedding width {d} (the dot interaction multiplies them), "
                f"got dense_layers={list(dense_layers)}; make its last entry {d}"
            )
        n_sparse = len(self.sparse_arch.feature_names)
        self.dense_arch = DenseArch(num_dense, dense_layers)
        if interaction == "dot":
            self.interaction = InteractionArch(n_sparse)
        elif interaction == "dcn":
            self.interaction = DCNv2Arch(n_sparse, d, dcn_layers, dcn_rank)
        else:
            raise ValueError(f"interaction must be 'dot' or 'dcn', got {interaction!r}")
        self.over_arch = OverArch(self.interaction.output_width(d), over_layers)
        self.num_dense = num_dense

    def forward(self, dense: torch.Tensor, sparse: SparseFeatures) -> torch.Tensor:
        """Logits (B,) from dense features (B, Dd) and the sparse features of the same B samples."""
        if dense.dim() != 2 or dense.shape[1] != self.num_dense:
            raise ValueError(f"dense features must be (B, {self.num_dense}), got shape {tuple(dense.shape)}")
        if sparse.batch_size != dense.shape[0]:
            raise ValueError(f"sparse features hold {sparse.batch_size} samples, dense {dense.shape[0]}")
        x = self.dense_arch(dense)  # (B, D)
        e = self.sparse_arch(sparse).to(x.dtype)  # (B, F, D)
        return self.over_arch(self.interaction(x, e))

    # -- model directories (`sessrec.models.pretrained`) --------------------------------------------
    def save_pretrained(self, directory: str | os.PathLike, vocab: RankingVocab | None = None) -> Path:
        """Write the model directory (a new version of an existing one) with the vocabulary of the
        sparse features' ids (default: the one it was loaded with); returns the folder written."""
        sections, weights = self.pretrained_parts()
        return write_model_directory(directory, sections, weights, vocab if vocab is not None else self.vocab)

    def pretrained_parts(self) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """The config section (``model``) and the weights (``model.*``) of a model directory."""
        return {"model": config_of(self)}, with_prefix(self.state_dict(), NETWORK)

    @classmethod
    def load_directory(cls, folder: Path, config: dict[str, Any], source: str) -> DLRM:
        model = instantiate(config.get("model"), expected=cls, source=source, key="model")
        load_into(model, under(load_weights(folder), NETWORK), str(folder / WEIGHTS))
        model.attach(load_vocab(folder, config, RankingVocab))
        return model.eval()
