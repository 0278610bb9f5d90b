"""Networks as plain `nn.Module`s (no Lightning): encoders, the session model, objectives.

Encoders map ((B, L, D) embeddings, (B, L) bool real positions) to (B, L, D) and say whether
they are ``causal``; objectives say which kind they train (`Objective.check`). Networks hold no
vocabulary and save nothing: `sessrec.artifacts` saves a trained one with what reads raw input into it.
"""

from sessrec.models.bert import BertEncoder
from sessrec.models.bsarec import BSARecEncoder
from sessrec.models.causal_lm import CausalLanguageModeling
from sessrec.models.dlrm import DLRM, DCNv2Arch, DenseArch, InteractionArch, OverArch, SparseArch
from sessrec.models.dropout import FastDropout, use_fast_dropout
from sessrec.models.electra import ElectraEncoder
from sessrec.models.gpt2 import GPT2Encoder
from sessrec.models.gru4rec import GRU4RecEncoder
from sessrec.models.hf_encoder import HFEncoder
from sessrec.models.hstu import HSTUEncoder
from sessrec.models.masking import MaskedItemModeling
from sessrec.models.objective import MaskingResult, Objective, ObjectiveOutput
from sessrec.models.permutation_lm import PermutationLanguageModeling, PermutationResult
from sessrec.models.replaced_token import ReplacedTokenDetection, ReplacementResult
from sessrec.models.sasrec import SASRecEncoder
from sessrec.models.session_ensemble import SessionEnsemble
from sessrec.models.session_model import SessionModel
from sessrec.models.side_info import SideInfoConfig, SideInfoEmbedding
from sessrec.models.xlnet import XLNetEncoder

__all__ = [
    "DLRM",
    "BSARecEncoder",
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
    "InteractionArch",
    "MaskedItemModeling",
    "MaskingResult",
    "Objective",
    "ObjectiveOutput",
    "OverArch",
    "PermutationLanguageModeling",
    "PermutationResult",
    "ReplacedTokenDetection",
    "ReplacementResult",
    "SASRecEncoder",
    "SessionEnsemble",
    "SessionModel",
    "SideInfoConfig",
    "SideInfoEmbedding",
    "SparseArch",
    "XLNetEncoder",
    "use_fast_dropout",
]
