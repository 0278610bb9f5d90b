"""From checkpoint to production: checkpoints that resume fit, model directories, resume after SIGKILL,
growing the catalogue and the retraining gate."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute
import pyarrow.parquet as pq
import pytest
import pytorch_lightning as pl
import torch
import yaml

from sessrec.artifacts import ClickRanker, SessionRecommender, load_artifact
from sessrec.cli import cli
from sessrec.data import ItemVocab, Schema, SchemaError, SideFeatures, TimeWindowSource, generate_sessions
from sessrec.data.loader import SessionLoader
from sessrec.embeddings import DynamicTables
from sessrec.lifecycle.gate import Gate
from sessrec.lifecycle.retrain import retrain, summary
from sessrec.models import (
    CausalLanguageModeling,
    ElectraEncoder,
    GRU4RecEncoder,
    HSTUEncoder,
    MaskedItemModeling,
    ReplacedTokenDetection,
    SASRecEncoder,
    XLNetEncoder,
)
from sessrec.serving.recommender import SessionModelService, load_recommender
from sessrec.tasks import DLRMTask, NextItemTask, Optimization, SessionDataModule
from sessrec.tasks.checkpointing import best_of_run, with_more_items

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]


def tiny_recipe(run: Path, max_epochs: int = 2) -> Path:
    """A 2-epoch XLNet-MLM fit of ~20 steps per epoch that saves last.ckpt every 5 steps."""
    recipe = {
        "seed_everything": 0,
        "trainer": {
            "max_epochs": max_epochs, "accelerator": "cpu", "logger": False, "default_root_dir": str(run),
            "enable_progress_bar": False, "enable_model_summary": False,
            "callbacks": [{"class_path": "pytorch_lightning.callbacks.ModelCheckpoint",
                           "init_args": {"monitor": "val/ndcg@20", "mode": "max", "save_top_k": 1, "filename": "best",
                                         "dirpath": str(run / "checkpoints")}}],
        },
        "last_checkpoint": {"every_n_train_steps": 5},
        "model": {"encoder": {"class_path": "sessrec.models.XLNetEncoder",
                              "init_args": {"d_model": 16, "n_head": 2, "n_layer": 1, "dropout": 0.1}},
                  "optimization": {"lr": 0.003}, "schedule": {"warmup_steps": 5}},
        "data": {"source": {"class_path": "sessrec.data.SyntheticSource",
                            "init_args": {"num_sessions": 3000, "num_items": 100}},
                 "max_length": 10, "batch_size": 128},
    }
    path = run / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    run = tmp_path_factory.mktemp("fit")
    recipe = tiny_recipe(run)
    fit = cli(["fit", "--config", str(recipe)])
    return run, recipe, fit


def final_metric(fit) -> float:
    return float(fit.trainer.callback_metrics["val/ndcg@20"])


@pytest.mark.slow
def test_checkpoint_loads_weights_only_and_carries_the_vocabulary(fitted):
    run, _, fit = fitted
    checkpoint = torch.load(run / "checkpoints" / "best.ckpt", weights_only=True)
    assert checkpoint["hyper_parameters"]["encoder"]["class_path"] == "sessrec.models.xlnet.XLNetEncoder"
    saved = ItemVocab.empty().load_state_dict(checkpoint["SessionDataModule"]["vocab"], "ckpt")
    assert saved == fit.datamodule.vocab
    assert (run / "checkpoints" / "last.ckpt").exists()


def test_a_checkpoint_holding_the_vocabulary_as_file_bytes_is_refused_in_one_line(fitted, tmp_path):
    """The data module state holds the vocabulary's state dict; the bare bytes of its parquet file are refused."""
    run, _, fit = fitted
    checkpoint = torch.load(run / "checkpoints" / "best.ckpt", weights_only=True)
    fit.datamodule.vocab.save(tmp_path / "vocab.parquet")
    data = bytearray((tmp_path / "vocab.parquet").read_bytes())
    checkpoint["SessionDataModule"] = {"vocab": torch.frombuffer(data, dtype=torch.uint8)}
    data = SessionDataModule(source=fit.datamodule.source, max_length=5)
    with pytest.raises(ValueError, match=r"the checkpoint's vocabulary: expected a state dict with the key 'parquet', got Tensor$"):
        data.load_state_dict(checkpoint["SessionDataModule"])


def test_the_last_checkpoint_restores_the_task_of_its_run(fitted):
    run, _, fit = fitted
    task = best_of_run(fit.model, run / "checkpoints" / "last.ckpt", fit.datamodule)
    original = fit.model.eval()
    items = torch.tensor([[0, 0, 5, 9, 12], [3, 4, 5, 6, 7]])
    torch.testing.assert_close(task.model(items, task.objective), original.model(items, original.objective))
    assert task.vocab == fit.datamodule.vocab


def test_fit_writes_the_model_directory_of_the_best_checkpoint(fitted):
    run, _, fit = fitted
    recommender = SessionRecommender.from_pretrained(run / "model")
    best = best_of_run(fit.model, run / "checkpoints" / "best.ckpt", fit.datamodule)
    items = torch.tensor([[0, 2, 3, 4], [9, 8, 7, 6]])
    torch.testing.assert_close(recommender.scores(items), best.model(items, best.objective))
    config = json.loads((run / "model" / "config.json").read_text())
    assert config["format"] == "sessrec.model" and config["version"] == 5 and "task" not in config
    assert config["model"]["init_args"]["num_items"] == len(recommender.vocab) and recommender.vocab == fit.datamodule.vocab
    assert not (run / "checkpoints" / "vocab.parquet").exists()  # the vocabulary is stored once: in the model directory
    train = fit.datamodule.splits.train  # the last event of the training split: where a retrain may start
    assert config["train_end"] == recommender.train_end == max(max(t) for t in train.column("timestamp").to_pylist())


def test_a_fit_records_the_network_once_and_every_loader_builds_it_from_there(fitted):
    """The served recommender (`load_recommender`) and the task that evaluates and retrains
    (`NextItemTask.from_recommender` of `load_artifact`) read the one ``model`` section and agree."""
    run, _, _ = fitted
    text = (run / "model" / "config.json").read_text()
    config = json.loads(text)
    assert text.count('"sessrec.models.xlnet.XLNetEncoder"') == 1 and text.count('"d_model"') == 1
    assert config["model"]["init_args"]["encoder"]["init_args"]["d_model"] == 16
    served = load_recommender(run / "model")
    task = NextItemTask.from_recommender(load_artifact(run / "model")).eval()
    assert task.hparams["encoder"] == config["model"]["init_args"]["encoder"]
    items = torch.tensor([[0, 2, 3, 4], [9, 8, 7, 6]])
    with torch.no_grad():
        torch.testing.assert_close(task.model(items, task.objective), served.recommender.scores(items), rtol=0, atol=0)


@pytest.mark.slow
def test_resume_after_sigkill_ends_where_the_uninterrupted_run_ends(fitted, tmp_path):
    """Killed mid-epoch 1 by SIGKILL, resumed from last.ckpt: the same final validation metric."""
    _, _, fit = fitted
    recipe = tiny_recipe(tmp_path)
    killer = (
        "import os, signal\n"
        "from sessrec.tasks import NextItemTask\n"
        "step = NextItemTask.training_step\n"
        "def killed(self, batch, i):\n"
        "    if self.global_step == 27: os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return step(self, batch, i)\n"
        "NextItemTask.training_step = killed\n"
        "from sessrec.cli import cli\n"
        f"cli(['fit', '--config', {str(recipe)!r}])\n"
    )
    done = subprocess.run([sys.executable, "-c", killer], capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == -signal.SIGKILL
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 25
    assert not list((tmp_path / "checkpoints").glob("*.tmp"))
    resumed = cli(["fit", "--config", str(recipe), "--ckpt_path", str(last)])
    assert resumed.trainer.global_step == fit.trainer.global_step
    assert abs(final_metric(resumed) - final_metric(fit)) < 1e-4


def test_loader_state_continues_the_epoch():
    items = torch.arange(1, 101, dtype=torch.int32).reshape(50, 2)
    loader = SessionLoader(items, batch_size=8, shuffle=True, seed=3)
    loader.set_epoch(4)
    full = [b.index.tolist() for b in loader]
    loader.set_epoch(4)
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.state_dict()
    assert state["epoch"] == 4 and state["position"] == 3
    fresh = SessionLoader(items, batch_size=8, shuffle=True, seed=3)
    fresh.load_state_dict(state)
    assert [b.index.tolist() for b in fresh] == full[3:]


def test_test_without_a_checkpoint_is_refused(fitted):
    _, recipe, _ = fitted
    with pytest.raises(ValueError, match="test needs --model_dir: the model NextItemTask is trained"):
        cli(["test", "--config", str(recipe)])


@pytest.mark.slow
def test_test_and_predict_create_no_run_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tiny = ["--config", str(ROOT / "recipes" / "quickstart.yaml"), "--trainer.max_epochs", "1",
            "--trainer.enable_progress_bar", "false", "--data.source.init_args.num_sessions", "1000",
            "--data.source.init_args.num_items", "100", "--model.encoder.init_args.d_model", "16",
            "--model.encoder.init_args.n_head", "2", "--model.encoder.init_args.n_layer", "1"]
    cli(["fit", *tiny])
    before = sorted(p.name for p in (tmp_path / "runs" / "quickstart").iterdir())
    cli(["test", *tiny, "--model_dir", str(tmp_path / "runs" / "quickstart" / "version_0" / "model")])
    assert sorted(p.name for p in (tmp_path / "runs" / "quickstart").iterdir()) == before == ["version_0"]


ENCODERS = {
    "xlnet-mlm": (lambda: XLNetEncoder(d_model=16, n_head=2, n_layer=1), MaskedItemModeling),
    "gru4rec-clm": (lambda: GRU4RecEncoder(d_model=16), CausalLanguageModeling),
    "sasrec-clm": (lambda: SASRecEncoder(d_model=16, n_head=2, n_layer=1), CausalLanguageModeling),
    "electra-rtd": (lambda: ElectraEncoder(d_model=16, n_head=2, n_layer=1), ReplacedTokenDetection),
}


@pytest.mark.parametrize("name", sorted(ENCODERS))
def test_model_directory_round_trip(name, tmp_path):
    torch.manual_seed(0)
    encoder, objective = ENCODERS[name]
    vocab = ItemVocab(pa.array(np.arange(100, 130)), np.arange(30, 0, -1))
    task = NextItemTask(num_items=len(vocab), max_length=8, encoder=encoder(), objective=objective()).eval()
    task.vocab = vocab
    loaded = SessionRecommender.from_pretrained(task.recommender().save_pretrained(tmp_path / "model"))
    items = torch.tensor([[0, 0, 3, 4, 5], [7, 8, 9, 10, 11]])
    torch.testing.assert_close(loaded.scores(items), task.model(items, task.objective))
    assert loaded.vocab == vocab
    recs = SessionModelService(loaded).recommend([["101", "102", "103"], ["110"]], k=5)  # id strings are cast
    top = task.model(torch.tensor([[3, 4, 5], [0, 0, 12]]), task.objective).topk(5, dim=1).indices
    assert [r["item_ids"] for r in recs] == [vocab.decode(row.numpy()).to_pylist() for row in top]


def test_dlrm_model_directory_round_trip(tmp_path):
    from sessrec.datasets.clickout_rows import CLICKS, SPARSE_FEATURES, RankingVocab
    from sessrec.datasets.clickouts import DENSE_FEATURES

    torch.manual_seed(0)
    vocabs = {name: ItemVocab(pa.array([f"{name}{i}" for i in range(5)]), np.ones(5, dtype=np.int64))
              for name in (*SPARSE_FEATURES, CLICKS)}
    vocab = RankingVocab(vocabs)
    task = DLRMTask(cardinalities=vocab.cardinalities, num_dense=len(DENSE_FEATURES),
                    network={"embedding_dim": 4, "dense_layers": [8, 4], "over_layers": [8]}).eval()
    task.vocab = vocab
    loaded = DLRMTask.from_ranker(ClickRanker.from_pretrained(task.ranker().save_pretrained(tmp_path / "dlrm")))
    for name, value in task.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], value)
    assert loaded.vocab.cardinalities == vocab.cardinalities


def test_load_recommender_reads_model_and_pipeline_directories(tmp_path):
    vocab = ItemVocab(pa.array(np.arange(100, 130)), np.arange(30, 0, -1))
    task = NextItemTask(num_items=len(vocab), max_length=8, encoder=GRU4RecEncoder(d_model=8),
                        objective=CausalLanguageModeling())
    task.vocab = vocab
    task.recommender().save_pretrained(tmp_path / "model")
    assert isinstance(load_recommender(tmp_path / "model"), SessionModelService)
    with pytest.raises(FileNotFoundError, match="neither a saved pipeline .* nor a model directory"):
        load_recommender(tmp_path)


def test_growing_the_catalogue_keeps_every_learned_row():
    torch.manual_seed(0)
    vocab = ItemVocab(pa.array([7, 5, 9]), np.array([3, 2, 1]))
    grown, old_to_new = vocab.grow(pa.array([9, 11, 11, 12, 7]))
    assert grown.raw_ids.to_pylist() == [7, 5, 9, 11, 12]
    assert grown.counts.tolist() == [4, 2, 2, 2, 1]
    assert grown.encode(pa.array([7, 5, 9])).ids.tolist() == vocab.encode(pa.array([7, 5, 9])).ids.tolist()
    task = NextItemTask(num_items=len(vocab), max_length=6, encoder=GRU4RecEncoder(d_model=8),
                        objective=CausalLanguageModeling())
    bigger = with_more_items(task, old_to_new, len(grown))
    old, new = task.model.item_embedding.weight, bigger.model.item_embedding.weight
    assert new.shape == (len(grown), 8)
    torch.testing.assert_close(new[torch.from_numpy(old_to_new)], old)
    items = torch.tensor([[0, 2, 3, 4]])  # known items only: the same scores over the known ids
    torch.testing.assert_close(bigger.eval().model(items)[:, : len(vocab)], task.eval().model(items))


def event_file(tmp_path: Path) -> tuple[Path, list[float]]:
    events = generate_sessions(num_sessions=4000, num_items=80, seed=1)
    events = events.filter(pa.compute.equal(events.column("event_type"), "product"))  # page views carry no item
    path = tmp_path / "events.parquet"
    pq.write_table(events.select(["session_id", "item_id", "timestamp"]), path)
    t = np.sort(events.column("timestamp").to_numpy())
    return path, [float(np.quantile(t, q)) for q in (0.0, 0.5, 0.75, 1.0)]


def test_time_windows_split_sessions_by_their_last_event(tmp_path):
    path, (start, mid, late, end) = event_file(tmp_path)
    splits = TimeWindowSource([str(path)], Schema(), start, mid, late).load()
    last = lambda t: np.array([max(x) for x in t.column("timestamp").to_pylist()])  # noqa: E731
    assert (last(splits.train) < mid).all() and (last(splits.valid) < mid).all()
    assert ((last(splits.test) >= mid) & (last(splits.test) < late)).all()
    assert set(splits.train.column("session_id").to_pylist()).isdisjoint(splits.test.column("session_id").to_pylist())
    with pytest.raises(ValueError, match="train_from < train_until <= test_from < test_until"):
        TimeWindowSource([str(path)], Schema(), mid, start, late)
    with pytest.raises(ValueError, match="'yesterday' is neither an ISO-8601 date/time nor epoch seconds"):
        TimeWindowSource([str(path)], Schema(), "yesterday", mid, late)


def test_a_time_window_bound_in_milliseconds_is_refused_naming_the_setting(tmp_path):
    path, (start, mid, late, end) = event_file(tmp_path)
    with pytest.raises(ValueError) as err:
        TimeWindowSource([str(path)], Schema(), start, mid * 1000, late * 1000)
    assert str(err.value) == (f"train_until: {mid * 1000!r} seconds since the epoch fall after 2100; give seconds (not "
                              "milliseconds) or an ISO-8601 date or time")
    with pytest.raises(ValueError, match=r"^test_until: '2999-01-01' falls after 2100; give the date or time of the window"):
        TimeWindowSource([str(path)], Schema(), start, mid, "2999-01-01")  # a mistyped year
    with pytest.raises(ValueError, match=r"^train_from: nan is no time; give epoch seconds or an ISO-8601 date or time$"):
        TimeWindowSource([str(path)], Schema(), float("nan"), mid, late)


def test_a_time_window_whose_validation_share_rounds_to_no_session_is_refused(tmp_path):
    path, (start, mid, late, end) = event_file(tmp_path)
    ends = pq.read_table(path).group_by("session_id").aggregate([("timestamp", "max")]).column("timestamp_max").to_numpy()
    early = float(np.sort(ends)[3]) + 1e-3  # the training window holds the first 4 sessions to end
    source = TimeWindowSource([str(path)], Schema(), start, early, late)
    with pytest.raises(ValueError) as err:
        source.load()
    assert str(err.value) == (f"{path}: the validation split is empty: valid_fraction 0.1 of the training window's 4 "
                              "sessions rounds to none; lengthen valid_fraction or the training window")
    assert TimeWindowSource([str(path)], Schema(), start, early, late, valid_fraction=0.25).load().valid.num_rows == 1


def test_time_window_files_of_two_id_types_are_refused_naming_both_files_and_the_column(tmp_path):
    path, (start, mid, late, end) = event_file(tmp_path)
    events = pq.read_table(path)
    text = tmp_path / "late.parquet"
    pq.write_table(events.set_column(0, "session_id", events.column("session_id").cast(pa.string())), text)
    with pytest.raises(SchemaError) as err:
        TimeWindowSource([str(path), str(text)], Schema(), start, mid, late).load()
    first = events.column("session_id")[0].as_py()
    assert str(err.value) == (
        f"{text}: column 'session_id' holds string values (e.g. '{first}' at row 0), where {path} holds int64 values "
        f"(e.g. {first} at row 0); give the files one type of 'session_id' (the schema's string_ids: true reads both as "
        "text)")


def test_retrain_promotes_a_good_candidate_and_rejects_a_bad_one(tmp_path):
    path, (start, mid, late, end) = event_file(tmp_path)
    data = SessionDataModule(TimeWindowSource([str(path)], Schema(), start, mid, late), max_length=8, batch_size=128)
    base = NextItemTask(num_items=data.num_items, max_length=8, encoder=GRU4RecEncoder(d_model=16),
                        objective=CausalLanguageModeling(), optimization=Optimization(lr=0.01))
    pl.seed_everything(0)
    pl.Trainer(max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False).fit(base, datamodule=data)
    root = tmp_path / "current"
    served = base.recommender()
    served.train_end = data.splits.train_end()  # as sessrec fit records it
    served.save_pretrained(root)
    common = dict(paths=[str(path)], schema=Schema(), max_epochs=1, train_from=mid, train_until=late, test_until=end + 1)
    with pytest.raises(ValueError, match=r"gate metric recall@50: the candidate's validation computes recall at "
                                         r"[0-9, ]+ \(the current model's evaluation ks\); gate on one of those"):
        retrain(str(root), out=str(tmp_path / "at50"), gate=Gate("recall@50"), **common)
    assert not (tmp_path / "at50").exists()  # refused before anything was written
    with pytest.raises(ValueError, match=r"gate metric mrr: a session model's validation computes recall, ndcg and mrr "
                                         r"at [0-9, ]+ \(the current model's evaluation ks\), not mrr without a cut-off"):
        retrain(str(root), out=str(tmp_path / "mrr"), gate=Gate("mrr"), **common)
    assert not (tmp_path / "mrr").exists()
    good = retrain(str(root), out=str(tmp_path / "good"), gate=Gate("recall@20", tolerance=0.05, min_pairs=100), lr=0.005,
                   **common)
    assert good["promoted"] and good["version"] == "v000002" and good["candidate_items"] >= good["current_items"]
    assert good["current_version"] is None and good["best_compared"] is None and good["versus_best"] is None
    assert good["pairs"] == good["test_sessions"] > 100  # the last item of each test session
    assert good["best"] == ("v000002" if good["new_best"] else "v000001")  # the plain model became v000001
    promoted = SessionRecommender.from_pretrained(root)
    assert promoted.vocab == SessionRecommender.from_pretrained(tmp_path / "good" / "model").vocab
    # a random model, let through by a tolerance of 0.99: promoted, but the best stays the anchor
    noise = retrain(str(root), out=str(tmp_path / "noise"), gate=Gate("recall@20", tolerance=0.99, min_pairs=100),
                    warm_start=False, lr=1e-9, **common)
    assert noise["promoted"] and noise["version"] == "v000003" and not noise["new_best"]
    assert noise["best"] == good["best"] and noise["current_version"] == "v000002"
    # the next candidate is gated against the current model (the random one) and against the best
    bad = retrain(str(root), out=str(tmp_path / "bad"), gate=Gate("recall@20", tolerance=0.0, min_pairs=100),
                  warm_start=False, lr=1e-9, seed=1, **common)
    best = noise["best"]
    assert not bad["promoted"] and not bad["passed"] and bad["best"] == best and bad["best_compared"] == best
    assert set(bad["metrics"]) == {"candidate", "current", "best"}
    assert bad["metrics"]["candidate"]["recall@20"] < bad["metrics"]["best"]["recall@20"]
    assert f"candidate trails the best promoted ({best}) by " in bad["reason"]
    assert bad["reason"].endswith(": more than the tolerance 0")
    assert bad["versus_best"]["difference"] == pytest.approx(
        bad["metrics"]["candidate"]["recall@20"] - bad["metrics"]["best"]["recall@20"], abs=1e-6)
    after = SessionRecommender.from_pretrained(root)
    assert after.vocab == SessionRecommender.from_pretrained(tmp_path / "noise" / "model").vocab  # the rejected one replaced nothing
    log = [json.loads(line) for line in (root / "promotions.jsonl").read_text().splitlines()]
    assert [e["event"] for e in log] == ["adopt", "promote", "promote", "decision"]
    assert log[-1] == bad and log[2]["previous"] == "v000002"
    if good["best"] == "v000002":  # the best was evaluated again, from its version, on the same pairs
        assert bad["metrics"]["best"]["recall@20"] == pytest.approx(good["metrics"]["candidate"]["recall@20"])
    assert "more than the tolerance" in summary(bad) and summary(good).startswith("promoted as v000002")


@pytest.mark.parametrize("warm_start", [True, False])
def test_retrain_keeps_an_hstu_trained_without_event_times_without_them(tmp_path, warm_start):
    """An HSTU trained with --data.times false is served without times: its candidate, warm or fresh, is too."""
    path, (start, mid, late, end) = event_file(tmp_path)
    data = SessionDataModule(TimeWindowSource([str(path)], Schema(), start, mid, late), max_length=8, batch_size=128,
                             times=False)
    base = NextItemTask(num_items=data.num_items, max_length=8, encoder=HSTUEncoder(d_model=8, n_head=2, n_layer=1),
                        objective=CausalLanguageModeling())
    pl.Trainer(max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False, limit_val_batches=0).fit(base, datamodule=data)
    assert base.model.encoder.trained_with_times is False
    served = base.recommender()
    served.train_end = data.splits.train_end()
    served.save_pretrained(tmp_path / "current")
    retrain(str(tmp_path / "current"), out=str(tmp_path / "c"), gate=Gate("recall@20", tolerance=0.99, min_pairs=1),
            paths=[str(path)], schema=Schema(), max_epochs=1, train_from=mid, train_until=late, test_until=end + 1,
            warm_start=warm_start, promote=False)
    candidate = SessionRecommender.from_pretrained(tmp_path / "c" / "model")
    assert candidate.model.encoder.trained_with_times is False


def untrained_current(tmp_path):
    """An event file and an untrained GRU4Rec saved as the current model (`tmp_path`/current) on its first window.
    Returns the file, its window bounds and the model's vocabulary."""
    path, (start, mid, late, end) = event_file(tmp_path)
    data = SessionDataModule(TimeWindowSource([str(path)], Schema(), start, mid, late), max_length=8, batch_size=128)
    task = NextItemTask(num_items=data.num_items, max_length=8, encoder=GRU4RecEncoder(d_model=8),
                        objective=CausalLanguageModeling())
    task.vocab = data.vocab
    served = task.recommender()
    served.train_end = data.splits.train_end()
    served.save_pretrained(tmp_path / "current")
    return path, (start, mid, late, end), data.vocab


def test_retrain_refuses_a_gate_needing_more_pairs_than_the_test_window_holds_before_training(tmp_path):
    """min_pairs above the test window's pairs could only end in a refusal: it is refused before the candidate
    trains, naming the pairs the window holds (one per test session: its last item)."""
    path, (start, mid, late, end), vocab = untrained_current(tmp_path)
    pairs = TimeWindowSource([str(path)], Schema(), mid, late, end + 1).load().test.num_rows
    common = dict(paths=[str(path)], schema=Schema(), max_epochs=1, train_from=mid, train_until=late, test_until=end + 1)
    with pytest.raises(ValueError) as err:
        retrain(str(tmp_path / "current"), out=str(tmp_path / "c"), gate=Gate("recall@20", min_pairs=pairs + 1), **common)
    assert str(err.value) == (
        f"gate min_pairs {pairs + 1}: the test window ({late} .. {end + 1}) holds {pairs} test pairs (the test window's "
        "sessions (their last items)), and the gate refuses a candidate on fewer, so this turn could only be refused; "
        "lower --gate.min_pairs or widen the test window (--test_until)")
    assert not (tmp_path / "c").exists()  # refused before anything was written or trained
    assert not (tmp_path / "current" / "promotions.jsonl").exists()


def test_retrain_on_events_of_another_catalogue_is_refused_before_training(tmp_path):
    """A retrain recipe whose paths name another catalogue's events (the ids of the current model's items moved by
    10**6): the turn trained its candidate, wrote it to --out and only then was refused when the current model was
    evaluated, so that the same turn run again with the right paths was refused for an --out that holds another run.
    It is refused before anything is written or trained."""
    path, (start, mid, late, end), vocab = untrained_current(tmp_path)
    events = pq.read_table(path)
    other = tmp_path / "other.parquet"
    pq.write_table(events.set_column(1, "item_id", pa.compute.add(events.column("item_id"), 1_000_000)), other)
    test = TimeWindowSource([str(other)], Schema(), mid, late, end + 1).load().test
    products = sum(len(s) for s in test.column("item_id").to_pylist())
    first = test.column("item_id")[0].as_py()[0]
    with pytest.raises(ValueError) as err:
        retrain(str(tmp_path / "current"), out=str(tmp_path / "c"), gate=Gate("recall@20", min_pairs=1), paths=[str(other)],
                schema=Schema(), max_epochs=1, train_from=mid, train_until=late, test_until=end + 1)
    assert str(err.value) == (
        f"{other}: none of the {products} items of the test window ({late} .. {end + 1}) is in the current model's "
        f"vocabulary {tmp_path / 'current' / 'vocab.parquet'} ({len(vocab) - 2} items of type int64, e.g. "
        f"{vocab.raw_ids[0].as_py()!r}; the window's first {first!r}): the events and the model do not belong "
        "together; nothing was trained")
    assert not (tmp_path / "c").exists()
    assert not (tmp_path / "current" / "promotions.jsonl").exists()


def test_retrain_into_a_candidate_folder_another_turn_writes_is_refused(tmp_path):
    """Two turns at once of two model directories with one --out (a scheduler's template): the second would write its
    vocabulary and best.ckpt over the first's, whose candidate would be the other's model, gated and promoted. While a
    turn writes its candidate folder, another is refused in one line naming it, before anything is written there."""
    from sessrec.saved.atomic import lock_folder

    path, (start, mid, late, end) = event_file(tmp_path)
    data = SessionDataModule(TimeWindowSource([str(path)], Schema(), start, mid, late), max_length=8)
    task = NextItemTask(num_items=data.num_items, max_length=8, encoder=GRU4RecEncoder(d_model=8),
                        objective=CausalLanguageModeling())
    task.vocab = data.vocab
    served = task.recommender()
    served.train_end = data.splits.train_end()
    served.save_pretrained(tmp_path / "current")
    out = tmp_path / "c"
    common = dict(paths=[str(path)], schema=Schema(), max_epochs=1, train_from=mid, train_until=late, test_until=end + 1)
    held = lock_folder(out, "held by the other turn")  # the other turn, writing its candidate there
    try:
        with pytest.raises(RuntimeError) as err:
            retrain(str(tmp_path / "current"), out=str(out), gate=Gate("recall@20", min_pairs=1), **common)
    finally:
        os.close(held)
    assert str(err.value) == (f"out {out}: another sessrec retrain is writing its candidate here; give each candidate a "
                              "new folder (e.g. runs/<name>/candidates/<date>)")
    assert not any(out.iterdir()) and not (tmp_path / "current" / "promotions.jsonl").exists()


def test_retrain_refuses_a_model_that_reads_side_features_before_training(tmp_path):
    """The candidate's data carries no side features: the turn failed once training began, leaving its folder."""
    path, (start, mid, late, end) = event_file(tmp_path)
    data = SessionDataModule(TimeWindowSource([str(path)], Schema(), start, mid, late), max_length=8,
                             side_features=SideFeatures(time=["since_prev"], position=4))
    task = NextItemTask(num_items=data.num_items, max_length=8, encoder=GRU4RecEncoder(d_model=8),
                        objective=CausalLanguageModeling(), side_features=data.side_info)
    task.vocab, task.side_transform, task.side_config = data.vocab, data.side, data.side_features
    served = task.recommender()
    served.train_end = data.splits.train_end()
    served.save_pretrained(tmp_path / "current")
    common = dict(paths=[str(path)], schema=Schema(), max_epochs=1, train_from=mid, train_until=late, test_until=end + 1)
    with pytest.raises(ValueError) as err:
        retrain(str(tmp_path / "current"), out=str(tmp_path / "c"), gate=Gate("recall@20", min_pairs=1), **common)
    assert str(err.value) == (
        f"{tmp_path / 'current'}: the model reads side features ['position', 'since_prev'], which sessrec "
        "retrain does not give its candidate; train a new model on the window with sessrec fit and the recipe's "
        "side_features")
    assert not (tmp_path / "c").exists()  # refused before anything was written or trained


def test_retrain_refuses_a_metric_it_cannot_compare_pair_by_pair_and_a_directory_in_use(tmp_path):
    from sessrec.saved.versions import VersionedDirectory

    model = tmp_path / "model"
    model.mkdir()
    args = dict(paths=["x.parquet"], train_from="0", train_until="1", test_until="2", out=str(tmp_path / "c"))
    with pytest.raises(ValueError, match="metric 'auc' is not a mean over test pairs"):
        retrain(str(model), gate=Gate("auc"), **args)
    with VersionedDirectory(model).lock(), pytest.raises(RuntimeError, match="another process .* is writing this model"):
        retrain(str(model), **args)
    assert not (tmp_path / "c").exists()
    with pytest.raises(ValueError, match="max_epochs must be an integer >= 1, got 0: a candidate of no epoch"):
        retrain(str(model), max_epochs=0, **args)
    (tmp_path / "taken").write_text("x")
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "best.ckpt").write_text("x")
    for name, what in (("taken", "is a file"), ("used", "holds another run")):
        with pytest.raises(FileExistsError, match=f"out {tmp_path / name}: {what}; give each candidate a new folder"):
            retrain(str(model), **{**args, "out": str(tmp_path / name)})


@pytest.mark.parametrize("recipe,turn", [("retrain_rsc15.yaml", "retrain"), ("retrain_dlrm_trivago.yaml", "retrain_dlrm")])
def test_the_retraining_recipes_parse_into_a_turn_with_its_gate(recipe, turn):
    import sessrec.lifecycle.retrain as module
    from sessrec.cli.parsers import function_command, parse

    parser = function_command(getattr(module, turn), "sessrec retrain")
    window = ["--end", "2018-11-08T06:00"] if turn == "retrain_dlrm" else [
        "--train_from", "2014-04-02", "--train_until", "2014-04-05", "--test_until", "2014-04-06"]
    args = ["--config", str(ROOT / "recipes" / recipe), *window, "--out", "x"]
    kwargs = parser.instantiate(parse(parser, args, owner=getattr(module, turn)))
    gate = kwargs.as_dict()["gate"]
    assert isinstance(gate, Gate) and (gate.tolerance, gate.confidence, gate.min_pairs) == (0.005, 0.95, 1000)
    assert gate.metric == ("mrr" if turn == "retrain_dlrm" else "recall@20")


TRIVAGO = ROOT.parent / "shared" / "data" / "trivago_rsc19_100k" / "trivago_val_100k.parquet.snappy"


@pytest.mark.slow
@pytest.mark.skipif(not TRIVAGO.exists(), reason="trivago_rsc19_100k is not available here")
def test_dlrm_retrain_grows_its_tables_and_keeps_what_it_learned(tmp_path):
    from sessrec.lifecycle.retrain import retrain_dlrm
    from sessrec.tasks import ClickoutDataModule

    window = dict(test_hours=6.0, valid_hours=4.0, train_hours=6.0, min_count=1)
    data = ClickoutDataModule(str(TRIVAGO), end="2018-11-07T18:00", batch_size=4096, **window)
    pl.seed_everything(0)
    base = DLRMTask(cardinalities=data.cardinalities, num_dense=data.num_dense,
                    network={"embedding_dim": 8, "dense_layers": [16, 8], "over_layers": [16]}, sparse=DynamicTables(lr=0.05))
    pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False).fit(base, datamodule=data)
    served = base.ranker()
    served.train_end = data.train_end()  # as sessrec fit records it
    served.save_pretrained(tmp_path / "current")
    before = base.model.sparse_arch.tables["hotel"]
    common = dict(path=str(TRIVAGO), end="2018-11-08T00:00", max_epochs=1, **{k: v for k, v in window.items() if k != "min_count"})
    with pytest.raises(ValueError, match=r"^gate min_pairs 1000000: the test window \(the 6 hours before 2018-11-08T00:00\) "
                                         r"holds \d+ test pairs \(clicked rows of the test hours' click-outs\), .* \(--test_hours\)$"):
        retrain_dlrm(str(tmp_path / "current"), out=str(tmp_path / "many"), gate=Gate("mrr", 0.99, min_pairs=10**6), **common)
    assert not (tmp_path / "many").exists()
    with pytest.raises(ValueError, match=r"^gate metric ndcg@20: the click ranker's validation computes auc, mrr, logloss, "
                                         r"recall@\d+"):
        retrain_dlrm(str(tmp_path / "current"), out=str(tmp_path / "ndcg"), gate=Gate("ndcg@20", 0.99), **common)
    assert not (tmp_path / "ndcg").exists()
    good = retrain_dlrm(str(tmp_path / "current"), out=str(tmp_path / "good"), gate=Gate("mrr", 0.99, min_pairs=100), **common)
    assert good["promoted"] and good["candidate_ids"]["hotel"] > good["current_ids"]["hotel"]
    assert good["pairs"] > 100 and good["versus_current"]["difference"] == pytest.approx(
        good["metrics"]["candidate"]["mrr"] - good["metrics"]["current"]["mrr"], abs=1e-6)
    grown = ClickRanker.from_pretrained(tmp_path / "current").model.sparse_arch.tables["hotel"]
    assert grown.num_keys > before.num_keys and bool(torch.isin(before.sorted_keys, grown.sorted_keys).all())
    old_rows = before.embedding(before.sorted_keys)
    kept = (grown.embedding(before.sorted_keys) == old_rows).all(dim=1)
    assert kept.any() and not kept.all()  # rows the new window did not train are the old ones, the others moved on
    # the good turn's window again (a backfill: the promoted ranker trained on these click-outs), at a rate that ruins it
    bad = retrain_dlrm(str(tmp_path / "current"), out=str(tmp_path / "bad"), gate=Gate("mrr", 0.0, min_pairs=100), lr=10.0,
                       backfill=True, **common)
    assert not bad["promoted"] and bad["metrics"]["candidate"]["mrr"] < bad["metrics"]["current"]["mrr"]
    assert bad["reason"].startswith("candidate trails the current model (v000002) by ")
    after = ClickRanker.from_pretrained(tmp_path / "current").model.sparse_arch.tables["hotel"]
    assert torch.equal(after.sorted_keys, grown.sorted_keys)


def test_a_retrain_turn_stopped_by_sigterm_fails_in_one_line(tmp_path, monkeypatch):
    """Lightning ends a fit on SIGTERM (a scheduler's or a container's stop) with an exit of status 0: a turn whose
    candidate did not finish training said nothing and returned; it is now an error that says so."""
    from pytorch_lightning.utilities.exceptions import SIGTERMException

    from sessrec.lifecycle.retrain import fit_candidate

    def stopped(self, *args, **kwargs):
        raise SIGTERMException()

    monkeypatch.setattr(pl.Trainer, "fit", stopped)
    with pytest.raises(RuntimeError, match=r"^stopped by SIGTERM at step 0 of the candidate's training: nothing was gated "
                                           r"or promoted; run the turn again$"):
        fit_candidate(None, None, tmp_path, "val/ndcg@20", max_epochs=1)


def test_a_failed_turn_leaves_no_candidate_folder_so_that_it_can_be_run_again(tmp_path, monkeypatch):
    """A turn stopped by SIGTERM says "run the turn again", but it left --out holding the vocabulary it had written,
    and the same command was then refused for an --out that holds another run (a scheduler's retry, forever). A
    failed turn removes what it wrote and the folders it created; the turn run again trains and decides."""
    from pytorch_lightning.utilities.exceptions import SIGTERMException

    path, (start, mid, late, end), _ = untrained_current(tmp_path)
    out = tmp_path / "candidates" / "day"
    turn = dict(out=str(out), gate=Gate("recall@20", tolerance=0.99, min_pairs=1), paths=[str(path)], schema=Schema(),
                max_epochs=1, train_from=mid, train_until=late, test_until=end + 1, promote=False)
    fit = pl.Trainer.fit

    def stopped(self, *args, **kwargs):
        raise SIGTERMException()

    monkeypatch.setattr(pl.Trainer, "fit", stopped)
    with pytest.raises(RuntimeError, match="^stopped by SIGTERM at step 0 of the candidate's training"):
        retrain(str(tmp_path / "current"), **turn)
    assert not (tmp_path / "candidates").exists()
    (tmp_path / "empty").mkdir()  # a folder given empty stays, emptied
    with pytest.raises(RuntimeError, match="^stopped by SIGTERM"):
        retrain(str(tmp_path / "current"), **{**turn, "out": str(tmp_path / "empty")})
    assert list((tmp_path / "empty").iterdir()) == []
    monkeypatch.setattr(pl.Trainer, "fit", fit)
    decision = retrain(str(tmp_path / "current"), **turn)
    assert decision["passed"] and not decision["promoted"] and (out / "model" / "config.json").exists()


def test_the_gate_ranks_a_model_on_a_window_of_items_it_never_saw_as_misses(tmp_path):
    """A day of new items is what retraining is for: the current model's ranks there are misses to weigh, not a
    split refused for its unknown targets (as ``sessrec test --model_dir`` refuses one)."""
    from sessrec.data import SyntheticSource
    from sessrec.lifecycle.retrain import LoadedSplits, pair_ranks

    splits = SyntheticSource(num_sessions=300, num_items=30).load()
    vocab = ItemVocab.fit(pa.array(np.arange(1000, 1010)))  # few of the window's items
    vocab_file = vocab.save(tmp_path / "vocab.parquet")
    torch.manual_seed(0)
    task = NextItemTask(num_items=len(vocab), max_length=8, encoder=GRU4RecEncoder(d_model=8),
                        objective=CausalLanguageModeling()).eval()
    task.vocab = vocab
    with pytest.raises(ValueError, match=r"\(test split\): 12 of 15 targets \(80.0%\) are unknown to the model's vocabulary"):
        SessionDataModule(LoadedSplits(splits), max_length=8, eval_protocol="last", vocab_path=str(vocab_file)).setup("test")
    ranks = pair_ranks(task, splits, vocab_file)
    assert len(ranks) == 15 and np.isinf(ranks.ranks).sum() == 12  # the unknown targets are misses
