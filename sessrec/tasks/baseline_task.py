"""`BaselineTask`: a non-neural baseline in the same Lightning loops and metrics as `NextItemTask`.

Nothing is trained: `setup` fits the baseline on the data module's training sessions (each whole
session once, whatever rows a network would train on), then
``sessrec validate`` / ``sessrec test`` rank every evaluation prefix over the full catalogue
with `TopKMetrics` and print the same ``[val]`` / ``[test]`` lines, and ``sessrec predict``
writes top-K recommendations with the same `TopKWriter`:

    sessrec test     --config recipes/data/diginetica.yaml --config recipes/model/vsknn.yaml
    sessrec validate --config recipes/data/diginetica.yaml --config recipes/model/vsknn.yaml --model.baseline.k 200

Shape letters: B batch, V items.
"""

from __future__ import annotations

import torch
from torch import nn

from sessrec.baselines import SessionBaseline
from sessrec.data import frame
from sessrec.data.batch import SessionBatch
from sessrec.metrics import TopKMetrics
from sessrec.saved.registry import config_of, register
from sessrec.tasks.next_item import exclude_seen
from sessrec.tasks.scoring_only import ScoringOnlyTask
from sessrec.tasks.settings import Evaluation


@register
class BaselineTask(ScoringOnlyTask):
    """Evaluate or score a `SessionBaseline` (no trainable weights).

    Args:
        baseline: the baseline (``class_path`` in a recipe), e.g. `sessrec.baselines.VSKNN`.
        num_items: score vector size; linked from the data module (``data.num_items``).
        evaluation: metric cut-offs, recommendations per session, and whether the input
            session's items are excluded (`Evaluation`, as `NextItemTask`'s; a data fragment sets it for both).
        num_virtual: the last `num_virtual` ids are virtual (non-product) items, linked from the
            data module: input only, so their scores are -inf whatever the baseline counted.
    """


    def __init__(
        self,
        baseline: SessionBaseline,
        num_items: int = 0,
        evaluation: Evaluation = Evaluation(),  # noqa: B008 - frozen
        num_virtual: int = 0,
    ) -> None:
        super().__init__()
        evaluation = Evaluation.of(evaluation)
        self.save_hyperparameters(ignore=["baseline", "evaluation"])
        self.hparams.update(evaluation=config_of(evaluation))  # plain data, as NextItemTask keeps its parts
        self.baseline = baseline
        self.metrics = nn.ModuleDict({stage: TopKMetrics(evaluation.ks) for stage in ("val", "test")})

    def nothing_to_train(self) -> ValueError:
        return ValueError(
            f"{type(self.baseline).__name__} has no weights to train: run `sessrec test` "
            "(or `sessrec validate`) with this recipe; the baseline is fitted on the training split there"
        )

    def setup(self, stage: str) -> None:
        if stage == "fit":
            raise self.nothing_to_train()
        if self.baseline.fitted:
            return
        dm = self.trainer.datamodule
        if dm is None or not hasattr(dm, "tensors"):
            raise ValueError(
                "BaselineTask fits on the training sessions of a SessionDataModule; pass datamodule="
            )
        # only the training split, each session once: evaluation sessions never enter, nor the training
        # prefixes and reversed copies that a network's rows add (`train_prefixes`, `augment_reversed`)
        sessions = dm.sessions("train")
        self.baseline.fit(
            sessions, num_items=self.hparams.num_items or dm.num_items, times=frame.end_times(dm.splits.train)
        )

    def forward(self, batch: SessionBatch) -> torch.Tensor:
        """(B, V) scores of the prefixes; the baseline sees `batch.items` only, never the targets."""
        scores = self.baseline(batch.items).to(batch.items.device)
        if self.hparams.num_virtual:
            scores[:, scores.shape[1] - self.hparams.num_virtual :] = float("-inf")
        return exclude_seen(scores, batch.items) if self.evaluation.exclude_seen else scores
