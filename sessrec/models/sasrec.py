"""SASRec-style causal self-attention encoder (Kang & McAuley, 2018) on PyTorch's fused attention.

A compact transformer written directly on `torch.nn.functional.scaled_dot_product_attention`:
pre-LayerNorm blocks (attention, then a position-wise feed-forward, each added to its residual)
and a final LayerNorm. Two settings give eSASRec's layer (Tikhonovich et al., RecSys 2025, after LiGR,
Gupta et al. 2025): ``gated`` multiplies each branch by a sigmoid gate read from the block's input
(``x + sigmoid(W x) * branch``), and ``feed_forward="swiglu"`` is the gated SiLU feed-forward
(``W2 (silu(W1 x) * W3 x)``, no biases) in place of GELU. Causal: position i attends to real positions <= i, so it trains with
`CausalLanguageModeling` and is read at the last item. Positions come from `SessionModel`
(counted from the first real item).

Left padding: a padding row would attend to nothing, and the softmax of an empty row is NaN,
which would then spread through the value products of the next layer. Each padding row may
therefore attend to itself; real rows never see padding, so their outputs do not depend on it.

Shape letters: B batch, L sequence, D model width, H heads, E head width (D / H).
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import nn

from sessrec.models.hf_encoder import check_encoder
from sessrec.saved.registry import Configurable, check_switches


def causal_attention_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, L) bool real positions -> (B, 1, L, L) bool: query i may attend to key j.

    j <= i and j real; a padding row attends to itself only, so no row is empty.
    """
    length = attention_mask.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=attention_mask.device).tril()
    allowed = causal & attention_mask[:, None, :]  # (B, L, L)
    allowed |= torch.eye(length, dtype=torch.bool, device=attention_mask.device) & ~attention_mask[:, :, None]
    return allowed[:, None]


def init_linear_layers(module: nn.Module, d_model: int, initializer_range: float | None) -> None:
    """Every `nn.Linear` inside `module`: weights normal with std `initializer_range` (None: ``d_model ** -0.5``),
    biases zero. The attention encoders' initialisation (SASRec, HSTU)."""
    std = initializer_range if initializer_range is not None else d_model**-0.5
    for layer in module.modules():
        if isinstance(layer, nn.Linear):
            nn.init.normal_(layer.weight, std=std)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)


class SelfAttention(nn.Module):
    """Multi-head self-attention: one fused QKV projection, SDPA, an output projection."""

    def __init__(self, d_model: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.n_head, self.dropout = n_head, dropout
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """(B, L, D) and (B, 1, L, L) bool allowed pairs -> (B, L, D)."""
        b, length, d = x.shape
        q, k, v = self.qkv(x).view(b, length, 3, self.n_head, d // self.n_head).permute(2, 0, 3, 1, 4)  # 3 x (B, H, L, E)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=self.dropout if self.training else 0.0)
        return self.out(y.transpose(1, 2).reshape(b, length, d))


class SwiGLU(nn.Module):
    """``W2 dropout(silu(W1 x) * W3 x)``, without biases: the gated feed-forward of LLaMA, FuXi-alpha and LiGR."""

    def __init__(self, d_model: int, d_inner: int, dropout: float) -> None:
        super().__init__()
        self.w1 = nn.Linear(d_model, d_inner, bias=False)
        self.w3 = nn.Linear(d_model, d_inner, bias=False)
        self.w2 = nn.Linear(d_inner, d_model, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(self.dropout(F.silu(self.w1(x)) * self.w3(x)))


class SASRecBlock(nn.Module):
    """x + attention(LN(x)), then x + feed-forward(LN(x)); with `gated`, each branch times sigmoid(W x)."""

    def __init__(
        self,
        d_model: int,
        n_head: int,
        d_inner: int,
        dropout: float,
        layer_norm_eps: float,
        gated: bool = False,
        feed_forward: str = "gelu",
    ) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.attn = SelfAttention(d_model, n_head, dropout)
        self.ffn_norm = nn.LayerNorm(d_model, eps=layer_norm_eps)
        if feed_forward == "swiglu":
            self.ffn: nn.Module = SwiGLU(d_model, d_inner, dropout)
        else:
            self.ffn = nn.Sequential(nn.Linear(d_model, d_inner), nn.GELU(), nn.Dropout(dropout), nn.Linear(d_inner, d_model))
        self.dropout = nn.Dropout(dropout)
        self.gates = nn.ModuleList(nn.Linear(d_model, d_model) for _ in range(2)) if gated else None

    def _add(self, x: torch.Tensor, branch: torch.Tensor, gate: int) -> torch.Tensor:
        branch = self.dropout(branch)
        if self.gates is not None:
            branch = torch.sigmoid(self.gates[gate](x)) * branch
        return x + branch

    def forward(self, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        x = self._add(x, self.attn(self.attn_norm(x), allowed), 0)
        return self._add(x, self.ffn(self.ffn_norm(x)), 1)


class SASRecEncoder(nn.Module, Configurable):
    """Causal pre-LayerNorm transformer mapping (B, L, D) embeddings to (B, L, D) hidden states.

    Args:
        d_model: model width D.
        n_head: attention heads; must divide `d_model`.
        n_layer: blocks.
        d_inner: feed-forward width (default 4 * d_model).
        dropout: dropout on attention weights and residual branches.
        layer_norm_eps: LayerNorm epsilon.
        initializer_range: std of the Linear weights (biases start at zero); default
            ``d_model ** -0.5``, sized for small widths (see `XLNetEncoder`).
        gated: multiply the attention and feed-forward branches by ``sigmoid(W x)`` of the block input
            before adding them (LiGR's gated residual, as in eSASRec).
        feed_forward: ``gelu`` (Linear, GELU, Linear) or ``swiglu`` (`SwiGLU`, width `d_inner`).
    """

    causal: ClassVar[bool] = True

    def __init__(
        self,
        d_model: int = 64,
        n_head: int = 2,
        n_layer: int = 2,
        d_inner: int | None = None,
        dropout: float = 0.2,
        layer_norm_eps: float = 1e-6,
        initializer_range: float | None = None,
        gated: bool = False,
        feed_forward: Literal["gelu", "swiglu"] = "gelu",
    ) -> None:
        super().__init__()
        check_encoder(type(self).__name__, d_model, n_head, n_layer, dropout, d_inner, initializer_range)
        if feed_forward not in ("gelu", "swiglu"):
            raise ValueError(f"SASRecEncoder feed_forward must be 'gelu' or 'swiglu', got {feed_forward!r}")
        check_switches({"gated": gated}, "SASRecEncoder ")
        self.d_model = d_model
        self.blocks = nn.ModuleList(
            SASRecBlock(d_model, n_head, d_inner or 4 * d_model, dropout, layer_norm_eps, gated, feed_forward)
            for _ in range(n_layer)
        )
        self.norm = nn.LayerNorm(d_model, eps=layer_norm_eps)
        init_linear_layers(self, d_model, initializer_range)

    def forward(self, embeddings: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, L, D) embeddings and (B, L) bool mask of real positions -> (B, L, D)."""
        allowed = causal_attention_mask(attention_mask)
        x = embeddings
        for block in self.blocks:
            x = block(x, allowed)
        return self.norm(x)
