"""Stage 2 filters and stage 4 ordering rules on hand-built (B, K) candidate matrices.

Vocabulary of these tests: raw ids 10, 20, 30, 40, 50, 60 are model ids 2, 3, 4, 5, 6, 7.
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from sessrec.data.schema import SchemaError
from sessrec.data.vocab import ItemVocab
from sessrec.pipeline.candidates import Candidates, RequestSessions
from sessrec.pipeline.filters import ItemTableFilter, NonProductFilter, SeenItemsFilter
from sessrec.pipeline.ordering import BoostRule, DiversityCap, Ordering, SoftmaxSampling
from sessrec.pipeline.pipeline import join_state, split_state
from sessrec.saved.registry import config_of, instantiate

INF = float("inf")


@pytest.fixture
def vocab() -> ItemVocab:
    return ItemVocab(pa.array([10, 20, 30, 40, 50, 60]), np.array([6, 5, 4, 3, 2, 1]))


def write(tmp_path: Path, name: str = "rules.parquet", **columns: list) -> Path:
    path = tmp_path / name
    pq.write_table(pa.table(columns), path)
    return path


def scored(items: list[list[int]], scores: list[list[float]]) -> Candidates:
    return Candidates(torch.tensor(items), scores=torch.tensor(scores))


def anonymous(b: int) -> RequestSessions:
    return RequestSessions(torch.zeros(b, 1, dtype=torch.long))


def reloaded(stage):
    """The stage rebuilt as a saved pipeline does: from its config, then its state dict (plain values
    through JSON, arrays copied)."""
    plain, arrays = split_state(stage.state_dict())
    rebuilt = instantiate(json.loads(json.dumps(config_of(stage))), expected=type(stage), source="test")
    return rebuilt.load_state_dict(join_state(json.loads(json.dumps(plain)), {k: v.copy() for k, v in arrays.items()}))


# ------------------------------------------------------------------------------------ filters
SESSIONS = RequestSessions(torch.tensor([[0, 2, 3, 4], [5, 5, 6, 2]]))
CANDIDATES = Candidates(
    torch.tensor([[2, 3, 4, 5, 0], [2, 6, 7, 3, 5]]),
    features={"f": torch.arange(10.0).reshape(2, 5)},
    scores=torch.tensor([[1.0, 1.0, 1.0, 1.0, -INF], [1.0] * 5]),
)


@pytest.mark.parametrize(
    ("window", "expected"),
    [
        (None, [[0, 0, 0, 5, 0], [0, 0, 7, 3, 0]]),
        (1, [[2, 3, 0, 5, 0], [0, 6, 7, 3, 5]]),
        (2, [[2, 0, 0, 5, 0], [0, 0, 7, 3, 5]]),
    ],
)
def test_seen_items_window_or_whole_session(window: int | None, expected: list[list[int]]) -> None:
    stage = SeenItemsFilter(window=window)
    for f in (stage, reloaded(stage)):
        out = f.apply(SESSIONS, CANDIDATES)
        assert out.items.tolist() == expected
        assert out.scores.tolist() == [[1.0 if i else -INF for i in row] for row in expected]
        assert torch.equal(out.features["f"], CANDIDATES.features["f"])


def test_seen_items_rejects_empty_window() -> None:
    with pytest.raises(ValueError, match="window must be an integer >= 1"):
        SeenItemsFilter(window=0)


def test_non_product_filter_removes_specials_virtual_and_out_of_range() -> None:
    candidates = Candidates(torch.tensor([[0, 1, 2, 5, 6, 7, 8, 9], [3, 4, 1, 0, 7, 2, 5, 6]]))
    stage = NonProductFilter(num_items=8, num_virtual=2)  # products 2..5, virtual 6, 7
    for f in (stage, reloaded(stage)):
        out = f.apply(anonymous(2), candidates)
        assert out.items.tolist() == [[0, 0, 2, 5, 0, 0, 0, 0], [3, 4, 0, 0, 0, 2, 5, 0]]
    assert NonProductFilter(num_items=8).apply(anonymous(2), candidates).items[0].tolist() == [
        0,
        0,
        2,
        5,
        6,
        7,
        0,
        0,
    ]
    with pytest.raises(ValueError, match="num_virtual=7"):
        NonProductFilter(num_items=8, num_virtual=7)


@pytest.fixture
def windows(tmp_path: Path) -> Path:
    """10 always; 20 in [100, 200) and from 300 on; 30 in [50, 150); 99 unknown to the vocabulary."""
    return write(
        tmp_path,
        item_id=[10, 20, 20, 30, 99],
        valid_from=pa.array([None, 300, 100, 50, None], pa.int64()),
        valid_to=pa.array([None, None, 200, 150, None], pa.float64()),
    )


NOW = torch.tensor([120.0, 250.0, 400.0, 200.0], dtype=torch.float64)
LISTED_AT_NOW = [[2, 3, 4], [2], [2, 3], [2]]  # model ids with a row valid at each request time


@pytest.mark.parametrize("mode", ["allow", "deny"])
def test_item_table_filter_validity_windows(windows: Path, vocab: ItemVocab, mode: str) -> None:
    stage = ItemTableFilter(str(windows), mode=mode).bind(vocab)
    assert stage.num_unknown == 1
    candidates = Candidates(torch.tensor([[2, 3, 4, 5, 0]] * 4))
    for f in (stage, reloaded(stage)):
        out = f.apply(RequestSessions(torch.ones(4, 2, dtype=torch.long), now=NOW), candidates)
        listed = [
            [i if (i in valid) == (mode == "allow") else 0 for i in [2, 3, 4, 5, 0]]
            for valid in LISTED_AT_NOW
        ]
        assert out.items.tolist() == listed


def test_item_table_filter_without_request_time_counts_every_row(windows: Path, vocab: ItemVocab) -> None:
    candidates = Candidates(torch.tensor([[2, 3, 4, 5, 6], [6, 5, 4, 3, 2]]))
    deny = ItemTableFilter(str(windows)).bind(vocab).apply(anonymous(2), candidates)
    allow = ItemTableFilter(str(windows), mode="allow").bind(vocab).apply(anonymous(2), candidates)
    assert deny.items.tolist() == [[0, 0, 0, 5, 6], [6, 5, 0, 0, 0]]
    assert allow.items.tolist() == [[2, 3, 4, 0, 0], [0, 0, 4, 3, 2]]


def test_item_table_filter_timestamps_and_plain_csv_list(tmp_path: Path, vocab: ItemVocab) -> None:
    t = lambda day: datetime(2024, 1, day, tzinfo=timezone.utc)
    path = write(
        tmp_path,
        item_id=["30", "40"],  # text ids are matched to the integer vocabulary
        valid_from=pa.array([t(1), t(10)], pa.timestamp("ms", tz="UTC")),
        valid_to=pa.array([t(5), None], pa.timestamp("ms", tz="UTC")),
    )
    now = torch.tensor([t(2).timestamp(), t(7).timestamp(), t(12).timestamp()], dtype=torch.float64)
    deny = ItemTableFilter(str(path)).bind(vocab)
    out = deny.apply(RequestSessions(torch.ones(3, 1).long(), now=now), Candidates(torch.tensor([[4, 5]] * 3)))
    assert out.items.tolist() == [[0, 5], [4, 5], [4, 0]]
    (tmp_path / "allow.csv").write_text("item_id\n20\n50\n")
    allow = ItemTableFilter(str(tmp_path / "allow.csv"), mode="allow").bind(vocab)
    out = allow.apply(
        RequestSessions(torch.ones(1, 1).long(), now=now[:1]), Candidates(torch.tensor([[2, 3, 6, 7]]))
    )
    assert out.items.tolist() == [[0, 3, 6, 0]]


def test_item_table_filter_reads_nanosecond_timestamps(tmp_path: Path, vocab: ItemVocab) -> None:
    """A window of nanosecond timestamps (pandas' unit) that microseconds cannot hold opens and closes where it says."""
    start = 1_704_067_200_000_000_001  # 2024-01-01 00:00:00.000000001 UTC
    path = write(tmp_path, item_id=[30], valid_from=pa.array([start], pa.timestamp("ns")),
                 valid_to=pa.array([start + 86_400 * 10**9], pa.timestamp("ns", tz="Europe/Berlin")))
    now = torch.tensor([1_704_067_199.0, 1_704_067_200.5, 1_704_153_600.5], dtype=torch.float64)
    deny = ItemTableFilter(str(path)).bind(vocab)
    out = deny.apply(RequestSessions(torch.ones(3, 1).long(), now=now), Candidates(torch.tensor([[4, 5]] * 3)))
    assert out.items.tolist() == [[4, 5], [0, 5], [4, 5]]


def test_a_csv_item_table_lists_text_ids_as_written(tmp_path: Path) -> None:
    """``01050`` of a CSV deny list is item ``"01050"`` of a text vocabulary, not ``"1050"`` (which Arrow's reading of the
    file as integers made it), and is refused against an integer vocabulary, where it names no item as written."""
    text = ItemVocab.fit(pa.array(["01050", "1050", "7"]))  # "01050" -> 2, "1050" -> 3, "7" -> 4
    (tmp_path / "deny.csv").write_text("item_id\n01050\n7\n")
    deny = ItemTableFilter(str(tmp_path / "deny.csv")).bind(text)
    assert deny.apply(anonymous(1), Candidates(torch.tensor([[2, 3, 4]]))).items.tolist() == [[0, 3, 0]]
    with pytest.raises(TypeError, match="'01050' is not written as the vocabulary's int64 ids are"):
        ItemTableFilter(str(tmp_path / "deny.csv")).bind(ItemVocab.fit(pa.array([1050, 7])))


def test_saved_item_table_filter_needs_no_file(windows: Path, vocab: ItemVocab) -> None:
    stage = ItemTableFilter(str(windows), mode="allow").bind(vocab)
    windows.unlink()
    loaded = reloaded(stage).bind(vocab)  # bind: nothing to read once loaded
    assert loaded.num_unknown == 1 and loaded.path == str(windows)
    assert stage.state_dict()["ids"].tolist() == [2, 3, 3, 4]
    candidates = Candidates(torch.tensor([[2, 3, 4, 5, 0]] * 4))
    sessions = RequestSessions(torch.ones(4, 2, dtype=torch.long), now=NOW)
    assert torch.equal(loaded.apply(sessions, candidates).items, stage.apply(sessions, candidates).items)


def test_item_table_filter_must_be_bound(windows: Path) -> None:
    with pytest.raises(RuntimeError, match="call bind"):
        ItemTableFilter(str(windows)).apply(anonymous(1), Candidates(torch.tensor([[2]])))


@pytest.mark.parametrize(
    ("columns", "kwargs", "message"),
    [
        ({"item": [10]}, {}, r"rules.parquet: column 'item_id' is missing; the file has columns \['item'\]"),
        (
            {"item_id": [10], "valid_from": [1]},
            {"valid_to": "until"},
            "rules.parquet: column 'until' is missing",
        ),
        ({"item_id": pa.array([10, None, 30])}, {}, "rules.parquet: column 'item_id' has a null id at row 1"),
        (
            {"item_id": [10, 20], "valid_from": [100, 300], "valid_to": [200, 100]},
            {},
            "rules.parquet: row 1 has valid_from=300 after valid_to=100",
        ),
        ({"item_id": [10], "valid_from": ["soon"]}, {}, "column 'valid_from' has dtype string"),
        (  # milliseconds read as seconds: the window would open in the year 52,000 and the row never hold
            {"item_id": [10, 20], "valid_from": [1_600_000_000, 1_600_000_000_000]},
            {},
            r"rules.parquet: column 'valid_from' holds 1600000000000 at row 1, after the year 3000 in seconds",
        ),
        (
            {"item_id": [10], "valid_to": [1.8e12]},
            {},
            r"rules.parquet: column 'valid_to' holds 1800000000000.0 at row 0, after the year 3000",
        ),
    ],
)
def test_item_table_filter_bad_tables(tmp_path: Path, columns: dict, kwargs: dict, message: str) -> None:
    path = write(tmp_path, **columns)
    with pytest.raises(SchemaError, match=message):
        ItemTableFilter(str(path), **kwargs).read()


def test_rules_whose_items_the_vocabulary_does_not_hold_list_nothing(tmp_path: Path, vocab: ItemVocab) -> None:
    """Every id unknown (dropped when bound): a deny table blanks nothing, a boost raises nothing and a cap caps
    nothing, with or without a request time; an allow table, which would blank every list, is refused."""
    table = str(write(tmp_path, item_id=[98, 99], category=["a", "a"], valid_from=[0, 0], valid_to=[1e9, 1e9]))
    candidates = Candidates(torch.tensor([[2, 3, 4, 0], [5, 6, 7, 2]]))
    for sessions in (anonymous(2), RequestSessions(torch.ones(2, 1, dtype=torch.long), now=NOW[:2])):
        assert ItemTableFilter(table).bind(vocab).apply(sessions, candidates).items.tolist() == [[2, 3, 4, 0], [5, 6, 7, 2]]
    with pytest.raises(SchemaError, match=r"\.parquet: none of the allow table's 2 item ids is in the pipeline's "
                                          r"vocabulary, so every list would be empty; check the file and its 'item_id' ids$"):
        ItemTableFilter(table, mode="allow").bind(vocab)
    ordering = Ordering([BoostRule([99], weight=1.0)], DiversityCap(table, max_per_category=1)).bind(vocab)
    for o in (ordering, reloaded(ordering)):
        assert o.order(anonymous(2), DIVERSE, k=3).items.tolist() == [[3, 5, 4], [3, 6, 2]]


def test_item_table_filter_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SchemaError, match=r"absent.parquet: no such file"):
        ItemTableFilter(str(tmp_path / "absent.parquet")).bind(ItemVocab.empty())


# ----------------------------------------------------------------------------------- ordering
def test_plain_ordering_is_top_k_by_score() -> None:
    candidates = scored([[2, 3, 0, 5], [6, 0, 0, 0]], [[0.25, 0.5, -INF, 0.125], [1.0, -INF, -INF, -INF]])
    out = Ordering().order(anonymous(2), candidates, k=3)
    assert out.items.tolist() == [[3, 2, 5], [6, 0, 0]]
    assert out.scores.tolist() == [[0.5, 0.25, 0.125], [1.0, -INF, -INF]]
    wide = Ordering().order(anonymous(2), candidates, k=6)  # k > K: padded
    assert wide.items.tolist() == [[3, 2, 5, 0, 0, 0], [6, 0, 0, 0, 0, 0]]
    scores = torch.randn(5, 30, generator=torch.Generator().manual_seed(0))
    items = torch.arange(2, 32).expand(5, -1)
    out = Ordering().order(anonymous(5), Candidates(items, scores=scores), k=10)
    top = scores.topk(10, dim=1)
    assert torch.equal(out.scores, top.values) and torch.equal(out.items, top.indices + 2)


BOOST_CANDIDATES = scored([[2, 3, 4, 5, 6]], [[0.5, 0.25, 0.125, -1.0, -2.0]])


def test_boost_add_and_multiply_change_the_order(tmp_path: Path, vocab: ItemVocab) -> None:
    add = Ordering([BoostRule([40], weight=1.75)]).bind(vocab)
    out = add.order(anonymous(1), BOOST_CANDIDATES, k=3)
    assert out.items.tolist() == [[5, 2, 3]] and out.scores.tolist() == [[0.75, 0.5, 0.25]]
    # multiply: x e^2 on the softmax probability of 50 and 30 = +2 on their logits (-2 -> 0, 0.125 -> 2.125)
    path = write(tmp_path, item_id=[50, 30, 77])
    multiply = BoostRule(str(path), weight=math.exp(2.0), mode="multiply").bind(vocab)
    assert multiply.num_unknown == 1
    out = Ordering([multiply]).order(anonymous(1), BOOST_CANDIDATES, k=5)
    assert out.items.tolist() == [[4, 2, 3, 6, 5]]
    assert out.scores[0].tolist() == pytest.approx([2.125, 0.5, 0.25, 0.0, -1.0], abs=1e-6)
    with pytest.raises(ValueError, match="> 0 with mode='multiply'"):
        BoostRule([40], weight=0.0, mode="multiply")


def test_dedupe_keeps_the_best_entry_of_an_item() -> None:
    candidates = scored(
        [[2, 3, 2, 4, 3], [5, 5, 5, 0, 0]],
        [[0.125, 0.75, 0.5, 0.25, 0.375], [0.25, 0.25, 0.5, -INF, -INF]],
    )
    out = Ordering().order(anonymous(2), candidates, k=4)
    assert out.items.tolist() == [[3, 2, 4, 0], [5, 0, 0, 0]]
    assert out.scores.tolist() == [[0.75, 0.5, 0.25, -INF], [0.5, -INF, -INF, -INF]]
    # a batch without a repeated item (empty slots repeat id 0): the top-k by score
    alone = Ordering().order(anonymous(1), scored([[2, 0, 4, 0, 3]], [[0.125, -INF, 0.75, -INF, 0.5]]), k=4)
    assert alone.items.tolist() == [[4, 3, 2, 0]] and alone.scores.tolist() == [[0.75, 0.5, 0.125, -INF]]


@pytest.fixture
def categories(tmp_path: Path) -> Path:
    """10, 20, 40: a; 30 and the unknown 99: b; 50: none; 60 unlisted."""
    return write(
        tmp_path,
        "categories.parquet",
        item_id=[10, 20, 30, 40, 50, 99],
        category=["a", "a", "b", "a", None, "b"],
    )


DIVERSE = scored(
    [[2, 3, 4, 5, 6, 7], [5, 2, 6, 3, 0, 0]],
    [[0.6, 0.9, 0.7, 0.8, 0.5, 0.4], [0.1, 0.2, 0.3, 0.4, -INF, -INF]],
)


@pytest.mark.parametrize(
    ("n", "expected"),
    [(1, [[3, 4, 6, 7, 0, 0], [3, 6, 0, 0, 0, 0]]), (2, [[3, 5, 4, 6, 7, 0], [3, 6, 2, 0, 0, 0]])],
)
def test_diversity_cap(categories: Path, vocab: ItemVocab, n: int, expected: list[list[int]]) -> None:
    ordering = Ordering(diversity=DiversityCap(str(categories), max_per_category=n)).bind(vocab)
    assert ordering.diversity.num_unknown == 1
    for o in (ordering, reloaded(ordering)):
        assert o.order(anonymous(2), DIVERSE, k=6).items.tolist() == expected


def test_a_nan_category_is_uncapped_as_a_null_one(tmp_path: Path, vocab: ItemVocab) -> None:
    """pandas writes a missing category of a float column as NaN: those items are uncapped, not one category."""
    table = write(tmp_path, "nan.parquet", item_id=[10, 20, 30, 40], category=[1.0, float("nan"), float("nan"), 1.0])
    ordering = Ordering(diversity=DiversityCap(str(table), max_per_category=1)).bind(vocab)
    out = ordering.order(anonymous(1), scored([[2, 3, 4, 5]], [[0.9, 0.8, 0.7, 0.6]]), k=4)
    assert out.items.tolist() == [[2, 3, 4, 0]]  # 10 caps 40 (category 1.0); 20 and 30 stay


def test_boost_then_cap_decides_which_item_of_a_category_stays(categories: Path, vocab: ItemVocab) -> None:
    ordering = Ordering([BoostRule([10], weight=0.5)], DiversityCap(str(categories), 1)).bind(vocab)
    # 10 (id 2) raised from 0.6 to 1.1 outranks 20 (id 3, 0.9) of the same category: 20 goes
    out = ordering.order(anonymous(1), scored([[2, 3, 4]], [[0.6, 0.9, 0.7]]), k=3)
    assert out.items.tolist() == [[2, 4, 0]]


def test_diversity_cap_bad_tables(tmp_path: Path) -> None:
    twice = write(tmp_path, item_id=[10, 20, 10], category=["a", "b", "c"])
    with pytest.raises(SchemaError, match="rules.parquet: column 'item_id' lists item 10 2 times"):
        DiversityCap(str(twice), 1).read()
    no_category = write(tmp_path, "plain.parquet", item_id=[10])
    with pytest.raises(
        SchemaError, match=r"plain.parquet: column 'category' is missing; the file has columns \['item_id'\]"
    ):
        DiversityCap(str(no_category), 1).read()
    with pytest.raises(SchemaError, match="absent.csv: no such file"):
        DiversityCap(str(tmp_path / "absent.csv"), 1).read()
    DiversityCap(str(tmp_path / "absent.csv"), 1)  # the file is read when the rule is bound (or read), not built


def test_a_rule_without_a_source_holds_only_what_it_loads(categories: Path, vocab: ItemVocab) -> None:
    with pytest.raises(ValueError, match=r"BoostRule has no items to read \(items=None\)"):
        BoostRule(None, 1.0).bind(vocab)
    with pytest.raises(ValueError, match=r"DiversityCap has no category file to read \(category_path=None\)"):
        DiversityCap(None, 2).read()
    saved = DiversityCap(str(categories), 2).bind(vocab)
    loaded = DiversityCap(None, 2).load_state_dict(saved.state_dict()).bind(vocab)
    assert torch.equal(loaded.cap(DIVERSE.items, DIVERSE.scores), saved.cap(DIVERSE.items, DIVERSE.scores))


def test_ordering_rules_must_be_bound() -> None:
    with pytest.raises(RuntimeError, match="BoostRule holds raw item ids: call bind"):
        Ordering([BoostRule([10], 1.0)]).order(anonymous(1), BOOST_CANDIDATES, k=1)


# ----------------------------------------------------------------------------------- sampling
def many_candidates(b: int = 16, k: int = 12) -> Candidates:
    scores = torch.randn(b, k, generator=torch.Generator().manual_seed(1))
    items = torch.arange(2, 2 + k).expand(b, -1).clone()
    items[:, -3:] = 0  # three empty slots per row
    return Candidates(items, scores=scores.masked_fill(items == 0, -INF))


def sample(candidates: Candidates, k: int, temperature: float | None = 1.0, seed: int = 0) -> torch.Tensor:
    ordering = Ordering(sampling=SoftmaxSampling(temperature, seed))
    return ordering.order(anonymous(len(candidates.items)), candidates, k).items


def test_sampling_is_seeded_and_never_returns_empty_or_repeated_items() -> None:
    candidates = many_candidates()
    first = sample(candidates, k=9)
    assert torch.equal(first, sample(candidates, k=9))
    assert not torch.equal(first, sample(candidates, k=9, seed=1))
    assert (first >= 2).all()  # 9 valid per row: all sampled, none empty
    assert all(len(set(row)) == 9 for row in first.tolist())
    padded = sample(candidates, k=11)  # only 9 valid: the last two slots are empty
    assert (padded[:, :9] >= 2).all() and (padded[:, 9:] == 0).all()


def test_sampling_at_tiny_or_zero_temperature_is_greedy() -> None:
    candidates = many_candidates()
    greedy = Ordering().order(anonymous(16), candidates, k=6).items
    for temperature in (1e-6, 1e-310, 5e-324, 0.0, None):  # score / temperature overflows at the two tiniest
        assert torch.equal(sample(candidates, k=6, temperature=temperature), greedy)


@pytest.mark.parametrize("seed", [1.5, True, -1, 2**64, "3"])
def test_a_seed_the_noise_cannot_take_is_refused(seed) -> None:
    """The noise reads the seed's 64 bits: 1.5 failed only when a list was sampled, and 2**64 or -1 sampled as 0 or
    2**64 - 1 (another seed, the same samples)."""
    with pytest.raises(ValueError, match=r"^SoftmaxSampling seed must be an integer in 0 \.\. 2\*\*64 - 1 \(the noise's "
                                         rf"64 bits\), got {re.escape(repr(seed))}$"):
        SoftmaxSampling(1.0, seed=seed)
    assert torch.equal(sample(many_candidates(), k=9, seed=2**64 - 1), sample(many_candidates(), k=9, seed=2**64 - 1))


def test_sampling_follows_softmax_of_score_over_temperature() -> None:
    # weights exp(2 log 3 / 2) : exp(0) = 3 : 1, so the first pick is item 2 with probability 3/4
    candidates = scored([[2, 3]] * 4000, [[2 * math.log(3.0), 0.0]] * 4000)
    sessions = RequestSessions(torch.stack([torch.arange(4000) % 97 + 2, torch.arange(4000) // 97 + 2], dim=1))
    first = Ordering(sampling=SoftmaxSampling(2.0)).order(sessions, candidates, 1).items[:, 0]
    assert (first == 2).double().mean().item() == pytest.approx(0.75, abs=0.03)


def test_a_session_gets_its_sample_whatever_the_batch_its_padding_and_the_runs_before() -> None:
    """The noise is the seed's, the session's and the candidate's: the same lists alone or in a batch, in
    another order, with more padding, from a sampler that sampled before; another item, another list."""
    items = torch.arange(2, 14).expand(6, -1).clone()
    scores = torch.randn(6, 12, generator=torch.Generator().manual_seed(5))
    sessions = torch.tensor([[0, 0, 4, 9], [0, 3, 3, 5], [7, 8, 9, 10], [0, 0, 0, 6], [0, 0, 6, 4], [0, 0, 4, 6]])
    ordering = Ordering(sampling=SoftmaxSampling(1.0, seed=3))
    batch = ordering.order(RequestSessions(sessions), Candidates(items, scores=scores), 5).items
    for row in range(6):  # alone, padded to 6 positions, after the batch's draws
        alone = RequestSessions(torch.nn.functional.pad(sessions[row : row + 1], (2, 0)))
        assert torch.equal(ordering.order(alone, Candidates(items[row : row + 1], scores=scores[row : row + 1]), 5).items,
                           batch[row : row + 1])
    backwards = torch.arange(5, -1, -1)
    again = Ordering(sampling=SoftmaxSampling(1.0, seed=3)).order(
        RequestSessions(sessions[backwards]), Candidates(items[backwards], scores=scores[backwards]), 5).items
    assert torch.equal(again, batch[backwards])
    same_scores = Candidates(items, scores=scores[:1].expand(6, -1))  # sessions 4 and 5: the same items, other order
    lists = ordering.order(RequestSessions(sessions), same_scores, 12).items.tolist()
    assert len({tuple(r) for r in lists}) == 6


def test_ordering_state_round_trip(tmp_path: Path, categories: Path, vocab: ItemVocab) -> None:
    boosts = [
        BoostRule([40], 1.0),
        BoostRule(str(write(tmp_path, "campaign.parquet", item_id=[20])), 2.0, "multiply"),
    ]
    ordering = Ordering(boosts, DiversityCap(str(categories), 2), SoftmaxSampling(0.5, seed=3)).bind(vocab)
    plain, arrays = split_state(ordering.state_dict())
    assert sorted(arrays) == ["boosts/0/ids", "boosts/1/ids", "diversity/category", "diversity/ids"]
    assert plain == {"boosts": {"0": {"num_unknown": 0}, "1": {"num_unknown": 0}}, "diversity": {"num_unknown": 1}}
    loaded = reloaded(ordering).bind(vocab)  # bind: no-op when loaded
    candidates = many_candidates()
    for _ in range(2):  # the generators advance alike
        a, b = ordering.order(anonymous(16), candidates, 5), loaded.order(anonymous(16), candidates, 5)
        assert torch.equal(a.items, b.items) and torch.equal(a.scores, b.scores)
