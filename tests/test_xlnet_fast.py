"""XLNetEncoder's batch-first content stream against HF's XLNetModel with the same weights.

`XLNetEncoder.content_stream` reimplements HF's bidirectional relative attention (no memory, no
segments) on the real rows only; these tests hold it to HF's outputs and gradients at every real
position, check that padding positions are 0, that the query stream (perm_mask/target_mapping)
is still HF's, and that the state_dict is HF's.
"""

import pytest
import torch
from transformers import XLNetModel
from transformers.models.xlnet.modeling_xlnet import XLNetRelativeAttention

import sessrec.models.xlnet as xlnet_module
from sessrec.models import SessionModel, XLNetEncoder
from sessrec.models.dropout import use_fast_dropout

torch.set_num_threads(1)


def real_mask(b: int, length: int, seed: int = 0) -> torch.Tensor:
    """(B, L) right-aligned real positions: row 0 without padding, row 1 a single item, the rest random."""
    lengths = torch.randint(1, length + 1, (b,), generator=torch.Generator().manual_seed(seed))
    lengths[0], lengths[1] = length, 1
    return torch.arange(length)[None, :] >= (length - lengths)[:, None]


def hf_content(enc: XLNetEncoder, x: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    return enc.xlnet(inputs_embeds=x, attention_mask=real.to(x.dtype), use_mems=False).last_hidden_state


@pytest.mark.parametrize("shape", [(6, 9, 32, 4, 2), (5, 1, 16, 2, 1), (4, 20, 64, 4, 2)])
def test_content_stream_matches_hf_at_real_positions(shape):
    b, length, d, heads, layers = shape
    torch.manual_seed(0)
    enc = XLNetEncoder(d_model=d, n_head=heads, n_layer=layers, dropout=0.3).eval()
    x = torch.randn(b, length, d)
    real = real_mask(b, length)
    ours, theirs = enc(x, real), hf_content(enc, x, real)
    assert ours.shape == (b, length, d)
    assert (ours - theirs)[real].abs().max() < 1e-5
    assert torch.equal(ours[~real], torch.zeros_like(ours[~real]))
    no_padding = torch.ones(b, length, dtype=torch.bool)
    assert (enc(x, no_padding) - hf_content(enc, x, no_padding)).abs().max() < 1e-5


def test_gradients_match_hf():
    """Training mode without dropout: the same gradients for the input and every trained parameter."""
    torch.manual_seed(1)
    enc = XLNetEncoder(d_model=32, n_head=4, n_layer=2, dropout=0.0).train()
    x = torch.randn(6, 9, 32, requires_grad=True)
    real = real_mask(6, 9, seed=1)
    weights = torch.randn(6, 9, 32) * real[..., None]  # a loss on the real positions only
    params = [x] + [p for p in enc.parameters() if p.requires_grad]
    ours = torch.autograd.grad((enc(x, real) * weights).sum(), params, allow_unused=True)
    theirs = torch.autograd.grad((hf_content(enc, x, real) * weights).sum(), params, allow_unused=True)
    compared = 0
    for a, h in zip(ours, theirs):
        assert (a is None) == (h is None)
        if h is not None:
            assert (a - h).abs().max() <= 1e-5 * h.abs().max()
            compared += 1
    assert compared == len(params) - 1  # all but mask_emb, which only the query stream reads


def test_dropout_in_training_and_seeded_reproducibility():
    torch.manual_seed(2)
    enc = use_fast_dropout(XLNetEncoder(d_model=16, n_head=2, n_layer=2, dropout=0.3)).train()
    x, real = torch.randn(4, 7, 16), real_mask(4, 7, seed=2)
    torch.manual_seed(3)
    first = enc(x, real)
    torch.manual_seed(3)
    assert torch.equal(first, enc(x, real))
    assert not torch.equal(first, enc(x, real))  # a new draw of the masks
    assert torch.isfinite(first).all() and torch.equal(first[~real], torch.zeros_like(first[~real]))


def test_query_stream_is_hf():
    torch.manual_seed(3)
    enc = XLNetEncoder(d_model=16, n_head=2, n_layer=2, dropout=0.0).eval()
    enc.use_query_stream(True)
    x, real = torch.randn(3, 6, 16), real_mask(3, 6, seed=3)
    perm = torch.triu(torch.ones(6, 6), diagonal=1).expand(3, 6, 6).clone()
    mapping = torch.zeros(3, 2, 6)
    mapping[:, 0, -1], mapping[:, 1, -2] = 1.0, 1.0
    ours = enc(x, real, perm_mask=perm, target_mapping=mapping)
    theirs = enc.xlnet(inputs_embeds=x, attention_mask=real.float(), perm_mask=perm, target_mapping=mapping,
                       use_mems=False).last_hidden_state
    assert ours.shape == (3, 2, 16) and torch.equal(ours, theirs)


def test_state_dict_is_hf_xlnet():
    enc = XLNetEncoder(d_model=16, n_head=2, n_layer=2)
    hf = XLNetModel(enc.xlnet.config)
    assert list(enc.state_dict()) == [f"xlnet.{k}" for k in hf.state_dict()]


def test_rel_shift_forms_agree_with_hf(monkeypatch):
    """The strided view (eager) and the reshape-and-slice form (traced, exported) give HF's shift."""
    x = torch.randn(3, 2, 7, 14)
    hf = XLNetRelativeAttention.rel_shift_bnij(x, klen=7)
    i, j = torch.meshgrid(torch.arange(7), torch.arange(7), indexing="ij")
    assert torch.equal(hf, x[:, :, i, 7 - i + j])  # entry (i, j) scores the distance i - j
    assert torch.equal(xlnet_module._rel_shift(x, 7), hf)
    monkeypatch.setattr(xlnet_module, "symbolic", lambda: True)
    assert torch.equal(xlnet_module._rel_shift(x, 7), hf)


def test_traced_model_matches_eager_on_another_shape():
    """torch.jit.trace takes the data-independent path (all B L rows); the result is the same."""
    torch.manual_seed(4)
    model = SessionModel(30, XLNetEncoder(d_model=16, n_head=2, n_layer=2), max_length=8).eval()
    example = torch.tensor([[0, 0, 3, 4, 5], [6, 7, 8, 9, 10]])
    traced = torch.jit.trace(model, example, check_trace=False)
    other = torch.tensor([[0, 0, 0, 0, 3, 4, 5], [6, 7, 8, 9, 10, 11, 12], [0, 5, 6, 7, 8, 9, 10]])
    with torch.no_grad():
        torch.testing.assert_close(traced(other), model(other), rtol=0, atol=1e-5)  # -inf at padding and OOV
