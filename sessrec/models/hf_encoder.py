"""`HFEncoder`: what the wrappers of Hugging Face encoders (BERT, ELECTRA, GPT-2, XLNet) share.

Sessions reach an HF model as embeddings (``inputs_embeds``), never as token ids. Each wrapper
keeps its own typed constructor (the recipe's config, with that model's defaults), the HF
configuration it builds and its forward; the base holds the rest:

- the width check, and the weight-init scale: ``d_model ** -0.5`` unless given. HF's 0.02 is
  sized for d_model ~ 1024: at d_model 64 it makes each attention block's output ~40x smaller
  than its residual, and the encoder learns item context far more slowly;
- `freeze`: parameters sessrec never reads (the word-embedding table, segment parameters) leave
  training, since data-parallel training requires every trained parameter to reach the loss;
- `one_position`: an HF absolute position table counts from the first column, which with
  right-aligned, left-padded sessions depends on the padding. It is reduced to one zero, frozen
  row that every position reads (`positions`); `SessionModel` adds the positions instead, counted
  from the session's end (bidirectional) or its first real item (causal).

Shape letters: B batch, L sequence, D model width.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import nn

from sessrec.saved.registry import Configurable, check_integers, check_probabilities


def check_encoder(
    owner: str, d_model: int, n_head: int, n_layer: int, dropout: float, d_inner: int | None = None,
    initializer_range: float | None = None,
) -> None:
    """Refuse an encoder's shape in one line naming `owner` and the setting: a width, head count or layer count
    below 1 (an encoder of no layers reads nothing of the session), `n_head` not dividing `d_model`, a
    dropout outside [0, 1) (a dropout of 1 zeroes every activation: nothing trains), a feed-forward width
    `d_inner` below 1 (None is the encoder's default), or an `initializer_range` that is no finite std >= 0."""
    check_integers({"d_model": d_model, "n_head": n_head, "n_layer": n_layer}, f"{owner} ")
    if d_inner is not None:
        check_integers({"d_inner": d_inner}, f"{owner} ")
    check_probabilities({"dropout": dropout}, f"{owner} ")
    if d_model % n_head:
        raise ValueError(f"{owner} d_model ({d_model}) must be a multiple of n_head ({n_head})")
    if initializer_range is not None and not (math.isfinite(initializer_range) and initializer_range >= 0):
        raise ValueError(f"{owner} initializer_range must be a finite std >= 0 or None, got {initializer_range!r}")


def symbolic() -> bool:
    """Traced, compiled or exported: no value of a tensor can be read (the checks on values are skipped) and
    shapes must not depend on the data."""
    return torch.jit.is_tracing() or torch.compiler.is_compiling() or torch.onnx.is_in_onnx_export()


class HFEncoder(nn.Module, Configurable):
    """Base of the HF encoder wrappers: (B, L, D) embeddings and (B, L) real positions -> (B, L, D).

    Args:
        d_model: model width D.
        n_head: attention heads; must divide `d_model`.
        n_layer: layers, at least one.
        dropout: the encoder's dropout probability, in [0, 1) (`check_encoder`).
        initializer_range: std of the weight init; None: ``d_model ** -0.5``.
        d_inner: the feed-forward width the wrapper builds, checked here (None: its default).
    """

    causal: ClassVar[bool] = False

    def __init__(
        self, d_model: int, n_head: int, n_layer: int, dropout: float, initializer_range: float | None,
        d_inner: int | None = None,
    ) -> None:
        super().__init__()
        check_encoder(type(self).__name__, d_model, n_head, n_layer, dropout, d_inner, initializer_range)
        self.d_model = d_model
        self.init_std = initializer_range if initializer_range is not None else d_model**-0.5

    @staticmethod
    def freeze(*params: nn.Parameter) -> None:
        """Keep parameters that sessrec never reads out of training."""
        for param in params:
            param.requires_grad_(False)

    @classmethod
    def one_position(cls, table: nn.Embedding) -> None:
        """Zero and freeze an HF absolute position table of one row (see the module docstring)."""
        nn.init.zeros_(table.weight)
        cls.freeze(table.weight)

    @staticmethod
    def positions(attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, L) position ids that all read the one zero row of `one_position`'s table."""
        return torch.zeros(attention_mask.shape, dtype=torch.long, device=attention_mask.device)
