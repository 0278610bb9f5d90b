"""Embedding core: typed table configs, keyed jagged ids, fused tables with a fused sparse optimizer,
id hashing and frequency capping, dynamic (growing, evicting) tables and hybrid device/host placement.

Plain PyTorch (no Lightning); TorchRec is optional and imported only where it is used.
"""

from sessrec.embeddings.config import TableConfig
from sessrec.embeddings.dynamic import DynamicEmbeddingBag
from sessrec.embeddings.fused import FusedEmbeddingBagCollection
from sessrec.embeddings.hashing import FrequencyCap, IdHasher, hash_ids
from sessrec.embeddings.hybrid import HybridEmbeddingBag
from sessrec.embeddings.jagged import SparseFeatures

__all__ = [
    "DynamicEmbeddingBag", "FrequencyCap", "FusedEmbeddingBagCollection", "HybridEmbeddingBag", "IdHasher",
    "SparseFeatures", "TableConfig", "hash_ids",
]
