"""Ranking metrics against hand-computed cases."""

import math
import re

import pytest
import torch

from sessrec.metrics import RankingMetrics, TopKMetrics, target_ranks

NEG = float("-inf")


def scores(*rows):
    return torch.tensor(rows, dtype=torch.float32)


def test_ranks_are_pessimistic_on_ties():
    # ids 0, 1 are padding/OOV (-inf). Target 3 ties with item 2 -> rank 2, not 1.
    s = scores([NEG, NEG, 5.0, 5.0, 1.0])
    assert target_ranks(s, torch.tensor([3])).tolist() == [2.0]
    assert target_ranks(s, torch.tensor([4])).tolist() == [3.0]
    # a constant model ranks every target last among the three real items
    flat = scores([NEG, NEG, 0.0, 0.0, 0.0])
    assert target_ranks(flat, torch.tensor([2])).tolist() == [3.0]


def test_items_scored_nan_count_against_the_target_and_a_target_scored_nan_is_a_miss():
    """NaN compares false with every score: counted as 'not at least as high', the items a broken model scores NaN
    would lift the target's rank."""
    from sessrec.metrics import clicked_ranks, list_ranks

    nan = float("nan")
    assert target_ranks(scores([NEG, NEG, nan, nan, 1.0]), torch.tensor([4])).tolist() == [3.0]
    assert math.isinf(target_ranks(scores([NEG, NEG, 2.0, nan]), torch.tensor([3])).item())
    listed = list_ranks(torch.tensor([[2, 3, 4]]), torch.tensor([[nan, 1.0, 0.5]]), torch.tensor([3]))
    assert listed.tolist() == [2.0]
    clicked = clicked_ranks(torch.tensor([nan, 1.0, 0.5]), torch.tensor([0, 1, 0]), torch.tensor([0, 0, 0]))
    assert clicked.tolist() == [2.0]


def test_a_target_scored_inf_is_ranked_not_a_miss():
    """A score of +inf (a half-precision overflow) lies above every finite one: the target was counted as one no list
    can hold, while the served list puts it first."""
    inf = float("inf")
    s = scores([NEG, NEG, 1.0, inf, 2.0], [NEG, NEG, inf, inf, 2.0])
    assert target_ranks(s, torch.tensor([3, 3])).tolist() == [1.0, 2.0]
    m = TopKMetrics(ks=[1])
    m.update(s, torch.tensor([3, 3]))
    assert {k: float(v) for k, v in m.compute().items()} == {"recall@1": 0.5, "ndcg@1": 0.5, "mrr@1": 0.5, "unrankable": 0.0}


def test_oov_and_padding_targets_are_misses():
    s = scores([NEG, NEG, 3.0, 2.0])
    r = target_ranks(s, torch.tensor([1]))
    assert math.isinf(r.item())
    m = TopKMetrics(ks=[100])  # K larger than the catalogue: still a miss
    m.update(s, torch.tensor([1]))
    assert m.compute()["recall@100"].item() == 0.0
    m.update(s, torch.tensor([2]))  # a target in the vocabulary: rankable
    assert m.compute()["unrankable"].item() == 0.5


def test_hand_computed_batch():
    # row 1: target 4 has rank 1; row 2: target 2 has rank 3; row 3: target 5 has rank 2
    s = scores(
        [NEG, NEG, 0.1, 0.2, 0.9, 0.3],
        [NEG, NEG, 0.1, 0.5, 0.4, 0.3],
        [NEG, NEG, 0.7, 0.1, 0.2, 0.6],
    )
    t = torch.tensor([4, 2, 5])
    assert target_ranks(s, t).tolist() == [1.0, 4.0, 2.0]
    m = TopKMetrics(ks=[1, 2, 4])
    m.update(s, t)
    out = {k: v.item() for k, v in m.compute().items()}
    assert out["recall@1"] == pytest.approx(1 / 3)
    assert out["recall@2"] == pytest.approx(2 / 3)
    assert out["recall@4"] == pytest.approx(1.0)
    assert out["mrr@2"] == pytest.approx((1 + 0.5) / 3)
    assert out["mrr@4"] == pytest.approx((1 + 0.25 + 0.5) / 3)
    assert out["ndcg@2"] == pytest.approx((1 + 1 / math.log2(3)) / 3)
    assert out["ndcg@4"] == pytest.approx((1 + 1 / math.log2(5) + 1 / math.log2(3)) / 3)


def test_k_larger_than_catalogue_counts_every_real_target():
    s = scores([NEG, NEG, 0.3, 0.2, 0.1])
    m = TopKMetrics(ks=[50])
    m.update(s, torch.tensor([4]))
    out = m.compute()
    assert out["recall@50"].item() == 1.0
    assert out["mrr@50"].item() == pytest.approx(1 / 3)


def test_accumulates_over_batches_like_one_batch():
    torch.manual_seed(0)
    s = torch.randn(10, 30)
    s[:, :2] = NEG
    t = torch.randint(2, 30, (10,))
    whole, parts = TopKMetrics(ks=[5, 10]), TopKMetrics(ks=[5, 10])
    whole.update(s, t)
    parts.update(s[:3], t[:3])
    parts.update(s[3:], t[3:])
    for k, v in whole.compute().items():
        assert parts.compute()[k].item() == pytest.approx(v.item())
    parts.reset()
    assert parts.count.item() == 0


def test_rejects_bad_cutoffs():
    with pytest.raises(ValueError, match="ks"):
        TopKMetrics(ks=[0])


@pytest.mark.parametrize("metric", [TopKMetrics, RankingMetrics])
@pytest.mark.parametrize("ks", [[0], [5, -1], [2.5], [True], []])
def test_cutoffs_that_are_no_positive_integers_are_refused_when_the_metric_is_built(metric, ks):
    """A cut-off of 2.5 is not reported as recall@2, and RankingMetrics refuses what TopKMetrics refuses,
    before any update, naming the cut-offs."""
    with pytest.raises(ValueError, match=rf"^ks must be positive integer cut-offs, got {re.escape(str(ks))}$"):
        metric(ks=ks)


def test_exclude_seen_masks_the_input_items_and_makes_a_repeat_target_a_miss():
    from sessrec.data import SessionBatch
    from sessrec.models import CausalLanguageModeling, SASRecEncoder
    from sessrec.tasks import Evaluation, NextItemTask
    from sessrec.tasks.next_item import exclude_seen

    scores = torch.arange(12.0).repeat(2, 1)  # (2, 12): item 11 best, then 10, ...
    items = torch.tensor([[0, 0, 11, 4], [10, 10, 9, 12]], dtype=torch.int32)  # 12: outside the scores
    masked = exclude_seen(scores, items)
    inf = float("-inf")
    assert masked[0].tolist() == [inf, 1, 2, 3, inf, 5, 6, 7, 8, 9, 10, inf]
    assert masked[1].tolist() == [inf, 1, 2, 3, 4, 5, 6, 7, 8, inf, inf, 11]
    assert scores[0, 11] == 11  # a new tensor

    torch.manual_seed(0)
    batch = SessionBatch(items=torch.tensor([[0, 2, 3, 4], [5, 6, 7, 3]]), targets=torch.tensor([3, 8]))
    task = NextItemTask(num_items=10, max_length=4, encoder=SASRecEncoder(d_model=8, n_head=1, n_layer=1),
                        objective=CausalLanguageModeling(), evaluation=Evaluation(ks=[8], top_k=4, exclude_seen=True)).eval()
    with torch.no_grad():
        raw = task.model(batch.items, task.objective)  # (2, 10)
        top = task.predict_step(batch, 0).items
        task._step(batch, "test")
    assert torch.equal(top, exclude_seen(raw, batch.items).topk(4, dim=1).indices)
    assert not (top[:, :, None] == batch.items[:, None, :]).any()  # nothing the session holds
    expected = TopKMetrics([8])
    expected.update(exclude_seen(raw, batch.items), batch.targets)
    got = task.metrics["test"].compute()
    assert got == expected.compute()
    assert float(got["recall@8"]) <= 0.5  # target 3 repeats an item of row 0: always a miss
    assert float(got["unrankable"]) == 0.5  # and is counted as one no list can hold


# -- one implementation for every caller -------------------------------------------------------------
def test_targets_and_labels_of_another_shape_than_their_scores_are_refused_naming_both_shapes():
    """One target per row of scores, one label and one query per score, one served list per target: a batch of two rows and one target
    was ranked by broadcasting (both rows against the first row's target) and counted twice."""
    from sessrec.metrics import clicked_ranks, list_ranks

    two_rows = scores([NEG, NEG, 3.0, 2.0, 1.0], [NEG, NEG, 1.0, 2.0, 3.0])
    for targets in (torch.tensor([3]), torch.tensor([[3], [4]]), torch.tensor([3, 4, 2])):
        message = f"targets must be (2,) item ids, one per row of the (2, 5) scores, got shape {tuple(targets.shape)}"
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            TopKMetrics(ks=[1]).update(two_rows, targets)
    with pytest.raises(ValueError, match=re.escape("scores must be (B, V) rows of item scores, got shape (5,)")):
        target_ranks(two_rows[0], torch.tensor([3]))
    with pytest.raises(ValueError, match=re.escape("labels (2,) and groups (3,) must be (3,) as the scores")):
        clicked_ranks(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1, 0]), torch.tensor([0, 0, 1]))
    lists = torch.tensor([[4, 7, 9], [4, 9, 7]])
    for list_scores, targets, shapes in ((scores([3.0, 2.0, 1.0], [3.0, 2.0, 1.0]), torch.tensor([7]), "(2, 3), (2, 3) and (1,)"),
                                         (scores([3.0, 2.0, 1.0]), torch.tensor([7, 9]), "(2, 3), (1, 3) and (2,)")):
        with pytest.raises(ValueError, match=re.escape(f"(N,) targets, got shapes {shapes}")):
            list_ranks(lists, list_scores, targets)


def test_rank_values_by_hand():
    from sessrec.metrics import rank_values

    ranks = torch.tensor([1.0, 2.0, 3.0, float("inf")])
    assert rank_values(ranks, "recall@2").tolist() == [1.0, 1.0, 0.0, 0.0]
    assert rank_values(ranks, "mrr@2").tolist() == [1.0, 0.5, 0.0, 0.0]
    assert rank_values(ranks, "ndcg@3").tolist() == pytest.approx([1.0, 1 / math.log2(3), 0.5, 0.0])
    assert rank_values(ranks, "mrr").tolist() == [1.0, 0.5, 1 / 3, 0.0]
    with pytest.raises(ValueError, match="metric 'auc' is not a mean over test pairs"):
        rank_values(ranks, "auc")


def test_ranks_below_one_are_refused_as_no_1_based_ranks():
    """0-based ranks (argsort positions) gave recall@K of one rank too many and an MRR of inf; a rank below 1
    or NaN is a ValueError naming it, whatever the metric."""
    from sessrec.metrics import rank_sums, rank_values

    for ranks, value in ((torch.tensor([0.0, 2.0, 3.0]), "0.0 at 0"), (torch.tensor([1.0, float("nan")]), "nan at 1"),
                         (torch.tensor([2.0, -1.0]), "-1.0 at 1")):
        for metric in ("recall@2", "ndcg@2", "mrr@2", "mrr"):
            with pytest.raises(ValueError, match=rf"^ranks are 1-based \(1: first, inf: a miss\), got {re.escape(value)}"):
                rank_values(ranks, metric)
        with pytest.raises(ValueError, match="^ranks are 1-based"):
            rank_sums(ranks, [2])
    assert rank_values(torch.zeros(0), "mrr@2").tolist() == []


def test_list_clicked_and_catalogue_ranks_break_ties_the_same_way():
    """The same scores seen as a catalogue row, a served list and a query's rows give the same rank."""
    from sessrec.metrics import clicked_ranks, list_ranks

    row = scores([NEG, NEG, 5.0, 4.0, 4.0, 1.0])  # target 4 ties with 3: pessimistic rank 3
    assert target_ranks(row, torch.tensor([4])).tolist() == [3.0]
    listed = list_ranks(torch.tensor([[2, 3, 4, 5]]), torch.tensor([[5.0, 4.0, 4.0, 1.0]]), torch.tensor([4]))
    assert listed.tolist() == [3.0]
    clicked = clicked_ranks(torch.tensor([5.0, 4.0, 4.0, 1.0]), torch.tensor([0, 0, 1, 0]), torch.tensor([0, 0, 0, 0]))
    assert clicked.tolist() == [3.0]


def test_auc_is_torchmetrics_auroc_and_keeps_ties_of_large_logits():
    from torchmetrics.functional.classification import binary_auroc

    from sessrec.metrics import binary_auc

    torch.manual_seed(0)
    probs, labels = torch.rand(200), (torch.rand(200) < 0.4).long()
    assert float(binary_auc(probs, labels)) == pytest.approx(float(binary_auroc(probs, labels)), abs=1e-6)
    # logits 40 and 50 differ; a sigmoid in float32 would make them tie at 1.0 (AUC 0.5 instead of 1)
    assert float(binary_auc(torch.tensor([40.0, 50.0]), torch.tensor([0, 1]))) == 1.0


# -- against a brute-force reference ------------------------------------------------------------------
def brute_rank(row: list[float], target: int) -> float:
    """1 + the other items scoring at least as high as the target, or NaN; inf for a special id or a target scored
    -inf or NaN: a plain loop over the row."""
    own = row[target]
    if target < 2 or math.isnan(own) or own == NEG:
        return math.inf
    return 1.0 + sum(1 for j, s in enumerate(row) if j != target and (math.isnan(s) or s >= own))


def test_topk_metrics_over_batches_of_several_sizes_match_a_brute_force_reference():
    """Ties, -inf, +inf and NaN scores, targets at rank k and k + 1, k past the catalogue, specials as targets, batches
    of different sizes: the means are over all pairs, not of per-batch means."""
    import random

    rng = random.Random(0)
    choices = [0.0, 1.0, 2.0, NEG, float("nan"), float("inf")]
    for _ in range(200):
        width, ks = rng.randint(3, 9), sorted(rng.sample(range(1, 12), rng.randint(1, 3)))
        metric, ranks = TopKMetrics(ks), []
        for _ in range(rng.randint(1, 5)):
            rows = [[rng.choice([*choices, rng.random()]) for _ in range(width)] for _ in range(rng.randint(1, 6))]
            targets = [rng.randrange(width) for _ in rows]
            metric.update(torch.tensor(rows), torch.tensor(targets))
            ranks += [brute_rank(row, t) for row, t in zip(rows, targets)]
        expected = {}
        for k in ks:
            expected[f"recall@{k}"] = sum(r <= k for r in ranks) / len(ranks)
            expected[f"ndcg@{k}"] = sum(1 / math.log2(r + 1) for r in ranks if r <= k) / len(ranks)
            expected[f"mrr@{k}"] = sum(1 / r for r in ranks if r <= k) / len(ranks)
        expected["unrankable"] = sum(math.isinf(r) for r in ranks) / len(ranks)
        got = {k: float(v) for k, v in metric.compute().items()}
        assert got == pytest.approx(expected, abs=1e-6)


def test_the_evaluation_loss_is_the_mean_over_rankable_targets_whatever_the_batching():
    """A batch whose targets were all unseen in training logged a loss of 0.0 weighted by its sessions, and the
    others their mean weighted by all their sessions: test/loss moved with eval_batch_size, and a test split of
    unseen targets only printed a loss of 0.0 over no target (now NaN)."""
    import numpy as np
    import pyarrow as pa
    import pytorch_lightning as pl

    from sessrec.data import SessionSplits
    from sessrec.data.sources import SessionSource
    from sessrec.models import CausalLanguageModeling, GRU4RecEncoder
    from sessrec.tasks import NextItemTask, SessionDataModule

    class Log(SessionSource):
        def __init__(self, test: list[list[int]]) -> None:
            self.test = test

        def load(self) -> SessionSplits:
            train = [[10 + i % 7, 10 + (i + 1) % 7, 10 + (i + 3) % 7] for i in range(20)]
            table = lambda rows: pa.table({"session_id": np.arange(len(rows)), "item_id": rows})  # noqa: E731
            return SessionSplits(train=table(train), valid=table(train[:4]), test=table(self.test), source="log")

    def test_loss(test: list[list[int]], batch: int) -> dict[str, float]:
        dm = SessionDataModule(Log(test), max_length=4, eval_batch_size=batch)
        pl.seed_everything(0)
        task = NextItemTask(num_items=dm.num_items, max_length=4, encoder=GRU4RecEncoder(d_model=8),
                            objective=CausalLanguageModeling())
        trainer = pl.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False)
        return trainer.test(task, dm, verbose=False)[0]

    mixed = [[10, 99], [11, 12], [12, 98], [13, 14]]  # 99 and 98: unseen in training
    one, all_ = test_loss(mixed, 1), test_loss(mixed, 4)
    assert one["test/loss"] == pytest.approx(all_["test/loss"]) and all_["test/loss"] > 1.0
    unseen = test_loss([[10, 99], [11, 98]], 4)
    assert math.isnan(unseen["test/loss"]) and unseen["test/unrankable"] == 1.0  # no loss over no target, not 0.0
