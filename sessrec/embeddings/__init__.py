"""Embedding core: typed table configs, keyed jagged ids, fused tables with a fused sparse optimizer,
id hashing and frequency capping, dynamic (growing, evicting) tables, hybrid device/host placement,
host-memory advice (huge pages, keeping freed memory), the compiled SGD update (`kernels`),
a ranking model's sparse module chosen by a typed config (`sparse_arch`),
and, beyond one machine, a sharding planner executed through TorchRec (`sharding`).

Plain PyTorch (no Lightning); TorchRec is optional and imported only where it is used.
"""

from sessrec.embeddings.config import TableConfig
from sessrec.embeddings.dynamic import DynamicEmbeddingBag
from sessrec.embeddings.fused import FusedEmbeddingBagCollection
from sessrec.embeddings.hashing import FrequencyCap, IdHasher, hash_ids
from sessrec.embeddings.host_memory import advise_huge_pages, retain_freed_memory
from sessrec.embeddings.hybrid import HybridEmbeddingBag
from sessrec.embeddings.jagged import SparseFeatures
from sessrec.embeddings.planner import (
    DeviceLoad,
    Shard,
    ShardingPlan,
    ShardingPlanner,
    TableHotness,
    TablePlan,
)
from sessrec.embeddings.sharding import (
    embedding_bag_collection,
    full_state_dict,
    load_full_state_dict,
    pooled_features,
    shard_model,
    to_embedding_bag_configs,
    to_keyed_jagged_tensor,
    to_torchrec_plan,
)
from sessrec.embeddings.sparse_arch import (
    DynamicSparseArch,
    DynamicTables,
    FusedTables,
    HybridSparseArch,
    HybridTables,
    SparseArch,
    SparseTables,
    TorchRecSparseArch,
    TorchRecTables,
)

__all__ = [
    "DeviceLoad", "DynamicEmbeddingBag", "DynamicSparseArch", "DynamicTables", "FrequencyCap",
    "FusedEmbeddingBagCollection", "FusedTables", "HybridEmbeddingBag", "HybridSparseArch", "HybridTables",
    "IdHasher", "Shard", "ShardingPlan", "ShardingPlanner", "SparseArch", "SparseFeatures", "SparseTables",
    "TableConfig", "TableHotness", "TablePlan", "TorchRecSparseArch", "TorchRecTables", "advise_huge_pages", "embedding_bag_collection", "full_state_dict", "hash_ids", "load_full_state_dict",
    "pooled_features", "retain_freed_memory", "shard_model", "to_embedding_bag_configs",
    "to_keyed_jagged_tensor", "to_torchrec_plan",
]
