"""TorchRec execution of our sharding plans: 2 processes over gloo train like 1 process.

Skipped when the ``torchrec`` extra is absent. The 2-process run spawns once and trains every
placement in turn inside one process group (the imports cost most of the time).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from torch import nn

pytest.importorskip("torchrec")

from sessrec.embeddings import FusedTables, TorchRecTables
from sessrec.embeddings.config import TableConfig
from sessrec.embeddings.jagged import SparseFeatures
from sessrec.embeddings.planner import ShardingPlanner
from sessrec.embeddings.sharding import (
    embedding_bag_collection,
    load_full_state_dict,
    pooled_features,
    shard_model,
    to_embedding_bag_configs,
    to_keyed_jagged_tensor,
    to_torchrec_plan,
)

TABLES = [
    TableConfig("user", num_embeddings=40, embedding_dim=8),
    TableConfig("item", num_embeddings=60, embedding_dim=8, pooling="mean", feature_names=("item", "history")),
    TableConfig("tags", num_embeddings=24, embedding_dim=16),
]
FEATURES = [f for t in TABLES for f in t.features]
DENSE, GLOBAL_BATCH, STEPS, LR, WORLD = 4, 32, 6, 1.0, 2
# (name, per-table placement constraints, fused optimizer in backward)
CASES = [
    ("table_wise", {"user": "table_wise", "item": "table_wise", "tags": "table_wise"}, False),
    ("row_wise", {"user": "row_wise", "item": "row_wise", "tags": "row_wise"}, False),
    ("row_wise_fused", {"user": "row_wise", "item": "row_wise", "tags": "row_wise"}, True),
    ("mixed", {"user": "data_parallel", "item": "table_wise", "tags": "column_wise"}, False),
]


class TinyRanker(nn.Module):
    """Pooled embeddings beside dense features, into a 2-layer head: one logit per sample."""

    def __init__(self) -> None:
        super().__init__()
        self.sparse = embedding_bag_collection(TABLES)
        width = DENSE + sum(len(t.features) * t.embedding_dim for t in TABLES)
        self.head = nn.Sequential(nn.Linear(width, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, kjt, dense: torch.Tensor) -> torch.Tensor:
        # by key: a sharded collection orders its output columns by sharding group
        pooled = pooled_features(self.sparse(kjt), FEATURES)  # (B, sum of F_t * D_t)
        return self.head(torch.cat([dense, pooled], dim=1)).squeeze(-1)


def build_model() -> TinyRanker:
    torch.manual_seed(0)
    return TinyRanker()


def batch(step: int, lo: int, hi: int) -> tuple[SparseFeatures, torch.Tensor, torch.Tensor]:
    """Samples [lo, hi) of the seeded global batch of ``step``: ids (multi-hot with -1 padding), dense, labels."""
    g = torch.Generator().manual_seed(1000 + step % 2)  # two batches in turn
    user = torch.randint(0, 40, (GLOBAL_BATCH,), generator=g)
    item = torch.randint(0, 60, (GLOBAL_BATCH, 3), generator=g)
    item[torch.rand(GLOBAL_BATCH, 3, generator=g) < 0.3] = -1  # bags of 0 to 3 ids
    history = torch.randint(-20, 60, (GLOBAL_BATCH, 4), generator=g).clamp(min=-1)
    tags = torch.randint(-8, 24, (GLOBAL_BATCH, 2), generator=g).clamp(min=-1)
    dense = torch.randn(GLOBAL_BATCH, DENSE, generator=g)
    labels = ((user % 2 == 0) | (dense[:, 0] > 1)).float()  # learnable from the user id and one dense value
    ids = {"user": user[lo:hi], "item": item[lo:hi], "history": history[lo:hi], "tags": tags[lo:hi]}
    return SparseFeatures.from_dense(ids), dense[lo:hi], labels[lo:hi]


def train_one_process() -> list[float]:
    model = build_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        features, dense, labels = batch(step, 0, GLOBAL_BATCH)
        loss = nn.functional.binary_cross_entropy_with_logits(model(to_keyed_jagged_tensor(features), dense), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def plan_for(constraints: dict[str, str]):
    planner = ShardingPlanner(world_size=WORLD, device_memory_bytes=1 << 20, batch_size=GLOBAL_BATCH // WORLD,
                              optimizer="sgd", data_parallel_max_bytes=0, column_shard_dim=8)
    return planner.plan(TABLES, constraints=constraints)


def _worker(rank: int, rendezvous: str, out_path: str) -> None:
    import torch.distributed as dist
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    torch.set_num_threads(1)
    # a file rendezvous, not a TCP port: a port probed free can be taken by another process
    # before the workers bind it, which failed one full-suite run
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=WORLD)
    per_rank = GLOBAL_BATCH // WORLD
    results = {}
    for name, constraints, fused in CASES:
        model = build_model()
        full = {k: v.clone() for k, v in model.state_dict().items()}
        if fused:
            apply_optimizer_in_backward(torch.optim.SGD, model.sparse.parameters(), {"lr": LR})
        sharded = shard_model(model, plan_for(constraints))
        load_full_state_dict(sharded, full)
        params = dict(in_backward_optimizer_filter(sharded.named_parameters())) if fused else dict(sharded.named_parameters())
        opt = torch.optim.SGD(params.values(), lr=LR)
        losses = []
        for step in range(STEPS):
            features, dense, labels = batch(step, rank * per_rank, (rank + 1) * per_rank)
            logits = sharded(to_keyed_jagged_tensor(features), dense)
            loss = nn.functional.binary_cross_entropy_with_logits(logits, labels)  # mean over this rank's half
            opt.zero_grad()
            loss.backward()
            opt.step()
            total = loss.detach().clone()
            dist.all_reduce(total)  # the global batch's mean loss: the ranks' halves are equal
            losses.append(total.item() / WORLD)
        results[name] = losses
        # every collective of this plan has completed on both ranks before its modules go away
        # (a data-parallel table's DDP reducer torn down while the other rank still reduces aborts gloo)
        dist.barrier()
        del sharded, opt  # DDP's reducer and the sharded modules hold the group: release them first
    # both ranks reach here before the group goes away: tearing it down while the other rank is
    # still in a collective aborts gloo ("terminate called without an active exception")
    dist.barrier()
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


@pytest.mark.slow
def test_two_processes_train_like_one(tmp_path):
    import torch.multiprocessing as mp

    expected = train_one_process()
    # it learns: each of the two batches scores better two steps later
    assert expected[4] < expected[0] - 0.01 and expected[5] < expected[1] - 0.005, expected
    out = tmp_path / "losses.json"
    context = mp.spawn(_worker, args=(str(tmp_path / "rendezvous"), str(out)), nprocs=WORLD, join=False)
    deadline = time.monotonic() + 300  # a collective that never completes fails the test, not CI
    while not context.join(timeout=5):  # raises if a worker raised
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail("the 2-process run did not finish in 300 s")
    got = json.loads(out.read_text())
    assert set(got) == {name for name, _, _ in CASES}
    for name, losses in got.items():
        # float32 sums in another order (the gradient all-reduce, row-wise partial sums) move the
        # loss by ~1e-7; a real fault (a gradient not divided by the world size, a wrong shard
        # offset, a mean pooled twice) moves it by 1e-3 or more from the first steps.
        assert losses == pytest.approx(expected, abs=1e-5), name


def test_conversions():
    configs = to_embedding_bag_configs(TABLES)
    assert [c.name for c in configs] == ["user", "item", "tags"]
    assert configs[1].feature_names == ["item", "history"] and configs[1].pooling.value == "MEAN"
    features, _, _ = batch(0, 0, 4)
    kjt = to_keyed_jagged_tensor(features)
    assert kjt.keys() == ["user", "item", "history", "tags"]
    assert torch.equal(kjt.values(), features.values) and torch.equal(kjt.lengths(), features.lengths)
    with pytest.raises(TypeError, match="SparseFeatures"):
        to_keyed_jagged_tensor({"user": torch.tensor([1])})


def test_plan_conversion():
    model = build_model()
    tr = to_torchrec_plan(model, plan_for(CASES[3][1]))
    module_plan = tr.plan["sparse"]
    assert module_plan["user"].sharding_type == "data_parallel"
    assert module_plan["item"].sharding_type == "table_wise"
    assert module_plan["tags"].sharding_type == "column_wise" and len(module_plan["tags"].ranks) == 2
    with pytest.raises(ValueError, match="process group has 3"):
        to_torchrec_plan(model, plan_for(CASES[3][1]), world_size=3)


def test_row_wise_mean_beside_other_placements_is_refused():
    model = build_model()
    plan = plan_for({"user": "table_wise", "item": "row_wise", "tags": "table_wise"})
    with pytest.raises(ValueError, match=r"mean-pooled tables \['item'\] are row-wise"):
        to_torchrec_plan(model, plan)


def test_table_missing_from_plan():
    model = build_model()
    plan = ShardingPlanner(world_size=WORLD, device_memory_bytes=1 << 20, batch_size=16).plan(TABLES[:2])
    with pytest.raises(ValueError, match=r"tables \['tags'\].*not in the plan"):
        to_torchrec_plan(model, plan)


# ----------------------------------------------------------------- DLRMTask under TorchRecStrategy
TRIVAGO = Path(__file__).resolve().parents[2] / "shared" / "data" / "trivago_rsc19_100k" / "trivago_val_100k.parquet.snappy"


class Losses(pl.Callback):
    """Each rank's training loss per step and the tables' placements, written to `folder` at the end (picklable for spawn)."""

    def __init__(self, folder: str) -> None:
        self.folder, self.losses = folder, []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["loss"]))

    def on_train_end(self, trainer, pl_module) -> None:
        Path(self.folder).mkdir(exist_ok=True)
        plan = getattr(trainer.strategy, "plan", None)
        placed = {t.table: [t.placement, sorted({s.rank for s in t.shards})] for t in plan.tables} if plan else {}
        Path(self.folder, f"losses{trainer.global_rank}.json").write_text(json.dumps({"losses": self.losses, "plan": placed}))


def trivago_slice(tmp_path: Path, rows: int = 30_000) -> str:
    import pyarrow.parquet as pq

    small = tmp_path / "log.parquet"
    pq.write_table(pq.read_table(TRIVAGO).slice(0, rows), small)
    return str(small)


@pytest.mark.slow
@pytest.mark.skipif(not TRIVAGO.exists(), reason="trivago_rsc19_100k is not available here")
def test_dlrm_task_sharded_over_two_processes_trains_like_one(tmp_path):
    from sessrec.tasks import ClickoutDataModule, DLRMTask, TorchRecStrategy

    path, steps, batch = trivago_slice(tmp_path), 8, 512

    def data(batch_size: int) -> ClickoutDataModule:
        return ClickoutDataModule(path, test_hours=2, valid_hours=2, batch_size=batch_size, eval_batch_size=2048)

    def task(backend: str) -> DLRMTask:
        pl.seed_everything(0)
        d = data(batch)
        return DLRMTask(cardinalities=d.cardinalities, num_dense=d.num_dense,
                        network={"embedding_dim": 8, "dense_layers": [16, 8], "over_layers": [16]},
                        sparse=FusedTables() if backend == "fused" else TorchRecTables(), optimization={"lr": 0.01})

    def trainer(**kwargs) -> pl.Trainer:
        return pl.Trainer(accelerator="cpu", max_steps=steps, logger=False, enable_checkpointing=False,
                          enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                          limit_val_batches=0, **kwargs)

    # one process, the embedding core's tables: the reference
    one = task("fused")
    trainer(devices=1, callbacks=[Losses(str(tmp_path / "one"))]).fit(one, datamodule=data(batch))
    # two processes, TorchRec tables sharded (the largest row-wise, the rest one table per rank), half the batch each
    two = task("torchrec")
    names = sorted(two.hparams.cardinalities, key=lambda n: -two.hparams.cardinalities[n])
    constraints = {n: "row_wise" if i == 0 else "table_wise" for i, n in enumerate(names)}
    strategy = TorchRecStrategy(start_method="spawn", data_parallel_max_bytes=0, constraints=constraints)
    trainer(devices=2, strategy=strategy, callbacks=[Losses(str(tmp_path / "two"))]).fit(two, datamodule=data(batch // 2))

    expected = json.loads((tmp_path / "one" / "losses0.json").read_text())["losses"]
    runs = [json.loads((tmp_path / "two" / f"losses{r}.json").read_text()) for r in range(2)]
    halves = [run["losses"] for run in runs]
    placed = runs[0]["plan"]
    assert placed[names[0]] == ["row_wise", [0, 1]]  # the largest table split by rows over both ranks
    assert {placed[n][0] for n in names[1:]} == {"table_wise"}
    assert {r for n in names[1:] for r in placed[n][1]} == {0, 1}  # whole tables on both ranks
    assert len(expected) == len(halves[0]) == len(halves[1]) == steps
    assert expected[-1] < expected[0] - 0.05  # it learns
    # each rank's mean over its half; the global batch's loss is their mean
    assert [(a + b) / 2 for a, b in zip(*halves)] == pytest.approx(expected, abs=1e-5)
    # back in this process the trained model is whole (the workers assembled the shards): weights and test MRR agree
    dense = {k: v for k, v in one.model.state_dict().items() if not k.startswith("sparse_arch.")}
    for name, value in dense.items():
        torch.testing.assert_close(two.model.state_dict()[name], value, atol=1e-5, rtol=0, msg=name)
    for table in names:
        torch.testing.assert_close(two.model.sparse_arch.table_weight(table), one.model.sparse_arch.table_weight(table),
                                   atol=1e-5, rtol=0, msg=table)
    tested = {}
    for name, t in (("one", one), ("two", two)):
        out = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False).test(t, datamodule=data(batch), verbose=False)
        tested[name] = out[0]["test/mrr"]
    assert tested["two"] == pytest.approx(tested["one"], abs=1e-4)
    assert 0.2 < tested["one"] < 1


def test_torchrec_backend_starts_as_the_embedding_core():
    from sessrec.models.dlrm import DLRM

    tables = [TableConfig("a", 50, 8), TableConfig("b", 30, 8)]
    models = {}
    for backend in ("fused", "torchrec"):
        torch.manual_seed(0)
        models[backend] = DLRM(3, tables, [16, 8], [16], seed=3, sparse=FusedTables() if backend == "fused" else TorchRecTables())
    g = torch.Generator().manual_seed(1)
    features = SparseFeatures.from_dense({"a": torch.randint(-1, 50, (6, 3), generator=g), "b": torch.randint(0, 30, (6,), generator=g)})
    dense = torch.randn(6, 3, generator=g)
    out = {k: m(dense, features) for k, m in models.items()}
    assert out["fused"].abs().min() > 0  # a real output, not zeros
    torch.testing.assert_close(out["torchrec"], out["fused"], rtol=0, atol=1e-6)
    for t in ("a", "b"):
        assert torch.equal(models["torchrec"].sparse_arch.table_weight(t), models["fused"].sparse_arch.table_weight(t))


def test_torchrec_strategy_needs_torchrec_tables():
    from sessrec.tasks import TorchRecStrategy

    with pytest.raises(ValueError, match=r"has none: build the DLRM with sparse: TorchRecTables\(\)"):
        TorchRecStrategy()._tables(nn.Linear(2, 2))


def test_torchrec_tables_refuse_per_id_weights_they_would_ignore():
    tables = [TableConfig("a", 10, 4), TableConfig("b", 7, 4, pooling="mean")]
    arch = TorchRecTables().build(tables, seed=0)
    ids = {"a": torch.tensor([[1, 2], [3, -1]]), "b": torch.tensor([[0, 6], [5, -1]])}
    weights = {"a": torch.tensor([[0.5, 2.0], [3.0, 1.0]]), "b": torch.tensor([[1.0, 0.25], [2.0, 1.0]])}
    with pytest.raises(ValueError, match=r"TorchRecTables take no per-id weights; the batch has weights for \['a', 'b'\]"):
        arch(SparseFeatures.from_dense(ids, weights))
