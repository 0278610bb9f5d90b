"""Side information for the models: per-interaction features and per-item vectors.

`SideFeatures` (a data-module argument) names what the model sees beside the item ids:

- categorical columns of the session table (e.g. trivago's action type, platform, device),
  mapped to ids by `Categorify` (0 padding/null, 1 rare or unseen, 2..);
- continuous columns (e.g. the price of the clicked item), `LogNormalize`d; a null or
  non-finite value is *missing* and becomes 0 (the training mean after normalisation);
- time features from the ``timestamp`` list: ``since_prev`` (seconds since the previous event of
  the session; missing for the first) and ``dwell`` (seconds to the next event; missing for the
  last), log-normalised (`TIME_FEATURES` declares each);
- the position in the session (from its start) as a categorical id ``1 + min(position, cap - 1)``;
- pre-computed item vectors per modality (text, image ...), read from parquet and aligned with
  the vocabulary (see `read_item_vectors`).

The transforms are fitted on the training split only by `sessrec.features.SideFeatureTransform`
(feature ops sit above this package), applied to every split and to scored files, and saved as
one ``features.npz`` beside the checkpoint, as the vocabulary is; `FittedSideFeatures` is what the
data layer reads of them. `SideInfoSpec` is what the model needs to build its embedding tables;
the data module hands it to the model (a linked argument).

Shape letters: E events (flat, session after session), V vocabulary size, M vector width.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sessrec.data.columns import no_such
from sessrec.data.schema import SchemaError
from sessrec.data.vocab import NUM_SPECIAL, ItemVocab
from sessrec.saved.registry import register

TimeFeature = Literal["since_prev", "dwell"]
POSITION = "position"


@dataclass(frozen=True)
class TimeFeatureSpec:
    """A feature derived from the timestamps of a session.

    Args:
        description: what the value of an event is.
        looks_ahead: the value at an event depends on the event after it; the model then hides it
            wherever the next event is hidden or is the one to predict (`SideInfoSpec.looks_ahead`).
    """

    description: str
    looks_ahead: bool


TIME_FEATURES: dict[str, TimeFeatureSpec] = {
    "since_prev": TimeFeatureSpec("seconds since the previous event of the session", looks_ahead=False),
    "dwell": TimeFeatureSpec("seconds to the next event of the session", looks_ahead=True),
}


@register  # a model directory's data section builds it (the data module's side_features)
@dataclass
class SideFeatures:
    """Which side information the model gets (all empty: none).

    Args:
        categorical: list columns of the session table embedded as categories.
        continuous: list columns of numbers, log-normalised; nulls and non-finite values are missing values (0), a
            negative value is refused naming its session and event (`normalized` takes such columns).
        normalized: the continuous columns already normalised upstream (e.g. by NVTabular's
            ``Normalize``, negative values included): used as given, not log-normalised.
        time: features derived from the timestamps: ``since_prev``, ``dwell``.
        position: when > 0, the position in the session from its start, capped at this many
            categories.
        min_count: categories seen fewer times in training share the rare/unseen id 1.
        nulls: ``error`` refuses a null in a categorical column (the message names the file,
            column, session and row); ``pad`` maps nulls to the padding id 0.
        item_vectors: modality name -> parquet file with an ``item_id`` column and a ``vector``
            list column (one fixed-width float vector per item), e.g. text or image embeddings.
        looks_ahead: the categorical or continuous columns whose value at an event depends on the
            event after it (e.g. a precomputed time to the next click); the time features declare
            their own (`TIME_FEATURES`).
    """

    categorical: list[str] = field(default_factory=list)
    continuous: list[str] = field(default_factory=list)
    normalized: list[str] = field(default_factory=list)
    time: list[TimeFeature] = field(default_factory=list)
    position: int = 0
    min_count: int = 1
    nulls: Literal["error", "pad"] = "error"
    item_vectors: dict[str, str] = field(default_factory=dict)
    looks_ahead: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        names = self.sequence_features
        if len(set(names)) != len(names):
            raise ValueError(f"side feature names must be distinct, got {names}")
        bad = [t for t in self.time if t not in TIME_FEATURES]
        if bad:
            raise ValueError(f"unknown time feature {bad[0]!r}; use one of {sorted(TIME_FEATURES)}")
        given = [c for c in self.normalized if c not in self.continuous]
        if given:
            raise ValueError(f"normalized names {given[0]!r}, which is not a continuous side feature {self.continuous}")
        columns = [*self.categorical, *self.continuous]
        stray = [c for c in self.looks_ahead if c not in columns]
        if stray:
            raise ValueError(f"looks_ahead names {stray[0]!r}, which is not a categorical or continuous side feature {columns}")
        if self.position < 0 or self.min_count < 1:
            raise ValueError(f"position must be >= 0 and min_count >= 1, got {self.position}, {self.min_count}")
        if self.nulls not in ("error", "pad"):
            raise ValueError(f"nulls must be 'error' or 'pad', got {self.nulls!r}")

    @property
    def sequence_features(self) -> list[str]:
        """Names of the per-interaction features, as they appear in `SessionBatch.features`."""
        return [*self.categorical, *([POSITION] if self.position else []), *self.continuous, *self.time]

    @property
    def looks_ahead_features(self) -> list[str]:
        """The features whose value at an event depends on the event after it."""
        return [*self.looks_ahead, *(t for t in self.time if TIME_FEATURES[t].looks_ahead)]

    @property
    def enabled(self) -> bool:
        return bool(self.sequence_features or self.item_vectors)


@register  # a saved session model's config builds it (`SideInfoEmbedding`'s spec)
@dataclass
class SideInfoSpec:
    """Sizes the model needs to build its side-information layers.

    Args:
        categorical: feature name -> number of ids (padding and rare/unseen included).
        continuous: names of the continuous features.
        item_vectors: modality -> vector width M.
        looks_ahead: features whose value at an event depends on the event after it
            (`SideFeatures.looks_ahead_features`): the model hides them wherever the next event is
            hidden or is the one to predict, and evaluation hides them at the last input event.
    """

    categorical: dict[str, int] = field(default_factory=dict)
    continuous: list[str] = field(default_factory=list)
    item_vectors: dict[str, int] = field(default_factory=dict)
    looks_ahead: list[str] = field(default_factory=list)


class FittedSideFeatures(Protocol):
    """Side-feature transforms fitted on the training split, as the data layer reads them
    (`ScoringStream`); `sessrec.features.SideFeatureTransform` is the library's."""

    config: SideFeatures

    def transform(self, sessions: pa.Table, source: str = "<sessions>") -> dict[str, np.ndarray]:
        """Per-event features (E,) by name: int64 ids (categorical) or float32 (continuous, 0 = missing)."""
        ...


def read_item_vectors(path: str | os.PathLike, vocab: ItemVocab) -> tuple[np.ndarray, int]:
    """Item vectors aligned with the vocabulary.

    Args:
        path: parquet with an ``item_id`` column (raw ids, as in the event log) and a ``vector``
            column (a list of floats of one width per item).
        vocab: the fitted vocabulary.

    Returns:
        (V, M) float32 matrix whose row ``i`` is the vector of model id ``i`` (zeros for padding,
        OOV, virtual items and items without a vector), and the number of products that have one.
    """
    path = Path(path)
    if not path.exists():
        raise no_such(path, "item-vector file")
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as err:
        raise SchemaError(f"{path}: cannot be read as parquet: {err}") from err
    for col in ("item_id", "vector"):
        if col not in table.column_names:
            raise SchemaError(f"{path}: column {col!r} is missing; the file has columns {table.column_names}")
    vectors = table.column("vector").combine_chunks()
    if not (pa.types.is_list(vectors.type) or pa.types.is_fixed_size_list(vectors.type) or pa.types.is_large_list(vectors.type)):
        raise SchemaError(f"{path}: column 'vector' has dtype {vectors.type}, expected a list of floats per item")
    if vectors.null_count:
        row = int(np.flatnonzero(vectors.is_null().to_numpy(zero_copy_only=False))[0])
        raise SchemaError(f"{path}: column 'vector' is null at row {row} (item {table.column('item_id')[row].as_py()!r})")
    lengths = pc.list_value_length(vectors).to_numpy(zero_copy_only=False)
    if len(lengths) == 0 or lengths.min() != lengths.max() or lengths[0] == 0:
        row = int(np.flatnonzero(lengths != lengths[0])[0]) if len(lengths) and lengths.min() != lengths.max() else 0
        raise SchemaError(
            f"{path}: column 'vector' must hold non-empty vectors of one width; row {row} has {lengths[row] if len(lengths) else 0}"
            f" values, row 0 has {lengths[0] if len(lengths) else 0}"
        )
    flat = pc.list_flatten(vectors).cast(pa.float32()).to_numpy(zero_copy_only=False).reshape(len(lengths), -1)
    bad = ~np.isfinite(flat).all(axis=1)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise SchemaError(f"{path}: column 'vector' has a non-finite value at row {row} (item {table.column('item_id')[row].as_py()!r})")
    if pc.count_distinct(table.column("item_id")).as_py() != table.num_rows:
        counts = pc.value_counts(table.column("item_id").combine_chunks())
        dup = counts.field("values").filter(pc.greater(counts.field("counts"), 1))[0].as_py()
        raise SchemaError(f"{path}: column 'item_id' holds item {dup!r} more than once; give one vector per item")
    ids = vocab.encode(table.column("item_id")).ids
    usable = ids >= NUM_SPECIAL
    out = np.zeros((len(vocab), flat.shape[1]), dtype=np.float32)
    out[ids[usable]] = flat[usable]
    out[~vocab.recommendable()] = 0.0
    return out, int(usable.sum())
