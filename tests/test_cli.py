"""End to end through the ``sessrec`` CLI: fit -> test -> predict, and batch-scoring failure modes."""

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import torch

from sessrec.artifacts import SessionRecommender
from sessrec.cli import cli as main
from sessrec.data import ItemVocab, SchemaError
from sessrec.saved.registry import config_of, instantiate
from sessrec.tasks import SessionDataModule

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "--config", str(ROOT / "recipes" / "quickstart.yaml"),
    "--trainer.max_epochs", "3",
    "--trainer.enable_progress_bar", "false",
    "--data.source.init_args.num_sessions", "3000",
    "--data.source.init_args.num_items", "200",
    "--model.encoder.init_args.d_model", "16",
    "--model.encoder.init_args.n_head", "2",
    "--model.encoder.init_args.n_layer", "1",
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run = tmp_path_factory.mktemp("run")
    cwd = os.getcwd()
    os.chdir(run)
    try:
        main(["fit", *TINY])
    finally:
        os.chdir(cwd)
    ckpt = next(run.glob("runs/quickstart/*/checkpoints/best.ckpt"))
    return run, ckpt.parent.parent / "model"


@pytest.mark.slow
def test_fit_writes_checkpoint_and_model_directory(trained):
    _, model_dir = trained
    vocab = SessionRecommender.from_pretrained(model_dir).vocab
    assert 150 < len(vocab) <= 202
    checkpoints = model_dir.parent / "checkpoints"
    assert (checkpoints / "best.ckpt").is_file() and not (checkpoints / "vocab.parquet").exists()  # one vocabulary: the model's
    assert not list(checkpoints.glob(".*tmp*"))


def test_fit_records_the_data_module_it_trained_with(trained):
    _, model_dir = trained
    data = SessionRecommender.from_pretrained(model_dir).data
    assert data["class_path"] == "sessrec.tasks.session_data.SessionDataModule"
    assert data["init_args"]["source"]["class_path"] == "sessrec.data.sources.SyntheticSource"
    assert {k: data["init_args"]["source"]["init_args"][k] for k in ("num_sessions", "num_items")} == {
        "num_sessions": 3000, "num_items": 200}  # the recipe's values as the command line changed them
    assert {k: data["init_args"][k] for k in ("max_length", "batch_size", "vocab_path")} == {
        "max_length": 20, "batch_size": 256, "vocab_path": None}
    built = instantiate(data, expected=SessionDataModule, source=str(model_dir / "config.json"), key="data")
    assert config_of(built) == data  # the registry builds the data module it describes


def test_a_pipeline_without_a_data_block_reads_the_sessions_fit_recorded(trained, tmp_path):
    """The pipeline built from the model directory alone equals the one given the recipe's data block."""
    pytest.importorskip("lightgbm")
    from sessrec.data import SyntheticSource
    from sessrec.pipeline.retrieval.covisitation import CoVisitation
    from sessrec.pipeline.scoring import GBDTScorer
    from sessrec.pipeline_training import fitting
    from sessrec.pipeline_training.recipe import ModelRetrieval, PipelineRecipe

    _, model_dir = trained

    def metrics(data: SessionDataModule | None) -> dict[str, float]:
        recipe = PipelineRecipe(data=data, models={"m": ModelRetrieval(str(model_dir), k=20)}, covisitation=CoVisitation(),
                                covisitation_k=20, max_candidates=30, output=str(tmp_path / "pipeline"),
                                scorer=GBDTScorer(max_rounds=10, threads=1, min_data_in_leaf=5))
        pipe = recipe.build()
        fitting.fit_ranker(pipe, recipe.ranker_data(), recipe.scorer)
        return fitting.evaluate_pipeline(pipe, recipe.data.pairs("test"), [10, 20])

    written = SessionDataModule(source=SyntheticSource(num_sessions=3000, num_items=200), max_length=20)  # TINY's
    got = metrics(None)
    assert got == metrics(written) and got["recall@20"] > 0


def test_test_subcommand_reports_metrics(trained):
    run, model_dir = trained
    cli = main(["test", *TINY, "--model_dir", str(model_dir)])
    metrics = cli.trainer.callback_metrics
    # learnable synthetic transitions: far above popularity after one epoch
    assert metrics["test/recall@20"] > 0.3
    assert 0 < metrics["test/mrr@20"] <= metrics["test/recall@20"]


@pytest.mark.parametrize("sub", ["test", "validate"])
def test_evaluating_a_model_directory_without_the_sessions_to_read_is_refused(trained, sub, sessrec_main):
    """No recipe nor flag named a data source: the default generated 20,000 synthetic sessions of 1,000 items, most
    of whose targets the 200-item model had never seen, and printed their metrics with exit 0."""
    _, model_dir = trained
    assert sessrec_main(sub, "--model_dir", str(model_dir), "--trainer.enable_progress_bar", "false") == (
        f"sessrec {sub}: error: {sub} --model_dir {model_dir}: no recipe or flag names the sessions to evaluate "
        "on (data.source), and the default would be generated synthetic sessions: give the data recipe the model was "
        "trained with (--config recipes/data/<name>.yaml) or --data.source (--traceback for details)")


def sessions_file(path: Path, vocab: ItemVocab, layout: str) -> dict:
    raw = vocab.raw_ids.to_pylist()
    sessions = {"s1": raw[:3], "s2": [raw[5], 99_999_999], "s3": [raw[7]]}  # 99_999_999 is unknown
    if layout == "lists":
        pq.write_table(pa.table({"session_id": list(sessions), "item_id": list(sessions.values())}), path)
    else:
        sid = [s for s, items in sessions.items() for _ in items]
        iid = [i for items in sessions.values() for i in items]
        pacsv.write_csv(pa.table({"session_id": sid, "item_id": iid}), path)
    return sessions


@pytest.mark.slow
@pytest.mark.parametrize("layout,name", [("lists", "sessions.parquet"), ("events", "events.csv")])
def test_predict_writes_raw_topk(trained, tmp_path, layout, name):
    _, model_dir = trained
    vocab = SessionRecommender.from_pretrained(model_dir).vocab
    src = tmp_path / name
    sessions = sessions_file(src, vocab, layout)
    out = tmp_path / "recs.parquet"
    main(["predict", *TINY, "--model_dir", str(model_dir), "--data.predict_path", str(src), "--scoring.output", str(out)])
    recs = pq.read_table(out)
    assert recs.column_names == ["session_id", "item_ids", "scores"]
    assert sorted(recs.column("session_id").to_pylist()) == sorted(sessions)
    known = set(vocab.raw_ids.to_pylist())
    for items, scores in zip(recs.column("item_ids").to_pylist(), recs.column("scores").to_pylist()):
        assert len(items) == 20 and len(set(items)) == 20
        assert set(items) <= known  # raw ids, never padding/OOV
        assert scores == sorted(scores, reverse=True)
    # refuses to overwrite unless told
    with pytest.raises(FileExistsError, match="exists"):
        main(["predict", *TINY, "--model_dir", str(model_dir), "--data.predict_path", str(src), "--scoring.output", str(out)])
    main(["predict", *TINY, "--model_dir", str(model_dir), "--data.predict_path", str(src),
          "--scoring.output", str(out), "--scoring.overwrite", "true"])


@pytest.mark.slow
def test_predict_failure_leaves_nothing(trained, tmp_path):
    _, model_dir = trained
    vocab = SessionRecommender.from_pretrained(model_dir).vocab
    raw = vocab.raw_ids.to_pylist()
    # many good sessions, then a bad id far down the file: fails after batches were written
    n = 5000
    sid = np.repeat(np.arange(n), 2)
    iid = np.array(raw[:2] * n, dtype=object)
    iid[-1] = "not-an-id"
    src = tmp_path / "bad.csv"
    pacsv.write_csv(pa.table({"session_id": sid, "item_id": pa.array([str(v) for v in iid])}), src)
    out = tmp_path / "recs.parquet"
    with pytest.raises((SchemaError, TypeError)):
        main(["predict", *TINY, "--model_dir", str(model_dir), "--data.predict_path", str(src), "--scoring.output", str(out),
              "--data.eval_batch_size", "64"])
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [src]


def test_predict_rejects_empty_session(trained, tmp_path):
    _, model_dir = trained
    src = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"session_id": ["a", "b"], "item_id": pa.array([[1000], []], pa.list_(pa.int64()))}), src)
    out = tmp_path / "recs.parquet"
    with pytest.raises(SchemaError, match=r"empty.parquet.*item_id.*'b'.*no items"):
        main(["predict", *TINY, "--model_dir", str(model_dir), "--data.predict_path", str(src), "--scoring.output", str(out)])
    assert not out.exists()


def test_predict_reports_progress_in_lines_not_a_bar_of_unknown_length(trained, tmp_path, capsys):
    _, model_dir = trained
    src = tmp_path / "sessions.parquet"
    sessions_file(src, SessionRecommender.from_pretrained(model_dir).vocab, "lists")
    main(["predict", *TINY, "--trainer.enable_progress_bar", "true", "--model_dir", str(model_dir),
          "--data.predict_path", str(src), "--scoring.output", str(tmp_path / "recs.parquet")])
    shown = capsys.readouterr()
    assert re.search(r"^\[predict\] done: 1 batches, 3 sessions in \d+ s \(\d+ sessions/s\)$", shown.out, flags=re.MULTILINE)
    assert "/--" not in shown.out + shown.err and "it/s" not in shown.out + shown.err


@pytest.mark.parametrize("given, expected", [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_the_commands_let_waiting_openmp_threads_sleep_unless_the_user_says_otherwise(given, expected):
    """`sessrec.cli` sets OMP_WAIT_POLICY before torch loads libgomp (it imports no torch itself: ``sessrec --help``,
    ``promote`` and ``rollback`` start without it); a value the user gives is kept."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if given is not None:
        env["OMP_WAIT_POLICY"] = given
    code = ("import os, sys; import sessrec.cli; assert 'torch' not in sys.modules; import torch; "
            "print(os.environ['OMP_WAIT_POLICY'])")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == expected
