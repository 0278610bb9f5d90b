"""Learning-rate schedule of `NextItemTask`: warm-up, cosine decay, and decay on the wall clock."""

import pytest

from sessrec.models import XLNetEncoder
from sessrec.tasks import NextItemTask
from sessrec.tasks import next_item


def lr_factor(monkeypatch, clock, **kw):
    monkeypatch.setattr(next_item.time, "monotonic", lambda: clock[0])
    task = NextItemTask(num_items=20, encoder=XLNetEncoder(d_model=16, n_head=2, n_layer=1), **kw)
    return task.configure_optimizers()["lr_scheduler"]["scheduler"].lr_lambdas[0]


def test_warmup_then_cosine_by_steps(monkeypatch):
    factor = lr_factor(monkeypatch, [0.0], warmup_steps=4)
    assert [factor(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert factor(5) == pytest.approx(0.0)  # without a trainer one step is planned: decayed at once


def test_schedule_seconds_decays_on_the_wall_clock(monkeypatch):
    clock = [100.0]
    factor = lr_factor(monkeypatch, clock, schedule_seconds=10.0)
    assert factor(0) == pytest.approx(1.0)
    clock[0] = 105.0  # half the budget: cosine at its midpoint
    assert factor(0) == pytest.approx(0.5)
    clock[0] = 107.5
    assert factor(0) == pytest.approx(0.5 * (1 - 2**-0.5))  # cos(0.75 pi) = -1/sqrt(2)
    clock[0] = 500.0
    assert factor(0) == pytest.approx(0.0)
    linear = lr_factor(monkeypatch, clock, schedule_seconds=10.0, scheduler="linear")
    clock[0] = 502.0
    assert linear(0) == pytest.approx(0.8)


def test_schedule_seconds_must_be_positive():
    with pytest.raises(ValueError, match="schedule_seconds"):
        NextItemTask(num_items=20, encoder=XLNetEncoder(d_model=16, n_head=2, n_layer=1), schedule_seconds=0)
