"""`CompiledTrees` (a LightGBM model's trees compiled by lleaves) against LightGBM's own `predict`, bit for bit:
missing values of both kinds with default sides both ways, thresholds, near-zeros, infinities, the order of the
sum; its cache (keyed, checked, rewritten when damaged); and the `GBDTScorer` that scores with it. Skipped where
lleaves is not installed (``pip install 'sessrec[fast-trees]'``).

Shape letters: N rows, F features.
"""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch

from sessrec.pipeline.candidate_features import RankingInputs
from sessrec.pipeline.scoring import GBDTScorer, compiled_trees, gbdt_scorer, tree_ensemble
from sessrec.pipeline.scoring.compiled_trees import CompiledTrees, probe_rows

lgb = pytest.importorskip("lightgbm")
lleaves = pytest.importorskip("lleaves")
if compiled_trees._lleaves() is None:
    pytest.skip("lleaves 1.3 compiles with llvmlite < 0.45 only", allow_module_level=True)

F = 5


def data(seed: int, n: int = 4000) -> tuple[np.ndarray, np.ndarray]:
    """(N, F) rows and their relevance: feature 0 NaN in a fifth of the rows, where relevance is high (NaN
    splits send NaN left or right by their gain), feature 1 NaN where it is low, the others never NaN (splits
    of missing type None); feature 4 takes a few values and values within 1e-35 of 0."""
    g = np.random.default_rng(seed)
    x = g.normal(size=(n, F))
    y = (x[:, 0] + x[:, 1] - x[:, 2] + 0.5 * g.normal(size=n) > 0).astype(int)
    x[(g.random(n) < 0.2) & (y == 1), 0] = np.nan
    x[(g.random(n) < 0.2) & (y == 0), 1] = np.nan
    x[:, 4] = g.choice([-2.0, -1e-36, 0.0, 1e-36, 3.0], size=n)
    return x, y


def booster(seed: int, rounds: int, leaves: int = 15) -> lgb.Booster:
    x, y = data(seed)
    params = {"objective": "lambdarank", "num_leaves": leaves, "min_data_in_leaf": 5, "learning_rate": 0.1,
              "verbosity": -1, "num_threads": 1, "seed": seed, "deterministic": True}
    return lgb.train(params, lgb.Dataset(x, y, group=np.full(len(x) // 20, 20)), num_boost_round=rounds)


def adversarial(model: lgb.Booster, seed: int) -> np.ndarray:
    """(N, F) rows of `data` with, in every feature, NaN, infinities, zeros, values within LightGBM's 1e-35f of 0
    and just past it, and every split's threshold and its neighbours."""
    g = np.random.default_rng(seed)
    x, _ = data(seed, 2000)
    zero = tree_ensemble.ZERO
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-36, -1e-40, zero, -zero,
                         np.nextafter(zero, 1.0), -np.nextafter(zero, 1.0)])
    mask = g.random(x.shape) < 0.2
    x[mask] = g.choice(specials, size=int(mask.sum()))
    rows = [x]
    for info in model.dump_model()["tree_info"]:
        stack = [info["tree_structure"]]
        while stack:
            node = stack.pop()
            if "leaf_value" in node:
                continue
            stack += [node["left_child"], node["right_child"]]
            t = float(node["threshold"])
            for value in (t, np.nextafter(t, -np.inf), np.nextafter(t, np.inf), np.float32(t)):
                row = data(seed + 1, 1)[0][0]
                row[int(node["split_feature"])] = value
                rows.append(row[None])
    return np.vstack(rows)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> object:
    return tmp_path_factory.mktemp("trees")


@pytest.fixture(scope="module")
def model() -> lgb.Booster:
    return booster(0, 60)


def test_the_models_hold_every_kind_of_split_the_backend_is_checked_on(model) -> None:
    kinds = set()
    for info in model.dump_model()["tree_info"]:
        stack = [info["tree_structure"]]
        while stack:
            node = stack.pop()
            if "leaf_value" not in node:
                # a NaN split sends NaN its default side; a None split's NaN is 0, left where 0 <= threshold
                side = node["default_left"] if node["missing_type"] == "NaN" else node["threshold"] >= 0
                kinds.add((node["missing_type"], side))
                stack += [node["left_child"], node["right_child"]]
    assert kinds == {("NaN", True), ("NaN", False), ("None", True), ("None", False)}


@pytest.mark.parametrize("rounds", [1, 23, 60])
def test_the_compiled_trees_predict_lightgbms_floats_bit_for_bit(model, cache, rounds: int) -> None:
    trees = CompiledTrees.of(model, rounds, cache)
    assert isinstance(trees, CompiledTrees) and trees.num_trees == rounds
    for x in (data(7)[0], adversarial(model, 8)):
        expected = model.predict(x, num_iteration=rounds)
        assert np.array_equal(trees.predict(x), expected)
        assert np.array_equal(trees.predict(x.astype(np.float32)), model.predict(x.astype(np.float32), num_iteration=rounds))


def test_the_sum_runs_in_tree_order_as_lightgbms(model, cache) -> None:
    """lleaves' default blocks of 34 trees sum the 60 trees in another order: other floats on these rows, which
    the check of `of` refuses (LightGBM's predictions are then used)."""
    x = adversarial(model, 8)
    expected = model.predict(x)
    (cache / "model.txt").write_text(model.model_to_string())
    blocked = lleaves.Model(model_file=str(cache / "model.txt"))
    blocked.compile(fblocksize=34, finline=False)
    trees = CompiledTrees.of(model, 60, cache)
    assert not np.array_equal(blocked.predict(trees.rows(x), n_jobs=1), expected)
    assert np.array_equal(trees.predict(x), expected)


def test_a_forest_summed_in_another_order_is_refused(model, tmp_path, monkeypatch) -> None:
    compile = lleaves.Model.compile
    monkeypatch.setattr(lleaves.Model, "compile", lambda self, cache=None, **kw: compile(self, cache, **{**kw, "fblocksize": 34}))
    assert CompiledTrees.of(model, 60, tmp_path) is None


def test_probe_rows_reach_every_split_at_its_threshold_above_it_and_with_nan(model) -> None:
    dump = model.dump_model(num_iteration=5)
    rows = probe_rows(dump)
    splits = sum(1 for info in dump["tree_info"] for _ in _splits(info["tree_structure"]))
    assert rows.shape == (3 * splits + 256, F)
    first = dump["tree_info"][0]["tree_structure"]
    t = float(first["threshold"])
    assert rows[0, first["split_feature"]] == t and rows[1, first["split_feature"]] == np.nextafter(t, np.inf)
    assert np.isnan(rows[2, first["split_feature"]])


def _splits(node: dict) -> list[dict]:
    return [] if "leaf_value" in node else [node, *_splits(node["left_child"]), *_splits(node["right_child"])]


def test_a_cached_forest_loads_without_compiling_and_another_cpu_compiles_its_own(model, tmp_path, monkeypatch) -> None:
    x = adversarial(model, 3)
    expected = model.predict(x, num_iteration=20)
    assert np.array_equal(CompiledTrees.of(model, 20, tmp_path).predict(x), expected)
    entries = sorted(tmp_path.iterdir())
    assert [e.suffix for e in entries] == [".trees"]  # no temporary file left
    monkeypatch.setattr(lleaves.compiler, "compile_to_module", lambda *a, **k: pytest.fail("compiled a cached forest"))
    assert np.array_equal(CompiledTrees.of(model, 20, tmp_path).predict(x), expected)
    monkeypatch.undo()
    binding = compiled_trees._lleaves()[1]
    monkeypatch.setattr(binding, "get_host_cpu_name", lambda: "another-cpu")
    assert np.array_equal(CompiledTrees.of(model, 20, tmp_path).predict(x), expected)
    assert len(list(tmp_path.iterdir())) == 2


def test_a_damaged_or_foreign_cache_entry_is_compiled_again(model, tmp_path) -> None:
    x = adversarial(model, 4)
    expected = model.predict(x, num_iteration=10)
    CompiledTrees.of(model, 10, tmp_path)
    (entry,) = tmp_path.iterdir()
    data = bytearray(entry.read_bytes())
    data[len(data) // 2] ^= 0xFF  # a flipped byte: its sha256 no longer matches
    entry.write_bytes(bytes(data))
    assert np.array_equal(CompiledTrees.of(model, 10, tmp_path).predict(x), expected)
    assert entry.read_bytes() != bytes(data)  # rewritten
    other = tmp_path / "other"
    CompiledTrees.of(booster(1, 10), 10, other)  # another model's sound entry under this model's key
    (foreign,) = other.iterdir()
    entry.write_bytes(foreign.read_bytes())
    assert np.array_equal(CompiledTrees.of(model, 10, tmp_path).predict(x), expected)
    assert entry.read_bytes() != foreign.read_bytes()


def test_an_unwritable_cache_still_gives_the_trees(model, tmp_path) -> None:
    (tmp_path / "file").write_text("")
    trees = CompiledTrees.of(model, 5, tmp_path / "file" / "trees")
    x = adversarial(model, 5)
    assert np.array_equal(trees.predict(x), model.predict(x, num_iteration=5))


def test_lightgbm_or_onnxruntime_score_where_lleaves_cannot(model, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(lleaves.Model, "compile", lambda self, *a, **k: (_ for _ in ()).throw(AttributeError("PassManagerBuilder")))
    assert CompiledTrees.of(model, 5, tmp_path) is None
    monkeypatch.undo()
    monkeypatch.setattr(compiled_trees, "_lleaves", lambda: None)
    assert CompiledTrees.of(model, 5, tmp_path) is None
    monkeypatch.undo()
    binding = compiled_trees._lleaves()[1]
    monkeypatch.delattr(binding, "PassManagerBuilder")  # llvmlite >= 0.45
    assert compiled_trees._lleaves() is None


def test_rows_split_over_threads_get_the_floats_of_one_thread(model, cache) -> None:
    trees = CompiledTrees.of(model, 60, cache)
    rows = trees.rows(adversarial(model, 6))
    alone = trees.run(rows)
    assert np.array_equal(trees.run(rows, 7), alone) and np.array_equal(trees.run(rows[:3], 7), alone[:3])


def test_the_scorer_scores_with_the_compiled_trees_as_with_lightgbm(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SESSREC_CACHE_DIR", str(tmp_path))
    assert compiled_trees.cache_dir() == tmp_path / "trees"
    g = torch.Generator().manual_seed(0)
    dense = torch.randn(300, 8, F, generator=g)
    dense[..., 0][torch.rand(300, 8, generator=g) < 0.2] = float("nan")
    labels = torch.zeros(300, 8)
    labels[torch.arange(300), (dense[..., 1] + dense[..., 2]).argmax(dim=1)] = 1
    inputs = RankingInputs(dense, {}, torch.ones(300, 8, dtype=torch.bool), [f"f{i}" for i in range(F)])
    scorer = GBDTScorer(num_leaves=7, max_rounds=20, early_stopping=20, min_data_in_leaf=3, threads=1).fit(inputs, labels)
    assert isinstance(scorer.trees, CompiledTrees)
    x = dense.reshape(-1, F).numpy()
    expected = torch.from_numpy(scorer.booster.predict(x, num_iteration=scorer.best_round)).float().reshape(300, 8)
    assert torch.equal(scorer.score(inputs), expected)
    others = [GBDTScorer().load_state_dict(scorer.state_dict()), copy.deepcopy(scorer), pickle.loads(pickle.dumps(scorer))]
    assert all(isinstance(other.trees, CompiledTrees) for other in others)
    asked = []
    run = CompiledTrees.run
    monkeypatch.setattr(CompiledTrees, "run", lambda self, rows, threads=1: asked.append(threads) or run(self, rows, threads))
    monkeypatch.setattr(scorer.booster, "predict", lambda *a, **k: pytest.fail("LightGBM scored rows the trees reproduce"))
    monkeypatch.setattr(gbdt_scorer, "ROWS_PER_THREAD", 500)  # 1 + 2,400 // 500 = 5 threads, at most torch's 3
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        assert all(torch.equal(other.score(inputs), expected) for other in [scorer, *others]) and asked == [3] * 4
    finally:
        torch.set_num_threads(before)


def test_one_leaf_trees_compile_and_categorical_or_zero_as_missing_splits_do_not(tmp_path) -> None:
    g = np.random.default_rng(9)
    x = np.column_stack([g.integers(0, 6, 600), g.normal(size=600)]).astype(np.float64)
    y = ((x[:, 0] % 2 == 0) + (x[:, 1] > 0)).astype(int)
    group = np.full(30, 20)
    stumps = lgb.train({"objective": "lambdarank", "min_data_in_leaf": 10_000, "verbosity": -1}, lgb.Dataset(x, y, group=group), 3)
    assert all("leaf_value" in info["tree_structure"] for info in stumps.dump_model()["tree_info"])
    assert np.array_equal(CompiledTrees.of(stumps, 3, tmp_path).predict(x), stumps.predict(x))
    for params, kwargs in (({}, {"categorical_feature": [0]}), ({"zero_as_missing": True}, {})):
        model = lgb.train({"objective": "lambdarank", "verbosity": -1, "min_data_in_leaf": 5, **params},
                          lgb.Dataset(x, y, group=group, **kwargs), num_boost_round=5)
        assert CompiledTrees.of(model, 5, tmp_path) is None
