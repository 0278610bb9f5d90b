"""Top-K indexes over an item table: the blocked exact search equals a full product's topk, FAISS
HNSW/IVF find most of the exact top-k with exact scores, state round trips, and bad input is named."""

import json
import sys

import numpy as np
import pytest
import torch

from sessrec.pipeline.retrieval.index import (
    BOUNDED_ROWS,
    GROUP_ROWS,
    QUERY_ROWS,
    ExactIndex,
    FaissIndex,
    host_top_k,
)
from sessrec.saved.registry import config_of, instantiate


def table(n: int, d: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(n, d) float32 Gaussian vectors and shuffled, spread-out int64 ids (not their row numbers)."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, d), dtype=np.float32), rng.permutation(n).astype(np.int64) * 3 + 2


def recall(found: torch.Tensor, truth: torch.Tensor) -> float:
    return float((found.unsqueeze(2) == truth.unsqueeze(1)).any(dim=2).float().mean())


@pytest.mark.parametrize("block_size", [3, 64, 100, 257, 65536])  # < k, not dividing N, = N, > N
def test_exact_matches_full_product_topk_at_any_block_size(block_size):
    vectors, ids = table(257, 8, seed=0)
    queries = torch.from_numpy(np.random.default_rng(1).standard_normal((5, 8), dtype=np.float32))
    top = (queries @ torch.from_numpy(vectors).T).topk(10, dim=1)  # (5, 10)
    scores, found = ExactIndex(block_size).build(vectors, ids).search(queries, 10)
    assert scores.dtype == torch.float32 and found.dtype == torch.int64 and found.shape == (5, 10)
    assert torch.equal(found, torch.from_numpy(ids)[top.indices])
    torch.testing.assert_close(scores, top.values, rtol=1e-5, atol=1e-5)


def test_exact_scores_queries_in_parts_of_query_rows_with_the_results_of_one_product():
    vectors, ids = table(300, 8, seed=2)
    queries = torch.from_numpy(np.random.default_rng(3).standard_normal((2 * QUERY_ROWS + 5, 8), dtype=np.float32))
    top = (queries @ torch.from_numpy(vectors).T).topk(7, dim=1)
    scores, found = ExactIndex().build(vectors, ids).search(queries, 7)
    assert torch.equal(found, torch.from_numpy(ids)[top.indices])
    torch.testing.assert_close(scores, top.values, rtol=1e-5, atol=1e-5)
    empty = ExactIndex().build(vectors, ids).search(queries[:0], 7)
    assert empty[0].shape == (0, 7) and empty[1].shape == (0, 7)


@pytest.mark.parametrize("n, k", [(3001, 20), (GROUP_ROWS * 20 - 1, 20), (90, 20), (79, 20)])  # groups of 128, 127
def test_host_top_k_is_topk_bit_for_bit(n, k):  # and 4, the rest one more group; fewer than 4 k columns: topk
    """The scores at or above the k-th largest group maximum hold each row's top k: the same values and columns as
    ``topk``, with columns past the last whole group and with few columns."""
    scores = torch.from_numpy(np.random.default_rng(5).standard_normal((QUERY_ROWS, n), dtype=np.float32))
    top = scores.topk(k, dim=1)
    values, columns = host_top_k(scores, k)
    assert values.dtype == torch.float32 and columns.dtype == torch.int64
    assert torch.equal(values, top.values) and torch.equal(columns, top.indices)


def test_host_top_k_finds_a_top_k_all_in_one_group_ties_to_the_lower_column_and_ranks_nan_rows_by_topk():
    n, k = 2000, 10  # groups of 128 columns
    assert BOUNDED_ROWS == 4
    scores = torch.arange(n, dtype=torch.float32).repeat(3, 1) / n  # rising with the column
    scores[0, 256:266] = 5.0 + torch.arange(10.0)  # row 0: its best ten all in group 2
    scores[1] = 0.0
    scores[1, [300, 200, 600]] = 1.0  # row 1: three tied, then 1997 tied at 0
    scores[2, 7] = float("nan")
    values, columns = host_top_k(torch.cat([scores[:2], scores[:2]]), k)  # BOUNDED_ROWS rows
    assert torch.equal(values[2:], values[:2]) and torch.equal(columns[2:], columns[:2])
    assert columns[0].tolist() == list(range(265, 255, -1)) and values[0].tolist() == [14.0 - i for i in range(10)]
    assert columns[1].tolist() == [200, 300, 600, 0, 1, 2, 3, 4, 5, 6] and values[1, :3].tolist() == [1.0] * 3
    nan = host_top_k(torch.cat([scores, scores[:1]]), k)  # torch.topk ranks NaN first
    assert nan[1][2, 0] == 7 and nan[0][2, 0].isnan() and torch.equal(nan[1][0], columns[0])


def test_exact_hand_computed_case_and_padding_beyond_n():
    index = ExactIndex(block_size=2).build(np.eye(3, dtype=np.float32), np.array([7, 8, 9]))
    scores, ids = index.search(torch.tensor([[0.0, 2.0, 1.0], [3.0, -1.0, 0.5]]), k=5)
    assert ids.tolist() == [[8, 9, 7, 0, 0], [7, 9, 8, 0, 0]]
    assert scores.tolist() == [[2.0, 1.0, 0.0, float("-inf"), float("-inf")],
                               [3.0, 0.5, -1.0, float("-inf"), float("-inf")]]


@pytest.mark.parametrize("block_size", [2, 4, 16])
def test_exact_k_above_n_returns_all_items_sorted_then_padding(block_size):
    vectors, ids = table(6, 4, seed=2)
    queries = torch.from_numpy(np.random.default_rng(3).standard_normal((3, 4), dtype=np.float32))
    full = (queries @ torch.from_numpy(vectors).T).sort(dim=1, descending=True)
    scores, found = ExactIndex(block_size).build(vectors, ids).search(queries, 9)
    assert torch.equal(found[:, :6], torch.from_numpy(ids)[full.indices])
    torch.testing.assert_close(scores[:, :6], full.values)
    assert (found[:, 6:] == 0).all() and torch.isneginf(scores[:, 6:]).all()


@pytest.fixture(scope="module")
def faiss_case():
    pytest.importorskip("faiss")
    vectors, ids = table(5000, 16, seed=4)
    queries = torch.from_numpy(np.random.default_rng(5).standard_normal((40, 16), dtype=np.float32))
    truth = ExactIndex().build(vectors, ids).search(queries, 50)[1]
    built = {
        "hnsw": FaissIndex("hnsw", seed=0).build(vectors, ids),
        "ivf": FaissIndex("ivf", nlist=64, nprobe=32, seed=0).build(vectors, ids),  # isotropic: half of lists
    }
    return vectors, ids, queries, truth, built


@pytest.mark.parametrize("kind", ["hnsw", "ivf"])
def test_faiss_recall_at_50_and_exact_scores_of_returned_items(faiss_case, kind):
    vectors, ids, queries, truth, built = faiss_case
    scores, found = built[kind].search(queries, 50)
    assert scores.dtype == torch.float32 and found.dtype == torch.int64 and found.shape == (40, 50)
    assert recall(found, truth) >= 0.9  # measured: hnsw 0.9995, ivf 0.966
    assert (found != 0).all()
    row_of = {int(item): row for row, item in enumerate(ids)}
    rows = torch.tensor([[row_of[int(i)] for i in r] for r in found])
    exact = (queries.unsqueeze(1) * torch.from_numpy(vectors)[rows]).sum(dim=2)  # (40, 50)
    torch.testing.assert_close(scores, exact, rtol=1e-5, atol=1e-4)
    assert (scores[:, :-1] >= scores[:, 1:]).all()  # best first


def test_faiss_ivf_default_lists_and_padding_of_missing_results():
    pytest.importorskip("faiss")
    vectors, ids = table(100, 4, seed=6)
    index = FaissIndex("ivf", nprobe=1, seed=0).build(vectors, ids)
    assert index.num_lists == 40 and FaissIndex("hnsw").num_lists is None  # round(4 * sqrt(100))
    scores, found = index.search(torch.from_numpy(vectors[:3]), 100)  # one list of 40 holds < 100 items
    missing = found == 0
    assert missing.any() and torch.isneginf(scores[missing]).all() and torch.isfinite(scores[~missing]).all()
    scores, found = FaissIndex("hnsw").build(vectors, ids).search(torch.from_numpy(vectors[:2]), 103)
    assert (found[:, 100:] == 0).all() and torch.isneginf(scores[:, 100:]).all()


def round_trip(index):
    config, arrays = config_of(index), index.state_dict()
    assert all(isinstance(a, np.ndarray) for a in arrays.values())
    config = json.loads(json.dumps(config))
    rebuilt = instantiate(config, expected=(ExactIndex, FaissIndex), source="test")
    return rebuilt.load_state_dict({name: a.copy() for name, a in arrays.items()}), arrays


def test_exact_state_round_trip_gives_identical_results():
    vectors, ids = table(300, 8, seed=7)
    queries = torch.from_numpy(np.random.default_rng(8).standard_normal((4, 8), dtype=np.float32))
    index = ExactIndex(block_size=50).build(vectors, ids)
    restored, arrays = round_trip(index)
    assert set(arrays) == {"vectors", "ids"} and restored.block_size == 50
    for a, b in zip(index.search(queries, 20), restored.search(queries, 20)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("kind", ["hnsw", "ivf"])
def test_faiss_state_round_trip_gives_identical_results(faiss_case, kind):
    _, _, queries, _, built = faiss_case
    restored, arrays = round_trip(built[kind])
    assert set(arrays) == {"index", "ids"} and arrays["index"].dtype == np.uint8
    assert (restored.kind, restored.ef_search, restored.nprobe) == (kind, 128, 16 if kind == "hnsw" else 32)
    for a, b in zip(built[kind].search(queries, 50), restored.search(queries, 50)):
        assert torch.equal(a, b)


def test_a_loaded_faiss_index_applies_its_own_query_settings(faiss_case):
    state = faiss_case[4]["hnsw"].state_dict()
    assert FaissIndex("hnsw", ef_search=300).load_state_dict(state)._index.hnsw.efSearch == 300
    with pytest.raises(ValueError, match="the saved faiss index is not of kind 'ivf'"):
        FaissIndex("ivf").load_state_dict(state)
    state = faiss_case[4]["ivf"].state_dict()
    assert FaissIndex("ivf", nprobe=5).load_state_dict(state)._index.nprobe == 5


def test_hnsw_ef_search_below_k_is_raised_to_k(faiss_case):
    queries, state = faiss_case[2], faiss_case[4]["hnsw"].state_dict()
    low = FaissIndex("hnsw", ef_search=1).load_state_dict(state).search(queries, 50)
    at_k = FaissIndex("hnsw", ef_search=50).load_state_dict(state).search(queries, 50)
    assert torch.equal(low[1], at_k[1]) and torch.equal(low[0], at_k[0])


def make(name):
    if name == "faiss":
        pytest.importorskip("faiss")
        return FaissIndex("hnsw")
    return ExactIndex()


@pytest.mark.parametrize("name", ["exact", "faiss"])
@pytest.mark.parametrize(("vectors", "ids", "message"), [
    (np.ones(5, np.float32), np.arange(5), r"2-d \(N, D\), got shape \(5,\)"),
    (np.ones((5, 3), np.float32), np.arange(4), r"ids must have shape \(N,\) = \(5,\).*got \(4,\)"),
    (np.array([[1.0, 2.0], [np.nan, 0.0]], np.float32), np.arange(2),
     r"1 non-finite values \(first: nan at row 1, column 0\)"),
    (np.array([[1.0, np.inf]], np.float32), np.arange(1), r"first: inf at row 0, column 1"),
    (np.ones((0, 3), np.float32), np.arange(0), r"at least one item.*got shape \(0, 3\)"),
])
def test_bad_tables_are_named(name, vectors, ids, message):
    with pytest.raises(ValueError, match=message):
        make(name).build(vectors, ids)


@pytest.mark.parametrize("name", ["exact", "faiss"])
def test_bad_searches_are_named(name):
    index = make(name)
    with pytest.raises(RuntimeError, match="search called before build"):
        index.search(torch.ones(1, 3), 1)
    with pytest.raises(RuntimeError, match="state_dict called before build"):
        index.state_dict()
    index.build(np.ones((4, 3), np.float32), np.arange(4))
    with pytest.raises(ValueError, match=r"shape \(B, 3\).*got \(2, 5\)"):
        index.search(torch.ones(2, 5), 1)
    with pytest.raises(ValueError, match=r"shape \(B, 3\).*got \(3,\)"):
        index.search(torch.ones(3), 1)
    with pytest.raises(ValueError, match="k must be an integer >= 1, got 0"):
        index.search(torch.ones(2, 3), 0)
    with pytest.raises(TypeError, match="ids must be integers, got dtype float64"):
        index.build(np.ones((4, 3), np.float32), np.arange(4.0))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"kind": "flat"}, "kind must be 'hnsw' or 'ivf', got 'flat'"),
    ({"hnsw_m": 1}, "hnsw_m must be an integer >= 2, got 1"),
    ({"ef_search": 0}, "ef_search must be an integer >= 1, got 0"),
    ({"nprobe": -3}, "nprobe must be an integer >= 1, got -3"),
    ({"nlist": 0}, r"nlist must be None \(about 4 sqrt\(N\)\) or an integer >= 1, got 0"),
])
def test_bad_faiss_settings_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FaissIndex(**kwargs)


def test_bad_block_size_and_too_many_lists_are_named():
    with pytest.raises(ValueError, match="block_size must be an integer >= 1, got 0"):
        ExactIndex(block_size=0)
    pytest.importorskip("faiss")
    with pytest.raises(ValueError, match="nlist=8 exceeds the 5 vectors"):
        FaissIndex("ivf", nlist=8).build(np.ones((5, 2), np.float32), np.arange(5))


def test_missing_faiss_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "faiss", None)  # makes `import faiss` raise ImportError
    with pytest.raises(ImportError, match="pip install faiss-cpu"):
        FaissIndex().build(np.ones((4, 3), np.float32), np.arange(4))


@pytest.mark.parametrize("score_scale", [None, 8.0])
def test_a_session_models_candidate_scores_are_its_logits_and_follow_its_weights(score_scale):
    """`SessionModelRetriever.score`: the model's own logits at any recommendable ids (a finite value at the
    special ones, which the model masks), the new weights' once they are written in place, and a pickle's the same."""
    import pickle

    from sessrec.models import CausalLanguageModeling, SASRecEncoder, SessionModel
    from sessrec.pipeline import SessionModelRetriever
    from sessrec.pipeline.candidates import RequestSessions

    torch.manual_seed(0)
    model = SessionModel(num_items=30, encoder=SASRecEncoder(d_model=8, n_head=2, n_layer=1, dropout=0.0),
                         max_length=6, score_scale=score_scale).eval()
    with torch.no_grad():
        model.output_bias.normal_()
    retriever = SessionModelRetriever(model, CausalLanguageModeling())
    items = torch.tensor([[0, 0, 5, 7], [3, 9, 2, 11]])
    candidates = torch.tensor([[0, 1, 7, 29, 4], [12, 12, 2, 6, 0]])

    def expected() -> torch.Tensor:
        with torch.no_grad():
            return model(items, CausalLanguageModeling()).gather(1, candidates)

    def check(scorer: SessionModelRetriever) -> None:
        got, want = scorer.score(RequestSessions(items), candidates), expected()
        assert torch.isfinite(got).all() and torch.equal(torch.isfinite(want), candidates >= 2)
        torch.testing.assert_close(got[candidates >= 2], want[candidates >= 2], rtol=1e-5, atol=1e-5)

    check(retriever)
    with torch.no_grad():
        model.item_embedding.weight.mul_(-2.0)  # in place: the table follows
        model.output_bias.add_(1.0)
    check(retriever)
    check(pickle.loads(pickle.dumps(retriever)))


def test_a_retriever_reads_the_latest_items_its_recommender_is_served_on():
    """A `SessionRecommender` served on fewer items (``inference.max_length``) than its network reads: its
    retriever (`from_pretrained`, a pipeline recipe's) queries those latest items, so the pipeline's scores are
    the recommender's; a window outside 1..the network's length is refused."""
    import pyarrow as pa

    from sessrec.artifacts.session_recommender import Inference, SessionRecommender
    from sessrec.data.vocab import ItemVocab
    from sessrec.models import CausalLanguageModeling, SASRecEncoder, SessionModel
    from sessrec.pipeline import SessionModelRetriever
    from sessrec.pipeline.candidates import RequestSessions

    torch.manual_seed(0)
    model = SessionModel(num_items=30, encoder=SASRecEncoder(d_model=8, n_head=2, n_layer=1, dropout=0.0),
                         max_length=6).eval()
    vocab = ItemVocab.fit(pa.array(np.arange(100, 128)))
    items = torch.tensor([[0, 4, 9, 5, 7, 12], [3, 9, 2, 11, 20, 6]])
    candidates = torch.tensor([[2, 7, 29, 4], [12, 2, 6, 25]])
    served = SessionRecommender(model, CausalLanguageModeling(), vocab, Inference(max_length=3))
    want = served.scores(items).gather(1, candidates)
    retriever = SessionModelRetriever(model, CausalLanguageModeling(), max_length=3)
    torch.testing.assert_close(retriever.score(RequestSessions(items), candidates), want, rtol=1e-5, atol=1e-5)
    whole = SessionModelRetriever(model, CausalLanguageModeling()).score(RequestSessions(items), candidates)
    assert not torch.allclose(whole, want, atol=1e-3)  # the network's six items give other scores
    with pytest.raises(ValueError, match="^max_length must be between 1 and the network's 6 items, got 7$"):
        SessionModelRetriever(model, CausalLanguageModeling(), max_length=7)
