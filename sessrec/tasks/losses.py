"""Next-item losses over a large catalogue: full softmax, sampled softmax, in-batch negatives.

The full softmax scores every target against every item, so its cost grows with the catalogue.
The sampled losses score each target against a small candidate set instead:

- ``sampled``: S negatives shared by the whole batch, drawn with replacement uniformly over
  the catalogue or by popularity (count ** power);
- ``per_target``: S negatives drawn for each target on its own, by the same sampler (RecTools'
  SASRec with its sampled softmax: uniform negatives per position);
- ``in_batch``: the other targets of the batch are the negatives (drawn by popularity, for free);
- ``mixed``: both.

Each candidate's logit is corrected by the log of its expected number of draws in its set (logQ
correction, Bengio & Senecal 2008; Yi et al. 2019), so that the sampled softmax estimates the
full one without bias in the limit, whatever the sampler. With ``mixed`` each set is corrected by its
own draws (n f_j for the in-batch columns, S q_j for the sampled ones, not by their sum): each set
estimates the full softmax's normaliser on its own and the two together twice it, the same gradients
in the limit and log 2 more in the loss's value. Candidates equal to a row's own target
(accidental hits) are removed from that row. Padding and OOV are never candidates.

Every loss is a `CatalogueLoss`: called as ``loss(model, hidden, targets, generator)`` where
``model.score(hidden, candidates)`` returns (N, K) scores of the hidden states against candidate
item ids (the whole catalogue when ``candidates`` is None), ``model.score_targets(hidden,
targets)`` the (N,) score of each row's own target and ``model.catalogue_loss(hidden, targets,
temperature, label_smoothing)`` the full softmax's cross-entropy without keeping its (N, V) scores
twice (`SessionModel.catalogue_loss`). A new loss is a subclass (a dataclass whose
fields are its arguments), named in a recipe by its ``class_path``; `NextItemTask` takes any.

Shape letters: N targets in the batch, D width, V catalogue (incl. padding and OOV),
S sampled negatives (shared, or per target), K candidates per row.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from typing import ClassVar, Literal

import torch

from sessrec.data.vocab import NUM_SPECIAL
from sessrec.saved.registry import Configurable, check_integers, check_probabilities, check_switches


def smoothed_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """Cross-entropy whose label smoothing spreads only over the finite (valid) candidates.

    `F.cross_entropy(label_smoothing=...)` spreads the smoothing mass over every column, so a
    single -inf column (padding, OOV, a removed accidental hit) makes the loss infinite.

    Args:
        logits: (N, K) scores; -inf marks candidates that are not part of the row.
        labels: (N,) column of each row's target.
        label_smoothing: share of the target mass spread uniformly over the valid candidates.
    """
    return smoothed_nll(torch.log_softmax(logits, dim=1), labels, label_smoothing)


def smoothed_nll(logp: torch.Tensor, labels: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """`smoothed_cross_entropy` from (N, K) log-probabilities (-inf: not a candidate of the row)."""
    nll = -logp.gather(1, labels[:, None]).squeeze(1)
    if label_smoothing == 0.0:
        return nll.mean()
    valid = torch.isfinite(logp)
    uniform = -(logp.masked_fill(~valid, 0.0).sum(dim=1) / valid.sum(dim=1))
    return ((1.0 - label_smoothing) * nll + label_smoothing * uniform).mean()


def inverse_cdf_draws(probs: torch.Tensor, shape: tuple[int, ...], generator: torch.Generator | None = None) -> torch.Tensor:
    """Ids drawn with replacement from the (V,) probabilities `probs`, `shape` of them: each uniform number
    is looked up in the cumulative sums, so an id of probability 0 is never drawn. The law of
    `torch.multinomial` with replacement, at a fraction of its cost for the N x S draws of ``per_target``."""
    cdf = probs.double().cumsum(0)
    u = torch.rand(shape, generator=generator, device=probs.device, dtype=torch.float64) * cdf[-1]
    return torch.searchsorted(cdf, u, right=True).clamp_(max=len(probs) - 1)


def _check(label_smoothing: float, temperature: float) -> None:
    check_probabilities({"label_smoothing": label_smoothing})
    if not (math.isfinite(temperature) and temperature > 0.0):  # inf: every logit 0, nothing trains; nan: a NaN loss
        raise ValueError(f"temperature must be a finite positive number, got {temperature}")


class CatalogueLoss(ABC, Configurable):
    """Base class of the next-item losses: (N, D) hidden states and (N,) targets -> a scalar loss.

    Each subclass registers itself (`sessrec.saved.registry`), so a saved model may name it.

    Class attributes:
        needs_item_counts: the loss reads the training count of every item; the task then calls
            `set_item_counts` with the data module's vocabulary counts at setup.
    """

    needs_item_counts: ClassVar[bool] = False

    @abstractmethod
    def __call__(
        self, model: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """The loss of predicting `targets` from `hidden` with `model`'s scores; `generator` seeds any sampling."""

    def set_item_counts(self, counts: torch.Tensor) -> None:
        """(V,) training counts per model id (called when `needs_item_counts`)."""
        raise NotImplementedError(f"{type(self).__name__} does not read item counts (needs_item_counts is False)")


@dataclass
class FullSoftmax(CatalogueLoss):
    """Cross-entropy over the whole catalogue.

    Args:
        label_smoothing: share of the target mass spread over all recommendable items.
        temperature: logits are divided by it.
    """

    label_smoothing: float = 0.0
    temperature: float = 1.0

    def __post_init__(self) -> None:
        _check(self.label_smoothing, self.temperature)

    def __call__(
        self, model: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        return model.catalogue_loss(hidden, targets, self.temperature, self.label_smoothing)


@dataclass
class SampledSoftmax(CatalogueLoss):
    """Softmax over the target and a few negatives, with logQ correction.

    Args:
        negatives: ``sampled`` (S shared negatives), ``per_target`` (S negatives of each target's own),
            ``in_batch`` (the batch's other targets) or ``mixed`` (in-batch and S shared ones).
        num_samples: S, negatives per batch (``sampled``, ``mixed``) or per target (``per_target``).
        sampler: ``uniform`` over the items or ``popularity`` (training count ** `power`).
        power: exponent of the popularity sampler (word2vec's 0.75 flattens the head).
        logq_correction: subtract log(expected draws) from every candidate's logit.
        label_smoothing: share of the target mass spread over the row's valid candidates.
        temperature: logits are divided by it before the correction.

    The popularity sampler and the in-batch correction need the training counts of the items:
    call `set_item_counts` (the Lightning task does it from the data module's vocabulary).
    Without counts, in-batch negatives are corrected by their frequency in the batch.

    A negative equal to its row's target is removed (scored -inf) under every choice; RecTools keeps
    such draws as negatives (at S = 256 of Beauty's 12k items, 2% of its targets meet their own item once).
    """

    needs_item_counts: ClassVar[bool] = True

    negatives: Literal["sampled", "per_target", "in_batch", "mixed"] = "sampled"
    num_samples: int = 1024
    sampler: Literal["uniform", "popularity"] = "uniform"
    power: float = 0.75
    logq_correction: bool = True
    label_smoothing: float = 0.0
    temperature: float = 1.0

    def __post_init__(self) -> None:
        _check(self.label_smoothing, self.temperature)
        if self.negatives not in ("sampled", "per_target", "in_batch", "mixed"):
            raise ValueError(f"negatives must be 'sampled', 'per_target', 'in_batch' or 'mixed', got {self.negatives!r}")
        if self.sampler not in ("uniform", "popularity"):
            raise ValueError(f"sampler must be 'uniform' or 'popularity', got {self.sampler!r}")
        if not math.isfinite(self.power):
            raise ValueError(f"power must be a finite number, got {self.power}")
        check_switches({"logq_correction": self.logq_correction}, "SampledSoftmax ")
        if self.negatives != "in_batch":
            check_integers({"num_samples": self.num_samples}, f"SampledSoftmax with {self.negatives!r} negatives: ")
        defaults = {f.name: f.default for f in fields(self)}
        unused = (["num_samples", "sampler", "power"] if self.negatives == "in_batch"  # the batch's targets: none drawn
                  else ["power"] if self.sampler == "uniform" else [])
        ignored = [f"{name}={getattr(self, name)!r}" for name in unused if getattr(self, name) != defaults[name]]
        if ignored:
            why = ("negatives='in_batch' draws none (the batch's other targets are the negatives)"
                   if self.negatives == "in_batch" else "sampler='uniform' reads no popularity")
            at = ", ".join(f"{name}={defaults[name]!r}" for name in unused if getattr(self, name) != defaults[name])
            raise ValueError(f"SampledSoftmax: {', '.join(ignored)} would have no effect: {why}; leave them out, or at "
                             f"their defaults ({at})")
        self.counts: torch.Tensor | None = None

    def set_item_counts(self, counts: torch.Tensor) -> None:
        """(V,) training counts per model id; padding and OOV entries are ignored."""
        counts = torch.as_tensor(counts, dtype=torch.float64).clone()
        if counts.dim() != 1 or counts.numel() <= NUM_SPECIAL:
            raise ValueError(f"counts must be a (V,) vector with V > {NUM_SPECIAL}, got shape {tuple(counts.shape)}")
        if (counts < 0).any():
            raise ValueError("item counts must be non-negative")
        counts[:NUM_SPECIAL] = 0.0
        self.counts = counts

    def _sampling_probs(self, num_items: int, device: torch.device, recommendable: torch.Tensor | None = None) -> torch.Tensor:
        """(V,) probability of drawing each id; 0 for padding, OOV and every id not `recommendable`.

        ``recommendable`` is the model's (V,) mask (`SessionModel.recommendable`): virtual items
        score -inf as candidates, so drawing one would waste a negative (and under the popularity
        sampler frequent page-view tokens would take a large share of them).
        """
        if self.sampler == "uniform":
            probs = torch.ones(num_items, dtype=torch.float64)
        else:
            if self.counts is None or self.counts.numel() != num_items:
                raise ValueError("the popularity sampler needs set_item_counts(counts) with one count per item id")
            probs = (self.counts + 1.0).pow(self.power)  # +1: never-seen items can still be drawn
        probs[:NUM_SPECIAL] = 0.0
        if recommendable is not None:  # masked where the mask lives: no device-to-host sync per step
            probs = probs.to(recommendable.device).masked_fill(~recommendable, 0.0)
        return (probs / probs.sum()).to(device=device, dtype=torch.float32)

    def __call__(
        self, model: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        columns = self.columns(model, targets, generator)
        logits = columns.logits(model, hidden, targets, self.temperature)
        return smoothed_cross_entropy(logits, columns.labels, self.label_smoothing)

    def columns(self, model: torch.nn.Module, targets: torch.Tensor, generator: torch.Generator | None = None) -> Columns:
        """Draw the candidates of one step: what every row is scored against (`Columns`)."""
        n, num_items, device = targets.shape[0], model.num_items, targets.device
        recommendable = getattr(model, "recommendable", None)
        if self.negatives == "sampled":  # each row: its own target, then the S shared negatives
            probs = self._sampling_probs(num_items, device, recommendable)
            samples = torch.multinomial(probs, self.num_samples, replacement=True, generator=generator)  # (S,)
            log_q = torch.cat([probs.new_zeros(1), torch.log(probs[samples] * self.num_samples)])
            hit = torch.cat([torch.zeros_like(targets[:, None], dtype=torch.bool), samples[None, :] == targets[:, None]], 1)
            return Columns(samples, True, log_q if self.logq_correction else None, hit, torch.zeros_like(targets))
        if self.negatives == "per_target":  # each row: its own target, then its own S negatives
            probs = self._sampling_probs(num_items, device, recommendable)
            samples = inverse_cdf_draws(probs, (n, self.num_samples), generator)  # (N, S)
            log_q = torch.cat([probs.new_zeros(n, 1), torch.log(probs[samples] * self.num_samples)], dim=1)
            hit = torch.cat([torch.zeros_like(targets[:, None], dtype=torch.bool), samples == targets[:, None]], 1)
            return Columns(samples, True, log_q if self.logq_correction else None, hit, torch.zeros_like(targets))

        # in-batch (and mixed): the batch's targets are the candidates, the diagonal the positives
        if self.counts is not None:  # over the items that may be targets: virtual items' counts are no share of them
            counts = self.counts.to(device=device, dtype=torch.float32)
            if recommendable is not None:
                counts = counts.masked_fill(~recommendable.to(device), 0.0)
            freq = counts[targets] / counts.sum()
        else:
            freq = (targets[None, :] == targets[:, None]).sum(dim=1).float() / n
        candidates, log_q = targets, torch.log(freq * n)  # expected occurrences among the n targets
        if self.negatives == "mixed":
            probs = self._sampling_probs(num_items, device, recommendable)
            samples = torch.multinomial(probs, self.num_samples, replacement=True, generator=generator)
            candidates = torch.cat([targets, samples])
            log_q = torch.cat([log_q, torch.log(probs[samples] * self.num_samples)])
        # accidental hits: a candidate equal to the row's target, other than the row's own column
        hit = candidates[None, :] == targets[:, None]  # (N, K)
        hit[:, :n].fill_diagonal_(False)
        return Columns(candidates, False, log_q if self.logq_correction else None, hit, torch.arange(n, device=device))


@dataclass
class Columns:
    """The candidates a sampled loss scores the N rows of one step against: K columns a row.

    Args:
        ids: (S,) item ids scored by every row: the shared negatives (after each row's own target
            when `own_target`), or the in-batch (and sampled) candidates; or (N, S), each row's own
            negatives (``per_target``).
        own_target: column 0 of each row is its own target (``sampled`` and ``per_target`` negatives).
        log_q: (K,) or (N, K) subtracted from the rows' columns (the logQ correction), or None.
        removed: (N, K) accidental hits, scored -inf.
        labels: (N,) the column of each row's target.
    """

    ids: torch.Tensor
    own_target: bool
    log_q: torch.Tensor | None
    removed: torch.Tensor
    labels: torch.Tensor

    def logits(self, model: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
        """(N, K) the corrected logits of `model`'s (N, D) `hidden` at these columns, divided by `temperature`
        before the correction; any model on the same ids scores the same columns (a teacher, say)."""
        if self.ids.dim() == 2:  # each row its own negatives: (N, D) rows against (N, S, D) item vectors
            h, table, bias = model.head(hidden, self.ids.reshape(-1))
            logits = torch.bmm(table.view(*self.ids.shape, -1), h[:, :, None]).squeeze(2) + bias.view(self.ids.shape)
        else:
            logits = model.score(hidden, self.ids)  # (N, S) or (N, K)
        if self.own_target:
            logits = torch.cat([model.score_targets(hidden, targets)[:, None], logits], dim=1)
        logits = logits / temperature
        if self.log_q is not None:
            logits = logits - (self.log_q if self.log_q.dim() == 2 else self.log_q[None, :])
        return logits.masked_fill(self.removed, float("-inf"))
