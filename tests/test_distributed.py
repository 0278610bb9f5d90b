"""Data-parallel training on CPU (2 processes, gloo): loaders shard by rank, and the ranks end identical."""

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import pytorch_lightning as pl
import torch

from sessrec.data import SyntheticSource
from sessrec.data.loader import SessionLoader
from sessrec.datasets.clickout_rows import RankingLoader
from sessrec.embeddings import FusedTables
from sessrec.models import MaskedItemModeling, XLNetEncoder
from sessrec.tasks import (
    ClickoutDataModule,
    DLRMTask,
    Evaluation,
    NextItemTask,
    Optimization,
    SessionDataModule,
)

torch.set_num_threads(1)
TRIVAGO = Path(__file__).resolve().parents[2] / "shared" / "data" / "trivago_rsc19_100k" / "trivago_val_100k.parquet.snappy"


@pytest.mark.parametrize("shuffle", [True, False], ids=["training", "evaluation"])
@pytest.mark.parametrize("n, world", [(103, 2), (100, 4), (7, 3)])
def test_session_loader_shards_are_disjoint_and_complete(n, world, shuffle):
    items = torch.arange(1, n + 1, dtype=torch.int32).unsqueeze(1)
    shards = []
    for rank in range(world):
        loader = SessionLoader(items, batch_size=4, shuffle=shuffle, seed=5, rank=rank, world_size=world)
        loader.set_epoch(2)
        shards.append(torch.cat([b.index for b in loader]).tolist())
        assert len(loader) == -(-loader.num_rows // 4)
    seen = [i for s in shards for i in s]
    assert len(seen) == len(set(seen))  # disjoint
    if shuffle:  # equal shares; the remainder (under `world` rows) sits out this epoch
        assert len({len(s) for s in shards}) == 1 and len(seen) == n - n % world
    else:  # every evaluation row exactly once
        assert sorted(seen) == list(range(n))


def test_ranking_loader_shards_whole_queries(tmp_path):
    from test_ranking_data import log_table  # the hand-made click-out log

    from sessrec.datasets.clickout_rows import RankingVocab, encode_rows
    from sessrec.datasets.clickouts import build_clickout_rows

    rows = build_clickout_rows(log_table(), "hand.parquet")
    tensors = encode_rows(rows, RankingVocab.fit(rows))
    parts = [RankingLoader(tensors, batch_size=3, rank=r, world_size=2) for r in range(2)]
    groups = [torch.cat([b.groups for b in loader]).tolist() for loader in parts]
    assert not set(groups[0]) & set(groups[1])  # no query split across ranks
    assert sorted(groups[0] + groups[1]) == sorted(tensors.groups.tolist())


class Record(pl.Callback):
    """Each rank's training rows and final weights, written to `folder` (picklable for ddp_spawn)."""

    def __init__(self, folder: str) -> None:
        self.folder, self.rows = folder, []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        index = getattr(batch, "index", None)
        self.rows.append((trainer.current_epoch, index.tolist() if index is not None else []))

    def on_train_end(self, trainer, pl_module) -> None:
        state = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
        torch.save({"rows": self.rows, "state": state}, f"{self.folder}/rank{trainer.global_rank}.pt")


def ddp_trainer(folder: Path, **kwargs) -> pl.Trainer:
    return pl.Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", max_epochs=2, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      callbacks=[Record(str(folder))], num_sanity_val_steps=0, **kwargs)


def ranks(folder: Path) -> list[dict]:
    return [torch.load(folder / f"rank{r}.pt", weights_only=True) for r in range(2)]


@pytest.mark.slow
def test_next_item_ddp_shards_sessions_and_ends_with_identical_weights(tmp_path):
    pl.seed_everything(0)
    data = SessionDataModule(SyntheticSource(num_sessions=600, num_items=60), max_length=8, batch_size=32)
    task = NextItemTask(num_items=data.num_items, max_length=8, encoder=XLNetEncoder(d_model=16, n_head=2, n_layer=1),
                        objective=MaskedItemModeling(), optimization=Optimization(lr=0.01))
    ddp_trainer(tmp_path).fit(task, datamodule=data)
    first, second = ranks(tmp_path)
    for epoch in (0, 1):
        a = {i for e, rows in first["rows"] if e == epoch for i in rows}
        b = {i for e, rows in second["rows"] if e == epoch for i in rows}
        assert not a & b and len(a) == len(b)  # each rank on its own half of the sessions
        assert len(a | b) >= data.tensors("train")[0].shape[0] - 2 * 32 - 1  # together, all but a partial batch
    for name, value in first["state"].items():
        torch.testing.assert_close(second["state"][name], value, rtol=0, atol=0, msg=name)


@pytest.mark.slow
@pytest.mark.skipif(not TRIVAGO.exists(), reason="trivago_rsc19_100k is not available here")
def test_dlrm_ddp_ends_with_identical_weights_and_refuses_the_fused_optimizer(tmp_path):
    small = tmp_path / "log.parquet"
    pq.write_table(pq.read_table(TRIVAGO).slice(0, 30_000), small)
    data = ClickoutDataModule(str(small), test_hours=2, valid_hours=2, batch_size=512, eval_batch_size=2048)
    common = dict(cardinalities=data.cardinalities, num_dense=data.num_dense,
                  network={"embedding_dim": 8, "dense_layers": [16, 8], "over_layers": [16]})
    pl.seed_everything(0)
    ddp_trainer(tmp_path, max_steps=6).fit(DLRMTask(sparse=FusedTables(), **common), datamodule=data)
    first, second = ranks(tmp_path)
    assert len(first["rows"]) == len(second["rows"]) == 6  # the same number of steps on both ranks
    assert any("sparse_arch" in name for name in first["state"])
    for name, value in first["state"].items():  # embedding tables included
        torch.testing.assert_close(second["state"][name], value, rtol=0, atol=0, msg=name)
    with pytest.raises(Exception, match="needs tables the dense optimizer updates"):
        ddp_trainer(tmp_path, max_steps=2).fit(DLRMTask(sparse=FusedTables(optimizer="adagrad_rowwise"), **common),
                                               datamodule=data)


@pytest.mark.slow
def test_predict_on_two_processes_writes_one_output_in_input_order(tmp_path, capfd):
    import pyarrow as pa
    import pyarrow.csv as pacsv

    from sessrec.scoring.output import long_table
    from sessrec.tasks import TopKWriter
    from sessrec.tasks.callbacks import PredictProgress

    pl.seed_everything(0)
    data = SessionDataModule(SyntheticSource(num_sessions=400, num_items=50), max_length=8, eval_batch_size=16)
    task = NextItemTask(num_items=data.num_items, max_length=8, encoder=XLNetEncoder(d_model=16, n_head=2, n_layer=1),
                        objective=MaskedItemModeling(), evaluation=Evaluation(top_k=5))
    raw = data.vocab.raw_ids.to_pylist()
    rng = np.random.default_rng(0)
    sessions = [[raw[i] for i in rng.integers(0, len(raw), rng.integers(1, 6))] for _ in range(150)]
    pq.write_table(pa.table({"session_id": list(range(1000, 1150)), "item_id": sessions}), tmp_path / "s.parquet")
    outputs = {}
    for devices, strategy, name in ((1, "auto", "recs1.parquet"), (2, "ddp_spawn", "recs2.parquet"),
                                    (2, "ddp_spawn", "recs2.csv")):
        data = SessionDataModule(SyntheticSource(num_sessions=400, num_items=50), max_length=8, eval_batch_size=16,
                                 predict_path=str(tmp_path / "s.parquet"))
        pl.Trainer(accelerator="cpu", devices=devices, strategy=strategy, logger=False, enable_progress_bar=False,
                   callbacks=[TopKWriter(str(tmp_path / name)), PredictProgress(interval=1e9)]).predict(
            task, datamodule=data, return_predictions=False)
        outputs[name] = (pacsv.read_csv if name.endswith(".csv") else pq.read_table)(tmp_path / name)
        done = [line for line in capfd.readouterr().out.splitlines() if line.startswith("[predict] done: ")]
        assert len(done) == 1 and done[0].startswith("[predict] done: 10 batches, 150 sessions in "), (name, done)
    assert outputs["recs2.parquet"].column("session_id").to_pylist() == list(range(1000, 1150))
    assert outputs["recs2.parquet"].equals(outputs["recs1.parquet"])
    long = long_table(outputs["recs1.parquet"])  # one row per recommendation, in the same order
    assert outputs["recs2.csv"].column("item_id").equals(long.column("item_id").cast(pa.int64()))
    assert outputs["recs2.csv"].column("session_id").to_pylist() == long.column("session_id").to_pylist()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recs1.parquet", "recs2.csv", "recs2.parquet", "s.parquet"]



@pytest.mark.slow
def test_predict_on_more_processes_than_batches_joins_no_part_of_an_earlier_killed_run(tmp_path):
    """A rank without a batch writes no part: the one a killed run of as many processes left under its
    name is not this run's."""
    import pyarrow as pa

    from sessrec.tasks import TopKWriter

    pl.seed_everything(0)
    data = SessionDataModule(SyntheticSource(num_sessions=400, num_items=50), max_length=8, eval_batch_size=16)
    task = NextItemTask(num_items=data.num_items, max_length=8, encoder=XLNetEncoder(d_model=16, n_head=2, n_layer=1),
                        objective=MaskedItemModeling(), evaluation=Evaluation(top_k=5))
    raw = data.vocab.raw_ids.to_pylist()
    pq.write_table(pa.table({"session_id": list(range(20)), "item_id": [[raw[i]] for i in range(20)]}), tmp_path / "s.parquet")
    stale = pa.table({"session_id": [99], "item_ids": [[raw[0]]], "scores": pa.array([[1.0]], pa.list_(pa.float32()))})
    pq.write_table(stale, tmp_path / ".recs.parquet.part-2-of-3")  # rank 2 of a killed run
    data = SessionDataModule(SyntheticSource(num_sessions=400, num_items=50), max_length=8, eval_batch_size=16,
                             predict_path=str(tmp_path / "s.parquet"))  # 2 batches: rank 2 scores none
    pl.Trainer(accelerator="cpu", devices=3, strategy="ddp_spawn", logger=False, enable_progress_bar=False,
               callbacks=[TopKWriter(str(tmp_path / "recs.parquet"))]).predict(task, datamodule=data, return_predictions=False)
    assert pq.read_table(tmp_path / "recs.parquet").column("session_id").to_pylist() == list(range(20))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recs.parquet", "s.parquet"]

@pytest.mark.slow
def test_a_test_on_three_processes_reports_the_loss_and_metrics_of_one():
    """Each process scores its shard: the loss, as the metrics, is the mean over all of them (it was process 0's
    shard's), whatever the shards' sizes."""
    pl.seed_everything(0)
    data = SessionDataModule(SyntheticSource(num_sessions=400, num_items=50), max_length=8, eval_batch_size=16)
    task = NextItemTask(num_items=data.num_items, max_length=8, encoder=XLNetEncoder(d_model=16, n_head=2, n_layer=1),
                        objective=MaskedItemModeling())
    results = {}
    for devices, strategy in ((1, "auto"), (3, "ddp_spawn")):
        data = SessionDataModule(SyntheticSource(num_sessions=400, num_items=50), max_length=8, eval_batch_size=16)
        trainer = pl.Trainer(accelerator="cpu", devices=devices, strategy=strategy, logger=False, enable_progress_bar=False)
        results[devices] = trainer.test(task, datamodule=data, verbose=False)[0]
    assert results[3].keys() == results[1].keys() and "test/loss" in results[1]
    assert results[3] == pytest.approx(results[1], rel=1e-6)


def test_bf16_mixed_precision_trains_on_cpu():
    """bf16 autocast on CPU learns as fp32 does (synthetic transitions: chance Recall@20 is about 0.12)."""
    recall = {}
    for precision in ("bf16-mixed", "32-true"):
        pl.seed_everything(0)
        data = SessionDataModule(SyntheticSource(num_sessions=600, num_items=200), max_length=8, batch_size=64)
        task = NextItemTask(num_items=data.num_items, max_length=8, encoder=XLNetEncoder(d_model=16, n_head=2, n_layer=1),
                            objective=MaskedItemModeling(), optimization=Optimization(lr=0.01))
        trainer = pl.Trainer(accelerator="cpu", precision=precision, max_epochs=3, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(task, datamodule=data)
        assert torch.isfinite(trainer.callback_metrics["train/loss"])
        assert task.model.item_embedding.weight.dtype == torch.float32  # weights stay fp32; autocast computes in bf16
        recall[precision] = float(trainer.callback_metrics["val/recall@20"])
    assert recall["bf16-mixed"] > 0.4 and abs(recall["bf16-mixed"] - recall["32-true"]) < 0.05


def test_a_data_module_set_up_in_a_process_group_destroys_it_before_the_interpreter_exits(tmp_path):
    """Gloo's threads left to the interpreter's teardown may abort a spawned process after its work is
    done; setup makes the process destroy its group at exit (an earlier atexit handler runs later)."""
    import subprocess
    import sys

    script = f"""
import atexit
import torch.distributed as dist
from sessrec.data import SyntheticSource
from sessrec.tasks import SessionDataModule
atexit.register(lambda: print("initialized at exit:", dist.is_initialized()))
dist.init_process_group("gloo", init_method="file://{tmp_path / 'store'}", rank=0, world_size=1)
SessionDataModule(SyntheticSource(num_sessions=50, num_items=20), max_length=4).setup("fit")
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "initialized at exit: False"
