"""`ScoringOnlyTask`: the Lightning loops of a task with nothing to train.

`BaselineTask` (a kNN or popularity baseline, fitted at `setup`) and `EnsembleTask` (trained
members, loaded at `setup`) share them: ``sessrec validate`` / ``sessrec test`` update the same
`TopKMetrics` and print the same ``[val]`` / ``[test]`` lines as `NextItemTask`, ``sessrec predict``
returns the top-K recommendable items of each session, and ``sessrec fit`` is refused with the
subclass's `nothing_to_train` message. A subclass gives ``forward(batch) -> (B, V)`` scores,
``metrics`` (a `TopKMetrics` per stage ``val`` / ``test``), and ``evaluation`` (`Evaluation` as plain
data) and ``num_virtual`` hyper-parameters. Shape letters: B batch, V items.
"""

from __future__ import annotations

import pytorch_lightning as pl

from sessrec.data.batch import SessionBatch
from sessrec.data.vocab import NUM_SPECIAL
from sessrec.models.session_model import top_recommendable
from sessrec.tasks.checkpointing import full_precision
from sessrec.tasks.next_item import NextItemTask, TopK


class ScoringOnlyTask(pl.LightningModule):
    """Validation, test and prediction loops over ``self(batch)``; training refused."""

    def nothing_to_train(self) -> ValueError:
        """The error `sessrec fit` gets: what to run instead."""
        return ValueError(f"{type(self).__name__} has no weights to train: run `sessrec test` (or validate, predict)")

    def _step(self, batch: SessionBatch, stage: str) -> None:
        self.metrics[stage].update(self(batch), batch.targets)

    def training_step(self, batch: SessionBatch, batch_idx: int) -> None:
        raise self.nothing_to_train()  # defined so that Lightning reaches `setup`, which says why

    def configure_optimizers(self) -> None:
        raise self.nothing_to_train()

    # the evaluation settings, the loops over `_step`, the metric logging and the printed [val]/[test] lines are
    # NextItemTask's, shared as they are
    evaluation = NextItemTask.evaluation
    validation_step = NextItemTask.validation_step
    test_step = NextItemTask.test_step
    _log_metrics = NextItemTask._log_metrics
    on_validation_epoch_end = NextItemTask.on_validation_epoch_end
    on_test_epoch_end = NextItemTask.on_test_epoch_end

    def predict_step(self, batch: SessionBatch, batch_idx: int) -> TopK:
        with full_precision(self):
            scores = self(batch)
        recommendable = scores.shape[1] - NUM_SPECIAL - int(self.hparams.get("num_virtual", 0))
        items, values = top_recommendable(scores, self.evaluation.top_k, recommendable)
        return TopK(items=items, scores=values)
