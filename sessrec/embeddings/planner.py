"""A greedy sharding planner: where each embedding table lives when one device is not enough.

For each table the planner picks one of four placements (the names of TorchRec's ``ShardingType``):

- ``data_parallel``: a full copy on every device; its gradient is all-reduced like a dense layer's.
- ``table_wise``: the whole table on one device; the pooled outputs travel to their samples' devices.
- ``row_wise``: rows split evenly over all devices (``ceil(R / W)`` rows each, as TorchRec does).
- ``column_wise``: the width split into k equal shards, each placed like a table-wise table.

Greedy rules, in this order (a per-table ``constraints`` entry overrides them):

1. memory > ``device_memory_bytes`` -> row-wise (it cannot live on one device);
2. memory <= ``data_parallel_max_bytes`` -> data-parallel (a small table costs less to copy than to
   send its outputs around);
3. width >= ``column_wise_min_dim`` and more than one device -> column-wise, shards of at most
   ``column_shard_dim`` columns;
4. otherwise table-wise.

Data-parallel and row-wise tables load every device alike and are placed first; then table-wise
tables and column-wise shards, most expensive first, each go to the least-loaded device (by
estimated step time, then memory used, then rank) that has room: longest-processing-time-first
bin packing. A table-wise table that fits on no single device falls back to row-wise. A table that
does not fit at all raises a `ValueError` naming the table, its bytes and the memory.

Cost model (one training step, forward + backward). Notation: W devices, B samples per device
(global batch G = W * B), a table of R rows and width D, F features that use it, L = F *
pooling_factor * access_frequency ids per sample, b = ``param_bytes`` per weight, 8 bytes per id,
s(D) = optimizer-state bytes per row of width D (sgd 0; rowwise_adagrad 4; adagrad 4 D; adam 8 D).

- memory of a table = R * (D * b + s(D)); a row-wise shard holds its rows of it; a column shard of
  width d is a table of its own: R * (d * b + s(d));
- lookup bytes (rows read in forward, gradient rows written in backward) = 2 * rows looked up * D * b:
  data-parallel 2 B L D b on each device; table-wise 2 G L D b on the owner; row-wise 2 G L D b / W
  on each device (ids assumed spread evenly over the rows); a column shard of width d: 2 G L d b;
- communication bytes, with a = (W - 1) / W the share that leaves a device:
  data-parallel 2 a R D b per device (ring all-reduce of the dense gradient); table-wise, on the
  owner, 2 a G F D b (pooled outputs out in forward, their gradients back) + a G L 8 (ids in);
  row-wise, per device, 2 a G F D b (reduce-scatter of partial sums, then the gradients'
  all-gather) + a B L 8 (ids bucketized out); a column shard of width d: 2 a G F d b + a G L 8;
- time = lookup bytes / ``memory_bandwidth`` + communication bytes / ``network_bandwidth``.

The model ignores compute, caches and overlap; it ranks placements, it does not predict wall-clock.

Shape letters: W devices, B per-device batch, R rows, D width, F features per table.

Examples:
    >>> from sessrec.embeddings.config import TableConfig
    >>> planner = ShardingPlanner(world_size=2, device_memory_bytes=2**30, batch_size=512)
    >>> plan = planner.plan([TableConfig("city", 1000, 16), TableConfig("item", 10**6, 64)])
    >>> plan["city"].placement, plan["item"].placement, plan["item"].ranks
    ('data_parallel', 'table_wise', (0,))
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from sessrec.embeddings.config import TableConfig
from sessrec.saved.registry import check_integers

Placement = Literal["data_parallel", "table_wise", "row_wise", "column_wise"]
Optimizer = Literal["sgd", "rowwise_adagrad", "adagrad", "adam"]
PLACEMENTS: tuple[str, ...] = get_args(Placement)
OPTIMIZERS: tuple[str, ...] = get_args(Optimizer)
ID_BYTES = 8  # int64 ids on the wire


@dataclass(frozen=True)
class TableHotness:
    """How often a table is read, per sample.

    Args:
        pooling_factor: average ids per sample in one feature's bag (1.0 for one-hot).
        access_frequency: share of samples in which the feature is present, in (0, 1].
    """

    pooling_factor: float = 1.0
    access_frequency: float = 1.0

    def __post_init__(self) -> None:
        if not self.pooling_factor > 0:
            raise ValueError(f"pooling_factor must be > 0, got {self.pooling_factor!r}")
        if not 0 < self.access_frequency <= 1:
            raise ValueError(f"access_frequency must be in (0, 1], got {self.access_frequency!r}")


@dataclass(frozen=True)
class Shard:
    """One block of a table on one device: rows [row_offset, +num_rows), columns [col_offset, +num_cols)."""

    rank: int
    row_offset: int
    num_rows: int
    col_offset: int
    num_cols: int
    memory_bytes: int


@dataclass(frozen=True)
class TablePlan:
    """Where one table lives and what it costs per step (summed over its shards and devices)."""

    table: str
    placement: Placement
    shards: tuple[Shard, ...]
    memory_bytes: int
    lookup_bytes: float
    comm_bytes: float
    time_ms: float
    reason: str

    @property
    def ranks(self) -> tuple[int, ...]:
        """The devices holding a shard, in shard order (one per shard; ranks may repeat column-wise)."""
        return tuple(s.rank for s in self.shards)


@dataclass(frozen=True)
class DeviceLoad:
    """Memory and estimated per-step cost of one device under a plan."""

    rank: int
    memory_bytes: int
    capacity_bytes: int
    lookup_bytes: float
    comm_bytes: float
    time_ms: float


@dataclass(frozen=True)
class ShardingPlan:
    """A placement for every table, with its per-table and per-device cost estimates."""

    tables: tuple[TablePlan, ...]
    devices: tuple[DeviceLoad, ...]
    batch_size: int
    optimizer: str

    @property
    def world_size(self) -> int:
        return len(self.devices)

    def __getitem__(self, table: str) -> TablePlan:
        for t in self.tables:
            if t.table == table:
                return t
        raise KeyError(f"no table {table!r} in the plan; tables: {[t.table for t in self.tables]}")

    def describe(self) -> str:
        """The plan as a table of tables and a table of devices (what ``print(plan)`` shows)."""
        w = self.world_size
        lines = [
            (
                f"sharding plan: {len(self.tables)} tables on {w} devices, batch {self.batch_size} per device "
                f"({self.batch_size * w} global), optimizer {self.optimizer}; lookup and comm are bytes per step, "
                "ms the estimated time"
            ),
            f"{'table':<16} {'placement':<14} {'ranks':<12} {'memory':>11} {'lookup':>11} {'comm':>11} {'ms':>9}  reason",
        ]
        for t in self.tables:
            ranks = ",".join(str(r) for r in t.ranks)
            lines.append(
                f"{t.table:<16} {t.placement:<14} {ranks:<12} {_human(t.memory_bytes):>11} "
                f"{_human(t.lookup_bytes):>11} {_human(t.comm_bytes):>11} {t.time_ms:>9.3f}  {t.reason}"
            )
        lines.append(f"{'device':<16} {'memory used / capacity':<39} {'lookup':>11} {'comm':>11} {'ms':>9}")
        for d in self.devices:
            used = f"{_human(d.memory_bytes)} / {_human(d.capacity_bytes)} ({d.memory_bytes / d.capacity_bytes:.0%})"
            lines.append(
                f"{d.rank:<16} {used:<39} {_human(d.lookup_bytes):>11} {_human(d.comm_bytes):>11} {d.time_ms:>9.3f}"
            )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.describe()


@dataclass(frozen=True)
class ShardingPlanner:
    """Greedy table placement over W devices of equal memory (rules and cost model in the module doc).

    Args:
        world_size: W, number of devices (processes).
        device_memory_bytes: memory each device gives to embedding tables and their optimizer state.
        batch_size: B, samples per device per step (the global batch is W * B).
        optimizer: the tables' optimizer, for its state bytes per row.
        param_bytes: bytes per weight (4 for fp32, 2 for fp16/bf16).
        data_parallel_max_bytes: tables up to this memory are replicated on every device.
        column_wise_min_dim: tables at least this wide are split by columns (when W > 1).
        column_shard_dim: the widest column shard; the shard count k is the smallest divisor of D
            with D / k <= column_shard_dim.
        memory_bandwidth: device memory bytes/s, for the lookup time.
        network_bandwidth: bytes/s in or out of one device, for the communication time.
    """

    world_size: int
    device_memory_bytes: int
    batch_size: int
    optimizer: Optimizer = "rowwise_adagrad"
    param_bytes: int = 4
    data_parallel_max_bytes: int = 1 << 20
    column_wise_min_dim: int = 256
    column_shard_dim: int = 128
    memory_bandwidth: float = 100e9
    network_bandwidth: float = 10e9

    def __post_init__(self) -> None:
        names = ("world_size", "device_memory_bytes", "batch_size", "param_bytes", "column_wise_min_dim", "column_shard_dim")
        check_integers({name: getattr(self, name) for name in names}, "ShardingPlanner: ")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"ShardingPlanner: optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.data_parallel_max_bytes < 0:
            raise ValueError(f"ShardingPlanner: data_parallel_max_bytes must be >= 0, got {self.data_parallel_max_bytes!r}")
        for name in ("memory_bandwidth", "network_bandwidth"):
            if not getattr(self, name) > 0:
                raise ValueError(f"ShardingPlanner: {name} must be > 0 bytes/s, got {getattr(self, name)!r}")

    def row_bytes(self, embedding_dim: int) -> int:
        """Bytes per row of width D: the weights plus the optimizer's state."""
        state = {"sgd": 0, "rowwise_adagrad": 4, "adagrad": 4 * embedding_dim, "adam": 8 * embedding_dim}
        return embedding_dim * self.param_bytes + state[self.optimizer]

    def table_bytes(self, table: TableConfig) -> int:
        """Memory of a whole table with its optimizer state."""
        return table.num_embeddings * self.row_bytes(table.embedding_dim)

    def plan(
        self,
        tables: Sequence[TableConfig],
        hotness: Mapping[str, TableHotness] | None = None,
        constraints: Mapping[str, Placement] | None = None,
    ) -> ShardingPlan:
        """Place every table.

        Args:
            tables: the tables; names must be distinct.
            hotness: table name -> `TableHotness`; a missing table is one-hot, always present.
            constraints: table name -> placement that overrides the greedy rules.

        Returns:
            The `ShardingPlan`, tables in the order given.

        Raises:
            ValueError: duplicate or unknown table names, an unknown placement, or a table that fits
                nowhere (the message names the table, its bytes and the free memory).
        """
        hotness = dict(hotness or {})
        constraints = dict(constraints or {})
        if not tables:
            raise ValueError("plan() needs at least one table")
        if not all(isinstance(t, TableConfig) for t in tables):
            raise TypeError(f"tables must be TableConfig, got {[type(t).__name__ for t in tables]}")
        names = [t.name for t in tables]
        if len(set(names)) != len(names):
            raise ValueError(f"table names must be distinct, got {names}")
        for what, mapping in (("hotness", hotness), ("constraints", constraints)):
            unknown = sorted(set(mapping) - set(names))
            if unknown:
                raise ValueError(f"{what} names tables {unknown} that are not among the tables {names}")
        for name, placement in constraints.items():
            if placement not in PLACEMENTS:
                raise ValueError(f"constraints[{name!r}] must be one of {PLACEMENTS}, got {placement!r}")

        w = self.world_size
        state = _State(w, self.device_memory_bytes)
        kinds: dict[str, tuple[str, str]] = {t.name: self._rule(t, constraints.get(t.name)) for t in tables}
        planned: dict[str, TablePlan] = {}
        by_name = {t.name: t for t in tables}

        # data-parallel and row-wise load every device alike: first, in the order given
        for t in tables:
            kind, reason = kinds[t.name]
            if kind in ("data_parallel", "row_wise"):
                planned[t.name] = self._place_everywhere(t, kind, reason, hotness.get(t.name), state)

        # then whole tables and column shards, most expensive first, each on the least-loaded device
        items: list[tuple[float, int, str, int, int]] = []  # (-time, -memory, name, col_offset, num_cols)
        for t in tables:
            kind, _ = kinds[t.name]
            if kind not in ("table_wise", "column_wise"):
                continue
            k = self._column_shards(t.embedding_dim) if kind == "column_wise" else 1
            d = t.embedding_dim // k
            for j in range(k):
                lookup, comm = self._one_device_cost(t, d, hotness.get(t.name))
                items.append((-self._ms(lookup, comm), -t.num_embeddings * self.row_bytes(d), t.name, j * d, d))
        shards: dict[str, list[Shard]] = {}
        for _, neg_memory, name, col_offset, num_cols in sorted(items):
            t = by_name[name]
            kind, reason = kinds[name]
            memory = -neg_memory
            rank = state.least_loaded(memory)
            if rank is None and kind == "table_wise" and name not in constraints:
                why = f"{reason}; no single device had {_human(memory)} free"
                planned[name] = self._place_everywhere(t, "row_wise", why, hotness.get(name), state)
                continue
            if rank is None:
                raise ValueError(
                    f"table {name!r} ({t.num_embeddings} x {t.embedding_dim}, {kind}): a shard of {_human(memory)} "
                    f"({memory} bytes, with {self.optimizer} state) fits on none of the {w} devices of "
                    f"{_human(self.device_memory_bytes)}, the freest has {_human(state.free_max())} left; add devices, "
                    f"raise device_memory_bytes, use a lighter optimizer, or constrain it to 'row_wise'"
                )
            lookup, comm = self._one_device_cost(t, num_cols, hotness.get(name))
            state.add(rank, memory, lookup, comm, self._ms(lookup, comm))
            shards.setdefault(name, []).append(Shard(rank, 0, t.num_embeddings, col_offset, num_cols, memory))

        for name, table_shards in shards.items():
            t = by_name[name]
            kind, reason = kinds[name]
            table_shards.sort(key=lambda s: s.col_offset)
            lookup, comm = self._one_device_cost(t, table_shards[0].num_cols, hotness.get(name))
            k = len(table_shards)
            planned[name] = TablePlan(
                name, kind, tuple(table_shards), sum(s.memory_bytes for s in table_shards),  # type: ignore[arg-type]
                k * lookup, k * comm, k * self._ms(lookup, comm), reason,
            )

        devices = tuple(
            DeviceLoad(r, state.memory[r], self.device_memory_bytes, state.lookup[r], state.comm[r], state.time[r])
            for r in range(w)
        )
        return ShardingPlan(tuple(planned[n] for n in names), devices, self.batch_size, self.optimizer)

    # -- rules and costs -------------------------------------------------------------------------

    def _rule(self, t: TableConfig, forced: str | None) -> tuple[str, str]:
        """(placement, reason) by the greedy rules or a constraint."""
        memory = self.table_bytes(t)
        if forced is not None:
            return forced, "constrained"
        if memory > self.device_memory_bytes:
            return "row_wise", f"{_human(memory)} > one device's {_human(self.device_memory_bytes)}"
        if memory <= self.data_parallel_max_bytes:
            return "data_parallel", f"{_human(memory)} <= data_parallel_max_bytes"
        if self.world_size > 1 and t.embedding_dim >= self.column_wise_min_dim:
            return "column_wise", f"width {t.embedding_dim} >= column_wise_min_dim"
        return "table_wise", "default"

    def _column_shards(self, dim: int) -> int:
        """k: the smallest divisor of D with D / k <= column_shard_dim (TorchRec needs equal shards)."""
        k = math.ceil(dim / self.column_shard_dim)
        while dim % k:
            k += 1
        return k

    def _lookups(self, t: TableConfig, hot: TableHotness | None) -> float:
        """L: ids per sample read from this table."""
        hot = hot or TableHotness()
        return len(t.features) * hot.pooling_factor * hot.access_frequency

    def _one_device_cost(self, t: TableConfig, cols: int, hot: TableHotness | None) -> tuple[float, float]:
        """(lookup, comm) bytes of a table-wise table or one column shard of width ``cols``, on its device."""
        w, b = self.world_size, self.param_bytes
        g = self.batch_size * w
        a = (w - 1) / w
        lookups = self._lookups(t, hot)
        lookup = 2 * g * lookups * cols * b
        comm = 2 * a * g * len(t.features) * cols * b + a * g * lookups * ID_BYTES
        return lookup, comm

    def _place_everywhere(
        self, t: TableConfig, kind: str, reason: str, hot: TableHotness | None, state: _State
    ) -> TablePlan:
        """A data-parallel or row-wise table: a shard on every device, or a ValueError."""
        w, b, batch = self.world_size, self.param_bytes, self.batch_size
        a = (w - 1) / w
        r, d, f = t.num_embeddings, t.embedding_dim, len(t.features)
        lookups = self._lookups(t, hot)
        row = self.row_bytes(d)
        if kind == "data_parallel":
            rows = [(0, r)] * w
            lookup = 2 * batch * lookups * d * b
            comm = 2 * a * r * d * b
        else:
            block = math.ceil(r / w)  # TorchRec's row-wise blocks: ceil(R / W) rows, the last ones shorter
            rows = [(min(i * block, r), max(0, min(block, r - i * block))) for i in range(w)]
            lookup = 2 * batch * w * lookups * d * b / w
            comm = 2 * a * batch * w * f * d * b + a * batch * lookups * ID_BYTES
        need = max(n for _, n in rows) * row
        if need > state.free_min():
            raise ValueError(
                f"table {t.name!r} ({r} x {d}, {_human(r * row)} = {r * row} bytes with {self.optimizer} state, "
                f"{kind}) needs {_human(need)} on every device but the fullest of the {w} devices of "
                f"{_human(self.device_memory_bytes)} has {_human(state.free_min())} free; add devices, raise "
                f"device_memory_bytes, or use a lighter optimizer"
            )
        ms = self._ms(lookup, comm)
        shards = tuple(Shard(i, off, n, 0, d, n * row) for i, (off, n) in enumerate(rows))
        for s in shards:
            state.add(s.rank, s.memory_bytes, lookup, comm, ms)
        return TablePlan(
            t.name, kind, shards, sum(s.memory_bytes for s in shards),  # type: ignore[arg-type]
            w * lookup, w * comm, w * ms, reason,
        )

    def _ms(self, lookup: float, comm: float) -> float:
        return 1e3 * (lookup / self.memory_bandwidth + comm / self.network_bandwidth)


class _State:
    """Running per-device totals while placing."""

    def __init__(self, world_size: int, capacity: int) -> None:
        self.capacity = capacity
        self.memory = [0] * world_size
        self.lookup = [0.0] * world_size
        self.comm = [0.0] * world_size
        self.time = [0.0] * world_size

    def add(self, rank: int, memory: int, lookup: float, comm: float, ms: float) -> None:
        self.memory[rank] += memory
        self.lookup[rank] += lookup
        self.comm[rank] += comm
        self.time[rank] += ms

    def free_min(self) -> int:
        return self.capacity - max(self.memory)

    def free_max(self) -> int:
        return self.capacity - min(self.memory)

    def least_loaded(self, memory: int) -> int | None:
        """The device with room for ``memory`` and the least estimated time (then memory, then rank)."""
        fits = [r for r in range(len(self.memory)) if self.memory[r] + memory <= self.capacity]
        return min(fits, key=lambda r: (self.time[r], self.memory[r], r)) if fits else None


def _human(n: float) -> str:
    """Bytes as B / KiB / MiB / GiB / TiB with one decimal."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
