"""GRU4Rec encoder (Hidasi et al., 2016): a `torch.nn.GRU` over the session's items.

Causal by construction (the state at i has read items <= i): trains with
`CausalLanguageModeling` and is read at the last item.

Left padding: the GRU must not run over the padding, or the state at the first real item would
depend on how much padding precedes it. Each row is left-aligned with one vectorized gather
(real positions first, in order), run as a packed sequence of its true length, and scattered
back to its right-aligned columns. Padding positions come back as zeros.

Shape letters: B batch, L sequence, D model width.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from sessrec.saved.registry import Configurable, check_integers, check_probabilities


class GRU4RecEncoder(nn.Module, Configurable):
    """GRU mapping (B, L, D) embeddings to (B, L, D) hidden states.

    Args:
        d_model: width D of the inputs and of the hidden state.
        n_layer: stacked GRU layers.
        dropout: dropout between stacked layers; with one layer there is none, and a dropout above 0
            is refused (`SessionModel`'s ``dropout`` drops the input embeddings).

    The GRU keeps PyTorch's init, uniform in ``±d_model ** -0.5``: already the scale that small
    widths need.
    """

    causal: ClassVar[bool] = True

    def __init__(self, d_model: int = 64, n_layer: int = 1, dropout: float = 0.0) -> None:
        super().__init__()
        check_integers({"d_model": d_model, "n_layer": n_layer}, "GRU4RecEncoder ")
        check_probabilities({"dropout": dropout}, "GRU4RecEncoder ")
        if dropout > 0 and n_layer == 1:
            raise ValueError(f"GRU4RecEncoder dropout {dropout} is applied between stacked layers, and n_layer is 1: set "
                             "n_layer 2 or more, or dropout 0.0 (SessionModel's dropout drops input embeddings)")
        self.d_model = d_model
        self.gru = nn.GRU(d_model, d_model, num_layers=n_layer, batch_first=True, dropout=dropout)

    def forward(self, embeddings: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, L, D) embeddings and (B, L) bool mask of real positions -> (B, L, D)."""
        b, length, d = embeddings.shape
        # column j of the left-aligned row is column order[:, j] of the input: real ones first, in order
        order = torch.argsort((~attention_mask).to(torch.uint8), dim=1, stable=True)  # (B, L)
        index = order.unsqueeze(-1).expand(b, length, d)
        left = embeddings.gather(1, index)  # (B, L, D)
        lengths = attention_mask.sum(dim=1).clamp(min=1).cpu()  # an empty row runs one step, discarded below
        packed = pack_padded_sequence(left, lengths, batch_first=True, enforce_sorted=False)
        out, _ = self.gru(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=length)  # (B, L, D), zeros past each length
        right = torch.empty_like(out).scatter_(1, index, out)
        return right * attention_mask.unsqueeze(-1).to(right.dtype)
