"""Networks as plain `nn.Module`s (no Lightning): encoders, the session model, objectives."""

from sessrec.models.masking import MaskedItemModeling, MaskingResult
from sessrec.models.session_model import SessionModel
from sessrec.models.xlnet import XLNetEncoder

__all__ = ["MaskedItemModeling", "MaskingResult", "SessionModel", "XLNetEncoder"]
