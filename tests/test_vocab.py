"""Item vocabulary: fitting with frequency caps, encode/decode, save/load."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from sessrec.data.vocab import NUM_SPECIAL, OOV, PAD, ItemVocab

# counts: 7 x4, 3 x2, 9 x2, 5 x1, 8 x1
ITEMS = [9, 7, 3, 7, 5, 7, 9, 8, 3, 7]


def test_special_ids():
    assert (PAD, OOV, NUM_SPECIAL) == (0, 1, 2)


def test_fit_orders_by_frequency_then_raw_id():
    vocab = ItemVocab.fit(pa.array(ITEMS))
    assert vocab.raw_ids.to_pylist() == [7, 3, 9, 5, 8]
    assert vocab.counts.tolist() == [4, 2, 2, 1, 1]
    assert len(vocab) == 5 + 2


def test_fit_min_count_and_max_size():
    assert ItemVocab.fit(pa.array(ITEMS), min_count=2).raw_ids.to_pylist() == [7, 3, 9]
    assert ItemVocab.fit(pa.array(ITEMS), max_size=2).raw_ids.to_pylist() == [7, 3]  # the 3/9 tie goes to 3
    capped = ItemVocab.fit(pa.array(ITEMS), min_count=2, max_size=10)
    assert capped.raw_ids.to_pylist() == [7, 3, 9] and capped.counts.tolist() == [4, 2, 2]
    assert len(ItemVocab.fit(pa.array(ITEMS), min_count=5)) == NUM_SPECIAL


def test_fit_is_deterministic_under_shuffles():
    rng = np.random.default_rng(0)
    items = rng.integers(0, 50, 2_000)
    first = ItemVocab.fit(pa.array(items), min_count=3)
    again = ItemVocab.fit(
        pa.chunked_array([pa.array(part) for part in np.array_split(rng.permutation(items), 3)]), min_count=3
    )
    assert first == again
    counts = np.bincount(items, minlength=50)
    expected = sorted((raw for raw in range(50) if counts[raw] >= 3), key=lambda raw: (-counts[raw], raw))
    assert first.raw_ids.to_pylist() == expected


def test_fit_string_ids_ties_by_raw_id():
    vocab = ItemVocab.fit(pa.array(["b", "a", "c", "b", "c"]))
    assert vocab.raw_ids.to_pylist() == ["b", "c", "a"]


def test_fit_refuses_null_ids():
    with pytest.raises(ValueError, match="item ids hold 1 nulls"):
        ItemVocab.fit(pa.array([1, None, 2]))


def test_encode_counts_unknown():
    vocab = ItemVocab.fit(pa.array(ITEMS), min_count=2)  # 7 -> 2, 3 -> 3, 9 -> 4
    result = vocab.encode(pa.array([9, 7, 42, 5, 3, 7]))
    assert result.ids.tolist() == [4, 2, OOV, OOV, 3, 2]  # 5 was seen once: rare, so OOV like 42
    assert result.num_unknown == 2
    assert result.ids.dtype == np.int64
    assert vocab.encode(pa.chunked_array([[3], [9, 100]])).ids.tolist() == [3, 4, OOV]


def test_encode_refuses_uncastable_types():
    vocab = ItemVocab.fit(pa.array([1, 2]))
    with pytest.raises(TypeError, match="cannot be matched with a vocabulary of int64"):
        vocab.encode(pa.array(["x"]))


@pytest.mark.parametrize("raw", [[1000, 1001, 1000, 1002], ["hotel-a", "hotel-b", "hotel-a", "hotel-c"]])
def test_round_trip_raw_to_ids_to_raw(raw):
    vocab = ItemVocab.fit(pa.array(raw))
    ids = vocab.encode(pa.array(raw)).ids
    assert ids.min() >= NUM_SPECIAL
    assert vocab.decode(ids).to_pylist() == raw
    assert vocab.decode(ids.reshape(2, 2)).to_pylist() == raw  # any shape, flattened


def test_decode_specials_to_null():
    vocab = ItemVocab.fit(pa.array(["x", "y", "y"]))
    assert vocab.decode(np.array([2, PAD, 3, OOV])).to_pylist() == ["y", None, "x", None]



@pytest.mark.parametrize("raw", [[7, 9, -3, 2**62], ["x", "y", "z", "w"]])
def test_decode_list_is_decode_as_python_values(raw):
    """The int64 vocabulary's numpy path and the Arrow one give `decode`'s values, None at padding, OOV and
    virtual ids, in any shape."""
    vocab = ItemVocab(pa.array(raw), np.array([2, 1, 1, 1]), num_virtual=1)  # the last id (5) virtual
    ids = np.array([[2, PAD, 5, OOV], [4, 3, 3, 2]])
    assert vocab.decode_list(ids) == vocab.decode(ids).to_pylist()
    assert vocab.decode_list(ids)[:4] == [raw[0], None, None, None]
    assert [type(v) for v in vocab.decode_list(np.array([2]))] == [type(raw[0])]
    assert vocab.decode_list(np.zeros(0, dtype=np.int64)) == []

def test_save_load_round_trip_atomic(tmp_path):
    vocab = ItemVocab.fit(pa.array(["b", "a", "c", "b"]), min_count=1)
    path = vocab.save(tmp_path / "run" / "vocab.parquet")
    assert path == tmp_path / "run" / "vocab.parquet"
    assert [p.name for p in path.parent.iterdir()] == ["vocab.parquet"]  # no temporary file left
    loaded = ItemVocab.load(path)
    assert loaded == vocab
    assert loaded.raw_ids.type == pa.string()
    assert loaded.encode(pa.array(["c", "b", "z"])).ids.tolist() == [4, 2, OOV]


def test_save_failure_leaves_nothing(tmp_path, monkeypatch):
    import sessrec.saved.atomic as atomic_module  # where ItemVocab.save writes (ParquetFile)

    def broken_write(table, where):
        with open(where, "wb") as half:
            half.write(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(atomic_module.pq, "write_table", broken_write)
    with pytest.raises(OSError, match="disk full"):
        ItemVocab.fit(pa.array([1])).save(tmp_path / "vocab.parquet")
    assert list(tmp_path.iterdir()) == []


def test_load_refuses_other_parquet(tmp_path):
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"item": [1], "n": [2]}), tmp_path / "other.parquet")
    with pytest.raises(ValueError, match="not a sessrec vocabulary"):
        ItemVocab.load(tmp_path / "other.parquet")


def test_constructor_checks():
    with pytest.raises(ValueError, match="same length"):
        ItemVocab(pa.array([1, 2]), np.array([1]))
    with pytest.raises(ValueError, match="distinct"):
        ItemVocab(pa.array([1, 1]), np.array([1, 1]))


@pytest.mark.parametrize("kind", ["int64", "string"])
def test_a_few_ids_are_looked_up_as_a_whole_file_is(kind):
    """Up to SMALL_LOOKUP ids go through the sorted keys, more through pc.index_in: the same ids one by one
    as in a whole file, virtual split kept."""
    from sessrec.data.vocab import SMALL_LOOKUP

    rng = np.random.default_rng(0)
    keys = rng.permutation(5_000)[:3_000] * 7 - 9_000  # negative ids too, unsorted
    cast = (lambda v: [None if x is None else f"é{x}" for x in v]) if kind == "string" else (lambda v: v)
    vocab = ItemVocab(pa.array(cast(keys.tolist())), np.arange(3_000, 0, -1), num_virtual=500)
    query = [int(x) for x in rng.choice(keys, 3 * SMALL_LOOKUP)] + [123_456, -1]  # two unknown ids
    query[5] = None
    virtual = rng.random(len(query)) < 0.5
    assert min(virtual.sum(), (~virtual).sum()) > SMALL_LOOKUP  # each side through pc.index_in
    whole = vocab.encode(pa.array(cast(query)), virtual=virtual)
    assert whole.num_unknown > 2  # None, the unknown ids, and keys looked up on the wrong side of the split
    one_by_one = [vocab.encode(pa.array(cast([q])), virtual=virtual[i : i + 1]).ids[0] for i, q in enumerate(query)]
    assert one_by_one == whole.ids.tolist()
    position = {k: i for i, k in enumerate(keys.tolist())}
    expected = [OOV if q is None or position.get(q) is None or (position[q] >= 2_500) != v
                else NUM_SPECIAL + position[q] for q, v in zip(query, virtual)]
    assert whole.ids.tolist() == expected


def test_a_request_of_a_few_ids_does_not_hash_the_whole_vocabulary(monkeypatch):
    import sessrec.data.vocab as vocab_module

    vocab = ItemVocab(pa.array(np.arange(100_000) * 3), np.ones(100_000, dtype=np.int64))

    def whole_vocabulary(*args, **kwargs):
        raise AssertionError("pc.index_in hashes all 100,000 keys for a lookup of 3 ids")

    monkeypatch.setattr(vocab_module.pc, "index_in", whole_vocabulary)
    assert vocab.encode(pa.array([3, 4, 299_997])).ids.tolist() == [NUM_SPECIAL + 1, OOV, NUM_SPECIAL + 99_999]


def test_a_file_of_integer_ids_far_fewer_than_the_keys_does_not_hash_the_whole_vocabulary(monkeypatch):
    import sessrec.data.vocab as vocab_module

    vocab = ItemVocab(pa.array(np.arange(200_000, 0, -1) * 5), np.ones(200_000, dtype=np.int64))

    def whole_vocabulary(*args, **kwargs):
        raise AssertionError("pc.index_in hashes all 200,000 keys for a file of 14,287 integer ids")

    monkeypatch.setattr(vocab_module.pc, "index_in", whole_vocabulary)
    query = np.arange(0, 100_005, 7)  # 14,287 ids (> SMALL_LOOKUP): multiples of 35 are known, 0 is not
    query[-1] = 1_000_005  # the last key, 1,000,000, is the largest: beyond it
    expected = np.where((query % 5 == 0) & (query > 0) & (query <= 1_000_000), NUM_SPECIAL + 200_000 - query // 5, OOV)
    assert vocab.encode(pa.array(query)).ids.tolist() == expected.tolist()


@pytest.mark.parametrize("raw", [[3, 1, 2, 1], ["b", "a", "b"], [1, None, 2]])
def test_repeated_or_null_raw_ids_are_refused(raw):
    with pytest.raises(ValueError, match="distinct"):
        ItemVocab(pa.array(raw), np.ones(len(raw), dtype=np.int64))
    distinct = [x for i, x in enumerate(raw) if x is not None and x not in raw[:i]]
    assert len(ItemVocab(pa.array(distinct), np.ones(len(distinct), dtype=np.int64))) == len(distinct) + NUM_SPECIAL


def test_keys_sorted_for_lookups_follow_a_loaded_state():
    vocab = ItemVocab(pa.array([5, 6]), np.array([2, 1]))
    assert vocab.encode(pa.array([6, 9])).ids.tolist() == [3, OOV]  # sorts and keeps [5, 6]
    vocab.load_state_dict(ItemVocab(pa.array([9, 6]), np.array([2, 1])).state_dict())
    assert vocab.encode(pa.array([6, 9])).ids.tolist() == [3, 2]


def test_encode_takes_a_list_or_a_numpy_array_as_an_arrow_array():
    vocab = ItemVocab.fit(pa.array(ITEMS))
    expected = vocab.encode(pa.array([9, 7, 42])).ids.tolist()
    assert expected == [4, 2, OOV]
    assert vocab.encode([9, 7, 42]).ids.tolist() == expected
    assert vocab.encode(np.array([9, 7, 42])).ids.tolist() == expected
    assert vocab.encode(np.array([9, 7, 42]), virtual=np.zeros(3, bool)).num_unknown == 1
    text = ItemVocab.fit(pa.array(["b", "a", "b"]))
    assert text.encode(np.array(["b", "zz", "a"])).ids.tolist() == [2, OOV, 3]
    with pytest.raises(TypeError, match=r"^raw ids must be an Arrow array, a list or a numpy array of ids, got str$"):
        text.encode("ab")
    with pytest.raises(TypeError, match=r"^events.csv: raw ids are not one array of ids of one type: .*'a'"):
        vocab.encode([7, "a"], source="events.csv")
