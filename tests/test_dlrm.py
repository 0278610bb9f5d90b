"""DLRM parts (shapes, a hand-computed output, a seeded expected output), the ranking metrics on hand
cases, DLRMTask's optimizers and baselines, the sparse modules (the hybrid one against the fused one),
the allocator opt-in, and the synthetic Criteo-like generator."""

import math

import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from sessrec.datasets.criteo import generate_criteo
from sessrec.embeddings import DynamicTables, FusedTables, HybridTables, SparseFeatures, TableConfig
from sessrec.metrics import RankingMetrics, binary_auc, clicked_ranks
from sessrec.models.dlrm import DLRM, DCNv2Arch, InteractionArch
from sessrec.saved.registry import config_of
from sessrec.tasks.dlrm_task import DLRMTask

torch.set_num_threads(1)
TABLES = [TableConfig("a", 10, 4), TableConfig("b", 7, 4), TableConfig("c", 5, 4)]
SMALL = {"embedding_dim": 4, "dense_layers": [4], "over_layers": [8]}  # DLRMTask's network part


def sparse(batch: int, seed: int = 0) -> SparseFeatures:
    g = torch.Generator().manual_seed(seed)
    return SparseFeatures.from_dense({
        "a": torch.randint(0, 10, (batch,), generator=g),
        "b": torch.randint(0, 7, (batch, 2), generator=g),  # multi-hot
        "c": torch.randint(0, 5, (batch,), generator=g),
    })


def test_dot_interaction_by_hand():
    dense = torch.tensor([[1.0, 2.0]])
    emb = torch.tensor([[[3.0, 4.0], [0.0, 1.0]]])  # (B=1, F=2, D=2)
    # [dense, d.e1 = 11, d.e2 = 2, e1.e2 = 4]
    assert InteractionArch(2)(dense, emb).tolist() == [[1.0, 2.0, 11.0, 2.0, 4.0]]
    assert InteractionArch(2).output_width(2) == 5


def test_dcn_cross_layer_by_hand():
    arch = DCNv2Arch(num_sparse_features=1, embedding_dim=1, num_layers=1, rank=1)
    with torch.no_grad():
        arch.down[0].weight.fill_(1.0)  # V x = x1 + x2
        arch.up[0].weight.fill_(1.0)
        arch.up[0].bias.fill_(0.5)
    # x0 = [2, 3]: x0 * (5 + 0.5) + x0 = [13, 19.5]
    assert arch(torch.tensor([[2.0]]), torch.tensor([[[3.0]]])).tolist() == [[13.0, 19.5]]


@pytest.mark.parametrize("interaction", ["dot", "dcn"])
def test_shapes(interaction):
    model = DLRM(5, TABLES, dense_layers=[8, 4], over_layers=[16], interaction=interaction, seed=0)
    out = model(torch.randn(6, 5), sparse(6))
    assert out.shape == (6,) and torch.isfinite(out).all()
    out.sum().backward()
    assert model.dense_arch.mlp[0].weight.grad is not None


def test_hand_set_weights_give_the_hand_computed_logit():
    model = DLRM(1, [TableConfig("t", 3, 2)], dense_layers=[2], over_layers=[])
    with torch.no_grad():
        model.dense_arch.mlp[0].weight.copy_(torch.tensor([[1.0], [2.0]]))
        model.dense_arch.mlp[0].bias.zero_()
        model.sparse_arch.collection.table_weight("t").copy_(torch.tensor([[0.0, 0.0], [3.0, 4.0], [1.0, -1.0]]))
        model.over_arch.mlp[0].weight.fill_(1.0)
        model.over_arch.mlp[0].bias.zero_()
    ids = SparseFeatures.from_dense({"t": torch.tensor([1, 2])})
    # x = relu([d, 2d]) = [1, 2]; row 1 = [3, 4] -> 1 + 2 + 11 = 14; row 2 = [1, -1] -> 1 + 2 - 1 = 2
    assert model(torch.tensor([[1.0], [1.0]]), ids).tolist() == [14.0, 2.0]


def test_seeded_expected_output():
    torch.manual_seed(0)
    model = DLRM(3, TABLES, dense_layers=[8, 4], over_layers=[8], seed=0)
    out = model(torch.linspace(-1, 1, 12).view(4, 3), sparse(4, seed=1))
    torch.testing.assert_close(out, torch.tensor(EXPECTED), rtol=1e-4, atol=1e-5)


EXPECTED = [-0.121695, -0.120761, -0.097506, -0.113113]  # recorded from this seed; a change means the arithmetic changed


def test_bad_configs_and_inputs():
    with pytest.raises(ValueError, match="end at the embedding width 4"):
        DLRM(3, TABLES, dense_layers=[8, 5])
    with pytest.raises(ValueError, match="one embedding width"):
        DLRM(3, [TableConfig("a", 10, 4), TableConfig("b", 10, 8)], dense_layers=[4])
    with pytest.raises(ValueError, match="interaction must be"):
        DLRM(3, TABLES, dense_layers=[4], interaction="cross")
    model = DLRM(3, TABLES, dense_layers=[4])
    with pytest.raises(ValueError, match=r"dense features must be \(B, 3\)"):
        model(torch.randn(4, 2), sparse(4))
    with pytest.raises(ValueError, match="hold 4 samples, dense 5"):
        model(torch.randn(5, 3), sparse(4))
    with pytest.raises(ValueError, match="feature 'a': id 10 out of range"):
        model(torch.randn(1, 3), SparseFeatures.from_dense({"a": torch.tensor([10]), "b": torch.tensor([0]),
                                                            "c": torch.tensor([0])}))


# -- metrics ------------------------------------------------------------------------------------
def test_auc_by_hand_with_ties():
    # positive 1.0 vs negatives 1.0 (tie: 1/2) and 0.0 (1): AUC 0.75
    assert float(binary_auc(torch.tensor([1.0, 1.0, 0.0]), torch.tensor([1.0, 0.0, 0.0]))) == 0.75
    assert float(binary_auc(torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0.0, 0.0, 1.0, 1.0]))) == 0.75
    assert torch.isnan(binary_auc(torch.tensor([0.3]), torch.tensor([1.0])))


def test_mrr_and_recall_by_hand_skip_queries_without_click():
    scores = torch.tensor([0.9, 0.5, 0.7, 0.2, 0.8, 0.1, 0.3, 0.3])
    labels = torch.tensor([0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 2, 3, 3])  # query 2 has no click
    # query 0: 0.7 is second; query 1: 0.2 is second; query 3: tie counts against (pessimistic) -> 2
    assert clicked_ranks(scores, labels, groups).tolist() == [2.0, 2.0, 2.0]
    # a clicked row scored NaN is a miss (as a catalogue target's), not last of its query (a hit within k rows)
    assert clicked_ranks(torch.tensor([float("nan"), 1.0]), torch.tensor([1, 0]), torch.tensor([0, 0])).tolist() == [math.inf]
    m = RankingMetrics(ks=[1, 2])
    m.update(scores[:5], labels[:5], groups[:5])
    m.update(scores[5:], labels[5:], groups[5:])
    out = m.compute()
    assert float(out["mrr"]) == 0.5 and float(out["recall@1"]) == 0.0 and float(out["recall@2"]) == 1.0
    assert float(out["logloss"]) == pytest.approx(
        float(torch.nn.functional.binary_cross_entropy_with_logits(scores, labels)))


# -- task ---------------------------------------------------------------------------------------
def batch_of(n: int = 12):
    from sessrec.datasets.clickout_rows import RankingBatch

    groups = torch.arange(n) // 3
    labels = (torch.arange(n) % 3 == 1).float()
    position = (torch.arange(n) % 3).float()
    return RankingBatch(torch.randn(n, 3), sparse(n), labels, groups,
                        {"position": -position, "popularity": torch.zeros(n) - position / 100})


@pytest.mark.slow
@pytest.mark.parametrize("embedding_optimizer", ["adagrad_rowwise", "sgd", "none"])
def test_task_optimizers(embedding_optimizer):
    cards = {t.name: t.num_embeddings for t in TABLES}
    task = DLRMTask(cards, 3, network=SMALL, sparse=FusedTables(optimizer=embedding_optimizer, lr=0.1))
    opt = task.configure_optimizers()
    in_opt = {id(p) for g in opt.param_groups for p in g["params"]}
    table = task.model.sparse_arch.collection.weight(0)
    assert (id(table) in in_opt) == (embedding_optimizer == "none")
    before = table.detach().clone()
    batch = batch_of()
    loss = task._step(batch, "train")
    opt.zero_grad()
    loss.backward()
    opt.step()
    touched = torch.unique(batch.sparse.values[: 12])  # feature "a" rows, offset 0 in the shared weight
    changed = (table.detach() != before).any(dim=1)
    assert changed[touched].all()
    assert not changed[torch.tensor(sorted(set(range(10)) - set(touched.tolist())), dtype=torch.long)].any()


def test_task_evaluates_the_baselines_on_the_same_rows():
    cards = {t.name: t.num_embeddings for t in TABLES}
    task = DLRMTask(cards, 3, network=SMALL)
    task._step(batch_of(), "test")  # outside a Trainer: self.log warns, metrics still update
    pos = task.baseline_metrics["test_position"].compute()
    pop = task.baseline_metrics["test_popularity"].compute()
    assert float(pos["mrr"]) == 0.5 and float(pos["recall@1"]) == 0.0  # the clicked row is always second
    assert float(pop["mrr"]) == 0.5 and "logloss" not in pos
    assert 0 <= float(task.metrics["test"].compute()["auc"]) <= 1
    with pytest.raises(ValueError, match="linked from the data module"):
        DLRMTask()


def test_compiled_dense_parts_train_like_eager_under_the_same_names():
    """``compile`` wraps the MLPs and the interaction in place: same losses, same checkpoint keys.

    ``aot_eager`` traces with dynamo and AOT autograd like inductor does, without generating C++
    (minutes on a cold CI machine); the fused table update stays in eager autograd either way.
    """
    cards = {t.name: t.num_embeddings for t in TABLES}
    runs = []
    for compile in (False, "aot_eager"):
        torch.manual_seed(0)
        task = DLRMTask(cards, 3, network=SMALL, compile=compile)
        opt = task.configure_optimizers()
        losses = []
        for step in range(3):
            loss = task._step(batch_of(), "train")
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        compiled = [part._compiled_call_impl is not None
                    for part in (task.model.dense_arch, task.model.interaction, task.model.over_arch)]
        runs.append((torch.stack(losses), task.state_dict(), compiled))
    (eager, eager_state, eager_compiled), (traced, traced_state, traced_compiled) = runs
    assert eager_compiled == [False] * 3 and traced_compiled == [True] * 3
    assert list(traced_state) == list(eager_state)
    torch.testing.assert_close(traced, eager, rtol=1e-5, atol=1e-6)
    for name, value in eager_state.items():
        torch.testing.assert_close(traced_state[name], value, rtol=1e-5, atol=1e-6)


def test_bf16_autocast_on_cpu():
    cards = {t.name: t.num_embeddings for t in TABLES}
    task = DLRMTask(cards, 3, network=SMALL)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = task._step(batch_of(), "train")
    loss.backward()
    assert torch.isfinite(loss)


# -- synthetic Criteo-like data ------------------------------------------------------------------
def test_criteo_like_generator_is_seeded_skewed_and_learnable():
    cards = [50, 1000] + [20] * 24
    data = generate_criteo(6000, cards, multi_hot=1, seed=3)
    again = generate_criteo(6000, cards, multi_hot=1, seed=3)
    assert torch.equal(data.ids, again.ids) and torch.equal(data.labels, again.labels)
    assert data.dense.shape == (6000, 13) and data.ids.shape == (26, 6000, 1) and len(data.keys) == 26
    for f, c in enumerate(cards):
        assert 0 <= int(data.ids[f].min()) and int(data.ids[f].max()) < c
    counts = torch.bincount(data.ids[1].flatten(), minlength=1000).sort(descending=True).values
    assert counts[:100].sum() > 0.5 * 6000  # power law: the top 10% of ids cover most samples
    assert 0.15 < float(data.labels.mean()) < 0.35
    multi = generate_criteo(10, [30, 40], multi_hot=3, seed=0)
    dense, feats, labels = multi.batch(2, 6)
    assert feats.lengths.tolist() == [3] * 8 and feats.values.shape == (24,) and dense.shape == (4, 13)
    # a DLRM learns the hidden model: held-out AUC well above chance
    torch.manual_seed(0)
    model = DLRM(13, [TableConfig(k, c, 8) for k, c in zip(data.keys, cards)], dense_layers=[16, 8],
                 over_layers=[16], sparse=FusedTables(optimizer="adagrad_rowwise", lr=0.1), seed=0)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(3):
        for start in range(0, 5000, 250):
            dense, feats, labels = data.batch(start, start + 250)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(dense, feats), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
    dense, feats, labels = data.batch(5000, 6000)
    with torch.no_grad():
        assert float(binary_auc(model(dense, feats), labels)) > 0.65
    with pytest.raises(ValueError, match="positive cardinalities"):
        generate_criteo(10, [0, 5])


# -- the sparse module, chosen by its config -----------------------------------------------------
def test_a_hybrid_dlrm_gives_the_outputs_and_gradients_of_the_fused_one_with_the_same_weights():
    """HybridTables keeps each table's first 3 ids in one weight and the rest in another; with the rows of
    a FusedTables DLRM (optimizer none) copied in, outputs and every gradient are the fused model's."""
    tables = [TableConfig("a", 10, 4), TableConfig("b", 7, 4, pooling="mean"), TableConfig("c", 5, 4, feature_names=("c", "d"))]
    torch.manual_seed(0)
    fused = DLRM(3, tables, dense_layers=[4], over_layers=[8], sparse=FusedTables(), seed=0)
    hybrid = DLRM(3, tables, dense_layers=[4], over_layers=[8], sparse=HybridTables(num_hot=3), seed=1)
    dense_state = {k: v for k, v in fused.state_dict().items() if not k.startswith("sparse_arch.")}
    hybrid.load_state_dict(dense_state, strict=False)
    with torch.no_grad():
        for t in tables:
            part = hybrid.sparse_arch.tables[t.name]
            full = fused.sparse_arch.table_weight(t.name)
            part.hot_weight.copy_(full[:3])  # hot ids 0..2, cold ids 3.. in order
            part.cold_weight.copy_(full[3:])
            assert torch.equal(hybrid.sparse_arch.table_weight(t.name), full)
    g = torch.Generator().manual_seed(2)
    ids = SparseFeatures.from_dense({
        "a": torch.randint(0, 10, (6, 3), generator=g), "b": torch.tensor([[0, 6], [2, -1], [-1, -1], [5, 5], [1, 4], [3, 0]]),
        "c": torch.randint(0, 5, (6,), generator=g), "d": torch.randint(0, 5, (6, 2), generator=g),
    })
    dense = torch.randn(6, 3, generator=g)
    out_fused, out_hybrid = fused(dense, ids), hybrid(dense, ids)
    torch.testing.assert_close(out_hybrid, out_fused, rtol=1e-6, atol=1e-6)
    (out_fused * torch.arange(6.0)).sum().backward()
    (out_hybrid * torch.arange(6.0)).sum().backward()
    weight_grad = fused.sparse_arch.collection.weight(0).grad  # (22, 4): a, b, c rows one after the other
    start = 0
    for t in tables:
        part = hybrid.sparse_arch.tables[t.name]
        rows = weight_grad[start:start + t.num_embeddings]
        torch.testing.assert_close(torch.cat([part.hot_weight.grad, part.cold_weight.grad]), rows, rtol=1e-6, atol=1e-6)
        start += t.num_embeddings
    assert weight_grad.abs().sum() > 0
    for name, p in fused.named_parameters():
        if not name.startswith("sparse_arch."):
            torch.testing.assert_close(dict(hybrid.named_parameters())[name].grad, p.grad, rtol=1e-6, atol=1e-6)


def test_the_sparse_module_is_recorded_and_a_bad_one_refused():
    model = DLRM(3, TABLES, dense_layers=[4], over_layers=[8], sparse=DynamicTables(optimizer="sgd", lr=0.2, max_rows=64))
    assert config_of(model)["init_args"]["sparse"] == {"class_path": "sessrec.embeddings.sparse_arch.DynamicTables",
                                                       "init_args": {"optimizer": "sgd", "lr": 0.2, "max_rows": 64}}
    assert type(model.sparse_arch).__name__ == "DynamicSparseArch"
    with pytest.raises(TypeError, match="sparse must be FusedTables, DynamicTables, HybridTables or TorchRecTables"):
        DLRM(3, TABLES, dense_layers=[4], sparse="torchrec")
    with pytest.raises(ValueError, match="num_hot must be an integer >= 0, got -1"):
        HybridTables(num_hot=-1)
    with pytest.raises(ValueError, match="FusedTables optimizer must be"):
        FusedTables(optimizer="adam")


def test_a_dlrm_task_trains_hybrid_tables_with_the_dense_optimizer():
    cards = {t.name: t.num_embeddings for t in TABLES}
    task = DLRMTask(cards, 3, network=SMALL, sparse=HybridTables(num_hot=2))
    opt = task.configure_optimizers()
    in_opt = {id(p) for g in opt.param_groups for p in g["params"]}
    table = task.model.sparse_arch.tables["a"]
    assert id(table.hot_weight) in in_opt and id(table.cold_weight) in in_opt
    before = table.full_weight().detach().clone()
    loss = task._step(batch_of(), "train")
    opt.zero_grad()
    loss.backward()
    opt.step()
    assert not torch.equal(table.full_weight().detach(), before)


# -- the allocator opt-in ------------------------------------------------------------------------------------
def test_retain_freed_memory_is_an_explicit_opt_in(monkeypatch):
    calls = []
    monkeypatch.setattr("sessrec.tasks.dlrm_task.retain_freed_memory", lambda *a, **k: calls.append(1) or True)
    cards = {t.name: t.num_embeddings for t in TABLES}
    for opt_in, expected in ((None, 0), (True, 1)):
        task = DLRMTask(cards, 3, network=SMALL) if opt_in is None else DLRMTask(cards, 3, network=SMALL, retain_freed_memory=True)
        trainer = pl.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, accelerator="cpu")
        trainer.fit(task, train_dataloaders=DataLoader([batch_of()], batch_size=None))
        assert len(calls) == expected, opt_in


@pytest.mark.parametrize("pooling", ["sum", "mean"])
def test_forward_one_id_gives_the_bag_forwards_logits_bit_for_bit(pooling):
    torch.manual_seed(0)
    tables = [TableConfig("a", 10, 4, pooling=pooling), TableConfig("b", 7, 4, feature_names=("b", "b2"), pooling=pooling)]
    model = DLRM(3, tables, dense_layers=[8, 4], over_layers=[8], seed=0).eval()
    g = torch.Generator().manual_seed(1)
    ids = {"a": torch.randint(0, 10, (50,), generator=g), "b": torch.randint(0, 7, (50,), generator=g),
           "b2": torch.randint(0, 7, (50,), generator=g)}
    dense = torch.randn(50, 3, generator=g)
    with torch.no_grad():
        expected = model(dense, SparseFeatures.from_dense(ids))
        assert torch.equal(model.forward_one_id(dense, ids), expected)
        one = {k: v[:1] for k, v in ids.items()}  # against the bag forward of the same one row: a matrix product of
        # one row may round otherwise than the same row among 50 (AVX-512 kernels chosen by the row count)
        assert torch.equal(model.forward_one_id(dense[:1], one), model(dense[:1], SparseFeatures.from_dense(one)))


def test_forward_one_id_of_other_sparse_modules_runs_forward():
    torch.manual_seed(0)
    model = DLRM(3, TABLES, dense_layers=[4], over_layers=[8], sparse=DynamicTables(max_rows=64), seed=0).eval()
    ids = {"a": torch.tensor([1, 2]), "b": torch.tensor([3, 3]), "c": torch.tensor([0, 4])}
    dense = torch.randn(2, 3)
    with torch.no_grad():
        assert torch.equal(model.forward_one_id(dense, ids), model(dense, SparseFeatures.from_dense(ids)))


def test_forward_one_id_refuses_other_features_shapes_and_ids_outside_the_table():
    model = DLRM(3, TABLES, dense_layers=[4]).eval()
    ids = {"a": torch.tensor([1]), "b": torch.tensor([0]), "c": torch.tensor([0])}
    with torch.no_grad():
        with pytest.raises(ValueError, match=r"ids must hold the features \['a', 'b', 'c'\], got \['a', 'b'\]"):
            model.forward_one_id(torch.randn(1, 3), {"a": ids["a"], "b": ids["b"]})
        with pytest.raises(ValueError, match=r"one per sample, shape \(1,\), got \{'b': \(1, 2\)\}"):
            model.forward_one_id(torch.randn(1, 3), {**ids, "b": torch.tensor([[0, 1]])})
        with pytest.raises(ValueError, match=r"feature 'c': ids must lie in \[0, 5\), got 5..5"):
            model.forward_one_id(torch.randn(1, 3), {**ids, "c": torch.tensor([5])})
        with pytest.raises(ValueError, match=r"dense features must be \(B, 3\)"):
            model.forward_one_id(torch.randn(1, 2), ids)
