"""Embedding core: configs, jagged ids, fused tables (padding, offsets, pooling, fused optimizers),
hashing and frequency capping, dynamic tables, hybrid placement, and bad inputs."""

import pytest
import torch
from torch import nn

from sessrec.embeddings import FusedEmbeddingBagCollection, SparseFeatures, TableConfig

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


# --- fused optimizers ------------------------------------------------------------------------

def reference_rowwise_adagrad(weight, momentum, grad, lr, eps, dim):
    """Hand-written row-wise Adagrad on a dense gradient: only rows with a non-zero gradient move."""
    touched = grad.abs().sum(1) > 0
    momentum = momentum + torch.where(touched, grad.pow(2).sum(1) / dim, 0.0)
    return weight - torch.where(touched.unsqueeze(1), lr * grad / (momentum.sqrt() + eps).unsqueeze(1), 0.0), momentum


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad_rowwise"])
def test_fused_optimizer_matches_reference_with_duplicate_ids(optimizer):
    tables = [TableConfig("a", 6, 3, pooling="mean"), TableConfig("b", 4, 3)]  # 3 -> 4: padding must not count
    ebc = FusedEmbeddingBagCollection(tables, optimizer=optimizer, lr=0.1, seed=0)
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


def test_no_update_without_backward_and_under_no_grad():
    ebc = FusedEmbeddingBagCollection([TableConfig("a", 5, 4)], optimizer="sgd", seed=0)
    before = ebc.weight(0).clone()
    with torch.no_grad():
        ebc(SparseFeatures.from_dense({"a": torch.tensor([1, 2])}))
    assert torch.equal(before, ebc.weight(0))


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
