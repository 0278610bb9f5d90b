"""Execute a `ShardingPlan` with TorchRec's `DistributedModelParallel` (the optional ``torchrec`` extra).

Our fused embedding core is the single-device default; this module is how a model outgrows one
device. It converts our types to TorchRec's and back:

- `TableConfig` -> ``EmbeddingBagConfig`` (`to_embedding_bag_configs`, `embedding_bag_collection`);
- `SparseFeatures` -> ``KeyedJaggedTensor`` (`to_keyed_jagged_tensor`; the same feature-major layout);
- `ShardingPlan` -> TorchRec's per-module ``ShardingPlan`` (`to_torchrec_plan`, through the helpers
  of ``torchrec.distributed.sharding_plan``: ``table_wise(rank)``, ``row_wise()``,
  ``column_wise(ranks)``, ``data_parallel()``);
- `shard_model` wraps a model holding ``EmbeddingBagCollection``s in ``DistributedModelParallel``;
  `load_full_state_dict` copies an unsharded state dict into the local shards, `full_state_dict`
  assembles the shards of all ranks into one (for a checkpoint any process can read);
- `pooled_features` reads a collection's pooled output by feature name: a sharded collection
  orders its output columns by sharding group, so ``KeyedTensor.values()`` depends on the plan.

TorchRec is imported inside the functions only, so ``import sessrec`` never needs it. Install it
with ``pip install 'sessrec[torchrec-deps]'`` and then, without dependencies so that pip keeps the local
torch, ``pip install --no-deps torchrec==1.9.2 fbgemm-gpu-cpu==1.8.0 tensordict==0.15.3``
(docs/sharding.md).

Gradients: TorchRec divides the gradients of sharded tables by the world size in the backward
all-to-all, and DDP averages the dense ones, so with the global batch split evenly over W ranks
and a per-rank mean loss, W processes train like one process on the whole batch.

The optimizer of the tables: by default (``dense`` kernel) the sharded weights are ordinary
parameters that the user's optimizer steps with the rest of the model. To fuse the update into
the backward (TorchRec's ``fused`` kernel), call
``torchrec.optim.apply_optimizer_in_backward(opt_class, ebc.parameters(), {...})`` before
`shard_model` and give the dense optimizer only
``torchrec.optim.optimizers.in_backward_optimizer_filter(model.named_parameters())``.

Example (in every process of a gloo or nccl group)::

    plan = ShardingPlanner(world_size=2, device_memory_bytes=2**30, batch_size=512).plan(tables)
    model = MyModel(sparse=embedding_bag_collection(tables), ...)
    full = model.state_dict()
    sharded = shard_model(model, plan)
    load_full_state_dict(sharded, full)   # every rank starts from the same weights
    logits = sharded(to_keyed_jagged_tensor(features), dense)
    # and inside MyModel.forward: pooled_features(self.sparse(kjt), feature_names), not .values()
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from sessrec.embeddings.config import TableConfig
from sessrec.embeddings.jagged import SparseFeatures
from sessrec.embeddings.planner import ShardingPlan

if TYPE_CHECKING:
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
    from torchrec.distributed import DistributedModelParallel

INSTALL_HINT = (
    "TorchRec is missing or does not load: pip install 'sessrec[torchrec-deps]', then without dependencies "
    "pip install --no-deps torchrec==1.9.2 fbgemm-gpu-cpu==1.8.0 tensordict==0.15.3 (see docs/sharding.md; "
    "--no-deps keeps pip from replacing torch)"
)


def require_torchrec() -> Any:
    """Import and return the ``torchrec`` module, or raise an ImportError that says how to install it."""
    try:
        import torchrec
        import torchrec.distributed  # fbgemm's operators load here: a build that does not fit torch fails now
    except (ImportError, OSError) as err:  # OSError: an fbgemm-gpu-cpu build that does not fit this torch
        raise ImportError(f"{INSTALL_HINT}; the import failed with: {err}") from err
    return torchrec


def to_embedding_bag_configs(tables: Sequence[TableConfig]) -> list[EmbeddingBagConfig]:
    """Our table configs as TorchRec ``EmbeddingBagConfig``s (same names, rows, widths, pooling, features)."""
    torchrec = require_torchrec()
    pooling = {"sum": torchrec.PoolingType.SUM, "mean": torchrec.PoolingType.MEAN}
    return [
        torchrec.EmbeddingBagConfig(
            name=t.name, num_embeddings=t.num_embeddings, embedding_dim=t.embedding_dim,
            feature_names=list(t.features), pooling=pooling[t.pooling],
        )
        for t in tables
    ]


def embedding_bag_collection(
    tables: Sequence[TableConfig], device: torch.device | str | None = None, is_weighted: bool = False
) -> EmbeddingBagCollection:
    """A TorchRec ``EmbeddingBagCollection`` of our tables (the module that `shard_model` shards).

    Its forward takes a ``KeyedJaggedTensor`` and returns a ``KeyedTensor`` whose ``values()`` are
    (B, sum of F_t * D_t), the pooled features in table order.
    """
    torchrec = require_torchrec()
    return torchrec.EmbeddingBagCollection(
        tables=to_embedding_bag_configs(tables), is_weighted=is_weighted,
        device=torch.device(device) if device is not None else None,
    )


def to_keyed_jagged_tensor(features: SparseFeatures) -> KeyedJaggedTensor:
    """Our `SparseFeatures` as a ``KeyedJaggedTensor``: the layout is the same, nothing is copied."""
    if not isinstance(features, SparseFeatures):
        raise TypeError(f"to_keyed_jagged_tensor takes SparseFeatures, got {type(features).__name__}")
    torchrec = require_torchrec()
    return torchrec.KeyedJaggedTensor(
        keys=list(features.keys), values=features.values, lengths=features.lengths, weights=features.weights,
    )


def to_torchrec_plan(
    model: nn.Module, plan: ShardingPlan, world_size: int | None = None, local_size: int | None = None,
    device_type: str = "cpu",
) -> Any:
    """Our plan as TorchRec's ``ShardingPlan`` for every ``EmbeddingBagCollection`` in ``model``.

    Args:
        model: the unsharded model; each table of each ``EmbeddingBagCollection`` in it must be in ``plan``.
        plan: from `ShardingPlanner.plan`.
        world_size: ranks of the process group (default: ``plan.world_size``); must equal the plan's.
        local_size: ranks per host (default: ``world_size``, one host).
        device_type: ``"cpu"`` (gloo) or ``"cuda"`` (nccl).

    Returns:
        ``torchrec.distributed.types.ShardingPlan`` keyed by module path.

    Raises:
        ValueError: no collection in the model, a table missing from the plan, a world size that
            differs from the plan's, or a row-wise mean-pooled table beside tables placed otherwise
            in one collection (TorchRec 1.9 then divides those tables' sums by their bag lengths too).
    """
    require_torchrec()
    from torchrec import EmbeddingBagCollection
    from torchrec.distributed.sharding_plan import (
        column_wise,
        construct_module_sharding_plan,
        data_parallel,
        row_wise,
        table_wise,
    )
    from torchrec.distributed.types import ShardingPlan as TorchRecShardingPlan

    world_size = plan.world_size if world_size is None else world_size
    if world_size != plan.world_size:
        raise ValueError(
            f"the plan is for {plan.world_size} devices but the process group has {world_size}; "
            f"plan again with ShardingPlanner(world_size={world_size}, ...)"
        )
    collections = {n: m for n, m in model.named_modules() if isinstance(m, EmbeddingBagCollection)}
    if not collections:
        raise ValueError(f"{type(model).__name__} holds no torchrec EmbeddingBagCollection to shard")
    planned = {t.table for t in plan.tables}
    module_plans = {}
    for path, ebc in collections.items():
        configs = ebc.embedding_bag_configs()
        missing = [c.name for c in configs if c.name not in planned]
        if missing:
            raise ValueError(f"tables {missing} of the collection {path or '(root)'!r} are not in the plan {sorted(planned)}")
        placements = {c.name: plan[c.name].placement for c in configs}
        mean_rw = [c.name for c in configs if placements[c.name] == "row_wise" and c.pooling.value == "MEAN"]
        others = [n for n, p in placements.items() if p != "row_wise"]
        if mean_rw and others:
            raise ValueError(
                f"collection {path or '(root)'!r}: the mean-pooled tables {mean_rw} are row-wise while {others} "
                "are not; TorchRec 1.9 then divides the pooled sums of those by their bag lengths too. Place "
                "every table of this collection row-wise, put the mean-pooled tables in a collection of their "
                "own, or constrain them to another placement"
            )
        generators = {}
        for c in configs:
            p = plan[c.name]
            if p.placement == "table_wise":
                generators[c.name] = table_wise(rank=p.shards[0].rank)
            elif p.placement == "row_wise":
                generators[c.name] = row_wise()
            elif p.placement == "column_wise":
                generators[c.name] = column_wise(ranks=list(p.ranks))
            else:
                generators[c.name] = data_parallel()
        module_plans[path] = construct_module_sharding_plan(
            ebc, generators, local_size=local_size or world_size, world_size=world_size, device_type=device_type,
        )
    return TorchRecShardingPlan(module_plans)


def shard_model(
    model: nn.Module,
    plan: ShardingPlan,
    process_group: torch.distributed.ProcessGroup | None = None,
    device: torch.device | str | None = None,
) -> DistributedModelParallel:
    """Wrap ``model`` in TorchRec's ``DistributedModelParallel`` with our plan; call it in every rank.

    The embedding tables are sharded as planned; everything else is replicated and wrapped in DDP.
    The sharded tables start from TorchRec's own initialisation: use `load_full_state_dict` to start
    every rank from one set of weights.

    Args:
        model: an unsharded model holding one or more ``EmbeddingBagCollection``s.
        plan: from `ShardingPlanner.plan`, for the group's world size.
        process_group: default: the initialised default group (``torch.distributed.init_process_group``).
        device: where this rank computes: ``cpu`` (gloo) by default, ``cuda:<local rank>`` with nccl.

    Returns:
        The ``DistributedModelParallel`` module (call it like ``model``).
    """
    require_torchrec()
    import torch.distributed as dist
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.types import ShardingEnv

    if process_group is None:
        if not dist.is_initialized():
            raise ValueError("shard_model needs a process group: call torch.distributed.init_process_group first")
        process_group = dist.group.WORLD
    device = torch.device(device if device is not None else "cpu")
    world_size = dist.get_world_size(process_group)
    torchrec_plan = to_torchrec_plan(model, plan, world_size=world_size, device_type=device.type)
    return DistributedModelParallel(
        model, env=ShardingEnv.from_process_group(process_group), device=device, plan=torchrec_plan,
        sharders=[EmbeddingBagCollectionSharder()],
    )


def pooled_features(pooled: Any, keys: Sequence[str]) -> torch.Tensor:
    """(B, sum of widths) pooled embeddings of ``keys`` in that order, from an EBC's ``KeyedTensor``.

    Use this rather than ``KeyedTensor.values()``: a sharded collection returns its features
    grouped by sharding type and rank, not in the order of its tables, so ``values()`` of the same
    model changes its columns with the plan.
    """
    by_key = pooled.to_dict()
    missing = [k for k in keys if k not in by_key]
    if missing:
        raise KeyError(f"features {missing} are not in the pooled output, which has {sorted(by_key)}")
    return torch.cat([by_key[k] for k in keys], dim=1)


def load_full_state_dict(sharded: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Copy an unsharded state dict (e.g. ``model.state_dict()`` before `shard_model`) into ``sharded``.

    Each rank copies the rows and columns of its own shards; replicated tensors are copied whole.

    Raises:
        KeyError: a key of the sharded model is missing from ``state_dict``.
        ValueError: a tensor's full shape differs.
    """
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    with torch.no_grad():
        for key, target in sharded.state_dict().items():
            if key not in state_dict:
                raise KeyError(f"{key!r} of the sharded model is not in the state dict (keys: {sorted(state_dict)[:8]} ...)")
            source = state_dict[key]
            if tuple(target.shape) != tuple(source.shape):
                raise ValueError(f"{key!r}: the sharded model's full shape {tuple(target.shape)} differs from {tuple(source.shape)}")
            if isinstance(target, ShardedTensor):
                for shard in target.local_shards():
                    (r0, c0), (nr, nc) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                    shard.tensor.copy_(source[r0:r0 + nr, c0:c0 + nc])
            else:
                target.copy_(source)


def full_state_dict(state_dict: Mapping[str, Any], device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """``state_dict`` with every ``ShardedTensor`` assembled whole: the unsharded model's state dict.

    A collective: call it in every rank of the group (each rank writes its own shards into a
    zero tensor of the full shape, and a sum over ranks fills in the rest). Plain tensors (the
    replicated parts) are kept as they are. The inverse of `load_full_state_dict`.

    Args:
        state_dict: a sharded model's state dict.
        device: where the whole tensors are assembled (the group's device: ``cpu`` with gloo).
    """
    import torch.distributed as dist
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    full = {}
    for key, value in state_dict.items():
        if isinstance(value, ShardedTensor):
            whole = torch.zeros(value.size(), dtype=value.metadata().tensor_properties.dtype, device=device)
            for shard in value.local_shards():
                (r0, c0), (nr, nc) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                whole[r0:r0 + nr, c0:c0 + nc] = shard.tensor.detach()  # a rank may hold no shard of a table
            dist.all_reduce(whole, group=value._process_group)
            full[key] = whole
        else:
            full[key] = value
    return full
