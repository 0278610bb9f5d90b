"""BERT encoder over item embeddings, as in BERT4Rec (HF `transformers.BertModel`, ``inputs_embeds``).

Bidirectional: every real position attends to every other, so it trains with
`MaskedItemModeling` and is read at a [MASK] slot appended after the last item. Padding is
masked out of the attention.

Positions: BERT's own absolute table would count from the first column, which with
right-aligned, left-padded inputs depends on the padding. Its table is therefore reduced to one
row, zeroed and frozen, and every position uses it; `SessionModel` adds the positions instead,
counted from the end of the session for bidirectional encoders (the [MASK] slot is always at
distance 0, whatever the session length). BERT's embedding LayerNorm and dropout still apply.

Shape letters: B batch, L sequence, D model width.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn
from transformers import BertConfig, BertModel

from sessrec.models.config import Configurable


class BertEncoder(nn.Module, Configurable):
    """Stack of BERT layers (post-LayerNorm, bidirectional) mapping (B, L, D) to (B, L, D).

    Args:
        d_model: model width D.
        n_head: attention heads; must divide `d_model`.
        n_layer: layers.
        d_inner: feed-forward width (default 4 * d_model).
        dropout: dropout on the embeddings, attention weights and residual branches.
        layer_norm_eps: LayerNorm epsilon.
        initializer_range: std of the weight init; default ``d_model ** -0.5`` (HF's 0.02 starves
            small models, see `XLNetEncoder`).
    """

    causal: ClassVar[bool] = False

    def __init__(
        self,
        d_model: int = 64,
        n_head: int = 2,
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
        config = BertConfig(
            vocab_size=1,  # items are embedded outside
            hidden_size=d_model,
            num_hidden_layers=n_layer,
            num_attention_heads=n_head,
            intermediate_size=d_inner or 4 * d_model,
            hidden_act="gelu",
            hidden_dropout_prob=dropout,
            attention_probs_dropout_prob=dropout,
            max_position_embeddings=1,  # positions come from SessionModel (see the module docstring)
            type_vocab_size=1,
            initializer_range=initializer_range if initializer_range is not None else d_model**-0.5,
            layer_norm_eps=layer_norm_eps,
            pad_token_id=0,
            use_cache=False,
        )
        self.bert = BertModel(config, add_pooling_layer=False)
        self.bert.embeddings.word_embeddings.weight.requires_grad_(False)  # never read: inputs come as embeddings
        nn.init.zeros_(self.bert.embeddings.position_embeddings.weight)
        self.bert.embeddings.position_embeddings.weight.requires_grad_(False)

    def forward(self, embeddings: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, L, D) embeddings and (B, L) bool mask of real positions -> (B, L, D)."""
        same = torch.zeros(attention_mask.shape, dtype=torch.long, device=embeddings.device)  # the one zero row
        out = self.bert(inputs_embeds=embeddings, attention_mask=attention_mask.long(), position_ids=same, token_type_ids=same)
        return out.last_hidden_state
