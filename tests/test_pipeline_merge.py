"""`merge` and `Candidates`: the union of retrievers' lists, with each source's rank and score, by hand."""

import itertools

import numpy as np
import pytest
import torch

from sessrec.pipeline import Candidates, Retrieved, merge
from sessrec.pipeline.retrieval.retriever import lookup_sparse, top_k_sparse


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


def at(ranks: dict[int, int], width: int) -> Retrieved:
    """One session's list of `width` items with `ranks` (item -> 1-based rank) placed, filler items elsewhere."""
    row = [100 + i for i in range(width)]
    for item, rank in ranks.items():
        row[rank - 1] = item
    return Retrieved(items=torch.tensor([row]), scores=torch.zeros(1, width))


def test_merge_sums_priorities_source_by_source_in_the_order_given():
    """Item 10 has ranks 4, 6 and 12 (1/4 + 1/6 + 1/12 = 1/2), item 20 rank 2 (1/2). In float64 the first sum
    is 0.5 or 0.49999999999999994 depending on the order of addition: merge adds source by source in the
    order given (on every device), so 10 comes first (a tie: the lower id) exactly when that sum is 0.5."""
    sources = {"a": at({20: 2, 10: 4}, 4), "b": at({10: 6}, 6), "c": at({10: 12}, 12)}
    outcomes = set()
    for order in itertools.permutations("abc"):
        total = 0.0
        for name in order:
            total += {"a": 1 / 4, "b": 1 / 6, "c": 1 / 12}[name]
        items = merge({name: sources[name] for name in order}).items[0].tolist()
        assert (items.index(10) < items.index(20)) == (total == 0.5), (order, total)
        outcomes.add(total == 0.5)
    assert outcomes == {True, False}  # both roundings occur among the orders


@pytest.mark.gpu
def test_merge_on_cuda_equals_the_cpu():
    """Many sources with overlapping lists: the same items, order and features on CUDA as on the CPU."""
    gen = torch.Generator().manual_seed(0)
    sources = {}
    for j in range(5):
        k = 10 + 10 * j
        items = torch.stack([torch.randperm(60, generator=gen)[:k] + 2 for _ in range(128)])
        sources[f"s{j}"] = Retrieved(items, torch.randn(128, k, generator=gen))
    cpu = merge(sources)
    gpu = merge({n: Retrieved(r.items.cuda(), r.scores.cuda()) for n, r in sources.items()})
    assert torch.equal(gpu.items.cpu(), cpu.items)
    for name, value in cpu.features.items():
        assert torch.equal(gpu.features[name].cpu(), value), name


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


def test_compact_of_rows_already_filled_from_the_front_equals_the_stable_reordering():
    """Rows whose filled slots lead (as `merge` lays them: cut or padded, not reordered) and rows with gaps give the
    reordering's items, features and scores: empty rows, no filled slot at all, a width below, at and above the
    filled one, no columns, no rows."""
    import torch.nn.functional as F

    def reordered(c: Candidates, width: int | None) -> Candidates:  # the plain stable reordering, every time
        filled = max(int(c.valid.sum(dim=1).max()) if len(c.items) else 0, 1)
        order = torch.argsort((~c.valid).to(torch.int8), dim=1, stable=True)[:, : filled if width is None else min(filled, width)]
        pad = 0 if width is None else width - order.shape[1]
        pick = lambda t: F.pad(t.gather(-1, order.expand(*t.shape[:-2], *order.shape)), (0, pad))  # noqa: E731
        return Candidates(pick(c.items), {n: pick(v) for n, v in c.features.items()}, pick(c.scores))

    g = torch.Generator().manual_seed(0)
    items = torch.randint(2, 50, (6, 7), generator=g)
    lead = torch.arange(7) < torch.tensor([7, 3, 0, 1, 5, 0]).unsqueeze(1)  # filled from the front
    gaps = torch.rand(6, 7, generator=g) < 0.5
    for mask in (lead, gaps, torch.zeros(6, 7, dtype=torch.bool), lead[:0], lead[:, :0]):
        ids = torch.where(mask, items[: mask.shape[0], : mask.shape[1]], 0)
        c = Candidates(ids, {"x": torch.rand(ids.shape, generator=g), "y": torch.rand(ids.shape, generator=g)},
                       torch.rand(ids.shape, generator=g).masked_fill(~mask, float("-inf")))
        for width in (None, 1, 4, 7, 9):
            got, want = c.compact(width), reordered(c, width)
            assert torch.equal(got.items, want.items) and torch.equal(got.scores, want.scores)
            assert all(torch.equal(got.features[n], want.features[n]) for n in ("x", "y"))


def test_top_k_sparse_ranks_each_rows_entries_ties_to_the_lower_id_and_pads_with_empty_slots():
    # row 0: items 2 (0.5), 3 (0.7), 6 (0.5); row 1: nothing; row 2: item 4 (0.25); width V = 8
    keys, values = np.array([2, 3, 6, 20]), np.array([0.5, 0.7, 0.5, 0.25], dtype=np.float32)
    top = top_k_sparse(keys, values, 3, 8, 3)
    assert top.items.tolist() == [[3, 2, 6], [0, 0, 0], [4, 0, 0]]
    inf = float("-inf")
    assert top.scores.tolist() == [[pytest.approx(0.7), 0.5, 0.5], [inf] * 3, [0.25, inf, inf]]
    assert top_k_sparse(keys, values, 3, 8, 1).items.tolist() == [[3], [0], [4]]
    assert lookup_sparse(keys, values, np.array([[0, 0], [2, 1]]), np.array([[6, 4], [4, 4]]), 8).tolist() == [[0.5, 0.0], [0.25, 0.0]]


def test_stacked_columns_are_made_once_per_layout():
    """Each stacked column's source and 1-based rank there, made once for each layout of the sources' widths."""
    from sessrec.pipeline.candidates import stacked_columns

    source, rank = stacked_columns((2, 0, 3), torch.device("cpu"))
    assert source.tolist() == [0, 0, 2, 2, 2] and rank.tolist() == [1, 2, 1, 2, 3]
    assert stacked_columns((2, 0, 3), torch.device("cpu"))[0] is source


def test_lookup_sparse_takes_one_row_per_line_and_gives_float32():
    """Rows of shape (B, 1) name each line's row (as the retrievers pass them); float64 values come back as float32,
    0 at ids < 2 and where the matrix holds no entry."""
    keys, values = np.array([1, 2, 3, 6, 20]), np.array([9.0, 0.5, 0.1, 0.5, 0.25])
    out = lookup_sparse(keys, values, np.array([[0], [2]]), np.array([[6, 3, 1, 5], [4, 4, 0, 7]]), 8)
    assert out.dtype == np.float32 and out.tolist() == [[0.5, np.float32(0.1), 0.0, 0.0], [0.25, 0.25, 0.0, 0.0]]
    assert lookup_sparse(keys[:0], values[:0], np.array([[0]]), np.array([[6, 3]]), 8).tolist() == [[0.0, 0.0]]



def test_top_k_sparse_is_a_stable_sort_of_each_dense_row_on_many_ties():
    """Rows of many entries (only those at or above the k-th highest are ranked) against a stable argsort of
    each dense row: the same items and scores, ties to the lower id."""
    rng = np.random.default_rng(5)
    for _ in range(100):
        rows, width, k = int(rng.integers(1, 6)), int(rng.integers(4, 40)), int(rng.integers(1, 8))
        dense = rng.integers(0, 4, (rows, width)).astype(np.float32) * 0.5
        keys = np.flatnonzero(dense.reshape(-1) > 0)
        top = top_k_sparse(keys, dense.reshape(-1)[keys], rows, width, k)
        for r in range(rows):
            order = [c for c in np.argsort(-dense[r], kind="stable") if dense[r, c] > 0][:k]
            assert top.items[r].tolist() == order + [0] * (k - len(order))
            assert top.scores[r, : len(order)].tolist() == dense[r, order].tolist()

def test_list_metrics_count_ties_against_the_target():
    from sessrec.pipeline_training.fitting import list_metrics

    items = torch.tensor([[4, 7, 9, 5], [4, 7, 9, 5], [4, 7, 9, 5], [4, 7, 0, 0]])
    scores = torch.tensor([[3.0, 2.0, 2.0, 1.0], [3.0, 2.0, 1.5, 1.0], [3.0, 2.0, 1.5, 1.5], [3.0, 2.0, -1, -1]])
    targets = torch.tensor([7, 9, 9, 7])
    out = list_metrics(items, scores, targets, ks=[1, 3])
    # ranks: 3 (7 ties with 9), 3, miss (9 ties with the full list's last entry), 2 (a short list: nothing unlisted)
    assert out["recall@1"] == 0 and out["recall@3"] == 3
    assert out["mrr@3"] == pytest.approx(1 / 3 + 1 / 3 + 1 / 2)


def test_lookup_sparse_searching_the_entries_among_the_wanted_keys_equals_the_plain_search(monkeypatch):
    """Both directions of the search give the plain lookup's values: keys wanted twice, ids < 2, rows of the shape of
    the columns or one per line, float64 values, more entries than wanted keys and fewer."""
    from sessrec.pipeline.retrieval import retriever

    monkeypatch.setattr(retriever, "REVERSED_LOOKUP", (1, 4))  # from one wanted key on, as a batch's are

    def plain(keys, values, rows, cols, width):
        at = np.minimum(np.searchsorted(keys, rows * width + cols), len(keys) - 1)
        return np.where((keys[at] == rows * width + cols) & (cols >= 2), values[at], 0).astype(np.float32)

    rng = np.random.default_rng(0)
    for entries, dtype in ((5, np.float32), (40, np.float64), (400, np.float32)):
        keys = np.sort(rng.choice(6 * 100, entries, replace=False))
        values = rng.random(entries).astype(dtype)
        for rows in (np.arange(6)[:, None], rng.integers(0, 6, (6, 9))):
            cols = rng.integers(0, 100, (6, 9))
            cols[:, 4] = cols[:, 2]  # wanted twice
            got = lookup_sparse(keys, values, rows, cols, 100)
            assert got.dtype == np.float32 and np.array_equal(got, plain(keys, values, rows, cols, 100))
            assert (got != 0).any() or entries == 5
    assert retriever.REVERSED_LOOKUP[1] * 6 * 9 < 400  # the last case searched each wanted key among the entries
