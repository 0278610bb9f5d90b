"""Training objectives: targets, inputs, never-leaking attention patterns, and refused pairs."""

import itertools
import re

import pytest
import torch
from torch import nn

from sessrec.models import (
    BertEncoder,
    CausalLanguageModeling,
    ElectraEncoder,
    GPT2Encoder,
    GRU4RecEncoder,
    MaskedItemModeling,
    PermutationLanguageModeling,
    ReplacedTokenDetection,
    SASRecEncoder,
    SessionModel,
    XLNetEncoder,
)
from sessrec.tasks import NextItemTask

torch.set_num_threads(1)

ITEMS = torch.tensor(
    [
        [0, 0, 0, 5, 6, 7, 8],
        [0, 0, 0, 0, 0, 0, 9],  # one item: nothing precedes it (CLM has no target)
        [3, 1, 4, 1, 5, 9, 2],  # 1 = OOV: never a target
        [0, 0, 0, 0, 0, 1, 1],  # only OOV: nothing to predict
        [0, 0, 0, 0, 12, 12, 13],
    ]
)


def random_sessions(n=64, length=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    items = torch.randint(2, 60, (n, length), generator=g)
    items[torch.rand(n, length, generator=g) < 0.05] = 1  # some OOV
    pad = torch.randint(0, length, (n,), generator=g)
    return items.masked_fill(torch.arange(length)[None, :] < pad[:, None], 0)  # left padding


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def tiny(encoder, num_items=30, seed=0):
    torch.manual_seed(seed)
    return SessionModel(num_items, encoder, max_length=8, dropout=0.0).eval()


# ---------------------------------------------------------------- MLM


def test_mlm_reads_exactly_the_masked_slots():
    items = random_sessions()
    m = MaskedItemModeling(mask_prob=0.3)(items, gen())
    assert torch.equal(m.read, m.masked)
    assert torch.equal(m.targets, items[m.masked])
    assert (m.inputs[m.masked] == 0).all() and torch.equal(m.inputs[~m.masked], items[~m.masked])
    assert (m.targets >= 2).all()
    has_known = (items >= 2).any(dim=1)
    assert torch.equal(m.masked.any(dim=1), has_known)


# ---------------------------------------------------------------- CLM


def test_clm_targets_are_the_sequence_shifted_by_one():
    m = CausalLanguageModeling()(ITEMS)
    assert torch.equal(m.inputs, ITEMS) and not m.masked.any()  # nothing is hidden: the encoder is causal
    assert m.read.tolist() == [
        [False, False, False, True, True, True, False],
        [False] * 7,
        [False, True, False, True, True, True, False],  # 3->1, 4->1 skipped (OOV is never a target); 1->4 kept
        [False] * 7,
        [False, False, False, False, True, True, False],
    ]
    assert m.targets.tolist() == [6, 7, 8, 4, 5, 9, 2, 12, 13]
    assert torch.equal(m.targets, ITEMS[:, 1:][m.read[:, :-1]])
    assert not m.read[:, -1].any()


def test_clm_last_only_reads_the_transition_to_each_rows_last_item():
    m = CausalLanguageModeling(last_only=True)(ITEMS)
    assert m.read.tolist() == [[False] * 5 + [True, False], [False] * 7, [False] * 5 + [True, False], [False] * 7, [False] * 5 + [True, False]]
    assert m.targets.tolist() == [8, 2, 13]


def test_clm_last_only_over_every_prefix_trains_the_pairs_of_clm_over_the_sessions():
    """Each prefix row (what the data module's ``train_prefixes`` gives), right-aligned, read at its last transition:
    the same (history, target) pairs as CLM over the whole sessions, each once."""
    items = random_sessions(seed=5)
    full = CausalLanguageModeling()(items)
    rows_pos = full.read.nonzero().tolist()
    expected = sorted((tuple(items[b, : i + 1][items[b, : i + 1] != 0].tolist()), int(items[b, i + 1])) for b, i in rows_pos)
    prefixes = []
    for b in range(items.shape[0]):
        real = items[b][items[b] != 0]
        for end in range(2, len(real) + 1):
            prefixes.append(torch.cat([torch.zeros(items.shape[1] - end, dtype=items.dtype), real[:end]]))
    rows = torch.stack(prefixes)
    last = CausalLanguageModeling(last_only=True)(rows)
    got = sorted((tuple(r[: -1][r[: -1] != 0].tolist()), int(t)) for r, t in zip(rows[last.read.any(dim=1)], last.targets, strict=True))
    assert got == expected and len(got) == len(full.targets) > 0


def test_clm_every_session_with_a_successor_has_a_target():
    items = random_sessions(seed=3)
    m = CausalLanguageModeling()(items)
    possible = ((items[:, :-1] != 0) & (items[:, 1:] >= 2)).any(dim=1)
    assert torch.equal(m.read.any(dim=1), possible)
    assert (m.targets >= 2).all()
    assert (items[m.read] != 0).all()  # read only at real items


@pytest.mark.parametrize("name", ["gpt2", "sasrec", "gru4rec"])
def test_clm_hidden_state_never_depends_on_its_target(name):
    """Through the whole model (positions included): the state read at i is blind to items after i."""
    model = tiny(ENCODERS[name]())
    items = torch.tensor([[0, 0, 4, 5, 6, 7, 8, 9]])
    m = CausalLanguageModeling()(items)
    with torch.no_grad():
        base = model.encode(m.inputs, m.masked)[0]
        for pos in range(3, 8):
            changed = items.clone()
            changed[0, pos:] = 20
            torch.testing.assert_close(model.encode(changed, m.masked)[0, :pos], base[:pos])


# ---------------------------------------------------------------- PLM


def test_plm_targets_inputs_and_target_mapping():
    items = random_sessions(seed=1)
    m = PermutationLanguageModeling(target_prob=0.3)(items, gen(1))
    assert torch.equal(m.inputs, items) and not m.masked.any()  # XLNet's query stream hides the content
    assert torch.equal(m.targets, items[m.read]) and (m.targets >= 2).all()
    # a session with two or more items has a target and keeps a context item; one item: no target
    real = (items != 0).sum(dim=1)
    assert torch.equal(m.read.any(dim=1), (items >= 2).any(dim=1) & (real >= 2))
    assert ((items != 0) & ~m.read).any(dim=1).all()
    # target_mapping: the k-th valid row of a session is one-hot at its k-th target position
    assert torch.equal(m.target_mapping.sum(dim=2) == 1, m.valid)
    assert torch.equal(m.target_mapping.sum(dim=1).bool(), m.read)
    positions = m.target_mapping.argmax(dim=2)[m.valid]  # (N,) in row-major order
    rows = m.valid.nonzero()[:, 0]
    assert torch.equal(items[rows, positions], m.targets)


def test_plm_perm_mask_never_lets_a_target_see_itself():
    items = random_sessions(seed=2)
    m = PermutationLanguageModeling(target_prob=0.4)(items, gen(2))
    blocked = m.perm_mask.bool()  # (B, L, L): i may not attend to j
    target = m.read
    diag = blocked.diagonal(dim1=1, dim2=2)
    assert torch.equal(diag, target)  # targets never see themselves; context items do (content stream)
    # every query may see every context item
    assert not (blocked & ~target[:, None, :]).any()
    # context items see no target at all
    assert (blocked | ~(~target[:, :, None] & target[:, None, :])).all()
    # among the targets, "i sees j" is a strict order: exactly one of two distinct targets sees the other
    sees = ~blocked & target[:, :, None] & target[:, None, :]
    pair = target[:, :, None] & target[:, None, :] & ~torch.eye(items.shape[1], dtype=torch.bool)
    assert torch.equal((sees ^ sees.transpose(1, 2)) & pair, pair)
    assert not (sees & sees.transpose(1, 2)).any()


def test_plm_query_stream_never_sees_its_own_target():
    """Changing a target item changes nothing in its own prediction (it can change later targets')."""
    model = tiny(XLNetEncoder(d_model=16, n_head=2, n_layer=2, dropout=0.0))
    items = torch.tensor([[0, 0, 4, 5, 6, 7, 8, 9]])
    plm = PermutationLanguageModeling(target_prob=0.5, last_item_prob=0.0)
    m = plm(items, gen(5))
    assert m.read.sum() >= 2
    kw = {"perm_mask": m.perm_mask, "target_mapping": m.target_mapping}
    with torch.no_grad():
        base = model.encode(m.inputs, m.masked, **kw)[m.valid]  # (N, D)
        for k, pos in enumerate(m.read[0].nonzero()[:, 0]):
            changed = m.inputs.clone()
            changed[0, pos] = 20
            torch.testing.assert_close(model.encode(changed, m.masked, **kw)[m.valid][k], base[k])


def test_plm_never_leaves_a_target_without_context():
    """Every item chosen: the earliest becomes context, and no target's query sees its own item.

    A target that sees no item at all would attend evenly to every key, its own content among them
    (HF XLNet masks with -1e30, which a row masked everywhere cannot tell apart).
    """
    model = tiny(XLNetEncoder(d_model=16, n_head=2, n_layer=2, dropout=0.0))
    items = torch.tensor([[0, 0, 0, 0, 0, 4, 5, 6], [0, 0, 0, 0, 0, 0, 0, 7], [0, 0, 0, 0, 0, 0, 8, 9]])
    m = PermutationLanguageModeling(target_prob=1.0, last_item_prob=0.0)(items, gen(3))
    assert m.read.tolist() == [[False] * 6 + [True, True], [False] * 8, [False] * 7 + [True]]
    assert m.targets.tolist() == [5, 6, 9]
    kw = {"perm_mask": m.perm_mask, "target_mapping": m.target_mapping}
    with torch.no_grad():
        base = model.encode(m.inputs, m.masked, **kw)[m.valid]  # (N, D)
        for k, (row, pos) in enumerate(m.read.nonzero().tolist()):
            changed = m.inputs.clone()
            changed[row, pos] = 20
            torch.testing.assert_close(model.encode(changed, m.masked, **kw)[m.valid][k], base[k])


def test_plm_evaluation_reads_an_unseen_slot():
    model = tiny(XLNetEncoder(d_model=16, n_head=2, n_layer=1, dropout=0.0))
    plm = PermutationLanguageModeling()
    with torch.no_grad():
        h = plm.next_item_hidden(model, torch.tensor([[0, 4, 5, 6], [7, 8, 9, 10]]))
        assert h.shape == (2, 16)
        torch.testing.assert_close(plm.next_item_hidden(model, torch.tensor([[4, 5, 6]])), h[:1])
        assert not torch.allclose(plm.next_item_hidden(model, torch.tensor([[0, 4, 5, 7]])), h[:1])


# ---------------------------------------------------------------- RTD


def bound_rtd(**kw):
    rtd = ReplacedTokenDetection(**kw)
    torch.manual_seed(0)
    model = SessionModel(60, ElectraEncoder(d_model=16, n_head=2, n_layer=1, dropout=0.0), max_length=12, dropout=0.0)
    rtd.bind(model)
    return rtd, model


def test_rtd_masks_and_replaces_disjoint_known_items():
    items = random_sessions(seed=4)
    rtd, _ = bound_rtd(mask_prob=0.2, replace_prob=0.3)
    m = rtd(items, gen(4))
    assert not (m.masked & m.replace).any()
    assert not m.replace[items < 2].any() and not m.masked[items < 2].any()
    assert torch.equal(m.targets, items[m.masked]) and torch.equal(m.read, m.masked)
    assert (m.inputs[m.masked] == 0).all()
    assert torch.equal(m.masked.any(dim=1), (items >= 2).any(dim=1))
    assert m.replace.float().sum() / ((items >= 2) & ~m.masked).sum() == pytest.approx(0.3, abs=0.08)


def test_rtd_labels_are_one_exactly_where_the_sample_differs():
    items = random_sessions(seed=5)
    rtd, _ = bound_rtd(replace_prob=0.5)
    m = rtd(items, gen(5))
    original = items[m.replace]
    samples = original.clone()
    samples[::2] = (samples[::2] + 1) % 60 + 2  # half differ, half equal the original
    inputs, labels = ReplacedTokenDetection.corrupt(m, samples)
    assert torch.equal(inputs[m.replace], samples)
    assert torch.equal(inputs[~m.replace], m.inputs[~m.replace])  # masked slots stay 0, the rest original
    expected = torch.zeros_like(labels)
    expected[m.replace] = (samples != original).float()
    assert torch.equal(labels, expected)
    assert labels.sum() == (samples != original).sum() > 0


def test_rtd_proposals_follow_the_generator_and_never_special_ids():
    rtd, _ = bound_rtd()
    logits = torch.full((500, 6), -2.0)
    logits[:, :2] = float("-inf")
    logits[:, 4] = 3.0
    a = rtd.propose(logits, gen(7))
    assert torch.equal(a, rtd.propose(logits, gen(7)))
    assert (a >= 2).all()
    share = (a == 4).float().mean().item()
    assert share == pytest.approx(torch.softmax(logits[0], 0)[4].item(), abs=0.05)


def test_rtd_discriminator_never_sees_a_masked_item():
    items = random_sessions(seed=6)
    rtd, model = bound_rtd(mask_prob=0.3, replace_prob=0.3)
    seen = []
    model.item_embedding.register_forward_pre_hook(lambda mod, args: seen.append(args[0].clone()))
    out = rtd.training_output(model, items, gen(6))
    m = rtd(items, gen(6))  # the same draw
    generator_ids, discriminator_ids = seen
    hide = m.masked | m.replace
    assert (generator_ids[hide] == 0).all() and torch.equal(generator_ids[~hide], items[~hide])
    assert (discriminator_ids[m.masked] == 0).all()
    assert torch.equal(discriminator_ids[~hide], items[~hide])
    assert torch.equal(out.targets, items[m.masked])
    assert out.hidden.shape == (len(out.targets), 16)
    assert torch.isfinite(out.aux_loss) and out.aux_loss > 0
    assert set(out.logs) == {"rtd_generator_loss", "rtd_discriminator_loss", "rtd_replaced"}


def test_rtd_generator_of_another_width_and_unbound_use():
    rtd = ReplacedTokenDetection(generator_encoder=BertEncoder(d_model=8, n_head=1, n_layer=1))
    with pytest.raises(RuntimeError, match="bind"):
        rtd.training_output(tiny(ElectraEncoder(d_model=16, n_head=2, n_layer=1)), ITEMS, gen())
    model = tiny(ElectraEncoder(d_model=16, n_head=2, n_layer=1))
    rtd.bind(model)
    assert isinstance(rtd.generator_in, nn.Linear) and rtd.generator_in.out_features == 8
    out = rtd.training_output(model, ITEMS, gen())
    assert torch.isfinite(out.aux_loss)
    with pytest.raises(ValueError, match="generator must be bidirectional"):
        ReplacedTokenDetection(generator_encoder=GPT2Encoder(d_model=16, n_head=2, n_layer=1))


@pytest.mark.parametrize("kw", [{"replace_prob": 1.5}, {"temperature": 0.0}, {"discriminator_weight": -1.0}, {"mask_prob": 0.0}])
def test_rtd_rejects_bad_settings(kw):
    with pytest.raises(ValueError):
        ReplacedTokenDetection(**kw)


@pytest.mark.parametrize("kw, message", [
    ({"temperature": float("nan")}, "temperature must be a finite positive number, got nan"),
    ({"temperature": float("inf")}, "temperature must be a finite positive number, got inf"),
    ({"generator_weight": float("nan")}, "loss weights must be finite numbers >= 0, got nan and 1.0"),
    ({"discriminator_weight": float("inf")}, "loss weights must be finite numbers >= 0, got 1.0 and inf"),
])
def test_rtd_refuses_settings_that_are_no_finite_numbers(kw, message):
    """A NaN weight or temperature makes the loss NaN, an infinite temperature proposes uniformly at random."""
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        ReplacedTokenDetection(**kw)


@pytest.mark.parametrize("kw", [{"target_prob": 0.0}, {"last_item_prob": 2.0}])
def test_plm_rejects_bad_settings(kw):
    with pytest.raises(ValueError):
        PermutationLanguageModeling(**kw)


# ---------------------------------------------------------------- pairs


ENCODERS = {
    "xlnet": lambda: XLNetEncoder(d_model=16, n_head=2, n_layer=1),
    "bert": lambda: BertEncoder(d_model=16, n_head=2, n_layer=1),
    "electra": lambda: ElectraEncoder(d_model=16, n_head=2, n_layer=1),
    "gpt2": lambda: GPT2Encoder(d_model=16, n_head=2, n_layer=1),
    "sasrec": lambda: SASRecEncoder(d_model=16, n_head=2, n_layer=1),
    "gru4rec": lambda: GRU4RecEncoder(d_model=16),
}
OBJECTIVES = {
    "mlm": MaskedItemModeling,
    "clm": CausalLanguageModeling,
    "plm": PermutationLanguageModeling,
    "rtd": ReplacedTokenDetection,
}
VALID = {
    ("xlnet", "mlm"), ("xlnet", "plm"), ("xlnet", "rtd"), ("bert", "mlm"), ("bert", "rtd"), ("electra", "mlm"),
    ("electra", "rtd"), ("gpt2", "clm"), ("sasrec", "clm"), ("gru4rec", "clm"),
}
REASON = {"mlm": "bidirectional encoder", "rtd": "bidirectional encoder", "clm": "causal encoder", "plm": "XLNetEncoder"}


@pytest.mark.parametrize("enc,obj", list(itertools.product(ENCODERS, OBJECTIVES)))
def test_invalid_pairs_are_refused_when_the_task_is_built(enc, obj):
    def make():
        return NextItemTask(num_items=30, max_length=8, encoder=ENCODERS[enc](), objective=OBJECTIVES[obj]())

    if (enc, obj) in VALID:
        task = make()
        task.eval()
        with torch.no_grad():
            assert task.model(ITEMS, task.objective).shape == (len(ITEMS), 30)
    else:
        with pytest.raises(ValueError, match=REASON[obj]):
            make()


@pytest.mark.parametrize("enc,obj", [("bert", "clm"), ("sasrec", "mlm")])
def test_research_code_that_skips_bind_is_refused_at_its_first_training_step(enc, obj):
    """Without `bind`, CLM trained a bidirectional encoder whose every position saw the item it predicts."""
    model = SessionModel(num_items=30, encoder=ENCODERS[enc](), max_length=8)
    with pytest.raises(ValueError, match=REASON[obj]):
        OBJECTIVES[obj]().training_output(model, ITEMS)


@pytest.mark.parametrize("enc,obj", sorted(VALID))
def test_training_sessions_wider_than_the_network_reads_are_refused(enc, obj):
    """A data module of max_length 12 and a SessionModel of 8 (say) trained items past the 8th on clamped positions,
    which evaluation (the latest 8 items) never reads: refused at the first training step, naming both widths."""
    model, objective = tiny(ENCODERS[enc](), num_items=60), OBJECTIVES[obj]()
    objective.bind(model)
    wide = torch.randint(2, 60, (4, 12), generator=gen())
    with pytest.raises(ValueError, match=r"^training sessions of 12 items are wider than the 8 the network reads "
                                         r"\(SessionModel max_length\): build it with max_length=12, or pass each "
                                         r"session's latest 8 items$"):
        objective.training_output(model, wide, gen())
    assert len(objective.training_output(model, wide[:, -8:], gen()).targets)


def test_an_encoder_must_say_whether_it_is_causal():
    class Plain(nn.Module):
        d_model = 16

        def forward(self, x, mask):
            return x

    with pytest.raises(TypeError, match="causal: bool"):
        MaskedItemModeling().check(Plain())


def test_an_appended_mask_slot_takes_the_last_event_time():
    """The [MASK] slot's time is the latest known (the last item's), never 0 nor the next event's; side features get 0."""
    from sessrec.models.objective import EVENT_TIMES, append_slot, latest

    items = torch.tensor([[0, 5, 6], [7, 8, 9]])
    times = torch.tensor([[0.0, 100.0, 160.0], [10.0, 20.0, 35.0]], dtype=torch.float64)
    inputs, features = append_slot(items, {EVENT_TIMES: times, "price": torch.ones(2, 3)}, max_length=2)
    assert inputs.tolist() == [[5, 6, 0], [8, 9, 0]]  # the latest 2 items and the slot
    assert features[EVENT_TIMES].tolist() == [[100.0, 160.0, 160.0], [20.0, 35.0, 35.0]]
    assert features["price"].tolist() == [[1, 1, 0], [1, 1, 0]]
    _, cropped = latest(items, {EVENT_TIMES: times}, max_length=2)  # a causal read keeps the latest columns
    assert cropped[EVENT_TIMES].tolist() == [[100.0, 160.0], [20.0, 35.0]]
