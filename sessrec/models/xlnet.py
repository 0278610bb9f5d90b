"""XLNet encoder over item embeddings (HF `transformers.XLNetModel` with ``inputs_embeds``).

XLNet carries relative positional attention, so sequences of any length up to the data's
`max_length` need no absolute positions (`SessionModel` adds its distance-from-end embedding
on top). Used bidirectionally (``attn_type='bi'``): for masked item modelling a [MASK] slot
attends to the whole session, padding is never attended to. Given XLNet's ``perm_mask`` and
``target_mapping`` it returns the query stream instead, for `PermutationLanguageModeling`.

Shape letters: B batch, L sequence, D model width.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn
from transformers import XLNetConfig, XLNetModel

from sessrec.models.config import Configurable


class XLNetEncoder(nn.Module, Configurable):
    """Stack of XLNet layers mapping (B, L, D) embeddings to (B, L, D) hidden states.

    Args:
        d_model: model width D.
        n_head: attention heads; must divide `d_model`.
        n_layer: layers.
        d_inner: feed-forward width (default 4 * d_model).
        dropout: dropout inside the layers.
        layer_norm_eps: LayerNorm epsilon.
        initializer_range: std of the weight init; default ``d_model ** -0.5``. HF's 0.02 is sized
            for d_model ~ 1024: at d_model 64 it makes each attention block's output ~40x smaller
            than its residual, and the encoder learns item context far more slowly.
    """

    causal: ClassVar[bool] = False
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
        super().__init__()
        if d_model % n_head:
            raise ValueError(f"d_model ({d_model}) must be a multiple of n_head ({n_head})")
        self.d_model = d_model
        config = XLNetConfig(
            vocab_size=1,  # items are embedded outside; XLNet's own token table stays tiny
            d_model=d_model,
            n_layer=n_layer,
            n_head=n_head,
            d_inner=d_inner or 4 * d_model,
            dropout=dropout,
            layer_norm_eps=layer_norm_eps,
            initializer_range=initializer_range if initializer_range is not None else d_model**-0.5,
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
        frozen = [self.xlnet.word_embedding.weight]
        frozen += [p for layer in self.xlnet.layer for p in (layer.rel_attn.r_s_bias, layer.rel_attn.seg_embed)]
        for param in frozen:
            param.requires_grad_(False)

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
        dtype = embeddings.dtype
        out = self.xlnet(
            inputs_embeds=embeddings,
            attention_mask=attention_mask.to(dtype),
            perm_mask=None if perm_mask is None else perm_mask.to(dtype),
            target_mapping=None if target_mapping is None else target_mapping.to(dtype),
            use_mems=False,
        )
        return out.last_hidden_state
