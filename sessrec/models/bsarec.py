"""BSARec-style encoder (Shin et al., AAAI 2024): causal self-attention beside a low-pass frequency branch.

Each block mixes two views of its input x: ``alpha * F(x) + (1 - alpha) * A(x)``, then a feed-forward,
each residual followed by a LayerNorm (post-LayerNorm, as BSARec's code). ``A`` is causal multi-head
attention (`sessrec.models.sasrec.SelfAttention`); ``F`` is the frequency branch: the session's low-frequency
part ``low`` (its `frequencies` lowest DFT bins over a window of `window` positions) plus the rest
scaled by a learned per-channel ``beta ** 2``, ``low + beta**2 (x - low)``, added to x.

The low pass is a fixed linear map over positions, ``P = irfft(keep * rfft(I))``, a symmetric projection.
BSARec filters its left-padded window whatever the padding holds; here a session's output depends neither
on its padding nor on the batch's width, in one of two spans (`span`): ``window``, the (W, W) map of a
window of W positions applied to the session right-aligned in it, padding read as 0 (a batch of width L
uses P's last L rows and columns; a session much shorter than W keeps little of itself in the low band);
``session``, the (n, n) map of the session's own n positions, so its trend over its own length is kept.
W must cover the longest input: ``max_length + 1`` for `MaskedItemModeling`, whose [MASK] slot follows
the items.

The branch reads every position of the window, later ones included, so the encoder is not causal
(``causal = False``): it trains with `MaskedItemModeling`, and ``last_item_prob=1`` with the data
module's ``train_prefixes`` gives BSARec's training rows (each prefix predicts its next item, hidden
behind [MASK]). Positions come from `SessionModel` (counted back from the last item).

Shape letters: B batch, L sequence, D model width, W window.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
from torch import nn

from sessrec.models.hf_encoder import check_encoder
from sessrec.models.sasrec import SelfAttention, causal_attention_mask, init_linear_layers
from sessrec.saved.registry import Configurable, check_integers, check_probabilities


def low_pass_matrix(window: int, frequencies: int) -> torch.Tensor:
    """(W, W) float32 P: ``P @ x`` keeps the `frequencies` lowest bins of the real DFT of x (W, ...) over the
    window, ``irfft(keep * rfft(x), n=W)``; symmetric, a projection (P @ P = P)."""
    spectrum = torch.fft.rfft(torch.eye(window, dtype=torch.float64), dim=0)  # (W // 2 + 1, W)
    spectrum[frequencies:] = 0
    return torch.fft.irfft(spectrum, n=window, dim=0).float()


def session_low_pass(window: int, frequencies: int) -> torch.Tensor:
    """(W + 1, W, W) float32: entry n holds `low_pass_matrix` (n, min(frequencies, n // 2 + 1)) in its last n
    rows and columns (a right-aligned session of n positions), zeros elsewhere; entry 0 is all zeros."""
    out = torch.zeros(window + 1, window, window)
    for n in range(1, window + 1):
        out[n, window - n :, window - n :] = low_pass_matrix(n, min(frequencies, n // 2 + 1))
    return out


class FrequencyBranch(nn.Module):
    """``LN(x + dropout(low + beta**2 (x - low)))`` with ``low`` the low pass of the real positions."""

    def __init__(self, d_model: int, window: int, frequencies: int, span: str, dropout: float, layer_norm_eps: float) -> None:
        super().__init__()
        self.span = span
        table = low_pass_matrix(window, frequencies) if span == "window" else session_low_pass(window, frequencies)
        self.register_buffer("low_pass", table, persistent=False)
        self.sqrt_beta = nn.Parameter(torch.randn(1, 1, d_model))
        self.dropout = nn.Dropout(dropout)
        self.norm = nn.LayerNorm(d_model, eps=layer_norm_eps)

    def forward(self, x: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """(B, L, D) and (B, L) bool real positions -> (B, L, D)."""
        length = x.shape[1]
        inputs = x * real.unsqueeze(-1).to(x.dtype)
        if self.span == "window":  # the window's last L positions: the right-aligned session
            low = torch.einsum("ij,bjd->bid", self.low_pass[-length:, -length:], inputs)
        else:  # each session's own map, by its length
            low = self.low_pass[:, -length:, -length:][real.sum(dim=1)] @ inputs  # (B, L, L) gathered
        return self.norm(x + self.dropout(low + self.sqrt_beta**2 * (x - low)))


class BSARecBlock(nn.Module):
    """``h = alpha F(x) + (1 - alpha) LN(x + dropout(A(x)))``, then ``LN(h + dropout(FFN(h)))``."""

    def __init__(self, d_model: int, n_head: int, d_inner: int, dropout: float, alpha: float, window: int,
                 frequencies: int, span: str, layer_norm_eps: float) -> None:
        super().__init__()
        self.alpha = alpha
        self.frequency = FrequencyBranch(d_model, window, frequencies, span, dropout, layer_norm_eps)
        self.attn = SelfAttention(d_model, n_head, dropout)
        self.attn_norm = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.ffn = nn.Sequential(nn.Linear(d_model, d_inner), nn.GELU(), nn.Linear(d_inner, d_model))
        self.ffn_norm = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, real: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        attended = self.attn_norm(x + self.dropout(self.attn(x, allowed)))
        h = self.alpha * self.frequency(x, real) + (1 - self.alpha) * attended
        return self.ffn_norm(h + self.dropout(self.ffn(h)))


class BSARecEncoder(nn.Module, Configurable):
    """Post-LayerNorm blocks of causal attention mixed with a low-pass frequency branch: (B, L, D) -> (B, L, D).

    Args:
        d_model: model width D.
        n_head: attention heads; must divide `d_model`.
        n_layer: blocks.
        d_inner: feed-forward width (default 4 * d_model).
        dropout: dropout on attention weights, on each branch and on the feed-forward.
        alpha: weight of the frequency branch against attention, in [0, 1].
        frequencies: DFT bins the low pass keeps, 1 (the window's mean) to W // 2 + 1 (every one);
            BSARec's ``c`` keeps ``c // 2 + 1`` (its c = 5: 3).
        window: W, positions the low pass is defined over; at least the longest input the encoder reads.
        span: ``window`` (the W-position window, padding as 0) or ``session`` (each session's own positions;
            a session of n keeps at most n // 2 + 1 bins).
        layer_norm_eps: LayerNorm epsilon.
        initializer_range: std of the Linear weights (biases start at zero); default ``d_model ** -0.5``.
    """

    causal: ClassVar[bool] = False  # the frequency branch reads later positions

    def __init__(
        self,
        d_model: int = 64,
        n_head: int = 1,
        n_layer: int = 2,
        d_inner: int | None = None,
        dropout: float = 0.5,
        alpha: float = 0.7,
        frequencies: int = 3,
        window: int = 51,
        span: Literal["window", "session"] = "window",
        layer_norm_eps: float = 1e-12,
        initializer_range: float | None = None,
    ) -> None:
        super().__init__()
        owner = type(self).__name__
        check_encoder(owner, d_model, n_head, n_layer, dropout, d_inner, initializer_range)
        check_integers({"window": window, "frequencies": frequencies}, f"{owner} ")
        check_probabilities({"alpha": alpha}, f"{owner} ", one=True)
        if span not in ("window", "session"):
            raise ValueError(f"{owner} span must be 'window' or 'session', got {span!r}")
        if frequencies > window // 2 + 1:
            raise ValueError(f"{owner} frequencies ({frequencies}) must be at most window // 2 + 1 = {window // 2 + 1}, "
                             f"the DFT bins of a window of {window}")
        self.d_model, self.window = d_model, window
        self.blocks = nn.ModuleList(
            BSARecBlock(d_model, n_head, d_inner or 4 * d_model, dropout, alpha, window, frequencies, span, layer_norm_eps)
            for _ in range(n_layer)
        )
        init_linear_layers(self, d_model, initializer_range)

    def forward(self, embeddings: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, L, D) embeddings and (B, L) bool mask of real positions -> (B, L, D); L at most `window`."""
        if embeddings.shape[1] > self.window:
            raise ValueError(f"BSARecEncoder reads at most window={self.window} positions, got sessions of "
                             f"{embeddings.shape[1]}: set window to the model's max_length (+ 1 for the [MASK] slot)")
        allowed = causal_attention_mask(attention_mask)
        x = embeddings
        for block in self.blocks:
            x = block(x, attention_mask, allowed)
        return x
