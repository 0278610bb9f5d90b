"""Feature-engineering ops: hand-computed values, brute-force references, persistence, errors, backends.

Every op runs on NumPy and on ``array_api_strict`` arrays (proof that the code uses the array API
standard only, where the op is expressible in it); tests marked ``gpu`` run the same cases on CuPy.
"""

from __future__ import annotations

import json
import math
import runpy
from pathlib import Path

import array_api_strict
import numpy as np
import pyarrow as pa
import pytest

from sessrec.data.vocab import ItemVocab
from sessrec.features import (
    Categorify,
    CountEncoding,
    CyclicTime,
    FeaturePipeline,
    HashedCross,
    LogNormalize,
    NotFittedError,
    SessionTimeFeatures,
    TargetEncoding,
    session_offsets,
    session_times,
)
from sessrec.features.backend import as_column, bincount, hash_columns, mix64, to_host

BACKENDS = ["numpy", "strict"]


def on(backend: str, frame: dict[str, list]) -> dict:
    """The frame's columns as arrays of `backend`."""
    if backend == "numpy":
        return {k: np.asarray(v) for k, v in frame.items()}
    if backend == "strict":
        return {k: array_api_strict.asarray(np.asarray(v)) for k, v in frame.items()}
    import cupy

    return {k: cupy.asarray(np.asarray(v)) for k, v in frame.items()}


def host(x) -> np.ndarray:
    return to_host(x)


# ------------------------------------------------------------------------------------- Categorify
# training counts: 5 x3, 7 x2, 8 x1, 9 x1
TRAIN_C = {"c": [5, 7, 5, 9, 7, 5, 8]}
TEST_C = {"c": [7, 5, 9, 4, 8]}


@pytest.mark.parametrize("backend", BACKENDS)
def test_categorify_ids_by_frequency_then_value(backend):
    op = Categorify("c").fit(on(backend, TRAIN_C))
    assert host(op.transform(on(backend, TEST_C))).tolist() == [3, 2, 5, 1, 4]  # 4 unseen -> OOV 1
    assert op.num_ids == 4 + 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_categorify_frequency_capping(backend):
    rare = Categorify("c", min_count=2).fit(on(backend, TRAIN_C))
    assert host(rare.transform(on(backend, TEST_C))).tolist() == [3, 2, 1, 1, 1]
    top1 = Categorify("c", max_size=1).fit(on(backend, TRAIN_C))
    assert host(top1.transform(on(backend, TEST_C))).tolist() == [1, 2, 1, 1, 1]
    assert top1.num_ids == 3


def test_categorify_text_with_nulls_padded():
    train = {"c": pa.array(["b", "a", "b", None, "c", "a", "b"])}  # b x3, a x2, c x1
    op = Categorify("c", nulls="pad").fit(train)
    assert op.transform({"c": pa.array(["c", "zz", None, "a", "b"])}).tolist() == [4, 1, 0, 3, 2]
    with pytest.raises(ValueError, match=r"column 'c' has a null at row 3.*nulls='pad'"):
        Categorify("c").fit(train)


@pytest.mark.parametrize("kind", ["int", "text"])
def test_categorify_matches_item_vocab(kind):
    rng = np.random.default_rng(0)
    train, test = rng.zipf(1.5, 3_000) % 200, rng.zipf(1.5, 500) % 250
    if kind == "text":
        train, test = np.char.add("v", train.astype(str)), np.char.add("v", test.astype(str))
    for min_count, max_size in [(1, None), (3, None), (1, 20), (2, 50)]:
        op = Categorify("c", min_count=min_count, max_size=max_size).fit({"c": pa.array(train)})
        vocab = ItemVocab.fit(pa.array(train), min_count=min_count, max_size=max_size)
        assert op.to_vocab() == vocab
        np.testing.assert_array_equal(op.transform({"c": test}), vocab.encode(pa.array(test)).ids)
        assert op.num_ids == len(vocab)


@pytest.mark.parametrize("backend", BACKENDS)
def test_codes_fitted_in_one_kind_are_read_in_the_other_by_their_decimal_text(backend):
    """A parquet file's integer codes and a CSV's text codes are one category when the text is the integer's
    decimal: `1` is 1, `01` and `x` are codes never seen, never 1 (unseen: OOV 1)."""
    ints = Categorify("c").fit(on(backend, {"c": [7, 7, 1, -3, 2**62]}))
    text = pa.array(["1", "01", "7", "x", "-3", str(2**62), str(2**64), "+7", " 7"])
    assert host(ints.transform({"c": text})).tolist() == [4, 1, 2, 1, 3, 5, 1, 1, 1]  # 7 most frequent, then -3, 1, 2**62
    words = Categorify("c").fit({"c": pa.array(["7", "7", "1", "01"])})
    assert host(words.transform(on(backend, {"c": [1, 7, 5]}))).tolist() == [4, 2, 1]  # "7", then "01" and "1" by bytes


# ---------------------------------------------------------------------------------- CountEncoding
@pytest.mark.parametrize("backend", BACKENDS)
def test_count_encoding(backend):
    op = CountEncoding("c").fit(on(backend, {"c": [3, 3, 1, 3, 2, 1]}))
    assert host(op.transform(on(backend, {"c": [1, 2, 3, 4]}))).tolist() == [2, 1, 3, 0]


def test_count_encoding_text_nulls_as_unseen():
    op = CountEncoding("c", nulls="unseen").fit({"c": pa.array(["x", None, "x", "y"])})
    assert op.transform({"c": pa.array([None, "x", "y", "q"])}).tolist() == [0, 2, 1, 0]


# --------------------------------------------------------------------------------- TargetEncoding
TE_TRAIN = {"c": [1, 1, 2, 2, 2, 3], "y": [1.0, 0.0, 1.0, 1.0, 0.0, 1.0], "s": [10, 10, 11, 12, 12, 13]}


@pytest.mark.parametrize("backend", BACKENDS)
def test_target_encoding_full_train_statistics(backend):
    # prior = 4/6; m = 2: c=1 -> (1 + 2*2/3) / (2 + 2) = 7/12, c=2 -> (2 + 4/3) / 5 = 2/3,
    # c=3 -> (1 + 4/3) / 3 = 7/9, unseen 9 -> the prior 2/3
    op = TargetEncoding("c", "y", smoothing=2.0).fit(on(backend, TE_TRAIN))
    out = host(op.transform(on(backend, {"c": [1, 2, 3, 9]})))
    np.testing.assert_allclose(out, [7 / 12, 2 / 3, 7 / 9, 2 / 3], rtol=0, atol=1e-15)


def brute_force_oof(c, y, fold, m) -> np.ndarray:
    """Out-of-fold smoothed means by a loop over rows (the reference)."""
    out = np.empty(len(y))
    for r in range(len(y)):
        outside = fold != fold[r]
        prior = y[outside].mean()
        same = outside & (c == c[r])
        out[r] = (y[same].sum() + m * prior) / (same.sum() + m)
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("target", ["binary", "continuous"])
def test_target_encoding_out_of_fold_matches_brute_force(backend, target):
    rng = np.random.default_rng(1)
    n = 400
    session = np.sort(rng.integers(0, 90, n))
    c = rng.integers(0, 12, n)
    y = rng.integers(0, 2, n).astype(float) if target == "binary" else rng.normal(3.0, 2.0, n)
    op = TargetEncoding("c", "y", fold_by="s", n_folds=4, smoothing=3.0, seed=5)
    frame = on(backend, {"c": c, "y": y, "s": session})
    out = host(op.fit_transform(frame))
    fold = host(op.folds(frame))
    assert set(fold.tolist()) == {0, 1, 2, 3}
    np.testing.assert_allclose(out, brute_force_oof(c, y, fold, 3.0), rtol=1e-12, atol=1e-12)
    full = host(op.transform(frame))  # other splits: full-train statistics
    prior = y.mean()
    ref = [(y[c == v].sum() + 3.0 * prior) / ((c == v).sum() + 3.0) for v in c]
    np.testing.assert_allclose(full, ref, rtol=1e-12)


def test_target_encoding_own_fold_never_leaks():
    rng = np.random.default_rng(2)
    c, s = rng.integers(0, 5, 200), np.repeat(np.arange(50), 4)
    y = rng.integers(0, 2, 200).astype(float)
    op = TargetEncoding("c", "y", fold_by="s", n_folds=3)
    before = op.fit_transform({"c": c, "y": y, "s": s})
    fold = op.folds({"c": c, "y": y, "s": s})
    flipped = y.copy()
    flipped[fold == 0] = 1 - flipped[fold == 0]  # change every target of fold 0
    after = op.fit_transform({"c": c, "y": flipped, "s": s})
    np.testing.assert_array_equal(after[fold == 0], before[fold == 0])
    assert not np.array_equal(after[fold != 0], before[fold != 0])


def test_folds_deterministic_by_session_and_order_free():
    rng = np.random.default_rng(3)
    s = rng.integers(0, 1_000, 5_000)
    frame = {"c": np.zeros(5_000, dtype=np.int64), "y": np.zeros(5_000), "s": s}
    op = TargetEncoding("c", "y", fold_by="s", n_folds=5, seed=11)
    fold = op.folds(frame)
    same, other = (TargetEncoding("c", "y", fold_by="s", n_folds=5, seed=seed) for seed in (11, 12))
    np.testing.assert_array_equal(fold, same.folds(frame))
    assert not np.array_equal(fold, other.folds(frame))
    for session in np.unique(s):  # rows of one session share a fold
        assert len(set(fold[s == session].tolist())) == 1
    perm = rng.permutation(5_000)  # the fold is a function of the session id, not of the row order
    np.testing.assert_array_equal(op.folds({k: v[perm] for k, v in frame.items()}), fold[perm])
    assert np.bincount(fold).min() > 0.15 * 5_000  # roughly balanced
    # hard-coded: sessions 0..5 with seed 11 into 5 folds
    six = {"c": np.zeros(6, dtype=np.int64), "y": np.zeros(6), "s": np.arange(6)}
    assert op.folds(six).tolist() == hash_columns([np.arange(6)], 5, seed=11).tolist() == EXPECTED_FOLDS


EXPECTED_FOLDS = [4, 1, 2, 3, 1, 2]


def test_target_encoding_text_fold_keys_and_nulls():
    frame = {
        "c": pa.array(["a", None, "a", "b"]),
        "y": np.array([1.0, 0.0, 0.0, 1.0]),
        "s": pa.array(["u1", "u1", "u2", "u3"]),
    }
    op = TargetEncoding("c", "y", fold_by="s", n_folds=2, smoothing=1.0, nulls="unseen")
    out = op.fit_transform(frame)
    fold = op.folds(frame)
    assert fold[0] == fold[1]
    assert np.isfinite(out).all()
    # full statistics: prior 1/2; a: (1 + 0.5) / 3 = 0.5, null and unseen -> 0.5, b: (1 + 0.5) / 2 = 0.75
    np.testing.assert_allclose(op.transform({"c": pa.array(["a", None, "b", "z"])}), [0.5, 0.5, 0.75, 0.5])


# ------------------------------------------------------------------------------- hashing, crosses
def mix64_reference(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) % 2**64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
    return z ^ (z >> 31)


def test_mix64_is_splitmix64():
    gamma = 0x9E3779B97F4A7C15
    states = np.array([0, gamma, 2 * gamma % 2**64, 3 * gamma % 2**64], dtype=np.uint64)
    # the first outputs of the SplitMix64 generator seeded with 0
    expected = [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F, 0xF88BB8A8724C81EC]
    assert [int(v) for v in mix64(states)] == expected
    assert [mix64_reference(int(v)) for v in states] == expected


def test_mix64_and_namespace_of_numpy_and_strict_arrays():
    """NumPy arrays get array_api_compat's NumPy namespace without asking it (and mix64 its constants made once), other
    arrays the namespace it gives them; the same outputs on both."""
    import array_api_compat

    from sessrec.features.backend import namespace

    x = np.array([0, 1, 2**63, 2**64 - 1], dtype=np.uint64)
    assert namespace(x) is array_api_compat.array_namespace(x) and namespace(x, x[:1]) is namespace(x)
    strict = array_api_strict.asarray(x)
    assert namespace(strict) is array_api_compat.array_namespace(strict)
    assert mix64(x).dtype == np.uint64 and [int(v) for v in mix64(x)] == [mix64_reference(int(v)) for v in x]
    assert [int(v) for v in to_host(mix64(strict))] == [int(v) for v in mix64(x)]


def test_feature_ops_read_the_outputs_of_earlier_ops_before_the_frames_columns():
    """The ops of a pipeline see the frame and the outputs of earlier ops as one mapping of columns: an earlier op's
    output of a frame column's name is the one read."""
    from sessrec.features.backend import get_column
    from sessrec.features.feature_pipeline import _View

    view = _View({"a": np.array([1, 2]), "b": np.array([3, 4])})
    view.extra["a"] = np.array([5, 6])
    assert list(view) == ["a", "b"] and "b" in view and "c" not in view and len(view) == 2
    assert get_column(view, "a").values.tolist() == [5, 6] and get_column(view, "b").values.tolist() == [3, 4]
    with pytest.raises(ValueError, match=r"^column 'c' is not in the input; it has columns \['a', 'b'\]$"):
        get_column(view, "c")


@pytest.mark.parametrize("backend", BACKENDS)
def test_hashed_cross_hard_coded_and_reference(backend):
    frame = on(backend, {"a": [1, 2, 3], "b": [10, 20, 30]})
    out = host(HashedCross(["a", "b"], buckets=1000, seed=7).transform(frame))
    assert out.tolist() == [108, 731, 472]
    pairs = [(1, 10), (2, 20), (3, 30)]
    ref = [mix64_reference(mix64_reference(mix64_reference(7) ^ a) ^ b) % 1000 for a, b in pairs]
    assert out.tolist() == ref


def test_hashed_cross_spreads_and_depends_on_seed_and_order():
    rng = np.random.default_rng(4)
    frame = {"a": rng.integers(0, 100, 20_000), "b": rng.integers(0, 100, 20_000)}
    out = HashedCross(["a", "b"], buckets=64).transform(frame)
    assert out.min() >= 0 and out.max() < 64 and np.bincount(out, minlength=64).min() > 200
    assert not np.array_equal(out, HashedCross(["a", "b"], buckets=64, seed=1).transform(frame))
    assert not np.array_equal(out, HashedCross(["b", "a"], buckets=64).transform(frame))
    np.testing.assert_array_equal(out, HashedCross(["a", "b"], buckets=64).transform(frame))


def test_hashed_cross_of_categorified_text_in_a_pipeline():
    frame = {"city": pa.array(["rome", "oslo", "rome"]), "device": np.array([0, 1, 0])}
    pipe = FeaturePipeline(
        {"city": Categorify("city"), "x": HashedCross(["city", "device"], buckets=16)}  # crosses the ids
    )
    out = pipe.fit_transform(frame)
    assert out["city"].tolist() == [2, 3, 2]
    assert out["x"].tolist() == hash_columns([np.array([2, 3, 2]), np.array([0, 1, 0])], 16).tolist()
    with pytest.raises(TypeError, match=r"column 'city' holds text \(e.g. 'rome'\).*Categorify"):
        HashedCross(["city", "device"], buckets=16).transform(frame)


# ---------------------------------------------------------------------------------- time features
SESS = {"s": [1, 1, 1, 2, 3, 3], "t": [10.0, 12.0, 20.0, 5.0, 7.0, 7.0]}


@pytest.mark.parametrize("backend", BACKENDS)
def test_session_time_features(backend):
    out = SessionTimeFeatures("s", "t").transform(on(backend, SESS))
    assert host(out.since_prev).tolist() == [0.0, 2.0, 8.0, 0.0, 0.0, 0.0]
    assert host(out.elapsed).tolist() == [0.0, 2.0, 10.0, 0.0, 0.0, 0.0]
    assert host(out.position).tolist() == [0, 1, 2, 0, 0, 1]
    assert host(out.position_from_end).tolist() == [2, 1, 0, 0, 1, 0]


def test_session_time_features_milliseconds_and_text_sessions():
    frame = {"s": pa.array(["x", "x", "y"]), "t": np.array([1_000, 3_500, 9_000])}
    out = SessionTimeFeatures("s", "t", time_unit="ms").transform(frame)
    assert out.since_prev.tolist() == [0.0, 2.5, 0.0] and out.elapsed.tolist() == [0.0, 2.5, 0.0]


def test_session_times_from_offsets_with_an_empty_session():
    offsets = np.array([0, 2, 2, 5])  # the middle session is empty
    out = session_times(np.array([1.0, 4.0, 2.0, 2.5, 6.0]), offsets)
    assert out.since_prev.tolist() == [0.0, 3.0, 0.0, 0.5, 3.5]
    assert out.position.tolist() == [0, 1, 0, 1, 2] and out.position_from_end.tolist() == [1, 0, 2, 1, 0]
    assert session_offsets(np.array([4, 4, 9, 9, 9, 2])).tolist() == [0, 2, 5, 6]
    assert session_offsets(np.array([], dtype=np.int64)).tolist() == [0]


def test_session_time_features_refuse_unsorted_rows():
    with pytest.raises(ValueError, match=r"column 's'.*session 1 are not adjacent \(again at row 3\)"):
        SessionTimeFeatures("s", "t").transform({"s": np.array([1, 1, 2, 1]), "t": np.array([1.0, 2, 3, 4])})
    with pytest.raises(ValueError, match=r"column 't' goes back in time within a session: 1.0 at row 1"):
        SessionTimeFeatures("s", "t").transform({"s": np.array([1, 1, 2]), "t": np.array([5.0, 1.0, 3.0])})


@pytest.mark.parametrize("backend", BACKENDS)
def test_cyclic_time(backend):
    monday_0630 = 4 * 86_400 + 6.5 * 3_600  # 1970-01-05 was a Monday
    sunday_18 = 1_704_045_600  # 2023-12-31 18:00 UTC, a Sunday
    out = CyclicTime("t").transform(on(backend, {"t": [0.0, monday_0630, sunday_18]}))
    hour = np.array([0.0, 6.5, 18.0]) * 2 * math.pi / 24
    weekday = np.array([3, 0, 6]) * 2 * math.pi / 7  # Thursday, Monday, Sunday
    np.testing.assert_allclose(host(out.hour_sin), np.sin(hour), atol=1e-12)
    np.testing.assert_allclose(host(out.hour_cos), np.cos(hour), atol=1e-12)
    np.testing.assert_allclose(host(out.weekday_sin), np.sin(weekday), atol=1e-12)
    np.testing.assert_allclose(host(out.weekday_cos), np.cos(weekday), atol=1e-12)
    np.testing.assert_allclose(host(out.hour_sin)[2], -1.0, atol=1e-12)  # 18:00: bottom of the circle
    ms = CyclicTime("t", time_unit="ms").transform({"t": np.array([monday_0630 * 1000])})
    np.testing.assert_allclose(ms.hour_sin, np.sin(hour[1:2]), atol=1e-12)


# ---------------------------------------------------------------------------------- LogNormalize
@pytest.mark.parametrize("backend", BACKENDS)
def test_log_normalize(backend):
    e = math.e
    op = LogNormalize("x").fit(on(backend, {"x": [0.0, e - 1, e**2 - 1]}))  # log1p: 0, 1, 2
    sd = math.sqrt(2 / 3)  # population std of (0, 1, 2)
    out = host(op.transform(on(backend, {"x": [0.0, e - 1, e**3 - 1]})))
    np.testing.assert_allclose(out, [-1 / sd, 0.0, 2 / sd], rtol=1e-12)


def test_log_normalize_negatives_and_constant_columns():
    with pytest.raises(ValueError, match=r"column 'price' has a negative value -2.0 at row 1.*='clip'"):
        LogNormalize("price").fit({"price": np.array([1.0, -2.0])})
    clipped = LogNormalize("price", negatives="clip").fit({"price": np.array([-5.0, 0.0, math.e - 1])})
    np.testing.assert_allclose(clipped.transform({"price": np.array([-1.0])}), [-(1 / 3) / math.sqrt(2 / 9)])
    const = LogNormalize("x").fit({"x": np.array([3.0, 3.0])})  # std 0: centred only
    np.testing.assert_allclose(const.transform({"x": np.array([3.0, math.e * 4 - 1])}), [0.0, 1.0])


# ------------------------------------------------------------------------------------- pipeline
def events(seed: int, n: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    session = np.sort(rng.integers(0, n // 4, n))
    t = 1_700_000_000 + session * 3_600.0 + np.arange(n) * 7.0
    return pa.table(
        {
            "session_id": session,
            "timestamp": t,
            "item_id": rng.zipf(1.6, n) % 300,
            "category": pa.array(np.char.add("cat", (rng.integers(0, 20, n)).astype(str))),
            "price": rng.gamma(2.0, 10.0, n),
            "clicked": rng.integers(0, 2, n).astype(float),
        }
    )


def pipeline() -> FeaturePipeline:
    return FeaturePipeline(
        {
            "item": Categorify("item_id", min_count=2),
            "category": Categorify("category"),
            "item_count": CountEncoding("item_id"),
            "category_ctr": TargetEncoding("category", "clicked", "session_id", n_folds=3, smoothing=5.0),
            "item_x_category": HashedCross(["item", "category"], buckets=97, seed=3),
            "price": LogNormalize("price"),
            "time": SessionTimeFeatures(),
            "clock": CyclicTime(),
        }
    )


def test_pipeline_outputs_and_round_trip(tmp_path: Path):
    train, test = events(0, 2_000), events(1, 500)
    pipe = pipeline()
    fitted = pipe.fit_transform(train)
    assert list(fitted) == [
        "item", "category", "item_count", "category_ctr", "item_x_category", "price",
        "time_since_prev", "time_elapsed", "time_position", "time_position_from_end",
        "clock_hour_sin", "clock_hour_cos", "clock_weekday_sin", "clock_weekday_cos",
    ]
    assert all(len(v) == 2_000 for v in fitted.values())
    expected = pipe.transform(test)
    path = pipe.save(tmp_path / "features.npz")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["features.npz"]  # no temporary file left
    loaded = FeaturePipeline.load(path)
    assert [repr(op) for op in loaded.ops.values()] == [repr(op) for op in pipe.ops.values()]
    again = loaded.transform(test)
    assert list(again) == list(expected)
    for name in expected:
        assert expected[name].dtype == again[name].dtype, name
        np.testing.assert_array_equal(again[name], expected[name], err_msg=name)
    # out-of-fold on train differs from the full-train transform of the same rows
    assert not np.array_equal(fitted["category_ctr"], pipe.transform(train)["category_ctr"])


def test_pipeline_inputs_pyarrow_dict_and_pandas_agree():
    train = events(0, 300)
    pipe = FeaturePipeline({"item": Categorify("item_id"), "cat": CountEncoding("category")}).fit(train)
    as_dict = {name: train.column(name).to_numpy() for name in train.column_names}
    for frame in (as_dict, train.to_pandas()):
        out = pipe.transform(frame)
        np.testing.assert_array_equal(out["item"], pipe.transform(train)["item"])
        np.testing.assert_array_equal(out["cat"], pipe.transform(train)["cat"])


def test_pyarrow_numbers_are_zero_copy():
    values = pa.chunked_array([pa.array(np.arange(10, dtype=np.int64))])
    col = as_column(values, "x")
    assert not col.values.flags.writeable  # a read-only view of Arrow's buffer, not a copy
    assert col.values.ctypes.data == values.chunk(0).buffers()[1].address


# --------------------------------------------------------------------------------------- errors
def test_transform_before_fit():
    with pytest.raises(NotFittedError, match=r"Categorify\(column='c'.*is not fitted"):
        Categorify("c").transform({"c": np.array([1])})
    with pytest.raises(NotFittedError, match="TargetEncoding"):
        TargetEncoding("c", "y").transform({"c": np.array([1])})
    with pytest.raises(NotFittedError, match="LogNormalize"):
        LogNormalize("x").transform({"x": np.array([1.0])})
    with pytest.raises(NotFittedError, match="FeaturePipeline is not fitted"):
        FeaturePipeline({"c": Categorify("c")}).transform({"c": np.array([1])})


def test_bad_columns_are_named_with_an_example():
    with pytest.raises(ValueError, match=r"column 'item' is not in the input; it has columns \['c'\]"):
        Categorify("item").fit({"c": np.array([1])})
    with pytest.raises(TypeError, match=r"column 'c' has dtype float64 \(e.g. 1.5 at row 0\).*integer or"):
        Categorify("c").fit({"c": np.array([1.5, 2.0])})
    with pytest.raises(ValueError, match=r"column 'y' has a missing or non-finite value nan at row 2"):
        TargetEncoding("c", "y").fit({"c": np.array([1, 2, 3]), "y": np.array([1.0, 0.0, np.nan])})
    with pytest.raises(ValueError, match=r"column 'x' has a missing or non-finite value None at row 1"):
        LogNormalize("x").fit({"x": pa.array([1.0, None])})
    with pytest.raises(ValueError, match=r"column 'x' has a missing or non-finite value inf at row 0"):
        LogNormalize("x").fit({"x": np.array([np.inf])})
    with pytest.raises(ValueError, match=r"column 'c' has a null at row 1"):
        CountEncoding("c").fit({"c": pa.array([1, None])})
    with pytest.raises(TypeError, match=r"column 'c' was fitted on integer values; now it holds another kind, none of"):
        Categorify("c").fit({"c": np.array([1])}).transform({"c": pa.array(["a", "01"])})
    with pytest.raises(TypeError, match=r"column 'c' was fitted on text values; now it holds another kind"):
        Categorify("c").fit({"c": pa.array(["a", "01"])}).transform({"c": np.array([1])})
    with pytest.raises(TypeError, match=r"column 'when' has Arrow type timestamp.*float seconds"):
        CyclicTime("when").transform({"when": pa.array([0], pa.timestamp("s"))})
    with pytest.raises(ValueError, match="n_folds must be >= 2"):
        TargetEncoding("c", "y", n_folds=1)


def test_load_errors(tmp_path: Path):
    (tmp_path / "junk.npz").write_bytes(b"not a zip file")
    with pytest.raises(ValueError, match="junk.npz: not a sessrec feature pipeline"):
        FeaturePipeline.load(tmp_path / "junk.npz")
    np.savez(tmp_path / "other.npz", a=np.arange(3))
    with pytest.raises(ValueError, match="other.npz: not a sessrec feature pipeline"):
        FeaturePipeline.load(tmp_path / "other.npz")
    pipe = FeaturePipeline({"c": Categorify("c")}).fit({"c": np.array([1, 2])})
    path = pipe.save(tmp_path / "ok.npz")
    with np.load(path) as npz:
        arrays = dict(npz)
    header = arrays["__pipeline__"].tobytes().decode()
    assert '"class_path": "sessrec.features.ops.Categorify"' in header
    arrays["__pipeline__"] = np.frombuffer(header.replace('ops.Categorify"', 'ops.Categorise"').encode(), np.uint8)
    np.savez(tmp_path / "unknown.npz", **arrays)
    with pytest.raises(ValueError, match=r"unknown.npz: config.init_args.ops.c: 'sessrec.features.ops.Categorise' "
                                         "is not a registered class"):
        FeaturePipeline.load(tmp_path / "unknown.npz")
    arrays["__pipeline__"] = np.frombuffer(header.encode(), np.uint8)
    del arrays["0/counts"]
    np.savez(tmp_path / "partial.npz", **arrays)
    with pytest.raises(ValueError, match=r"op 'c' lacks its fitted array 'counts'"):
        FeaturePipeline.load(tmp_path / "partial.npz")
    loaded = FeaturePipeline.load(path)  # scoring data without the fitted column
    with pytest.raises(ValueError, match=r"column 'c' is not in the input; it has columns \['item_id'\]"):
        loaded.transform({"item_id": np.array([1])})


def test_a_feature_file_of_another_version_is_refused_naming_it(tmp_path: Path):
    pipe = FeaturePipeline({"item": Categorify("item_id")}).fit(events(0, 100))
    arrays = dict(np.load(pipe.save(tmp_path / "f.npz")))
    header = json.loads(arrays["__pipeline__"].tobytes().decode())
    arrays["__pipeline__"] = np.frombuffer(json.dumps({**header, "version": 1}).encode(), np.uint8)
    np.savez(tmp_path / "v1.npz", **arrays)
    with pytest.raises(ValueError, match=r"v1.npz: a feature file 'sessrec.features' version 1; this sessrec reads "
                                         r"'sessrec.features' version 2: fit the features again with sessrec fit"):
        FeaturePipeline.load(tmp_path / "v1.npz")


def test_a_state_dict_loads_into_the_same_ops_only():
    train = events(0, 300)
    pipe = FeaturePipeline({"item": Categorify("item_id"), "n": CountEncoding("category")}).fit(train)
    state = pipe.state_dict()
    fresh = FeaturePipeline({"item": Categorify("item_id"), "n": CountEncoding("category")}).load_state_dict(state)
    np.testing.assert_array_equal(fresh.transform(train)["item"], pipe.transform(train)["item"])
    other = FeaturePipeline({"item": Categorify("item_id", min_count=3), "n": CountEncoding("category")})
    with pytest.raises(ValueError, match=r"the state dict: holds the state of the feature ops .*min_count\": 1"):
        other.load_state_dict(state)


def test_failed_save_leaves_nothing(tmp_path: Path):
    pipe = FeaturePipeline({"c": Categorify("c")})
    with pytest.raises(NotFittedError):
        pipe.save(tmp_path / "f.npz")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------- backends
@pytest.mark.parametrize("with_weights", [False, True])
def test_bincount_standard_branch_matches_numpy(with_weights):
    rng = np.random.default_rng(5)
    x = rng.integers(0, 30, 1_000)
    w = rng.integers(0, 5, 1_000).astype(float) if with_weights else None
    strict = bincount(array_api_strict.asarray(x), 40, None if w is None else array_api_strict.asarray(w))
    ref = np.bincount(x, weights=w, minlength=40)
    np.testing.assert_array_equal(to_host(strict), ref)
    assert to_host(strict).dtype == (np.float64 if with_weights else np.int64)


class FakeCudfSeries:
    """Enough of a cuDF string Series for the adapter, which goes through ``to_arrow()``."""

    __module__ = "cudf.core.series"
    dtype = "object"

    def __init__(self, values: list) -> None:
        self.values = values

    def to_arrow(self) -> pa.Array:
        return pa.array(self.values)


def test_cudf_text_columns_go_through_arrow():
    op = Categorify("c", nulls="pad").fit({"c": FakeCudfSeries(["a", "b", "a", None])})
    assert op.transform({"c": FakeCudfSeries(["b", "a", None, "q"])}).tolist() == [3, 2, 0, 1]


def run_all(backend: str) -> dict[str, np.ndarray]:
    """Every op on one frame of `backend`, outputs on the host."""
    rng = np.random.default_rng(6)
    n = 3_000
    session = np.sort(rng.integers(0, 700, n))
    frame = {
        "s": session,
        "t": 1_700_000_000 + session * 1_000.0 + np.arange(n),
        "c": rng.zipf(1.7, n) % 80,
        "d": rng.integers(0, 7, n),
        "y": rng.integers(0, 2, n).astype(float),
        "x": rng.gamma(2.0, 3.0, n),
    }
    out = FeaturePipeline(
        {
            "cat": Categorify("c", min_count=3),
            "count": CountEncoding("c"),
            "te": TargetEncoding("c", "y", fold_by="s", n_folds=5, smoothing=4.0),
            "cross": HashedCross(["c", "d"], buckets=1_000),
            "log": LogNormalize("x"),
            "st": SessionTimeFeatures("s", "t"),
            "cyc": CyclicTime("t"),
        }
    ).fit_transform(on(backend, frame))
    return {k: to_host(v) for k, v in out.items()}


def assert_same(got: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> None:
    assert list(got) == list(ref)
    for name, value in ref.items():
        if np.issubdtype(value.dtype, np.integer) or name in ("te", "st_since_prev", "st_elapsed"):
            np.testing.assert_array_equal(got[name], value, err_msg=name)  # binary target, whole times
        else:
            np.testing.assert_allclose(got[name], value, rtol=1e-12, atol=1e-12, err_msg=name)


def test_strict_array_api_matches_numpy():
    assert_same(run_all("strict"), run_all("numpy"))


@pytest.mark.gpu
def test_cupy_matches_numpy():
    pytest.importorskip("cupy")
    assert_same(run_all("cupy"), run_all("numpy"))


@pytest.mark.gpu
def test_cupy_text_and_null_columns():
    cupy = pytest.importorskip("cupy")
    frame = {"c": pa.array(["a", "b", None, "a"]), "y": cupy.asarray([1.0, 0.0, 1.0, 1.0])}
    op = TargetEncoding("c", "y", n_folds=2, smoothing=1.0, nulls="unseen")
    gpu = op.fit_transform(frame)
    assert isinstance(gpu, cupy.ndarray)  # text coded on the host, then moved to the target's device
    ref = op.fit_transform({"c": frame["c"], "y": cupy.asnumpy(frame["y"])})
    np.testing.assert_array_equal(cupy.asnumpy(gpu), ref)


def test_docs_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    text = (Path(__file__).resolve().parents[1] / "docs" / "features.md").read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "example.py").write_text(code)
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(tmp_path / "example.py"))
    assert (tmp_path / "features.npz").is_file()
