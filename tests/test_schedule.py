"""The typed parts of `NextItemTask`'s config: the learning-rate schedule's values, validation, round trips."""

import math

import numpy as np
import pyarrow as pa
import pytest
import torch

from sessrec.artifacts import SessionRecommender
from sessrec.data.vocab import ItemVocab
from sessrec.models import (
    BSARecEncoder,
    CausalLanguageModeling,
    HSTUEncoder,
    MaskedItemModeling,
    SideInfoConfig,
    XLNetEncoder,
)
from sessrec.tasks import BaselineTask, Evaluation, NextItemTask, Optimization, Schedule, next_item
from sessrec.tasks.checkpointing import best_of_run


def tiny_task(**kw) -> NextItemTask:
    return NextItemTask(num_items=20, max_length=6, encoder=XLNetEncoder(d_model=16, n_head=2, n_layer=1), **kw)


def lr_factor(monkeypatch, clock, **kw):
    monkeypatch.setattr(next_item.time, "monotonic", lambda: clock[0])
    return tiny_task(**kw).configure_optimizers()["lr_scheduler"]["scheduler"].lr_lambdas[0]


# -- Schedule.factor ----------------------------------------------------------------------------


def test_linear_warmup_reaches_the_peak_at_the_last_warmup_step():
    schedule = Schedule(warmup_steps=4)
    assert [schedule.factor(s, 100) for s in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]


def test_cosine_decay_by_steps_after_warmup():
    schedule = Schedule(warmup_steps=10, decay="cosine")
    assert schedule.factor(10, 110) == 1.0
    assert schedule.factor(35, 110) == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))  # a quarter of the decay
    assert schedule.factor(60, 110) == pytest.approx(0.5)
    assert schedule.factor(110, 110) == pytest.approx(0.0)
    assert schedule.factor(500, 110) == pytest.approx(0.0)  # past the planned steps: stays at the end


def test_linear_and_constant_decay():
    linear = Schedule(warmup_steps=0, decay="linear")
    assert [linear.factor(s, 10) for s in (0, 1, 5, 10, 20)] == pytest.approx([1.0, 0.9, 0.5, 0.0, 0.0])
    constant = Schedule(warmup_steps=2, decay="constant")
    assert [constant.factor(s, 10) for s in (0, 1, 2, 9, 50)] == [0.5, 1.0, 1.0, 1.0, 1.0]


def test_by_default_the_clock_is_ignored():
    schedule = Schedule(decay="linear")
    assert schedule.factor(5, 10, clock=0.0) == schedule.factor(5, 10, clock=1e9) == pytest.approx(0.5)


def test_a_time_budget_takes_over_when_the_clock_runs_ahead_of_the_steps():
    schedule = Schedule(warmup_steps=0, decay="linear", seconds=100.0)
    assert schedule.factor(10, 100, clock=5.0) == pytest.approx(0.9)  # steps ahead: 10%
    assert schedule.factor(10, 100, clock=50.0) == pytest.approx(0.5)  # clock ahead: 50%
    assert schedule.factor(10, 100, clock=1000.0) == pytest.approx(0.0)  # budget spent
    cosine = Schedule(seconds=10.0)
    assert cosine.factor(0, 100, clock=5.0) == pytest.approx(0.5)  # the budget runs from the first step
    assert cosine.factor(0, 100, clock=7.5) == pytest.approx(0.5 * (1 - 2**-0.5))  # cos(0.75 pi) = -1/sqrt(2)
    assert Schedule(warmup_steps=4, seconds=10.0).factor(1, 100, clock=9.0) == 0.5  # warm-up is by steps only


def test_planned_steps_are_asked_for_only_once_the_decay_has_started():
    asked = []

    def total() -> int:
        asked.append(True)
        return 20

    schedule = Schedule(warmup_steps=5, decay="linear")
    assert [schedule.factor(s, total) for s in range(6)] == [0.2, 0.4, 0.6, 0.8, 1.0, 1.0]
    assert not asked
    assert schedule.factor(10, total) == pytest.approx(1 - 5 / 15)
    assert asked


# -- the task's scheduler -----------------------------------------------------------------------


def test_the_tasks_scheduler_is_the_schedules_factor(monkeypatch):
    factor = lr_factor(monkeypatch, [0.0], schedule=Schedule(warmup_steps=4))
    assert [factor(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert factor(5) == pytest.approx(0.0)  # without a trainer one step is planned: decayed at once


def test_the_tasks_time_budget_counts_seconds_since_the_first_step(monkeypatch):
    clock = [100.0]
    factor = lr_factor(monkeypatch, clock, schedule=Schedule(seconds=10.0))
    assert factor(0) == pytest.approx(1.0)
    clock[0] = 105.0  # half the budget: cosine at its midpoint
    assert factor(0) == pytest.approx(0.5)
    clock[0] = 500.0
    assert factor(0) == pytest.approx(0.0)
    linear = lr_factor(monkeypatch, clock, schedule=Schedule(decay="linear", seconds=10.0))
    clock[0] = 502.0
    assert linear(0) == pytest.approx(0.8)


def test_the_optimizer_takes_the_learning_rate_and_decays_matrices_only():
    opt = tiny_task(optimization=Optimization(lr=0.02, weight_decay=0.1)).configure_optimizers()["optimizer"]
    decayed, rest = opt.param_groups
    assert decayed["weight_decay"] == 0.1 and rest["weight_decay"] == 0.0
    assert decayed["initial_lr"] == rest["initial_lr"] == 0.02
    assert all(p.dim() >= 2 for p in decayed["params"]) and any(p.dim() == 1 for p in rest["params"])


@pytest.mark.parametrize("encoder", [lambda: HSTUEncoder(d_model=16, n_head=2, n_layer=1),
                                     lambda: XLNetEncoder(d_model=16, n_head=2, n_layer=1),
                                     lambda: BSARecEncoder(d_model=16, n_head=2, n_layer=1, window=7)])
def test_weight_decay_reaches_the_layers_matrices_and_no_embedding_table_bias_or_scale(encoder):
    """What `Optimization.weight_decay` promises: matrices only. A side feature's embedding table (its name says
    no "embedding"), a soft one-hot table, HSTU's relative position and time biases, XLNet's attention biases and
    BSARec's per-channel scale were decayed as matrices, being two-dimensional."""
    enc = encoder()
    objective = CausalLanguageModeling() if enc.causal else MaskedItemModeling()
    task = NextItemTask(num_items=20, max_length=6, encoder=enc, objective=objective,
                        side_features={"categorical": {"device": 4}, "continuous": ["price"]},
                        side_info=SideInfoConfig(soft_one_hot_bins=3),
                        optimization=Optimization(lr=0.02, weight_decay=0.1))
    decayed, rest = task.configure_optimizers()["optimizer"].param_groups
    names = {id(p): n for n, p in task.named_parameters()}
    decayed_names = {names[id(p)] for p in decayed["params"]}
    assert len(decayed["params"]) + len(rest["params"]) == len(names)
    for name in names.values():
        leaf = name.rsplit(".", 1)[-1]
        kept = any(word in leaf for word in ("bias", "emb", "table", "beta")) or ".categorical." in name
        assert (name not in decayed_names) if kept else True, name
    linear = {f"{n}.weight" for n, m in task.named_modules() if isinstance(m, torch.nn.Linear)}
    assert linear and linear <= decayed_names


# -- validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize("make, message", [
    (lambda: Optimization(lr=0), "optimization lr must be a positive number, got 0"),
    (lambda: Optimization(lr=float("nan")), "optimization lr"),
    (lambda: Optimization(weight_decay=-0.1), "optimization weight_decay must be >= 0, got -0.1"),
    (lambda: Schedule(warmup_steps=-1), "schedule warmup_steps must be an integer >= 0, got -1"),
    (lambda: Schedule(warmup_steps=2.5), "schedule warmup_steps"),
    (lambda: Schedule(decay="step"), "schedule decay must be 'constant', 'cosine' or 'linear', got 'step'"),
    (lambda: Schedule(seconds=0), "schedule seconds must be a positive number or None, got 0"),
    (lambda: Schedule(seconds=-5.0), "schedule seconds"),
    (lambda: Evaluation(ks=[]), r"evaluation ks must be positive integer cut-offs, got \[\]"),
    (lambda: Evaluation(ks=[10, 0]), "evaluation ks"),
    (lambda: Evaluation(top_k=0), "evaluation top_k must be an integer >= 1, got 0"),
    (lambda: Optimization(lr=True), "optimization lr must be a positive number, got True"),
    (lambda: Optimization(lr="1e-3"), "optimization lr must be a positive number, got '1e-3'"),
    (lambda: Optimization(weight_decay="0"), "optimization weight_decay must be >= 0, got '0'"),
    (lambda: Schedule(seconds="60"), "schedule seconds must be a positive number or None, got '60'"),
    (lambda: Evaluation(ks=20), "evaluation ks must be positive integer cut-offs, got 20"),
])
def test_invalid_settings_raise_one_line(make, message):
    with pytest.raises(ValueError, match=message) as err:
        make()
    assert "\n" not in str(err.value)


def test_a_task_refuses_invalid_parts_given_as_mappings():
    with pytest.raises(ValueError, match="schedule seconds"):
        tiny_task(schedule={"seconds": 0})
    with pytest.raises(TypeError, match="unexpected keyword argument 'scheduler'"):
        tiny_task(schedule={"scheduler": "linear"})


# -- round trips --------------------------------------------------------------------------------

PARTS = {
    "optimization": Optimization(lr=0.004, weight_decay=0.01),
    "schedule": Schedule(warmup_steps=7, decay="linear", seconds=120.0),
    "evaluation": Evaluation(ks=[5, 10], top_k=7, exclude_seen=True),
}


def test_parts_are_plain_data_in_the_hyperparameters():
    task = tiny_task(**PARTS)
    for name, part in PARTS.items():
        assert task.hparams[name]["init_args"] == {k: v for k, v in vars(part).items()}
        assert getattr(task, name) == part
    assert task.metrics["val"].ks == [5, 10]
    rebuilt = tiny_task(**{name: {"lr": 0.004, "weight_decay": 0.01} if name == "optimization" else task.hparams[name]
                           for name in PARTS})  # plain fields or class_path + init_args
    assert (rebuilt.optimization, rebuilt.schedule, rebuilt.evaluation) == tuple(PARTS.values())


def test_the_evaluation_round_trips_through_a_model_directory_as_its_inference_settings(tmp_path):
    task = tiny_task(**PARTS)
    task.vocab = ItemVocab(pa.array(np.arange(100, 118)), np.arange(18, 0, -1))
    loaded = SessionRecommender.from_pretrained(task.recommender().save_pretrained(tmp_path / "model"))
    evaluation = PARTS["evaluation"]
    assert (loaded.inference.top_k, loaded.inference.exclude_seen) == (evaluation.top_k, evaluation.exclude_seen)
    again = NextItemTask.from_recommender(loaded, evaluation=evaluation)
    assert again.evaluation == evaluation and again.metrics["test"].ks == [5, 10]


def test_parts_round_trip_through_a_checkpoint(tmp_path):
    task = tiny_task(**PARTS)
    checkpoint = {"state_dict": task.state_dict(), "hyper_parameters": dict(task.hparams)}
    task.on_save_checkpoint(checkpoint)  # what Lightning adds to the checkpoint it writes
    torch.save(checkpoint, tmp_path / "task.ckpt")
    torch.load(tmp_path / "task.ckpt", weights_only=True)  # plain data only
    loaded = best_of_run(task, tmp_path / "task.ckpt", None)
    assert (loaded.optimization, loaded.schedule, loaded.evaluation) == tuple(PARTS.values())


def test_a_baseline_keeps_its_evaluation_as_plain_data():
    from sessrec.baselines import Popularity

    task = BaselineTask(baseline=Popularity(), num_items=10, evaluation={"ks": [3], "exclude_seen": True})
    assert task.evaluation == Evaluation(ks=[3], exclude_seen=True)
    assert task.hparams.evaluation["init_args"] == {"ks": [3], "top_k": 20, "exclude_seen": True}
    assert task.metrics["val"].ks == [3]
