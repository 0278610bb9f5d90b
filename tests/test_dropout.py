"""FastDropout: nn.Dropout's law (keep rate, scale, train/eval), seeded, swapped in everywhere."""

import pytest
import torch
from torch import nn

from sessrec.models import FastDropout, SessionModel, XLNetEncoder, use_fast_dropout
from sessrec.models.dropout import keep_mask


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_keep_rate_and_scale_match_dropout(p):
    torch.manual_seed(0)
    x = torch.full((1_000, 1_000), 2.0, requires_grad=True)
    y = FastDropout(p).train()(x)
    kept = y != 0
    assert abs(kept.float().mean().item() - (1 - p)) < 0.002  # 1e6 draws: sd 0.0005
    torch.testing.assert_close(y[kept], torch.full_like(y[kept], 2.0 / (1 - p)))
    y.sum().backward()
    # the gradient is the same mask and scale
    torch.testing.assert_close(x.grad, kept.float() / (1 - p))


def test_mask_lanes_are_independent_and_seeded():
    torch.manual_seed(1)
    a = keep_mask((400_000,), 0.5)
    torch.manual_seed(1)
    b = keep_mask((400_000,), 0.5)
    assert torch.equal(a, b)
    lanes = a.view(-1, 4).float()  # the four lanes of each random word
    for i in range(4):
        assert abs(lanes[:, i].mean().item() - 0.5) < 0.005
    both = (lanes[:, 0] * lanes[:, 1]).mean().item()  # independent lanes: P(both kept) = 1/4
    assert abs(both - 0.25) < 0.005
    assert keep_mask((2, 3, 5), 0.2).shape == (2, 3, 5)  # any size, not only multiples of 4


def test_eval_mode_and_zero_p_are_identity_and_bad_p_is_refused():
    x = torch.randn(4, 5)
    assert FastDropout(0.5).eval()(x) is x
    assert FastDropout(0.0).train()(x) is x
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        FastDropout(1.0)


def test_session_model_swaps_every_dropout_and_keeps_its_state_dict():
    encoder = XLNetEncoder(d_model=16, n_head=2, n_layer=2, dropout=0.2)
    plain_keys = set(encoder.state_dict())
    model = SessionModel(30, encoder, max_length=5, dropout=0.3)
    kinds = [type(m) for m in model.modules()]
    assert nn.Dropout not in kinds and kinds.count(FastDropout) >= 5
    assert model.dropout.p == 0.3
    assert {k.removeprefix("encoder.") for k in model.state_dict() if k.startswith("encoder.")} == plain_keys
    seq = use_fast_dropout(nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.1)))
    assert isinstance(seq[1], FastDropout) and seq[1].p == 0.1
