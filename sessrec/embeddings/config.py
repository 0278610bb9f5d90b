"""Typed embedding-table configuration: `TableConfig`.

A table has a name, a number of rows, a width and a pooling mode, and is looked up by one or more
features (several features may share one table, e.g. "query item" and "history items").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sessrec.saved.registry import check_integers, register

POOLINGS = ("sum", "mean")


@register  # a saved DLRM's config builds it
@dataclass(frozen=True)
class TableConfig:
    """One embedding table.

    Args:
        name: table name, unique in a collection.
        num_embeddings: rows (ids 0 .. num_embeddings - 1).
        embedding_dim: width of each row (before any padding of the stored width).
        pooling: how the ids of one bag are combined: ``sum`` or ``mean`` (an empty bag gives zeros).
        feature_names: the features looked up in this table; ``()`` means ``(name,)``.

    Examples:
        >>> TableConfig("city", num_embeddings=1000, embedding_dim=16).features
        ('city',)
    """

    name: str
    num_embeddings: int
    embedding_dim: int
    pooling: Literal["sum", "mean"] = "sum"
    feature_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"table name must be a non-empty string, got {self.name!r}")
        check_integers({"num_embeddings": self.num_embeddings, "embedding_dim": self.embedding_dim}, f"table {self.name!r}: ")
        if self.pooling not in POOLINGS:
            raise ValueError(f"table {self.name!r}: pooling must be one of {POOLINGS}, got {self.pooling!r}")
        names = tuple(self.feature_names)
        if any(not isinstance(f, str) or not f for f in names):
            raise ValueError(f"table {self.name!r}: feature_names must be non-empty strings, got {names!r}")
        if len(set(names)) != len(names):
            raise ValueError(f"table {self.name!r}: feature_names has duplicates: {names!r}")
        object.__setattr__(self, "feature_names", names)  # a list from YAML becomes a tuple

    @property
    def features(self) -> tuple[str, ...]:
        """The features looked up in this table (``(name,)`` when none are given)."""
        return self.feature_names or (self.name,)
