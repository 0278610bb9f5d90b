"""`TreeEnsemble` (a LightGBM model's trees in onnxruntime) against LightGBM's own `predict`, and the
`GBDTScorer` that scores with it: missing values of both kinds, near-zero inputs, one-leaf trees,
the best round, and the models it must leave to LightGBM.

Shape letters: B sessions, K candidates, F dense features, N rows.
"""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch

from sessrec.pipeline.candidate_features import RankingInputs
from sessrec.pipeline.scoring import GBDTScorer, compiled_trees, gbdt_scorer, tree_ensemble
from sessrec.pipeline.scoring.tree_ensemble import TreeEnsemble

lgb = pytest.importorskip("lightgbm")
pytest.importorskip("onnxruntime", minversion="1.21")

B, K, F = 200, 8, 4


@pytest.fixture(scope="module", autouse=True)
def without_compiled_trees():
    """The scorers here run their trees in onnxruntime, lleaves installed or not (tests/test_pipeline_compiled_trees.py)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(compiled_trees, "_lleaves", lambda: None)
        yield


def rows(seed: int) -> tuple[RankingInputs, torch.Tensor]:
    """B sessions of K candidates: feature 0 NaN in a fifth of the rows (a NaN split), the others never
    NaN (splits without missing values); the positive has the largest sum of features 1 and 2 and noise."""
    g = torch.Generator().manual_seed(seed)
    dense = torch.randn(B, K, F, generator=g)
    dense[..., 0][torch.rand(B, K, generator=g) < 0.2] = float("nan")
    dense[..., 3] = torch.randint(0, 3, (B, K), generator=g).float()  # a few values: thresholds between them
    labels = torch.zeros(B, K)
    noise = torch.randn(B, K, generator=g)
    labels[torch.arange(B), (dense[..., 1] + dense[..., 2] + noise).argmax(dim=1)] = 1
    valid = torch.ones(B, K, dtype=torch.bool)
    valid[::7, -2:] = False
    return RankingInputs(dense, {}, valid, [f"f{i}" for i in range(F)]), labels


def probes(seed: int) -> np.ndarray:
    """(N, F) float32 rows that test every way of reaching a split: NaN in every feature, zeros and values
    within 1e-35 of 0 (0 to LightGBM), each split's threshold itself, infinities, ordinary values."""
    g = np.random.default_rng(seed)
    x = g.normal(size=(400, F)).astype(np.float32)
    x[g.random(x.shape) < 0.15] = np.nan
    x[g.random(x.shape) < 0.1] = 0.0
    tiny = g.random(x.shape) < 0.05
    x[tiny] = np.float32(1e-40) * g.choice([-1, 1], size=int(tiny.sum()))
    x[:8] = [[np.inf] * F, [-np.inf] * F, [np.nan] * F, [0.0] * F, [-0.0] * F, [1e-36] * F, [-1e-36] * F, [2.0] * F]
    return x


@pytest.fixture(scope="module")
def fitted() -> GBDTScorer:
    inputs, labels = rows(1)  # its best round: 25
    scorer = GBDTScorer(num_leaves=7, max_rounds=30, early_stopping=30, min_data_in_leaf=3, threads=1)
    return scorer.fit(inputs, labels)


@pytest.mark.parametrize("share", [0.5, 1.0])
def test_the_trees_predict_what_lightgbm_predicts_up_to_the_round_asked_for(fitted, share: float) -> None:
    rounds = int(fitted.best_round * share)
    assert rounds >= 5
    trees = TreeEnsemble.of(fitted.booster, rounds)
    assert trees.num_trees == rounds
    x = probes(1)
    thresholds = [t for tree in fitted.booster.dump_model()["tree_info"] for t in _thresholds(tree["tree_structure"])]
    x[8 : 8 + len(thresholds), 1] = np.float32(thresholds[: len(x) - 8])  # at the thresholds, as rounded to float32
    expected = fitted.booster.predict(x, num_iteration=rounds)
    np.testing.assert_allclose(trees.predict(x), expected, rtol=0, atol=1e-9)
    if share < 1:  # the later rounds would change the scores
        assert np.abs(trees.predict(x) - fitted.booster.predict(x, num_iteration=fitted.best_round)).max() > 1e-6


def _thresholds(tree: dict) -> list[float]:
    if "leaf_value" in tree:
        return []
    return [tree["threshold"], *_thresholds(tree["left_child"]), *_thresholds(tree["right_child"])]


def test_both_missing_kinds_are_in_the_trees(fitted) -> None:
    kinds = set()

    def walk(tree: dict) -> None:
        if "leaf_value" not in tree:
            kinds.add(tree["missing_type"])
            walk(tree["left_child"])
            walk(tree["right_child"])

    for info in fitted.booster.dump_model(num_iteration=fitted.best_round)["tree_info"]:
        walk(info["tree_structure"])
    assert kinds == {"NaN", "None"}


def test_the_scorer_scores_with_the_trees_as_lightgbm_scores(fitted) -> None:
    assert isinstance(fitted.trees, TreeEnsemble) and fitted.trees.num_trees == fitted.best_round
    inputs, _ = rows(0)
    inputs.dense[0, :3] = float("nan")
    scores = fitted.score(inputs)
    x = inputs.dense[inputs.valid].numpy()
    expected = torch.from_numpy(fitted.booster.predict(x, num_iteration=fitted.best_round)).float()
    assert torch.equal(scores[inputs.valid], expected)
    assert torch.isneginf(scores[~inputs.valid]).all()


def test_a_loaded_scorer_rebuilds_its_trees_and_copies_drop_the_session(fitted) -> None:
    inputs, _ = rows(3)
    expected = fitted.score(inputs)
    loaded = GBDTScorer().load_state_dict(fitted.state_dict())
    assert isinstance(loaded._trees, TreeEnsemble) and loaded._trees is not fitted.trees  # built at load
    assert torch.equal(loaded.score(inputs), expected)
    for twin in (copy.deepcopy(fitted), pickle.loads(pickle.dumps(fitted))):
        assert twin._trees is False and torch.equal(twin.score(inputs), expected)


def test_trees_of_one_leaf_score_their_leaf() -> None:
    inputs, labels = rows(4)
    scorer = GBDTScorer(max_rounds=3, early_stopping=3, min_data_in_leaf=10_000, threads=1).fit(inputs, labels)
    dump = scorer.booster.dump_model(num_iteration=scorer.best_round)
    assert all("leaf_value" in info["tree_structure"] for info in dump["tree_info"])
    x = probes(5)
    np.testing.assert_allclose(scorer.trees.predict(x), scorer.booster.predict(x, num_iteration=scorer.best_round),
                               rtol=0, atol=1e-9)


def test_categorical_splits_and_zero_as_missing_are_left_to_lightgbm() -> None:
    g = np.random.default_rng(6)
    x = np.column_stack([g.integers(0, 6, 600), g.normal(size=600)]).astype(np.float64)
    y = (x[:, 0] % 2 == 0) + (x[:, 1] > 0)
    for params, kwargs in (({}, {"categorical_feature": [0]}), ({"zero_as_missing": True}, {})):
        booster = lgb.train({"objective": "regression", "verbosity": -1, "min_data_in_leaf": 5, **params},
                            lgb.Dataset(x, y, **kwargs), num_boost_round=5)
        assert not TreeEnsemble.exact(booster.dump_model()) and TreeEnsemble.of(booster, 5) is None
    plain = lgb.train({"objective": "regression", "verbosity": -1, "min_data_in_leaf": 5}, lgb.Dataset(x, y), 5)
    assert TreeEnsemble.exact(plain.dump_model())


def test_rows_of_another_width_are_refused(fitted) -> None:
    with pytest.raises(ValueError, match=r"the trees read 4 features, got rows of shape \(2, 3\)"):
        fitted.trees.predict(np.zeros((2, 3), dtype=np.float32))


def test_values_within_1e_35_of_zero_are_zero_as_to_lightgbm(fitted) -> None:
    # a split at 0 itself (LightGBM's own put 0 between -1e-35 and 1e-35): 1e-40 goes left, as 0 does
    text = fitted.booster.model_to_string(num_iteration=fitted.best_round)
    head, _, rest = text.partition("\nthreshold=")
    first, _, tail = rest.partition(" ")
    zero = "0." + "0" * (len(first) - 2)  # as long as the number it replaces: the header lists the trees' sizes
    booster = lgb.Booster(model_str=f"{head}\nthreshold={zero} {tail}")
    feature = booster.dump_model()["tree_info"][0]["tree_structure"]["split_feature"]
    x = np.zeros((5, F), dtype=np.float32)
    # LightGBM's bound is 1e-35 as a float32 (1.0000000180025095e-35), itself zero to it
    x[:, feature] = [1e-40, -1e-40, np.float32(1e-35), -np.float32(1e-35), 1e-30]
    expected = booster.predict(x)
    assert expected[0] == expected[1] == expected[2] == expected[3] != expected[4]
    assert np.array_equal(TreeEnsemble.of(booster, fitted.best_round).predict(x.astype(np.float64)), expected)
    np.testing.assert_allclose(TreeEnsemble.of(booster, fitted.best_round).predict(x), expected, rtol=0, atol=1e-9)


def test_float32_rows_zero_what_the_float64_comparison_zeros(fitted) -> None:
    """ZERO32 is ZERO (LightGBM's 1e-35f) as a float32: float32 rows found near zero before their float64 copy
    are zeroed exactly where their float64 values lie within ZERO of 0 (the next float32 up lies past it)."""
    zero32 = tree_ensemble.ZERO32
    assert float(zero32) == tree_ensemble.ZERO == 1.0000000180025095e-35 < float(np.nextafter(zero32, np.float32(1)))
    values = [zero32, -zero32, np.nextafter(zero32, np.float32(1)), 1e-40, -0.0, np.nan, 1.5, 1e-30]
    x = np.array(values * 2, dtype=np.float32).reshape(-1, F)
    rows = fitted.trees.rows(x)
    expected = x.astype(np.float64)
    expected[np.abs(expected) <= tree_ensemble.ZERO] = 0.0
    assert rows.dtype == np.float64 and np.array_equal(rows, expected, equal_nan=True)
    assert rows[0].tolist() == [0.0, 0.0, float(np.nextafter(zero32, np.float32(1))), 0.0]
    assert np.array_equal(fitted.trees.rows(x.astype(np.float64)), expected, equal_nan=True)


def test_without_onnxruntime_lightgbm_scores_alike(fitted, monkeypatch: pytest.MonkeyPatch) -> None:
    inputs, _ = rows(0)
    expected = fitted.score(inputs)
    monkeypatch.setattr(tree_ensemble, "_onnx", lambda: None)  # not installed, or older than 1.21
    alone = GBDTScorer().load_state_dict(fitted.state_dict())
    assert alone.trees is None and torch.equal(alone.score(inputs), expected)
    with pytest.raises(ImportError, match=r"TreeEnsemble needs onnx and onnxruntime >= 1\.21"):
        TreeEnsemble(fitted.booster.dump_model())


def test_rows_split_over_threads_get_the_floats_of_one_thread(fitted) -> None:
    x = np.concatenate([probes(seed) for seed in range(3)])  # 1,200 rows, split unevenly over 7
    alone = fitted.trees.predict(x)
    assert np.array_equal(fitted.trees.predict(x, threads=7), alone)
    assert np.array_equal(fitted.trees.predict(x[:3], threads=7), alone[:3])  # fewer rows than threads


def test_the_scorer_runs_its_trees_on_torchs_threads(fitted, monkeypatch: pytest.MonkeyPatch) -> None:
    inputs, _ = rows(0)
    expected = fitted.score(inputs)  # one thread: the 1,540 rows are under ROWS_PER_THREAD
    monkeypatch.setattr(gbdt_scorer, "ROWS_PER_THREAD", 500)  # 1 + 1,540 // 500 = 4 threads, at most torch's 3
    asked = []
    run = TreeEnsemble.run
    monkeypatch.setattr(TreeEnsemble, "run", lambda self, rows, threads=1: asked.append(threads) or run(self, rows, threads))
    monkeypatch.setattr(fitted.booster, "predict", lambda *a, **k: pytest.fail("LightGBM scored rows the trees reproduce"))
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        assert torch.equal(fitted.score(inputs), expected) and asked == [3]
    finally:
        torch.set_num_threads(before)
