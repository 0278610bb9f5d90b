"""The retraining gate (`sessrec.lifecycle.gate`) on per-pair values, and the per-pair test metrics
(`sessrec.lifecycle.paired_ranks`) it compares, against the tasks' own test metrics."""

import itertools
import math
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import pytorch_lightning as pl
import torch

from sessrec.data import ItemVocab, SyntheticSource, frame
from sessrec.lifecycle.gate import Gate
from sessrec.lifecycle.paired_ranks import PairRanks, aligned, clickout_ranks, next_item_ranks
from sessrec.lifecycle.retrain import LoadedSplits, pair_ranks
from sessrec.models import CausalLanguageModeling, GRU4RecEncoder
from sessrec.saved.registry import config_of
from sessrec.tasks import DLRMTask, Evaluation, NextItemTask, Optimization, SessionDataModule

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
TRIVAGO = ROOT.parent / "shared" / "data" / "trivago_rsc19_100k" / "trivago_val_100k.parquet.snappy"
Z95 = 1.6448536  # the standard normal's 95% quantile


def trainer_test(task: pl.LightningModule, data: pl.LightningDataModule) -> dict[str, float]:
    """The task's own test metrics by ``trainer.test`` (``recall@20``, ``mrr``, ...)."""
    trainer = pl.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    (metrics,) = trainer.test(task, datamodule=data, verbose=False)
    return {k.removeprefix("test/"): float(v) for k, v in metrics.items() if k.count("/") == 1}


def hits(n: int, rate: float, seed: int = 0) -> np.ndarray:
    """(n,) 0/1 per-pair values (a recall) with `rate` hits."""
    return (np.random.default_rng(seed).random(n) < rate).astype(np.float64)


def worse(values: np.ndarray, lost: int, offset: int = 0) -> np.ndarray:
    """`values` with `lost` of its hits, from the `offset`-th on, turned into misses."""
    out = values.copy()
    out[np.flatnonzero(values == 1)[offset:offset + lost]] = 0.0
    return out


# ------------------------------------------------------------------------------------------------ the gate
@pytest.mark.slow
def test_a_chain_of_small_losses_is_stopped_by_the_best_promoted():
    n, gate = 20_000, Gate("recall@20", tolerance=0.005, min_pairs=1000, samples=500)
    chain = [hits(n, 0.5)]
    for k in range(10):  # each candidate 0.004 worse than the one before: 80 more of the 20,000 pairs missed
        chain.append(worse(chain[-1], 80, offset=80 * k))
    assert np.diff([c.mean() for c in chain]) == pytest.approx([-0.004] * 10)
    current = best = chain[0]
    promoted = []
    for candidate in chain[1:]:
        decision = gate.decide(candidate, current, None if best is current else best)
        promoted.append(decision.passed)
        if decision.passed:
            current = candidate
            best = candidate if decision.new_best else best
    assert promoted == [True] + [False] * 9  # the first loss is within the tolerance, the second would pass it
    assert best is chain[0] and current is chain[1] and best.mean() - current.mean() == pytest.approx(0.004)
    # against the current model alone, every one of them passes: a loss of 0.04 in ten turns
    assert all(gate.decide(candidate, last).passed for last, candidate in itertools.pairwise(chain))


def test_the_reason_names_the_reference_the_candidate_trails():
    best = hits(20_000, 0.5)
    current, candidate = worse(best, 80), worse(best, 160)
    decision = Gate(tolerance=0.005).decide(candidate, current, best, current_name="the current model (v000004)",
                                            best_name="the best promoted (v000003)")
    assert not decision.passed and not decision.new_best and decision.pairs == 20_000
    low, high = -decision.versus_best.high, -decision.versus_best.low
    assert decision.reason == (
        f"candidate trails the best promoted (v000003) by 0.0080 [{low:.4f}, {high:.4f}]: more than the tolerance 0.005"
    )
    assert 0.005 < low < 0.008 < high < 0.0095
    assert decision.versus_current.difference == pytest.approx(-0.004) and decision.versus_current.holds(0.005)
    assert asdict(decision)["versus_best"]["reference"] == "the best promoted (v000003)"


def test_too_few_pairs_are_refused_even_for_an_equal_candidate():
    gate = Gate(tolerance=0.005, min_pairs=1000)
    few = hits(999, 0.5)
    decision = gate.decide(few.copy(), few)
    assert not decision.passed and not decision.new_best
    assert decision.reason == "only 999 test pairs, fewer than min_pairs 1000: too few to decide"
    assert (decision.versus_current.difference, decision.versus_current.low, decision.versus_current.high) == (0.0, 0.0, 0.0)
    enough = hits(1000, 0.5)
    assert gate.decide(enough.copy(), enough).passed


def test_a_clearly_better_candidate_passes_and_becomes_the_best():
    best = hits(5000, 0.5)
    current = worse(best, 20)
    candidate = np.where(hits(5000, 0.2, seed=3) == 1, 1.0, best)  # about 0.1 better than the best
    decision = Gate().decide(candidate, current, best)
    assert decision.passed and decision.new_best
    assert decision.versus_best.low > 0.08 and decision.versus_current.low > decision.versus_best.low
    assert decision.reason.startswith("candidate leads the current model by ") and "within the tolerance 0.005" in decision.reason
    # better than the current model, a little worse than the best: promoted, but the best stays the anchor
    between = worse(best, 10)
    kept = Gate().decide(between, current, best)
    assert kept.passed and not kept.new_best and kept.versus_best.difference == pytest.approx(-0.002)
    # without a best apart from the current model, the anchor is the current model
    assert Gate().decide(between, current).new_best and not Gate().decide(current, between).new_best


def test_the_interval_is_computed_on_pairs():
    n = 4000
    rng = np.random.default_rng(7)
    reference = rng.random(n)
    candidate = reference + 0.002 + rng.normal(0.0, 0.02, n)  # high correlation between the two models' values
    decision = Gate(min_pairs=100, samples=4000).decide(candidate, reference)
    d = candidate - reference
    paired = 2 * Z95 * d.std() / math.sqrt(n)
    unpaired = 2 * Z95 * math.sqrt(candidate.var() + reference.var()) / math.sqrt(n)
    width = decision.versus_current.high - decision.versus_current.low
    assert width == pytest.approx(paired, rel=0.1)  # the spread of the mean paired difference
    assert unpaired > 10 * width
    assert decision.versus_current.low == pytest.approx(d.mean() - Z95 * d.std() / math.sqrt(n), abs=0.1 * paired)


def test_the_decision_is_seeded_and_the_inputs_checked():
    a, b = hits(3000, 0.4), hits(3000, 0.4, seed=1)
    assert Gate(seed=3).decide(a, b) == Gate(seed=3).decide(a, b)
    assert Gate(seed=3).decide(a, b).versus_current.low != Gate(seed=4).decide(a, b).versus_current.low
    with pytest.raises(ValueError, match="the current's per-pair values must be 3000 finite numbers, got shape"):
        Gate().decide(a, b[:10])
    with pytest.raises(ValueError, match="the best's per-pair values must be 3000 finite numbers"):
        Gate().decide(a, b, np.full(3000, np.nan))
    with pytest.raises(ValueError, match="gate tolerance must be >= 0, got -0.1"):
        Gate(tolerance=-0.1)
    for tolerance in (1.0, 5):  # 5 meant as 5 points: every candidate, a random one too, would be promoted
        with pytest.raises(ValueError) as err:
            Gate("mrr@20", tolerance=tolerance)
        assert str(err.value) == (f"gate tolerance must be below 1, got {tolerance!r}: mrr@20 of each test pair is in "
                                  "[0, 1], so no candidate trails by 1 or more and every one would be promoted; a "
                                  "tolerance is a share (0.005 for half a point)")
    with pytest.raises(ValueError, match=r"gate confidence must be in \(0.5, 1\), got 1.5"):
        Gate(confidence=1.5)


def test_per_pair_values_follow_the_metric_formulas():
    ranks = np.array([1.0, 2.0, 3.0, 21.0, np.inf])
    pairs = PairRanks(np.arange(5), np.zeros(5, np.int64), ranks, {})
    assert pairs.values("recall@2").tolist() == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert pairs.values("ndcg@20") == pytest.approx([1.0, 1 / math.log2(3), 0.5, 0.0, 0.0])
    assert pairs.values("mrr@20") == pytest.approx([1.0, 0.5, 1 / 3, 0.0, 0.0])
    assert pairs.values("mrr") == pytest.approx([1.0, 0.5, 1 / 3, 1 / 21, 0.0])
    with pytest.raises(ValueError, match="metric 'auc' is not a mean over test pairs"):
        pairs.values("auc")
    with pytest.raises(ValueError, match="metric 'auc' is not a mean over test pairs"):
        Gate("auc")
    disagreeing = PairRanks(np.arange(5), np.zeros(5, np.int64), ranks, {"recall@2": 0.5})
    with pytest.raises(RuntimeError, match="the per-pair recall@2 averages 0.4000000 but the task's metric is 0.5000000"):
        disagreeing.values("recall@2")


# ------------------------------------------------------------------------------------------------ per-pair metrics
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny GRU4Rec trained one epoch on synthetic sessions, its splits and its vocabulary file."""
    folder = tmp_path_factory.mktemp("gate")
    splits = SyntheticSource(num_sessions=1500, num_items=60, seed=2).load()
    data = SessionDataModule(LoadedSplits(splits), max_length=8, batch_size=128, seed=0)
    pl.seed_everything(0)
    task = NextItemTask(num_items=data.num_items, max_length=8, encoder=GRU4RecEncoder(d_model=16),
                        objective=CausalLanguageModeling(), optimization=Optimization(lr=0.01))
    pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False).fit(task, datamodule=data)
    return task, splits, data.vocab.save(folder / "vocab.parquet")


@pytest.mark.parametrize("protocol,exclude_seen", [("last", False), ("all_prefixes", True)])
def test_per_pair_values_average_to_the_trainer_test(trained, protocol, exclude_seen):
    task, splits, vocab_path = trained
    task.hparams.evaluation = config_of(Evaluation(exclude_seen=exclude_seen))
    try:
        data = SessionDataModule(LoadedSplits(splits), max_length=8, eval_batch_size=100, eval_protocol=protocol,
                                 vocab_path=str(vocab_path))
        expected = trainer_test(task, data)
        ranks = next_item_ranks(task, data)
    finally:
        task.hparams.evaluation = config_of(Evaluation())
    assert len(ranks) == data.stats["test_pairs"] > 100
    for metric in ("recall@10", "recall@20", "ndcg@20", "mrr@20"):
        assert ranks.values(metric).mean() == pytest.approx(expected[metric], abs=1e-6)
        assert ranks.metrics[metric] == pytest.approx(expected[metric], abs=1e-7)
    assert 0 < expected["recall@20"] < 1
    assert (ranks.positions >= 1).all()  # a target always has an event before it
    if protocol == "last":  # one pair per session, its last event
        lengths = np.array([len(s) for s in splits.test.column("item_id").to_pylist()])
        assert np.array_equal(ranks.positions, lengths - 1)
        assert np.array_equal(ranks.sessions, splits.test.column("session_id").to_numpy())


def test_models_with_other_vocabularies_are_compared_on_the_same_pairs(trained, tmp_path):
    task, splits, vocab_path = trained
    data = SessionDataModule(LoadedSplits(splits), max_length=8, vocab_path=str(vocab_path))
    # a model that knows only the items of the first 100 training sessions
    values, _ = frame.list_offsets(splits.train.slice(0, 100).column("item_id"))
    small_vocab = ItemVocab.fit(values)
    small_path = small_vocab.save(tmp_path / "small.parquet")
    small = NextItemTask(num_items=len(small_vocab), max_length=8, encoder=GRU4RecEncoder(d_model=16),
                         objective=CausalLanguageModeling())
    small_data = SessionDataModule(LoadedSplits(splits), max_length=8, vocab_path=str(small_path))
    big, little = next_item_ranks(task, data), next_item_ranks(small, small_data)
    assert aligned({"the candidate": big, "the current model": little}) == len(big)
    targets = np.array([s[-1] for s in splits.test.column("item_id").to_pylist()])
    unseen = ~np.isin(targets, values.to_numpy())
    assert unseen.any() and np.isinf(little.ranks[unseen]).all()  # an item the model never saw is a miss for it
    assert little.values("recall@20").mean() == pytest.approx(trainer_test(small, small_data)["recall@20"], abs=1e-6)
    shifted = PairRanks(big.sessions, big.positions + 1, big.ranks, big.metrics)
    with pytest.raises(ValueError, match=r"the test pairs of the current model \(\d+\) are not those of the candidate"):
        aligned({"the candidate": big, "the current model": shifted})


def test_a_model_trained_with_event_times_is_ranked_with_them(tmp_path):
    """A model whose encoder reads event times (HSTU) was ranked without them: its encoder refused at the end of a
    retraining turn, after the candidate had trained. The data module of `retrain` gives the test batches their
    times when the task reads them, and the pairs are ranked as ``trainer.test`` ranks them."""
    from sessrec.models import HSTUEncoder

    splits = SyntheticSource(num_sessions=300, num_items=30, seed=2).load()
    data = SessionDataModule(LoadedSplits(splits), max_length=8, batch_size=64, seed=0)
    pl.seed_everything(0)
    task = NextItemTask(num_items=data.num_items, max_length=8, encoder=HSTUEncoder(d_model=8, n_head=2, n_layer=1),
                        objective=CausalLanguageModeling(), optimization=Optimization(lr=0.01))
    pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False).fit(task, datamodule=data)
    assert task.model.needs_times
    vocab_path = data.vocab.save(tmp_path / "vocab.parquet")
    ranks = pair_ranks(task, splits, vocab_path)
    expected = trainer_test(task, SessionDataModule(LoadedSplits(splits), max_length=8, eval_protocol="last",
                                                    vocab_path=str(vocab_path)))
    for metric in ("recall@10", "ndcg@20", "mrr@20"):
        assert ranks.values(metric).mean() == pytest.approx(expected[metric], abs=1e-6)


@pytest.mark.skipif(not TRIVAGO.exists(), reason="trivago_rsc19_100k is not available here")
def test_clickout_reciprocal_ranks_average_to_the_dlrm_test_mrr():
    from sessrec.tasks import ClickoutDataModule

    data = ClickoutDataModule(str(TRIVAGO), end="2018-11-07T12:00", test_hours=4.0, valid_hours=2.0, train_hours=4.0,
                              batch_size=4096, eval_batch_size=2000)
    pl.seed_everything(0)
    task = DLRMTask(cardinalities=data.cardinalities, num_dense=data.num_dense,
                    network={"embedding_dim": 8, "dense_layers": [16, 8], "over_layers": [16]})
    pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False).fit(task, datamodule=data)
    expected = trainer_test(task, data)
    ranks = clickout_ranks(task, data)
    assert len(ranks) > 100 and len(np.unique(ranks.sessions)) == len(ranks)  # one click per click-out here
    assert ranks.values("mrr").mean() == pytest.approx(expected["mrr"], abs=1e-6)
    assert ranks.values("recall@5").mean() == pytest.approx(expected["recall@5"], abs=1e-6)
    assert 0.1 < expected["mrr"] < 1
