"""Batch scoring partition by partition (`sessrec.scoring`): ``sessrec predict|recommend --engine dask``.

One module-scoped world: a seeded, untrained XLNet (d_model 16) saved as a model directory, a saved
pipeline over it and co-visitation, and 700 sessions in the event layout (rows of a session
adjacent, row groups of 300 rows that cut sessions, a few unknown ids). The fast tests check the
partitions (whole sessions, the same batches as the whole file's stream), the local engine's parts,
resumption and refusals; the slow ones start Dask clusters of 2 worker processes and check that
they write the same bytes as one process, read the model once per worker, import no training
stack, and that a run whose worker was killed resumes from the parts it wrote.
"""

from __future__ import annotations

import itertools
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from sessrec.cli import cli
from sessrec.data import SchemaError, SyntheticSource
from sessrec.data.stream import ScoringStream
from sessrec.models import XLNetEncoder
from sessrec.pipeline.offline import recommend_file
from sessrec.pipeline.pipeline import Pipeline
from sessrec.pipeline.retrieval.covisitation import CoVisitation
from sessrec.pipeline.retrieval.session_model_retriever import SessionModelRetriever
from sessrec.pipeline_training.recipe import index_sessions
from sessrec.scoring import Engine, TopKJob, predict_file
from sessrec.tasks import NextItemTask, SessionDataModule

torch.set_num_threads(1)
MAX_LENGTH, SESSIONS, UNKNOWN = 10, 700, 99_999_999
SOURCE = {"num_sessions": 600, "num_items": 200}
XLNET = {"d_model": 16, "n_head": 2, "n_layer": 1}


@dataclass
class World:
    model_dir: Path
    pipeline_dir: Path
    events: Path  # 700 sessions, one row per event, row groups of 300 rows
    recipe: Path  # the data recipe `sessrec predict` reads with --model_dir
    session_ids: list[int]


def saved_model_and_pipeline(folder: Path, dm: SessionDataModule, per_retriever: int, max_candidates: int) -> tuple[Path, Path]:
    """An untrained tiny XLNet (seed 0) on `dm`'s vocabulary saved to ``folder/model``, and a pipeline of it and
    co-visitation (`per_retriever` candidates each) saved to ``folder/pipeline``."""
    torch.manual_seed(0)
    task = NextItemTask(num_items=dm.num_items, max_length=dm.max_length, encoder=XLNetEncoder(**XLNET))
    task.vocab = dm.vocab
    model_dir = task.recommender().save_pretrained(folder / "model")
    retrievers = {"xlnet": (SessionModelRetriever.from_pretrained(model_dir), per_retriever),
                  "covisitation": (CoVisitation().fit(index_sessions(dm), dm.num_items), per_retriever)}
    pipeline = Pipeline(dm.vocab, retrievers, max_length=dm.max_length, max_candidates=max_candidates)
    return model_dir, pipeline.save_pretrained(folder / "pipeline")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    folder = tmp_path_factory.mktemp("batch_scoring")
    dm = SessionDataModule(source=SyntheticSource(**SOURCE), max_length=MAX_LENGTH)
    model_dir, pipeline_dir = saved_model_and_pipeline(folder, dm, per_retriever=20, max_candidates=30)
    rng = np.random.default_rng(0)
    raw = np.array(dm.vocab.raw_ids.to_pylist()[2:])
    lengths = rng.integers(1, 8, SESSIONS)
    items = rng.choice(raw, size=int(lengths.sum()))
    items[[5, 400, 1500]] = UNKNOWN
    ids = rng.permutation(10 * SESSIONS)[:SESSIONS]  # not sorted: the output keeps the input's order
    events = folder / "events.parquet"
    pq.write_table(pa.table({"session_id": np.repeat(ids, lengths), "item_id": items}), events, row_group_size=300)
    recipe = folder / "data.yaml"
    recipe.write_text(yaml.safe_dump({
        "data": {"source": {"class_path": "sessrec.data.SyntheticSource", "init_args": SOURCE}, "max_length": MAX_LENGTH,
                 "eval_batch_size": 32},
        "model": {"encoder": {"class_path": "sessrec.models.XLNetEncoder", "init_args": XLNET}},
        "trainer": {"enable_progress_bar": False},
    }))
    return World(model_dir, pipeline_dir, events, recipe, ids.tolist())


def predict_args(world: World, output: Path, *extra: str) -> list[str]:
    return ["predict", "--config", str(world.recipe), "--model_dir", str(world.model_dir), "--data.predict_path",
            str(world.events), "--scoring.output", str(output), *extra]


@pytest.fixture(scope="module")
def one_process(world: World, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What ``sessrec predict`` writes in one process (the Trainer's loop, `TopKWriter`)."""
    out = tmp_path_factory.mktemp("one_process") / "recs.parquet"
    cli(predict_args(world, out))
    return out


# ------------------------------------------------------------------------------------- partitions
def test_partitions_hold_whole_sessions_and_the_same_batches_as_the_whole_file(world: World) -> None:
    vocab = Pipeline.from_pretrained(world.pipeline_dir).vocab
    whole = list(ScoringStream(world.events, vocab, max_length=MAX_LENGTH, batch_size=32, chunk_rows=128))
    stream = ScoringStream(world.events, vocab, max_length=MAX_LENGTH, batch_size=32, chunk_rows=128)
    partitions = stream.partitions(3 * 32)
    assert [p.sessions for p in partitions] == [96] * 7 + [SESSIONS - 7 * 96]
    ids = pq.read_table(world.events).column("session_id").to_numpy()
    assert partitions[0].start == 0 and partitions[-1].stop == len(ids)
    for before, after in itertools.pairwise(partitions):
        assert before.stop == after.start and ids[after.start - 1] != ids[after.start]  # cut between sessions
    parts = [b for p in partitions for b in ScoringStream(world.events, vocab, max_length=MAX_LENGTH, batch_size=32,
                                                          chunk_rows=50, rows=(p.start, p.stop))]
    assert len(parts) == len(whole) == 22
    for got, expected in zip(parts, whole):
        assert torch.equal(got.items, expected.items) and got.keys.equals(expected.keys)
    assert [k for b in whole for k in b.keys.to_pylist()] == world.session_ids


def test_batches_do_not_depend_on_the_chunks_read(world: World) -> None:
    vocab = Pipeline.from_pretrained(world.pipeline_dir).vocab
    small, large = (list(ScoringStream(world.events, vocab, max_length=MAX_LENGTH, batch_size=64, chunk_rows=rows))
                    for rows in (37, 100_000))
    assert [len(b) for b in small] == [64] * 10 + [60]
    assert all(torch.equal(a.items, b.items) and a.keys.equals(b.keys) for a, b in zip(small, large, strict=True))


def test_partitions_refuse_a_session_that_comes_back_in_another_partition(world: World, tmp_path: Path) -> None:
    src = tmp_path / "events.csv"
    pacsv.write_csv(pa.table({"session_id": [1, 1, 2, 3, 3, 1], "item_id": [10, 11, 12, 13, 14, 15]}), src)
    stream = ScoringStream(src, Pipeline.from_pretrained(world.pipeline_dir).vocab, batch_size=1, chunk_rows=2)
    with pytest.raises(SchemaError, match=r"events.csv: column 'session_id' has session 1 again at row 5"):
        stream.partitions(1)


# ---------------------------------------------------------------------------------- local engine
def test_the_local_engine_writes_what_the_trainer_writes_and_resumes(
    world: World, one_process: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "recs.parquet"
    real, calls = TopKJob.score, []

    def killed_in_the_third_partition(self, recommender, batch):
        if len(calls) == 2 * 3:  # the first batch of partition 2
            raise RuntimeError("killed")
        calls.append(len(batch))
        return real(self, recommender, batch)

    monkeypatch.setattr(TopKJob, "score", killed_in_the_third_partition)
    with pytest.raises(RuntimeError, match="killed"):
        predict_file(world.model_dir, world.events, out, batch_size=32, partition_batches=3)
    parts = out.with_name("recs.parquet.parts")
    assert sorted(p.name for p in parts.iterdir()) == ["manifest.json", "part-000000.parquet", "part-000001.parquet"]
    monkeypatch.undo()
    counts = predict_file(world.model_dir, world.events, out, batch_size=32, partition_batches=3)
    assert (counts["sessions"], counts["partitions_written"], counts["partitions_resumed"]) == (SESSIONS, 6, 2)
    first_rescored = ScoringStream(world.events, Pipeline.from_pretrained(world.pipeline_dir).vocab).partitions(96)[2].start
    assert counts["unknown_items"] == int((np.array([5, 400, 1500]) >= first_rescored).sum())  # of the partitions scored
    assert counts["loads"] == {"local": 0}  # the model was read by the run itself, not by a job
    assert out.read_bytes() == one_process.read_bytes() and not parts.exists()
    recs = pq.read_table(out)
    assert recs.column("session_id").to_pylist() == world.session_ids
    assert {len(items) for items in recs.column("item_ids").to_pylist()} == {20}  # the model's top_k


def test_a_local_run_does_not_import_distributed(world: World, tmp_path: Path) -> None:
    """Scoring on this process needs no Dask: ``predict_file`` and ``recommend_file`` run without importing
    distributed (its import costs a second, and a Dask worker is the only process that has it)."""
    import subprocess

    script = (f"import sys; from pathlib import Path; from sessrec.scoring import predict_file; "
              f"from sessrec.pipeline.offline import recommend_file; from sessrec.pipeline.pipeline import Pipeline; "
              f"predict_file(Path({str(world.model_dir)!r}), Path({str(world.events)!r}), Path({str(tmp_path / 'p.parquet')!r})); "
              f"recommend_file(Pipeline.from_pretrained({str(world.pipeline_dir)!r}), Path({str(world.events)!r}), "
              f"Path({str(tmp_path / 'r.parquet')!r})); print(sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed')))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert pq.read_table(tmp_path / "p.parquet").num_rows == pq.read_table(tmp_path / "r.parquet").num_rows == SESSIONS


@pytest.mark.parametrize("command", ["predict", "recommend"])
def test_sessions_whose_items_the_model_never_saw_are_refused_before_anything_is_written(
    world: World, tmp_path: Path, sessrec_main, command: str
) -> None:
    """A file of another catalogue (every id unknown) would be scored as empty sessions, the same list for each,
    and written with exit 0; it is refused in one line naming the file, the column and its first id."""
    events = pq.read_table(world.events)
    shifted = tmp_path / "other_catalogue.parquet"
    pq.write_table(events.set_column(1, "item_id", pa.array(events.column("item_id").to_numpy() + 10**9)), shifted)
    args = [a if a != str(world.events) else str(shifted) for a in command_args(world, command, tmp_path / "recs.parquet")]
    first, batch = 10**9 + events.column("item_id")[0].as_py(), 32 if command == "predict" else 1024  # the first batch
    read = int(np.isin(events.column("session_id").to_numpy(), world.session_ids[:batch]).sum())
    assert sessrec_main(*args) == (
        f"sessrec {command}: error: {shifted}: column 'item_id': none of the {read} item ids of its first "
        f"{min(batch, len(world.session_ids))} sessions is known to the model (the first: {first}); these are sessions "
        "of another catalogue, or another column's ids: check the file and the schema's item_id (--traceback for details)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other_catalogue.parquet", *(["pipeline.yaml"] * (command == "recommend"))]
    items = events.column("item_id").to_numpy() + 10**9
    items[:50] -= 10**9
    pq.write_table(events.set_column(1, "item_id", pa.array(items)), shifted)  # a few known ids: scored, the others OOV
    assert sessrec_main(*args) == ""
    assert pq.read_table(tmp_path / "recs.parquet").num_rows == len(world.session_ids)


def test_a_run_into_an_output_that_another_run_writes_is_refused_and_never_mixed_with_it(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs into one output at once (a scheduler, two terminals): while the first writes its parts, a second
    ``predict`` or ``recommend`` into the same file (here with another k) is refused in one line, and the file joined
    holds the first run's recommendations only."""
    out = tmp_path / "recs.parquet"
    real, refused, calls = TopKJob.score, [], []

    def others_meanwhile(self, recommender, batch):
        calls.append(len(batch))
        if len(calls) == 1:
            for other in (lambda: predict_file(world.model_dir, world.events, out, k=3, batch_size=32, partition_batches=1),
                          lambda: recommend_file(world.pipeline_dir, world.events, out, k=3, batch_size=32, now=1.7e9)):
                with pytest.raises(RuntimeError) as err:
                    other()
                refused.append(str(err.value))
        return real(self, recommender, batch)

    monkeypatch.setattr(TopKJob, "score", others_meanwhile)
    predict_file(world.model_dir, world.events, out, k=5, batch_size=32, partition_batches=3)
    parts = out.with_name("recs.parquet.parts")
    assert refused == [f"--scoring.output {out}: another run is writing it (its parts in {parts}); wait for it to "
                       "finish, or name another file",
                       f"--output {out}: another run is writing it (its parts in {parts}); wait for it to finish, or "
                       "name another file"]
    recs = pq.read_table(out)
    assert recs.column("session_id").to_pylist() == world.session_ids and not parts.exists()
    assert {len(items) for items in recs.column("item_ids").to_pylist()} == {5}


def test_recommend_writes_the_same_file_whatever_the_partitions(world: World, tmp_path: Path) -> None:
    one = recommend_file(world.pipeline_dir, world.events, tmp_path / "one.parquet", k=5, batch_size=32,
                         partition_batches=100, now=1.7e9)
    many = recommend_file(world.pipeline_dir, world.events, tmp_path / "many.parquet", k=5, batch_size=32,
                          partition_batches=1, now=1.7e9)
    assert (one["partitions_written"], many["partitions_written"]) == (1, 22)
    assert (tmp_path / "one.parquet").read_bytes() == (tmp_path / "many.parquet").read_bytes()
    csv = recommend_file(world.pipeline_dir, world.events, tmp_path / "recs.csv", k=5, batch_size=32,
                         partition_batches=4, now=1.7e9)
    assert csv["sessions"] == SESSIONS and pacsv.read_csv(tmp_path / "recs.csv").num_rows == 5 * SESSIONS


def test_recommend_and_predict_on_threads_write_the_bytes_of_one_thread(world: World, tmp_path: Path, sessrec_main) -> None:
    one = recommend_file(world.pipeline_dir, world.events, tmp_path / "one.parquet", k=5, batch_size=32,
                         partition_batches=1, now=1.7e9)  # this module runs torch on one thread
    assert one["partitions_written"] == 22
    torch.set_num_threads(2)
    try:
        three = recommend_file(world.pipeline_dir, world.events, tmp_path / "three.parquet", k=5, batch_size=32,
                               partition_batches=1, now=1.7e9, workers=3)
        assert torch.get_num_threads() == 2  # one torch thread per partition during the run only
    finally:
        torch.set_num_threads(1)
    assert three["partitions_written"] == 22 and three["sessions"] == SESSIONS
    assert (tmp_path / "one.parquet").read_bytes() == (tmp_path / "three.parquet").read_bytes()
    predict_file(world.model_dir, world.events, tmp_path / "p1.parquet", k=5, batch_size=32, partition_batches=1)
    predict_file(world.model_dir, world.events, tmp_path / "p3.parquet", k=5, batch_size=32, partition_batches=1, workers=3)
    assert (tmp_path / "p1.parquet").read_bytes() == (tmp_path / "p3.parquet").read_bytes()
    out = tmp_path / "cli.parquet"
    assert sessrec_main(*command_args(world, "recommend", out), "--now", "1.7e9", "--k", "5", "--batch_size", "32",
                        "--partition_batches", "1", "--workers", "2") == ""
    assert out.read_bytes() == (tmp_path / "one.parquet").read_bytes()


def test_threads_raise_the_first_failed_partition_once_the_running_ones_end() -> None:
    from sessrec.scoring.engine import Runner

    ended: list[int] = []

    def job(index: int, rows: tuple[int, int]) -> dict:
        if index in (1, 3):
            raise ValueError(f"partition {index}: bad row {rows[0]}")
        ended.append(index)
        return {"index": index}

    pending = [(i, (10 * i, 10 * i + 10)) for i in range(6)]
    assert Runner(None, 2).run(job, pending[:1] + pending[2:3], "parts") == [{"index": 0}, {"index": 2}]
    with pytest.raises(ValueError, match=r"^partition 1: bad row 10$"):
        Runner(None, 2).run(job, pending, "parts")
    assert torch.get_num_threads() == 1


# ------------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("command", ["predict", "recommend"])
def test_an_unknown_engine_is_one_line(world: World, tmp_path: Path, sessrec_main, command: str) -> None:
    got = sessrec_main(*command_args(world, command, tmp_path / "recs.parquet"), "--engine", "spark")
    assert got.startswith(f"sessrec {command}: error:") and "engine" in got and "spark" in got and "'dask'" in got
    assert not list(tmp_path.glob("recs.parquet*"))


@pytest.mark.parametrize("command", ["predict", "recommend"])
def test_an_output_directory_is_refused_before_any_scoring(world: World, tmp_path: Path, sessrec_main, command: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    got = sessrec_main(*command_args(world, command, out), "--engine", "dask", "--workers", "2")
    flag = "--scoring.output" if command == "predict" else "--output"
    assert got == (f"sessrec {command}: error: {flag} {out} is a directory; name a file in it (e.g. "
                   f"{out / 'recs.parquet'}) (--traceback for details)")
    assert not list(out.iterdir()) and not out.with_name("out.parts").exists()


@pytest.mark.parametrize("command", ["predict", "recommend"])
def test_an_unreachable_scheduler_is_one_line_naming_it(world: World, tmp_path: Path, sessrec_main, command: str) -> None:
    import dask
    import distributed  # noqa: F401 - its defaults loaded before dask.config.set (tests/conftest.py)

    address = "tcp://127.0.0.1:9"  # the discard port: nothing listens
    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}):
        got = sessrec_main(*command_args(world, command, tmp_path / "recs.parquet"), "--engine", "dask",
                           "--scheduler", address)
    assert got.startswith(f"sessrec {command}: error: --scheduler {address}: cannot reach a Dask scheduler there "
                          "(waited 1s, dask's distributed.comm.timeouts.connect)")
    assert not (tmp_path / "recs.parquet").exists() and not (tmp_path / "recs.parquet.parts").exists()


def test_predict_on_dask_refuses_trainer_settings_it_cannot_honour(world: World, tmp_path: Path, sessrec_main) -> None:
    got = sessrec_main(*predict_args(world, tmp_path / "recs.parquet"), "--engine", "dask", "--trainer.precision", "bf16-mixed")
    assert got == ("sessrec predict: error: --trainer.precision bf16-mixed: predict --engine dask scores on each "
                   "worker's CPU in float32, without the Trainer; set --trainer.precision 32-true or use --engine local "
                   "(--traceback for details)")
    got = sessrec_main(*predict_args(world, tmp_path / "recs.parquet"), "--partition_batches", "2")
    assert got == ("sessrec predict: error: --partition_batches needs --engine dask (the local engine scores on the "
                   "Trainer) (--traceback for details)")
    got = sessrec_main(*predict_args(world, tmp_path / "recs.parquet"), "--workers", "2")
    assert got == ("sessrec predict: error: --workers 2 needs --engine dask for sessrec predict (the local engine scores "
                   "on the Trainer) (--traceback for details)")
    got = sessrec_main("fit", "--config", str(world.recipe), "--engine", "dask")
    assert got == ("sessrec fit: error: --engine dask is for sessrec predict (and recommend); fit runs on the Trainer "
                   "(--traceback for details)")
    assert not list(tmp_path.iterdir())


def test_the_local_clusters_workers_start_without_dasks_malloc_trim_threshold() -> None:
    import dask
    import distributed  # noqa: F401 - its defaults loaded before dask.config.set (tests/conftest.py)

    from sessrec.scoring.engine import scoring_environ

    with dask.config.set({"distributed.nanny.pre-spawn-environ": {"MALLOC_TRIM_THRESHOLD_": 65536, "OMP_NUM_THREADS": 1}}):
        assert scoring_environ() == {"OMP_NUM_THREADS": 1}


def test_engine_settings_that_cannot_be_honoured_are_refused() -> None:
    with pytest.raises(ValueError, match="--workers 0: must be 1 or more"):
        Engine("local", workers=0)
    with pytest.raises(ValueError, match="--scheduler needs --engine dask"):
        Engine("local", scheduler="tcp://127.0.0.1:8786")
    with pytest.raises(ValueError, match="the cluster there has its own workers"):
        Engine("dask", scheduler="tcp://127.0.0.1:8786", workers=2)
    with pytest.raises(ValueError, match="--workers 0: must be 1 or more"):
        Engine("dask", workers=0)
    with pytest.raises(ValueError, match="--engine 'spark': unknown engine; the engines are local, dask"):
        Engine("spark")


def command_args(world: World, command: str, output: Path) -> list[str]:
    """``sessrec predict`` or ``sessrec recommend`` of the world's model or pipeline, writing `output`."""
    if command == "predict":
        return predict_args(world, output)
    recipe = output.parent / "pipeline.yaml"
    data = {"source": {"class_path": "sessrec.data.SyntheticSource", "init_args": SOURCE}, "max_length": MAX_LENGTH}
    recipe.write_text(yaml.safe_dump({"pipeline": {"data": data, "covisitation": {}, "output": str(world.pipeline_dir)}}))
    return ["recommend", "--config", str(recipe), "--input_path", str(world.events), "--output", str(output)]


@pytest.mark.slow
def test_a_bad_row_met_by_a_dask_worker_is_one_line_without_the_workers_traceback(
    world: World, tmp_path: Path, sessrec_main, capfd: pytest.CaptureFixture
) -> None:
    events = tmp_path / "events.csv"
    item = pq.read_table(world.events).column("item_id")[0].as_py()
    events.write_text("session_id,item_id\n" + "".join(f"{s},{item}\n" for s in range(40)) + "41,-5\n")
    got = sessrec_main("predict", "--config", str(world.recipe), "--model_dir", str(world.model_dir), "--data.predict_path",
                       str(events), "--scoring.output", str(tmp_path / "recs.csv"), "--data.eval_batch_size", "8",
                       "--engine", "dask", "--workers", "1", "--partition_batches", "1")
    assert got.startswith(f"sessrec predict: error: {events}: ") and "-5" in got
    assert "Traceback" not in capfd.readouterr().err
    assert not (tmp_path / "recs.csv").exists()


# -------------------------------------------------------------------------------- Dask clusters
@pytest.mark.slow
def test_predict_on_two_workers_writes_what_one_process_writes(world: World, one_process: Path, tmp_path: Path) -> None:
    out = tmp_path / "recs.parquet"
    cli(predict_args(world, out, "--engine", "dask", "--workers", "2", "--partition_batches", "3"))
    assert out.read_bytes() == one_process.read_bytes()


@pytest.mark.slow
def test_recommend_on_two_workers_writes_what_one_process_writes(world: World, tmp_path: Path) -> None:
    local = recommend_file(world.pipeline_dir, world.events, tmp_path / "local.parquet", k=5, batch_size=32,
                           partition_batches=2, now=1.7e9)
    dask = recommend_file(world.pipeline_dir, world.events, tmp_path / "dask.parquet", k=5, batch_size=32,
                          partition_batches=2, now=1.7e9, engine="dask", workers=2)
    assert (local["partitions_written"], dask["partitions_written"]) == (11, 11)
    assert sorted(dask["loads"].values()) == [1, 1]  # each worker read the pipeline once for its partitions
    assert (tmp_path / "dask.parquet").read_bytes() == (tmp_path / "local.parquet").read_bytes()


def kill_once(flag: Path, partition: int) -> object:
    """A worker plugin that ends its worker's process when partition `partition` starts executing, once
    (`flag` marks that it happened: the worker the nanny restarts gets the plugin again)."""
    from distributed.diagnostics.plugin import WorkerPlugin

    class KillOnce(WorkerPlugin):  # a local class: pickled by value, the workers need not import this test
        def transition(self, key, start, finish, **kwargs):
            if finish == "executing" and str(key).startswith(f"sessrec-partition-{partition}-") and not flag.exists():
                flag.touch()
                os._exit(1)

    return KillOnce()


@pytest.mark.slow
def test_predict_resumes_after_a_worker_is_killed(world: World, one_process: Path, tmp_path: Path) -> None:
    import dask
    from distributed import Client, LocalCluster

    from sessrec.scoring.engine import scoring_environ

    out, parts = tmp_path / "recs.parquet", tmp_path / "recs.parquet.parts"
    with dask.config.set({"distributed.scheduler.allowed-failures": 0,  # a task whose worker dies fails the run
                          "distributed.nanny.pre-spawn-environ": scoring_environ()}):
        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0")
    with cluster, Client(cluster) as client:
        client.register_plugin(kill_once(tmp_path / "killed", partition=4))
        # the error names a partition the dead worker held (4, or one queued there behind it)
        with pytest.raises(RuntimeError, match=r"a Dask worker died while scoring 'sessrec-partition-\d+-\w+' .*; the "
                                               r"parts written are kept in .*recs.parquet.parts: run the same command again"):
            predict_file(world.model_dir, world.events, out, batch_size=32, partition_batches=1,
                         engine="dask", scheduler=cluster.scheduler_address)
        assert (tmp_path / "killed").exists() and not out.exists()
        # the workers imported what scoring needs, not the training stack
        assert set(client.run(lambda: "pytorch_lightning" in sys.modules).values()) == {False}
    done = sorted(p.name for p in parts.glob("part-*.parquet"))
    assert done and "part-000004.parquet" not in done  # 4 started when a worker had finished a partition
    counts = predict_file(world.model_dir, world.events, out, batch_size=32, partition_batches=1,
                          engine="dask", workers=2)
    assert counts["partitions_resumed"] == len(done) and counts["partitions_written"] == 22 - len(done)
    assert sum(counts["loads"].values()) <= 2 and counts["sessions"] == SESSIONS
    assert out.read_bytes() == one_process.read_bytes()


def test_a_k_above_what_a_session_can_be_recommended_returns_what_there_is(world: World, tmp_path: Path) -> None:
    """With its own items excluded, a session can be recommended fewer items than the catalogue's: a k above that
    returns those, in every path (batch scoring, the Trainer's, the Python API, the server), never a seen item, an
    empty id or a -inf score."""
    from dataclasses import replace

    from fastapi.testclient import TestClient

    from sessrec.artifacts import SessionRecommender
    from sessrec.serving.app import build_app
    from sessrec.serving.recommender import SessionModelService
    from sessrec.serving.request import Limits

    recommender = SessionRecommender.from_pretrained(world.model_dir)
    recommender.inference = replace(recommender.inference, exclude_seen=True)
    excluding = recommender.save_pretrained(tmp_path / "excluding")
    service = SessionModelService.from_pretrained(excluding)
    products, k = service.vocab.num_products, 10 * service.vocab.num_products
    out, trainer = tmp_path / "recs.parquet", tmp_path / "trainer.parquet"
    predict_file(excluding, world.events, out, k=k, batch_size=32)
    cli(["predict", "--config", str(world.recipe), "--model_dir", str(excluding), "--data.predict_path", str(world.events),
         "--scoring.output", str(trainer), "--model.evaluation.top_k", str(k)])
    recs, inputs = pq.read_table(out), pq.read_table(world.events).to_pandas()
    assert recs.equals(pq.read_table(trainer))
    known = set(service.vocab.raw_ids.to_pylist()[2:])
    seen = inputs.groupby("session_id", sort=False)["item_id"].agg(lambda s: set(s) & known)
    for session, items, scores in zip(*(recs.column(c).to_pylist() for c in ("session_id", "item_ids", "scores"))):
        assert len(items) == products - len(seen[session]) and not set(items) & seen[session]
        assert None not in items and all(np.isfinite(scores)) and scores == sorted(scores, reverse=True)
    session = [int(i) for i in inputs["item_id"][:3] if int(i) in known]
    api = service.recommend([session], k=k)[0]
    assert len(api["item_ids"]) == products - len(set(session)) and not set(api["item_ids"]) & set(session)
    with TestClient(build_app(service, limits=Limits(k_max=k))) as client:
        reply = client.post("/recommend", json={"session": session, "k": k})
    assert reply.status_code == 200 and reply.json()["recommendations"] == [api]
