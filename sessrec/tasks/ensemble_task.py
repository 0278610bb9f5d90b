"""`EnsembleTask`: evaluate or score several trained session models as one (`SessionEnsemble`).

Nothing is trained here: the members are trained with ``sessrec fit`` (one run each, e.g. the
same recipe with other seeds), and a recipe names their model directories (``runs/<name>/model``,
which ``sessrec fit`` writes). Then
``sessrec validate`` / ``sessrec test`` rank every evaluation prefix over the full catalogue by
the weighted mean of the members' log-probabilities, with the same metrics and ``[val]`` /
``[test]`` lines as `NextItemTask`, and ``sessrec predict`` writes top-K recommendations:

    sessrec test --config recipes/seq_s3rec_beauty_ensemble.yaml

Members are loaded without running code from their files (`SessionRecommender.from_pretrained`:
registered classes only) and refused, one line naming the directory, when they are not model
directories of session models, read side features, score another catalogue than each other or
than the data module's vocabulary (compared by content), or read a longer window than the data
module gives them. Nothing of the members is kept between runs: each run reads every model
directory's current version, so a member saved again (retrained, promoted, rolled back) is scored
as it is now. Shape letters: B batch, V items.
"""

from __future__ import annotations

import torch
from torch import nn

from sessrec.data.batch import SessionBatch
from sessrec.data.vocab import ItemVocab
from sessrec.metrics import TopKMetrics
from sessrec.models.session_ensemble import SessionEnsemble
from sessrec.saved.registry import config_of, register
from sessrec.tasks.members import check_same_vocabulary, check_vocabulary, load_member
from sessrec.tasks.next_item import exclude_seen
from sessrec.tasks.scoring_only import ScoringOnlyTask
from sessrec.tasks.settings import Evaluation


@register
class EnsembleTask(ScoringOnlyTask):
    """Evaluate or score a `SessionEnsemble` of trained session models.

    Args:
        members: model directories of trained session models (``runs/<name>/model``, which
            ``sessrec fit`` writes), at least one.
        weights: one positive weight per member; None: equal weights.
        num_items: score vector size; linked from the data module (``data.num_items``), checked
            against the members'.
        max_length: the items of a session the data module gives (``data.max_length``, linked);
            a member that reads more is refused.
        evaluation: metric cut-offs, recommendations per session, and whether the input
            session's items are excluded (`Evaluation`, as `NextItemTask`'s); the recipe's, not the members'.
            The items excluded are those of the widest member window (its latest items that some member
            reads), not the whole of a wider ``data.max_length``.
        num_virtual: linked from the data module; virtual ids are never recommended (the members' own
            masks, which agree as their vocabularies do).
    """


    def __init__(
        self,
        members: list[str],
        weights: list[float] | None = None,
        num_items: int = 0,
        max_length: int = 0,
        evaluation: Evaluation = Evaluation(),  # noqa: B008 - frozen
        num_virtual: int = 0,
    ) -> None:
        super().__init__()
        evaluation = Evaluation.of(evaluation)
        self.save_hyperparameters(ignore=["evaluation"])
        self.hparams.update(evaluation=config_of(evaluation))
        self.metrics = nn.ModuleDict({stage: TopKMetrics(evaluation.ks) for stage in ("val", "test")})
        self._ensemble: SessionEnsemble | None = None
        self._vocabs: list[ItemVocab] = []  # the members' vocabularies, checked against the data module's at setup

    @property
    def ensemble(self) -> SessionEnsemble:
        """The members, loaded and checked on first use (at `setup`: loading them while LightningCLI builds
        this task would hand them its hyper-parameters)."""
        if self._ensemble is None:
            members, num_items, max_length = self.hparams.members, self.hparams.num_items, self.hparams.max_length
            loaded = [load_member(path) for path in members]
            check_same_vocabulary(loaded, [str(p) for p in members])
            ensemble = SessionEnsemble([r.model for r in loaded], self.hparams.weights, names=[str(p) for p in members],
                                       objectives=[r.objective for r in loaded], windows=[r.inference.max_length for r in loaded])
            self._vocabs = [r.vocab for r in loaded]
            for path, member in zip(members, loaded):
                network = member.model
                if num_items and network.num_items != num_items:
                    raise ValueError(
                        f"{path}: scores {network.num_items} items where the data module's vocabulary has {num_items}: "
                        "the member was trained on other data"
                    )
            if max_length:
                check_windows(ensemble, max_length)
            self._ensemble = ensemble.to(self.device)
        return self._ensemble

    @property
    def uses_times(self) -> bool:
        """Whether the batches should carry event times: some member's encoder reads them."""
        return self.ensemble.uses_times

    @property
    def needs_times(self) -> bool:
        """Whether the batches must carry event times: some member was trained with them."""
        return self.ensemble.needs_times

    def nothing_to_train(self) -> ValueError:
        return ValueError(
            "an EnsembleTask has no weights to train: train each member with `sessrec fit`, then run "
            "`sessrec test` (or validate, predict) with the ensemble recipe"
        )

    def setup(self, stage: str) -> None:
        if stage == "fit":
            raise self.nothing_to_train()
        dm = self.trainer.datamodule if self._trainer is not None else None
        vocab = getattr(dm, "vocab", None)
        if vocab is None:
            raise ValueError("EnsembleTask scores the sessions of a SessionDataModule; pass datamodule=")
        found = vocab.fingerprint()
        for name, held in zip(self.ensemble.names, self._vocabs):
            check_vocabulary(name, held, vocab, found)
        width = getattr(dm, "max_length", None)
        if width is not None:  # the data module's own, where research code builds the task without the CLI's link
            check_windows(self.ensemble, int(width))

    def forward(self, batch: SessionBatch) -> torch.Tensor:
        """(B, V) ensemble scores of the batch's prefixes (its targets are never read); with ``exclude_seen``, the
        items of the widest member window at -inf (what some member reads, as a member served alone excludes its own)."""
        scores = self.ensemble(batch)
        if not self.evaluation.exclude_seen:
            return scores
        return exclude_seen(scores, batch.items[:, -max(self.ensemble.windows):])


def check_windows(ensemble: SessionEnsemble, max_length: int) -> None:
    """Refuse a member that reads more of a session than the `max_length` items the data module gives."""
    for name, window in zip(ensemble.names, ensemble.windows):
        if window > max_length:
            raise ValueError(
                f"{name}: reads the latest {window} items of a session where --data.max_length gives {max_length}: "
                f"set --data.max_length {window} (or more) so that every member sees what it was trained on"
            )
