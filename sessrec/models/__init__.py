"""Networks as plain `nn.Module`s (no Lightning): encoders, the session model, objectives.

Encoders map ((B, L, D) embeddings, (B, L) bool real positions) to (B, L, D) and say whether
they are ``causal``; objectives say which kind they train (`Objective.check`). `SessionModel` and
`DLRM` save and load themselves as model directories (`sessrec.models.pretrained`).
"""

from sessrec.models.bert import BertEncoder
from sessrec.models.causal_lm import CausalLanguageModeling
from sessrec.models.dlrm import DLRM, DCNv2Arch, DenseArch, InteractionArch, OverArch, SparseArch
from sessrec.models.dropout import FastDropout, use_fast_dropout
from sessrec.models.electra import ElectraEncoder
from sessrec.models.ensemble import SessionEnsemble
from sessrec.models.gpt2 import GPT2Encoder
from sessrec.models.gru4rec import GRU4RecEncoder
from sessrec.models.hf_encoder import HFEncoder
from sessrec.models.hstu import HSTUEncoder
from sessrec.models.masking import MaskedItemModeling
from sessrec.models.objective import MaskingResult, Objective, ObjectiveOutput
from sessrec.models.permutation_lm import PermutationLanguageModeling, PermutationResult
from sessrec.models.pretrained import Inference, PretrainedNetwork, load_pretrained
from sessrec.models.replaced_token import ReplacedTokenDetection, ReplacementResult
from sessrec.models.sasrec import SASRecEncoder
from sessrec.models.session_model import SessionModel
from sessrec.models.side_info import SideInfoConfig, SideInfoEmbedding
from sessrec.models.xlnet import XLNetEncoder

__all__ = [
    "DLRM",
    "BertEncoder",
    "CausalLanguageModeling",
    "DCNv2Arch",
    "DenseArch",
    "ElectraEncoder",
    "FastDropout",
    "GPT2Encoder",
    "GRU4RecEncoder",
    "HFEncoder",
    "HSTUEncoder",
    "Inference",
    "InteractionArch",
    "MaskedItemModeling",
    "MaskingResult",
    "Objective",
    "ObjectiveOutput",
    "OverArch",
    "PermutationLanguageModeling",
    "PermutationResult",
    "PretrainedNetwork",
    "ReplacedTokenDetection",
    "ReplacementResult",
    "SASRecEncoder",
    "SessionEnsemble",
    "SessionModel",
    "SideInfoConfig",
    "SideInfoEmbedding",
    "SparseArch",
    "XLNetEncoder",
    "load_pretrained",
    "use_fast_dropout",
]
