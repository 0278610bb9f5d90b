"""BERT encoder over item embeddings, as in BERT4Rec (HF `transformers.BertModel`, ``inputs_embeds``).

Bidirectional: every real position attends to every other, so it trains with
`MaskedItemModeling` and is read at a [MASK] slot appended after the last item. Padding is
masked out of the attention. BERT's own position table is one zero row (`HFEncoder.one_position`);
its embedding LayerNorm and dropout still apply.

Shape letters: B batch, L sequence, D model width.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import BertConfig, BertModel

from sessrec.models.hf_encoder import HFEncoder


class BertEncoder(HFEncoder):
    """Stack of BERT layers (post-LayerNorm, bidirectional) mapping (B, L, D) to (B, L, D).

    Args:
        d_model: model width D.
        n_head: attention heads; must divide `d_model`.
        n_layer: layers.
        d_inner: feed-forward width (default 4 * d_model).
        dropout: dropout on the embeddings, attention weights and residual branches.
        layer_norm_eps: LayerNorm epsilon.
        initializer_range: std of the weight init; default ``d_model ** -0.5`` (`HFEncoder`).
    """

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
        super().__init__(d_model, n_head, n_layer, dropout, initializer_range, d_inner)
        self.build(
            vocab_size=1,  # items are embedded outside
            hidden_size=d_model,
            num_hidden_layers=n_layer,
            num_attention_heads=n_head,
            intermediate_size=d_inner or 4 * d_model,
            hidden_act="gelu",
            hidden_dropout_prob=dropout,
            attention_probs_dropout_prob=dropout,
            max_position_embeddings=1,  # positions come from SessionModel
            type_vocab_size=1,
            initializer_range=self.init_std,
            layer_norm_eps=layer_norm_eps,
            pad_token_id=0,
            use_cache=False,
        )
        self.freeze(self.hf.embeddings.word_embeddings.weight)  # never read: inputs come as embeddings
        self.one_position(self.hf.embeddings.position_embeddings)

    def build(self, **config: Any) -> None:
        """Create the HF model from its configuration's arguments."""
        self.bert = BertModel(BertConfig(**config), add_pooling_layer=False)

    @property
    def hf(self) -> BertModel:
        return self.bert

    def forward(self, embeddings: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, L, D) embeddings and (B, L) bool mask of real positions -> (B, L, D)."""
        same = self.positions(attention_mask)
        out = self.hf(inputs_embeds=embeddings, attention_mask=attention_mask.long(), position_ids=same, token_type_ids=same)
        return out.last_hidden_state
