"""Ensembles of trained session models: `SessionEnsemble` by hand, and `EnsembleTask` through the CLI."""

from __future__ import annotations

import contextlib
import io
import math
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from test_cli_runs import TINY as TINY_RUN

from sessrec.artifacts import Inference, SessionRecommender
from sessrec.cli import cli
from sessrec.data import SyntheticSource
from sessrec.data.batch import SessionBatch
from sessrec.data.vocab import ItemVocab
from sessrec.metrics import TopKMetrics
from sessrec.models import CausalLanguageModeling, GRU4RecEncoder, HSTUEncoder, SessionEnsemble, SessionModel
from sessrec.models.objective import EVENT_TIMES
from sessrec.tasks import Evaluation, SessionDataModule
from sessrec.tasks.ensemble_task import EnsembleTask
from sessrec.tasks.members import check_same_vocabulary, load_member

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]


def gru(num_items: int = 12, seed: int = 0) -> SessionModel:
    torch.manual_seed(seed)
    return SessionModel(num_items=num_items, encoder=GRU4RecEncoder(d_model=8), max_length=4).eval()


SESSIONS = torch.tensor([[0, 4, 5, 6], [0, 0, 7, 3]])


def test_the_ensemble_is_the_weighted_mean_of_the_members_log_probabilities():
    a, b = gru(seed=0), gru(seed=1)
    with torch.no_grad():
        got = SessionEnsemble([a, b], weights=[3, 1])(SESSIONS)
        want = 0.75 * torch.log_softmax(a(SESSIONS), -1) + 0.25 * torch.log_softmax(b(SESSIONS), -1)
        assert torch.allclose(got, want, atol=1e-6)
        assert torch.isinf(got[:, :2]).all() and torch.isfinite(got[:, 2:]).all()  # padding and OOV: never
        # a normalised geometric mean: the probabilities sum to one again only for one member
        assert torch.exp(got).sum(-1).le(1 + 1e-6).all()
        one = SessionEnsemble([a])(SESSIONS)
        assert torch.allclose(one, torch.log_softmax(a(SESSIONS), -1), atol=1e-6)
        assert torch.equal(one.argsort(-1, descending=True)[:, :5], a(SESSIONS).argsort(-1, descending=True)[:, :5])


def test_event_times_go_only_to_the_members_that_read_them():
    torch.manual_seed(0)
    hstu = SessionModel(num_items=12, encoder=HSTUEncoder(d_model=8, n_head=2, n_layer=1), max_length=4).eval()
    for layer in hstu.modules():  # trained time biases (they start at zero)
        if hasattr(layer, "time_bias"):
            torch.nn.init.normal_(layer.time_bias, std=1.0)
    plain = gru(seed=2)
    times = torch.tensor([[0.0, 10.0, 70.0, 4000.0], [0.0, 0.0, 5.0, 9.0]])
    with torch.no_grad():
        got = SessionEnsemble([hstu, plain])(SESSIONS, {EVENT_TIMES: times})
        want = 0.5 * torch.log_softmax(hstu(SESSIONS, None, {EVENT_TIMES: times}), -1) + 0.5 * torch.log_softmax(plain(SESSIONS), -1)
        assert torch.allclose(got, want, atol=1e-6)
        assert not torch.allclose(got, SessionEnsemble([hstu, plain])(SESSIONS), atol=1e-6)  # the times count for HSTU


def test_members_that_do_not_belong_together_are_refused():
    with pytest.raises(ValueError, match="member 1: scores 13 items where member 0 scores 12"):
        SessionEnsemble([gru(12), gru(13)])
    with pytest.raises(ValueError, match="2 weights for 1 members"):
        SessionEnsemble([gru()], weights=[1, 1])
    for bad in (0, -1, math.nan, math.inf):
        with pytest.raises(ValueError, match="positive and finite"):
            SessionEnsemble([gru(), gru()], weights=[1, bad])
    with pytest.raises(ValueError, match="at least one member"):
        SessionEnsemble([])
    with pytest.raises(ValueError, match="member 0: a window of 5 items, where its network reads 1 to 4"):
        SessionEnsemble([gru()], windows=[5])
    with pytest.raises(TypeError, match="must be a SessionModel, got Linear"):
        SessionEnsemble([gru(), torch.nn.Linear(2, 2)])
    a = SessionRecommender(gru(), CausalLanguageModeling(), ItemVocab.fit(pa.array(list(range(10))), min_count=1), Inference(4))
    b = SessionRecommender(gru(), CausalLanguageModeling(), ItemVocab.fit(pa.array(list(range(1, 11))), min_count=1),
                           Inference(4))  # 10 items each, other raw ids
    with pytest.raises(ValueError, match="runs/b/model: was trained on another vocabulary than runs/a/model"):
        check_same_vocabulary([a, b], ["runs/a/model", "runs/b/model"])


def test_a_member_served_on_fewer_items_than_its_network_reads_reads_as_many_in_the_ensemble(tmp_path):
    """A member whose inference settings read 2 items of a network of 4 scores as it is served alone."""
    vocab = ItemVocab.fit(pa.array(list(range(10))), min_count=1)
    short = SessionRecommender(gru(seed=0), CausalLanguageModeling(), vocab, Inference(2))
    full = SessionRecommender(gru(seed=1), CausalLanguageModeling(), vocab, Inference(4))
    paths = [str(short.save_pretrained(tmp_path / "short")), str(full.save_pretrained(tmp_path / "full"))]
    task = EnsembleTask(members=paths, num_items=12, max_length=4)
    with torch.no_grad():
        got = task.ensemble(SESSIONS)
        want = 0.5 * torch.log_softmax(short.scores(SESSIONS), -1) + 0.5 * torch.log_softmax(full.scores(SESSIONS), -1)
        assert torch.allclose(got, want, atol=1e-6)
        assert not torch.allclose(short.scores(SESSIONS), short.model(SESSIONS), atol=1e-4)  # the cut counts


def test_a_data_module_narrower_than_a_members_window_is_refused_without_the_cli_link(tmp_path):
    """Research code that builds the task and the data module apart (no --data.max_length link): a member reading 6
    items would read the 3 the data module gives, scoring otherwise than it is served; refused at setup."""
    import pytorch_lightning as pl

    dm = SessionDataModule(SyntheticSource(num_sessions=200, num_items=30, num_clusters=3), max_length=3)
    member = SessionRecommender(SessionModel(dm.num_items, GRU4RecEncoder(d_model=8), max_length=6),
                                CausalLanguageModeling(), dm.vocab, Inference(6))
    path = str(member.save_pretrained(tmp_path / "member"))
    trainer = pl.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    with pytest.raises(ValueError, match=f"^{re.escape(path)}: reads the latest 6 items of a session where "
                                         "--data.max_length gives 3"):
        trainer.test(EnsembleTask(members=[path]), datamodule=dm)


def test_exclude_seen_removes_the_items_the_members_read_not_the_whole_data_window(tmp_path):
    """Sessions of 6 items, members reading the latest 2 and 4: items 8 and 9, read by no member, stay
    recommendable, and an ensemble of one excludes what its member served alone excludes."""
    vocab = ItemVocab.fit(pa.array(list(range(10))), min_count=1)
    short = SessionRecommender(gru(seed=0), CausalLanguageModeling(), vocab, Inference(2, exclude_seen=True))
    full = SessionRecommender(gru(seed=1), CausalLanguageModeling(), vocab, Inference(4, exclude_seen=True))
    paths = [str(short.save_pretrained(tmp_path / "short")), str(full.save_pretrained(tmp_path / "full"))]
    batch = SessionBatch(items=torch.tensor([[8, 9, 4, 5, 6, 7], [0, 0, 0, 3, 2, 3]]))
    evaluation = Evaluation(exclude_seen=True)
    with torch.no_grad():
        both = EnsembleTask(members=paths, num_items=12, max_length=6, evaluation=evaluation)(batch)
        assert torch.isinf(both[0, [4, 5, 6, 7]]).all() and torch.isfinite(both[0, [8, 9]]).all()
        one = EnsembleTask(members=paths[1:], num_items=12, max_length=6, evaluation=evaluation)(batch)
        assert torch.equal(torch.isinf(one), torch.isinf(full.scores(batch.items)))


# -- EnsembleTask through the CLI --------------------------------------------------------------------

TINY = [*TINY_RUN, "--trainer.max_epochs", "1"]  # the tiny XLNet-MLM of tests/test_cli_runs.py, one epoch
DATA = """data:
  source:
    class_path: sessrec.data.SyntheticSource
    init_args: {{num_sessions: {sessions}, num_items: 150}}
  max_length: 20
  eval_batch_size: 128
"""


def ensemble_recipe(folder: Path, members: list[Path], sessions: int = 1500, weights: str = "null") -> str:
    path = folder / f"ensemble_{len(list(folder.glob('ensemble_*.yaml')))}.yaml"
    listed = ", ".join(str(m) for m in members)
    path.write_text(
        "trainer: {enable_progress_bar: false, enable_model_summary: false}\n"
        "model:\n  class_path: sessrec.tasks.EnsembleTask\n"
        f"  init_args: {{members: [{listed}], weights: {weights}, evaluation: {{ks: [5, 20]}}}}\n"
        + DATA.format(sessions=sessions)
    )
    return str(path)


def printed_test(out: str) -> dict[str, float]:
    (line,) = [x for x in out.splitlines() if x.startswith("[test]")]
    return {k: float(v) for k, v in re.findall(r"(\S+)=([0-9.]+)", line)}


@pytest.fixture(scope="module")
def members(tmp_path_factory) -> list[Path]:
    """The model directories of two tiny XLNet-MLM runs on the same synthetic sessions, seeds 0 and 1."""
    folder = tmp_path_factory.mktemp("members")
    out = []
    for seed in (0, 1):
        dirpath = folder / f"seed{seed}" / "checkpoints"
        cli(["fit", *TINY, "--seed_everything", str(seed), "--model.seed", str(seed),
             "--trainer.logger.init_args.save_dir", str(folder / "runs"), "--trainer.callbacks.init_args.dirpath", str(dirpath)])
        out.append(dirpath.parent / "model")  # the model directory sessrec fit writes beside the checkpoints
    return out


@pytest.mark.slow
def test_an_ensemble_of_one_is_its_member_and_of_two_is_the_mean_of_both(members, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    a, b = members
    cli(["test", *TINY, "--model_dir", str(a), "--model.evaluation.ks", "[5, 20]"])
    alone = printed_test(capsys.readouterr().out)
    cli(["test", "--config", ensemble_recipe(tmp_path, [a])])
    assert printed_test(capsys.readouterr().out) == alone  # one member: its own ranking, so its own metrics
    run = cli(["test", "--config", ensemble_recipe(tmp_path, [a, b], weights="[2, 1]")])
    both = printed_test(capsys.readouterr().out)
    assert both != alone

    # by hand: the data module's test pairs, the members' log-probabilities weighted 2:1
    dm = SessionDataModule(source=SyntheticSource(num_sessions=1500, num_items=150), max_length=20)
    items, targets = dm.tensors("test")
    nets = [load_member(a), load_member(b)]
    with torch.no_grad():
        scores = sum(w * torch.log_softmax(n.model(items.long(), n.objective), -1) for w, n in zip((2 / 3, 1 / 3), nets))
    metrics = TopKMetrics([5, 20])
    metrics.update(scores, targets.long())
    for name, value in metrics.compute().items():
        assert both[name] == pytest.approx(float(value), abs=6e-5), name
    assert run.model.ensemble.names == [str(a), str(b)]


@pytest.mark.slow
def test_ensemble_predict_writes_the_ensembles_top_k(members, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    raw = SessionDataModule(source=SyntheticSource(num_sessions=1500, num_items=150)).vocab.raw_ids.to_pylist()
    src, out = tmp_path / "sessions.parquet", tmp_path / "recs.parquet"
    pq.write_table(pa.table({"session_id": ["a", "b"], "item_id": [raw[:3], raw[5:6]]}), src)
    cli(["predict", "--config", ensemble_recipe(tmp_path, members), "--data.predict_path", str(src),
         "--scoring.output", str(out), "--model.init_args.evaluation.top_k", "7"])
    recs = pq.read_table(out)
    assert recs.column("session_id").to_pylist() == ["a", "b"]
    for items, scores in zip(recs.column("item_ids").to_pylist(), recs.column("scores").to_pylist()):
        assert len(set(items)) == 7 and set(items) <= set(raw)
        assert scores == sorted(scores, reverse=True) and all(s < 0 for s in scores)  # log-probabilities


@pytest.mark.slow
def test_the_cli_refuses_members_that_do_not_fit_the_data_or_the_task(members, tmp_path, monkeypatch, sessrec_main):
    monkeypatch.chdir(tmp_path)
    a, _ = members
    other = ensemble_recipe(tmp_path, [a], sessions=900)  # another vocabulary (fewer items seen in training)
    assert re.fullmatch(rf"sessrec test: error: {re.escape(str(a))}: (scores \d+ items where the data module's vocabulary "
                        rf"has \d+|was trained on another vocabulary than the data module's).* \(--traceback for details\)",
                        sessrec_main("test", "--config", other))
    recipe = ensemble_recipe(tmp_path, [a])
    assert "reads the latest 20 items of a session where --data.max_length gives 10" in sessrec_main(
        "test", "--config", recipe, "--data.max_length", "10")
    missing = tmp_path / "nowhere"
    assert f"{missing}: no such model directory" in sessrec_main("test", "--config", ensemble_recipe(tmp_path, [missing]))
    assert "an EnsembleTask has no weights to train" in sessrec_main("fit", "--config", recipe)


def test_a_checkpoint_is_not_a_member_and_the_refusal_names_the_model_directory(tmp_path):
    path = tmp_path / "best.ckpt"
    path.write_bytes(b"a checkpoint")  # refused by its kind, nothing read
    with pytest.raises(ValueError) as info:
        load_member(path)
    assert str(info.value) == (f"{path}: a file, where an ensemble member or teacher is the model directory that sessrec "
                               "fit writes (runs/<name>/model); checkpoints only resume fit")


ENSEMBLE_RECIPES = sorted(p for p in (ROOT / "recipes").glob("*.yaml") if "sessrec.tasks.EnsembleTask" in p.read_text())


def test_there_are_ensemble_recipes():
    assert {p.stem for p in ENSEMBLE_RECIPES} >= {"seq_s3rec_beauty_ensemble", "seq_amazon_beauty_ensemble"}


def fit_loop(path: Path) -> tuple[list[str], dict]:
    """The model directories that a recipe header's ``for s in ...; do sessrec fit <configs> --seed_everything $s ...
    dirpath <dir>$s/checkpoints; done`` writes (``<dir>$s/model``, beside the checkpoints), and the config those
    runs train with (their files merged)."""
    text = path.read_text()
    loop = re.search(r"for s in ([\d ]+); do sessrec fit ((?:--config \S+ )+)--seed_everything \$s --model.seed \$s "
                     r"--data.seed \$s --trainer.callbacks.init_args.dirpath (\S+)\$s/checkpoints; done", text)
    assert loop, f"{path.name}: no fit loop in its header"
    seeds, configs, folder = loop.group(1).split(), loop.group(2).split()[1::2], loop.group(3)
    trained: dict = {}
    for config in configs:  # later files override earlier ones, block by block as the CLI merges them
        for key, value in (yaml.safe_load((ROOT / config).read_text()) or {}).items():
            trained[key] = {**trained.get(key, {}), **value} if isinstance(value, dict) else value
    return [f"{folder}{s}/model" for s in seeds], trained


@pytest.mark.parametrize("path", ENSEMBLE_RECIPES, ids=lambda p: p.stem)
def test_a_shipped_ensemble_recipe_names_the_members_its_fit_commands_write(path, monkeypatch):
    """The header's ``for s in ...; do sessrec fit <configs> ... dirpath <dir>$s`` writes the members the recipe lists,
    and the recipe's data block and evaluation are those the members were trained and evaluated with."""
    recipe = yaml.safe_load(path.read_text())
    members = recipe["model"]["init_args"]["members"]
    written, trained = fit_loop(path)
    assert members == written
    assert recipe["data"] == trained["data"], path.name  # the same vocabulary and windows as the members'
    assert recipe["model"]["init_args"]["evaluation"] == trained["model"]["evaluation"], path.name
    monkeypatch.chdir(ROOT)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), pytest.raises(SystemExit):
        cli(["test", "--config", str(path), "--print_config"])
    parsed = yaml.safe_load(buf.getvalue())["model"]
    assert parsed["class_path"] == f"{EnsembleTask.__module__.rpartition('.')[0]}.{EnsembleTask.__name__}"
    assert parsed["init_args"]["members"] == members
