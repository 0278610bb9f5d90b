"""The greedy sharding planner against placements and costs computed by hand (module doc of planner.py)."""

from __future__ import annotations

import pytest

from sessrec.embeddings.config import TableConfig
from sessrec.embeddings.planner import ShardingPlanner, TableHotness


def small_planner(**overrides) -> ShardingPlanner:
    kwargs = {
        "world_size": 2, "device_memory_bytes": 1_000_000, "batch_size": 10, "optimizer": "sgd",
        "data_parallel_max_bytes": 1000, "column_wise_min_dim": 64, "column_shard_dim": 32, "memory_bandwidth": 1e9, "network_bandwidth": 1e8,
    }
    kwargs.update(overrides)
    return ShardingPlanner(**kwargs)


TABLES = [
    TableConfig("tiny", 10, 8),  # 320 B <= 1000: data-parallel
    TableConfig("huge", 100_000, 4),  # 1.6 MB > 1 MB: row-wise
    TableConfig("wide", 1000, 64),  # 256 kB, width 64: two column shards of 32
    TableConfig("mid", 1000, 16),  # 64 kB, 5 ids per sample: table-wise
    TableConfig("small", 500, 16),  # 32 kB: table-wise
]


def test_hand_computed_plan():
    # W = 2, B = 10 per device, G = 20, b = 4 bytes, a = (W - 1) / W = 0.5, sgd: no state
    plan = small_planner().plan(TABLES, hotness={"mid": TableHotness(pooling_factor=5.0)})
    assert [t.placement for t in plan.tables] == ["data_parallel", "row_wise", "column_wise", "table_wise", "table_wise"]

    tiny = plan["tiny"]  # per device: lookup 2 B L D b = 2*10*1*8*4 = 640; comm 2 a R D b = 320
    assert tiny.ranks == (0, 1) and tiny.memory_bytes == 2 * 320
    assert (tiny.lookup_bytes, tiny.comm_bytes) == (1280, 640)

    huge = plan["huge"]  # 50_000 rows each; per device lookup 2*10*1*4*4 = 320, comm 2a G F D b + a B L 8 = 320 + 40
    assert [(s.row_offset, s.num_rows, s.memory_bytes) for s in huge.shards] == [(0, 50_000, 800_000), (50_000, 50_000, 800_000)]
    assert (huge.lookup_bytes, huge.comm_bytes) == (640, 720)

    # longest first: a wide shard costs lookup 2 G L d b = 5120, comm 2a G F d b + a G L 8 = 2560 + 80
    # -> 1e3 * (5120 / 1e9 + 2640 / 1e8) = 0.03152 ms; mid: 12800 and 1280 + 400 -> 0.0296 ms;
    # small: 2560 and 1280 + 80 -> 0.01616 ms. Placing wide#0 -> 0, wide#1 -> 1, mid -> 0 (a tie
    # in time and memory goes to the lower rank), small -> 1 (less time).
    wide = plan["wide"]
    assert [(s.rank, s.col_offset, s.num_cols, s.memory_bytes) for s in wide.shards] == [(0, 0, 32, 128_000), (1, 32, 32, 128_000)]
    assert (wide.lookup_bytes, wide.comm_bytes) == (2 * 5120, 2 * 2640)
    assert wide.time_ms == pytest.approx(2 * 0.03152)
    mid, small = plan["mid"], plan["small"]
    assert (mid.ranks, mid.lookup_bytes, mid.comm_bytes, mid.memory_bytes) == ((0,), 12800, 1680, 64_000)
    assert mid.time_ms == pytest.approx(0.0296)
    assert (small.ranks, small.lookup_bytes, small.comm_bytes, small.memory_bytes) == ((1,), 2560, 1360, 32_000)

    d0, d1 = plan.devices
    assert (d0.memory_bytes, d0.lookup_bytes, d0.comm_bytes) == (320 + 800_000 + 128_000 + 64_000, 18880, 5000)
    assert (d1.memory_bytes, d1.lookup_bytes, d1.comm_bytes) == (320 + 800_000 + 128_000 + 32_000, 8640, 4680)
    assert d0.time_ms == pytest.approx(1e3 * (18880 / 1e9 + 5000 / 1e8))
    assert sum(t.time_ms for t in plan.tables) == pytest.approx(d0.time_ms + d1.time_ms)


def test_describe_lists_tables_and_devices():
    text = str(small_planner().plan(TABLES))
    lines = text.splitlines()
    assert lines[0].startswith("sharding plan: 5 tables on 2 devices, batch 10 per device (20 global), optimizer sgd")
    assert any(line.split()[:3] == ["huge", "row_wise", "0,1"] for line in lines)
    assert any(line.split()[:3] == ["wide", "column_wise", "0,1"] for line in lines)
    assert lines[-2].split()[:4] == ["0", "969.1", "KiB", "/"]  # 992_320 bytes on device 0


def test_optimizer_state_in_memory():
    t = TableConfig("t", 10, 8)  # 10 rows of 8 fp32 = 320 bytes of weights
    assert ShardingPlanner(1, 10**6, 1, optimizer="sgd").table_bytes(t) == 320
    assert ShardingPlanner(1, 10**6, 1, optimizer="rowwise_adagrad").table_bytes(t) == 320 + 10 * 4
    assert ShardingPlanner(1, 10**6, 1, optimizer="adagrad").table_bytes(t) == 320 + 320
    assert ShardingPlanner(1, 10**6, 1, optimizer="adam").table_bytes(t) == 320 + 640
    assert ShardingPlanner(1, 10**6, 1, optimizer="sgd", param_bytes=2).table_bytes(t) == 160


@pytest.mark.parametrize(("rows", "world", "expected"), [(10, 4, [3, 3, 3, 1]), (5, 4, [2, 2, 1, 0]), (8, 2, [4, 4])])
def test_row_wise_blocks_follow_torchrec(rows, world, expected):
    planner = ShardingPlanner(world, 10**6, 1, optimizer="sgd")
    shards = planner.plan([TableConfig("t", rows, 4)], constraints={"t": "row_wise"})["t"].shards
    assert [s.num_rows for s in shards] == expected
    assert [s.row_offset for s in shards] == [min(sum(expected[:i]), rows) for i in range(world)]


@pytest.mark.parametrize(("dim", "shard_dim", "widths"), [(96, 64, [48, 48]), (256, 128, [128, 128]), (100, 64, [50, 50]), (7, 4, [1] * 7)])
def test_column_shards_are_equal(dim, shard_dim, widths):
    planner = ShardingPlanner(2, 10**9, 1, optimizer="sgd", column_shard_dim=shard_dim)
    shards = planner.plan([TableConfig("t", 10, dim)], constraints={"t": "column_wise"})["t"].shards
    assert [s.num_cols for s in shards] == widths
    assert [s.col_offset for s in shards] == [sum(widths[:i]) for i in range(len(widths))]


def test_one_device_never_splits_by_columns():
    plan = ShardingPlanner(1, 10**9, 8, optimizer="sgd", data_parallel_max_bytes=0).plan([TableConfig("w", 1000, 512)])
    assert plan["w"].placement == "table_wise" and plan["w"].ranks == (0,)
    assert plan["w"].comm_bytes == 0  # nothing leaves the only device


def test_table_wise_falls_back_to_row_wise_when_no_device_has_room():
    planner = ShardingPlanner(2, 1000, 1, optimizer="sgd", data_parallel_max_bytes=0)
    tables = [TableConfig(n, 150, 1) for n in ("a", "b", "c")]  # 600 bytes each
    plan = planner.plan(tables)
    assert [(t.placement, t.ranks) for t in plan.tables] == [("table_wise", (0,)), ("table_wise", (1,)), ("row_wise", (0, 1))]
    assert "no single device had 600 B free" in plan["c"].reason
    assert [d.memory_bytes for d in plan.devices] == [900, 900]


def test_access_frequency_scales_lookups():
    planner = small_planner(data_parallel_max_bytes=0)
    full = planner.plan([TableConfig("t", 100, 8)])["t"]
    half = planner.plan([TableConfig("t", 100, 8)], hotness={"t": TableHotness(access_frequency=0.5)})["t"]
    assert half.lookup_bytes == full.lookup_bytes / 2


def test_shared_table_counts_each_feature():
    planner = small_planner(data_parallel_max_bytes=0)
    one = planner.plan([TableConfig("t", 100, 8)])["t"]
    two = planner.plan([TableConfig("t", 100, 8, feature_names=("a", "b"))])["t"]
    assert two.lookup_bytes == 2 * one.lookup_bytes and two.comm_bytes == 2 * one.comm_bytes


def test_table_too_large_names_table_bytes_and_memory():
    planner = ShardingPlanner(2, 1000, 1, optimizer="sgd")
    with pytest.raises(ValueError, match=r"table 'big' \(1000 x 1, 3.9 KiB = 4000 bytes.*row_wise\) needs 2.0 KiB.*1000 B"):
        planner.plan([TableConfig("big", 1000, 1)])


def test_constrained_table_wise_too_large_is_an_error():
    planner = ShardingPlanner(2, 1000, 1, optimizer="sgd")
    with pytest.raises(ValueError, match=r"table 'big' .* a shard of 3.9 KiB \(4000 bytes"):
        planner.plan([TableConfig("big", 1000, 1)], constraints={"big": "table_wise"})


def test_data_parallel_must_fit_on_every_device():
    planner = ShardingPlanner(2, 1000, 1, optimizer="sgd")
    with pytest.raises(ValueError, match=r"table 'dp'.*data_parallel\) needs 1.2 KiB on every device"):
        planner.plan([TableConfig("dp", 300, 1)], constraints={"dp": "data_parallel"})


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"world_size": 0}, "world_size must be an integer >= 1"),
        ({"device_memory_bytes": -1}, "device_memory_bytes must be an integer >= 1"),
        ({"optimizer": "adamw"}, "optimizer must be one of"),
        ({"network_bandwidth": 0}, "network_bandwidth must be > 0"),
    ],
)
def test_bad_planner_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        small_planner(**kwargs)


def test_bad_plan_inputs():
    planner = small_planner()
    t = TableConfig("t", 10, 8)
    with pytest.raises(ValueError, match="distinct"):
        planner.plan([t, t])
    with pytest.raises(ValueError, match=r"hotness names tables \['x'\]"):
        planner.plan([t], hotness={"x": TableHotness()})
    with pytest.raises(ValueError, match=r"constraints\['t'\] must be one of"):
        planner.plan([t], constraints={"t": "grid"})
    with pytest.raises(ValueError, match="at least one table"):
        planner.plan([])
    with pytest.raises(TypeError, match="TableConfig"):
        planner.plan([("t", 10, 8)])
    with pytest.raises(ValueError, match="access_frequency"):
        TableHotness(access_frequency=0)
    with pytest.raises(KeyError, match="no table 'x'"):
        planner.plan([t])["x"]


def test_sharding_without_torchrec_says_how_to_install(monkeypatch):
    # here rather than in test_sharding.py, which is skipped as a whole without TorchRec
    import sys

    from sessrec.embeddings import sharding

    monkeypatch.setitem(sys.modules, "torchrec", None)  # as if not installed
    with pytest.raises(ImportError, match=r"pip install 'sessrec\[torchrec-deps\]'.*--no-deps torchrec==1.9.2"):
        sharding.to_embedding_bag_configs([TableConfig("t", 10, 8)])
