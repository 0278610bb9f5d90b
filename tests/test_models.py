"""Masking objective and session model: targets, shapes, padding invariance, no special ids."""

import re

import pytest
import torch

from sessrec.data import SessionBatch
from sessrec.models import CausalLanguageModeling, GPT2Encoder, MaskedItemModeling, SessionModel, XLNetEncoder
from sessrec.models.objective import realign

torch.set_num_threads(1)


def tiny_model(num_items=50, seed=0, **kw):
    torch.manual_seed(seed)
    return SessionModel(num_items, XLNetEncoder(d_model=16, n_head=2, n_layer=1, dropout=0.0), max_length=8, **kw).eval()


ITEMS = torch.tensor(
    [
        [0, 0, 0, 5, 6, 7, 8],
        [0, 0, 0, 0, 0, 0, 9],
        [3, 1, 4, 1, 5, 9, 2],  # 1 = OOV: never a target
        [0, 0, 0, 0, 0, 1, 1],  # only OOV: nothing to predict
    ]
)


def test_masking_targets_are_the_masked_items_and_inputs_hide_them():
    m = MaskedItemModeling(mask_prob=0.5, last_item_prob=0.0)(ITEMS, torch.Generator().manual_seed(0))
    assert torch.equal(m.targets, ITEMS[m.masked])
    assert (m.inputs[m.masked] == 0).all()
    assert torch.equal(m.inputs[~m.masked], ITEMS[~m.masked])
    assert not m.masked[ITEMS < 2].any()  # never padding or OOV
    assert m.masked[:3].any(dim=1).all()  # at least one target where one is possible
    assert not m.masked[3].any()


def test_masking_is_seeded_and_rate_is_right():
    items = torch.randint(2, 100, (2000, 20))
    a = MaskedItemModeling(mask_prob=0.3, last_item_prob=0.0)(items, torch.Generator().manual_seed(1))
    b = MaskedItemModeling(mask_prob=0.3, last_item_prob=0.0)(items, torch.Generator().manual_seed(1))
    assert torch.equal(a.masked, b.masked)
    assert a.masked.float().mean().item() == pytest.approx(0.3, abs=0.01)


def test_last_item_masking_is_the_evaluation_shape():
    m = MaskedItemModeling(mask_prob=0.2, last_item_prob=1.0)(ITEMS[:2], torch.Generator().manual_seed(0))
    expected = torch.zeros_like(ITEMS[:2], dtype=torch.bool)
    expected[:, -1] = True
    assert torch.equal(m.masked, expected)
    assert m.targets.tolist() == [8, 9]


@pytest.mark.parametrize("kw", [{"mask_prob": 0.0}, {"mask_prob": 1.5}, {"last_item_prob": -0.1}])
def test_masking_rejects_bad_probabilities(kw):
    with pytest.raises(ValueError):
        MaskedItemModeling(**kw)


def test_scores_shape_and_never_recommend_padding_or_oov():
    model = tiny_model()
    scores = model(SessionBatch(items=ITEMS))
    assert scores.shape == (4, 50)
    assert torch.isinf(scores[:, :2]).all() and (scores[:, :2] < 0).all()
    assert torch.isfinite(scores[:, 2:]).all()
    assert not (scores.topk(5).indices < 2).any()


def test_left_padding_does_not_change_scores():
    model = tiny_model()
    short = torch.tensor([[5, 6, 7]])
    padded = torch.tensor([[0, 0, 0, 5, 6, 7]])
    torch.testing.assert_close(model(short), model(padded))


@pytest.mark.parametrize("encoder", [XLNetEncoder, GPT2Encoder])
def test_sessions_padded_on_the_right_are_refused_naming_the_row(encoder):
    """The last column is read as the latest item: a row with padding after an item (left-aligned, or a
    hole) is a one-line ValueError, as the baselines refuse it, not scores of the padding slot."""
    torch.manual_seed(0)
    model = SessionModel(50, encoder(d_model=16, n_head=2, n_layer=1), max_length=8).eval()
    for items, row in ((torch.tensor([[0, 5, 6, 7], [5, 6, 7, 0]]), 1), (torch.tensor([[5, 0, 6, 7]]), 0)):
        with pytest.raises(ValueError, match=rf"^items must be right-aligned: padding \(0\) only on the left of each row; "
                                             rf"row {row} has padding after an item"):
            model(items)
    assert model(torch.tensor([[0, 0, 0, 0], [0, 5, 6, 7]])).shape == (2, 50)  # an empty row is padding only


@pytest.mark.parametrize("encoder", [XLNetEncoder, GPT2Encoder])
def test_items_of_another_shape_than_sessions_by_positions_are_refused_naming_the_shape(encoder):
    """A (L,) session, a (B, 1, L) stack or sessions of no column is a one-line ValueError naming the shape."""
    torch.manual_seed(0)
    model = SessionModel(50, encoder(d_model=16, n_head=2, n_layer=1), max_length=8).eval()
    for items, shape in ((torch.tensor([5, 6, 7]), "(3,)"), (torch.tensor([[[5, 6, 7]]]), "(1, 1, 3)"),
                         (torch.zeros(2, 0, dtype=torch.long), "(2, 0)")):
        with pytest.raises(ValueError, match=rf"^items: sessions are a \(B, L\) tensor of model ids, L >= 1, got shape "
                                             rf"{shape.replace('(', '[(]').replace(')', '[)]')}$"):
            model(items)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"max_length": 0}, "SessionModel max_length must be an integer >= 1, got 0"),
    ({"max_length": -2}, "SessionModel max_length must be an integer >= 1, got -2"),
    ({"max_length": 2.5}, "SessionModel max_length must be an integer >= 1, got 2.5"),
    ({"num_items": 20.5}, "SessionModel num_items must be an integer >= 1, got 20.5"),
    ({"num_virtual": 1.5}, "SessionModel num_virtual must be an integer >= 0, got 1.5"),
    ({"score_scale": float("nan")}, "SessionModel score_scale must be a positive finite number or None, got nan"),
    ({"score_scale": float("inf")}, "SessionModel score_scale must be a positive finite number or None, got inf"),
])
def test_a_session_model_of_settings_out_of_range_is_refused_in_one_line(kwargs, message):
    """A window of no item (which a causal model read as the whole session, ``items[:, -0:]``), a count that
    is no integer, or a score scale that makes every score NaN is refused naming the setting."""
    settings = {"num_items": 20, "encoder": GPT2Encoder(d_model=8, n_head=2, n_layer=1), **kwargs}
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        SessionModel(**settings)


def test_longer_inputs_keep_the_most_recent_items():
    model = tiny_model()  # max_length 9 = 8 items + [MASK]
    long = torch.arange(2, 14).unsqueeze(0)  # 12 items
    torch.testing.assert_close(model(long), model(long[:, -8:]))


def test_seeded_model_is_deterministic_and_order_sensitive():
    a, b = tiny_model(seed=3), tiny_model(seed=3)
    x = torch.tensor([[4, 5, 6]])
    torch.testing.assert_close(a(x), b(x))
    assert not torch.allclose(a(x), a(torch.tensor([[6, 5, 4]])))


def test_default_reading_follows_the_encoder():
    """Without an objective: a [MASK] slot for bidirectional encoders, the last item for causal ones."""
    x = torch.tensor([[0, 4, 5, 6], [3, 4, 9, 12]])
    bidirectional = tiny_model()
    torch.testing.assert_close(bidirectional(x), bidirectional(x, MaskedItemModeling()))
    torch.manual_seed(0)
    causal = SessionModel(50, GPT2Encoder(d_model=16, n_head=2, n_layer=1, dropout=0.0), max_length=8).eval()
    torch.testing.assert_close(causal(x), causal(x, CausalLanguageModeling()))
    with torch.no_grad():
        last = causal.encode(x, torch.zeros_like(x, dtype=torch.bool))[:, -1]
    torch.testing.assert_close(causal(x), causal.score(last))


def test_encoder_validates_heads():
    with pytest.raises(ValueError, match="multiple of n_head"):
        XLNetEncoder(d_model=30, n_head=4)


@pytest.mark.slow
def test_tiny_model_learns_a_transition():
    """A few hundred steps of MLM on a deterministic chain a -> a+1 must rank the successor first."""
    torch.manual_seed(0)
    model = SessionModel(22, XLNetEncoder(d_model=16, n_head=2, n_layer=1, dropout=0.0), max_length=6, dropout=0.0)
    starts = torch.randint(2, 16, (256,))
    items = starts[:, None] + torch.arange(6)[None, :]  # (256, 6) ids 2..21
    objective = MaskedItemModeling(mask_prob=0.3, last_item_prob=0.3)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    for _ in range(150):
        m = objective(items, gen)
        logits = model.score(model.encode(m.inputs, m.masked)[m.masked])
        loss = torch.nn.functional.cross_entropy(logits, m.targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        pred = model(torch.tensor([[4, 5, 6], [10, 11, 12]])).argmax(dim=1)
    assert pred.tolist() == [7, 13]


def test_score_scale_is_scaled_cosine_similarity():
    model = tiny_model(score_scale=10.0)
    hidden = torch.randn(3, 16)
    with torch.no_grad():
        model.item_embedding.weight[5] *= 100.0  # a long vector must not win by its length alone
        model.output_bias.fill_(0.25)
        scores = model.score(hidden)
    w = model.item_embedding.weight
    expected = 10.0 * (hidden / hidden.norm(dim=1, keepdim=True)) @ (w[2:] / w[2:].norm(dim=1, keepdim=True)).T + 0.25
    torch.testing.assert_close(scores[:, 2:], expected)
    assert scores[:, 2:].abs().max() <= 10.25 + 1e-5
    assert torch.isinf(scores[:, :2]).all()
    with pytest.raises(ValueError, match="score_scale"):
        tiny_model(score_scale=0.0)


@pytest.mark.parametrize("score_scale", [None, 4.0])
def test_candidate_scores_are_the_full_scores_of_those_columns(score_scale):
    model = tiny_model(score_scale=score_scale)
    with torch.no_grad():
        model.output_bias.normal_()
    hidden, candidates = torch.randn(3, 16), torch.tensor([7, 2, 49, 7])
    torch.testing.assert_close(model.score(hidden, candidates), model.score(hidden)[:, candidates])
    targets = candidates[:3]
    torch.testing.assert_close(model.score_targets(hidden, targets), model.score(hidden, targets).diagonal())


def test_prefixes_keep_a_right_aligned_head_of_each_cut_session():
    items = torch.tensor([[0, 0, 5, 6, 7, 8], [0, 0, 0, 0, 3, 4], [9, 8, 7, 6, 5, 4]])
    objective = MaskedItemModeling(prefix_prob=1.0)
    seen = set()
    for seed in range(40):
        cut = realign(items, objective.prefix_source(items, torch.Generator().manual_seed(seed)))
        for row, original in zip(cut.tolist(), items.tolist()):
            real = [i for i in row if i]
            n = sum(1 for i in original if i)
            assert row[: len(row) - len(real)] == [0] * (len(row) - len(real))  # still right-aligned
            assert real == [i for i in original if i][: len(real)]  # a head of the session
            assert len(real) == n if n < 3 else 2 <= len(real) <= n - 1
            seen.add((n, len(real)))
    assert {(4, 2), (4, 3), (6, 2), (6, 5), (2, 2)} <= seen  # every allowed length is drawn
    untouched = MaskedItemModeling(prefix_prob=0.0).prefix_source(items, torch.Generator().manual_seed(0))
    assert torch.equal(realign(items, untouched), items)
    m = objective(items, torch.Generator().manual_seed(3))
    assert len(m.targets) >= 3 and not (m.inputs[m.masked] != 0).any()  # one target per session, hidden
    with pytest.raises(ValueError, match="prefix_prob"):
        MaskedItemModeling(prefix_prob=1.5)


@pytest.mark.parametrize("score_scale", [None, 3.0])
def test_sampled_head_lookups_give_the_dense_lookups_gradient_in_one_dense_table_gradient(score_scale):
    """`item_rows` (sparse lookup gradients, summed into the input embedding's dense one) trains exactly
    as dense `index_select` lookups of the same rows: same loss, same gradients, a dense table gradient."""
    import copy

    from sessrec.tasks.losses import SampledSoftmax

    torch.manual_seed(0)
    model = SessionModel(num_items=40, encoder=GPT2Encoder(d_model=8, n_head=2, n_layer=1, dropout=0.0), dropout=0.0,
                         score_scale=score_scale)
    reference = copy.deepcopy(model)
    reference.item_rows = lambda ids: reference.item_embedding.weight.index_select(0, ids)
    items = torch.tensor([[0, 5, 7, 9], [3, 4, 9, 12], [0, 0, 30, 31]])
    grads = []
    for net in (model, reference):
        out = CausalLanguageModeling().training_output(net, items, torch.Generator().manual_seed(1))
        loss = SampledSoftmax(num_samples=16)(net, out.hidden, out.targets, torch.Generator().manual_seed(2))
        loss.backward()
        grads.append({name: p.grad for name, p in net.named_parameters() if p.grad is not None})
    got, expected = grads
    assert got.keys() == expected.keys() and "item_embedding.weight" in got
    assert got["item_embedding.weight"].layout == torch.strided
    assert got["item_embedding.weight"][[9, 12, 31]].abs().sum() > 0  # targets and inputs receive gradient
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-7)


def test_a_mixed_precision_trainer_validates_tests_and_predicts_in_float32(tmp_path):
    """bfloat16 scores tie by the hundreds over a catalogue and a tie counts against the target: under
    ``precision="bf16-mixed"`` the evaluation loops must score as float32 does (what chooses the
    checkpoint, what `sessrec test` reports), while training steps still run in bfloat16."""
    import pytorch_lightning as pl

    from sessrec.data import SyntheticSource
    from sessrec.models import SASRecEncoder
    from sessrec.tasks import NextItemTask, SessionDataModule

    dm = SessionDataModule(source=SyntheticSource(num_sessions=600, num_items=3000, seed=0), max_length=10,
                           batch_size=64, eval_batch_size=128)
    torch.manual_seed(0)
    task = NextItemTask(num_items=dm.num_items, max_length=10, encoder=SASRecEncoder(d_model=32, n_head=2, n_layer=1),
                        objective=CausalLanguageModeling())
    quiet = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False, "enable_model_summary": False,
             "default_root_dir": tmp_path, "accelerator": "cpu"}
    mixed = pl.Trainer(precision="bf16-mixed", max_epochs=1, num_sanity_val_steps=0, **quiet)
    mixed.fit(task, dm)
    dtypes = []
    hook = task.model.register_forward_hook(lambda module, args, out: dtypes.append(out.dtype))
    full = pl.Trainer(**quiet)
    for run in ("validate", "test"):
        expected = getattr(full, run)(task, dm, verbose=False)[0]
        got = getattr(mixed, run)(task, dm, verbose=False)[0]
        assert got == expected and expected  # the same metrics, to the last bit
    loader = dm.test_dataloader()
    tops_full, tops_mixed = full.predict(task, loader), mixed.predict(task, loader)
    hook.remove()
    for top_full, top_mixed in zip(tops_full, tops_mixed, strict=True):
        assert torch.equal(top_mixed.items, top_full.items) and torch.equal(top_mixed.scores, top_full.scores)
    assert set(dtypes) == {torch.float32}
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the training side: the network itself runs in bfloat16
        assert task.model(next(iter(loader)).items, task.objective, None).dtype == torch.bfloat16
