"""Virtual (non-product) items: input tokens only — never training targets, never recommended,
never evaluation targets; the vocabulary keeps them as a contiguous id range after the products."""

import numpy as np
import pyarrow as pa
import pytest
import torch

from sessrec.data import SessionSplits, frame
from sessrec.data.sources import SessionSource
from sessrec.data.vocab import OOV, ItemVocab
from sessrec.models import (
    CausalLanguageModeling,
    ElectraEncoder,
    MaskedItemModeling,
    PermutationLanguageModeling,
    ReplacedTokenDetection,
    SASRecEncoder,
    SessionModel,
    XLNetEncoder,
)
from sessrec.tasks import NextItemTask, SessionDataModule

torch.set_num_threads(1)

# 12 ids: 0 padding, 1 OOV, 2..7 products, 8..11 virtual items
NUM_ITEMS, NUM_VIRTUAL = 12, 4
ITEMS = torch.tensor(
    [
        [0, 0, 8, 2, 9, 3, 4],
        [10, 5, 11, 8, 6, 9, 7],
        [0, 0, 0, 0, 8, 9, 10],  # only virtual items: nothing to predict
        [0, 0, 0, 2, 1, 8, 3],  # OOV and a virtual item between two products
    ]
)
IS_VIRTUAL = ITEMS >= NUM_ITEMS - NUM_VIRTUAL


def model_for(encoder, seed=0):
    torch.manual_seed(seed)
    return SessionModel(NUM_ITEMS, encoder, max_length=8, dropout=0.0, num_virtual=NUM_VIRTUAL).eval()


def test_vocab_puts_virtual_keys_after_products():
    raw = pa.array(["7", "search:Paris", "7", "9", "filter:4 Star", "search:Paris", "9", "7", "5"])
    virtual = np.array([0, 1, 0, 0, 1, 1, 0, 0, 0], dtype=bool)
    vocab = ItemVocab.fit(raw, virtual=virtual)
    assert vocab.raw_ids.to_pylist() == ["7", "9", "5", "search:Paris", "filter:4 Star"]
    assert vocab.counts.tolist() == [3, 2, 1, 2, 1]
    assert (vocab.num_products, vocab.num_virtual, len(vocab)) == (3, 2, 7)
    assert vocab.recommendable().tolist() == [False, False, True, True, True, False, False]
    # a virtual key is looked up among the virtual keys only, a product among the products only
    enc = vocab.encode(pa.array(["9", "search:Paris", "search:Paris", "nope", "filter:x"]), virtual=np.array([0, 1, 0, 0, 1], bool))
    assert enc.ids.tolist() == [3, 5, OOV, OOV, OOV] and enc.num_unknown == 3
    assert vocab.decode(np.array([2, 4, 5, 6, 0])).to_pylist() == ["7", "5", None, None, None]


def test_vocab_with_virtual_items_round_trips(tmp_path):
    vocab = ItemVocab.fit(pa.array(["a", "b", "v:1", "a"]), virtual=np.array([0, 0, 1, 0], bool))
    vocab.save(tmp_path / "vocab.parquet")
    again = ItemVocab.load(tmp_path / "vocab.parquet")
    assert again == vocab and again.num_virtual == 1
    plain = ItemVocab.fit(pa.array([3, 4, 4]))
    plain.save(tmp_path / "plain.parquet")
    assert ItemVocab.load(tmp_path / "plain.parquet").num_virtual == 0


def test_model_never_recommends_virtual_items():
    model = model_for(XLNetEncoder(d_model=16, n_head=2, n_layer=1))
    assert model.recommendable.tolist() == [False, False] + [True] * 6 + [False] * 4
    scores = model(ITEMS)
    assert torch.isneginf(scores[:, :2]).all() and torch.isneginf(scores[:, 8:]).all()
    assert torch.isfinite(scores[:, 2:8]).all()
    task = NextItemTask(num_items=NUM_ITEMS, max_length=8, encoder=XLNetEncoder(d_model=16, n_head=2, n_layer=1), num_virtual=NUM_VIRTUAL)
    task.eval()
    top = task.predict_step(type("B", (), {"items": ITEMS, "features": None})(), 0)
    assert top.items.shape == (4, 6)  # only six ids can be recommended
    assert ((top.items >= 2) & (top.items < 8)).all()


@pytest.mark.parametrize("kind", ["mlm", "clm", "plm", "rtd"])
def test_no_objective_targets_a_virtual_item(kind):
    encoders = {
        "mlm": lambda: XLNetEncoder(d_model=16, n_head=2, n_layer=1),
        "clm": lambda: SASRecEncoder(d_model=16, n_head=2, n_layer=1),
        "plm": lambda: XLNetEncoder(d_model=16, n_head=2, n_layer=1),
        "rtd": lambda: ElectraEncoder(d_model=16, n_head=2, n_layer=1),
    }
    objectives = {
        "mlm": lambda: MaskedItemModeling(mask_prob=1.0),
        "clm": CausalLanguageModeling,
        "plm": lambda: PermutationLanguageModeling(target_prob=1.0),
        "rtd": lambda: ReplacedTokenDetection(mask_prob=0.3, replace_prob=1.0),
    }
    model = model_for(encoders[kind]())
    objective = objectives[kind]()
    objective.bind(model)
    for seed in range(5):
        m = objective.mask(ITEMS, torch.Generator().manual_seed(seed), model.recommendable)
        target_at = m.read
        if kind == "clm":  # position i is read to predict the item at i + 1
            target_at = torch.zeros_like(m.read)
            target_at[:, 1:] = m.read[:, :-1]
        assert not (target_at & IS_VIRTUAL).any()
        assert ((m.targets >= 2) & (m.targets < 8)).all()
        out = objective.training_output(model, ITEMS, torch.Generator().manual_seed(seed))
        assert ((out.targets >= 2) & (out.targets < 8)).all()
        assert torch.isfinite(model.score(out.hidden).gather(1, out.targets[:, None])).all()
    if kind == "clm":  # read where the next item is a product (the reading position may be virtual)
        expected = [
            [False, False, True, False, True, True, False],
            [True, False, False, True, False, True, False],
            [False] * 7,
            [False, False, False, False, False, True, False],  # 2->1 skipped (OOV), 8->3 kept
        ]
        assert m.read.tolist() == expected
    if kind in ("mlm", "plm"):  # probability 1: every product, and only products
        assert torch.equal(m.read, (ITEMS >= 2) & ~IS_VIRTUAL)
        assert torch.equal(m.inputs[IS_VIRTUAL], ITEMS[IS_VIRTUAL])  # virtual items stay visible inputs
    if kind == "rtd":
        assert not (m.replace & IS_VIRTUAL).any()
        assert torch.equal(m.replace | m.masked, (ITEMS >= 2) & ~IS_VIRTUAL)
        logits = torch.randn(5, NUM_ITEMS) + model.never  # the generator's scores over the catalogue
        samples = objective.propose(logits, torch.Generator().manual_seed(0))
        assert ((samples >= 2) & (samples < 8)).all()


def test_default_rule_without_a_mask_is_unchanged():
    m = MaskedItemModeling(mask_prob=1.0)(ITEMS, torch.Generator().manual_seed(0))
    assert torch.equal(m.masked, ITEMS >= 2)  # no mask given: every id but padding and OOV


def test_expand_prefixes_skips_virtual_targets():
    offsets = np.array([0, 4, 6, 9])
    # session 0: p v p v ; session 1: v p ; session 2: v v p
    targetable = np.array([1, 0, 1, 0, 0, 1, 0, 0, 1], dtype=bool)
    session, target = frame.expand_prefixes(offsets, "last", targetable)
    assert session.tolist() == [0, 1, 2] and target.tolist() == [2, 5, 8]
    session, target = frame.expand_prefixes(offsets, "all_prefixes", targetable)
    assert session.tolist() == [0, 1, 2] and target.tolist() == [2, 5, 8]
    # a product that starts its session has nothing before it: never a target
    session, target = frame.expand_prefixes(np.array([0, 3]), "all_prefixes", np.array([1, 1, 1], bool))
    assert target.tolist() == [2, 1]


class VirtualSource(SessionSource):
    """Text item ids; "v:..." events are virtual."""

    def load(self) -> SessionSplits:
        def table(sessions, first):
            items = [[e for e in s] for s in sessions]
            virtual = [[e.startswith("v:") for e in s] for s in sessions]
            return pa.table({"session_id": list(range(first, first + len(items))), "item_id": items, "virtual": virtual})

        train = [["a", "v:x", "b", "c"], ["b", "c", "v:y"], ["a", "b"], ["v:x", "c", "a"]] * 5
        test = [["a", "v:x", "b", "v:y"], ["v:y", "c"], ["b", "v:x", "v:y"], ["c", "a", "v:x", "zzz"]]
        return SessionSplits(train=table(train, 0), valid=table(test, 100), test=table(test, 200))


@pytest.mark.parametrize("protocol", ["last", "all_prefixes"])
def test_evaluation_pairs_never_have_virtual_targets(protocol):
    dm = SessionDataModule(source=VirtualSource(), max_length=5, eval_protocol=protocol)
    assert (dm.num_items, dm.num_virtual) == (7, 2)  # a, b, c + v:x, v:y
    items, targets = dm.tensors("test")
    assert dm.vocab.raw_ids.to_pylist() == ["a", "b", "c", "v:x", "v:y"]  # equal counts: by raw id
    a, b, c, vx, vy = 2, 3, 4, 5, 6
    # the last product of a session (virtual events before it stay inputs, those after it go);
    # a product with nothing before it is never a target
    expected = [([a, vx], b), ([vy], c), ([c, a, vx], OOV)]
    if protocol == "all_prefixes":
        expected.append(([c], a))
    got = [([i for i in row if i], t) for row, t in zip(items.tolist(), targets.tolist())]
    assert got == expected
    assert not np.isin(targets.numpy(), [vx, vy]).any()
