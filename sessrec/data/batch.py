"""`SessionBatch`: the one object that flows from the loader into models.

Shape letters: B sessions in the batch, L padded length.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import torch

# Item ids in the padded session matrices and their batches. int32 holds any catalogue up to
# 2**31 items and halves what the loader gathers per batch and copies to the device; embeddings
# and gathers take it as is, and the objectives widen only the few targets they pick to int64.
ITEM_DTYPE = np.dtype(np.int32)


@dataclass
class SessionBatch:
    """A batch of sessions for training and evaluating a model, right-aligned: the most recent item is
    in the last column.

    This is what `SessionLoader` yields and `SessionModel` / the tasks read: model ids (int32), the
    targets of evaluation, the rows' places in their source, side features. The pipeline's input
    is another type, `sessrec.pipeline.RequestSessions`: the sessions of a request (int64 ids, the
    request time, the whole history for filters, a per-request cache), never a training batch.

    Args:
        items: (B, L) int32 model item ids (`ITEM_DTYPE`; int64 accepted), 0 = padding on the left.
        targets: (B,) int64 next-item ids to predict after `items` (evaluation); None in training,
            where the objective chooses its own targets inside `items`.
        index: (B,) int64 row of each session in its source (maps predictions back to session ids).
        keys: raw session ids of the rows (batch scoring); host-side metadata, never moved.
        features: per-interaction side features by name, each (B, L) aligned with `items`
            (int64 ids for categorical features, 0 = padding; float32 for continuous ones,
            0 = padding or missing). None when the model uses no side information.
        times: (B, L) float64 event times in seconds since the epoch aligned with `items`
            (0 = padding), where the source has them and the reader was asked for them; else None.
    """

    items: torch.Tensor
    targets: torch.Tensor | None = None
    index: torch.Tensor | None = None
    keys: pa.Array | None = None
    features: dict[str, torch.Tensor] | None = None
    times: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.items.dim() != 2:
            raise ValueError(f"SessionBatch.items must be (B, L), got shape {tuple(self.items.shape)}")
        if self.targets is not None and self.targets.shape != self.items.shape[:1]:
            raise ValueError(f"targets shape {tuple(self.targets.shape)} does not match items {tuple(self.items.shape)}")
        if self.times is not None and self.times.shape != self.items.shape:
            raise ValueError(f"times shape {tuple(self.times.shape)} does not match items {tuple(self.items.shape)}")
        for name, value in (self.features or {}).items():
            if value.shape != self.items.shape:
                raise ValueError(
                    f"side feature {name!r} has shape {tuple(value.shape)}, items {tuple(self.items.shape)}: "
                    "features must be aligned with the items"
                )

    def __len__(self) -> int:
        return self.items.shape[0]

    @property
    def lengths(self) -> torch.Tensor:
        return (self.items != 0).sum(dim=1)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "SessionBatch":
        move = lambda t: None if t is None else t.to(device, non_blocking=non_blocking)  # noqa: E731
        feats = None if self.features is None else {k: move(v) for k, v in self.features.items()}
        return replace(self, items=move(self.items), targets=move(self.targets), index=move(self.index), features=feats,
                       times=move(self.times))

    def pin_memory(self) -> "SessionBatch":
        pin = lambda t: None if t is None else t.pin_memory()  # noqa: E731
        feats = None if self.features is None else {k: pin(v) for k, v in self.features.items()}
        return replace(self, items=pin(self.items), targets=pin(self.targets), index=pin(self.index), features=feats,
                       times=pin(self.times))
