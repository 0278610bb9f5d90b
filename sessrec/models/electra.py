"""ELECTRA encoder over item embeddings (HF `transformers.ElectraModel` with ``inputs_embeds``).

The discriminator of `ReplacedTokenDetection`, and its default generator (one narrow layer).
Architecturally a BERT encoder (`BertEncoder`, whose arguments, positions and forward it keeps);
ELECTRA's difference is the objective, not the layers. Its embedding width equals `d_model`, so
there is no projection between embeddings and layers.

Shape letters: B batch, L sequence, D model width.
"""

from __future__ import annotations

from typing import Any

from transformers import ElectraConfig, ElectraModel

from sessrec.models.bert import BertEncoder


class ElectraEncoder(BertEncoder):
    """Stack of ELECTRA layers (post-LayerNorm, bidirectional) mapping (B, L, D) to (B, L, D).

    Takes `BertEncoder`'s arguments.
    """

    def build(self, **config: Any) -> None:
        self.electra = ElectraModel(ElectraConfig(embedding_size=config["hidden_size"], **config))

    @property
    def hf(self) -> ElectraModel:
        return self.electra
