"""The files ``sessrec predict`` and ``sessrec recommend`` write (`sessrec.scoring.output`): the format
named by the extension, every output path checked before the input is read or anything scored, and
nothing left behind by a refused run, while an interrupted one keeps its parts for the rerun.

One module-scoped world: a seeded, untrained XLNet (d_model 16) saved as a model directory, a saved
pipeline over it and co-visitation, and 200 sessions in the event layout with event times. The
commands run through the ``sessrec`` entry point (`sessrec_main`) in this process.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from test_batch_scoring import saved_model_and_pipeline
from test_prepare import ROOMY

from sessrec.data import SyntheticSource
from sessrec.data.stream import ScoringStream
from sessrec.pipeline.offline import RecommendJob, recommend_file
from sessrec.scoring import OutputFile, TopKJob, predict_file
from sessrec.scoring.output import check_folder, long_table
from sessrec.tasks import NextItemTask, SessionDataModule

torch.set_num_threads(1)
MAX_LENGTH, SESSIONS, T0 = 10, 200, 1.7e9
SOURCE = {"num_sessions": 300, "num_items": 100}
XLNET = {"d_model": 16, "n_head": 2, "n_layer": 1}
SUPPORTED = "name a .parquet or .pq file (one row per session) or a .csv file (one row per recommendation)"


@dataclass
class World:
    model_dir: Path
    pipeline_dir: Path
    events: Path  # 200 sessions, one row per event, times in seconds
    late_ms: Path  # the same, with the last session's times in milliseconds (a refusal while scoring)
    recipe: Path  # the data recipe `sessrec predict` reads with --model_dir
    pipeline_recipe: Path  # the pipeline recipe `sessrec recommend` reads


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    folder = tmp_path_factory.mktemp("scoring_outputs")
    dm = SessionDataModule(source=SyntheticSource(**SOURCE), max_length=MAX_LENGTH)
    model_dir, pipeline_dir = saved_model_and_pipeline(folder, dm, per_retriever=10, max_candidates=15)
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 6, SESSIONS)
    ids = np.repeat(rng.permutation(10 * SESSIONS)[:SESSIONS], lengths)
    items = rng.choice(np.array(dm.vocab.raw_ids.to_pylist()[2:]), size=len(ids))
    times = T0 + np.arange(len(ids), dtype=np.float64)
    events, late_ms = folder / "events.parquet", folder / "late_ms.parquet"
    pq.write_table(pa.table({"session_id": ids, "item_id": items, "timestamp": times}), events)
    times[len(ids) - lengths[-1]:] *= 1000
    pq.write_table(pa.table({"session_id": ids, "item_id": items, "timestamp": times}), late_ms)
    recipe = folder / "data.yaml"
    recipe.write_text(yaml.safe_dump({
        "data": {"source": {"class_path": "sessrec.data.SyntheticSource", "init_args": SOURCE}, "max_length": MAX_LENGTH,
                 "eval_batch_size": 32},
        "model": {"encoder": {"class_path": "sessrec.models.XLNetEncoder", "init_args": XLNET}},
        "trainer": {"enable_progress_bar": False},
    }))
    pipeline_recipe = folder / "pipeline.yaml"
    pipeline_recipe.write_text(yaml.safe_dump({"pipeline": {
        "data": {"source": {"class_path": "sessrec.data.SyntheticSource", "init_args": SOURCE}, "max_length": MAX_LENGTH},
        "covisitation": {}, "output": str(pipeline_dir)}}))
    return World(model_dir, pipeline_dir, events, late_ms, recipe, pipeline_recipe)


def command(world: World, name: str, source: Path, output: str, *extra: str) -> list[str]:
    """``sessrec predict`` of the world's model or ``sessrec recommend`` of its pipeline, `source` to `output`."""
    if name == "predict":
        return ["predict", "--config", str(world.recipe), "--model_dir", str(world.model_dir), "--data.predict_path",
                str(source), "--scoring.output", output, *extra]
    return ["recommend", "--config", str(world.pipeline_recipe), "--input_path", str(source), "--output", output,
            "--batch_size", "32", "--partition_batches", "1", *extra]


def refused(name: str, message: str) -> str:
    return f"sessrec {name}: error: {message} (--traceback for details)"


@pytest.fixture
def nothing_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The input is never read and nothing is scored: a test that reaches either fails."""

    def never(*args, **kwargs):
        raise AssertionError("the run read its input or scored before refusing its output")

    for owner, name in ((ScoringStream, "__init__"), (NextItemTask, "predict_step"), (TopKJob, "__call__"),
                        (RecommendJob, "__call__")):
        monkeypatch.setattr(owner, name, never)


# ------------------------------------------------------------------------------------------ formats
def test_predict_writes_the_format_its_extension_names(world: World, tmp_path: Path, sessrec_main) -> None:
    for name in ("recs.parquet", "recs.csv", "recs.pq"):
        assert sessrec_main(*command(world, "predict", world.events, str(tmp_path / name))) == ""
    table = pq.read_table(tmp_path / "recs.parquet")
    assert table.column_names == ["session_id", "item_ids", "scores"] and table.num_rows == SESSIONS
    assert (tmp_path / "recs.pq").read_bytes() == (tmp_path / "recs.parquet").read_bytes()
    csv = pacsv.read_csv(tmp_path / "recs.csv")
    assert csv.column_names == ["session_id", "rank", "item_id", "score"] and csv.num_rows == 20 * SESSIONS
    long = long_table(table)
    assert csv.column("rank").to_pylist()[:21] == [*range(1, 21), 1]
    for column in ("session_id", "rank", "item_id"):
        assert csv.column(column).to_pylist() == long.column(column).to_pylist()
    np.testing.assert_allclose(csv.column("score").to_numpy(), long.column("score").to_numpy(), rtol=1e-6)
    # partition by partition (what --engine dask runs): the same bytes as the Trainer's loop
    predict_file(world.model_dir, world.events, tmp_path / "parts.csv", batch_size=32, partition_batches=2)
    assert (tmp_path / "parts.csv").read_bytes() == (tmp_path / "recs.csv").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["parts.csv", "recs.csv", "recs.parquet", "recs.pq"]


def test_recommend_writes_the_format_its_extension_names_in_any_case(world: World, tmp_path: Path) -> None:
    for name in ("recs.parquet", "recs.PQ", "recs.Csv"):
        recommend_file(world.pipeline_dir, world.events, tmp_path / name, k=4, batch_size=32)
    assert (tmp_path / "recs.PQ").read_bytes() == (tmp_path / "recs.parquet").read_bytes()
    csv, table = pacsv.read_csv(tmp_path / "recs.Csv"), pq.read_table(tmp_path / "recs.parquet")
    assert csv.num_rows == 4 * SESSIONS and csv.column("item_id").equals(long_table(table).column("item_id"))


# ------------------------------------------------------------------------- refused before any work
CASES = {  # output as typed, whether --overwrite true is given, the message after the flag and the path
    "json": ("recs.json", False, ": unknown extension '.json'; " + SUPPORTED),
    "txt": ("recs.txt", False, ": unknown extension '.txt'; " + SUPPORTED),
    "no extension": ("recs", False, ": unknown extension '(none)'; " + SUPPORTED),
    "a directory": ("out", False, " is a directory; name a file in it (e.g. {tmp}/out/recs.parquet)"),
    "a slash": ("new/", False, " is a directory; name a file in it (e.g. {tmp}/new/recs.parquet)"),
    "an existing file": ("taken.parquet", False, " exists; pass {overwrite} true to replace it"),
    "the input": ("sessions.parquet", True, " is the input file; name another file for the recommendations"),
    "under a file": ("a_file/recs.csv", False, ": {tmp}/a_file is a file, not a folder"),
    # a missing folder and back: the file it names once the folder is created
    "the input via a new folder": ("new/../sessions.parquet", True, " is the input file; name another file for the "
                                   "recommendations"),
    "an existing file via a new folder": ("new/../taken.parquet", False, " exists; pass {overwrite} true to replace it"),
    "its parts folder a file": ("recs.csv", False, ": {tmp}/recs.csv.parts is a file, where the run keeps its parts; "
                                "remove it or name another file"),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", ["predict", "recommend"])
def test_an_output_that_cannot_be_written_as_named_is_refused_before_any_work(
    world: World, tmp_path: Path, sessrec_main, nothing_runs, name: str, case: str
) -> None:
    source = tmp_path / "sessions.parquet"
    source.write_bytes(world.events.read_bytes())
    (tmp_path / "out").mkdir()
    (tmp_path / "taken.parquet").write_bytes(b"kept")
    (tmp_path / "a_file").write_text("kept")
    (tmp_path / "recs.csv.parts").write_text("kept")
    before = sorted(tmp_path.rglob("*"))
    output, overwrite, message = CASES[case]
    flag, overwrite_flag = ("--scoring.output", "--scoring.overwrite") if name == "predict" else ("--output", "--overwrite")
    given = f"{tmp_path}/{output}"  # as typed: "new/" ends in a slash
    got = sessrec_main(*command(world, name, source, given, *([overwrite_flag, "true"] if overwrite else [])))
    assert got == refused(name, f"{flag} {given}{message.format(tmp=tmp_path, overwrite=overwrite_flag)}")
    assert sorted(tmp_path.rglob("*")) == before  # no parts, no temporary file, no folder
    assert source.read_bytes() == world.events.read_bytes() and (tmp_path / "taken.parquet").read_bytes() == b"kept"


def test_an_output_inside_the_pipeline_directory_is_refused_before_any_work(world: World, tmp_path: Path,
                                                                          nothing_runs) -> None:
    pipeline = tmp_path / "pipeline"
    pipeline.symlink_to(world.pipeline_dir)  # by any path to it
    before = sorted(world.pipeline_dir.rglob("*"))
    for output in (pipeline / "recs.parquet", pipeline / "new" / "recs.csv"):
        with pytest.raises(ValueError, match=rf"^--output {output} is inside {pipeline}, which the run reads; name a "
                                             "file outside it$"):
            recommend_file(pipeline, world.events, output)
    assert sorted(world.pipeline_dir.rglob("*")) == before


def test_a_predict_output_inside_the_model_directory_is_refused_before_any_work(world: World, tmp_path: Path,
                                                                              sessrec_main, nothing_runs) -> None:
    """The model directory is the library's to manage (a save adds a version, old versions are pruned with what they
    hold): an output inside it is refused by both engines, by any path to the directory."""
    model = tmp_path / "model"
    model.symlink_to(world.model_dir)
    before = sorted(world.model_dir.rglob("*"))
    output = model / "recs.parquet"
    got = sessrec_main("predict", "--config", str(world.recipe), "--model_dir", str(model), "--data.predict_path",
                       str(world.events), "--scoring.output", str(output))
    assert got == refused("predict", f"--scoring.output {output} is inside {model}, which the run reads; name a file "
                                     "outside it")
    with pytest.raises(ValueError, match=rf"^--scoring.output {model}/new/recs.csv is inside {model}, which the run"):
        predict_file(model, world.events, model / "new" / "recs.csv")
    assert sorted(world.model_dir.rglob("*")) == before


def test_a_folder_that_refuses_a_new_file_is_refused_before_any_work(world: World, tmp_path: Path,
                                                                     nothing_runs) -> None:
    with pytest.raises(PermissionError, match=r"^--output /proc/sessrec/recs.csv: cannot write in /proc \("):
        recommend_file(world.pipeline_dir, world.events, "/proc/sessrec/recs.csv")


def test_the_checks_name_the_flag_and_the_path_as_given(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^--scoring.output x/y.JSONL: unknown extension '.JSONL'; name a .parquet"):
        OutputFile("x/y.JSONL", "--scoring.output").check(overwrite=False)
    OutputFile(tmp_path / "new" / "deeper" / "recs.csv").check(overwrite=False)  # missing folders: created when written
    assert not (tmp_path / "new").exists()


def test_a_folder_reached_through_a_missing_folder_and_back_is_the_folder_it_names(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    given = f"{tmp_path}/new/../model/onnx"
    with pytest.raises(ValueError, match=rf"^--out {re.escape(given)} is inside {tmp_path}/model, which the command"):
        check_folder(given, "--out", [tmp_path / "model"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


# --------------------------------------------------------------------------- refused while scoring
@pytest.mark.parametrize("name", ["predict", "recommend"])
def test_a_parts_folder_holding_what_no_run_wrote_is_refused_and_left_as_it_is(
    world: World, tmp_path: Path, sessrec_main, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    def never(*args, **kwargs):
        raise AssertionError("the run scored before refusing the parts folder")

    def run() -> str:  # predict's parts folder: predict_file (what sessrec predict --engine dask runs)
        if name == "recommend":
            return sessrec_main(*command(world, name, world.events, str(tmp_path / "recs.csv")))
        try:
            predict_file(world.model_dir, world.events, tmp_path / "recs.csv", batch_size=32, partition_batches=2)
        except FileExistsError as err:
            return str(err)
        return ""

    for owner, method in ((TopKJob, "__call__"), (RecommendJob, "__call__")):
        monkeypatch.setattr(owner, method, never)
    parts = tmp_path / "recs.csv.parts"
    (parts / "mine").mkdir(parents=True)
    for file, text in (("manifest.json", "{}"), ("part-000000.parquet", "kept"), ("notes.txt", "kept"),
                       ("mine/data", "kept")):
        (parts / file).write_text(text)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    flag = "--scoring.output" if name == "predict" else "--output"
    message = (f"{flag} {tmp_path}/recs.csv: {parts} holds 'mine' and 1 more, which no run wrote; a run removes "
               "that folder: move what it holds elsewhere, or name another output")
    assert run() == (refused(name, message) if name == "recommend" else message)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    shutil.rmtree(parts / "mine")
    (parts / "notes.txt").unlink()
    monkeypatch.undo()  # what a run wrote only: it starts over
    assert run() == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recs.csv"]


@pytest.mark.parametrize(("name", "flags"), [("recommend", ["--k", "0"]), ("predict", ["--model.evaluation.top_k", "0"]),
                                           ("predict", ["--model.evaluation.top_k", "0", "--engine", "dask"])])
def test_a_k_below_1_names_the_option_typed_and_the_python_argument(world: World, tmp_path: Path, sessrec_main,
                                                                    nothing_runs, name: str, flags: list[str]) -> None:
    got = sessrec_main(*command(world, name, world.events, str(tmp_path / "recs.csv"), *flags))
    assert got == refused(name, f"{flags[0]} 0: the number of recommendations per session must be 1 or more")
    for score, saved in ((predict_file, world.model_dir), (recommend_file, world.pipeline_dir)):
        with pytest.raises(ValueError, match=r"^k must be an integer of 1 or more, got 0$"):
            score(saved, world.events, tmp_path / "recs.csv", k=0)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(("name", "flags", "message"), [
    ("recommend", ["--batch_size", "0"], "--batch_size 0: must be 1 or more"),
    ("recommend", ["--partition_batches", "-1"], "--partition_batches -1: must be 1 or more"),
    ("predict", ["--engine", "dask", "--partition_batches", "0"], "--partition_batches 0: must be 1 or more"),
    ("predict", ["--engine", "dask", "--data.eval_batch_size", "0"],
     "SessionDataModule eval_batch_size must be an integer >= 1, got 0"),  # the data module's setting, as every other
])
def test_a_batch_count_below_1_names_the_option_typed(world: World, tmp_path: Path, sessrec_main, nothing_runs,
                                                      name: str, flags: list[str], message: str) -> None:
    got = sessrec_main(*command(world, name, world.events, str(tmp_path / "recs.csv"), *flags))
    assert got == refused(name, message)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("argument", ["batch_size", "partition_batches"])
def test_a_batch_count_below_1_names_the_python_argument(world: World, tmp_path: Path, nothing_runs,
                                                         argument: str) -> None:
    for score, saved in ((predict_file, world.model_dir), (recommend_file, world.pipeline_dir)):
        with pytest.raises(ValueError, match=rf"^{argument} must be an integer of 1 or more, got 0$"):
            score(saved, world.events, tmp_path / "recs.csv", **{argument: 0})
    assert not list(tmp_path.iterdir())


def test_a_recommend_refused_for_its_input_leaves_nothing_behind(world: World, tmp_path: Path, sessrec_main) -> None:
    output = tmp_path / "made" / "deeper" / "recs.parquet"
    got = sessrec_main(*command(world, "recommend", world.late_ms, str(output)))
    assert got.startswith(f"sessrec recommend: error: {world.late_ms}: column 'timestamp' has the time ")
    assert "read with time_unit: s as the year 55,840 (outside 1990..2100)" in got
    assert not list(tmp_path.iterdir())  # no parts (six partitions were written before), no folders it made


def test_a_predict_refused_while_scoring_removes_its_parts_and_an_interrupted_one_keeps_them(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    real, scored = TopKJob.score, []

    def fails_in_the_third_partition(error: BaseException):
        def score(self, recommender, batch):
            if len(scored) == 2 * 2:
                raise error
            scored.append(len(batch))
            return real(self, recommender, batch)
        return score

    out = tmp_path / "recs.csv"
    monkeypatch.setattr(TopKJob, "score", fails_in_the_third_partition(ValueError("a bad row")))
    with pytest.raises(ValueError, match="a bad row"):
        predict_file(world.model_dir, world.events, out, batch_size=32, partition_batches=2)
    assert not list(tmp_path.iterdir())
    scored.clear()
    monkeypatch.setattr(TopKJob, "score", fails_in_the_third_partition(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        predict_file(world.model_dir, world.events, out, batch_size=32, partition_batches=2)
    parts = tmp_path / "recs.csv.parts"
    assert sorted(p.name for p in parts.iterdir()) == ["manifest.json", "part-000000.parquet", "part-000001.parquet"]
    assert f"[predict] the parts written are kept in {parts}: run the same command again" in capsys.readouterr().out
    monkeypatch.undo()
    counts = predict_file(world.model_dir, world.events, out, batch_size=32, partition_batches=2)
    assert (counts["partitions_resumed"], counts["partitions_written"]) == (2, 2)
    assert pacsv.read_csv(out).num_rows == 20 * SESSIONS and sorted(p.name for p in tmp_path.iterdir()) == ["recs.csv"]


def test_a_predict_refused_while_scoring_removes_the_folders_it_made(world: World, tmp_path: Path, sessrec_main,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    real = NextItemTask.predict_step

    def fails_in_the_third_batch(self, batch, batch_idx, *args):
        if batch_idx == 2:
            raise ValueError(f"{batch.keys[0]}: a bad row")
        return real(self, batch, batch_idx, *args)

    monkeypatch.setattr(NextItemTask, "predict_step", fails_in_the_third_batch)
    got = sessrec_main(*command(world, "predict", world.events, str(tmp_path / "made" / "recs.csv")))
    assert got.endswith(": a bad row (--traceback for details)")
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_a_recommend_refused_on_a_dask_worker_leaves_nothing_behind(world: World, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"as the year 55,840 \(outside 1990..2100\)"):
        recommend_file(world.pipeline_dir, world.late_ms, tmp_path / "made" / "recs.parquet", k=4, batch_size=32,
                       partition_batches=1, engine="dask", workers=2)
    assert not list(tmp_path.iterdir())


# --------------------------------------------------------------------- the folders other commands write
def test_export_refuses_an_out_folder_it_cannot_write_before_reading_the_model(world: World, tmp_path: Path,
                                                                                 sessrec_main, monkeypatch) -> None:
    from sessrec.lifecycle import export

    monkeypatch.setattr(export, "load_artifact", lambda *a: pytest.fail("the model was read before --out was checked"))
    (tmp_path / "a_file").write_text("kept")
    for out, message in [
        ("a_file", "is a file; name a folder"),
        ("a_file/x", f": {tmp_path / 'a_file'} is a file, not a folder"),
        (f"{world.model_dir}/exported", f"is inside {world.model_dir}, which the command reads; name another folder"),
    ]:
        given = out if out.startswith("/") else f"{tmp_path}/{out}"
        got = sessrec_main("export", "--model_dir", str(world.model_dir), "--format", "torchscript", "--out", given)
        assert got == refused("export", f"--out {given}{'' if message.startswith(':') else ' '}{message}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"] and not (world.model_dir / "exported").exists()


def test_prepare_never_replaces_what_is_not_a_prepared_dataset_and_leaves_nothing_when_refused(tmp_path: Path) -> None:
    from sessrec.data import EventLogSource, Schema, prepare

    events = tmp_path / "raw" / "events.parquet"
    events.parent.mkdir()
    pq.write_table(pa.table({"sid": np.arange(60) // 3, "item": np.arange(60) % 7, "t": T0 + np.arange(60.0)}), events)
    source = EventLogSource(str(events), schema=Schema(session_id="sid", item_id="item", timestamp="t"), test_fraction=0.2)
    with pytest.raises(FileExistsError, match=r"raw: exists and is not a prepared dataset \(no manifest.json\); "
                                              r"--overwrite replaces a prepared dataset only: choose another --out"):
        prepare(source, str(events.parent), engine="local", memory_budget=ROOMY, overwrite=True)
    assert events.exists()  # the folder holding the source's events is not replaced
    (tmp_path / "a_file").write_text("kept")
    with pytest.raises(PermissionError, match=r"^--out .*a_file/p: cannot write there \(Not a directory"):
        prepare(source, str(tmp_path / "a_file" / "p"), engine="local", memory_budget=ROOMY)
    broken = EventLogSource(str(events), schema=Schema(session_id="sid", item_id="price"), test_fraction=0.2)
    with pytest.raises(ValueError, match="'price'"):
        prepare(broken, str(tmp_path / "made" / "deeper" / "p"), engine="local", memory_budget=ROOMY)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "raw"]  # no folder made for the refused run
    out = prepare(source, str(tmp_path / "made" / "p"), engine="local", memory_budget=ROOMY)
    assert prepare(source, str(out), engine="local", memory_budget=ROOMY, overwrite=True) == out  # a prepared dataset is replaced
