"""DLRM (Naumov et al., 2019) from named parts, with DCNv2 (Wang et al., 2021) as the alternative interaction.

    dense (B, Dd) --DenseArch--> (B, D) --+
                                          +--InteractionArch (dot) or DCNv2Arch (cross)--> OverArch --> (B,) logit
    sparse ids --SparseArch--> (B, F, D) -+

The sparse module is chosen by its config (`sessrec.embeddings.sparse_arch`): `FusedTables`
(the embedding core, `sessrec.embeddings.FusedEmbeddingBagCollection`: all tables of one width
looked up in one call and, with a fused optimizer, updated in backward), `DynamicTables` (tables
that grow with new ids), `HybridTables` (hot rows on the device, the rest in host memory) or
`TorchRecTables` (TorchRec's ``EmbeddingBagCollection``, the ``torchrec`` extra, which TorchRec's
planner and ``DistributedModelParallel`` shard across processes; `sessrec.tasks.TorchRecStrategy`
does it in a Lightning run).

Shape letters: B batch, Dd dense input features, D embedding width (= the bottom MLP's output),
F sparse features, I interaction output width, H hidden width.

The network holds no vocabulary and saves nothing itself: a trained one is saved with the
vocabulary of its sparse ids as a `sessrec.artifacts.ClickRanker`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import torch
from torch import nn

from sessrec.embeddings import SparseFeatures, TableConfig
from sessrec.embeddings.sparse_arch import (  # noqa: F401 - the sparse modules, importable from here too
    DynamicSparseArch,
    FusedTables,
    HybridSparseArch,
    SparseArch,
    SparseTables,
    TorchRecSparseArch,
    one_width,
)
from sessrec.saved.directory import loads_no_directory
from sessrec.saved.registry import Configurable


def _mlp(in_features: int, layer_sizes: Sequence[int], last_activation: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, out in enumerate(layer_sizes):
        layers.append(nn.Linear(in_features, out))
        if last_activation or i < len(layer_sizes) - 1:
            layers.append(nn.ReLU(inplace=True))  # on the Linear's fresh output: no second buffer
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
        self.register_buffer("pairs", rows * n + cols, persistent=False)  # positions in the flattened (F + 1, F + 1) dots

    def output_width(self, embedding_dim: int) -> int:
        return embedding_dim + self.pairs.numel()

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        stacked = torch.cat([dense.unsqueeze(1), sparse], dim=1)  # (B, F + 1, D)
        dots = torch.bmm(stacked, stacked.transpose(1, 2))  # (B, F + 1, F + 1)
        return torch.cat([dense, dots.flatten(1).index_select(1, self.pairs)], dim=1)  # (B, I)


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


class DLRM(nn.Module, Configurable):
    """DLRM: bottom MLP on dense features, embeddings of sparse ones, an interaction and a top MLP.

    Args:
        num_dense: Dd, dense features per sample.
        tables: embedding tables (one width D for all).
        dense_layers: bottom MLP widths; the last must be D.
        over_layers: top MLP hidden widths (a final layer to one logit is added).
        interaction: ``dot`` (pairwise dots, `InteractionArch`) or ``dcn`` (`DCNv2Arch`).
        dcn_layers: DCNv2 cross layers.
        dcn_rank: DCNv2 low rank.
        sparse: the module that holds the tables (`FusedTables`, `DynamicTables`, `HybridTables`,
            `TorchRecTables`); built as ``sparse_arch``.
        seed: seeds the tables' initial weights (the MLPs follow torch's global seed).

    Examples:
        >>> model = DLRM(2, [TableConfig("city", 10, 4)], dense_layers=[8, 4], over_layers=[8])
        >>> model(torch.randn(3, 2), SparseFeatures.from_dense({"city": torch.tensor([1, 2, 3])})).shape
        torch.Size([3])
    """

    from_pretrained = loads_no_directory("sessrec.artifacts.ClickRanker.from_pretrained({directory}).model")

    def __init__(
        self,
        num_dense: int,
        tables: Sequence[TableConfig],
        dense_layers: Sequence[int] = (64, 16),
        over_layers: Sequence[int] = (128, 64),
        interaction: Literal["dot", "dcn"] = "dot",
        dcn_layers: int = 2,
        dcn_rank: int = 16,
        *,
        sparse: SparseTables = FusedTables(),  # noqa: B008 - frozen
        seed: int | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(sparse, SparseTables):
            raise TypeError(
                f"sparse must be FusedTables, DynamicTables, HybridTables or TorchRecTables (sessrec.embeddings), got {sparse!r}"
            )
        self.sparse_arch = sparse.build(tables, seed)
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
        self._check(dense, sparse.batch_size)
        return self._over_embedded(dense, self.sparse_arch(sparse))

    def forward_one_id(self, dense: torch.Tensor, ids: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """`forward` of samples with exactly one id per sparse feature: logits (B,) from dense features
        (B, Dd) and each feature's (B,) ids.

        A bag of one id pools to its row (sum, mean and max alike), so with `SparseArch` tables each
        feature's rows are gathered from its table directly, without building `SparseFeatures` or
        calling the bag kernel: the same logits as `forward` for a fraction of its per-call cost
        (a request's few hundred rows). Other sparse modules run `forward`. The gathered rows
        give the tables a dense gradient: train with `forward`, whose sparse-gradient path
        `torch.optim.SparseAdam` needs.

        Raises:
            ValueError: ids of other features than the network's, not (B,), or outside their table.
        """
        self._check(dense)
        arch = self.sparse_arch
        if not isinstance(arch, SparseArch):
            return self.forward(dense, SparseFeatures.from_dense(dict(ids)))
        if sorted(ids) != sorted(arch.feature_names):
            raise ValueError(f"ids must hold the features {sorted(arch.feature_names)}, got {sorted(ids)}")
        bad = {name: tuple(i.shape) for name, i in ids.items() if i.shape != (dense.shape[0],)}
        if bad:
            raise ValueError(f"ids must be one per sample, shape ({dense.shape[0]},), got {bad}")
        rows = []
        for name in arch.feature_names:
            table = arch.table_weight(arch.table_of[name])
            try:
                rows.append(table.index_select(0, ids[name]))
            except (IndexError, RuntimeError) as error:  # checked by the gather itself: nothing to pay when in range
                raise ValueError(f"feature {name!r}: ids must lie in [0, {len(table)}), got "
                                 f"{int(ids[name].min())}..{int(ids[name].max())}") from error
        return self._over_embedded(dense, torch.stack(rows, dim=1))

    def _check(self, dense: torch.Tensor, batch: int | None = None) -> None:
        """Raise unless `dense` is (B, Dd) and, given, `batch` is B."""
        if dense.dim() != 2 or dense.shape[1] != self.num_dense:
            raise ValueError(f"dense features must be (B, {self.num_dense}), got shape {tuple(dense.shape)}")
        if batch is not None and batch != dense.shape[0]:
            raise ValueError(f"sparse features hold {batch} samples, dense {dense.shape[0]}")

    def _over_embedded(self, dense: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        """Logits (B,) from dense features (B, Dd) and the pooled embeddings (B, F, D)."""
        x = self.dense_arch(dense)  # (B, D)
        return self.over_arch(self.interaction(x, embedded.to(x.dtype)))
