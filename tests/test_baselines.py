"""Non-neural baselines: vectorized scores against brute-force references, hand cases, no leakage, CLI.

The references below loop over sessions in plain Python and follow the definitions in the
docstrings of `sessrec.baselines` (positions from 1 = oldest, latest occurrence wins, OOV keeps
its place but is not an item, time = row order, ties among neighbours go to the more recent).
"""

import math
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from sessrec.baselines import STAN, VSKNN, Popularity, SessionBaseline
from sessrec.cli import cli as main
from sessrec.data import SessionBatch, SyntheticSource, frame
from sessrec.tasks import BaselineTask, Evaluation, SessionDataModule

torch.set_num_threads(1)

V, L = 12, 6  # ids 2..11 are items; 0 padding, 1 OOV
TRAIN = [  # in time order
    [2, 3, 4],
    [3, 5, 3, 6],
    [7, 8],
    [2, 1, 5, 9],
    [4, 3, 2, 10, 11],
    [5, 6, 7],
    [9, 2, 3],
    [11, 10, 4, 4, 3, 6],
]
PREFIXES = [
    [2, 3],
    [5],
    [3, 1, 4, 3],
    [10, 6, 9, 2, 7],
    [8],
    [1],  # only OOV: no neighbours
    [11, 4, 4],
]


def pad(rows: list[list[int]], width: int = L) -> torch.Tensor:
    return torch.tensor([[0] * (width - len(r)) + r for r in rows])


def positions(seq: list[int]) -> dict[int, int]:
    """item -> 1-based position of its latest occurrence (known items only)."""
    return {item: p for p, item in enumerate(seq, start=1) if item >= 2}


# -- brute-force references -----------------------------------------------------------------------
def popularity_reference(per_session: bool) -> list[float]:
    counts = [0.0] * V
    for seq in TRAIN:
        for item in set(seq) if per_session else seq:
            if item >= 2:
                counts[item] += 1
    return counts


def weight_reference(kind: str, p: int, n: int) -> float:
    if kind == "same":
        return 1.0
    if kind == "div":
        return p / n
    if kind == "linear":
        return max(1.0 - 0.1 * (n - p), 0.0)
    if kind == "quadratic":
        return (p / n) ** 2
    return 1.0 / math.log10(n - p + 1.7)


def decay_reference(kind: str, d: int) -> float:
    if kind == "same":
        return 1.0
    if kind == "div":
        return 1.0 / d
    if kind == "linear":
        return max(1.0 - 0.1 * d, 0.0)
    if kind == "quadratic":
        return 1.0 / d**2
    return 1.0 / math.log10(d + 1.7)


def candidates(prefix: list[int], sample_size: int) -> list[int]:
    items = set(positions(prefix))
    found = [j for j, seq in enumerate(TRAIN) if items & set(positions(seq))]
    return found[-sample_size:] if sample_size else found


def neighbours(sims: dict[int, float], k: int) -> list[int]:
    return sorted((j for j in sims if sims[j] > 0), key=lambda j: (-sims[j], -j))[:k]


def vsknn_reference(
    prefix, k, sample_size, weighting, weighting_score, similarity, idf_weighting
) -> list[float]:
    pos_s, n = positions(prefix), len(prefix)
    w = {i: weight_reference(weighting, p, n) for i, p in pos_s.items()}
    sims = {}
    for j in candidates(prefix, sample_size):
        pos_n = positions(TRAIN[j])
        overlap = sum(w[i] for i in sorted(set(pos_n) & set(pos_s), key=pos_s.get))
        if similarity == "dot":
            sims[j] = overlap / len(pos_s)
        else:
            sims[j] = overlap / (math.sqrt(sum(v * v for v in w.values())) * math.sqrt(len(pos_n)))
    scores = [0.0] * V
    for j in neighbours(sims, k):
        pos_n = positions(TRAIN[j])
        step = n - max(pos_s[i] for i in set(pos_n) & set(pos_s)) + 1
        for i in pos_n:
            df = sum(i in seq for seq in TRAIN)
            scores[i] += (
                sims[j]
                * decay_reference(weighting_score, step)
                * (1 + idf_weighting * math.log(len(TRAIN) / df))
            )
    return scores


def stan_reference(prefix, k, sample_size, lambda_1, lambda_2, lambda_3) -> list[float]:
    pos_s, n = positions(prefix), len(prefix)
    w = {i: math.exp((p - n) / lambda_1) if lambda_1 else 1.0 for i, p in pos_s.items()}
    norm = math.sqrt(sum(v * v for v in w.values()))
    sims = {}
    for j in candidates(prefix, sample_size):
        pos_n = positions(TRAIN[j])
        overlap = sum(w[i] for i in sorted(set(pos_n) & set(pos_s), key=pos_s.get))
        sims[j] = overlap / (norm * math.sqrt(len(pos_n)))
        if lambda_2:
            sims[j] *= math.exp(-(len(TRAIN) - 1 - j) / lambda_2)
    scores = [0.0] * V
    for j in neighbours(sims, k):
        pos_n = positions(TRAIN[j])
        anchor = max(pos_n[i] for i in set(pos_n) & set(pos_s))
        for i, q in pos_n.items():
            scores[i] += sims[j] * (math.exp(-abs(q - anchor) / lambda_3) if lambda_3 else 1.0)
    return scores


def assert_matches(scores: torch.Tensor, expected: list[list[float]]) -> None:
    assert scores.shape == (len(expected), V) and scores.dtype == torch.float32
    assert torch.isneginf(scores[:, :2]).all()  # padding and OOV are never recommended
    np.testing.assert_allclose(
        scores[:, 2:].double().numpy(), np.array(expected)[:, 2:], rtol=1e-6, atol=1e-6
    )


# -- values ------------------------------------------------------------------------------------
@pytest.mark.parametrize("per_session", [False, True])
def test_popularity_matches_reference(per_session):
    pop = Popularity(per_session=per_session).fit(pad(TRAIN), num_items=V)
    assert_matches(pop(pad(PREFIXES)), [popularity_reference(per_session)] * len(PREFIXES))


VSKNN_CASES = [
    dict(k=100, sample_size=0, weighting="div", weighting_score="div", similarity="dot", idf_weighting=0.0),
    dict(
        k=2,
        sample_size=3,
        weighting="quadratic",
        weighting_score="quadratic",
        similarity="dot",
        idf_weighting=5.0,
    ),
    dict(
        k=3,
        sample_size=0,
        weighting="linear",
        weighting_score="linear",
        similarity="cosine",
        idf_weighting=0.0,
    ),
    dict(k=4, sample_size=5, weighting="log", weighting_score="log", similarity="cosine", idf_weighting=1.0),
    dict(k=1, sample_size=2, weighting="same", weighting_score="same", similarity="dot", idf_weighting=0.0),
]


@pytest.mark.parametrize("params", VSKNN_CASES, ids=lambda p: f"{p['weighting']}-{p['similarity']}-k{p['k']}")
def test_vsknn_matches_reference(params):
    knn = VSKNN(**params).fit(pad(TRAIN), num_items=V)
    assert_matches(knn(pad(PREFIXES)), [vsknn_reference(p, **params) for p in PREFIXES])


STAN_CASES = [
    dict(k=100, sample_size=0, lambda_1=None, lambda_2=None, lambda_3=None),
    dict(k=100, sample_size=0, lambda_1=1.02, lambda_2=None, lambda_3=2.05),
    dict(k=2, sample_size=4, lambda_1=0.5, lambda_2=3.0, lambda_3=1.0),
    dict(k=3, sample_size=0, lambda_1=1e-5, lambda_2=10.0, lambda_3=4.9),
]


@pytest.mark.parametrize(
    "params", STAN_CASES, ids=lambda p: f"k{p['k']}-l1_{p['lambda_1']}-l2_{p['lambda_2']}"
)
def test_stan_matches_reference(params):
    stan = STAN(**params).fit(pad(TRAIN), num_items=V)
    assert_matches(stan(pad(PREFIXES)), [stan_reference(p, **params) for p in PREFIXES])


def test_vsknn_hand_computed():
    train = pad([[2, 3, 4], [3, 5], [6, 7], [5, 2]], width=4)
    prefix = pad([[2, 5, 3]], width=4)
    # weights p/3: item 2 -> 1/3, item 5 -> 2/3, item 3 -> 1; similarity = overlap / 3 distinct items
    # [2, 3, 4]: (1/3 + 1) / 3 = 4/9, shares the last item (step 1, decay 1)
    # [3, 5]:    (1 + 2/3) / 3 = 5/9, step 1
    # [5, 2]:    (2/3 + 1/3) / 3 = 1/3, most recent shared item 5 is 2nd from the end: decay 1/2
    scores = VSKNN(k=10, sample_size=0).fit(train, num_items=8)(prefix)[0]
    expected = {2: 4 / 9 + 1 / 6, 3: 4 / 9 + 5 / 9, 4: 4 / 9, 5: 5 / 9 + 1 / 6, 6: 0.0, 7: 0.0}
    assert scores[2:].tolist() == pytest.approx([expected[i] for i in range(2, 8)], abs=1e-6)
    # k = 2 keeps the two most similar sessions: [5, 2] (1/3) drops out
    top2 = VSKNN(k=2, sample_size=0).fit(train, num_items=8)(prefix)[0]
    assert top2[2:].tolist() == pytest.approx([4 / 9, 1.0, 4 / 9, 5 / 9, 0.0, 0.0], abs=1e-6)


@pytest.mark.parametrize("baseline", [Popularity(), VSKNN(), STAN()], ids=lambda b: type(b).__name__)
def test_special_ids_are_minus_inf_and_everything_else_finite(baseline):
    scores = baseline.fit(pad(TRAIN), num_items=V)(pad(PREFIXES))
    assert torch.isneginf(scores[:, :2]).all()
    assert torch.isfinite(scores[:, 2:]).all()


def test_time_order_comes_from_timestamps():
    rng = np.random.default_rng(0)
    shuffled = rng.permutation(len(TRAIN))
    times = shuffled.astype(float)  # row r of the shuffled matrix is original session shuffled[r]
    for make in (lambda: VSKNN(k=2, sample_size=3), lambda: STAN(k=2, sample_size=3, lambda_2=3.0)):
        ordered = make().fit(pad(TRAIN), num_items=V)(pad(PREFIXES))
        from_times = make().fit(pad(TRAIN)[shuffled], num_items=V, times=times)(pad(PREFIXES))
        torch.testing.assert_close(from_times, ordered)


def test_bad_inputs_are_refused():
    with pytest.raises(RuntimeError, match="not fitted"):
        VSKNN()(pad(PREFIXES))
    with pytest.raises(ValueError, match="right-aligned"):
        VSKNN().fit(torch.tensor([[2, 0, 3]]), num_items=V)
    with pytest.raises(ValueError, match=r"outside \[0, 12\)"):
        VSKNN().fit(pad(TRAIN), num_items=V)(torch.tensor([[0, 12]]))
    with pytest.raises(ValueError, match="max_length"):
        STAN().fit(torch.full((2, 64), 2), num_items=V)
    with pytest.raises(ValueError, match="lambda_3"):
        STAN(lambda_3=0.0)
    with pytest.raises(ValueError, match="weighting"):
        VSKNN(weighting="exp")


# -- no leakage ----------------------------------------------------------------------------------
class Spy(SessionBaseline):
    """Wraps a baseline and records every tensor it is asked to score."""

    def __init__(self, inner: SessionBaseline) -> None:
        self.inner, self.seen = inner, []

    def _fit(self, sessions):
        self.inner.fit(sessions, self.num_items)
        self.fitted_on = sessions

    def _score(self, prefixes):
        self.seen.append(prefixes.copy())
        return self.inner._score(prefixes)


def test_item_sums_add_like_the_sparse_product_they_replace():
    """`item_sums` (what the kNN baselines spread their neighbours' weights with) gives, bit for bit,
    the float64 sums of scipy's COO -> dense conversion, duplicates added in the order given, the
    per-column factor applied after the sum (as ``(sums).multiply(factor)``), at the positive sums."""
    import scipy.sparse as sp

    from sessrec.baselines.knn import item_sums

    rng = np.random.default_rng(0)
    row, col = np.sort(rng.integers(0, 5, 400)), rng.integers(0, 30, 400)  # many duplicates
    row[row == 3] = 4  # a row without entries
    values, factor = rng.random(400) * 1e3, 1 + rng.random(30)
    summed = sp.coo_matrix((values, (row, col)), shape=(5, 30)).tocsr()
    for dense, got in ((summed.multiply(factor[None, :]).toarray(), item_sums(row, col, values, 30, factor)),
                       (summed.toarray(), item_sums(row, col, values, 30))):
        keys, sums = got
        assert keys.tolist() == np.flatnonzero(summed.toarray()).tolist() and sums.dtype == np.float32
        assert np.array_equal(sums, dense.ravel()[keys].astype(np.float32))
    assert [len(a) for a in item_sums(row[:0], col[:0], values[:0], 30)] == [0, 0]



def test_positive_sums_add_each_rows_terms_in_order_from_zero():
    """`positive_sums` (what the kNN baselines spread their neighbours' weights with) gives, bit for bit,
    each (row, col)'s terms added one by one from 0 in the order of `left`'s entries, times the per-column
    factor after the sum, as float32, at the positive sums only (keys ascending)."""
    import scipy.sparse as sp

    from sessrec.baselines.knn import by_rows, positive_sums

    rng = np.random.default_rng(0)
    row = np.sort(rng.integers(0, 5, 60))
    row[row == 3] = 4  # a row without entries
    mid = rng.integers(0, 40, 60)
    left_values = rng.random(60) * 1e3
    left_values[:3] = 0.0  # terms of 0: sums of 0 are left out
    right = sp.csr_matrix((rng.random(200) * 1e-3, (rng.integers(0, 40, 200), rng.integers(0, 30, 200))), shape=(40, 30))
    right.sum_duplicates()
    factor = 1 + rng.random(30)
    expected = np.zeros((5, 30))
    for r, m, v in zip(row, mid, left_values):  # the terms one by one, in order
        lo, hi = right.indptr[m], right.indptr[m + 1]
        for c, w in zip(right.indices[lo:hi], right.data[lo:hi]):
            expected[r, c] += v * w
    left = by_rows(row, mid, left_values, (5, 40))
    for scale, got in ((factor, positive_sums(left, right, factor)), (np.ones(30), positive_sums(left, right))):
        dense = (expected * scale[None, :]).astype(np.float32)
        keys, sums = got
        assert keys.tolist() == np.flatnonzero(dense > 0).tolist() and sums.dtype == np.float32
        assert sums.tobytes() == dense.ravel()[keys].tobytes()
    assert [len(a) for a in positive_sums(by_rows(row[:0], mid[:0], left_values[:0], (5, 40)), right)] == [0, 0]


def test_top_k_keeps_each_rows_k_highest_positive_scores_ties_to_the_latest():
    """`top_k` (the neighbours of each prefix) against a sort by (row, score descending, col descending), on
    rows shorter and longer than k, with many ties, zeros and negative scores."""
    from sessrec.baselines.knn import top_k

    rng = np.random.default_rng(3)
    for _ in range(200):
        counts = rng.integers(0, 30, rng.integers(1, 8))
        row = np.repeat(np.arange(len(counts)), counts)
        col = np.concatenate([np.sort(rng.choice(500, c, replace=False)) for c in counts]).astype(np.int64)
        score = rng.integers(-2, 5, len(row)) * 0.25
        k = int(rng.integers(1, 10))
        ranked = sorted((r, -s, -c, i) for i, (r, s, c) in enumerate(zip(row, score, col)) if s > 0)
        expected = [i for j, (r, *_, i) in enumerate(ranked) if sum(1 for x in ranked[:j] if x[0] == r) < k]
        assert top_k(row, col, score, k).tolist() == sorted(expected)
    assert top_k(row[:0], col[:0], score[:0], 3).tolist() == []

def test_positive_scores_are_the_positive_entries_of_the_dense_scores():
    for knn in (VSKNN(k=3, sample_size=4, idf_weighting=1.0), STAN(k=2, sample_size=3, lambda_2=3.0), Popularity()):
        knn.fit(pad(TRAIN), num_items=V)
        dense = knn(pad(PREFIXES)).numpy()
        keys, values = knn.positive_scores(pad(PREFIXES))
        assert keys.tolist() == np.flatnonzero(dense > 0).tolist() and len(keys) > len(PREFIXES)
        assert np.array_equal(values, dense.ravel()[keys])


@pytest.mark.parametrize(
    "params", STAN_CASES, ids=lambda p: f"k{p['k']}-l1_{p['lambda_1']}-l2_{p['lambda_2']}"
)
def test_stan_matches_reference_on_prefixes_narrower_than_the_training_sessions(params):
    """A batch of prefixes as wide as its longest (5 columns, training sessions of 6) is scored as the
    reference scores it: a neighbour's shared item past the batch's width still anchors lambda_3's distances."""
    stan = STAN(**params).fit(pad(TRAIN), num_items=V)
    assert_matches(stan(pad(PREFIXES, width=5)), [stan_reference(p, **params) for p in PREFIXES])
    torch.testing.assert_close(stan(pad(PREFIXES[:2], width=2)), stan(pad(PREFIXES[:2])))


def test_a_batch_that_reaches_no_neighbour_scores_zero_with_idf_weighting():
    """Prefixes of items no training session holds (a request of new items, only OOV) have no neighbour:
    every item scores 0, with the idf factor as without it."""
    for knn in (VSKNN(idf_weighting=5.0), VSKNN(idf_weighting=0.0)):
        scores = knn.fit(pad(TRAIN), num_items=V)(pad([[1], [1, 1]]))
        assert scores[:, 2:].eq(0).all() and torch.isneginf(scores[:, :2]).all()
        keys, values = knn.positive_scores(pad([[1]]))
        assert len(keys) == 0 and values.dtype == np.float32


def test_rows_are_scored_independently():
    knn = STAN(k=2, sample_size=3, lambda_2=3.0).fit(pad(TRAIN), num_items=V)
    batch = knn(pad(PREFIXES))
    for r, prefix in enumerate(PREFIXES):
        torch.testing.assert_close(knn(pad([prefix])), batch[r : r + 1])


def test_task_never_shows_the_target_and_fits_on_train_only():
    dm = SessionDataModule(
        source=SyntheticSource(num_sessions=600, num_items=60), eval_protocol="all_prefixes"
    )
    spy = Spy(VSKNN(k=20, sample_size=100))
    task = BaselineTask(baseline=spy, num_items=dm.num_items)
    train, _ = dm.tensors("train")
    spy.fit(train, dm.num_items)
    assert np.array_equal(spy.fitted_on, train.numpy())  # the index holds the training split only
    items, targets = dm.tensors("test")
    a = task(SessionBatch(items=items, targets=targets))
    b = task(SessionBatch(items=items, targets=(targets + 1) % dm.num_items))
    torch.testing.assert_close(a, b)  # the target does not move any score
    assert all(np.array_equal(seen, items.numpy()) for seen in spy.seen)  # exactly the prefixes, no more


@pytest.mark.parametrize("rows", [{"train_prefixes": True}, {"augment_reversed": True}])
def test_a_baseline_is_fitted_on_the_whole_training_sessions_whatever_rows_the_models_train_on(rows):
    """Training prefixes and reversed copies are rows for a network to learn from; a kNN index or a
    popularity count holds each training session once, in time order, so the test metrics are those
    of the data module without them."""
    import pytorch_lightning as pl

    source = SyntheticSource(num_sessions=300, num_items=40)
    fitted, metrics = {}, {}
    for name, settings in (("plain", {}), ("augmented", rows)):
        dm = SessionDataModule(source=source, **settings)
        spy = Spy(VSKNN(k=20, sample_size=100))
        task = BaselineTask(baseline=spy, num_items=dm.num_items)
        trainer = pl.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
        metrics[name] = trainer.test(task, datamodule=dm, verbose=False)[0]
        fitted[name] = spy.fitted_on
    order = np.argsort(frame.end_times(dm.splits.train), kind="stable")
    assert np.array_equal(fitted["augmented"], dm.sessions("train").numpy()[order])
    assert np.array_equal(fitted["augmented"], fitted["plain"])
    assert metrics["augmented"] == metrics["plain"]


# -- through the CLI -----------------------------------------------------------------------------
def recipe(tmp_path: Path, baseline: str, init_args: str = "{}") -> str:
    path = tmp_path / f"{baseline.rsplit('.', 1)[-1]}.yaml"
    path.write_text(
        f"""trainer: {{logger: false, enable_progress_bar: false, enable_model_summary: false}}
model:
  class_path: sessrec.tasks.BaselineTask
  init_args:
    baseline: {{class_path: {baseline}, init_args: {init_args}}}
data:
  source: {{class_path: sessrec.data.SyntheticSource, init_args: {{num_sessions: 3000, num_items: 200}}}}
"""
    )
    return str(path)


@pytest.fixture
def in_tmp(tmp_path):
    cwd = os.getcwd()
    os.chdir(tmp_path)
    yield tmp_path
    os.chdir(cwd)


@pytest.mark.slow
def test_cli_test_and_validate_report_metrics(in_tmp, capsys):
    vsknn = recipe(in_tmp, "sessrec.baselines.VSKNN", "{k: 50, sample_size: 500}")
    knn = main(["test", "--config", vsknn]).trainer.callback_metrics
    pop = main(["test", "--config", recipe(in_tmp, "sessrec.baselines.Popularity")]).trainer.callback_metrics
    assert "[test] epoch 0 step 0: recall@10=" in capsys.readouterr().out
    # learnable synthetic transitions: neighbours beat popularity by far
    assert knn["test/recall@20"] > pop["test/recall@20"] + 0.2 > 0.2
    assert 0 < knn["test/mrr@20"] <= knn["test/recall@20"]
    val = main(["validate", "--config", vsknn, "--model.baseline.k", "20"])
    assert val.model.baseline.k == 20 and "val/recall@20" in val.trainer.callback_metrics
    with pytest.raises(ValueError, match="no weights to train"):
        main(["fit", "--config", vsknn])


def test_cli_predict_writes_raw_topk(in_tmp):
    raw = SessionDataModule(
        source=SyntheticSource(num_sessions=3000, num_items=200)
    ).vocab.raw_ids.to_pylist()
    src, out = in_tmp / "sessions.parquet", in_tmp / "recs.parquet"
    pq.write_table(pa.table({"session_id": ["a", "b"], "item_id": [raw[:3], raw[5:6]]}), src)
    stan = recipe(in_tmp, "sessrec.baselines.STAN", "{k: 50, sample_size: 500}")
    main(["predict", "--config", stan, "--data.predict_path", str(src), "--scoring.output", str(out)])
    recs = pq.read_table(out)
    assert recs.column("session_id").to_pylist() == ["a", "b"]
    for items, scores in zip(recs.column("item_ids").to_pylist(), recs.column("scores").to_pylist()):
        assert len(set(items)) == 20 and set(items) <= set(raw)
        assert scores == sorted(scores, reverse=True)


def test_baseline_task_can_exclude_the_sessions_own_items():
    pop = Popularity()
    pop.fit(torch.tensor([[0, 2, 2, 3], [2, 3, 4, 5]]), num_items=7)  # counts: 2 > 3 > 4 = 5 > 6
    batch = SessionBatch(items=torch.tensor([[0, 0, 2, 4]], dtype=torch.int32))
    plain = BaselineTask(baseline=pop, num_items=7)(batch)
    seen = BaselineTask(baseline=pop, num_items=7, evaluation=Evaluation(exclude_seen=True))(batch)
    assert plain[0].topk(2).indices.tolist() == [2, 3]
    assert seen[0].topk(2).indices.tolist() == [3, 5]
    assert torch.isinf(seen[0, [0, 2, 4]]).all() and torch.equal(seen[0, [3, 5, 6]], plain[0, [3, 5, 6]])


def test_baseline_task_never_recommends_virtual_items():
    pop = Popularity()
    pop.fit(torch.tensor([[5, 6, 5, 2], [6, 5, 6, 2], [0, 0, 3, 5]]), num_items=7)  # virtual 5, 6 counted most
    batch = SessionBatch(items=torch.tensor([[0, 5, 2, 6]]))
    scores = BaselineTask(baseline=pop, num_items=7, num_virtual=2)(batch)
    assert torch.isinf(scores[0, [0, 1, 5, 6]]).all()
    assert scores[0].topk(2).indices.tolist() == [2, 3]
    assert BaselineTask(baseline=pop, num_items=7)(batch)[0].topk(2).indices.tolist() == [5, 6]


def test_a_baseline_without_scores_says_so():
    class Empty(SessionBaseline):
        def _fit(self, sessions):
            pass

    empty = Empty().fit(pad(TRAIN), num_items=V)
    for call in (empty.score, empty.positive_scores):
        with pytest.raises(NotImplementedError, match="Empty implements neither _score nor _positive_scores"):
            call(pad(PREFIXES))


@pytest.mark.parametrize("make", [lambda: VSKNN(k=5, sample_size=20, weighting="quadratic", idf_weighting=2.0),
                                  lambda: STAN(k=5, sample_size=20, lambda_2=30.0)])
def test_knn_spreads_neighbour_weights_alike_by_sort_and_by_sparse_product(make, monkeypatch):
    """Below `PRODUCT_PAIRS` neighbours the kNN baselines sum by `item_sums`, from it on by `positive_sums`:
    the same keys and float32 scores, bit for bit."""
    import sessrec.baselines.stan as stan_module
    import sessrec.baselines.vsknn as vsknn_module

    rng = np.random.default_rng(3)
    def sessions(n):  # right-aligned, 1-8 events
        return np.where(np.arange(8)[None, :] >= rng.integers(0, 8, (n, 1)), rng.integers(2, 40, (n, 8)), 0)

    train, prefixes = sessions(200), sessions(12)
    knn = make().fit(torch.from_numpy(train), num_items=40)
    got = []
    for threshold in (10**9, 0):
        for module in (vsknn_module, stan_module):
            monkeypatch.setattr(module, "PRODUCT_PAIRS", threshold)
        got.append(knn.positive_scores(prefixes))
    assert len(got[0][0]) > 50 and got[0][0].tolist() == got[1][0].tolist()
    assert got[0][1].tobytes() == got[1][1].tobytes()


def test_highest_position_is_the_highest_set_bit_of_every_mask():
    """`highest_position` gives p of the highest set bit 2 ** (p - 1) of each mask, 0 for none, up to position 63,
    also where a float64 of the whole mask would round up (2 ** 60 - 1)."""
    from sessrec.baselines.knn import highest_position

    rng = np.random.default_rng(0)
    bits = np.concatenate([[0, 1, 2**60 - 1, 2**62, 2**63 - 1], rng.integers(0, 2**62, 500) >> rng.integers(0, 62, 500)])
    expected = [int(b).bit_length() for b in bits]
    assert highest_position(bits).tolist() == expected and highest_position(bits).dtype == np.int64


def test_candidates_add_each_pairs_prefix_weights_oldest_position_first():
    """`SessionIndex.candidates` sums the weights of the items a pair shares from 0, the oldest prefix position
    first (not in item order): 1 + 1e16 - 1e16 is 0.0 in float64, -1e16 + 1e16 + 1 would be 1.0."""
    from sessrec.baselines.knn import SessionIndex, session_items

    index = SessionIndex(np.array([[0, 5, 4, 3], [0, 0, 0, 9]]), num_items=10)
    prefix = session_items(np.array([[5, 4, 3], [0, 0, 9]]), 10)
    assert prefix.items.tolist() == [3, 4, 5, 9] and prefix.positions.tolist() == [3, 2, 1, 1]
    pairs = index.candidates(prefix, 0, np.array([-1e16, 1e16, 1.0, 0.5]))
    assert pairs.row.tolist() == [0, 1] and pairs.col.tolist() == [0, 1]
    assert pairs.overlap.tolist() == [0.0, 0.5] and pairs.prefix_bits.tolist() == [7, 1]
