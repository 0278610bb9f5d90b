"""The per-request paths of the pipeline's features give the values of their definitions: the
co-visitation features from one lookup of the last three items, and the dense grid written at once
from grid and slot columns."""

import numpy as np
import pytest
import torch

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
    from sessrec.pipeline.pipeline import encode_raw

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
