"""XLNet encoder over item embeddings (HF `transformers.XLNetModel` with ``inputs_embeds``).

XLNet carries relative positional attention, so sequences of any length up to the data's
`max_length` need no absolute positions (`SessionModel` adds its distance-from-end embedding
on top). Used bidirectionally (``attn_type='bi'``): for masked item modelling a [MASK] slot
attends to the whole session, padding is never attended to. Given XLNet's ``perm_mask`` and
``target_mapping`` it returns the query stream instead, for `PermutationLanguageModeling`.

The content stream (every objective but PLM) runs `XLNetEncoder.content_stream`: HF's layers,
parameters and operations, batch-first, on the real positions only. HF's `XLNetModel` works in
(L, B, ...) order and pays for it in einsum permutations and copies, builds a float (L, L, B)
mask and subtracts 1e30 times it, and shifts the position scores through three copies; and it
runs every row-wise step (projections, feed-forward, dropout, LayerNorm) on the padding too,
although no real position ever reads a padding one. Here those steps run on the R real rows;
attention runs on padded (B, H, L, L) blocks with q, k and v from one matmul, an additive -inf
mask (the same zero weights as -1e30 after the softmax) and the shift as a strided view. As in
HF, each session draws its own dropout mask over the relative position embedding; without
dropout the position keys are computed once for the batch. Real positions match HF's outputs to
float rounding, padding positions are 0 (tests/test_xlnet_fast.py); the state_dict is HF's.

Shape letters: B batch, L sequence, D model width, H heads, E head width (D / H),
P relative positions (2 L: distances L .. -L + 1).
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn
from transformers import XLNetConfig, XLNetModel

from sessrec.models.hf_encoder import HFEncoder, symbolic


class XLNetEncoder(HFEncoder):
    """Stack of XLNet layers mapping (B, L, D) embeddings to (B, L, D) hidden states.

    Args:
        d_model: model width D.
        n_head: attention heads; must divide `d_model`.
        n_layer: layers.
        d_inner: feed-forward width (default 4 * d_model).
        dropout: dropout inside the layers.
        layer_norm_eps: LayerNorm epsilon.
        initializer_range: std of the weight init; default ``d_model ** -0.5`` (`HFEncoder`).
    """

    two_stream: ClassVar[bool] = True  # takes perm_mask / target_mapping (PermutationLanguageModeling)

    def __init__(
        self,
        d_model: int = 64,
        n_head: int = 4,
        n_layer: int = 2,
        d_inner: int | None = None,
        dropout: float = 0.1,
        layer_norm_eps: float = 1e-12,
        initializer_range: float | None = None,
    ) -> None:
        super().__init__(d_model, n_head, n_layer, dropout, initializer_range, d_inner)
        config = XLNetConfig(
            vocab_size=1,  # items are embedded outside; XLNet's own token table stays tiny
            d_model=d_model,
            n_layer=n_layer,
            n_head=n_head,
            d_inner=d_inner or 4 * d_model,
            dropout=dropout,
            layer_norm_eps=layer_norm_eps,
            initializer_range=self.init_std,
            attn_type="bi",
            mem_len=None,
            use_mems_eval=False,
            use_mems_train=False,
            pad_token_id=0,
            bos_token_id=None,
            eos_token_id=None,
        )
        self.xlnet = XLNetModel(config)
        # never read: sessions come in as embeddings (no word ids) and have no segments
        self.freeze(self.xlnet.word_embedding.weight)
        self.freeze(*(p for layer in self.xlnet.layer for p in (layer.rel_attn.r_s_bias, layer.rel_attn.seg_embed)))

    def use_query_stream(self, used: bool) -> None:
        """Train the query stream's embedding (``mask_emb``) only when the objective reads the query
        stream (`PermutationLanguageModeling`); frozen otherwise, since nothing else uses it."""
        self.xlnet.mask_emb.requires_grad_(used)

    def forward(
        self,
        embeddings: torch.Tensor,
        attention_mask: torch.Tensor,
        perm_mask: torch.Tensor | None = None,
        target_mapping: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B, L, D) embeddings and (B, L) bool mask of real positions -> (B, L, D) content stream.

        With ``perm_mask`` (B, L, L), 1 where i may not attend to j, and ``target_mapping``
        (B, P, L) one-hot rows: the (B, P, D) query stream at the P mapped positions.
        """
        if perm_mask is None and target_mapping is None:
            return self.content_stream(embeddings, attention_mask)
        dtype = embeddings.dtype
        out = self.xlnet(
            inputs_embeds=embeddings,
            attention_mask=attention_mask.to(dtype),
            perm_mask=None if perm_mask is None else perm_mask.to(dtype),
            target_mapping=None if target_mapping is None else target_mapping.to(dtype),
            use_mems=False,
        )
        return out.last_hidden_state

    def position_sinusoids(self, length: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """(P, 1, D) sinusoids for distances L .. -L + 1, the same numbers as HF's
        ``relative_positional_encoding``; a constant of L, kept per (L, device, dtype) outside tracing
        (and apart for inference mode, whose tensors autograd may not save)."""
        if symbolic():
            return self.xlnet.relative_positional_encoding(length, length).to(device=device, dtype=dtype)
        key = (length, device, dtype, torch.is_inference_mode_enabled())
        cache = self.__dict__.setdefault("_sinusoids", {})
        if key not in cache:
            cache[key] = self.xlnet.relative_positional_encoding(length, length).to(device=device, dtype=dtype)
        return cache[key]

    def content_stream(self, embeddings: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, L, D) embeddings, (B, L) bool real positions -> (B, L, D): HF's content stream, batch-first.

        A real query reads every real key and itself. Hidden states at padding positions are 0:
        no real query reads them, so every row-wise step (projections, feed-forward, dropout,
        LayerNorm) runs on the R real rows only; attention runs on the padded (B, H, L, L)
        blocks. HF computes padding rows too (there a padding query reads only itself), which
        changes nothing at the real positions. No memory, segments or head mask: none is used.
        """
        xlnet = self.xlnet
        b, length, d = embeddings.shape
        real = attention_mask.bool()
        allowed = real[:, None, None, :] | torch.eye(length, dtype=torch.bool, device=embeddings.device)
        bias = torch.zeros(allowed.shape, dtype=embeddings.dtype, device=embeddings.device)
        bias = bias.masked_fill(~allowed, float("-inf"))  # (B, 1, L, L)
        pos = self.position_sinusoids(length, embeddings.device, embeddings.dtype)  # (P, 1, D)
        if xlnet.dropout.training and xlnet.dropout.p > 0:
            pos = xlnet.dropout(pos.transpose(0, 1).expand(b, -1, -1))  # (B, P, D): a mask per session
        else:
            pos = pos.transpose(0, 1)  # (1, P, D): shared by the batch
        real_at = None if symbolic() else real.nonzero(as_tuple=True)  # ((R,), (R,)) batch and column
        if real_at is not None and len(real_at[0]) == b * length:
            real_at = None  # no padding: nothing to skip
        h = embeddings.reshape(b * length, d) if real_at is None else _real_rows(embeddings, real_at, (0, 1, 2))
        h = xlnet.dropout(h)  # (R, D)
        for layer in xlnet.layer:
            h = _attention_block(layer.rel_attn, h, real_at, b, pos, bias)
            h = layer.ff(h)
        h = xlnet.dropout(h)
        if real_at is not None:
            return _padded_rows(h, real_at, (b, length, d), (0, 1, 2))
        if symbolic():  # padding rows were computed: zero them as above
            return h.view(b, length, d) * real[..., None].to(h.dtype)
        return h.view(b, length, d)  # no padding


def _padded_rows(rows: torch.Tensor, real_at: tuple[torch.Tensor, torch.Tensor], shape: tuple[int, ...],
                 order: tuple[int, ...]) -> torch.Tensor:
    """`_PaddedRows`; without autograd (inference) the same writes without the Function's call overhead."""
    if torch.is_grad_enabled() and rows.requires_grad:
        return _PaddedRows.apply(rows, real_at, shape, order)
    out = rows.new_zeros(shape)
    out.permute(order).index_put_(real_at, rows)
    return out


def _real_rows(padded: torch.Tensor, real_at: tuple[torch.Tensor, torch.Tensor], order: tuple[int, ...]) -> torch.Tensor:
    """`_RealRows`; without autograd (inference) the same gather without the Function's call overhead."""
    if torch.is_grad_enabled() and padded.requires_grad:
        return _RealRows.apply(padded, real_at, order)
    return padded.permute(order)[real_at]


def _attention_block(
    attn: nn.Module,
    h: torch.Tensor,
    real_at: tuple[torch.Tensor, torch.Tensor] | None,
    b: int,
    pos: torch.Tensor,
    bias: torch.Tensor,
) -> torch.Tensor:
    """One `XLNetRelativeAttention` (content stream, post-attention included) over the real rows.

    Args:
        attn: HF's module; its parameters q, k, v, o, r are (D, H, E), r_w_bias and r_r_bias (H, E).
        h: (R, D) hidden states of the real positions (all B L of them when `real_at` is None).
        real_at: batch and column indices of those R positions, or None.
        b: batch size B.
        pos: (B, P, D) or (1, P, D) relative position embeddings (after dropout).
        bias: (B, 1, L, L) additive attention mask, 0 or -inf.
    """
    length, d = bias.shape[-1], h.shape[1]
    heads, width = attn.n_head, attn.d_head
    qkv_weight = torch.cat([attn.q, attn.k, attn.v], dim=1).view(d, 3 * heads * width)  # (D, 3 H E)
    qkv = (h @ qkv_weight).view(-1, 3, heads, width)  # (R, 3, H, E)
    if real_at is None:
        q, k, v = qkv.view(b, length, 3, heads, width).permute(2, 0, 3, 1, 4).contiguous().unbind(0)
    else:  # written straight into (3, B, H, L, E) order; padding queries, keys and values are 0
        q, k, v = _padded_rows(qkv, real_at, (3, b, heads, length, width), (1, 3, 0, 2, 4)).unbind(0)
    # content score (HF's ac) and position score (bd) against every distance, then bd's shift
    content = torch.matmul(q + attn.r_w_bias[:, None, :], k.transpose(-1, -2))  # (B, H, L, L)
    pos_keys = (pos @ attn.r.view(d, heads * width)).view(*pos.shape[:2], heads, width)  # (B or 1, P, H, E)
    position = torch.matmul(q + attn.r_r_bias[:, None, :], pos_keys.permute(0, 2, 3, 1))  # (B, H, L, P)
    score = (content + _rel_shift(position, length)) * attn.scale + bias
    prob = attn.dropout(torch.softmax(score, dim=-1))
    vec = torch.matmul(prob, v)  # (B, H, L, E)
    if real_at is None:
        vec = vec.transpose(1, 2).reshape(b * length, heads * width)
    else:
        vec = _real_rows(vec, real_at, (0, 2, 1, 3)).view(-1, heads * width)  # (R, H E)
    out = vec @ attn.o.view(d, heads * width).T  # (R, D)
    return attn.layer_norm(attn.dropout(out) + h)


class _PaddedRows(torch.autograd.Function):
    """(R, ...) rows -> a zero tensor of `shape` holding them at `real_at` of its view ``permute(order)``.

    ``zeros(shape).permute(order)[real_at] = rows`` with a backward that only gathers the rows'
    gradient (autograd's in-place-on-a-view path would first copy the whole padded gradient twice).
    """

    @staticmethod
    def forward(ctx, rows, real_at, shape, order):
        ctx.save_for_backward(*real_at)
        ctx.order = order
        out = rows.new_zeros(shape)
        out.permute(order).index_put_(real_at, rows)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad.permute(ctx.order)[ctx.saved_tensors], None, None, None


class _RealRows(torch.autograd.Function):
    """``padded.permute(order)[real_at]``: the (R, ...) real rows; backward writes their gradient
    into a zero tensor of the padded layout, ready for the matmul that made it."""

    @staticmethod
    def forward(ctx, padded, real_at, order):
        ctx.save_for_backward(*real_at)
        ctx.order, ctx.shape = order, padded.shape
        return padded.permute(order)[real_at]

    @staticmethod
    def backward(ctx, grad):
        out = grad.new_zeros(ctx.shape)
        out.permute(ctx.order).index_put_(ctx.saved_tensors, grad)
        return out, None, None


def _rel_shift(x: torch.Tensor, length: int) -> torch.Tensor:
    """(B, H, L, P) scores against distances L - m (m = 0 .. P - 1) -> (B, H, L, L): entry (i, j) is
    x[..., i, L - i + j], the score of distance i - j (HF's ``rel_shift_bnij``, without its copies
    where possible: a strided view of the contiguous scores)."""
    if symbolic():  # symbolic shapes: the reshape-and-slice form, as HF writes it
        b, heads, rows, cols = x.shape
        return x.reshape(b, heads, cols, rows)[:, :, 1:].reshape(b, heads, rows, cols - 1)[..., :length]
    x = x.contiguous()
    b, heads, rows, cols = x.shape
    return x.as_strided((b, heads, rows, length), (heads * rows * cols, rows * cols, cols - 1, 1), x.storage_offset() + length)
