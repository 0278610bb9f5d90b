"""GPT-2 encoder over item embeddings (HF `transformers.GPT2Model` with ``inputs_embeds``).

Causal: position i attends to positions <= i only, so it trains with `CausalLanguageModeling`
and is read at the last item. Left padding is masked out of every real row; HF's causal mask
gives the padding rows (which would see nothing) a finite output, so no NaN reaches real ones.
GPT-2's own position table is one zero row (`HFEncoder.one_position`); `SessionModel` counts
positions from the first real item, which padding cannot shift.

Shape letters: B batch, L sequence, D model width.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from transformers import GPT2Config, GPT2Model

from sessrec.models.hf_encoder import HFEncoder


class GPT2Encoder(HFEncoder):
    """Stack of GPT-2 blocks (pre-LayerNorm, causal) mapping (B, L, D) to (B, L, D).

    Args:
        d_model: model width D.
        n_head: attention heads; must divide `d_model`.
        n_layer: blocks.
        d_inner: feed-forward width (default 4 * d_model).
        dropout: dropout on the inputs, attention weights and residual branches.
        layer_norm_eps: LayerNorm epsilon.
        initializer_range: std of the weight init; default ``d_model ** -0.5`` (`HFEncoder`).
            GPT-2 further scales its residual projections by ``1 / sqrt(2 * n_layer)``.
    """

    causal: ClassVar[bool] = True

    def __init__(
        self,
        d_model: int = 64,
        n_head: int = 2,
        n_layer: int = 2,
        d_inner: int | None = None,
        dropout: float = 0.1,
        layer_norm_eps: float = 1e-5,
        initializer_range: float | None = None,
    ) -> None:
        super().__init__(d_model, n_head, n_layer, dropout, initializer_range, d_inner)
        config = GPT2Config(
            vocab_size=1,  # items are embedded outside
            n_positions=1,  # positions come from SessionModel
            n_embd=d_model,
            n_layer=n_layer,
            n_head=n_head,
            n_inner=d_inner or 4 * d_model,
            resid_pdrop=dropout,
            embd_pdrop=dropout,
            attn_pdrop=dropout,
            layer_norm_epsilon=layer_norm_eps,
            initializer_range=self.init_std,
            use_cache=False,
            bos_token_id=None,
            eos_token_id=None,
        )
        self.gpt2 = GPT2Model(config)
        self.freeze(self.gpt2.wte.weight)  # never read: inputs come as embeddings
        self.one_position(self.gpt2.wpe)

    def forward(self, embeddings: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, L, D) embeddings and (B, L) bool mask of real positions -> (B, L, D)."""
        out = self.gpt2(inputs_embeds=embeddings, attention_mask=attention_mask.long(),
                        position_ids=self.positions(attention_mask), use_cache=False)
        return out.last_hidden_state
