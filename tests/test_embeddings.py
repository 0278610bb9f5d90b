"""Embedding core: configs, jagged ids, fused tables (padding, offsets, pooling, fused optimizers),
hashing and frequency capping, dynamic tables, hybrid placement, and bad inputs."""

import sys

import pytest
import torch
from torch import nn

from sessrec.embeddings import (
    DynamicEmbeddingBag,
    FrequencyCap,
    FusedEmbeddingBagCollection,
    FusedTables,
    HybridEmbeddingBag,
    IdHasher,
    SparseFeatures,
    TableConfig,
    hash_ids,
    kernels,
)
from sessrec.embeddings import fused as fused_module
from sessrec.embeddings.fused import _row_writer, padded_width, sparse_update
from sessrec.embeddings.host_memory import advise_huge_pages, retain_freed_memory

torch.set_num_threads(1)


def reference_bags(weight, ids, mode="sum", per_sample_weights=None):
    """Plain nn.EmbeddingBag over (B, k) ids with negative = absent (mean of weighted ids = sum / count)."""
    bag = nn.EmbeddingBag.from_pretrained(weight.detach().clone(), mode="sum", freeze=False)
    ids = ids.reshape(ids.shape[0], -1)
    present = ids >= 0
    flat, offsets = ids[present], torch.cat([torch.zeros(1, dtype=torch.long), present.sum(1).cumsum(0)[:-1]])
    psw = None if per_sample_weights is None else per_sample_weights.reshape(ids.shape)[present]
    out = bag(flat, offsets, per_sample_weights=psw)
    if mode == "mean":
        out = out / present.sum(1).clamp(min=1).unsqueeze(1)
    return out, bag


# --- TableConfig -----------------------------------------------------------------------------

def test_table_config_defaults_and_validation():
    t = TableConfig("city", 10, 4, feature_names=["a", "b"])
    assert t.features == ("a", "b") and TableConfig("city", 10, 4).features == ("city",)
    with pytest.raises(ValueError, match="'city'.*num_embeddings"):
        TableConfig("city", 0, 4)
    with pytest.raises(ValueError, match="'city'.*embedding_dim"):
        TableConfig("city", 3, -1)
    with pytest.raises(ValueError, match="'city'.*pooling"):
        TableConfig("city", 3, 4, pooling="max")


# --- SparseFeatures --------------------------------------------------------------------------

def test_from_dense_one_hot_and_multi_hot_with_absent_entries():
    f = SparseFeatures.from_dense({"a": torch.tensor([3, 1, -1]), "b": torch.tensor([[2, 5], [4, -1], [-1, -1]])})
    assert f.keys == ("a", "b") and f.batch_size == 3
    assert f.lengths.tolist() == [1, 1, 0, 2, 1, 0]
    assert f.values.tolist() == [3, 1, 2, 5, 4]
    assert f.offsets().tolist() == [0, 1, 2, 2, 4, 5, 5]
    assert f.feature_lengths().tolist() == [2, 3]
    moved = f.to("cpu")
    assert torch.equal(moved.values, f.values) and moved.keys == f.keys


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"values": torch.tensor([1.0, 2.0])}, TypeError, "int64.*float ids"),
        ({"values": torch.tensor([1, -2])}, ValueError, "feature 'b': negative id -2"),
        ({"lengths": torch.tensor([1, 2])}, ValueError, "sums to 3 but values has 2"),
        ({"lengths": torch.tensor([1, 1, 0])}, ValueError, "not a multiple of the 2 keys"),
        ({"lengths": torch.tensor([3, -1])}, ValueError, "lengths must be >= 0"),
        ({"weights": torch.tensor([1.0])}, ValueError, "weights has shape"),
        ({"keys": ("a", "a")}, ValueError, "duplicates"),
        ({"weights": torch.tensor([1.0, float("nan")])}, ValueError, r"feature 'b': weight nan at position 1 \(of values\)"),
        ({"weights": torch.tensor([float("-inf"), 1.0])}, ValueError, r"feature 'a': weight -inf at position 0 \(of values\)"),
    ],
)
def test_sparse_features_bad_input(kwargs, error, match):
    args = {"keys": ("a", "b"), "values": torch.tensor([1, 2]), "lengths": torch.tensor([1, 1])} | kwargs
    with pytest.raises(error, match=match):
        SparseFeatures(**args)


def test_from_dense_rejects_float_ids_and_batch_mismatch():
    with pytest.raises(TypeError, match="feature 'a'.*integer"):
        SparseFeatures.from_dense({"a": torch.tensor([1.0, 2.0])})
    with pytest.raises(ValueError, match="feature 'b': batch 3 differs from 2"):
        SparseFeatures.from_dense({"a": torch.tensor([1, 2]), "b": torch.tensor([1, 2, 3])})


# --- FusedEmbeddingBagCollection: lookups -----------------------------------------------------

TABLES = [
    TableConfig("user", 7, 6),  # 6 floats = 24 bytes -> padded to 8
    TableConfig("item", 11, 8, pooling="mean", feature_names=("item", "history")),  # shared by two features
    TableConfig("tag", 5, 3, pooling="mean"),  # 3 -> 4: another width group
]


def batch():
    return {
        "user": torch.tensor([0, 6, 3]),
        "item": torch.tensor([[10, 2], [2, 2], [-1, -1]]),  # duplicates and an empty bag
        "history": torch.tensor([[1, 3, 5], [0, -1, -1], [9, 9, 4]]),
        "tag": torch.tensor([[4], [-1], [0]]),
    }


def test_padding_groups_tables_by_padded_width_and_keeps_padding_zero():
    ebc = FusedEmbeddingBagCollection(TABLES, seed=0)
    assert ebc.widths == (8, 4)
    assert ebc.weight(0).shape == (7 + 11, 8) and ebc.weight(1).shape == (5, 4)
    assert (ebc.weight(0)[:7, 6:] == 0).all() and (ebc.weight(1)[:, 3:] == 0).all()
    assert ebc.table_weight("item").shape == (11, 8)
    unpadded = FusedEmbeddingBagCollection(TABLES, pad_to_bytes=0, seed=0)
    assert unpadded.widths == (6, 8, 3)
    cache_line = FusedEmbeddingBagCollection(TABLES, pad_to_bytes=64, seed=0)
    assert cache_line.widths == (16,)
    with pytest.raises(ValueError, match="pad_to_bytes"):
        FusedEmbeddingBagCollection(TABLES, pad_to_bytes=6)


@pytest.mark.parametrize("pad", [16, 0, 64])
def test_lookup_matches_plain_embedding_bags(pad):
    ebc = FusedEmbeddingBagCollection(TABLES, pad_to_bytes=pad, seed=0)
    ids = batch()
    out = ebc(SparseFeatures.from_dense(ids))
    assert list(out) == ["user", "item", "history", "tag"]  # config order
    for feature, table in [("user", "user"), ("item", "item"), ("history", "item"), ("tag", "tag")]:
        mode = next(t.pooling for t in TABLES if t.name == table)
        expected, _ = reference_bags(ebc.table_weight(table), ids[feature], mode)
        torch.testing.assert_close(out[feature], expected)
    assert (out["item"][2] == 0).all() and (out["tag"][1] == 0).all()  # empty bags give zeros
    # mean of [2, 2] is row 2 itself
    torch.testing.assert_close(out["item"][1], ebc.table_weight("item")[2])


def test_lookup_is_independent_of_key_order_and_seeded():
    ids = batch()
    a = FusedEmbeddingBagCollection(TABLES, seed=3)(SparseFeatures.from_dense(ids))
    shuffled = {k: ids[k] for k in ["tag", "history", "user", "item"]}
    b = FusedEmbeddingBagCollection(TABLES, seed=3)(SparseFeatures.from_dense(shuffled))
    for k in a:
        torch.testing.assert_close(a[k], b[k])
    c = FusedEmbeddingBagCollection(TABLES, seed=4)(SparseFeatures.from_dense(ids))
    assert not torch.equal(a["user"], c["user"])


def test_per_sample_weights_sum_and_mean():
    tables = [TableConfig("s", 9, 4), TableConfig("m", 9, 4, pooling="mean")]
    ebc = FusedEmbeddingBagCollection(tables, seed=0)
    ids = torch.tensor([[1, 2, -1], [3, 3, 8]])
    w = torch.tensor([[0.5, 2.0, 9.0], [1.0, -1.0, 3.0]])
    out = ebc(SparseFeatures.from_dense({"s": ids, "m": ids}, weights={"s": w, "m": w}))
    for name in ("s", "m"):
        table = ebc.table_weight(name)
        expected = torch.stack([0.5 * table[1] + 2.0 * table[2], table[3] - table[3] + 3.0 * table[8]])
        if name == "m":
            expected = expected / torch.tensor([[2.0], [3.0]])
        torch.testing.assert_close(out[name], expected)


@pytest.mark.parametrize("sparse", ["fused_none", "fused_sgd", "hybrid", "dynamic"])
def test_float64_per_id_weights_pool_as_their_float32_values(sparse):
    from sessrec.embeddings import DynamicTables, HybridTables

    tables = [TableConfig("s", 9, 4), TableConfig("m", 9, 4, pooling="mean")]
    config = {"fused_none": FusedTables(), "fused_sgd": FusedTables(optimizer="sgd"), "hybrid": HybridTables(num_hot=3),
              "dynamic": DynamicTables(optimizer="sgd")}[sparse]
    arch = config.build(tables, seed=0).eval()
    ids = torch.tensor([[1, 2, -1], [3, 3, 8]])
    w = torch.tensor([[0.5, 2.0, 9.0], [1.0, -1.0, 0.1]], dtype=torch.float64)
    if sparse == "dynamic":
        arch.train()(SparseFeatures.from_dense({"s": ids, "m": ids}))  # the ids get rows
        arch.eval()
    out = arch(SparseFeatures.from_dense({"s": ids, "m": ids}, weights={"s": w, "m": w}))
    expected = arch(SparseFeatures.from_dense({"s": ids, "m": ids}, weights={"s": w.float(), "m": w.float()}))
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_dense_gradients_match_plain_bags_when_optimizer_is_none():
    ebc = FusedEmbeddingBagCollection(TABLES, seed=0)
    ids = batch()
    out = ebc(SparseFeatures.from_dense(ids))
    sum(o.pow(2).sum() * (i + 1) for i, o in enumerate(out.values())).backward()
    assert ebc.weight(0).grad is not None and (ebc.weight(0).grad[:7, 6:] == 0).all()
    g_item = torch.zeros(11, 8)
    for i, feature in enumerate(["user", "item", "history", "tag"]):
        table = {"history": "item"}.get(feature, feature)
        mode = next(t.pooling for t in TABLES if t.name == table)
        ref, bag = reference_bags(ebc.table_weight(table), ids[feature], mode)
        (ref.pow(2).sum() * (i + 1)).backward()
        if table == "item":
            g_item += bag.weight.grad
        else:
            g, start = ebc._table_group[table]
            grad = ebc.weight(g).grad[start:start + bag.weight.shape[0], :bag.weight.shape[1]]
            torch.testing.assert_close(grad, bag.weight.grad)
    torch.testing.assert_close(ebc.weight(0).grad[7:18, :8], g_item)


def test_sparse_gradients_equal_the_dense_ones_and_sparse_adam_moves_only_the_rows_looked_up():
    dense, sparse = (FusedEmbeddingBagCollection(TABLES, seed=0, sparse_gradient=flag) for flag in (False, True))
    ids = batch()
    for ebc in (dense, sparse):
        out = ebc(SparseFeatures.from_dense(ids))
        sum(o.pow(2).sum() * (i + 1) for i, o in enumerate(out.values())).backward()
    grad = sparse.weight(0).grad
    assert grad.is_sparse
    torch.testing.assert_close(grad.to_dense(), dense.weight(0).grad)
    before = sparse.weight(0).detach().clone()
    torch.optim.SparseAdam(sparse.parameters(), lr=0.1).step()
    moved = (sparse.weight(0).detach() != before).any(dim=1)
    assert torch.equal(moved, dense.weight(0).grad.abs().sum(dim=1) > 0) and moved.any() and not moved.all()


# --- fused optimizers ------------------------------------------------------------------------

def reference_rowwise_adagrad(weight, momentum, grad, lr, eps, dim):
    """Hand-written row-wise Adagrad on a dense gradient: only rows with a non-zero gradient move."""
    touched = grad.abs().sum(1) > 0
    momentum = momentum + torch.where(touched, grad.pow(2).sum(1) / dim, 0.0)
    return weight - torch.where(touched.unsqueeze(1), lr * grad / (momentum.sqrt() + eps).unsqueeze(1), 0.0), momentum


@pytest.mark.parametrize("optimizer,compiled", [("sgd", True), ("sgd", False), ("adagrad_rowwise", True)])
def test_fused_optimizer_matches_reference_with_duplicate_ids(optimizer, compiled):
    tables = [TableConfig("a", 6, 3, pooling="mean"), TableConfig("b", 4, 3)]  # 3 -> 4: padding must not count
    ebc = FusedEmbeddingBagCollection(tables, optimizer=optimizer, lr=0.1, seed=0, compile_update=compiled)
    assert not list(ebc.parameters())  # the fused weights are buffers: no outer optimizer sees them
    ref = {t.name: nn.EmbeddingBag.from_pretrained(ebc.table_weight(t.name).clone(), mode=t.pooling, freeze=False)
           for t in tables}
    momentum = {name: torch.zeros(len(bag.weight)) for name, bag in ref.items()}
    ids = {"a": torch.tensor([[1, 1], [1, 5], [0, 1]]), "b": torch.tensor([[3, 3], [2, 3], [3, 0]])}
    target = torch.arange(9.0).view(3, 3) / 10
    for _ in range(3):  # state carries over between steps
        out = ebc(SparseFeatures.from_dense(ids))
        ((out["a"] - target).pow(2).sum() + (out["b"] * target).sum()).backward()
        ref_loss = (ref["a"](ids["a"]) - target).pow(2).sum() + (ref["b"](ids["b"]) * target).sum()
        for bag in ref.values():
            bag.weight.grad = None
        ref_loss.backward()
        with torch.no_grad():
            for name, bag in ref.items():
                if optimizer == "sgd":
                    bag.weight -= 0.1 * bag.weight.grad
                else:
                    new, momentum[name] = reference_rowwise_adagrad(bag.weight, momentum[name], bag.weight.grad, 0.1, 1e-8, 3)
                    bag.weight.copy_(new)
        for name, bag in ref.items():
            torch.testing.assert_close(ebc.table_weight(name), bag.weight.detach(), rtol=1e-5, atol=1e-6)
    if optimizer == "adagrad_rowwise":
        torch.testing.assert_close(ebc.momentum_0[:6], momentum["a"])
        assert ebc.momentum_0[[2, 3, 4]].eq(0).all()  # untouched rows keep no state
    assert (ebc.weight(0)[:, 3:] == 0).all()  # padding never moves


def test_fused_optimizer_with_mixed_true_widths_in_one_group():
    tables = [TableConfig("a", 5, 2), TableConfig("b", 5, 4)]  # both stored 4 wide
    ebc = FusedEmbeddingBagCollection(tables, optimizer="adagrad_rowwise", lr=0.5, seed=1)
    before = ebc.table_weight("a").clone()
    out = ebc(SparseFeatures.from_dense({"a": torch.tensor([1]), "b": torch.tensor([2])}))
    (out["a"].sum() + out["b"].sum()).backward()
    # gradient of ones over D columns: state = D / D = 1, so each touched entry moves by lr / (1 + eps)
    torch.testing.assert_close(ebc.table_weight("a")[1], before[1] - 0.5, rtol=0, atol=1e-6)
    torch.testing.assert_close(ebc.momentum_0[[1, 7]], torch.ones(2))


def dense_reference_update(weight, momentum, rows, occurrence_grad, optimizer, lr, eps, dim):
    """The update on a dense (R, P) gradient built with index_add_ (duplicates accumulate)."""
    grad = torch.zeros_like(weight).index_add_(0, rows, occurrence_grad)
    if optimizer == "sgd":
        return weight - lr * grad, momentum
    return reference_rowwise_adagrad(weight, momentum, grad, lr, eps, dim)


@pytest.mark.parametrize("optimizer,compiled", [("sgd", False), ("sgd", True), ("adagrad_rowwise", False)])
@pytest.mark.parametrize("chunk_bytes", [None, 256 * 16, 1])  # default, several chunks of 256 rows, minimum chunk
@pytest.mark.parametrize("layout", ["one_per_bag", "bags_and_weights"])
def test_chunked_sparse_update_matches_a_dense_gradient(optimizer, compiled, chunk_bytes, layout):
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(3000, 4, generator=g)
    momentum = torch.rand(3000, generator=g)
    rows = torch.randint(0, 3000, (5000,), generator=g)  # ~2,400 distinct rows, many duplicates
    if layout == "one_per_bag":
        grad, bags, psw = torch.randn(5000, 4, generator=g), None, None
        occurrence = grad
    else:  # 5000 ids in 1200 bags, with per-id weights
        grad = torch.randn(1200, 4, generator=g)
        bags = torch.randint(0, 1200, (5000,), generator=g).sort().values
        psw = torch.rand(5000, generator=g)
        occurrence = grad[bags] * psw.unsqueeze(1)
    expected_w, expected_m = dense_reference_update(weight, momentum, rows, occurrence, optimizer, 0.1, 1e-8, 4.0)
    w, m = weight.clone(), momentum.clone()
    sparse_update(w, m, rows, grad, optimizer, 0.1, 1e-8, 4.0, bags, psw, chunk_bytes=chunk_bytes, compiled=compiled)
    torch.testing.assert_close(w, expected_w, rtol=1e-5, atol=1e-6)
    if optimizer == "adagrad_rowwise":
        torch.testing.assert_close(m, expected_m, rtol=1e-5, atol=1e-6)
    sparse_update(w, m, rows[:0], grad[:0], optimizer, 0.1, 1e-8, 4.0)  # no ids: nothing to do


def test_row_writer_views_aligned_rows_and_keeps_others():
    assert _row_writer(torch.zeros(5, 8)).dtype == torch.complex128  # 32-byte rows: 2 elements of 16 bytes
    assert _row_writer(torch.zeros(5, 6)).dtype == torch.float32  # 24-byte rows
    assert _row_writer(torch.zeros(5, 9)[:, :8]).dtype == torch.float32  # strided rows
    assert _row_writer(torch.zeros(41)[1:].view(5, 8)).dtype == torch.float32  # misaligned start


def test_huge_page_advice_keeps_values_and_updates():
    tables = [TableConfig("big", 40_000, 64), TableConfig("small", 10, 64)]  # 10 MB: over the 4 MB threshold
    a = FusedEmbeddingBagCollection(tables, optimizer="adagrad_rowwise", lr=0.1, seed=0, huge_pages=True)
    b = FusedEmbeddingBagCollection(tables, optimizer="adagrad_rowwise", lr=0.1, seed=0, huge_pages=False)
    assert torch.equal(a.weight(0), b.weight(0)) and (a.momentum_0 == 0).all()
    ids = {"big": torch.tensor([[39_999, 7], [7, 7]]), "small": torch.tensor([3, 9])}
    for ebc in (a, b):
        sum(o.sum() for o in ebc(SparseFeatures.from_dense(ids)).values()).backward()
    assert torch.equal(a.weight(0), b.weight(0)) and torch.equal(a.momentum_0, b.momentum_0)
    assert advise_huge_pages(torch.zeros(10)) is False  # too small to advise


def test_uniform_feature_sizes_lookup_and_range_check():
    """Every feature with the same number of ids takes the broadcast path; it must equal plain bags."""
    tables = [TableConfig("a", 7, 4), TableConfig("b", 5, 4, pooling="mean"), TableConfig("c", 9, 4)]
    ebc = FusedEmbeddingBagCollection(tables, optimizer="sgd", lr=0.1, seed=0)
    ids = {"a": torch.tensor([[6, 0], [1, 1]]), "b": torch.tensor([[4, 4], [0, 3]]), "c": torch.tensor([[8, 2], [5, 5]])}
    out = ebc(SparseFeatures.from_dense(ids))
    for t in tables:
        expected, _ = reference_bags(ebc.table_weight(t.name), ids[t.name], t.pooling)
        torch.testing.assert_close(out[t.name], expected)
    with pytest.raises(ValueError, match="feature 'b': id 5 out of range for table 'b' with 5 rows"):
        ebc(SparseFeatures.from_dense(ids | {"b": torch.tensor([[4, 5], [0, 3]])}))


@pytest.mark.parametrize("optimizer,compiled", [("sgd", True), ("sgd", False), ("adagrad_rowwise", True)])
def test_fused_update_with_shared_table_unused_feature_and_padding(optimizer, compiled):
    """Per-feature gradients: a table shared by two features, a feature left out of the loss, padded widths."""
    dense = FusedEmbeddingBagCollection(TABLES, seed=0)  # the same weights with a dense gradient
    fused = FusedEmbeddingBagCollection(TABLES, optimizer=optimizer, lr=0.1, seed=0, compile_update=compiled)
    ids = SparseFeatures.from_dense(batch())

    def loss(out):  # "tag" is unused: its gradient is None
        return (out["user"] * 2).sum() + out["item"].pow(2).sum() + (out["history"] * out["item"]).sum()

    loss(dense(ids)).backward()
    loss(fused(ids)).backward()
    for g, width in enumerate(dense.widths):
        weight = dense.weight(g).detach()
        grad = torch.zeros_like(weight) if dense.weight(g).grad is None else dense.weight(g).grad
        if optimizer == "sgd":
            expected = weight - 0.1 * grad
        else:
            dims = torch.tensor([float(t.embedding_dim) for t in TABLES for _ in range(t.num_embeddings)
                                 if padded_width(t.embedding_dim, 16) == width])
            expected, momentum = reference_rowwise_adagrad(weight, torch.zeros(len(weight)), grad, 0.1, 1e-8, dims)
            torch.testing.assert_close(getattr(fused, f"momentum_{g}"), momentum)
        torch.testing.assert_close(fused.weight(g), expected)
    assert torch.equal(fused.weight(1), dense.weight(1))  # only "tag" lives in group 1: untouched


@pytest.mark.parametrize("uniform", [True, False])
def test_chunked_lookup_matches_plain_bags_in_values_gradients_and_updates(uniform, monkeypatch):
    """A batch large enough to look up one feature per chunk (40,000 x 8 floats > 1 MB chunks)."""
    monkeypatch.setattr(fused_module, "_CPU_LOOKUP_CHUNK_BYTES", 2**20)
    g = torch.Generator().manual_seed(1)
    b = 40_000
    low = 0 if uniform else -1  # -1: absent ids, so features have different numbers of ids
    ids = {"user": torch.randint(0, 7, (b, 2), generator=g), "item": torch.randint(low, 11, (b, 2), generator=g),
           "history": torch.randint(low, 11, (b, 2 if uniform else 3), generator=g),
           "tag": torch.randint(low, 5, (b, 2), generator=g)}
    features = SparseFeatures.from_dense(ids)
    dense = FusedEmbeddingBagCollection(TABLES, seed=0)
    values = features.values[:int(features.lengths[:3 * b].sum())]
    sizes = features.feature_lengths()[:3].tolist()
    assert len(dense._chunks(0, values, features.lengths[:3 * b], sizes, ["user", "item", "history"], b)[1]) == 3
    out = dense(features)
    scale = {"user": 1.0, "item": 2.0, "history": 3.0, "tag": 4.0}

    def loss(out):
        return sum(o.pow(2).sum() * scale[f] for f, o in out.items()) / b

    loss(out).backward()
    grads = {}
    for f, table in [("user", "user"), ("item", "item"), ("history", "item"), ("tag", "tag")]:
        mode = next(t.pooling for t in TABLES if t.name == table)
        expected, bag = reference_bags(dense.table_weight(table), ids[f], mode)
        torch.testing.assert_close(out[f], expected)
        (expected.pow(2).sum() * scale[f] / b).backward()
        grads[table] = grads.get(table, 0) + bag.weight.grad
    for table, grad in grads.items():
        gr, start = dense._table_group[table]
        rows, dim = grad.shape
        torch.testing.assert_close(dense.weight(gr).grad[start:start + rows, :dim], grad)
    fused = FusedEmbeddingBagCollection(TABLES, optimizer="adagrad_rowwise", lr=0.1, seed=0)
    loss(fused(features)).backward()
    for gr in range(len(dense.widths)):
        dims = torch.tensor([float(t.embedding_dim) for t in TABLES for _ in range(t.num_embeddings)
                             if padded_width(t.embedding_dim, 16) == dense.widths[gr]])
        expected, momentum = reference_rowwise_adagrad(dense.weight(gr).detach(), torch.zeros(len(dims)),
                                                       dense.weight(gr).grad, 0.1, 1e-8, dims)
        torch.testing.assert_close(fused.weight(gr), expected)
        torch.testing.assert_close(getattr(fused, f"momentum_{gr}"), momentum)


@pytest.mark.parametrize("compiled", [True, False])
def test_fused_update_with_per_sample_weights_matches_a_dense_gradient(compiled):
    tables = [TableConfig("s", 9, 4), TableConfig("m", 9, 4, pooling="mean")]
    ids = torch.tensor([[1, 2, -1], [3, 3, 8]])
    w = torch.tensor([[0.5, 2.0, 9.0], [1.0, -1.0, 3.0]])
    features = SparseFeatures.from_dense({"s": ids, "m": ids}, weights={"s": w, "m": w})
    dense = FusedEmbeddingBagCollection(tables, seed=0)
    fused = FusedEmbeddingBagCollection(tables, optimizer="sgd", lr=0.1, seed=0, compile_update=compiled)
    for ebc in (dense, fused):
        out = ebc(features)
        (out["s"].pow(2).sum() + 3 * out["m"].sum()).backward()
    torch.testing.assert_close(fused.weight(0), dense.weight(0).detach() - 0.1 * dense.weight(0).grad)


def test_no_update_without_backward_and_under_no_grad():
    ebc = FusedEmbeddingBagCollection([TableConfig("a", 5, 4)], optimizer="sgd", seed=0)
    before = ebc.weight(0).clone()
    with torch.no_grad():
        ebc(SparseFeatures.from_dense({"a": torch.tensor([1, 2])}))
    assert torch.equal(before, ebc.weight(0))


def test_compiled_and_sorted_sgd_updates_agree_over_steps_with_a_varying_batch():
    """Same weights after three steps of different sizes (the compiled kernel has dynamic id counts)."""
    tables = [TableConfig("a", 50, 8), TableConfig("b", 30, 8)]
    eager = FusedEmbeddingBagCollection(tables, optimizer="sgd", lr=0.1, seed=0, compile_update=False)
    compiled = FusedEmbeddingBagCollection(tables, optimizer="sgd", lr=0.1, seed=0, compile_update=True)
    g = torch.Generator().manual_seed(3)
    for b in (16, 40, 7):
        ids = {"a": torch.randint(0, 50, (b, 3), generator=g), "b": torch.randint(0, 5, (b,), generator=g)}  # hot rows repeat
        target = torch.randn(b, 8, generator=g)
        for ebc in (eager, compiled):
            out = ebc(SparseFeatures.from_dense(ids))
            ((out["a"] - target).pow(2).sum() + (out["b"] * target).sum()).backward()
    torch.testing.assert_close(compiled.weight(0), eager.weight(0), rtol=1e-5, atol=1e-6)
    assert not torch.equal(eager.weight(0), FusedEmbeddingBagCollection(tables, seed=0).weight(0))  # it did train


def test_sgd_falls_back_to_the_sorted_update_when_compilation_fails(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(kernels, "_KERNELS", {})
    monkeypatch.setattr(kernels, "_warned", False)
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: broken)
    weight, rows, grad = torch.zeros(6, 4), torch.tensor([1, 4, 1]), torch.ones(3, 4)
    with pytest.warns(RuntimeWarning, match="compiled SGD update is unavailable.*no C\\+\\+ compiler"):
        sparse_update(weight, None, rows, grad, "sgd", 0.5, 1e-8, 4.0, compiled=True)
    expected = torch.zeros(6, 4)
    expected[1], expected[4] = -1.0, -0.5  # row 1 twice
    assert torch.equal(weight, expected)
    assert kernels._KERNELS == {(4, torch.float32, False, False): None}  # remembered: no second try


def test_deterministic_mode_uses_the_sorted_update(monkeypatch):
    def fail(*args):
        raise AssertionError("the compiled scatter must not run under deterministic algorithms")

    monkeypatch.setattr(fused_module, "sgd_scatter", fail)
    weight = torch.zeros(4, 4)
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        sparse_update(weight, None, torch.tensor([2, 2]), torch.ones(2, 4), "sgd", 0.25, 1e-8, 4.0, compiled=True)
    finally:
        torch.use_deterministic_algorithms(previous)
    assert weight[2].tolist() == [-0.5] * 4 and weight[[0, 1, 3]].eq(0).all()


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's mallopt")
def test_retain_freed_memory_recycles_freed_blocks_without_page_faults():
    import resource

    assert retain_freed_memory() is True  # process-wide from here on: it only keeps freed memory
    for _ in range(2):  # 16 MB touched (4,096 pages), then freed; twice, so the heap has a free block that fits
        torch.empty(4 * 2**20).fill_(1.0)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        torch.empty(4 * 2**20).fill_(1.0)  # handed back to the kernel, each would fault 4,096 pages again
    # 20,480 faults if handed back every time; up to half of that is allowed: a small allocation may split the free
    # block, and what earlier tests left to the collector may be freed and taken again in between
    assert resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before < 20_480 // 2


# --- bad input ---------------------------------------------------------------------------------

def test_lookup_errors_name_the_feature_and_value():
    ebc = FusedEmbeddingBagCollection(TABLES, seed=0)
    ids = batch()
    ids["history"] = torch.tensor([[1, 3, 11], [0, -1, -1], [9, 9, 4]])
    with pytest.raises(ValueError, match="feature 'history': id 11 out of range for table 'item' with 11 rows"):
        ebc(SparseFeatures.from_dense(ids))
    with pytest.raises(ValueError, match=r"unknown feature keys \['colour'\]"):
        ebc(SparseFeatures.from_dense(batch() | {"colour": torch.tensor([1, 1, 1])}))
    with pytest.raises(ValueError, match=r"features \['tag'\] are missing"):
        ebc(SparseFeatures.from_dense({k: v for k, v in batch().items() if k != "tag"}))
    with pytest.raises(TypeError, match="SparseFeatures"):
        ebc(batch())


def test_collection_config_errors():
    with pytest.raises(ValueError, match="unique"):
        FusedEmbeddingBagCollection([TableConfig("a", 3, 4), TableConfig("a", 3, 4)])
    with pytest.raises(ValueError, match=r"\['x'\] appear in several"):
        FusedEmbeddingBagCollection([TableConfig("a", 3, 4, feature_names=("x",)), TableConfig("b", 3, 4, feature_names=("x",))])
    with pytest.raises(ValueError, match="optimizer"):
        FusedEmbeddingBagCollection([TableConfig("a", 3, 4)], optimizer="adam")
    with pytest.raises(ValueError, match="sparse_gradient is for tables updated by an outer optimizer"):
        FusedEmbeddingBagCollection([TableConfig("a", 3, 4)], optimizer="sgd", sparse_gradient=True)
    with pytest.raises(ValueError, match="sparse_gradient needs optimizer 'none'"):
        FusedTables(optimizer="adagrad_rowwise", sparse_gradient=True)


@pytest.mark.parametrize("optimizer", ["none", "adagrad_rowwise"])
def test_weights_of_tables_in_another_order_or_size_are_refused_before_any_is_loaded(optimizer):
    saved = FusedEmbeddingBagCollection([TableConfig("a", 10, 4), TableConfig("b", 10, 4)], optimizer=optimizer, seed=0)
    state = saved.state_dict()
    for tables, first in [
        ([TableConfig("b", 10, 4), TableConfig("a", 10, 4)], r"table 0 is \['a', 10, 4\] there and \['b', 10, 4\] here"),
        ([TableConfig("a", 12, 4), TableConfig("b", 8, 4)], r"table 0 is \['a', 10, 4\] there and \['a', 12, 4\] here"),
    ]:
        other = FusedEmbeddingBagCollection(tables, optimizer=optimizer, seed=1)
        before = {k: v.clone() for k, v in other.state_dict().items()}
        with pytest.raises(ValueError, match=first):
            other.load_state_dict(state)
        assert all(torch.equal(v, before[k]) for k, v in other.state_dict().items())  # nothing half-loaded
    same = FusedEmbeddingBagCollection([TableConfig("a", 10, 4), TableConfig("b", 10, 4)], optimizer=optimizer, seed=1)
    same.load_state_dict(state)
    assert torch.equal(same.table_weight("b"), saved.table_weight("b"))


# --- hashing and frequency capping -------------------------------------------------------------

def fmix64_reference(ids, seed):
    """Python big-int reference of the documented hash (fmix64 of id + seed * golden, floor modulo)."""
    mask = 2**64 - 1
    out = []
    for i in ids:
        x = (i + seed * 0x9E3779B97F4A7C15) & mask
        x ^= x >> 33
        x = (x * 0xFF51AFD7ED558CCD) & mask
        x ^= x >> 33
        x = (x * 0xC4CEB9FE1A85EC53) & mask
        x ^= x >> 33
        out.append(x - 2**64 if x >= 2**63 else x)
    return out


@pytest.mark.parametrize("seed", [0, 7])
def test_hash_matches_the_documented_formula(seed):
    ids = [0, 1, 2, -5, 2**62, 10**15, -(2**63)]
    hashed = IdHasher(1000, seed=seed)(torch.tensor(ids))
    assert hashed.tolist() == [h % 1000 for h in fmix64_reference(ids, seed)]
    assert hashed.min() >= 0 and hashed.max() < 1000
    spread = IdHasher(64)(torch.arange(64_000)).bincount(minlength=64)
    assert spread.min() > 800 and spread.max() < 1200  # roughly uniform over buckets
    with pytest.raises(TypeError, match="integer"):
        IdHasher(10)(torch.tensor([1.5]))


def test_hashing_and_capping_refuse_counts_that_are_not_integers():
    ids = torch.tensor([7, 10**15])
    with pytest.raises(ValueError, match="num_buckets must be an integer >= 1, got 10.5"):
        hash_ids(ids, 10.5)
    with pytest.raises(ValueError, match="IdHasher num_buckets must be an integer >= 1, got 10.5"):
        IdHasher(10.5)
    with pytest.raises(ValueError, match="IdHasher num_buckets must be an integer >= 1, got True"):
        IdHasher(True)
    with pytest.raises(ValueError, match="seed must be an integer, got 1.5"):
        IdHasher(10, seed=1.5)
    with pytest.raises(ValueError, match="FrequencyCap max_rows must be an integer >= 1, got 2.5"):
        FrequencyCap(max_rows=2.5)
    with pytest.raises(ValueError, match="FrequencyCap min_count must be an integer >= 1, got 0"):
        FrequencyCap(min_count=0)


def test_frequency_cap_fit_update_and_round_trip():
    cap = FrequencyCap(min_count=2).fit(torch.tensor([5, 9, 5, 42, 9, 9]))
    assert cap.num_embeddings == 3 and cap(torch.tensor([[9, 5], [42, 7]])).tolist() == [[2, 1], [0, 0]]
    cap.update(torch.tensor([42, 3]))  # 42 now seen twice
    assert cap(torch.tensor([5, 9, 42, 3])).tolist() == [1, 2, 3, 0]
    restored = FrequencyCap(min_count=2).load_state_dict(cap.state_dict())
    assert restored(torch.tensor([5, 9, 42, 3])).tolist() == [1, 2, 3, 0] and restored.min_count == 2
    with pytest.raises(ValueError, match=r"\[min_count, max_rows\] = \[2, -1\], not \[1, 10\]"):
        FrequencyCap(min_count=1, max_rows=10).load_state_dict(cap.state_dict())
    top = FrequencyCap(max_rows=3).fit(torch.tensor([1, 1, 2, 2, 3, 3, 3, 4]))  # 3 most, then tie 1/2 -> 1
    assert top.keys.tolist() == [1, 3] and top(torch.tensor([1, 2, 3, 4])).tolist() == [1, 0, 2, 0]


# --- dynamic tables ------------------------------------------------------------------------------

@pytest.mark.parametrize("lr, eps", [(-0.1, 1e-8), (0.0, 1e-8), (float("nan"), 1e-8), (0.1, 0.0)])
def test_dynamic_refuses_a_learning_rate_or_eps_that_is_not_positive(lr, eps):
    from sessrec.embeddings import DynamicTables

    with pytest.raises(ValueError, match=rf"lr and eps must be > 0, got lr={lr}, eps={eps}"):
        DynamicEmbeddingBag(3, initial_capacity=2, max_capacity=8, lr=lr, eps=eps)
    if eps > 0:
        with pytest.raises(ValueError, match=rf"lr and eps must be > 0, got lr={lr}"):
            DynamicTables(lr=lr).build([TableConfig("a", 4, 3)])


def test_dynamic_grows_by_doubling_and_loses_no_update():
    table = DynamicEmbeddingBag(3, initial_capacity=2, max_capacity=64, lr=0.5, seed=0)
    table(torch.tensor([[100], [200]])).sum().backward()  # sum pooling: gradient ones -> each row moves by -0.5
    first = table.embedding(torch.tensor([100, 200])).clone()
    state = table.state_dict()
    out = table(torch.tensor([[100, 1], [2, 3], [4, 200]]))  # 4 new keys: 2 -> 4 -> 8 rows
    assert table.capacity == 8 and table.num_keys == 6
    torch.testing.assert_close(out[0] - table.embedding(torch.tensor(1)), first[0])  # old row kept across growth
    out.sum().backward()
    torch.testing.assert_close(table.embedding(torch.tensor([100, 200])), first - 0.5)  # update after growth applied
    assert table.counts[table.lookup(torch.tensor([100, 200, 3]))[0]].tolist() == [2, 2, 1]
    again = DynamicEmbeddingBag(3, initial_capacity=2, max_capacity=64, lr=0.5, seed=5)
    again.load_state_dict(state)  # a saved table of another size loads
    torch.testing.assert_close(again.embedding(torch.tensor([100, 200])), first)


def test_dynamic_growth_resumed_from_a_saved_table_draws_the_rows_of_an_uninterrupted_one():
    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 40, (3, 2), generator=g) for _ in range(4)]  # new keys every batch: 2 rows grow to 32

    def train(table, steps):
        for keys in steps:
            table(keys).pow(2).sum().backward()
        return table

    whole = train(DynamicEmbeddingBag(3, initial_capacity=2, max_capacity=64, lr=0.5, seed=0), batches)
    saved = train(DynamicEmbeddingBag(3, initial_capacity=2, max_capacity=64, lr=0.5, seed=0), batches[:2]).state_dict()
    resumed = DynamicEmbeddingBag(3, initial_capacity=2, max_capacity=64, lr=0.5, seed=7)
    resumed.load_state_dict(saved)
    train(resumed, batches[2:])
    assert resumed.capacity == whole.capacity == 32
    assert torch.equal(resumed.weight, whole.weight) and torch.equal(resumed.sorted_keys, whole.sorted_keys)
    other = DynamicEmbeddingBag(3, initial_capacity=2, max_capacity=64, seed=7)
    with pytest.raises(ValueError, match=r"^_extra_state: the saved row-initialisation generator state is torch.uint8 of "
                                         r"shape \(4,\), this table's uint8 of shape \(\d+,\)"):
        other.load_state_dict(saved | {"_extra_state": torch.zeros(4, dtype=torch.uint8)})
    assert other.num_keys == 0 and other.capacity == 2  # nothing loaded


def test_dynamic_refuses_a_saved_table_of_another_width_before_loading_it():
    saved = DynamicEmbeddingBag(8, initial_capacity=4, max_capacity=64, seed=0)
    saved(torch.tensor([[1, 2, 3]]))
    table = DynamicEmbeddingBag(4, initial_capacity=2, max_capacity=64, seed=0)
    with pytest.raises(ValueError, match=r"weight: the saved table's rows are 8 wide, this table's 4"):
        table.load_state_dict(saved.state_dict())
    assert table.weight.shape == (2, 4) and table.num_keys == 0  # nothing loaded


def test_dynamic_refuses_max_rows_below_a_table_and_a_saved_table_past_its_max_capacity():
    from sessrec.embeddings import DynamicTables

    with pytest.raises(ValueError, match=r"^table 'b' starts with 9 rows, more than max_rows=8; raise max_rows to at least 9$"):
        DynamicTables(max_rows=8).build([TableConfig("a", 8, 3), TableConfig("b", 9, 3)])
    saved = DynamicEmbeddingBag(2, initial_capacity=2, max_capacity=16, seed=0)
    saved(torch.tensor([[1, 2, 3, 4, 5]]))  # grows to 8 rows
    table = DynamicEmbeddingBag(2, initial_capacity=2, max_capacity=4, seed=0)
    with pytest.raises(ValueError, match=r"^weight: the saved table has 8 rows, more than this table's max_capacity=4; "
                                         r"build it with max_capacity >= 8$"):
        table.load_state_dict(saved.state_dict())
    assert table.capacity == 2 and table.num_keys == 0  # nothing loaded


def test_dynamic_adagrad_state_survives_growth():
    table = DynamicEmbeddingBag(2, initial_capacity=1, max_capacity=16, optimizer="adagrad_rowwise", lr=0.1, seed=0)
    table(torch.tensor([[7]])).sum().backward()
    assert table.momentum[table.lookup(torch.tensor(7))[0]].item() == pytest.approx(1.0)
    table(torch.tensor([[7], [8], [9]])).sum().backward()
    rows = table.lookup(torch.tensor([7, 8]))[0]
    torch.testing.assert_close(table.momentum[rows], torch.tensor([2.0, 1.0]))


def test_dynamic_evicts_the_least_frequent_rows_deterministically():
    table = DynamicEmbeddingBag(2, initial_capacity=4, max_capacity=4, seed=0)
    with torch.no_grad():
        table(torch.tensor([[1, 1, 1], [2, 2, 3], [4, 4, 4]]))  # counts: 1->3, 2->2, 3->1, 4->3
        row_of_3 = int(table.lookup(torch.tensor(3))[0])
        table(torch.tensor([[5]]))  # full: evict key 3 (count 1)
        assert table.lookup(torch.tensor([1, 2, 3, 4, 5]))[1].tolist() == [True, True, False, True, True]
        assert int(table.lookup(torch.tensor(5))[0]) == row_of_3 and table.capacity == 4
        table(torch.tensor([[6]]))  # counts now 1->3, 2->2, 4->3, 5->1: evict 5
        assert table.lookup(torch.tensor([2, 5, 6]))[1].tolist() == [True, False, True]
        table(torch.tensor([[7, 8]]))  # 6 (count 1) and 2 (count 2) go
        assert sorted(table.sorted_keys.tolist()) == [1, 4, 7, 8]
        with pytest.raises(ValueError, match="max_capacity=4"):
            table(torch.tensor([[10, 11, 12, 13, 14]]))


def test_dynamic_key_map_stays_sorted_and_exact_through_growth_and_eviction():
    table = DynamicEmbeddingBag(2, initial_capacity=4, max_capacity=32, seed=0)
    g = torch.Generator().manual_seed(0)
    for step in range(60):  # keys from a wide range: growth to 32 rows, then evictions every batch
        keys = torch.randint(-(10**12), 10**12, (3, 2), generator=g) if step % 3 else torch.randint(0, 40, (3, 2), generator=g)
        table(keys)
        used = table.used.nonzero().squeeze(1)
        assert table.sorted_keys.numel() == used.numel() <= 32
        assert bool((table.sorted_keys.diff() > 0).all())  # sorted, distinct
        assert torch.equal(table.sorted_keys, table.row_keys[used].sort().values)  # what a full re-sort gives
        rows, found = table.lookup(table.row_keys[used])
        assert bool(found.all()) and torch.equal(rows, used)  # every used row is found under its key
        assert bool(table.lookup(keys.reshape(-1))[1].all())  # the batch's keys are all in the map
    assert table.capacity == 32


def test_dynamic_is_deterministic_for_a_seed_and_eval_ignores_unknown_keys():
    def run(seed):
        table = DynamicEmbeddingBag(4, initial_capacity=2, max_capacity=8, pooling="mean", seed=seed)
        g = torch.Generator().manual_seed(1)
        for _ in range(5):
            table(torch.randint(0, 20, (2, 3), generator=g)).pow(2).sum().backward()
        return table

    a, b, c = run(0), run(0), run(1)
    assert torch.equal(a.weight, b.weight) and torch.equal(a.sorted_keys, b.sorted_keys)
    assert not torch.equal(a.weight, c.weight)
    a.eval()
    key = int(a.sorted_keys[0])
    unknown = int(torch.arange(100).masked_select(~torch.isin(torch.arange(100), a.sorted_keys))[0])
    out = a(torch.tensor([[key, unknown], [unknown, unknown]]))
    torch.testing.assert_close(out[0], a.embedding(torch.tensor(key)))  # mean over the known key only
    assert (out[1] == 0).all() and a.num_keys == a.capacity == 8  # full: rows were evicted


# --- hybrid placement ----------------------------------------------------------------------------

def check_hybrid_matches_plain(device):
    counts = torch.tensor([5, 0, 9, 1, 9, 3, 0, 2, 7, 4], dtype=torch.float)  # hot: 2, 4 (tie: lower first), 8
    ids = torch.tensor([[2, 1, 4], [6, 6, 0], [8, 3, 8], [9, 7, 5]])
    w = torch.rand(ids.shape)
    for pooling in ("sum", "mean"):
        hybrid = HybridEmbeddingBag(10, 4, num_hot=3, counts=counts, pooling=pooling, device=device, seed=0)
        assert hybrid.hot_ids.tolist() == [2, 4, 8] and hybrid.cold_weight.device.type == "cpu"
        plain = nn.EmbeddingBag.from_pretrained(hybrid.full_weight().detach().cpu().clone(), mode=pooling, freeze=False)
        for psw in (None, w) if pooling == "sum" else (None,):
            out = hybrid(ids.to(device), per_sample_weights=None if psw is None else psw.to(device))
            ref = plain(ids, per_sample_weights=psw)
            torch.testing.assert_close(out.cpu(), ref)
        flat, offsets = torch.tensor([2, 1, 9, 9]), torch.tensor([0, 0, 3])  # an empty first bag
        torch.testing.assert_close(hybrid(flat.to(device), offsets.to(device)).cpu(), plain(flat, offsets))
        hybrid.zero_grad()
        plain.zero_grad()
        (hybrid(ids.to(device)).cpu() * torch.arange(12.0).view(3, 4).repeat(2, 1)[:4]).sum().backward()
        (plain(ids) * torch.arange(12.0).view(3, 4).repeat(2, 1)[:4]).sum().backward()
        grad = torch.zeros(10, 4)
        grad[hybrid.hot_ids.cpu()] = hybrid.hot_weight.grad.cpu()
        grad[hybrid.cold_ids.cpu()] = hybrid.cold_weight.grad
        torch.testing.assert_close(grad, plain.weight.grad)


def test_hybrid_lookup_equals_a_plain_table_on_cpu():
    check_hybrid_matches_plain("cpu")
    bag = HybridEmbeddingBag(10, 4, num_hot=2, seed=0)
    with pytest.raises(ValueError, match="id 10 out of range for a table of 10 rows"):
        bag(torch.tensor([[1, 10]]))
    with pytest.raises(TypeError, match="int64"):
        bag(torch.tensor([[1.0]]))


@pytest.mark.gpu
def test_hybrid_lookup_equals_a_plain_table_on_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    check_hybrid_matches_plain("cuda")
    assert HybridEmbeddingBag(10, 4, num_hot=2, device="cuda").cold_weight.is_pinned()


@pytest.mark.parametrize("sparse", ["hybrid", "dynamic", "torchrec"])
def test_sparse_modules_refuse_unknown_missing_features_and_ids_past_their_table_naming_them(sparse):
    from sessrec.embeddings import DynamicTables, HybridTables, TorchRecTables

    if sparse == "torchrec":
        pytest.importorskip("torchrec")
    config = {"hybrid": HybridTables(num_hot=2), "dynamic": DynamicTables(), "torchrec": TorchRecTables()}[sparse]
    arch = config.build([TableConfig("a", 10, 4), TableConfig("b", 7, 4, feature_names=("x", "y"))], seed=0)
    ids = {"a": torch.tensor([1, 2]), "x": torch.tensor([[0, 6], [1, -1]]), "y": torch.tensor([3, 4])}
    with pytest.raises(ValueError, match=r"unknown feature keys \['colour'\]; these tables look up \['a', 'x', 'y'\]"):
        arch(SparseFeatures.from_dense(ids | {"colour": torch.tensor([1, 1])}))
    with pytest.raises(ValueError, match=r"features \['y'\] are missing from the batch \(got \['a', 'x'\]\)"):
        arch(SparseFeatures.from_dense({"a": ids["a"], "x": ids["x"]}))
    if sparse != "dynamic":  # a growing table takes any id
        with pytest.raises(ValueError, match="feature 'x': id 7 out of range for table 'b' with 7 rows"):
            arch(SparseFeatures.from_dense(ids | {"x": torch.tensor([[0, 6], [7, -1]])}))


def test_public_api():
    import sessrec.embeddings as emb

    assert sorted(emb.__all__) == sorted(
        ["DeviceLoad", "DynamicEmbeddingBag", "DynamicSparseArch", "DynamicTables", "FrequencyCap",
         "FusedEmbeddingBagCollection", "FusedTables", "HybridEmbeddingBag", "HybridSparseArch", "HybridTables",
         "IdHasher", "Shard", "ShardingPlan", "ShardingPlanner", "SparseArch", "SparseFeatures", "SparseTables",
         "TableConfig", "TableHotness", "TablePlan", "TorchRecSparseArch", "TorchRecTables", "advise_huge_pages", "embedding_bag_collection", "full_state_dict", "hash_ids", "load_full_state_dict",
         "pooled_features", "retain_freed_memory", "shard_model", "to_embedding_bag_configs", "to_keyed_jagged_tensor",
         "to_torchrec_plan"]
    )
    assert all(hasattr(emb, name) for name in emb.__all__)
