"""CoVisitation retriever: co-visitation matrices counted by hand, retrieval and lookups on hand-made sessions.

Hand case (ids 2..7 are items, 0 padding, 1 OOV), window 2:
    [2, 3, 4]     forward: 2->3 (d 1), 3->4 (d 1), 2->4 (d 2, weight 1/2)
    [3, 1, 5]     forward: 3->5 (d 2 across the OOV event, 1/2); OOV pairs with nothing
    [4, 4, 2]     forward: 4->4 left out (a repeat), 4->2 at d 1 and d 2: 1 + 1/2
"""

import copy
import json

import numpy as np
import pytest
import torch

from sessrec.pipeline.candidates import RequestSessions
from sessrec.pipeline.retrieval.covisitation import CoVisitation
from sessrec.saved.registry import config_of, instantiate

torch.set_num_threads(1)

V = 8
TRAIN = torch.tensor([[0, 0, 2, 3, 4], [0, 0, 3, 1, 5], [0, 0, 4, 4, 2]])
FORWARD_2 = {(2, 3): 1.0, (2, 4): 0.5, (3, 4): 1.0, (3, 5): 0.5, (4, 2): 1.5}
BOTH_2 = {
    (2, 3): 1.0,
    (2, 4): 2.0,
    (3, 2): 1.0,
    (3, 4): 1.0,
    (3, 5): 0.5,
    (4, 2): 2.0,
    (4, 3): 1.0,
    (5, 3): 0.5,
}
QUERIES = torch.tensor(
    [
        [0, 5, 2, 3],
        [3, 2, 3, 1],  # 3 again and an OOV last: the same two distinct items, 3 the most recent
        [0, 0, 0, 1],  # only OOV: nothing
        [0, 0, 0, 7],  # an item that never co-visits
        [0, 0, 0, 5],
    ]
)


def entries(cv: CoVisitation) -> dict[tuple[int, int], float]:
    m = cv.matrix.tocoo()
    return {(int(a), int(b)): float(v) for a, b, v in zip(m.row, m.col, m.data)}


def fit(**kwargs) -> CoVisitation:
    settings = {"window": 2, "normalize": False, **kwargs}
    return CoVisitation(**settings).fit(TRAIN, V)


# -- the co-visitation matrix ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "settings, expected",
    [
        ({"direction": "forward"}, FORWARD_2),
        ({"direction": "both"}, BOTH_2),
        ({"direction": "forward", "window": 1}, {(2, 3): 1.0, (3, 4): 1.0, (4, 2): 1.0}),
        ({"direction": "forward", "window": 10}, FORWARD_2),  # longer than the sessions
    ],
)
def test_matrix_by_hand(settings, expected):
    assert entries(fit(**settings)) == pytest.approx(expected)


def test_session_weights_scale_each_sessions_pairs():
    cv = CoVisitation(window=2, direction="forward", normalize=False).fit(
        TRAIN, V, weights=np.array([1.0, 2.0, 0.0])
    )
    assert entries(cv) == pytest.approx({(2, 3): 1.0, (2, 4): 0.5, (3, 4): 1.0, (3, 5): 1.0})  # 4->2 weighs 0


def test_max_neighbours_keeps_the_largest_ties_to_the_lower_id():
    # row 3 holds 2: 1, 4: 1, 5: 0.5 -> the tie 2 vs 4 goes to 2
    assert entries(fit(direction="both", max_neighbours=1)) == pytest.approx(
        {(2, 4): 2.0, (3, 2): 1.0, (4, 2): 2.0, (5, 3): 0.5}
    )


def test_normalize_divides_rows_by_their_sum():
    expected = {
        (2, 3): 1 / 3,
        (2, 4): 2 / 3,
        (3, 2): 0.4,
        (3, 4): 0.4,
        (3, 5): 0.2,
        (4, 2): 2 / 3,
        (4, 3): 1 / 3,
        (5, 3): 1.0,
    }
    assert entries(fit(direction="both", normalize=True)) == pytest.approx(expected)


def test_matrix_matches_a_brute_force_count():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 9, size=40)
    sessions = np.zeros((40, 8), dtype=np.int64)
    for s, n in enumerate(lengths):
        sessions[s, 8 - n :] = rng.integers(1, 12, size=n)  # OOV included, repeats likely
    for direction in ("forward", "both"):
        expected: dict[tuple[int, int], float] = {}
        for row in sessions:
            for i in range(8):
                for j in range(i + 1, min(i + 4, 8)):  # window 3
                    a, b = int(row[i]), int(row[j])
                    if a >= 2 and b >= 2 and a != b:
                        pairs = [(a, b), (b, a)] if direction == "both" else [(a, b)]
                        for key in pairs:
                            expected[key] = expected.get(key, 0.0) + 1 / (j - i)
        cv = CoVisitation(window=3, direction=direction, max_neighbours=100, normalize=False).fit(
            sessions, 12
        )
        assert entries(cv) == pytest.approx(expected)


# -- retrieval and scores -------------------------------------------------------------------------
def test_retrieve_hand_session_with_recency_weights():
    # last_items 2: 3 weighs 1, 2 weighs 0.5: W[3] + W[2] / 2 = {2: 1, 3: 0.5, 4: 1 + 1, 5: 0.5}
    got = fit(direction="both", last_items=2, recency_decay=0.5).retrieve(RequestSessions(QUERIES), k=5)
    inf = float("-inf")
    assert got.items.tolist() == [[4, 2, 3, 5, 0], [4, 2, 3, 5, 0], [0] * 5, [0] * 5, [3, 0, 0, 0, 0]]
    assert got.scores.tolist()[0] == [2.0, 1.0, 0.5, 0.5, inf]
    assert got.scores.tolist()[2] == [inf] * 5
    assert got.scores.tolist()[4] == [0.5, inf, inf, inf, inf]
    # last_items 3 adds 5 at weight 0.25: W[5] / 4 = {3: 0.125}
    third = fit(direction="both", last_items=3, recency_decay=0.5).retrieve(RequestSessions(QUERIES[:1]), k=3)
    assert third.items.tolist() == [[4, 2, 3]]
    assert third.scores.tolist() == [[2.0, 1.0, 0.625]]


def test_retrieve_matches_dense_product_and_never_returns_special_ids():
    rng = np.random.default_rng(1)
    train = rng.integers(1, 30, size=(200, 6))
    train[np.arange(6) < rng.integers(0, 5, size=(200, 1))] = 0  # right-aligned: padding on the left
    cv = CoVisitation(window=3, max_neighbours=5, last_items=3, recency_decay=0.7).fit(train, 30)
    queries = torch.from_numpy(rng.integers(1, 30, size=(16, 5)))
    queries[-1] = 1  # only OOV: nothing found
    got = cv.retrieve(RequestSessions(queries), k=8)
    dense = torch.from_numpy(cv.query(RequestSessions(queries)).toarray() @ cv.matrix.toarray()).float()
    found = got.items >= 2
    assert ((got.items == 0) | found).all()
    assert torch.allclose(got.scores[found], dense.gather(1, got.items)[found])
    kth = torch.where(found, got.scores, torch.full_like(got.scores, float("inf"))).min(dim=1).values
    assert found[:, 0].any() and (~found[:, 0]).any()
    assert torch.allclose(dense.max(dim=1).values[found[:, 0]], got.scores[found[:, 0], 0])
    assert (dense[~found[:, 0]] == 0).all()  # nothing found: nothing co-visits
    full = found.all(dim=1)  # rows with k items: nothing left out scores above their k-th
    assert full.any()
    assert (dense[full].topk(8, dim=1).values[:, -1] <= kth[full] + 1e-6).all()


def test_score_agrees_with_retrieve_and_is_zero_elsewhere():
    cv = fit(direction="both", last_items=3)
    sessions = RequestSessions(QUERIES)
    got = cv.retrieve(sessions, k=4)
    scores = cv.score(sessions, got.items)
    found = got.items != 0
    assert torch.equal(scores[found], got.scores[found])
    assert (scores[~found] == 0).all()
    other = cv.score(RequestSessions(QUERIES), torch.tensor([[7, 0, 5, 1]] * 5))  # fresh batch, no cache
    assert other[0].tolist() == [0.0, 0.0, 0.5, 0.0]


def test_two_retrievers_on_one_batch_keep_their_own_scores():
    sessions = RequestSessions(QUERIES[:1])
    forward = fit(direction="forward").retrieve(sessions, k=3)
    both = fit(direction="both").retrieve(sessions, k=3)
    assert forward.items.tolist() != both.items.tolist()


# -- pair weights ---------------------------------------------------------------------------------
def test_pair_weights():
    cv = fit(direction="both")
    items = torch.tensor([[3, 4, 2, 0], [2, 5, 7, 1], [3, 4, 5, 2]])
    by_session = cv.pair_weights(torch.tensor([2, 3, 1]), items)
    assert by_session.tolist() == [[1.0, 2.0, 0.0, 0.0], [1.0, 0.5, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
    by_candidate = cv.pair_weights(torch.tensor([[2, 2, 3, 4], [4, 3, 0, 3], [5, 5, 3, 3]]), items)
    assert by_candidate.tolist() == [[1.0, 2.0, 1.0, 0.0], [2.0, 0.5, 0.0, 0.0], [0.5, 0.0, 0.5, 1.0]]


def test_anchored_weights_are_the_pair_weights_of_every_anchor_beside_every_candidate():
    """Searched the other way round (each anchor row's entries among the session's sorted candidates): the same
    weights, also for repeated candidates, empty slots, padding or OOV anchors, rows without candidates, no columns."""
    cv = fit(direction="both")
    anchors = torch.tensor([[2, 3, 4], [0, 0, 5], [1, 4, 4], [3, 2, 0], [7, 6, 2]])
    items = torch.tensor([[3, 4, 2, 0, 4, 3], [2, 5, 3, 1, 0, 0], [2, 3, 3, 3, 5, 4], [0, 0, 0, 0, 0, 0],
                          [4, 1, 0, 2, 3, 3]])
    for a, c in ((anchors, items), (anchors[:, :1], items), (anchors, items[:, :0]), (anchors[:0], items[:0])):
        each = [cv.pair_weights(a[:, i].unsqueeze(1).expand(c.shape), c) for i in range(a.shape[1])]
        want = torch.stack(each, 1) if each else torch.zeros(c.shape[0], 0, c.shape[1])
        got = cv.anchored_weights(a, c)
        assert got.dtype == torch.float32 and torch.equal(got, want)
    first = cv.anchored_weights(anchors, items)[0]  # anchors 2, 3, 4 beside candidates 3, 4, 2, -, 4, 3
    assert first.tolist() == [[1.0, 2.0, 0.0, 0.0, 2.0, 1.0], [0.0, 1.0, 1.0, 0.0, 1.0, 0.0], [1.0, 0.0, 2.0, 0.0, 0.0, 1.0]]


# -- saving ---------------------------------------------------------------------------------------
def test_state_round_trip():
    cv = CoVisitation(window=3, max_neighbours=2, last_items=2, recency_decay=0.3, direction="forward").fit(
        TRAIN, V
    )
    config, arrays = config_of(cv), cv.state_dict()
    config = json.loads(json.dumps(config))
    assert sorted(arrays) == ["data", "indices", "indptr", "num_items"] and arrays["num_items"] == V
    back = instantiate(config, expected=CoVisitation, source="test").load_state_dict(copy.deepcopy(arrays))
    assert config_of(back) == config and back.num_items == cv.num_items == V
    assert (back.matrix != cv.matrix).nnz == 0
    a, b = cv.retrieve(RequestSessions(QUERIES), 4), back.retrieve(RequestSessions(QUERIES), 4)
    assert torch.equal(a.items, b.items) and torch.equal(a.scores, b.scores)
    anchors = torch.tensor([2, 3, 4, 5, 6])
    assert torch.equal(cv.pair_weights(anchors, a.items), back.pair_weights(anchors, a.items))
    with pytest.raises(ValueError, match="CSR"):
        CoVisitation().load_state_dict({**arrays, "indptr": arrays["indptr"][:-1]})
    with pytest.raises(ValueError, match=r"columns outside \[0, 8\)"):
        CoVisitation().load_state_dict({**arrays, "indices": arrays["indices"] + V})


# -- bad input ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "settings, message",
    [
        ({"window": 0}, "window"),
        ({"max_neighbours": 0}, "max_neighbours"),
        ({"last_items": 0}, "last_items"),
        ({"recency_decay": 0.0}, "recency_decay"),
        ({"recency_decay": 1.5}, "recency_decay"),
        ({"direction": "backward"}, "direction"),
    ],
)
def test_bad_settings(settings, message):
    with pytest.raises(ValueError, match=message):
        CoVisitation(**settings)


def test_bad_inputs():
    with pytest.raises(RuntimeError, match="not fitted"):
        CoVisitation().retrieve(RequestSessions(QUERIES), k=3)
    with pytest.raises(ValueError, match="shape"):
        CoVisitation().fit(torch.tensor([2, 3, 4]), V)
    with pytest.raises(TypeError, match="integer"):
        CoVisitation().fit(TRAIN.float(), V)
    with pytest.raises(ValueError, match="outside"):
        CoVisitation().fit(TRAIN, 5)
    with pytest.raises(ValueError, match="right-aligned"):
        CoVisitation().fit(torch.tensor([[2, 0, 3]]), V)
    with pytest.raises(ValueError, match="num_items"):
        CoVisitation().fit(TRAIN, 2)
    with pytest.raises(ValueError, match="weights"):
        CoVisitation().fit(TRAIN, V, weights=np.ones(2))
    with pytest.raises(ValueError, match="weights"):
        CoVisitation().fit(TRAIN, V, weights=np.array([1.0, -1.0, 1.0]))
    cv = fit()
    with pytest.raises(ValueError, match="outside"):
        cv.retrieve(RequestSessions(torch.tensor([[0, 2, 9]])), k=3)
    with pytest.raises(ValueError, match="k must"):
        cv.retrieve(RequestSessions(QUERIES), k=0)
    with pytest.raises(ValueError, match="outside"):
        cv.score(RequestSessions(QUERIES), torch.full((5, 2), V))
    with pytest.raises(ValueError, match="rows"):
        cv.score(RequestSessions(QUERIES), torch.full((4, 2), 2))
    with pytest.raises(ValueError, match="do not match"):
        cv.pair_weights(torch.tensor([2, 3]), torch.full((3, 2), 2))
