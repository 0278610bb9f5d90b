"""`Teachers`: trained session models whose next-item distribution a `NextItemTask` learns towards.

Knowledge distillation (Hinton et al., 2015) of an ensemble into one model: several runs scored
as one rank better than each (`EnsembleTask`), but an ensemble is several networks to export,
serve and score. A student trained with ``--model.distillation.teachers [...]`` learns at every
training position both the observed next item and the teachers' next-item distribution, and is
one network afterwards:

    loss = (1 - alpha) * CE(student, target) + alpha * T**2 * KL(teachers_T || student_T)

where ``_T`` is a softmax of the logits divided by the temperature T, and the teachers'
distribution is their weighted geometric mean (`SessionEnsemble`), renormalised. With the
`FullSoftmax` loss both distributions cover the catalogue (every teacher scores every item, a
cost that grows with the catalogue); with `SampledSoftmax` they cover the columns the loss draws
at each step (the target and its negatives, every model's logits logQ-corrected alike, as the
sampled softmax estimates the full one), and a teacher costs its encoder and those columns.
The loss's label smoothing and temperature apply to the target term.

The positions must be the same for student and teachers, so both train with
`CausalLanguageModeling` (every position predicts the next item; nothing random): the teachers'
targets are compared with the student's at every step. Teachers are model directories
(``runs/<name>/model``), loaded as `EnsembleTask` loads members (no code run from their files) and
refused, naming the directory, when
they are not causal, were trained on another vocabulary than the data module's, or read a shorter
window than the student's batches. They are kept out of the task's modules: not trained, not in
its checkpoint (which records each model directory's content hash: a resume refuses a teacher saved
again since), always in eval mode. Shape letters: N training positions, V items, K sampled columns.
"""

from __future__ import annotations

import torch
from torch import nn

from sessrec.artifacts.model_directory import read_model_directory
from sessrec.data.batch import SessionBatch
from sessrec.data.vocab import ItemVocab
from sessrec.models.causal_lm import CausalLanguageModeling
from sessrec.models.objective import Objective
from sessrec.models.session_ensemble import SessionEnsemble
from sessrec.tasks.losses import (
    CatalogueLoss,
    Columns,
    FullSoftmax,
    SampledSoftmax,
    smoothed_cross_entropy,
    smoothed_nll,
)
from sessrec.tasks.members import check_vocabulary, load_member
from sessrec.tasks.settings import Distillation


def check_student(objective: Objective, loss: CatalogueLoss) -> None:
    """Refuse a student that cannot be distilled into (at construction, before any data is read)."""
    if not isinstance(objective, CausalLanguageModeling):
        raise ValueError(  # noqa: TRY004 - a setting that cannot work, refused as the other settings are
            f"distillation trains a CausalLanguageModeling student (the teachers' positions must be its own), "
            f"got {type(objective).__name__}"
        )
    if not isinstance(loss, (FullSoftmax, SampledSoftmax)):
        raise ValueError(  # noqa: TRY004 - a setting that cannot work, refused as the other settings are
            f"distillation compares the student's and the teachers' scores over the catalogue (FullSoftmax) or over "
            f"the negatives of SampledSoftmax, got {type(loss).__name__}"
        )


class Teachers:
    """The teachers of a `Distillation` setting, loaded and checked against the student's data.

    Args:
        setting: the teachers' files, weights, alpha and temperature.
        vocab: the data module's vocabulary (each teacher's must equal it by content).
        num_items: the student's catalogue size.
        max_length: the items of a training session the data module gives.
    """

    def __init__(self, setting: Distillation, vocab: ItemVocab, num_items: int, max_length: int) -> None:
        members = [load_member(path) for path in setting.teachers]
        # each model directory's content hash, as loaded: a resumed run must find the same teachers (`check_resumed`)
        self.hashes = {str(path): read_model_directory(path)[1]["hash"] for path in setting.teachers}
        found = vocab.fingerprint()
        for path, member in zip(setting.teachers, members):
            if not isinstance(member.objective, CausalLanguageModeling):
                raise ValueError(  # noqa: TRY004 - a setting that cannot work, refused as the other settings are
                    f"{path}: was trained with {type(member.objective).__name__}, not "
                    "CausalLanguageModeling: a teacher must predict the next item at every position, as the student does"
                )
            check_vocabulary(path, member.vocab, vocab, found)
            if member.model.num_items != num_items:
                raise ValueError(f"{path}: scores {member.model.num_items} items where the student scores {num_items}")
            window = member.inference.max_length
            if window < max_length:
                raise ValueError(
                    f"{path}: reads sessions of up to {window} items where the student trains on {max_length}: "
                    f"set --data.max_length {window} (or less) or teach with a model of that window"
                )
        self.ensemble = SessionEnsemble([m.model for m in members], setting.weights, names=setting.teachers,
                                        objectives=[m.objective for m in members]).eval()
        self.ensemble.requires_grad_(False)
        self.alpha, self.temperature = setting.alpha, setting.temperature

    def check_resumed(self, recorded: dict[str, str]) -> None:
        """Refuse teachers that are not those a checkpoint was trained with (`recorded`: its `hashes`; compared by
        content, wherever the directories are now), naming the first saved again since (retrained, promoted)."""
        for path, found in self.hashes.items():
            if found not in recorded.values():
                raise ValueError(
                    f"{path}: holds another model than the teachers this run started with (saved again since the "
                    "checkpoint, or not one of them): resume with the teachers it started with, or start a new run"
                )

    def log_probs(
        self, items: torch.Tensor, batch: SessionBatch, targets: torch.Tensor, columns: Columns | None = None
    ) -> torch.Tensor:
        """(N, V) the teachers' log-probabilities at the student's training positions of (B, L) `items`;
        (N, K) over a sampled loss's `columns` (each teacher's logits there, logQ-corrected as the student's)."""
        if self.ensemble.weights.device != items.device:
            self.ensemble.to(items.device)
        total = None
        with torch.no_grad():
            ensemble = self.ensemble
            for name, weight, member, objective in zip(ensemble.names, ensemble.weights, ensemble.members, ensemble.objectives):
                out = objective.training_output(member, items, None, member.batch_features(batch))
                if not torch.equal(out.targets, targets):  # the positions are the student's, or nothing is learnt
                    raise RuntimeError(f"{name}: predicts other positions of the batch than the student")
                if columns is not None:
                    part = columns.logits(member, out.hidden, targets, self.temperature).float()
                else:  # in place from here: N x V is the large tensor
                    part = member.score(out.hidden).float()
                    if self.temperature != 1.0:
                        part.div_(self.temperature)
                part = torch.log_softmax(part, dim=-1).mul_(weight)
                total = part if total is None else total.add_(part)
            return torch.log_softmax(total, dim=-1)

    def loss(self, student: nn.Module, target_loss: FullSoftmax | SampledSoftmax, hidden: torch.Tensor,
             targets: torch.Tensor, items: torch.Tensor, batch: SessionBatch,
             generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The student's loss at (N, D) `hidden` predicting (N,) `targets`: (total, target term, KL term).

        With `FullSoftmax` both distributions cover the catalogue; with `SampledSoftmax` they cover the
        columns the loss draws for this step (its negatives, logQ-corrected for student and teachers alike).
        """
        if isinstance(target_loss, SampledSoftmax):
            columns = target_loss.columns(student, targets, generator)
            teacher = self.log_probs(items, batch, targets, columns)  # (N, K)
            labels = columns.labels
            logits_at = lambda t: columns.logits(student, hidden, targets, t)
        else:
            teacher = self.log_probs(items, batch, targets)  # (N, V), -inf where nothing may be recommended
            logits = student.score(hidden)  # (N, V), -inf at the same ids (the vocabularies are equal)
            labels = targets
            logits_at = lambda t: logits / t if t != 1.0 else logits
        mine = torch.log_softmax(logits_at(self.temperature), dim=-1)
        if target_loss.temperature == self.temperature:  # one log-softmax serves both terms
            target = smoothed_nll(mine, labels, target_loss.label_smoothing)
        else:
            target = smoothed_cross_entropy(logits_at(target_loss.temperature), labels, target_loss.label_smoothing)
        with torch.no_grad():
            valid = torch.isfinite(teacher)  # -inf in both: padding, OOV, virtual ids, a sampled loss's accidental hits
            probs = teacher.exp()  # 0 where invalid
            own = (probs * teacher.masked_fill(~valid, 0.0)).sum(dim=-1)  # sum p log p, no gradient
        cross = (probs * mine.masked_fill(~valid, 0.0)).sum(dim=-1)  # sum p log q
        kl = (own - cross).mean()
        total = (1.0 - self.alpha) * target + self.alpha * self.temperature**2 * kl
        return total, target, kl
