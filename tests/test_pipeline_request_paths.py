"""The per-request paths of the pipeline give the values of their definitions: the co-visitation
features from one lookup of the last three items, the dense grid written at once from grid and slot
columns, the retrievers' lists and scores from their sparse entries (kNN, co-visitation) and the
XLNet retriever's without autograd, against the dense scores they stand for."""

import numpy as np
import pytest
import torch

from sessrec.baselines import STAN, VSKNN
from sessrec.pipeline.candidate_features import CandidateFeatures
from sessrec.pipeline.candidates import Candidates, RequestSessions
from sessrec.pipeline.retrieval.covisitation import CoVisitation

torch.set_num_threads(1)


def test_covisitation_features_are_the_weights_of_the_last_items_decayed_by_half() -> None:
    cv = CoVisitation(window=3, normalize=False).fit(torch.tensor([[2, 3, 4, 5], [3, 4, 6, 2], [0, 5, 6, 3]]), 8)
    for items in (torch.tensor([[0, 2, 3, 4], [0, 0, 0, 5]]), torch.tensor([[3, 4], [0, 6]])):  # 3 and 2 positions
        sessions, cands = RequestSessions(items), Candidates(torch.tensor([[5, 6, 2, 0], [3, 6, 4, 7]]))
        raw = CandidateFeatures(groups=["covisitation"]).raw(sessions, cands, {"cv": cv})
        expected = 0
        for back in range(1, min(3, items.shape[1]) + 1):
            expected = expected + cv.pair_weights(items[:, -back], cands.items) * 0.5 ** (back - 1)
        assert torch.equal(raw["covis_last"], cv.pair_weights(items[:, -1], cands.items))
        assert torch.equal(raw["covis_last3"], expected) and bool((expected > 0).any())
    # session [3, 4], by hand: W[4, 5] = 1 (adjacent once), W[3, 5] = 1/2 + 1/2; W[4, 6] = 1, W[3, 6] = 1/2 + 1
    assert raw["covis_last3"][0, :2].tolist() == [1.0 + 0.5 * 1.0, 1.0 + 0.5 * 1.5] and raw["covis_last3"][0, 3] == 0

def test_dense_features_are_every_column_at_the_filled_slots_in_name_order() -> None:
    cands = Candidates(torch.tensor([[5, 0, 7], [0, 0, 0], [2, 3, 0]]))  # 4 filled slots
    raw = {"b_score": torch.arange(9.0).reshape(3, 3), "a_rrank": torch.full((3, 3), 0.5, dtype=torch.float64)}
    raw["d_slots"] = torch.tensor([1.0, 2.0, 3.0, 1 / 3], dtype=torch.float64)  # (M,) slot column given as such
    fitted = {"c_target": np.array([10.0, 11.0, 12.0, 13.0], dtype=np.float32),  # (M,) slot columns of the ops
              "e_count": np.array([4, 0, 2**40 + 1, 3], dtype=np.int64)}
    out = CandidateFeatures(groups=["retrievers"])._assemble(cands, raw, fitted, {})
    assert out.names == ["a_rrank", "b_score", "c_target", "d_slots", "e_count"] and out.dense.dtype == torch.float32
    third = float(np.float32(1 / 3))
    assert out.dense[0].tolist() == [[0.5, 0.0, 10.0, 1.0, 4.0], [0.0] * 5, [0.5, 2.0, 11.0, 2.0, 0.0]]
    assert out.dense[1].tolist() == [[0.0] * 5] * 3
    assert out.dense[2].tolist() == [[0.5, 6.0, 12.0, 3.0, 2.0**40], [0.5, 7.0, 13.0, third, 3.0], [0.0] * 5]
    fitted["c_target"] = fitted["c_target"][:3]
    with pytest.raises(ValueError, match="a column over the filled slots has 3 values for 4 slots"):
        CandidateFeatures(groups=["retrievers"])._assemble(cands, raw, fitted, {})


def test_reciprocal_ranks_are_one_over_each_retrievers_rank_and_0_where_it_did_not_retrieve() -> None:
    class Fixed:
        def score(self, sessions: RequestSessions, items: torch.Tensor) -> torch.Tensor:
            return items.float() / 10

    ranks = {"a_rank": torch.tensor([[1.0, 0.0, 4.0]]), "b_rank": torch.tensor([[0.0, 2.0, 3.0]])}
    cands = Candidates(torch.tensor([[5, 6, 7]]), features={**ranks, "sources": torch.tensor([[1.0, 1.0, 2.0]])})
    raw = CandidateFeatures(groups=["retrievers"]).raw(RequestSessions(torch.tensor([[5, 6]])), cands,
                                                      {"a": Fixed(), "b": Fixed(), "c": Fixed()})
    assert raw["a_rrank"].tolist() == [[1.0, 0.0, 0.25]] and raw["b_rrank"].tolist() == [[0.0, 0.5, float(np.float32(1 / 3))]]
    assert raw["c_rrank"].tolist() == [[0.0, 0.0, 0.0]] and raw["sources"].tolist() == [[1.0, 1.0, 2.0]]
    assert raw["b_score"].tolist() == [[0.5, 0.6000000238418579, 0.699999988079071]]


def test_a_requests_integer_ids_encode_as_the_arrow_path_encodes_them() -> None:
    import pyarrow as pa

    from sessrec.data.vocab import OOV, ItemVocab
    from sessrec.pipeline.request import encode_raw

    rng = np.random.default_rng(0)
    known = rng.choice(10**12, 300, replace=False)
    vocab = ItemVocab.fit(pa.array(np.repeat(known, rng.integers(1, 5, 300))), 1, None)
    sessions = [[int(x) for x in rng.choice(known, n)] for n in (1, 4, 9, 30)] + [[7, int(known[3]), 2**62, -5]]
    flat = np.array([x for s in sessions for x in s], dtype=np.int64)
    fast = vocab.encode_ints(flat)
    arrow = vocab.encode(pa.array(flat))
    np.testing.assert_array_equal(fast.ids, arrow.ids)
    assert fast.num_unknown == arrow.num_unknown == int(np.isin(flat, [7, 2**62, -5]).sum()) > 0
    assert (fast.ids[~np.isin(flat, known)] == OOV).all()
    as_text = [[str(x) for x in s] for s in sessions]  # the Arrow path (ids of another type, cast)
    assert torch.equal(encode_raw(vocab, sessions, 20), encode_raw(vocab, as_text, 20))


def _knn_world() -> tuple[np.ndarray, torch.Tensor, int]:
    """Seeded right-aligned training sessions (N, 8) over 40 items (ids 2..41) and 24 request prefixes,
    from a few clusters so that neighbours share items and scores tie."""
    rng = np.random.default_rng(3)
    v = 42
    cluster = rng.integers(0, 4, 600)
    train = 2 + (cluster[:, None] * 10 + rng.integers(0, 10, (600, 8))) % 40
    train[np.arange(8) < rng.integers(0, 6, (600, 1))] = 0
    prefixes = 2 + (rng.integers(0, 4, (24, 1)) * 10 + rng.integers(0, 10, (24, 6))) % 40
    prefixes[np.arange(6) < rng.integers(0, 5, (24, 1))] = 0
    prefixes[3, -2] = 1  # an OOV event
    return train, torch.from_numpy(prefixes), v


@pytest.mark.parametrize(
    ("baseline", "tied"),
    [
        (VSKNN(k=8, sample_size=20, weighting="quadratic", weighting_score="div", idf_weighting=5), True),
        (VSKNN(k=5, sample_size=0, similarity="cosine"), True),
        (STAN(k=8, sample_size=30, lambda_1=1.2, lambda_2=300.0, lambda_3=4.9), False),
        (STAN(k=8, sample_size=30, lambda_1=None, lambda_2=None, lambda_3=None), True),
    ],
    ids=["vsknn", "vsknn-cosine", "stan", "stan-no-decay"],
)
def test_knn_retriever_lists_and_scores_are_the_dense_scores_top_k_ties_to_the_lower_id(baseline, tied: bool) -> None:
    from sessrec.pipeline.retrieval.baseline_retriever import BaselineRetriever

    train, prefixes, v = _knn_world()
    retriever = BaselineRetriever(baseline, chunk=5).fit(train, v)  # several chunks of a batch
    dense = baseline.score(prefixes).numpy()  # (B, V): the baseline's own scores, 0 = not reached
    sessions = RequestSessions(prefixes)
    got = retriever.retrieve(sessions, 12)
    ties = 0
    for row in range(len(prefixes)):
        reached = np.flatnonzero(dense[row] > 0)
        order = reached[np.lexsort((reached, -dense[row, reached]))][:12]  # best first, ties: the lower id
        ties += len(order) - len(np.unique(dense[row, order]))
        assert got.items[row, : len(order)].tolist() == order.tolist()
        assert np.array_equal(got.scores[row, : len(order)].numpy(), dense[row, order])  # bit for bit
        assert (got.items[row, len(order) :] == 0).all() and torch.isinf(got.scores[row, len(order) :]).all()
    assert (ties > 0) == tied  # the tie rule was exercised where scores tie
    cands = torch.cat([got.items, torch.tensor([[0, 1, 5, 41]] * len(prefixes))], dim=1)  # empty slots, OOV, others
    scored = retriever.score(sessions, cands).numpy()
    expected = np.where(cands.numpy() >= 2, np.take_along_axis(dense, cands.numpy(), 1), 0.0)
    assert np.array_equal(scored, expected)


def test_covisitation_scores_are_the_sparse_products_bit_for_bit() -> None:
    train, prefixes, v = _knn_world()
    cv = CoVisitation(window=3, max_neighbours=6, last_items=4, recency_decay=0.7).fit(train, v)
    sessions = RequestSessions(prefixes)
    product = (cv.query(sessions) @ cv.matrix).toarray()  # scipy's float64 sums
    keys, values = cv.session_scores(sessions)
    assert keys.tolist() == np.flatnonzero(product).tolist() and np.array_equal(values, product.ravel()[keys])
    got = cv.retrieve(sessions, 10)
    for row in range(len(prefixes)):
        reached = np.flatnonzero(product[row])
        order = reached[np.lexsort((reached, -product[row, reached]))][:10]
        assert got.items[row, : len(order)].tolist() == order.tolist()
        assert np.array_equal(got.scores[row, : len(order)].numpy(), product[row, order].astype(np.float32))


def test_xlnet_retriever_without_autograd_gives_the_training_paths_scores_and_lists() -> None:
    from sessrec.models import SessionModel, XLNetEncoder
    from sessrec.pipeline.retrieval.index import ExactIndex
    from sessrec.pipeline.retrieval.session_model_retriever import SessionModelRetriever

    torch.manual_seed(0)
    model = SessionModel(num_items=300, encoder=XLNetEncoder(d_model=16, n_head=2, n_layer=2), max_length=8, score_scale=8.0)
    items = torch.randint(2, 300, (6, 8))
    items[:, :3] = torch.tensor([[0, 0, 0], [0, 0, 5], [7, 8, 9], [0, 0, 0], [0, 4, 4], [0, 0, 0]])
    items[5, :-1] = 0  # one item
    reference = model.eval()(items)  # (B, V): the whole-catalogue head, with autograd's recording path
    one_block = SessionModelRetriever(model, index=ExactIndex())
    blocks = SessionModelRetriever(model, index=ExactIndex(block_size=37))  # the running top-k over blocks
    with torch.inference_mode():
        got, other = one_block.retrieve(RequestSessions(items), 20), blocks.retrieve(RequestSessions(items), 20)
    assert torch.equal(got.items, other.items)
    torch.testing.assert_close(got.scores, other.scores, rtol=0, atol=1e-6)  # products of other shapes round apart
    top = reference.topk(20, dim=1)
    assert torch.equal(got.items, top.indices)
    torch.testing.assert_close(got.scores, top.values, rtol=0, atol=1e-5)


def fitted_names(groups: list[str] | None, covisitation: bool, times: bool) -> tuple[list[str], list[str]]:
    """The feature groups and names of a `CandidateFeatures` fitted on four sessions of candidates, with or without a
    co-visitation retriever and event times."""
    cv = CoVisitation(window=3).fit(torch.tensor([[2, 3, 4, 5], [3, 4, 6, 2], [0, 5, 6, 3]]), 8)
    items = torch.tensor([[0, 2, 3, 4], [0, 0, 0, 5], [0, 0, 6, 3], [0, 2, 4, 5]])
    stamps = torch.tensor([1.7e9, 1.7e9 + 60, 1.7e9 + 90, 1.7e9 + 200], dtype=torch.float64).expand(4, 4).clone()
    sessions = RequestSessions(items, times=stamps if times else None)
    cands = Candidates(torch.tensor([[5, 6, 2, 0], [3, 6, 4, 7], [2, 4, 5, 7], [6, 3, 7, 0]]))
    labels = torch.zeros(4, 4)
    labels[:, 0] = 1
    retrievers = {"cv": cv} if covisitation else {}
    features = CandidateFeatures(groups=groups).fit_statistics(items, 8)
    features.fit(sessions, cands, features.raw(sessions, cands, retrievers), labels)
    return features.groups, features.names


def test_every_group_the_rows_can_give_by_default_and_a_listed_group_they_cannot_give_is_refused() -> None:
    groups, names = fitted_names(None, covisitation=False, times=False)
    assert "covisitation" not in groups and "time" not in groups and "session" in groups
    assert not [n for n in names if n.startswith(("covis_", "time_")) or n == "session_duration"]
    groups, names = fitted_names(None, covisitation=True, times=True)
    assert groups == ["retrievers", "popularity", "session", "covisitation", "context", "time", "encodings", "ids"]
    assert {"covis_last", "covis_last3", "session_duration", "time_hour_sin", "time_weekday_cos"} <= set(names)
    listed = ["retrievers", "covisitation", "time"]
    assert fitted_names(listed, covisitation=True, times=True)[0] == listed
    with pytest.raises(ValueError, match=r"^features.groups lists \['covisitation'\], which the ranker's rows cannot give: "
                                         r"covisitation: no retriever gives co-visitation weights"):
        fitted_names(listed, covisitation=False, times=True)
    with pytest.raises(ValueError, match=r"lists \['covisitation', 'time'\], .* time: the ranker's rows carry no event times"):
        fitted_names(listed, covisitation=False, times=False)


def test_dense_and_sparse_grids_are_each_columns_value_cast_to_their_dtype_at_the_filled_slots_and_0_elsewhere() -> None:
    g, rng = torch.Generator().manual_seed(3), np.random.default_rng(3)
    items = torch.randint(1, 50, (4, 6), generator=g)
    items[1] = 0  # a session without candidates
    items[2, 4:] = 0
    cands = Candidates(items)
    m = int(cands.valid.sum())
    raw = {"z_score": torch.randn(4, 6, generator=g), "a_wide": torch.randn(4, 6, generator=g, dtype=torch.float64),
           "m_shared": torch.rand(4, 1, generator=g).expand(4, 6),  # a session's value, as the context columns are
           "k_slots": torch.randn(m, generator=g, dtype=torch.float64)}
    fitted = {"b_host": rng.standard_normal(m), "y_count": rng.integers(2**53, 2**62, m),  # int64 -> float32 rounds
              "c_half": rng.standard_normal(m).astype(np.float32), "cross": rng.integers(0, 9, m)}
    frame = {"last_item": rng.integers(0, 50, m)}
    out = CandidateFeatures(groups=["retrievers", "ids"])._assemble(cands, raw, fitted, frame)
    names = sorted(n for n in [*raw, *fitted] if n != "cross")
    assert out.names == names
    expected = np.zeros((4, 6, len(names)), dtype=np.float32)  # the reference: slot by slot, column by column
    cross, last = np.zeros((4, 6), dtype=np.int64), np.zeros((4, 6), dtype=np.int64)
    slot = 0
    for b in range(4):
        for k in range(6):
            if not cands.valid[b, k]:
                continue
            for j, name in enumerate(names):
                column = raw[name] if name in raw else fitted[name]
                value = column[slot] if (name in fitted or column.dim() == 1) else column[b, k]
                expected[b, k, j] = np.float32(value.item() if isinstance(value, torch.Tensor) else value)
            cross[b, k], last[b, k] = fitted["cross"][slot], frame["last_item"][slot]
            slot += 1
    assert out.dense.dtype == torch.float32 and np.array_equal(out.dense.numpy().view(np.int32), expected.view(np.int32))
    assert np.array_equal(out.sparse["cross"].numpy(), cross) and np.array_equal(out.sparse["last_item"].numpy(), last)
    assert torch.equal(out.sparse["item"], items)
