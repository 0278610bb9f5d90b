"""The typed parts of a task's configuration: optimisation, learning-rate schedule, evaluation.

`NextItemTask` takes all three (and `Distillation`, to learn from trained teachers),
`BaselineTask` takes `Evaluation`, `DLRMTask` takes `Optimization`, `Evaluation` and its
network's shape (`DLRMNetwork`). In a recipe each part is a
mapping under ``model:`` (or ``model.init_args:``), and on the command line a dotted flag::

    model:
      optimization: {lr: 0.005, weight_decay: 0.0}
      schedule: {warmup_steps: 200, decay: cosine}
      evaluation: {ks: [10, 20], exclude_seen: true}

    sessrec fit ... --model.optimization.lr 0.001 --model.schedule.seconds 2460

A saved task holds each part as plain data (`sessrec.saved.registry.config_of`); `of` turns that
back into the part.

Examples:
    >>> Schedule(warmup_steps=2, decay="linear").factor(step=6, total_steps=10)
    0.5
    >>> Optimization.of({"lr": 0.01})
    Optimization(lr=0.01, weight_decay=0.0)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from sessrec.models.session_ensemble import check_weights
from sessrec.saved.registry import check_integers, check_switches, instantiate, register

Part = TypeVar("Part", bound="_Part")  # typing.Self needs Python 3.11


def _finite(value: object) -> bool:
    """Whether `value` is a finite int or float (a bool is not a number here, nor is the text '1e-3')."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class _Part:
    """What the three parts share: `of`, which reads one from what a saved task holds (a dataclass
    without fields, so that the parts stay plain dataclasses: nested groups of flags in a recipe)."""

    @classmethod
    def of(cls: type[Part], value: Part | dict[str, Any]) -> Part:  # noqa: PYI019
        """`value` as a `cls`: an instance as it is, a mapping of its fields, or ``{"class_path", "init_args"}``."""
        if isinstance(value, cls):
            return value
        if isinstance(value, dict) and "class_path" in value:
            return instantiate(value, expected=cls, source=f"the {cls.__name__.lower()} setting")
        if isinstance(value, dict):
            return cls(**value)
        raise TypeError(f"expected a {cls.__name__} or a mapping of its fields, got {type(value).__name__}")


@register
@dataclass(frozen=True)
class Optimization(_Part):
    """AdamW: the peak learning rate and the weight decay.

    Args:
        lr: peak learning rate (the schedule scales it).
        weight_decay: weight decay on the layers' matrices only (not on biases, norms, scales or embedding
            tables: `sessrec.tasks.optim.decayed_and_rest`).
    """

    lr: float = 1e-3
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        if not (_finite(self.lr) and self.lr > 0):
            raise ValueError(f"optimization lr must be a positive number, got {self.lr!r}")
        if not (_finite(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"optimization weight_decay must be >= 0, got {self.weight_decay!r}")


@register
@dataclass(frozen=True)
class Schedule(_Part):
    """The learning-rate schedule: linear warm-up, then a decay to the end of training.

    By default the schedule is defined by steps: the decay runs over the steps the trainer plans
    (``trainer.max_epochs`` or ``max_steps``), so a run takes the same learning rate at each step
    on any machine. `seconds` adds a time budget: the decay then also runs on the wall clock and
    ends at whichever comes first, the planned steps or the budget. A run capped by
    ``trainer.max_time`` on a slow or busy machine then still anneals to the end of its schedule,
    but its learning rates, and so its result, depend on how fast the machine was.

    Args:
        warmup_steps: linear warm-up steps, from lr / warmup_steps up to the peak lr.
        decay: after warm-up: ``cosine`` (to 0), ``linear`` (to 0) or ``constant``.
        seconds: the time budget of the decay (seconds of training, across resumes); None: steps only.
    """

    warmup_steps: int = 0
    decay: Literal["constant", "cosine", "linear"] = "cosine"
    seconds: float | None = None

    def __post_init__(self) -> None:
        check_integers({"warmup_steps": self.warmup_steps}, "schedule ", minimum=0)
        if self.decay not in ("constant", "cosine", "linear"):
            raise ValueError(f"schedule decay must be 'constant', 'cosine' or 'linear', got {self.decay!r}")
        if self.seconds is not None and not (_finite(self.seconds) and self.seconds > 0):
            raise ValueError(f"schedule seconds must be a positive number or None, got {self.seconds!r}")

    def factor(self, step: int, total_steps: float | Callable[[], float], clock: float = 0.0) -> float:
        """The learning rate at optimizer step `step` (from 0) as a fraction of the peak (`LambdaLR`'s factor).

        Args:
            step: optimizer steps done.
            total_steps: the steps the trainer plans, or a function returning them (called only
                once the decay has started, since a resumed run knows them only after its restore);
                infinite for a run of no planned end: the steps then never advance the decay.
            clock: seconds of training so far; read only when `seconds` is set.
        """
        warmup = self.warmup_steps
        if step < warmup:
            return (step + 1) / warmup
        progress = 0.0
        if step > warmup:
            total = total_steps() if callable(total_steps) else total_steps
            progress = min((step - warmup) / max(total - warmup, 1), 1.0)
        if self.seconds is not None:
            progress = max(progress, min(clock / self.seconds, 1.0))
        if self.decay == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        if self.decay == "linear":
            return 1.0 - progress
        return 1.0


@register
@dataclass(frozen=True)
class Evaluation(_Part):
    """How a task is evaluated and what it recommends.

    `DLRMTask` reads `ks` only (recall@k within a query) and refuses `exclude_seen`: it scores the
    rows each query shows.

    Args:
        ks: cut-offs of the evaluation metrics (Recall, NDCG, MRR at each K).
        top_k: recommendations per session written by ``sessrec predict``.
        exclude_seen: at evaluation and prediction, never recommend an item of the input session
            (`sessrec.tasks.next_item.exclude_seen`); the validation loss is computed before this filter.
    """

    ks: list[int] = field(default_factory=lambda: [10, 20])
    top_k: int = 20
    exclude_seen: bool = False

    def __post_init__(self) -> None:
        ks = list(self.ks) if isinstance(self.ks, (list, tuple)) else []
        if not ks or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in ks):
            raise ValueError(f"evaluation ks must be positive integer cut-offs, got {self.ks!r}")
        check_integers({"top_k": self.top_k}, "evaluation ")
        check_switches({"exclude_seen": self.exclude_seen}, "evaluation ")
        object.__setattr__(self, "ks", ks)  # a tuple from a caller is stored as the list the type says


@register
@dataclass(frozen=True)
class Distillation(_Part):
    """Training a model towards trained teachers' next-item distribution as well as the targets.

    The teachers, scored as one (`sessrec.models.SessionEnsemble`: the weighted mean of their
    log-probabilities), give a distribution over the catalogue at every position the student
    learns from; the student's loss is ``(1 - alpha)`` times its cross-entropy on the targets plus
    ``alpha * temperature ** 2`` times the KL divergence from the teachers' distribution to its
    own, both softened by `temperature` (Hinton et al., 2015). The result is one model, which
    exports and serves as any other, trained from several.

    Args:
        teachers: model directories (``runs/<name>/model``, which ``sessrec fit`` writes) of trained
            causal (`CausalLanguageModeling`) session models on the student's vocabulary.
        weights: one positive weight per teacher; None: equal weights.
        alpha: share of the teachers' term in the loss, in (0, 1].
        temperature: both distributions are softened by it (logits divided by it).
    """

    teachers: list[str] = field(default_factory=list)
    weights: list[float] | None = None
    alpha: float = 0.5
    temperature: float = 1.0

    def __post_init__(self) -> None:
        teachers = [str(t) for t in self.teachers]
        if not teachers:
            raise ValueError("distillation needs at least one teacher (a model directory, runs/<name>/model)")
        object.__setattr__(self, "teachers", teachers)
        if self.weights is not None:
            object.__setattr__(self, "weights", check_weights(self.weights, len(teachers), of="teachers"))
        if not (math.isfinite(self.alpha) and 0.0 < self.alpha <= 1.0):
            raise ValueError(f"distillation alpha must be in (0, 1], got {self.alpha}")
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"distillation temperature must be a positive number, got {self.temperature}")


@register
@dataclass(frozen=True)
class DLRMNetwork(_Part):
    """The shape of `DLRMTask`'s network (`sessrec.models.DLRM`) besides its tables and sparse module.

    Args:
        embedding_dim: D, the width of every table (and the bottom MLP's output).
        dense_layers: bottom MLP widths; the last must be `embedding_dim`.
        over_layers: top MLP hidden widths.
        interaction: ``dot`` (pairwise dots) or ``dcn`` (DCNv2 low-rank cross layers).
        dcn_layers: DCNv2 cross layers.
        dcn_rank: DCNv2 low rank.
    """

    embedding_dim: int = 16
    dense_layers: list[int] = field(default_factory=lambda: [64, 16])
    over_layers: list[int] = field(default_factory=lambda: [128, 64])
    interaction: Literal["dot", "dcn"] = "dot"
    dcn_layers: int = 2
    dcn_rank: int = 16

    def __post_init__(self) -> None:
        object.__setattr__(self, "dense_layers", list(self.dense_layers))  # a tuple is stored as the list the type says
        object.__setattr__(self, "over_layers", list(self.over_layers))
        if not self.dense_layers or self.dense_layers[-1] != self.embedding_dim:
            raise ValueError(
                f"network dense_layers must end at embedding_dim {self.embedding_dim} (the dot interaction multiplies "
                f"them), got {self.dense_layers}"
            )
        if self.interaction not in ("dot", "dcn"):
            raise ValueError(f"network interaction must be 'dot' or 'dcn', got {self.interaction!r}")
        widths = {f"dense_layers[{i}]": w for i, w in enumerate(self.dense_layers)}
        widths |= {f"over_layers[{i}]": w for i, w in enumerate(self.over_layers)}
        check_integers({"embedding_dim": self.embedding_dim, "dcn_rank": self.dcn_rank, **widths}, "network ")
        check_integers({"dcn_layers": self.dcn_layers}, "network ", minimum=0)
