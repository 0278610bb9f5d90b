"""Side information: fitted transforms, alignment with the items through the loader, the
embedding module, item vectors, and clear errors on bad input."""


import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import pytorch_lightning as pl
import torch

from sessrec.data import (
    SchemaError,
    SessionSplits,
    SideFeatures,
    SideInfoSpec,
    read_item_vectors,
)
from sessrec.data.sources import SessionSource
from sessrec.features import SideFeatureTransform
from sessrec.models import BertEncoder, SessionModel, XLNetEncoder
from sessrec.models.side_info import SideInfoConfig, SideInfoEmbedding, SoftOneHot
from sessrec.tasks import NextItemTask, SessionDataModule

torch.set_num_threads(1)


def session_table(sessions, first=0, null_device_at=None):
    """Item ids plus side columns: ``tag`` (the item id as text), ``value`` (the item id as a
    number), ``device`` and ``timestamp``."""
    device = [["mobile" if (i + k) % 3 else "desktop" for k, _ in enumerate(s)] for i, s in enumerate(sessions)]
    if null_device_at is not None:
        device[null_device_at[0]][null_device_at[1]] = None
    return pa.table(
        {
            "session_id": list(range(first, first + len(sessions))),
            "item_id": pa.array(sessions, pa.list_(pa.int64())),
            "tag": pa.array([[str(i) for i in s] for s in sessions], pa.list_(pa.string())),
            "value": pa.array([[float(i) for i in s] for s in sessions], pa.list_(pa.float64())),
            "device": pa.array(device, pa.list_(pa.string())),
            "timestamp": pa.array([[1000.0 * i + 7.0 * k * k for k in range(len(s))] for i, s in enumerate(sessions)], pa.list_(pa.float64())),
        }
    )


class Source(SessionSource):
    def __init__(self, null_device_at=None):
        self.null_device_at = null_device_at

    def load(self) -> SessionSplits:
        rng = np.random.default_rng(0)

        def sessions(n):
            return [list(rng.integers(100, 140, size=int(k))) for k in rng.integers(1, 14, n)]

        return SessionSplits(
            train=session_table(sessions(120), 0, self.null_device_at),
            valid=session_table(sessions(20), 1000),
            test=session_table(sessions(20), 2000),
            source="sessions.parquet",
        )


SIDE = SideFeatures(categorical=["tag", "device"], continuous=["value"], time=["since_prev", "dwell"], position=6)


@pytest.mark.parametrize("protocol", ["last", "all_prefixes"])
def test_features_stay_aligned_through_padding_trimming_prefixes_and_shuffling(protocol):
    dm = SessionDataModule(source=Source(), max_length=8, batch_size=16, eval_batch_size=7, eval_protocol=protocol,
                           side_features=SIDE, augment_reversed=True)
    value = dm.side.pipeline.ops["value"]
    for loader in (dm.train_dataloader(), dm.val_dataloader(), dm.test_dataloader()):
        rows = []
        for batch in loader:
            assert set(batch.features) == {"tag", "device", "position", "value", "since_prev", "dwell"}
            # the feature equal to the item id is still equal to it, cell by cell
            assert torch.equal(batch.features["tag"], batch.items)
            # the continuous copy of the id is the log-normalised raw id of the item in the same cell
            known = batch.items.numpy() > 1
            raw = dm.vocab.decode(batch.items.numpy()[known]).to_numpy(zero_copy_only=False).astype(float)
            expected = (np.log1p(raw) - value.mean_) / value.std_
            np.testing.assert_allclose(batch.features["value"].numpy()[known], expected, rtol=1e-5, atol=1e-5)
            for name, f in batch.features.items():
                assert f.shape == batch.items.shape
                assert (f[batch.items == 0] == 0).all(), name  # padding stays padding
            rows.append(batch.index)
        rows = torch.cat(rows)
        assert len(rows) == (len(loader) * loader.batch_size if loader.drop_last else len(loader.items))
        assert len(set(rows.tolist())) == len(rows)


def test_transform_is_fitted_on_training_data_only():
    splits = Source().load()
    side = SideFeatureTransform(SIDE).fit(splits.train)
    again = SideFeatureTransform(SIDE).fit(splits.train)
    out, out2 = side.transform(splits.test), again.transform(splits.test)
    assert all(np.array_equal(out[k], out2[k]) for k in out)
    train_tags = set(pa.concat_arrays(splits.train.column("tag").chunks).flatten().to_pylist())
    test_tags = pa.concat_arrays(splits.test.column("tag").chunks).flatten().to_pylist()
    unseen = np.array([t not in train_tags for t in test_tags])
    assert (out["tag"][unseen] == 1).all() and (out["tag"][~unseen] >= 2).all()
    t = np.concatenate([np.asarray(x) for x in splits.test.column("timestamp").to_pylist()])
    # since_prev / dwell: missing (0) at session starts / ends, the log-normalised gap elsewhere
    first = np.concatenate([[True] + [False] * (len(x) - 1) for x in splits.test.column("timestamp").to_pylist()])
    assert (out["since_prev"][first] == 0).all()
    op = side.pipeline.ops["since_prev"]
    gaps = np.diff(t)[~first[1:]]
    np.testing.assert_allclose(out["since_prev"][~first], (np.log1p(gaps) - op.mean_) / op.std_, rtol=1e-5)
    assert side.spec == SideInfoSpec(
        categorical={"tag": side.pipeline.ops["tag"].num_ids, "device": 4, "position": 7},
        continuous=["value", "since_prev", "dwell"],
        looks_ahead=["dwell"],
    )


def test_evaluation_hides_the_look_ahead_of_the_last_input_event():
    dm = SessionDataModule(source=Source(), max_length=8, eval_protocol="all_prefixes", side_features=SIDE)
    for split in ("valid", "test"):
        dwell = dm.feature_tensors(split)["dwell"]
        assert (dwell[:, -1] == 0).all()  # the time to the target event is not an input
        assert (dwell[:, :-1] != 0).any()
    assert (dm.feature_tensors("train")["dwell"][:, :-1] != 0).any()


def test_transforms_round_trip_through_a_file(tmp_path):
    splits = Source().load()
    side = SideFeatureTransform(SIDE).fit(splits.train)
    side.save(tmp_path / "features.npz")
    loaded = SideFeatureTransform.load(tmp_path / "features.npz", SIDE)
    a, b = side.transform(splits.test), loaded.transform(splits.test)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    with pytest.raises(ValueError, match="do not match the recipe"):
        SideFeatureTransform.load(tmp_path / "features.npz", SideFeatures(categorical=["device"]))
    dm = SessionDataModule(source=Source(), side_features=SIDE, features_path=str(tmp_path / "features.npz"))
    assert dm.side.pipeline.ops["value"].mean_ == side.pipeline.ops["value"].mean_


def test_the_data_module_state_round_trips(tmp_path):
    dm = SessionDataModule(source=Source(), side_features=SIDE)
    expected = dm.side.transform(dm.splits.test)
    torch.save({"state_dict": {}, "SessionDataModule": dm.state_dict()}, tmp_path / "state.ckpt")
    saved = torch.load(tmp_path / "state.ckpt", weights_only=True)["SessionDataModule"]
    fresh = SessionDataModule(source=Source(), side_features=SIDE)
    fresh.load_state_dict(saved)
    assert fresh.vocab == dm.vocab
    got = fresh.side.transform(dm.splits.test)
    assert all(np.array_equal(got[k], expected[k]) for k in expected)
    with pytest.raises(ValueError, match="the checkpoint: the saved side features .* do not match the recipe"):
        SessionDataModule(source=Source(), side_features=SideFeatures(categorical=["device"])).load_state_dict(saved)


# ----------------------------------------------------------------------------- bad input


def test_missing_feature_column_names_source_and_column():
    dm = SessionDataModule(source=Source(), side_features=SideFeatures(categorical=["colour"]))
    with pytest.raises(SchemaError, match=r"sessions.parquet.*column 'colour' is missing.*'device'"):
        dm.tensors("train")


def test_null_in_a_categorical_without_a_policy_is_refused():
    dm = SessionDataModule(source=Source(null_device_at=(3, 0)), side_features=SideFeatures(categorical=["device"]))
    with pytest.raises(SchemaError, match=r"sessions.parquet.*column 'device' has a null value \(None\) at event 0 of session 3.*nulls: pad"):
        dm.tensors("train")
    dm = SessionDataModule(source=Source(null_device_at=(3, 0)), side_features=SideFeatures(categorical=["device"], nulls="pad"))
    device = dm.side.transform(dm.splits.train)["device"]
    first_of_session_3 = int(sum(len(s) for s in dm.splits.train.column("item_id").to_pylist()[:3]))
    assert device[first_of_session_3] == 0 and (np.delete(device, first_of_session_3) >= 2).all()


def test_a_negative_continuous_value_is_refused_naming_its_session_and_event():
    """The row named was the value's index among the split's present values (nulls skipped), no row of any file."""
    table = pa.table({"session_id": [7, 8], "item_id": [[1, 2, 3], [4, 5]],
                      "price": pa.array([[None, 2.0, 3.0], [1.0, -4.0]], pa.list_(pa.float64()))})
    side = SideFeatureTransform(SideFeatures(continuous=["price"]))
    message = ("f.parquet: column 'price' has a negative value -4.0 at event 1 of session 8; a continuous side feature "
               "is log-normalised and needs values >= 0: a column normalised upstream goes under side_features.normalized")
    with pytest.raises(SchemaError, match=f"^{re.escape(message)}$"):
        side.fit(table, "f.parquet")
    fitted = side.fit(table.slice(0, 1), "f.parquet")
    with pytest.raises(SchemaError, match=f"^{re.escape(message.replace('f.parquet', 'g.csv'))}$"):
        fitted.transform(table, "g.csv")


def test_wrong_kinds_are_refused():
    with pytest.raises(SchemaError, match=r"column 'value' has dtype double.*continuous"):
        SideFeatureTransform(SideFeatures(categorical=["value"])).fit(Source().load().train, "f.parquet")
    with pytest.raises(SchemaError, match=r"f.parquet: column 'device' has dtype string.*needs numbers"):
        SideFeatureTransform(SideFeatures(continuous=["device"])).fit(Source().load().train, "f.parquet")
    with pytest.raises(ValueError, match="unknown time feature"):
        SideFeatures(time=["elapsed"])


def test_integer_continuous_values_beyond_2_53_are_read_as_the_nearest_float():
    """An int64 continuous feature past 2**53 (nanoseconds, a Merlin INT list column) failed with Arrow's raw error
    'Integer value ... not in range'; it is a number, read as the nearest float64 (as the readers read such times)."""
    sessions = pa.table({"session_id": [1, 2], "item_id": [[1, 2], [3, 4]],
                         "ns": pa.array([[2**53 + 1, 5], [None, 2**62]], pa.list_(pa.int64()))})
    side = SideFeatureTransform(SideFeatures(continuous=["ns"], normalized=["ns"])).fit(sessions, "f.parquet")
    assert side.transform(sessions, "f.parquet")["ns"].tolist() == [np.float32(2**53), 5.0, 0.0, np.float32(2**62)]


# ----------------------------------------------------------------------------- the model side


def test_concat_starts_as_the_plain_item_model_and_hides_invisible_positions():
    torch.manual_seed(0)
    spec = SideInfoSpec(categorical={"device": 4}, continuous=["price"])
    side = SideInfoEmbedding(8, 20, spec, SideInfoConfig(aggregation="concat", feature_dim=4))
    x = torch.randn(2, 3, 8)
    feats = {"device": torch.tensor([[2, 3, 2], [0, 2, 3]]), "price": torch.tensor([[0.5, -1.0, 2.0], [0.0, 1.0, 1.0]])}
    hidden = torch.zeros(2, 3, dtype=torch.bool)
    torch.testing.assert_close(side(x, torch.ones(2, 3, dtype=torch.long), feats, hidden), x)  # identity item block
    visible = torch.tensor([[True, False, True], [False, True, True]])
    out = side(x, torch.ones(2, 3, dtype=torch.long), feats, visible)
    assert not torch.allclose(out[visible], x[visible])
    torch.testing.assert_close(out[~visible], x[~visible])
    changed = {k: v.clone() for k, v in feats.items()}
    changed["device"][0, 1], changed["price"][0, 1] = 3, 9.0  # features of a hidden position
    torch.testing.assert_close(side(x, torch.ones(2, 3, dtype=torch.long), changed, visible), out)
    with pytest.raises(ValueError, match="side feature 'price'"):
        side(x, torch.ones(2, 3, dtype=torch.long), {"device": feats["device"]}, visible)


def test_a_column_declared_looks_ahead_is_hidden_like_dwell():
    side = SideFeatures(categorical=["tag"], continuous=["value"], looks_ahead=["value", "tag"])
    dm = SessionDataModule(source=Source(), max_length=8, eval_protocol="all_prefixes", side_features=side)
    assert dm.side_info.looks_ahead == ["value", "tag"]
    for split in ("valid", "test"):
        features = dm.feature_tensors(split)
        assert (features["value"][:, -1] == 0).all() and (features["tag"][:, -1] == 0).all()
        assert (features["value"][:, :-1] != 0).any()
    assert SIDE.looks_ahead_features == ["dwell"]  # the time features declare their own
    with pytest.raises(ValueError, match="looks_ahead names 'price'"):
        SideFeatures(continuous=["value"], looks_ahead=["price"])


def test_a_categorical_look_ahead_feature_is_hidden_before_a_hidden_position():
    torch.manual_seed(0)
    spec = SideInfoSpec(categorical={"next_action": 5}, looks_ahead=["next_action"])
    model = SessionModel(20, XLNetEncoder(d_model=8, n_head=2, n_layer=1), dropout=0.0,
                         side_info=SideInfoEmbedding(8, 20, spec, SideInfoConfig(feature_dim=4))).eval()
    inputs, masked = torch.tensor([[5, 6, 0, 8]]), torch.tensor([[False, False, True, False]])
    base = {"next_action": torch.tensor([[2, 3, 0, 4]])}
    other = {"next_action": torch.tensor([[4, 2, 0, 2]])}
    a, b = model.embed(inputs, masked, base)[0], model.embed(inputs, masked, other)[0]
    torch.testing.assert_close(a[1], b[1])  # the next event is the [MASK] slot
    torch.testing.assert_close(a[3], b[3])  # the last event
    assert not torch.allclose(a[0], b[0])


def test_look_ahead_features_are_hidden_before_a_hidden_position():
    torch.manual_seed(0)
    spec = SideInfoSpec(continuous=["dwell", "price"], looks_ahead=["dwell"])
    model = SessionModel(20, XLNetEncoder(d_model=8, n_head=2, n_layer=1), dropout=0.0,
                         side_info=SideInfoEmbedding(8, 20, spec, SideInfoConfig(feature_dim=4))).eval()
    inputs = torch.tensor([[0, 5, 6, 0, 8, 9]])
    masked = torch.tensor([[False, False, False, True, False, False]])  # position 3 is a [MASK] slot
    feats = {"dwell": torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]]), "price": torch.ones(1, 6)}
    base = model.embed(inputs, masked, feats)

    def changed(pos):
        f = {k: v.clone() for k, v in feats.items()}
        f["dwell"][0, pos] += 10.0
        return model.embed(inputs, masked, f)[0, pos]

    torch.testing.assert_close(changed(2), base[0, 2])  # its next event is hidden: its dwell is not seen
    torch.testing.assert_close(changed(5), base[0, 5])  # the last event: the next one is what is predicted
    torch.testing.assert_close(changed(3), base[0, 3])  # the [MASK] slot itself shows nothing
    assert not torch.allclose(changed(1), base[0, 1]) and not torch.allclose(changed(4), base[0, 4])


def test_sum_aggregation_and_soft_one_hot():
    torch.manual_seed(0)
    spec = SideInfoSpec(categorical={"device": 4}, continuous=["price"])
    side = SideInfoEmbedding(8, 20, spec, SideInfoConfig(aggregation="sum", feature_dim=4, soft_one_hot_bins=3))
    x = torch.randn(1, 2, 8)
    feats = {"device": torch.tensor([[2, 3]]), "price": torch.tensor([[0.5, -1.0]])}
    visible = torch.ones(1, 2, dtype=torch.bool)
    soft = side.continuous["price"]
    w = torch.softmax(feats["price"][..., None] * soft.logits.weight[:, 0] + soft.logits.bias, dim=-1)
    expected = x + side.project(side.categorical["device"](feats["device"]) + w @ soft.table)
    torch.testing.assert_close(side(x, torch.ones(1, 2, dtype=torch.long), feats, visible), expected)
    one = SoftOneHot(bins=4, dim=2)
    assert torch.allclose(torch.softmax(one.logits(torch.tensor([[0.3]])[..., None]), -1).sum(), torch.tensor(1.0))


def test_item_vectors_are_l2_normalised_then_layer_normed_per_modality():
    torch.manual_seed(0)
    spec = SideInfoSpec(item_vectors={"text": 3, "image": 2})
    side = SideInfoEmbedding(4, 5, spec, SideInfoConfig(feature_dim=2))
    text = torch.tensor([[0.0, 0, 0], [0, 0, 0], [3.0, 4.0, 0.0], [1.0, 1.0, 1.0], [0, 0, 0]])
    image = torch.tensor([[0.0, 0], [0, 0], [10.0, 0.0], [0.0, -2.0], [5.0, 5.0]])
    side.item_vectors.set_vectors("text", text)
    side.item_vectors.set_vectors("image", image)
    torch.testing.assert_close(side.item_vectors.table_text[2], torch.tensor([0.6, 0.8, 0.0]))
    assert (side.item_vectors.table_text[4] == 0).all()  # an item without a vector stays zero
    ids = torch.tensor([[2, 3]])
    got = side.item_vectors(ids)
    ln_t, ln_i = side.item_vectors.norms["text"], side.item_vectors.norms["image"]
    expected = torch.cat([ln_t(torch.nn.functional.normalize(text[ids], dim=-1)), ln_i(torch.nn.functional.normalize(image[ids], dim=-1))], -1)
    torch.testing.assert_close(got, expected)
    with pytest.raises(ValueError, match="shape"):
        side.item_vectors.set_vectors("text", torch.zeros(5, 4))


def test_read_item_vectors_aligns_with_the_vocabulary(tmp_path):
    dm = SessionDataModule(source=Source())
    raw = dm.vocab.raw_ids.to_pylist()
    ids = [raw[3], raw[0], 999_999]  # 999_999 is not in the vocabulary: ignored
    path = tmp_path / "text.parquet"
    pq.write_table(pa.table({"item_id": ids, "vector": [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]}), path)
    table, found = read_item_vectors(path, dm.vocab)
    assert table.shape == (len(dm.vocab), 2) and found == 2
    assert table[2 + 3].tolist() == [1.0, 2.0] and table[2].tolist() == [3.0, 4.0]
    assert np.count_nonzero(table.any(axis=1)) == 2
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"item_id": [raw[0], raw[1]], "vector": [[1.0, 2.0], [3.0]]}), bad)
    with pytest.raises(SchemaError, match=r"bad.parquet.*one width"):
        read_item_vectors(bad, dm.vocab)
    pq.write_table(pa.table({"item_id": [raw[0]], "embedding": [[1.0]]}), bad)
    with pytest.raises(SchemaError, match=r"bad.parquet: column 'vector' is missing"):
        read_item_vectors(bad, dm.vocab)
    pq.write_table(pa.table({"item_id": [raw[0], raw[0]], "vector": [[1.0], [2.0]]}), bad)
    with pytest.raises(SchemaError, match=rf"bad.parquet: column 'item_id' holds item {raw[0]} more than once"):
        read_item_vectors(bad, dm.vocab)
    pq.write_table(pa.table({"item_id": [raw[0]], "vector": [[float("nan")]]}), bad)
    with pytest.raises(SchemaError, match=r"non-finite value at row 0"):
        read_item_vectors(bad, dm.vocab)


def test_training_with_side_features_and_item_vectors(tmp_path):
    dm0 = SessionDataModule(source=Source())
    vectors = np.random.default_rng(0).normal(size=(len(dm0.vocab.raw_ids), 6))
    pq.write_table(pa.table({"item_id": dm0.vocab.raw_ids, "vector": list(vectors)}), tmp_path / "v.parquet")
    side = SideFeatures(categorical=["device"], continuous=["value"], position=4, item_vectors={"text": str(tmp_path / "v.parquet")})
    dm = SessionDataModule(source=Source(), max_length=8, batch_size=32, side_features=side)
    assert dm.side_info.item_vectors == {"text": 6}
    torch.manual_seed(0)
    task = NextItemTask(num_items=dm.num_items, max_length=8, encoder=XLNetEncoder(d_model=16, n_head=2, n_layer=1),
                        side_features=dm.side_info)
    trainer = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path, num_sanity_val_steps=0)
    trainer.fit(task, dm)
    table = task.model.side_info.item_vectors.table_text
    row = dm.vocab.encode(dm.vocab.raw_ids.slice(0, 1)).ids[0]
    torch.testing.assert_close(table[row], torch.nn.functional.normalize(torch.tensor(vectors[0], dtype=torch.float32), dim=0))
    assert torch.isfinite(trainer.callback_metrics["val/recall@20"])
    state = task.state_dict()
    assert "model.side_info.item_vectors.table_text" in state  # the vectors travel with the checkpoint


def test_session_model_without_features_refuses_a_side_model():
    spec = SideInfoSpec(categorical={"device": 3})
    model = SessionModel(10, XLNetEncoder(d_model=8, n_head=2, n_layer=1), side_info=SideInfoEmbedding(8, 10, spec))
    with pytest.raises(ValueError, match="side feature 'device'"):
        model(torch.tensor([[2, 3]]))
    scores = model(torch.tensor([[2, 3]]), features={"device": torch.tensor([[2, 2]])})
    assert scores.shape == (1, 10)


@pytest.mark.parametrize("aggregation", ["concat", "sum"])
def test_side_features_the_model_cannot_embed_are_refused_naming_the_feature(aggregation):
    """A feature of another shape than the items, a category id outside its table or a categorical feature
    that is not of ids is one line naming the feature, where torch said "index out of range in self"."""
    spec = SideInfoSpec(categorical={"device": 5}, continuous=["price"])
    side = SideInfoEmbedding(8, 30, spec, SideInfoConfig(aggregation=aggregation))
    model = SessionModel(30, XLNetEncoder(d_model=8, n_head=2, n_layer=1), side_info=side).eval()
    items, price = torch.tensor([[0, 5, 6, 7]]), torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    cases = [
        ({"device": torch.tensor([[1, 2, 3]]), "price": price}, "side feature 'device' has shape (1, 3), the items (1, 4)"),
        ({"device": torch.tensor([[0, 1, 2, 3]]), "price": price[:, 1:]}, "side feature 'price' has shape (1, 3), the items (1, 4)"),
        ({"device": torch.tensor([[0, 1, 2, 5]]), "price": price},
         "side feature 'device': id 5 at [0, 3] is out of range: its ids are 0..4"),
        ({"device": torch.tensor([[0, -1, 2, 3]]), "price": price},
         "side feature 'device': id -1 at [0, 1] is out of range: its ids are 0..4"),
        ({"device": torch.tensor([[0.0, 1.0, 2.0, 3.0]]), "price": price},
         "side feature 'device' holds category ids (integers), got a float32 tensor"),
    ]
    with torch.no_grad():
        for features, message in cases:
            with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
                model(items, features=features)
        assert model(items, features={"device": torch.tensor([[0, 1, 2, 4]]), "price": price}).shape == (1, 30)


def test_side_features_follow_the_items_when_mlm_cuts_random_prefixes():
    from sessrec.models import MaskedItemModeling

    spec = SideInfoSpec(categorical={"tag": 20})
    model = SessionModel(20, XLNetEncoder(d_model=8, n_head=2, n_layer=1), side_info=SideInfoEmbedding(8, 20, spec))
    items = torch.tensor([[0, 0, 3, 4, 5, 6, 7], [2, 3, 4, 5, 6, 7, 8], [0, 0, 0, 0, 0, 9, 10]])
    seen = []
    encode = model.encode
    model.encode = lambda inputs, masked, features=None, **kw: seen.append((inputs, masked, features)) or encode(
        inputs, masked, features, **kw
    )
    objective = MaskedItemModeling(mask_prob=0.3, prefix_prob=1.0)
    objective.training_output(model, items, torch.Generator().manual_seed(0), {"tag": items.clone()})
    inputs, masked, features = seen[-1]
    assert not torch.equal(features["tag"], items)  # the sessions were cut and shifted ...
    assert torch.equal(features["tag"].masked_fill(masked, 0), inputs)  # ... and the feature (= the id) with them


@pytest.mark.parametrize("aggregation", ["concat", "sum"])
def test_a_continuous_side_value_that_is_no_number_is_refused_at_an_item_and_never_read_at_padding(aggregation):
    """A NaN price of a real item is one line naming the feature, the value and its position (its scores were NaN,
    and a top-k of NaN scores recommends arbitrary items); a NaN or infinite value at padding is not read: the
    session scores as with 0 there, where it made every score of the session NaN."""
    torch.manual_seed(0)
    spec = SideInfoSpec(categorical={"device": 5}, continuous=["price"])
    side = SideInfoEmbedding(8, 30, spec, SideInfoConfig(aggregation=aggregation))
    model = SessionModel(30, BertEncoder(d_model=8, n_head=2, n_layer=1), side_info=side).eval()
    items, device = torch.tensor([[0, 5, 6, 7], [4, 5, 6, 7]]), torch.tensor([[0, 1, 2, 3], [1, 1, 2, 3]])
    price = torch.tensor([[0.0, 1.0, 2.0, 3.0], [1.0, 1.0, 2.0, 3.0]])
    with torch.no_grad():
        expected = model(items, features={"device": device, "price": price})
        for value in (float("nan"), float("inf")):
            padded = price.clone()
            padded[0, 0] = value
            torch.testing.assert_close(model(items, features={"device": device, "price": padded}), expected)
        price[1, 2] = float("nan")
        with pytest.raises(ValueError, match=r"^side feature 'price': nan at \[1, 2\] of a real item is not a finite number$"):
            model(items, features={"device": device, "price": price})


@pytest.mark.parametrize(("changed", "message"), [
    ({"position": 3}, "'position' has 4 ids there and 7 in the network"),  # positions the network never saw
    ({"looks_ahead": ["value"]}, "look-ahead ['dwell', 'value'] there, ['dwell'] in the network"),  # a value zeroed
])
def test_evaluating_with_other_side_features_than_the_network_was_built_for_is_refused(tmp_path, changed, message):
    """A recipe whose position cap or look-ahead columns differ from the model's scored with exit 0."""
    dm = SessionDataModule(source=Source(), max_length=8, eval_batch_size=64, side_features=SIDE)
    task = NextItemTask(num_items=dm.num_items, max_length=8, encoder=XLNetEncoder(d_model=8, n_head=2, n_layer=1),
                        side_features=dm.side_info)
    other = SessionDataModule(source=Source(), max_length=8, eval_batch_size=64,
                              side_features=SideFeatures(**{**vars(SIDE), **changed}))
    trainer = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path)
    message = (f"the data module's side features do not match the model's: {message}; score with the side_features "
               "it was trained with")
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        trainer.test(task, other, verbose=False)


def test_scoring_an_event_file_whose_schema_names_the_side_columns_as_features(tmp_path):
    """`predict_schema.features` naming the side columns, as documented, was refused ("given two roles")."""
    from sessrec.data import FeatureSpec, Schema
    from sessrec.data.stream import ScoringStream

    splits = Source().load()
    side = SideFeatureTransform(SIDE).fit(splits.train)
    sessions = splits.test.slice(0, 6)
    lengths = [len(s) for s in sessions.column("item_id").to_pylist()]
    flat = {c: sessions.column(c).combine_chunks().flatten() for c in ("item_id", "tag", "value", "device", "timestamp")}
    events = pa.table({"session_id": np.repeat(sessions.column("session_id").to_numpy(), lengths), **flat})
    pq.write_table(events, tmp_path / "events.parquet")
    vocab = SessionDataModule(source=Source()).vocab
    plain = Schema()
    named = Schema(features=[FeatureSpec("tag"), FeatureSpec("device"), FeatureSpec("value", "continuous")])
    got = [list(ScoringStream(tmp_path / "events.parquet", vocab, schema, 8, 4, side=side)) for schema in (plain, named)]
    assert len(got[1]) == len(got[0]) == 2
    for a, b in zip(*got):
        assert torch.equal(a.items, b.items) and a.features.keys() == b.features.keys()
        assert all(torch.equal(a.features[k], b.features[k]) for k in a.features)
