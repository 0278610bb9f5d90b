"""Distillation of trained teachers into one model: the loss by hand, the refusals, and runs through the CLI."""

from __future__ import annotations

import contextlib
import copy
import io
import math
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest
import torch
import yaml
from test_ensemble import ROOT, fit_loop

from sessrec.artifacts import Inference, SessionRecommender
from sessrec.cli import cli
from sessrec.data.vocab import ItemVocab
from sessrec.models import (
    CausalLanguageModeling,
    GRU4RecEncoder,
    HSTUEncoder,
    MaskedItemModeling,
    SASRecEncoder,
    SessionModel,
    XLNetEncoder,
)
from sessrec.models.objective import EVENT_TIMES
from sessrec.tasks import NextItemTask, SessionDataModule
from sessrec.tasks.distillation import Teachers
from sessrec.tasks.losses import CatalogueLoss, FullSoftmax, SampledSoftmax
from sessrec.tasks.members import load_member
from sessrec.tasks.settings import Distillation

torch.set_num_threads(1)
V = 14  # 12 items after padding and OOV
VOCAB = ItemVocab(pa.array(np.arange(100, 112)), np.arange(12, 0, -1))
ITEMS = torch.tensor([[0, 0, 3, 4, 5], [6, 7, 8, 9, 10], [0, 0, 0, 11, 3], [0, 0, 0, 0, 12]])
NO_FEATURES = SimpleNamespace(features=None, times=None)  # a batch without side features or times


@dataclass
class Hinge(CatalogueLoss):
    """A loss that compares no distributions (a margin on the target's score)."""

    def __call__(self, model, hidden, targets, generator=None):
        return torch.relu(1.0 - model.score_targets(hidden, targets)).mean()


def causal(seed: int, window: int = 5, encoder: type = GRU4RecEncoder) -> SessionModel:
    torch.manual_seed(seed)
    enc = GRU4RecEncoder(d_model=8) if encoder is GRU4RecEncoder else SASRecEncoder(d_model=8, n_head=2, n_layer=1)
    return SessionModel(V, encoder=enc, max_length=window).eval()


def teacher_dir(folder: Path, seed: int, window: int = 5, vocab: ItemVocab = VOCAB) -> str:
    teacher = SessionRecommender(causal(seed, window), CausalLanguageModeling(), vocab, Inference(window))
    return str(teacher.save_pretrained(folder / f"teacher{seed}_{window}"))


def test_the_loss_is_the_target_cross_entropy_and_the_kl_to_the_teachers_geometric_mean(tmp_path):
    paths = [teacher_dir(tmp_path, 0), teacher_dir(tmp_path, 1)]
    setting = Distillation(teachers=paths, weights=[3, 1], alpha=0.3, temperature=2.0)
    teachers = Teachers(setting, VOCAB, V, max_length=5)
    student = causal(7, encoder=SASRecEncoder)
    out = CausalLanguageModeling().training_output(student, ITEMS)
    total, target, kl = teachers.loss(student, FullSoftmax(), out.hidden, out.targets, ITEMS, NO_FEATURES)

    # by hand: every real item followed by an item is read, the next item is its target
    read = (ITEMS[:, :-1] != 0) & (ITEMS[:, 1:] >= 2)
    assert out.targets.tolist() == ITEMS[:, 1:][read].tolist() == [4, 5, 7, 8, 9, 10, 3]
    with torch.no_grad():
        logps = []
        for path in paths:
            member = load_member(path).model
            hidden = member.encode(ITEMS, torch.zeros_like(ITEMS, dtype=torch.bool))[:, :-1][read]
            logps.append(torch.log_softmax(member.score(hidden)[:, 2:] / 2.0, -1))  # the 12 items only
        p = torch.softmax(0.75 * logps[0] + 0.25 * logps[1], -1)  # the geometric mean, renormalised
    logits = student.score(out.hidden)[:, 2:]
    q = torch.log_softmax(logits / 2.0, -1)
    want_kl = (p * (p.log() - q)).sum(-1).mean()
    want_target = torch.nn.functional.cross_entropy(logits, out.targets - 2)
    torch.testing.assert_close(kl, want_kl)
    torch.testing.assert_close(target, want_target)
    torch.testing.assert_close(total, 0.7 * want_target + 0.3 * 4.0 * want_kl)
    assert kl > 0
    total.backward()
    grads = [p.grad for p in student.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)

    # the student the teacher itself: no divergence left, only the target term
    alone = Teachers(Distillation(teachers=paths[:1], alpha=1.0), VOCAB, V, max_length=5)
    same = load_member(paths[0]).model
    hidden = CausalLanguageModeling().training_output(same, ITEMS).hidden
    _, target, kl = alone.loss(same, FullSoftmax(label_smoothing=0.1), hidden, out.targets, ITEMS, NO_FEATURES)
    assert abs(kl.item()) < 1e-5
    logp = torch.log_softmax(same.score(hidden)[:, 2:], -1)
    smoothed = 0.9 * -logp.gather(1, (out.targets - 2)[:, None]).squeeze(1) - 0.1 * logp.mean(-1)
    torch.testing.assert_close(target, smoothed.mean())  # the loss's label smoothing applies to the target term


def test_a_teacher_that_reads_event_times_gets_them_and_has_the_data_module_load_them(tmp_path):
    torch.manual_seed(0)
    hstu = SessionModel(V, encoder=HSTUEncoder(d_model=8, n_head=2, n_layer=1), max_length=5).eval()
    for layer in hstu.modules():  # trained time biases (they start at zero)
        if hasattr(layer, "time_bias"):
            torch.nn.init.normal_(layer.time_bias, std=1.0)
    path = str(SessionRecommender(hstu, CausalLanguageModeling(), VOCAB, Inference(5)).save_pretrained(tmp_path / "hstu"))
    teachers = Teachers(Distillation(teachers=[path]), VOCAB, V, max_length=5)
    read = (ITEMS[:, :-1] != 0) & (ITEMS[:, 1:] >= 2)
    targets = ITEMS[:, 1:][read]
    times = torch.cumsum(torch.rand(ITEMS.shape, dtype=torch.float64) * 5000, dim=1)
    got = teachers.log_probs(ITEMS, SimpleNamespace(features=None, times=times), targets)
    with torch.no_grad():
        hidden = hstu.encode(ITEMS, torch.zeros_like(ITEMS, dtype=torch.bool), {EVENT_TIMES: times})[:, :-1][read]
        torch.testing.assert_close(got, torch.log_softmax(hstu.score(hidden), -1))
    assert not torch.allclose(got[:, 2:], teachers.log_probs(ITEMS, NO_FEATURES, targets)[:, 2:])  # the times count
    task = NextItemTask(num_items=V, encoder=GRU4RecEncoder(d_model=8), objective=CausalLanguageModeling(),
                        distillation={"teachers": [path]})
    assert not task.uses_times  # before fitting: the student alone reads no times
    task._teachers = teachers  # as `setup("fit")` loads them, before the loaders are built
    assert task.uses_times


def test_with_sampled_negatives_both_distributions_cover_the_drawn_columns(tmp_path):
    teachers = Teachers(Distillation(teachers=[teacher_dir(tmp_path, 0)], alpha=0.4), VOCAB, V, max_length=5)
    student = causal(7, encoder=SASRecEncoder)
    loss = SampledSoftmax(negatives="sampled", num_samples=6, sampler="uniform")
    out = CausalLanguageModeling().training_output(student, ITEMS)
    targets = out.targets
    total, target, kl = teachers.loss(student, loss, out.hidden, targets, ITEMS, NO_FEATURES, torch.Generator().manual_seed(3))
    # the target term is the sampled softmax itself, on the same draws
    torch.testing.assert_close(target, loss(student, out.hidden, targets, torch.Generator().manual_seed(3)))

    # by hand: column 0 each row's target, then 6 uniform draws over the 12 items, logQ-corrected, accidental hits out
    probs = torch.ones(V, dtype=torch.float64)
    probs[:2] = 0.0
    probs = (probs / probs.sum()).float()
    samples = torch.multinomial(probs, 6, replacement=True, generator=torch.Generator().manual_seed(3))

    def columns(model: SessionModel, hidden: torch.Tensor) -> torch.Tensor:
        full = model.score(hidden)
        negative = (full[:, samples] - torch.log(probs[samples] * 6)).masked_fill(samples[None, :] == targets[:, None], -math.inf)
        return torch.cat([full.gather(1, targets[:, None]), negative], dim=1)

    teacher = load_member(teachers.ensemble.names[0]).model
    read = (ITEMS[:, :-1] != 0) & (ITEMS[:, 1:] >= 2)
    with torch.no_grad():
        hidden = teacher.encode(ITEMS, torch.zeros_like(ITEMS, dtype=torch.bool))[:, :-1][read]
        p = torch.log_softmax(columns(teacher, hidden), -1)
    q = torch.log_softmax(columns(student, out.hidden), -1)
    assert torch.isinf(p).any()  # an accidental hit: some draw is some row's target
    finite = torch.isfinite(p)
    want = torch.where(finite, p.exp() * (p - q), torch.zeros_like(q)).sum(-1).mean()
    torch.testing.assert_close(kl, want)
    torch.testing.assert_close(total, 0.6 * target + 0.4 * want)


def test_settings_and_students_that_cannot_be_distilled_are_refused():
    with pytest.raises(ValueError, match=r"^distillation needs at least one teacher \(a model directory, runs/<name>/model\)$"):
        Distillation(teachers=[])
    for alpha in (0.0, -0.1, 1.5, math.nan):
        with pytest.raises(ValueError, match="alpha must be in"):
            Distillation(teachers=["a.ckpt"], alpha=alpha)
    for temperature in (0.0, -1.0, math.inf):
        with pytest.raises(ValueError, match="temperature must be a positive number"):
            Distillation(teachers=["a.ckpt"], temperature=temperature)
    with pytest.raises(ValueError, match="2 weights for 1 teachers"):
        Distillation(teachers=["a.ckpt"], weights=[1, 2])
    for weight in (0.0, -1.0, math.nan):
        with pytest.raises(ValueError, match=f"weights must be positive and finite, got {weight}"):
            Distillation(teachers=["a.ckpt", "b.ckpt"], weights=[1, weight])
    setting = {"teachers": ["a.ckpt"]}
    with pytest.raises(ValueError, match="CausalLanguageModeling student .* got MaskedItemModeling"):
        NextItemTask(num_items=V, objective=MaskedItemModeling(), distillation=setting)
    with pytest.raises(ValueError, match="over the catalogue .* or over the negatives of SampledSoftmax, got Hinge"):
        NextItemTask(num_items=V, encoder=GRU4RecEncoder(d_model=8), objective=CausalLanguageModeling(),
                     loss=Hinge(), distillation=setting)
    task = NextItemTask(num_items=V, encoder=GRU4RecEncoder(d_model=8), objective=CausalLanguageModeling(),
                        distillation=setting)
    assert task.hparams.distillation["init_args"] == {"teachers": ["a.ckpt"], "weights": None, "alpha": 0.5,
                                                      "temperature": 1.0}
    assert "distillation" in NextItemTask.TRAINING_SETTINGS  # read only while fitting: evaluation never loads teachers


def test_teachers_that_do_not_fit_the_student_are_refused_by_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere: no such model directory"):
        Teachers(Distillation(teachers=[str(tmp_path / "nowhere")]), VOCAB, V, 5)
    checkpoint = tmp_path / "best.ckpt"
    checkpoint.write_bytes(b"a checkpoint")
    with pytest.raises(ValueError, match=f"^{re.escape(str(checkpoint))}: a file, where an ensemble member or teacher is "
                                         r"the model directory that sessrec fit writes \(runs/<name>/model\)"):
        Teachers(Distillation(teachers=[str(checkpoint)]), VOCAB, V, 5)
    torch.manual_seed(0)
    mlm = SessionModel(V, encoder=XLNetEncoder(d_model=8, n_head=2, n_layer=1), max_length=5)
    bidirectional = str(SessionRecommender(mlm, MaskedItemModeling(), VOCAB, Inference(5)).save_pretrained(tmp_path / "mlm"))
    with pytest.raises(ValueError, match=f"{re.escape(bidirectional)}: was trained with MaskedItemModeling"):
        Teachers(Distillation(teachers=[bidirectional]), VOCAB, V, 5)
    other = teacher_dir(tmp_path, 0, vocab=ItemVocab(pa.array(np.arange(200, 212)), np.arange(12, 0, -1)))
    with pytest.raises(ValueError, match=f"{re.escape(other)}: was trained on another vocabulary"):
        Teachers(Distillation(teachers=[teacher_dir(tmp_path, 1), other]), VOCAB, V, 5)
    short = teacher_dir(tmp_path, 2, window=3)
    with pytest.raises(ValueError, match=f"{re.escape(short)}: reads sessions of up to 3 items where the student trains on 5"):
        Teachers(Distillation(teachers=[short]), VOCAB, V, 5)


def test_a_resume_refuses_a_teacher_saved_again_since_the_checkpoint(tmp_path):
    """The checkpoint records the teachers' model directories as they were; a teacher saved again (retrained,
    promoted) would teach the rest of the run something else than its start."""
    path = teacher_dir(tmp_path, 0)
    task = NextItemTask(num_items=V, max_length=5, encoder=GRU4RecEncoder(d_model=8), objective=CausalLanguageModeling(),
                        loss=FullSoftmax(), distillation={"teachers": [path]})
    task._teachers = Teachers(Distillation(teachers=[path]), VOCAB, V, 5)  # as `setup("fit")` loads them
    checkpoint = {"state_dict": task.state_dict()}
    task.on_save_checkpoint(checkpoint)
    task.on_load_checkpoint(checkpoint)  # the same teachers: resumed
    moved = str(tmp_path / "moved")
    shutil.copytree(path, moved)
    task._teachers = Teachers(Distillation(teachers=[moved]), VOCAB, V, 5)
    task.on_load_checkpoint(checkpoint)  # the same teacher at another path (the run resumed from another folder)
    SessionRecommender(causal(1), CausalLanguageModeling(), VOCAB, Inference(5)).save_pretrained(path)  # a new version
    task._teachers = Teachers(Distillation(teachers=[path]), VOCAB, V, 5)
    with pytest.raises(ValueError, match=f"^{re.escape(path)}: holds another model than the teachers this run "
                                         "started with"):
        task.on_load_checkpoint(checkpoint)


@pytest.mark.parametrize("distilled", [False, True])
def test_a_data_module_of_another_width_than_the_model_is_refused_before_training(tmp_path, distilled):
    """Research code that builds the task and the data module apart: the CLI links --data.max_length to the model's,
    here a data module of rows 8 wide beside a model (and a teacher) of 5 would train the student, and have the teacher
    score, positions neither was built for; refused in one line, as every stage that reads the data module."""
    import pytorch_lightning as pl

    from sessrec.data import SyntheticSource

    dm = SessionDataModule(SyntheticSource(num_sessions=200, num_items=30, num_clusters=3), max_length=8, batch_size=16)
    teacher = SessionRecommender(SessionModel(dm.num_items, GRU4RecEncoder(d_model=8), max_length=5),
                                 CausalLanguageModeling(), dm.vocab, Inference(5))
    distillation = {"teachers": [str(teacher.save_pretrained(tmp_path / "teacher"))]} if distilled else None
    task = NextItemTask(num_items=dm.num_items, max_length=5, encoder=GRU4RecEncoder(d_model=8),
                        objective=CausalLanguageModeling(), loss=FullSoftmax(), distillation=distillation)
    trainer = pl.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path)
    message = ("the data module gives sessions of up to 8 items where the model reads 5: build the task with "
               "max_length=datamodule.max_length")
    for run in (trainer.fit, trainer.test):
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            run(task, datamodule=dm)
    assert task.global_step == 0


# -- through the CLI ---------------------------------------------------------------------------------

RECIPE = """trainer:
  max_epochs: 3
  enable_progress_bar: false
  enable_model_summary: false
  logger: false
  callbacks:
    - class_path: pytorch_lightning.callbacks.ModelCheckpoint
      init_args: {monitor: val/ndcg@20, mode: max, save_top_k: 1, filename: best}
model:
  encoder: {class_path: sessrec.models.GRU4RecEncoder, init_args: {d_model: 16}}
  objective: {class_path: sessrec.models.CausalLanguageModeling}
  loss: {class_path: sessrec.tasks.losses.FullSoftmax}
  optimization: {lr: 0.01}
data:
  source:
    class_path: sessrec.data.SyntheticSource
    init_args: {num_sessions: 1500, num_items: 150}
  max_length: 20
  batch_size: 32
"""


def kl_to(teacher: SessionModel, student: SessionModel, items: torch.Tensor) -> float:
    """Mean KL from the teacher's next-item distribution to the student's on (B, L) evaluation prefixes."""
    with torch.no_grad():
        p, q = torch.log_softmax(teacher(items)[:, 2:], -1), torch.log_softmax(student(items)[:, 2:], -1)  # causal: read by CLM
        return float((p.exp() * (p - q)).sum(-1).mean())


@pytest.mark.slow
def test_a_distilled_student_is_closer_to_its_teacher_and_saves_alone(tmp_path, monkeypatch, sessrec_main):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    fit = ["fit", "--config", "recipe.yaml"]
    cli([*fit, "--trainer.callbacks.init_args.dirpath", "teacher/checkpoints"])  # the model directory: teacher/model
    student = [*fit, "--seed_everything", "1", "--model.seed", "1", "--model.encoder.init_args.d_model", "8"]
    cli([*student, "--trainer.callbacks.init_args.dirpath", "plain/checkpoints"])
    run = cli([*student, "--trainer.callbacks.init_args.dirpath", "distilled/checkpoints",
               "--model.distillation.teachers", "[teacher/model]", "--model.distillation.alpha", "1.0"])
    assert run.model._teachers is not None and run.trainer.logged_metrics["train/teacher_kl"] > 0

    teacher, plain, distilled = (load_member(f"{name}/model").model for name in ("teacher", "plain", "distilled"))
    items, _ = SessionDataModule(source=run.datamodule.source, max_length=20).tensors("test")
    items = items.long()
    # taught by the teacher alone (alpha 1), the student's distribution is several times closer to it
    assert kl_to(teacher, distilled, items) < 0.3 * kl_to(teacher, plain, items)
    # the checkpoint holds the student alone: the plain run's tensors, and its setting for the record
    held = torch.load("distilled/checkpoints/best.ckpt", weights_only=True)
    assert held["state_dict"].keys() == torch.load("plain/checkpoints/best.ckpt", weights_only=True)["state_dict"].keys()
    assert held["hyper_parameters"]["distillation"]["init_args"]["teachers"] == ["teacher/model"]
    # evaluation reads the student only: the teachers may be gone
    Path("teacher/model").rename("teacher/moved")
    assert sessrec_main("test", *student[1:], "--model_dir", "distilled/model") == ""
    assert "teacher/model: no such model directory" in sessrec_main(*student, "--model.distillation.teachers", "[teacher/model]")
    assert ("distilled/checkpoints/best.ckpt: a file, where an ensemble member or teacher is the model directory" in
            sessrec_main(*student, "--model.distillation.teachers", "[distilled/checkpoints/best.ckpt]"))
    assert "distillation trains a CausalLanguageModeling student" in sessrec_main(
        *student, "--model.distillation.teachers", "[teacher/moved]", "--model.objective",
        "sessrec.models.MaskedItemModeling")


DISTILLED_RECIPES = sorted(p for p in (ROOT / "recipes").glob("*.yaml") if "distillation:" in p.read_text())


@pytest.mark.parametrize("path", DISTILLED_RECIPES, ids=lambda p: p.stem)
def test_a_shipped_distilled_recipe_names_the_teachers_its_fit_commands_write(path, monkeypatch):
    """The header's ``for s in ...; do sessrec fit ...`` writes the teachers the recipe lists, on the recipe's data,
    and the student is the teachers' configuration, at their width or wider."""
    recipe = yaml.safe_load(path.read_text())
    written, trained = fit_loop(path)
    assert recipe["model"]["distillation"]["teachers"] == written
    assert recipe["data"] == trained["data"], path.name  # the teachers' vocabulary and windows
    student = copy.deepcopy({k: v for k, v in recipe["model"].items() if k != "distillation"})
    teacher = copy.deepcopy(trained["model"])
    width = student["encoder"]["init_args"].pop("d_model")
    assert width >= teacher["encoder"]["init_args"].pop("d_model"), path.name
    assert student == teacher, path.name  # the teachers' configuration, distilled
    monkeypatch.chdir(ROOT)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), pytest.raises(SystemExit):
        cli(["fit", "--config", str(path), "--print_config"])
    parsed = yaml.safe_load(buf.getvalue())["model"]["init_args"]
    assert parsed["distillation"]["teachers"] == written
    assert parsed["objective"]["class_path"].endswith("CausalLanguageModeling")
