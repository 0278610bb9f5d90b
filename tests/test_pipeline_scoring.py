"""The rankers' own parts on tiny hand-made candidate matrices: the DLRM's id rows (an unseen row for
items and crosses the training rows do not hold), its dense scaling, its saved state, and the blend.

Shape letters: B sessions, K candidates, F dense features.
"""

from __future__ import annotations

import dataclasses
import math
from statistics import NormalDist

import numpy as np
import pytest
import torch

from sessrec.embeddings import SparseFeatures
from sessrec.pipeline.candidate_features import RankingInputs
from sessrec.pipeline.scoring import (
    BlendScorer,
    DLRMScorer,
    GBDTScorer,
    InputRows,
    Scorer,
    early_stopping_split,
    rank_gauss,
)
from sessrec.pipeline.scoring.blend_scorer import standardised
from sessrec.pipeline.scoring.dlrm_scorer import (
    PART_SESSIONS,
    IdRows,
    RankGauss,
    session_relative,
)
from sessrec.pipeline.scoring.scorer import true_positions
from sessrec.saved.registry import config_of, instantiate

torch.set_num_threads(1)

B, K = 120, 5
SEEN = (3, 4, 5, 6, 7)  # the item ids of the training rows
VOCABULARY, BUCKETS = 20, 64


def training_rows(seed: int = 0) -> tuple[RankingInputs, torch.Tensor]:
    """B sessions of K candidates drawn from `SEEN`; the positive is the candidate of the largest first feature."""
    g = torch.Generator().manual_seed(seed)
    dense = torch.randn(B, K, 2, generator=g)
    items = torch.tensor(SEEN)[torch.randint(0, len(SEEN), (B, K), generator=g)]
    last = torch.tensor(SEEN)[torch.randint(0, len(SEEN), (B, 1), generator=g)].expand(B, K)
    cross = (items * 7 + last) % BUCKETS
    labels = torch.zeros(B, K)
    labels[torch.arange(B), dense[..., 0].argmax(dim=1)] = 1
    cardinality = {"item": VOCABULARY, "last_item": VOCABULARY, "cross": BUCKETS}
    inputs = RankingInputs(dense, {"item": items, "last_item": last, "cross": cross}, torch.ones(B, K, dtype=torch.bool),
                           ["a", "b"], cardinality=cardinality)
    return inputs, labels


def one_session(items: list[int], last: int, cross: list[int] | None = None) -> RankingInputs:
    """One session whose candidates have identical dense features: only their ids tell them apart."""
    k = len(items)
    ids = {"item": torch.tensor([items]), "last_item": torch.full((1, k), last),
           "cross": torch.tensor([cross if cross is not None else [0] * k])}
    return RankingInputs(torch.zeros(1, k, 2), ids, torch.ones(1, k, dtype=torch.bool), ["a", "b"],
                         cardinality={"item": VOCABULARY, "last_item": VOCABULARY, "cross": BUCKETS})


@pytest.fixture(scope="module")
def fitted() -> tuple[DLRMScorer, RankingInputs, torch.Tensor]:
    inputs, labels = training_rows()
    return DLRMScorer(max_epochs=2, seed=0).fit(inputs, labels), inputs, labels


# -------------------------------------------------------------------------------------- id rows
def test_id_rows_map_every_id_not_kept_to_row_zero() -> None:
    rows = IdRows.fit(torch.tensor([4, 9, 4, 2, 9, 9]), vocabulary=12, min_count=2)
    assert rows.kept.tolist() == [4, 9] and rows.size == 3
    assert rows(torch.tensor([9, 4, 2, 0, 11, 15])).tolist() == [2, 1, 0, 0, 0, 0]  # 2: seen once; 15: past the vocabulary
    with pytest.raises(ValueError, match=r"kept ids must lie in \[0, 5\)"):
        IdRows(torch.tensor([1, 7]), vocabulary=5)


def test_an_item_never_in_the_training_rows_gets_the_unseen_row_and_a_seen_one_keeps_its_own(fitted) -> None:
    scorer, _, _ = fitted
    item_rows = scorer.rows["item"]
    assert item_rows.vocabulary == VOCABULARY and item_rows.kept.tolist() == list(SEEN)  # sized from the vocabulary
    assert item_rows(torch.tensor([3, 7, 12, 19])).tolist() == [1, 5, 0, 0]
    # candidates 12 and 19 were never in the training rows: the same (unseen) row, hence the same score;
    # the largest seen id (7) keeps its own row, where a table sized from the training rows would put 19 on it
    scores = scorer.score(one_session([5, 7, 12, 19], last=4))[0]
    assert scores[2] == scores[3]
    assert len({float(scores[0]), float(scores[1]), float(scores[2])}) == 3
    table = scorer.network.sparse_arch.table_weight("item")
    assert table.shape[0] == len(SEEN) + 1 and not torch.equal(table[0], table[5])
    # an unseen last item too: 15 and 16 score alike
    assert torch.equal(scorer.score(one_session([5, 6], last=15)), scorer.score(one_session([5, 6], last=16)))


def test_scores_of_the_valid_slots_equal_the_network_over_the_whole_grid(fitted) -> None:
    """`score` runs the network on the valid slots only; the same network over every slot of the padded
    grid, masked, gives the same scores within 1e-6."""
    scorer, inputs, _ = fitted
    valid = inputs.valid.clone()
    valid[0, 3:], valid[2, 1:] = False, False
    part = RankingInputs(inputs.dense, inputs.sparse, valid, inputs.names, cardinality=inputs.cardinality)
    with torch.no_grad():
        grid = torch.zeros(*valid.shape, scorer.num_dense * 3)
        grid[valid] = scorer._dense(part)  # (M, G) scaled inputs of the valid slots, row-major
        ids = scorer._ids({name: v.reshape(-1) for name, v in part.sparse.items()})
        whole = scorer.network(grid.reshape(-1, grid.shape[2]), SparseFeatures.from_dense(ids)).reshape(valid.shape)
    scores = scorer.score(part)
    assert torch.equal(scores.isinf(), ~valid)
    torch.testing.assert_close(scores[valid], whole[valid], rtol=0, atol=1e-6)


def test_a_batch_of_several_parts_scores_each_session_as_it_scores_alone(fitted) -> None:
    """`score` scales and scores `PART_SESSIONS` sessions at a time on their valid slots: a batch of several
    parts, with empty slots, gives each session the scores it gets alone, within 1e-6 (the matrix products'
    rounding at other row counts)."""
    scorer, inputs, _ = fitted
    valid = inputs.valid.clone()
    valid[::7, 2:], valid[3, 1:] = False, False
    assert len(valid) > 2 * PART_SESSIONS
    batch = RankingInputs(inputs.dense, inputs.sparse, valid, inputs.names, cardinality=inputs.cardinality)
    alone = torch.cat([scorer.score(RankingInputs(inputs.dense[i : i + 1], {name: ids[i : i + 1] for name, ids in inputs.sparse.items()},
                                                  valid[i : i + 1], inputs.names, cardinality=inputs.cardinality))
                       for i in range(len(valid))])
    scores = scorer.score(batch)
    assert torch.equal(scores.isinf(), ~valid) and torch.equal(alone.isinf(), ~valid)
    torch.testing.assert_close(scores[valid], alone[valid], rtol=0, atol=1e-6)
    assert not torch.equal(scores[0, :2], scores[1, :2])


def test_a_cross_never_in_the_training_rows_gets_the_unseen_row(fitted) -> None:
    scorer, inputs, _ = fitted
    seen = set(inputs.sparse["cross"].unique().tolist())
    unseen = [c for c in range(BUCKETS) if c not in seen][:2]
    kept = max(seen)
    assert scorer.rows["cross"](torch.tensor([*unseen, kept])).tolist() == [0, 0, len(seen)]
    scores = scorer.score(one_session([5, 5, 5], last=4, cross=[*unseen, kept]))[0].double()
    # the same row, hence the same score up to the matrix product's rounding at another row position
    assert abs(scores[0] - scores[1]) <= 1e-6 * abs(scores[0]) and abs(scores[1] - scores[2]) > 1e-4 * abs(scores[1])


def test_ids_seen_fewer_than_min_count_times_share_the_unseen_row() -> None:
    inputs, labels = training_rows()
    inputs.sparse["item"][0, 0] = 11  # once only
    scorer = DLRMScorer(max_epochs=1, min_count=2).fit(inputs, labels)
    assert 11 not in scorer.rows["item"].kept.tolist() and scorer.rows["item"](torch.tensor([11])).tolist() == [0]
    assert scorer.rows["item"].kept.tolist() == list(SEEN)


def test_ids_outside_the_cardinality_are_refused_at_fit() -> None:
    inputs, labels = training_rows()
    inputs.sparse["item"][0, 0] = VOCABULARY
    with pytest.raises(ValueError, match=r"table 'item': ids 3\.\.20 lie outside its cardinality 20"):
        DLRMScorer(max_epochs=1).fit(inputs, labels)


def test_without_a_cardinality_the_tables_cover_the_training_ids_and_larger_ids_are_unseen() -> None:
    inputs, labels = training_rows()
    inputs.cardinality = {}
    scorer = DLRMScorer(max_epochs=1).fit(inputs, labels)
    assert scorer.rows["item"].vocabulary == max(SEEN) + 1
    assert scorer.rows["item"](torch.tensor([7, 8, 500])).tolist() == [5, 0, 0]


# ------------------------------------------------------------------------------- dense scaling
def test_rank_gauss_takes_interpolated_ranks_and_the_middle_of_tied_runs() -> None:
    quantiles = torch.tensor([[0.0, 0.0, 0.0, 1.0, 2.0]])  # Q = 5: ranks 0..4 -> u = rank / 4
    out = RankGauss(quantiles)(torch.tensor([[0.0], [1.5], [1.0], [9.0], [-3.0]]))
    # 0: the run of ranks 0..2 -> 1; 1.5: between ranks 3 and 4; 9 and -3: the extremes, clipped to (0.1, 0.9)
    u = torch.tensor([1 / 4, 3.5 / 4, 3 / 4, 0.9, 0.1])
    normal = torch.tensor([NormalDist().inv_cdf(v) for v in u.tolist()])
    assert torch.allclose(out.squeeze(1), normal, atol=1e-5)


@pytest.mark.parametrize("q", [16, 13, 2])
def test_rank_gauss_matches_two_binary_searches(q: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The branchless search and the table give what a left and a right `searchsorted` of each value and
    the interpolation give: the same scores, bit for bit, on values that hit runs, single quantiles and
    neither, below and above all quantiles, for Q a power of two and not, in one pass or in blocks of
    rows; NaN stays NaN."""
    gen = torch.Generator().manual_seed(0)
    quantiles = torch.sort(torch.randint(0, 6, (4, q), generator=gen).float() / 2, dim=1).values  # runs of equal values
    x = torch.cat([torch.randint(-2, 8, (50, 4), generator=gen).float() / 2, torch.randn(50, 4, generator=gen) * 3])
    flat, q = x.T.contiguous(), quantiles.shape[1]
    first, past = torch.searchsorted(quantiles, flat), torch.searchsorted(quantiles, flat, right=True)
    upper = first.clamp(1, q - 1)
    lo, hi = quantiles.gather(1, upper - 1), quantiles.gather(1, upper)
    between = (upper - 1 + ((flat - lo) / (hi - lo).clamp(min=1e-12)).clamp(0, 1)) / (q - 1)
    u = torch.where(past > first, (first + past - 1).double() / (2 * (q - 1)), between.double()).clamp(0.5 / q, 1 - 0.5 / q)
    expected = (math.sqrt(2.0) * torch.erfinv(2 * u - 1)).float().T
    assert (past > first).any() and (past == first).any()
    scale = RankGauss(quantiles)
    assert torch.equal(scale(x), expected)
    assert torch.equal(scale(x.reshape(4, 25, 4)), expected.reshape(4, 25, 4))
    assert scale(torch.tensor([[float("nan")] * 4])).isnan().all()
    monkeypatch.setattr(rank_gauss, "BLOCK_VALUES", 12)  # blocks of 3 rows, the last one a single row
    assert torch.equal(scale(x), expected)
    assert torch.equal(scale(x.reshape(4, 25, 4)), expected.reshape(4, 25, 4))


def searched_scores(quantiles: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """(N, G) scores of `RankGauss` written out with a left and a right `searchsorted` of each value."""
    flat, q = x.T.contiguous(), quantiles.shape[1]
    first, past = torch.searchsorted(quantiles, flat), torch.searchsorted(quantiles, flat, right=True)
    upper = first.clamp(1, q - 1)
    lo, hi = quantiles.gather(1, upper - 1), quantiles.gather(1, upper)
    between = (((flat - lo) / (hi - lo).clamp(min=1e-12)).clamp(0, 1) + (upper - 1)) / (q - 1)
    u = torch.where(past > first, (first + past - 1).double() / (2 * (q - 1)), between.double()).clamp(0.5 / q, 1 - 0.5 / q)
    return (math.sqrt(2.0) * torch.erfinv(2 * u - 1)).float().T


def adversarial_columns() -> tuple[torch.Tensor, torch.Tensor]:
    """(G, 16) ascending quantiles that are hard for a bucket table (runs, one or two distinct values, infinities,
    neighbouring floats, -0.0 beside 0.0, subnormals, the float32 extremes, negatives only) and (N, G) values: every
    quantile, its neighbouring floats, midpoints, infinities, -0.0, values beyond the extremes and random ones."""
    tiny, big = 1.4e-45, 3.4028235e38
    up = [float(np.nextafter(np.float32(1.0), np.float32(2.0)) - 1.0) * k + 1.0 for k in range(8)]
    columns = [
        [0, 0, 0, 0, 1, 1, 2, 3, 3, 3, 5, 8, 8, 13, 21, 34],
        [7.0] * 16,
        [0.0] * 10 + [1.0] * 6,
        [-math.inf, -math.inf, -1, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, math.inf, math.inf],
        [0.5, 0.75, 0.99999994, *up, 1.0000019, 1.5, 2.0, 2.0, 3.0],
        [-tiny * 3, -tiny, -0.0, -0.0, 0.0, 0.0, tiny, tiny * 2, 1e-38, 1e-30, 1e-10, 1e-3, 1.0, 1.0, 2.0, 3.0],
        [-big, -1e30, -1e10, -1e3, -1, -1e-3, 0, 1e-3, 1, 1e3, 1e10, 1e20, 1e30, 1e37, 1e38, big],
        [-100.0, -50, -50, -20, -10, -9, -8, -7, -5, -3, -2, -2, -1, -1, -0.5, -0.0],
    ]
    gen = torch.Generator().manual_seed(3)
    columns.append(torch.sort(torch.randn(16, generator=gen) * 1e4).values.tolist())
    quantiles = torch.tensor(columns, dtype=torch.float32)
    specials = torch.tensor([math.inf, -math.inf, math.nan, -0.0, 0.0, tiny, -tiny, big, -big, 1e38, -1e38, 1e-40])
    parts = []
    for row in quantiles:
        up_, down = torch.nextafter(row, torch.tensor(math.inf)), torch.nextafter(row, torch.tensor(-math.inf))
        middle = (row[1:] / 2 + row[:-1] / 2)
        parts.append(torch.cat([row, up_, down, middle, specials, torch.randn(60, generator=gen) * row.abs().clamp(max=1e30).max()]))
    return quantiles, torch.stack(parts, dim=1)  # (N, G)


def same_floats(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same float32 bit patterns, NaN in the same places."""
    nan = a.isnan()
    return torch.equal(nan, b.isnan()) and torch.equal(a[~nan].view(torch.int32), b[~nan].view(torch.int32))


@pytest.mark.parametrize("entries", [rank_gauss.BUCKET_ENTRIES, 64])
def test_rank_gauss_bucket_tables_give_the_searched_scores_on_adversarial_columns(
        entries: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The host path (bucket tables, then a search only where a bucket holds several distinct quantiles) and the
    binary search give the scores of two `searchsorted`, bit for bit, on columns with runs, one or two distinct
    quantiles, infinities, neighbouring floats, -0.0 and subnormals; NaN gives NaN. With 64 table entries for 9
    features every bucket is coarse (shift 31 or 30) and the search runs over many distinct quantiles."""
    monkeypatch.setattr(rank_gauss, "BUCKET_ENTRIES", entries)
    quantiles, x = adversarial_columns()
    scale = RankGauss(quantiles)
    assert scale.host is not None and scale.host.table.numel() <= max(entries, 2 * len(quantiles))
    expected = searched_scores(quantiles, x)
    nan = x.isnan()
    expected[nan] = math.nan  # two searches of NaN place it anywhere; the scaling gives NaN
    assert same_floats(scale(x), expected)
    assert same_floats(scale(x[:3]), expected[:3])  # one block of a few rows
    scale.host = None  # the binary search alone
    assert same_floats(scale(x), expected)


def test_rank_gauss_on_the_host_gives_the_binary_searchs_floats_on_many_quantiles() -> None:
    """256 quantiles a feature (a fitted ranker's count), drawn from counts, heavy tails and flags: the bucket tables
    and the binary search give the same floats on values drawn the same way and on the quantiles themselves."""
    gen = torch.Generator().manual_seed(5)
    draws = torch.cat([torch.poisson(torch.full((4000, 4), 3.0), generator=gen), torch.randn(4000, 4, generator=gen).exp() * 100,
                       (torch.rand(4000, 2, generator=gen) < 0.1).float(), torch.randn(4000, 4, generator=gen)], dim=1)
    levels = torch.linspace(0, 1, 256, dtype=torch.float64)
    quantiles = torch.quantile(draws.double(), levels, dim=0).T.float().contiguous()
    scale = RankGauss(quantiles)
    x = torch.cat([draws[:1000] * 1.01, quantiles.T, -draws[:50]])
    host = scale(x)
    scale.host = None
    assert same_floats(host, scale(x))
    assert same_floats(host, searched_scores(quantiles, x))


def test_true_positions_are_the_flattened_positions_of_the_true_entries_in_order() -> None:
    """numpy's `flatnonzero` on the host gives what ``torch.nonzero`` of the flattened mask gives, also for a
    transposed (non-contiguous) mask and an empty one; an empty input is scaled to an empty output."""
    mask = torch.rand(37, 11, generator=torch.Generator().manual_seed(0)) < 0.4
    for each in (mask, mask.T, mask[:0], torch.zeros(5, dtype=torch.bool)):
        found = true_positions(each)
        assert found.dtype == torch.int64 and torch.equal(found, each.reshape(-1).nonzero().squeeze(1))
    assert true_positions(torch.tensor([[False, True], [True, True]])).tolist() == [1, 2, 3]
    assert RankGauss(torch.linspace(-1.0, 1.0, 5).repeat(3, 1))(torch.zeros(0, 3)).shape == (0, 3)


@pytest.mark.parametrize("q", [16, 13, 2])
def test_rank_gauss_gives_infinities_the_extreme_scores(q: int) -> None:
    """+inf takes the top score and -inf the bottom one (the ranks clipped to 1 - 0.5 / Q and 0.5 / Q), also
    for Q not a power of two, where +inf meets the search's +inf padding past the last quantile."""
    scale = RankGauss(torch.linspace(-1.0, 1.0, q).repeat(2, 1))
    out = scale(torch.tensor([[math.inf, -math.inf], [-math.inf, math.inf]]))
    top, bottom = NormalDist().inv_cdf(1 - 0.5 / q), NormalDist().inv_cdf(0.5 / q)
    assert out.reshape(-1).tolist() == pytest.approx([top, bottom, bottom, top], abs=1e-6)


def test_session_relative_features_subtract_the_best_and_the_mean_valid_candidate() -> None:
    dense = torch.tensor([[[1.0], [3.0], [100.0]]])
    valid = torch.tensor([[True, True, False]])
    assert session_relative(dense, valid)[0].tolist() == [[1.0, -2.0, -1.0], [3.0, 0.0, 1.0], [100.0, 97.0, 98.0]]


def test_a_feature_every_candidate_shares_is_exactly_its_mean_whatever_the_order() -> None:
    """Summed in float32, 7 x 0.1 / 7 is not 0.1: the difference was rounding noise that the rank-Gauss scaling spreads."""
    shared = torch.tensor([0.1, math.log1p(13.0), 1 / 3]).view(3, 1, 1).expand(3, 9, 1)
    dense = torch.cat([shared, torch.randn(3, 9, 1, generator=torch.Generator().manual_seed(0))], dim=2)
    valid = torch.ones(3, 9, dtype=torch.bool)
    valid[:, 7:] = False  # 7 candidates
    out = session_relative(dense, valid)
    assert out[..., 2][valid].eq(0).all() and out[..., 4][valid].eq(0).all()  # minus the best, minus the mean
    order = torch.tensor([4, 8, 0, 6, 2, 7, 1, 5, 3])
    assert torch.equal(session_relative(dense[:, order], valid[:, order]), out[:, order])


def test_scores_do_not_depend_on_the_order_of_the_candidates() -> None:
    """A feature shared by a session's candidates (its length) beside per-candidate ones, slots left empty."""
    g = torch.Generator().manual_seed(3)
    b, k = 120, 30
    length = torch.log1p(torch.randint(1, 50, (b, 1, 1), generator=g).float()).expand(b, k, 1)
    dense = torch.cat([torch.randn(b, k, 2, generator=g), length], dim=2)
    valid = torch.rand(b, k, generator=g) < 0.8
    valid[:, 0] = True
    items = torch.randint(3, 8, (b, k), generator=g)
    last = torch.randint(3, 8, (b, 1), generator=g).expand(b, k)
    labels = torch.zeros(b, k)
    labels[torch.arange(b), dense[..., 0].masked_fill(~valid, -9).argmax(dim=1)] = 1
    inputs = RankingInputs(dense, {"item": items, "last_item": last, "cross": (items * 7 + last) % BUCKETS}, valid,
                           ["a", "b", "length"], cardinality={"item": VOCABULARY, "last_item": VOCABULARY, "cross": BUCKETS})
    scorer = DLRMScorer(max_epochs=2, seed=0).fit(inputs, labels)
    order = torch.randperm(k, generator=g)
    moved = RankingInputs(dense[:, order], {n: ids[:, order] for n, ids in inputs.sparse.items()}, valid[:, order],
                          inputs.names, cardinality=inputs.cardinality)
    scores, back = scorer.score(inputs), torch.empty(b, k)
    back[:, order] = scorer.score(moved)
    assert torch.allclose(back[valid], scores[valid], rtol=0, atol=1e-6)  # the network's own last bits only


# ---------------------------------------------------------------------------------------- saving
@pytest.mark.parametrize("scaling", ["rank_gauss", "standard"])
def test_state_dict_round_trip_scores_identically(scaling: str) -> None:
    inputs, labels = training_rows()
    scorer = DLRMScorer(max_epochs=2, scaling=scaling, seed=1).fit(inputs, labels)
    state = scorer.state_dict()
    assert sorted(state["ids"]) == ["cross", "item"] and state["vocabulary"] == {"item": VOCABULARY, "cross": BUCKETS}
    loaded = DLRMScorer(max_epochs=2, scaling=scaling, seed=1).load_state_dict(state)
    assert torch.equal(loaded.score(inputs), scorer.score(inputs))
    probe = one_session([5, 12, 19], last=4)
    assert torch.equal(loaded.score(probe), scorer.score(probe))


def test_a_state_saved_without_id_rows_is_refused_in_one_line(fitted) -> None:
    scorer, _, _ = fitted
    old = {k: v for k, v in scorer.state_dict().items() if k not in ("ids", "vocabulary", "quantiles")}
    old |= {"mean": np.zeros(6, np.float32), "std": np.ones(6, np.float32)}  # the earlier layout: standardisation only
    with pytest.raises(ValueError, match="no id rows .* fit the ranker again"):
        DLRMScorer(max_epochs=2).load_state_dict(old)
    with pytest.raises(ValueError, match="scaling does not match"):
        DLRMScorer(max_epochs=2, scaling="standard").load_state_dict(scorer.state_dict())
    with pytest.raises(ValueError, match="which columns its network reads .* fit the ranker again"):
        DLRMScorer(max_epochs=2).load_state_dict({k: v for k, v in scorer.state_dict().items() if k != "columns"})
    for columns in ([0, 1, 2, 3, 6], [0, 0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 9], []):
        with pytest.raises(ValueError, match="columns must be ascending indices of its 6 inputs|scales 6 columns and reads 5"):
            DLRMScorer(max_epochs=2).load_state_dict({**scorer.state_dict(), "columns": np.array(columns)})


@pytest.mark.parametrize("scaling", ["rank_gauss", "standard"])
def test_a_column_with_one_value_among_the_training_rows_is_not_an_input(scaling: str) -> None:
    """A third feature that every row shares: it, and its differences from the session's best and mean (0 for any
    feature a session's candidates share), are left out; the network reads the 6 others, whatever its value later."""
    inputs, labels = training_rows()
    shared = RankingInputs(torch.cat([inputs.dense, torch.full((B, K, 1), 5.0)], dim=2), inputs.sparse, inputs.valid,
                           ["a", "b", "c"], cardinality=inputs.cardinality)
    scorer = DLRMScorer(max_epochs=2, scaling=scaling, seed=1).fit(shared, labels)
    assert scorer.columns.tolist() == [0, 1, 3, 4, 6, 7]  # of a, b, c, a - best, b - best, c - best, a - mean, ...
    assert scorer.network.dense_arch.mlp[0].in_features == 6
    assert torch.equal(scorer.score(shared), scorer.score(RankingInputs(
        torch.cat([inputs.dense, torch.full((B, K, 1), -3.0)], dim=2), inputs.sparse, inputs.valid, ["a", "b", "c"])))
    loaded = DLRMScorer(max_epochs=2, scaling=scaling, seed=1).load_state_dict(scorer.state_dict())
    assert loaded.columns.tolist() == [0, 1, 3, 4, 6, 7] and torch.equal(loaded.score(shared), scorer.score(shared))
    assert len(scorer.state_dict()["quantiles" if scaling == "rank_gauss" else "mean"]) == 6


# ------------------------------------------------------------------------------------------ blend
class FixedScorer(Scorer):
    """Scores each candidate by one dense feature times a factor (a stand-in ranker)."""

    def __init__(self, column: int = 0, factor: float = 1.0) -> None:
        self.column, self.factor = column, factor
        self.fitted = False

    def fit(self, inputs: RankingInputs, labels: torch.Tensor) -> FixedScorer:
        self.fitted = True
        return self

    def score(self, inputs: RankingInputs) -> torch.Tensor:
        return (inputs.dense[..., self.column] * self.factor).masked_fill(~inputs.valid, float("-inf"))

    def state_dict(self) -> dict:
        return {"fitted": self.fitted}

    def load_state_dict(self, state) -> FixedScorer:
        self.fitted = bool(state["fitted"])
        return self


def test_standardised_scores_have_mean_zero_and_unit_spread_per_session() -> None:
    scores = torch.tensor([[1.0, 3.0, float("-inf")], [5.0, 5.0, 5.0]])
    valid = torch.tensor([[True, True, False], [True, True, True]])
    assert standardised(scores, valid).tolist() == [[-1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]


def test_blend_sums_the_members_standardised_scores_with_their_weights() -> None:
    dense = torch.tensor([[[1.0, 0.0], [3.0, 2.0], [2.0, 4.0]]])
    inputs = RankingInputs(dense, {}, torch.ones(1, 3, dtype=torch.bool), ["a", "b"])
    blend = BlendScorer([FixedScorer(0, factor=100.0), FixedScorer(1)], weights=[1.0, 3.0]).fit(inputs, torch.tensor([[0, 1, 0.0]]))
    # member 0: (1, 3, 2) -> (-1.2247, 1.2247, 0); member 1: (0, 2, 4) -> (-1.2247, 0, 1.2247)
    z = math.sqrt(1.5)
    assert torch.allclose(blend.score(inputs), torch.tensor([[-4 * z, z, 3 * z]]), atol=1e-5)
    assert all(s.fitted for s in blend.scorers)
    for weights in ([1.0, 1.0], [float("nan")], [-1.0], [float("inf")]):
        with pytest.raises(ValueError, match="one finite, non-negative weight per scorer"):
            BlendScorer([FixedScorer()], weights=weights)


class SeenRows(FixedScorer):
    """A `FixedScorer` that keeps the valid slots it was asked to score."""

    def __init__(self, column: int = 0, factor: float = 1.0) -> None:
        super().__init__(column, factor)
        self.asked: list[torch.Tensor] = []

    def score(self, inputs: RankingInputs) -> torch.Tensor:
        self.asked.append(inputs.valid.clone())
        return super().score(inputs)


def test_a_blend_shortlist_scores_the_later_members_on_the_first_members_best_only() -> None:
    first = [[5.0, 1.0, 5.0, 3.0, 0.0], [0.0, 2.0, 4.0, 9.0, 1.0]]  # row 0: a tie at 5, ties go to the earlier slot
    second = [[0.0, 9.0, 4.0, 2.0, 7.0], [3.0, 1.0, 2.0, 8.0, 5.0]]
    valid = torch.tensor([[True] * 5, [True, True, True, True, False]])
    inputs = RankingInputs(torch.tensor([first, second]).permute(1, 2, 0).contiguous(), {}, valid, ["a", "b"])
    members = [SeenRows(0), SeenRows(1)]
    blend = BlendScorer(members, weights=[1.0, 2.0], shortlist=2)
    got = blend.score(inputs)
    assert members[0].asked[0].tolist() == valid.tolist()
    assert members[1].asked[0].tolist() == [[True, False, True, False, False], [False, False, True, True, False]]
    # row 0: slots 0, 2 (first 5, 5 -> z 0, 0; second 0, 4 -> z -1, 1): blend -2, 2; row 1: slots 3, 2 (first 9, 4
    # -> z 1, -1; second 8, 2 -> 1, -1): 3, -3. The rest below the lowest blended score, in the first member's order.
    assert got[0, [2, 0]].tolist() == [2.0, -2.0] and got[1, [3, 2]].tolist() == [3.0, -3.0]
    assert got[0].argsort(descending=True).tolist() == [2, 0, 3, 1, 4]
    assert got[1].argsort(descending=True).tolist()[:4] == [3, 2, 1, 0] and got[1, 4] == float("-inf")
    assert got[0, 3] == -3.0 and got[1, 1] == -4.0  # the best of the rest: one under the lowest blended score
    alone = BlendScorer(members, weights=[1.0, 2.0], shortlist=2).score(
        RankingInputs(inputs.dense[1:], {}, valid[1:], ["a", "b"]))
    assert torch.equal(alone[0], got[1])  # a session's shortlist and scores do not depend on its batch
    everything = BlendScorer(members, weights=[1.0, 2.0], shortlist=5).score(inputs)
    assert torch.equal(everything, BlendScorer(members, weights=[1.0, 2.0]).score(inputs))
    assert members[1].asked[-1].tolist() == valid.tolist()  # a shortlist of every slot is no shortlist
    config = config_of(blend)
    assert config["init_args"]["shortlist"] == 2
    assert instantiate(config, expected=Scorer, source="test").shortlist == 2


@pytest.mark.parametrize("make, message", [
    (lambda: BlendScorer([FixedScorer(), FixedScorer()], shortlist=0), "BlendScorer shortlist must be an integer >= 1, got 0"),
    (lambda: BlendScorer([FixedScorer(), FixedScorer()], shortlist=True), "BlendScorer shortlist must be an integer >= 1, got True"),
    (lambda: BlendScorer([FixedScorer()], shortlist=5), "BlendScorer shortlist needs two or more scorers"),
    (lambda: GBDTScorer(num_leaves=1), "GBDTScorer num_leaves must be an integer >= 2, got 1"),
    (lambda: GBDTScorer(max_rounds=0), "GBDTScorer max_rounds must be an integer >= 1, got 0"),
    (lambda: GBDTScorer(threads=0), "GBDTScorer threads must be an integer >= 1, got 0"),
    (lambda: GBDTScorer(learning_rate=float("nan")), "GBDTScorer learning_rate must be a finite number > 0, got nan"),
    (lambda: GBDTScorer(feature_fraction=1.5), r"GBDTScorer feature_fraction must be a number in \(0, 1\], got 1.5"),
    (lambda: GBDTScorer(stop_fraction=1.0), r"GBDTScorer stop_fraction must be a number in \(0, 1\), got 1.0"),
    (lambda: DLRMScorer(max_epochs=0), "DLRMScorer max_epochs must be an integer >= 1, got 0"),
    (lambda: DLRMScorer(dense_layers=(128, 0)), r"DLRMScorer dense_layers\[1\] must be an integer >= 1, got 0"),
    (lambda: DLRMScorer(interaction="cat"), "DLRMScorer interaction must be 'dot' or 'dcn', got 'cat'"),
    (lambda: DLRMScorer(id_dropout=1.0), r"DLRMScorer id_dropout must be a number in \[0, 1\), got 1.0"),
    (lambda: DLRMScorer(lr=-1e-3), "DLRMScorer lr must be a finite number > 0, got -0.001"),
    (lambda: DLRMScorer(stop_fraction=0), r"DLRMScorer stop_fraction must be a number in \(0, 1\), got 0"),
])
def test_a_ranker_setting_it_cannot_honour_is_refused_when_it_is_built(make, message) -> None:
    with pytest.raises(ValueError, match=f"^{message}"):
        make()


def test_blend_of_dlrm_and_lightgbm_saves_and_loads_through_its_config(fitted) -> None:
    pytest.importorskip("lightgbm")
    _, inputs, labels = fitted
    blend = BlendScorer([DLRMScorer(max_epochs=1), GBDTScorer(max_rounds=5, threads=1, min_data_in_leaf=5)]).fit(inputs, labels)
    config = config_of(blend)
    assert [m["class_path"].rpartition(".")[2] for m in config["init_args"]["scorers"]] == ["DLRMScorer", "GBDTScorer"]
    loaded = instantiate(config, expected=Scorer, source="test").load_state_dict(blend.state_dict())
    assert torch.equal(loaded.score(inputs), blend.score(inputs))
    with pytest.raises(ValueError, match=r"holds members \['0'\], its config 2 scorers"):
        instantiate(config, expected=Scorer, source="test").load_state_dict({"scorers": {"0": {}}})


@pytest.mark.parametrize("shortlist", [None, 3])
def test_the_blends_tree_members_prepare_their_host_rows_once_and_score_as_each_alone(fitted, shortlist, monkeypatch) -> None:
    pytest.importorskip("lightgbm")
    pytest.importorskip("onnxruntime")
    from sessrec.pipeline.scoring.tree_ensemble import TreeEnsemble

    dlrm, inputs, labels = fitted
    trees = [GBDTScorer(max_rounds=8, threads=1, min_data_in_leaf=5, seed=seed).fit(inputs, labels) for seed in (0, 1)]
    assert all(tree.trees is not None for tree in trees)
    blend = BlendScorer([dlrm, *trees], shortlist=shortlist)
    valid = inputs.valid.clone()
    valid[::7, 3:] = False  # sessions with fewer candidates
    inputs = dataclasses.replace(inputs, valid=valid)
    alone, narrowed = [dlrm.score(inputs)], blend.narrow(inputs, dlrm.score(inputs))
    alone += [tree.score(narrowed) for tree in trees]  # each member gathering and preparing its own rows
    prepared = []
    real_rows = TreeEnsemble.rows
    monkeypatch.setattr(TreeEnsemble, "rows", lambda self, x: prepared.append(len(x)) or real_rows(self, x))
    shared = blend.score(inputs)
    assert prepared == [int(narrowed.valid.sum())]  # once for the two tree members
    assert torch.equal(shared, blend.combine(alone, inputs.valid)) and bool(torch.isfinite(shared[valid]).all())


# ------------------------------------------------------------------------------ rows read in chunks
def test_ranker_rows_build_a_chunk_at_a_time_and_concatenate() -> None:
    inputs, _ = training_rows()
    inputs.groups = torch.arange(B) // 3
    asked = []

    class Counted(InputRows):
        def _build(self, rows):
            asked.append(len(rows))
            return super()._build(rows)

    rows = Counted(inputs, chunk=4)
    order = torch.tensor([9, 2, 2, 50, 119, 0, 7, 3, 8, 1])
    got = rows.inputs(order)
    assert asked == [4, 4, 2] and len(rows) == B and rows.names == ["a", "b"]
    assert torch.equal(got.dense, inputs.dense[order]) and torch.equal(got.groups, inputs.groups[order])
    assert all(torch.equal(got.sparse[n], inputs.sparse[n][order]) for n in inputs.sparse)


def test_valid_rows_are_the_valid_slots_of_the_sessions_asked_for_in_that_order() -> None:
    inputs, _ = training_rows()
    inputs.valid = inputs.valid.clone()
    inputs.valid[::4, 3:] = False  # sessions of 5 and of 3 filled slots
    sessions = torch.tensor([5, 1, 2, 8, 40, 41, 4])
    got = InputRows(inputs, chunk=3).valid_rows(sessions)  # three chunks of sessions
    assert got.dtype == np.float32 and got.shape == (29, 2)  # 5 + 5 + 5 + 3 + 3 + 5 + 3 slots
    assert np.array_equal(got[:5], inputs.dense[5, :5].numpy()) and np.array_equal(got[15:18], inputs.dense[8, :3].numpy())
    assert np.array_equal(got, inputs.dense[sessions][inputs.valid[sessions]].numpy())
    assert InputRows(inputs).valid_rows(torch.zeros(0, dtype=torch.long)).shape == (0, 2)


@pytest.mark.parametrize("make", [lambda: GBDTScorer(max_rounds=20, threads=1, min_data_in_leaf=5),
                                  lambda: DLRMScorer(max_epochs=2, batch_sessions=16)], ids=["gbdt", "dlrm"])
def test_a_scorer_fits_alike_on_rows_read_in_chunks(make) -> None:
    inputs, labels = training_rows()
    whole = make().fit(inputs, labels)
    chunked = make().fit(InputRows(inputs, chunk=7), labels)
    test, _ = training_rows(seed=3)
    assert torch.equal(whole.score(test), chunked.score(test))


def test_gbdt_bins_rows_read_in_chunks_as_lightgbm_bins_one_matrix() -> None:
    lgb = pytest.importorskip("lightgbm")
    inputs, labels = training_rows()
    inputs.dense[..., 1] = 0.0
    inputs.dense[:2, :, 1] = 1.0  # set on 10 rows only: a split of leaves of 5 rows can use it, of 20 (LightGBM's default) not
    scorer = GBDTScorer(max_rounds=5, threads=1, min_data_in_leaf=5).fit(InputRows(inputs, chunk=7), labels)
    train, stop = early_stopping_split(labels, scorer.stop_fraction, scorer.seed)
    sets = [lgb.Dataset(inputs.dense[r].reshape(-1, 2).numpy(), labels[r].reshape(-1).numpy(), group=[K] * len(r),
                        feature_name=inputs.names) for r in (train, stop)]
    sets[1].reference = sets[0]
    booster = lgb.train(scorer.params, sets[0], num_boost_round=5, valid_sets=[sets[1]],
                        callbacks=[lgb.early_stopping(scorer.early_stopping, verbose=False)])
    assert scorer.booster.model_to_string() == booster.model_to_string()


def test_scoring_gathers_the_rows_that_training_pools_to_the_same_logits(fitted) -> None:
    """Without autograd `_logits` runs `DLRM.forward_one_id`; with it, the bag path SparseAdam trains: the same floats."""
    scorer, inputs, _ = fitted
    valid = inputs.valid[:8]
    dense = scorer._dense(inputs)[: int(valid.sum())]  # the valid slots row-major: the first 8 sessions' first
    sparse = {name: ids[:8][valid] for name, ids in inputs.sparse.items()}
    with torch.no_grad():
        gathered = scorer._logits(valid, dense, sparse)
    pooled = scorer._logits(valid, dense, sparse).detach()
    assert torch.equal(gathered, pooled) and torch.isfinite(gathered[valid]).all()


@pytest.mark.parametrize("make", [lambda: GBDTScorer(max_rounds=5, threads=1, min_data_in_leaf=5), lambda: DLRMScorer(max_epochs=1)])
def test_rows_without_a_dense_feature_are_refused_in_one_line_naming_the_feature_groups(make) -> None:
    """features.groups: [ids] (or groups without their source) leave the ranker only ids: LightGBM failed on its
    forced splits, the DLRM's rank-Gauss on an empty quantile, neither naming the setting."""
    inputs, labels = training_rows()
    ids_only = RankingInputs(inputs.dense[..., :0], inputs.sparse, inputs.valid, [], cardinality=inputs.cardinality)
    scorer = make()
    if isinstance(scorer, GBDTScorer):
        pytest.importorskip("lightgbm")
    with pytest.raises(ValueError, match=rf"^{type(scorer).__name__} reads the dense features and the ranker's rows "
                                         r"have none: the feature groups switched on \(features.groups\) build none here"):
        scorer.fit(ids_only, labels)
