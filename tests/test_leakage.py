"""No evaluation leakage: the target item never reaches the model's inputs at val/test/predict.

Transformers4Rec shipped this bug (its issues #738, #746): the item to predict was part of the
input at evaluation. Here every eval batch is checked by hooking the item embedding, i.e. the
exact tensor of ids the network consumes, through the real Lightning loops, for every
training objective (each reads the next item its own way).
"""

import numpy as np
import pyarrow as pa
import pytest
import pytorch_lightning as pl
import torch

from sessrec.data import SessionSplits, SideInfoSpec
from sessrec.data.sources import SessionSource, UserSequenceSource
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
from sessrec.models.side_info import SideInfoEmbedding
from sessrec.tasks import NextItemTask, SessionDataModule

torch.set_num_threads(1)


class NoRepeatSource(SessionSource):
    """Sessions of distinct items, so a target id inside its own prefix can only be a leak."""

    def load(self) -> SessionSplits:
        rng = np.random.default_rng(0)

        def table(n, first):
            lengths = rng.integers(2, 9, n)
            lists = [list(rng.choice(np.arange(100, 160), size=k, replace=False)) for k in lengths]
            return pa.table({"session_id": np.arange(first, first + n), "item_id": pa.array(lists, pa.list_(pa.int64()))})

        return SessionSplits(train=table(300, 0), valid=table(40, 1000), test=table(40, 2000))


class Recorder(pl.Callback):
    """Pairs each eval batch with the ids that the item embedding received for it."""

    def __init__(self, task: NextItemTask):
        self.seen: list[torch.Tensor] = []
        self.rows: list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]] = []
        task.model.item_embedding.register_forward_pre_hook(lambda mod, args: self.seen.append(args[0].clone()))

    def _record(self, batch):
        self.rows.append((batch.items.clone(), None if batch.targets is None else batch.targets.clone(), self.seen[-1]))

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self._record(batch)

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self._record(batch)


# (encoder, objective, whether evaluation appends an empty slot after the observed items)
OBJECTIVES = {
    "mlm": (lambda: XLNetEncoder(d_model=16, n_head=2, n_layer=1), MaskedItemModeling, True),
    "clm": (lambda: SASRecEncoder(d_model=16, n_head=2, n_layer=1), CausalLanguageModeling, False),
    "plm": (lambda: XLNetEncoder(d_model=16, n_head=2, n_layer=1), PermutationLanguageModeling, True),
    "rtd": (lambda: ElectraEncoder(d_model=16, n_head=2, n_layer=1), ReplacedTokenDetection, True),
}


@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("protocol", ["last", "all_prefixes"])
def test_targets_never_in_model_inputs(protocol, objective, tmp_path):
    make_encoder, make_objective, slot = OBJECTIVES[objective]
    dm = SessionDataModule(source=NoRepeatSource(), max_length=10, batch_size=32, eval_batch_size=16, eval_protocol=protocol)
    task = NextItemTask(num_items=dm.num_items, max_length=10, encoder=make_encoder(), objective=make_objective())
    rec = Recorder(task)
    trainer = pl.Trainer(
        max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=tmp_path, num_sanity_val_steps=0, callbacks=[rec],
    )
    trainer.fit(task, dm)
    trainer.test(task, dm)
    assert rec.rows, "no evaluation batch was recorded"
    n_pairs = 0
    for items, targets, embedded in rec.rows:
        assert targets is not None
        # the network consumed exactly the prefix, plus an empty slot where the objective reads one ...
        if slot:
            assert torch.equal(embedded[:, -1], torch.zeros_like(targets))
            embedded = embedded[:, :-1]
        assert torch.equal(embedded[:, -items.shape[1] :], items)
        # ... and the target id is nowhere in it (sessions have distinct items)
        assert not (embedded == targets[:, None]).any()
        n_pairs += len(targets)
    expected = dm.stats["valid_pairs"] + dm.stats["test_pairs"]
    assert n_pairs == expected


def test_eval_pairs_are_prefix_then_next_item():
    dm = SessionDataModule(source=NoRepeatSource(), max_length=10, eval_protocol="all_prefixes")
    dm.setup("test")
    items, targets = dm.tensors("test")
    test = dm.splits.test.column("item_id").to_pylist()
    encoded = [dm.vocab.encode(pa.array(s)).ids.tolist() for s in test]
    expected_pairs = [(s[:k], s[k]) for s in encoded for k in range(len(s) - 1, 0, -1)]
    assert len(expected_pairs) == len(targets)
    for row, target, (prefix, nxt) in zip(items.tolist(), targets.tolist(), expected_pairs):
        assert [i for i in row if i] == prefix[-10:]
        assert target == nxt


def test_predict_inputs_are_the_whole_session(tmp_path):
    """Batch scoring predicts the item *after* the session: every given item is input, none hidden."""
    dm = SessionDataModule(source=NoRepeatSource(), max_length=10)
    task = NextItemTask(num_items=dm.num_items, max_length=10, encoder=XLNetEncoder(d_model=16, n_head=2, n_layer=1))
    seen = []
    task.model.item_embedding.register_forward_pre_hook(lambda mod, args: seen.append(args[0].clone()))
    items = torch.tensor([[0, 11, 12, 13]])
    task.eval()
    out = task.predict_step(type("B", (), {"items": items})(), 0)
    assert torch.equal(seen[-1][:, -4:-1], torch.tensor([[11, 12, 13]]))
    assert out.items.shape == (1, 20)


@pytest.mark.parametrize("protocol", ["last", "all_prefixes"])
def test_leave_one_out_targets_only_each_users_held_out_item_under_every_protocol(protocol, tmp_path):
    """Each user's sequence without its last two items is trained on; validation and test are the same
    sequences one and two items longer. Under every protocol, their only targets are the items held
    out (the second to last, the last), one per user, never an item the model was trained on."""
    rng = np.random.default_rng(0)
    lines = {u: rng.integers(1, 40, rng.integers(3, 9)).tolist() for u in range(30)}
    path = tmp_path / "sequences.txt"
    path.write_text("".join(f"{u} {i}\n" for u, items in lines.items() for i in items))
    dm = SessionDataModule(source=UserSequenceSource(str(path)), max_length=10, eval_protocol=protocol)
    for split, from_end in (("valid", 2), ("test", 1)):
        pairs = dm.pairs(split)
        users = getattr(dm.splits, split).column("session_id").to_numpy()[pairs.sessions.numpy()]
        assert sorted(users.tolist()) == list(lines)
        held_out = pa.array([lines[u][-from_end] for u in users], dm.vocab.raw_ids.type)
        assert np.array_equal(pairs.targets.numpy(), dm.vocab.encode(held_out).ids), split
        assert dm.stats[f"{split}_pairs"] == len(lines)


def test_permutation_targets_never_see_the_look_ahead_of_the_event_before_them():
    """PLM keeps its targets in the inputs (the content stream): the look-ahead feature of the event before a
    target (its dwell, the time to the target) would tell the target's query stream when its item happened."""
    torch.manual_seed(0)
    spec = SideInfoSpec(continuous=["dwell"], looks_ahead=["dwell"])
    model = SessionModel(40, XLNetEncoder(d_model=16, n_head=2, n_layer=1, dropout=0.0), max_length=8, dropout=0.0,
                         side_info=SideInfoEmbedding(16, 40, spec))
    objective = PermutationLanguageModeling(target_prob=0.3, last_item_prob=0.0)
    objective.bind(model)
    items, dwell = torch.arange(3, 11)[None], torch.rand(1, 8) * 10
    m = objective.mask(items, torch.Generator().manual_seed(1), model.recommendable)
    targets = m.read[0].nonzero().flatten().tolist()
    assert targets and 0 not in targets

    def query(dw):
        return objective.training_output(model, items, torch.Generator().manual_seed(1), {"dwell": dw}).hidden

    base = query(dwell)
    for k, at in enumerate(targets):
        changed = dwell.clone()
        changed[0, at - 1] += 100.0
        torch.testing.assert_close(query(changed)[k], base[k])
    before = [at - 1 for at in targets]
    elsewhere = dwell + 100.0
    elsewhere[0, before] = dwell[0, before]
    assert not torch.allclose(query(elsewhere), base)  # the dwell of the other events is read
