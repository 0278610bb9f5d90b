"""Encoders: shapes, left-padding invariance, causality, references, and a transition each one learns."""

import pytest
import torch
import torch.nn.functional as F

from sessrec.models import (
    BertEncoder,
    BSARecEncoder,
    CausalLanguageModeling,
    ElectraEncoder,
    GPT2Encoder,
    GRU4RecEncoder,
    HSTUEncoder,
    MaskedItemModeling,
    PermutationLanguageModeling,
    ReplacedTokenDetection,
    SASRecEncoder,
    SessionModel,
    XLNetEncoder,
)
from sessrec.models.sasrec import SelfAttention, causal_attention_mask

torch.set_num_threads(1)

ENCODERS = {
    "xlnet": lambda: XLNetEncoder(d_model=16, n_head=2, n_layer=2, dropout=0.0),
    "bert": lambda: BertEncoder(d_model=16, n_head=2, n_layer=2, dropout=0.0),
    "electra": lambda: ElectraEncoder(d_model=16, n_head=2, n_layer=2, dropout=0.0),
    "gpt2": lambda: GPT2Encoder(d_model=16, n_head=2, n_layer=2, dropout=0.0),
    "sasrec": lambda: SASRecEncoder(d_model=16, n_head=2, n_layer=2, dropout=0.0),
    "esasrec": lambda: SASRecEncoder(d_model=16, n_head=2, n_layer=2, dropout=0.0, gated=True, feed_forward="swiglu"),
    "gru4rec": lambda: GRU4RecEncoder(d_model=16, n_layer=2),
    "hstu": lambda: HSTUEncoder(d_model=16, n_head=2, n_layer=2, dropout=0.0),
    "bsarec": lambda: BSARecEncoder(d_model=16, n_head=2, n_layer=2, dropout=0.0, window=9),
    "bsarec-session": lambda: BSARecEncoder(d_model=16, n_head=2, n_layer=2, dropout=0.0, window=9, span="session"),
}
CAUSAL = {"gpt2", "sasrec", "esasrec", "gru4rec", "hstu"}


def encoder(name, seed=0):
    torch.manual_seed(seed)
    return ENCODERS[name]().eval()


def padded(seed=0):
    """(4, 7, 16) embeddings, left padding of 0..6 positions filled with noise, and the real mask."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 7, 16, generator=g)
    lengths = torch.tensor([7, 4, 1, 3])
    mask = torch.arange(7)[None, :] >= 7 - lengths[:, None]
    return x, mask, lengths


@pytest.mark.parametrize("name", ENCODERS)
def test_shape_width_and_causal_flag(name):
    enc = encoder(name)
    x, mask, _ = padded()
    with torch.no_grad():
        out = enc(x, mask)
    assert out.shape == (4, 7, 16) and enc.d_model == 16
    assert torch.isfinite(out).all()  # padding rows too: a NaN there would reach real rows through attention
    assert type(enc).causal is (name in CAUSAL)


@pytest.mark.parametrize("name", ENCODERS)
def test_left_padding_does_not_change_real_positions(name):
    enc = encoder(name)
    x, mask, lengths = padded()
    with torch.no_grad():
        out = enc(x, mask)
        for row, n in enumerate(lengths.tolist()):
            alone = enc(x[row : row + 1, 7 - n :], mask[row : row + 1, 7 - n :])
            torch.testing.assert_close(out[row, 7 - n :], alone[0], atol=1e-5, rtol=1e-4)
        noisier = x.clone()
        noisier[~mask] = 100.0 * torch.randn(int((~mask).sum()), 16)
        torch.testing.assert_close(enc(noisier, mask)[mask], out[mask], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", ENCODERS)
def test_causal_encoders_never_see_later_positions(name):
    enc = encoder(name)
    x, mask, _ = padded(seed=1)
    mask[:] = True
    changed = x.clone()
    changed[:, 4:] = torch.randn(4, 3, 16)
    with torch.no_grad():
        a, b = enc(x, mask), enc(changed, mask)
    if name in CAUSAL:
        torch.testing.assert_close(a[:, :4], b[:, :4])
    else:
        assert not torch.allclose(a[:, :4], b[:, :4])  # bidirectional: earlier positions read later ones


@pytest.mark.parametrize("name", ENCODERS)
def test_seeded_encoders_are_deterministic(name):
    x, mask, _ = padded()
    with torch.no_grad():
        torch.testing.assert_close(encoder(name, seed=3)(x, mask), encoder(name, seed=3)(x, mask))
        assert not torch.allclose(encoder(name, seed=3)(x, mask), encoder(name, seed=4)(x, mask))


def test_sasrec_attention_matches_a_naive_softmax_reference():
    torch.manual_seed(0)
    attn = SelfAttention(d_model=16, n_head=2, dropout=0.0).eval()
    x, mask, _ = padded(seed=2)
    allowed = causal_attention_mask(mask)  # (B, 1, L, L)
    with torch.no_grad():
        got = attn(x, allowed)
        q, k, v = attn.qkv(x).split(16, dim=-1)  # (B, L, D) each
        q, k, v = (t.view(4, 7, 2, 8).transpose(1, 2) for t in (q, k, v))  # (B, H, L, E)
        scores = q @ k.transpose(-1, -2) / 8**0.5  # (B, H, L, L)
        weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
        expected = attn.out((weights @ v).transpose(1, 2).reshape(4, 7, 16))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


def test_gated_swiglu_block_matches_its_formula():
    """eSASRec's layer: x + sigmoid(G1 x) * attn(LN1 x), then + sigmoid(G2 x) * W2(silu(W1 LN2 x) * W3 LN2 x)."""
    enc = encoder("esasrec")
    x, mask, _ = padded(seed=5)
    allowed = causal_attention_mask(mask)
    with torch.no_grad():
        h = x
        for block in enc.blocks:
            h = h + torch.sigmoid(block.gates[0](h)) * block.attn(block.attn_norm(h), allowed)
            n = block.ffn_norm(h)
            ffn = block.ffn.w2(F.silu(block.ffn.w1(n)) * block.ffn.w3(n))
            h = h + torch.sigmoid(block.gates[1](h)) * ffn
        expected = enc.norm(h)
        got = enc(x, mask)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    assert enc.blocks[0].ffn.w1.bias is None and enc.blocks[0].ffn.w1.weight.shape == (64, 16)
    plain = encoder("sasrec")
    assert sum(p.numel() for p in enc.parameters()) - sum(p.numel() for p in plain.parameters()) == 2 * (
        2 * (16 * 16 + 16) + 64 * 16 - 64 - 16  # two gates each; a third 16x64 matrix, no biases
    )


def test_sasrec_refuses_an_unknown_feed_forward():
    with pytest.raises(ValueError, match="feed_forward must be 'gelu' or 'swiglu', got 'relu'"):
        SASRecEncoder(d_model=16, n_head=2, feed_forward="relu")


def test_sasrec_mask_is_causal_over_real_keys_and_padding_rows_see_themselves():
    mask = torch.tensor([[False, False, True, True]])
    allowed = causal_attention_mask(mask)[0, 0]
    assert allowed.tolist() == [
        [True, False, False, False],
        [False, True, False, False],
        [False, False, True, False],
        [False, False, True, True],
    ]


def test_gru4rec_equals_the_gru_run_on_each_unpadded_session():
    enc = encoder("gru4rec")
    x, mask, lengths = padded(seed=3)
    with torch.no_grad():
        out = enc(x, mask)
        for row, n in enumerate(lengths.tolist()):
            ref, _ = enc.gru(x[row : row + 1, 7 - n :])
            torch.testing.assert_close(out[row, 7 - n :], ref[0])
    assert (out[~mask] == 0).all()


def test_a_gru4rec_dropout_that_one_layer_cannot_apply_is_refused():
    """torch's GRU drops out between stacked layers only: with one layer a dropout trained without any."""
    with pytest.raises(ValueError, match=r"^GRU4RecEncoder dropout 0.3 is applied between stacked layers, and n_layer is 1: "
                                         r"set n_layer 2 or more, or dropout 0.0 \(SessionModel's dropout drops input embeddings\)$"):
        GRU4RecEncoder(d_model=16, n_layer=1, dropout=0.3)
    assert GRU4RecEncoder(d_model=16, n_layer=2, dropout=0.3).gru.dropout == 0.3


@pytest.mark.parametrize("name", ["gpt2", "bert", "electra"])
def test_hf_absolute_position_tables_are_disabled(name):
    enc = encoder(name)
    tables = [p for n, p in enc.named_parameters() if "position" in n or n.endswith("wpe.weight")]
    assert tables and all(t.shape[0] == 1 and not t.requires_grad and (t == 0).all() for t in tables)


def test_session_model_positions_count_from_the_start_for_causal_encoders():
    causal = SessionModel(30, GPT2Encoder(d_model=16, n_head=2, n_layer=1), max_length=4)
    bidirectional = SessionModel(30, BertEncoder(d_model=16, n_head=2, n_layer=1), max_length=4)
    real = torch.tensor([[False, False, True, True, True], [True] * 5])
    assert causal.positions(real).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]
    assert bidirectional.positions(real).tolist() == [4, 3, 2, 1, 0]


PAIRS = {
    "xlnet-mlm": ("xlnet", lambda: MaskedItemModeling(mask_prob=0.3, last_item_prob=0.3)),
    "xlnet-plm": ("xlnet", lambda: PermutationLanguageModeling(target_prob=0.3, last_item_prob=0.3)),
    "bert-mlm": ("bert", lambda: MaskedItemModeling(mask_prob=0.3, last_item_prob=0.3)),
    "electra-rtd": ("electra", lambda: ReplacedTokenDetection(mask_prob=0.3, last_item_prob=0.3)),
    "gpt2-clm": ("gpt2", CausalLanguageModeling),
    "sasrec-clm": ("sasrec", CausalLanguageModeling),
    "gru4rec-clm": ("gru4rec", CausalLanguageModeling),
    "hstu-clm": ("hstu", CausalLanguageModeling),
    "bsarec-mlm": ("bsarec", lambda: MaskedItemModeling(mask_prob=0.3, last_item_prob=0.3)),
}


@pytest.mark.slow
@pytest.mark.parametrize("pair", PAIRS)
def test_tiny_model_learns_a_transition(pair):
    """150 steps on a deterministic chain a -> a+1: the successor is ranked first, read as at evaluation."""
    name, make_objective = PAIRS[pair]
    torch.manual_seed(0)
    enc = {**ENCODERS, "xlnet": lambda: XLNetEncoder(d_model=16, n_head=2, n_layer=1, dropout=0.0)}[name]()
    model = SessionModel(22, enc, max_length=6, dropout=0.0)
    objective = make_objective()
    objective.bind(model)
    starts = torch.randint(2, 16, (256,))
    items = starts[:, None] + torch.arange(6)[None, :]  # (256, 6) ids 2..21
    items[::3, :2] = 0  # some shorter, left-padded sessions
    params = list(model.parameters()) + [p for p in getattr(objective, "parameters", list)()]
    opt = torch.optim.Adam(params, lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(150):
        out = objective.training_output(model, items, gen)
        loss = F.cross_entropy(model.score(out.hidden), out.targets)
        if out.aux_loss is not None:
            loss = loss + out.aux_loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        pred = model(torch.tensor([[0, 4, 5, 6], [9, 10, 11, 12]]), objective).argmax(dim=1)
    assert pred.tolist() == [7, 13]


@pytest.mark.gpu
@pytest.mark.parametrize("pair", PAIRS)
def test_cuda_matches_cpu(pair):  # CPU twins: every test above
    name, make_objective = PAIRS[pair]
    torch.manual_seed(0)
    model = SessionModel(22, encoder(name), max_length=6, dropout=0.0).eval()
    objective = make_objective()
    objective.bind(model)
    items = torch.tensor([[0, 0, 4, 5, 6], [3, 4, 9, 12, 2]])
    with torch.no_grad():
        cpu = model(items, objective)
        if isinstance(objective, torch.nn.Module):
            objective.to("cuda")
        gpu = model.to("cuda")(items.to("cuda"), objective)
        out = objective.training_output(model, items.to("cuda"), torch.Generator(device="cuda").manual_seed(0))
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-4, atol=1e-4)
    assert out.hidden.is_cuda and torch.isfinite(out.hidden).all()


def test_bsarec_low_pass_is_the_dft_filter_of_the_zero_padded_window():
    from sessrec.models.bsarec import low_pass_matrix

    p = low_pass_matrix(9, 3)
    torch.testing.assert_close(p, p.T)
    torch.testing.assert_close(p @ p, p, atol=1e-6, rtol=0)  # a projection
    assert abs(float(torch.trace(p)) - 5.0) < 1e-5  # DC and two bins of a real signal: 1 + 2 + 2 dimensions
    x = torch.randn(9, 4, dtype=torch.float64)
    x[:5] = 0  # a session of 4 items right-aligned in the window, padding read as 0
    spectrum = torch.fft.rfft(x, dim=0, norm="ortho")
    spectrum[3:] = 0
    expected = torch.fft.irfft(spectrum, n=9, dim=0, norm="ortho")
    torch.testing.assert_close(p.double() @ x, expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(low_pass_matrix(8, 1), torch.full((8, 8), 1 / 8))  # one bin: the window's mean


def test_bsarec_block_matches_its_formula():
    """h = alpha LN1(x + low + beta^2 (x - low)) + (1 - alpha) LN2(x + A(x)); out = LN3(h + FFN(h))."""
    enc = encoder("bsarec")
    x, mask, _ = padded(seed=6)
    allowed = causal_attention_mask(mask)
    with torch.no_grad():
        h = x
        for block in enc.blocks:
            f = block.frequency
            low = f.low_pass[-7:, -7:] @ (h * mask.unsqueeze(-1))
            freq = f.norm(h + low + f.sqrt_beta**2 * (h - low))
            mixed = 0.7 * freq + 0.3 * block.attn_norm(h + block.attn(h, allowed))
            h = block.ffn_norm(mixed + block.ffn(mixed))
        torch.testing.assert_close(enc(x, mask), h, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("cls", [XLNetEncoder, BertEncoder, ElectraEncoder, GPT2Encoder, SASRecEncoder, BSARecEncoder])
@pytest.mark.parametrize(("kwargs", "message"), [
    ({"d_inner": 0}, "d_inner must be an integer >= 1, got 0"),
    ({"d_inner": -4}, "d_inner must be an integer >= 1, got -4"),
    ({"initializer_range": -1.0}, "initializer_range must be a finite std >= 0 or None, got -1.0"),
    ({"initializer_range": float("nan")}, "initializer_range must be a finite std >= 0 or None, got nan"),
])
def test_a_feed_forward_width_or_init_scale_out_of_range_is_refused_naming_the_encoder(cls, kwargs, message):
    """d_inner 0 is no default width (it built 4 * d_model, or a feed-forward of no unit), a negative one failed
    deep in torch, and so did a negative init std: each is one line naming the encoder and the setting."""
    with pytest.raises(ValueError, match=rf"^{cls.__name__} {message}$"):
        cls(d_model=16, n_head=2, **kwargs)


def test_an_hstu_init_scale_out_of_range_is_refused_naming_the_encoder():
    with pytest.raises(ValueError, match=r"^HSTUEncoder initializer_range must be a finite std >= 0 or None, got -1.0$"):
        HSTUEncoder(d_model=16, n_head=2, initializer_range=-1.0)


def test_bsarec_settings_and_objectives_it_cannot_take_are_refused():
    with pytest.raises(ValueError, match=r"reads at most window=9 positions, got sessions of 10"):
        encoder("bsarec")(torch.randn(1, 10, 16), torch.ones(1, 10, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"frequencies \(6\) must be at most window // 2 \+ 1 = 5"):
        BSARecEncoder(d_model=16, window=8, frequencies=6)
    with pytest.raises(ValueError, match="alpha"):
        BSARecEncoder(d_model=16, alpha=1.5)
    with pytest.raises(ValueError, match="needs a causal encoder, but BSARecEncoder is bidirectional"):
        CausalLanguageModeling().check(encoder("bsarec"))
    MaskedItemModeling(last_item_prob=1.0).check(encoder("bsarec"))


def test_a_bsarec_window_shorter_than_what_the_model_reads_is_refused_before_training():
    """A [MASK] slot follows max_length items at evaluation: a window of max_length trained, then failed there."""
    with pytest.raises(ValueError, match=r"^BSARecEncoder window=9 is shorter than the 10 positions the model reads "
                                         r"\(max_length 9 and the \[MASK\] slot\): set window to 10 or more$"):
        SessionModel(30, encoder("bsarec"), max_length=9)
    SessionModel(30, encoder("bsarec"), max_length=8)(torch.tensor([[0] + list(range(2, 10))]))


def test_bsarec_session_span_filters_each_session_over_its_own_positions():
    from sessrec.models.bsarec import low_pass_matrix

    enc = encoder("bsarec-session")
    branch = enc.blocks[0].frequency
    x, mask, lengths = padded(seed=7)
    with torch.no_grad():
        branch.sqrt_beta.zero_()  # beta 0: the branch is LN(x + low)
        got = branch(x, mask)
        for row, n in enumerate(lengths.tolist()):
            low = low_pass_matrix(n, min(3, n // 2 + 1)) @ x[row, 7 - n :]
            torch.testing.assert_close(got[row, 7 - n :], branch.norm(x[row, 7 - n :] + low), atol=1e-5, rtol=1e-4)
    assert torch.equal(branch.low_pass[1], torch.diag(torch.tensor([0.0] * 8 + [1.0])))  # one item: its own mean
    with pytest.raises(ValueError, match="span must be 'window' or 'session', got 'row'"):
        BSARecEncoder(d_model=16, span="row")
