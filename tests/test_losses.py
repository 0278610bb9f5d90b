"""Catalogue losses: smoothing over valid candidates, sampled softmax, in-batch negatives, logQ."""

import dataclasses
import json
import math
import re

import pytest
import torch
import torch.nn.functional as F

from sessrec.models.catalogue_softmax import catalogue_cross_entropy
from sessrec.tasks.losses import CatalogueLoss, FullSoftmax, SampledSoftmax, smoothed_cross_entropy

torch.set_num_threads(1)


class DotScorer(torch.nn.Module):
    """Minimal stand-in for `SessionModel`'s scores and catalogue loss: dot products, -inf on padding/OOV."""

    def __init__(self, num_items: int, d: int = 4, seed: int = 0) -> None:
        super().__init__()
        self.num_items = num_items
        self.weight = torch.nn.Parameter(torch.randn(num_items, d, generator=torch.Generator().manual_seed(seed)))

    def score(self, hidden, candidates=None):
        if candidates is None:
            s = hidden @ self.weight.T
            return s.index_fill(1, torch.tensor([0, 1]), float("-inf"))
        return hidden @ self.weight[candidates].T

    def score_targets(self, hidden, targets):
        return (hidden * self.weight[targets]).sum(dim=1)

    def head(self, hidden, candidates):
        return hidden, self.weight[candidates], torch.zeros(len(candidates))

    def catalogue_loss(self, hidden, targets, temperature=1.0, label_smoothing=0.0):
        bias = torch.zeros(self.num_items).index_fill(0, torch.tensor([0, 1]), float("-inf"))
        return catalogue_cross_entropy(hidden, self.weight, bias, targets, temperature, label_smoothing)


def test_smoothed_cross_entropy_matches_torch_when_all_columns_are_valid():
    logits, labels = torch.randn(5, 7), torch.tensor([0, 3, 6, 2, 2])
    for eps in (0.0, 0.1):
        torch.testing.assert_close(smoothed_cross_entropy(logits, labels, eps), F.cross_entropy(logits, labels, label_smoothing=eps))


def test_smoothing_ignores_minus_inf_columns():
    logits = torch.tensor([[float("-inf"), 1.0, 2.0, 0.0]])
    loss = smoothed_cross_entropy(logits, torch.tensor([2]), 0.3)
    logp = torch.log_softmax(torch.tensor([1.0, 2.0, 0.0]), 0)
    expected = 0.7 * -logp[1] + 0.3 * -logp.mean()
    torch.testing.assert_close(loss, expected)
    assert math.isinf(F.cross_entropy(logits, torch.tensor([2]), label_smoothing=0.3).item())  # why we need it


def test_full_softmax_is_cross_entropy_over_items_with_temperature():
    model, hidden, targets = DotScorer(10), torch.randn(3, 4), torch.tensor([2, 5, 9])
    got = FullSoftmax(temperature=2.0)(model, hidden, targets)
    scores = (hidden @ model.weight.T)[:, 2:] / 2.0
    torch.testing.assert_close(got, F.cross_entropy(scores, targets - 2))


def test_sampled_softmax_with_logq_estimates_the_full_softmax():
    model, targets = DotScorer(60, seed=1), torch.tensor([2, 7, 30, 59])
    hidden = torch.randn(4, 4, generator=torch.Generator().manual_seed(2))
    full = FullSoftmax()(model, hidden, targets).item()
    for sampler in ("uniform", "popularity"):
        loss = SampledSoftmax(num_samples=200, sampler=sampler)
        loss.set_item_counts(torch.arange(60).float())
        gen = torch.Generator().manual_seed(0)
        est = torch.stack([loss(model, hidden, targets, gen) for _ in range(200)]).mean().item()
        assert abs(est - full) < 0.05 * full, (sampler, est, full)
        naive = SampledSoftmax(num_samples=200, sampler=sampler, logq_correction=False)
        naive.set_item_counts(torch.arange(60).float())
        biased = torch.stack([naive(model, hidden, targets, gen) for _ in range(50)]).mean().item()
        assert abs(biased - full) > 0.1 * full  # without the correction the estimate is far off


def test_sampled_candidates_equal_to_the_target_are_removed():
    model = DotScorer(5)
    hidden, targets = torch.randn(2, 4), torch.tensor([2, 3])
    loss = SampledSoftmax(num_samples=50, logq_correction=False)
    gen = torch.Generator().manual_seed(0)
    # 3 real items (2, 3, 4), 50 draws: both targets are drawn; loss must equal a hand-built softmax
    got = loss(model, hidden, targets, torch.Generator().manual_seed(0))
    samples = torch.multinomial(torch.tensor([0, 0, 1, 1, 1.0]) / 3, 50, replacement=True, generator=gen)
    rows = []
    for i in range(2):
        negs = samples[samples != targets[i]]
        logits = torch.cat([(hidden[i] @ model.weight[targets[i]]).reshape(1), hidden[i] @ model.weight[negs].T])
        rows.append(-torch.log_softmax(logits, 0)[0])
    torch.testing.assert_close(got, torch.stack(rows).mean())


@pytest.mark.parametrize("logq", [False, True])
def test_per_target_negatives_hand_case(logq):
    """Each target against its own S uniform draws; a draw equal to the row's target is removed (masked)."""
    model = DotScorer(6)
    hidden, targets = torch.randn(3, 4, generator=torch.Generator().manual_seed(1)), torch.tensor([2, 3, 5])
    loss = SampledSoftmax(negatives="per_target", num_samples=6, logq_correction=logq)
    got = loss(model, hidden, targets, torch.Generator().manual_seed(4))
    # the same draws: 4 real items (2..5), uniform, 3 x 6 of them
    samples = loss.columns(model, targets, torch.Generator().manual_seed(4)).ids
    assert samples.shape == (3, 6) and samples.min() >= 2
    assert not torch.equal(samples[0], samples[1])  # each target its own negatives
    assert (samples == targets[:, None]).any()  # an accidental hit to remove
    rows = []
    for i in range(3):
        negs = samples[i][samples[i] != targets[i]]
        shift = math.log(1 / 4 * 6) if logq else 0.0  # log(expected draws) of each negative
        logits = torch.cat([(hidden[i] @ model.weight[targets[i]]).reshape(1), hidden[i] @ model.weight[negs].T - shift])
        rows.append(-torch.log_softmax(logits, 0)[0])
    torch.testing.assert_close(got, torch.stack(rows).mean())


def test_inverse_cdf_draws_follow_the_probabilities_and_skip_zeros():
    from sessrec.tasks.losses import inverse_cdf_draws

    probs = torch.tensor([0.0, 0.5, 0.0, 0.2, 0.3, 0.0])
    drawn = inverse_cdf_draws(probs, (200, 500), torch.Generator().manual_seed(0))
    freq = torch.bincount(drawn.reshape(-1), minlength=6).double() / drawn.numel()
    assert freq[[0, 2, 5]].eq(0).all()
    torch.testing.assert_close(freq, probs.double(), atol=0.005, rtol=0)


def test_per_target_negatives_score_as_the_session_models_full_scores():
    from sessrec.models import SASRecEncoder, SessionModel

    torch.manual_seed(0)
    model = SessionModel(num_items=40, encoder=SASRecEncoder(d_model=8, n_head=1, n_layer=1), score_scale=16.0)
    torch.nn.init.normal_(model.output_bias)
    hidden, targets = torch.randn(5, 8), torch.tensor([2, 9, 9, 30, 39])
    loss = SampledSoftmax(negatives="per_target", num_samples=7, sampler="popularity")
    loss.set_item_counts(torch.arange(40.0))
    columns = loss.columns(model, targets, torch.Generator().manual_seed(0))
    assert columns.ids.shape == (5, 7) and columns.log_q.shape == (5, 8)
    full = model.score(hidden)  # (5, 40)
    expected = torch.cat([full.gather(1, targets[:, None]), full.gather(1, columns.ids)], 1) - columns.log_q
    expected = expected.masked_fill(columns.removed, float("-inf"))
    torch.testing.assert_close(columns.logits(model, hidden, targets), expected)


def test_in_batch_negatives_hand_case():
    model = DotScorer(6)
    hidden, targets = torch.randn(3, 4), torch.tensor([2, 4, 2])  # item 2 twice: an accidental hit
    counts = torch.tensor([0, 0, 6.0, 1.0, 3.0, 2.0])
    loss = SampledSoftmax(negatives="in_batch")
    loss.set_item_counts(counts)
    logq = torch.log(counts[targets] / counts.sum() * 3)
    logits = hidden @ model.weight[targets].T - logq[None, :]
    logits[0, 2] = logits[2, 0] = float("-inf")  # the same item as the row's own target
    expected = F.cross_entropy(logits, torch.arange(3))
    torch.testing.assert_close(loss(model, hidden, targets), expected)


def test_in_batch_correction_reads_the_counts_of_the_items_that_can_be_targets():
    """Virtual items (page views) are never targets: the expected occurrences of an item among the batch's targets
    are over the products' counts, so that mixed negatives weigh their in-batch and sampled columns alike."""
    model = DotScorer(8)
    model.recommendable = torch.tensor([False, False, True, True, True, True, False, False])  # 6 and 7 virtual
    counts = torch.tensor([0, 0, 6.0, 1.0, 3.0, 2.0, 500.0, 500.0])  # the products: 12 events
    hidden = torch.randn(3, 4, generator=torch.Generator().manual_seed(1)).requires_grad_()
    targets = torch.tensor([2, 4, 5])
    loss = SampledSoftmax(negatives="mixed", num_samples=4)
    loss.set_item_counts(counts)
    got = loss(model, hidden, targets, torch.Generator().manual_seed(0))
    samples = torch.multinomial(torch.tensor([0, 0, 1, 1, 1, 1, 0, 0.0]) / 4, 4, replacement=True,
                                generator=torch.Generator().manual_seed(0))
    candidates = torch.cat([targets, samples])
    logq = torch.cat([torch.log(counts[targets] / 12 * 3), torch.full((4,), math.log(1 / 4 * 4))])
    hits = candidates[None, :] == targets[:, None]
    hits[:, :3] &= ~torch.eye(3, dtype=torch.bool)
    expected = F.cross_entropy((hidden @ model.weight[candidates].T - logq).masked_fill(hits, float("-inf")), torch.arange(3))
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(*(torch.autograd.grad(value, hidden)[0] for value in (got, expected)))


@pytest.mark.parametrize("settings,ignored,why", [
    ({"negatives": "in_batch", "num_samples": 2048, "sampler": "popularity"}, "num_samples=2048, sampler='popularity'",
     "negatives='in_batch' draws none"),
    ({"negatives": "in_batch", "power": 1.0}, "power=1.0", "negatives='in_batch' draws none"),
    ({"negatives": "sampled", "power": 0.5}, "power=0.5", "sampler='uniform' reads no popularity"),
])
def test_settings_a_sampled_softmax_would_not_read_are_refused(settings, ignored, why):
    with pytest.raises(ValueError, match="^" + re.escape(f"SampledSoftmax: {ignored} would have no effect: {why}")):
        SampledSoftmax(**settings)
    SampledSoftmax(negatives="in_batch", num_samples=1024, sampler="uniform")  # the defaults said aloud
    SampledSoftmax(negatives="mixed", num_samples=2048, sampler="popularity", power=0.5)


def test_mixed_uses_both_candidate_sets_and_never_samples_special_ids():
    model = DotScorer(8)
    loss = SampledSoftmax(negatives="mixed", num_samples=500, sampler="popularity", power=1.0)
    loss.set_item_counts(torch.tensor([100.0, 100.0, 1, 1, 1, 1, 1, 50]))  # counts on pad/OOV are ignored
    probs = loss._sampling_probs(8, torch.device("cpu"))
    assert probs[:2].eq(0).all() and probs[7] > 10 * probs[2]
    value = loss(model, torch.randn(4, 4), torch.tensor([2, 3, 7, 7]), torch.Generator().manual_seed(0))
    assert torch.isfinite(value)


@pytest.mark.parametrize("sampler", ["uniform", "popularity"])
def test_samplers_never_draw_virtual_items(sampler):
    from sessrec.models import SessionModel, XLNetEncoder

    torch.manual_seed(0)
    model = SessionModel(12, XLNetEncoder(d_model=8, n_head=2, n_layer=1), num_virtual=4)  # ids 8-11 virtual
    power = {"power": 1.0} if sampler == "popularity" else {}  # the uniform sampler reads no power
    loss = SampledSoftmax(negatives="sampled", num_samples=4000, sampler=sampler, **power)
    loss.set_item_counts(torch.tensor([0, 0, 1, 1, 1, 1, 1, 1, 1000, 1000, 1000, 1000.0]))  # page views: frequent
    probs = loss._sampling_probs(12, torch.device("cpu"), model.recommendable)
    assert probs[:2].eq(0).all() and probs[8:].eq(0).all()
    assert probs[2:8].tolist() == pytest.approx([1 / 6] * 6)
    drawn = torch.multinomial(probs, 4000, replacement=True, generator=torch.Generator().manual_seed(0))
    assert drawn.min() >= 2 and drawn.max() <= 7
    own = SampledSoftmax(negatives="per_target", num_samples=1000, sampler=sampler, **power)
    own.set_item_counts(loss.counts)
    drawn = own.columns(model, torch.tensor([2, 5, 7]), torch.Generator().manual_seed(0)).ids  # (3, 1000)
    assert drawn.min() >= 2 and drawn.max() <= 7
    value = loss(model, torch.randn(3, 8), torch.tensor([2, 5, 7]), torch.Generator().manual_seed(0))
    assert torch.isfinite(value)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"negatives": "random"}, "negatives"),
        ({"sampler": "zipf"}, "sampler"),
        ({"num_samples": 0}, "num_samples"),
        ({"num_samples": 1.5}, r"^SampledSoftmax with 'sampled' negatives: num_samples must be an integer >= 1, got 1.5$"),
        ({"negatives": "mixed", "num_samples": "10"}, r"^SampledSoftmax with 'mixed' negatives: num_samples must be an "
                                                       r"integer >= 1, got '10'$"),
        ({"label_smoothing": 1.0}, "label_smoothing"),
        ({"temperature": 0.0}, "temperature"),
    ],
)
def test_bad_settings_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SampledSoftmax(**kwargs)


@pytest.mark.parametrize("loss", [FullSoftmax, SampledSoftmax])
@pytest.mark.parametrize("temperature", [float("inf"), float("nan")])
def test_a_temperature_that_is_no_finite_number_is_refused(loss, temperature):
    """An infinite temperature makes every logit 0 (a constant loss: nothing trains), a NaN one a NaN loss."""
    with pytest.raises(ValueError, match=f"^temperature must be a finite positive number, got {temperature}$"):
        loss(temperature=temperature)


@pytest.mark.parametrize("power", [float("inf"), float("nan")])
def test_a_popularity_power_that_is_no_finite_number_is_refused(power):
    with pytest.raises(ValueError, match=f"^power must be a finite number, got {power}$"):
        SampledSoftmax(sampler="popularity", power=power)


def test_popularity_sampler_needs_counts():
    with pytest.raises(ValueError, match="set_item_counts"):
        SampledSoftmax(sampler="popularity")(DotScorer(6), torch.randn(2, 4), torch.tensor([2, 3]))


@pytest.mark.slow
def test_task_trains_with_a_sampled_loss_and_gets_item_counts_from_the_vocabulary(tmp_path, monkeypatch):
    from pathlib import Path

    import numpy as np

    from sessrec.cli import cli

    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(tmp_path)
    run = cli([
        "fit", "--config", str(root / "recipes" / "quickstart.yaml"),
        "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "5", "--trainer.limit_val_batches", "2",
        "--trainer.enable_progress_bar", "false",
        "--data.source.init_args.num_sessions", "600", "--data.source.init_args.num_items", "80",
        "--model.encoder.init_args.d_model", "16", "--model.encoder.init_args.n_head", "2",
        "--model.loss", "sessrec.tasks.losses.SampledSoftmax",
        "--model.loss.negatives", "mixed", "--model.loss.num_samples", "32", "--model.loss.sampler", "popularity",
    ])
    loss = run.model.loss
    assert isinstance(loss, SampledSoftmax) and loss.negatives == "mixed"
    counts = loss.counts.numpy()
    np.testing.assert_array_equal(counts[2:], run.datamodule.vocab.counts)
    assert counts[:2].sum() == 0 and counts.shape == (run.datamodule.num_items,)
    assert math.isfinite(float(run.trainer.callback_metrics["train/loss"]))


@dataclasses.dataclass
class ScaledFullSoftmax(CatalogueLoss):
    """A loss written outside the library: the full softmax times a factor (found by its class path)."""

    factor: float = 0.5

    def __call__(self, model, hidden, targets, generator=None):
        return self.factor * FullSoftmax()(model, hidden, targets, generator)


@pytest.mark.slow
def test_a_loss_outside_the_library_is_found_by_class_path(tmp_path, monkeypatch):
    from pathlib import Path

    from sessrec.cli import cli

    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(tmp_path)
    args = ["--config", str(root / "recipes" / "quickstart.yaml"), "--trainer.fast_dev_run", "1",
            "--trainer.enable_progress_bar", "false",
            "--data.source.init_args.num_sessions", "200", "--data.source.init_args.num_items", "40",
            "--model.encoder.init_args.d_model", "16", "--model.encoder.init_args.n_head", "2", "--model.dropout", "0.0"]
    losses = {}
    for name, extra in (("full", []), ("scaled", ["--model.loss", "test_losses.ScaledFullSoftmax", "--model.loss.factor", "0.25"])):
        run = cli(["fit", *args, *extra])
        losses[name] = float(run.trainer.callback_metrics["train/loss"])
    assert isinstance(run.model.loss, ScaledFullSoftmax) and run.model.loss.factor == 0.25
    assert losses["scaled"] == pytest.approx(0.25 * losses["full"], rel=1e-5)  # the same first step, scaled

    # its saved config (the hyper-parameters a checkpoint holds, which resume fit) builds where the class is
    # registered (a CatalogueLoss subclass registers itself when its module is imported), and is refused
    # with the fix where it is not
    from sessrec.saved import registry
    from sessrec.saved.registry import class_path
    from sessrec.tasks.checkpointing import build, plain_hparams

    config = {"class_path": class_path(run.model), "init_args": plain_hparams(run.model)}
    path = f"{__name__}.ScaledFullSoftmax"
    assert json.loads(json.dumps(config))["init_args"]["loss"]["class_path"] == path
    loaded = build(config, "best.ckpt", "hyper_parameters")
    assert isinstance(loaded.loss, ScaledFullSoftmax) and loaded.loss.factor == 0.25
    monkeypatch.delitem(registry._CLASSES, path)  # as before the module that defines it is imported
    with pytest.raises(ValueError) as refused:
        build(config, "best.ckpt", "hyper_parameters")
    assert str(refused.value) == (
        f"best.ckpt: hyper_parameters.init_args.loss: '{path}' is not registered; import the module that defines it "
        "(subclasses of CatalogueLoss register themselves; the sessrec command: --import MODULE) or call "
        "sessrec.saved.registry.register(ScaledFullSoftmax) "
        "before loading"
    )
    with pytest.raises(NotImplementedError, match="does not read item counts"):
        FullSoftmax().set_item_counts(torch.ones(5))


@dataclasses.dataclass
class RecordingSampledSoftmax(SampledSoftmax):
    """`SampledSoftmax` that keeps the negatives it draws at each call."""

    def columns(self, model, targets, generator=None):
        columns = super().columns(model, targets, generator)
        self.drawn = [*getattr(self, "drawn", []), columns.ids.tolist()]
        return columns


def test_every_batch_of_a_run_draws_its_own_negatives(monkeypatch):
    """The batches of one accumulated step, and the processes of a data-parallel run, draw negatives (and masks) of
    their own; the same seed, rank and batch draw the same ones."""
    import pytorch_lightning as pl

    from sessrec.data import SyntheticSource
    from sessrec.models import CausalLanguageModeling, GRU4RecEncoder
    from sessrec.tasks import NextItemTask, SessionDataModule

    def drawn(accumulate: int, rank: int = 0) -> list:
        monkeypatch.setattr(NextItemTask, "global_rank", property(lambda task: rank))
        dm = SessionDataModule(source=SyntheticSource(num_sessions=200, num_items=40), max_length=5, batch_size=16)
        task = NextItemTask(num_items=dm.num_items, max_length=5, encoder=GRU4RecEncoder(d_model=8),
                            objective=CausalLanguageModeling(),
                            loss=RecordingSampledSoftmax(num_samples=6))
        pl.Trainer(max_steps=4 // accumulate, accumulate_grad_batches=accumulate, limit_val_batches=0, logger=False,
                   enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False).fit(task, dm)
        return task.loss.drawn

    accumulated = drawn(accumulate=2)
    assert len(accumulated) == 4 and len({tuple(ids) for ids in accumulated}) == 4
    assert drawn(accumulate=1) == accumulated  # the batches draw by their place in the run, not by optimizer step
    other = drawn(accumulate=2, rank=1)
    assert all(mine != theirs for mine, theirs in zip(accumulated, other))
