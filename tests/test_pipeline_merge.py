"""`merge` and `Candidates`: the union of retrievers' lists, with each source's rank and score, by hand."""

import pytest
import torch

from sessrec.pipeline import Candidates, Retrieved, merge
from sessrec.pipeline.retrieval.base import top_k_dense


def test_merge_orders_by_agreement_and_keeps_each_source():
    a = Retrieved(items=torch.tensor([[5, 7, 9], [4, 0, 0]]), scores=torch.tensor([[3.0, 2.0, 1.0], [1.0, 0, 0]]))
    b = Retrieved(items=torch.tensor([[9, 6], [4, 8]]), scores=torch.tensor([[0.9, 0.5], [0.7, 0.6]]))
    out = merge({"a": a, "b": b})
    # row 0 priorities: 9 -> 1/3 + 1/1, 5 -> 1, 7 -> 1/2, 6 -> 1/2 (tie: lower id first after the stable sort)
    assert out.items.tolist() == [[9, 5, 6, 7], [4, 8, 0, 0]]
    f = out.features
    assert f["a_rank"].tolist() == [[3, 1, 0, 2], [1, 0, 0, 0]]
    assert f["b_rank"].tolist() == [[1, 0, 2, 0], [1, 2, 0, 0]]
    assert f["a_score"].tolist() == [[1.0, 3.0, 0.0, 2.0], [1.0, 0.0, 0.0, 0.0]]
    assert f["b_score"].tolist() == [[pytest.approx(0.9), 0.0, 0.5, 0.0], [pytest.approx(0.7), pytest.approx(0.6), 0, 0]]
    assert f["sources"].tolist() == [[2, 1, 1, 1], [2, 1, 0, 0]]


def test_merge_skips_special_ids_and_empty_slots():
    a = Retrieved(items=torch.tensor([[0, 1, 3]]), scores=torch.tensor([[9.0, 8.0, 1.0]]))
    out = merge({"a": a})
    assert out.items.tolist() == [[3]] and out.features["a_rank"].tolist() == [[3]]


def test_candidates_keep_and_compact():
    c = Candidates(torch.tensor([[5, 6, 7], [8, 9, 0]]), {"x": torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])},
                   torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, float("-inf")]]))
    kept = c.keep(torch.tensor([[True, False, True], [False, True, True]]))
    assert kept.items.tolist() == [[5, 0, 7], [0, 9, 0]]
    assert kept.scores[0, 1] == float("-inf") and kept.scores[1, 0] == float("-inf")
    small = kept.compact()
    assert small.items.tolist() == [[5, 7], [9, 0]]
    assert small.features["x"][small.valid].tolist() == [1.0, 3.0, 5.0]  # features travel with their items


def test_top_k_dense_returns_empty_slots_for_minus_inf():
    scores = torch.tensor([[float("-inf"), float("-inf"), 0.5, 0.7, float("-inf")]])
    top = top_k_dense(scores, 3)
    assert top.items.tolist() == [[3, 2, 0]] and top.scores[0, :2].tolist() == [pytest.approx(0.7), 0.5]


def test_list_metrics_count_ties_against_the_target():
    from sessrec.pipeline.training import list_metrics

    items = torch.tensor([[4, 7, 9, 5], [4, 7, 9, 5], [4, 7, 9, 5], [4, 7, 0, 0]])
    scores = torch.tensor([[3.0, 2.0, 2.0, 1.0], [3.0, 2.0, 1.5, 1.0], [3.0, 2.0, 1.5, 1.5], [3.0, 2.0, -1, -1]])
    targets = torch.tensor([7, 9, 9, 7])
    out = list_metrics(items, scores, targets, ks=[1, 3])
    # ranks: 3 (7 ties with 9), 3, miss (9 ties with the full list's last entry), 2 (a short list: nothing unlisted)
    assert out["recall@1"] == 0 and out["recall@3"] == 3
    assert out["mrr@3"] == pytest.approx(1 / 3 + 1 / 3 + 1 / 2)
