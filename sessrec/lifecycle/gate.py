"""The retraining gate: promote a candidate only when, pair by pair, it holds up against the current
model and against the best model promoted so far.

A gate that compares the candidate with the current model alone lets a loss of up to the tolerance
through at every turn, and the losses add up without bound. This gate also compares the candidate
with the **best** promoted model (the anchor), on the same test pairs, so the served model never
falls more than the tolerance below it however many turns pass. Each comparison is a paired
bootstrap: the test pairs are resampled (the same pairs for both models), and the candidate passes
when the one-sided lower confidence bound of the mean difference (candidate - reference) is above
``-tolerance``. Fewer than `min_pairs` test pairs are too few to decide on: the candidate is refused.

The gate never compares on sessions a compared model trained on (`check_unseen`): the comparison
window must start after the last event of each compared model's training data, or the current model
would be scored on its own training sessions.

    >>> gate = Gate("recall@20", tolerance=0.005, min_pairs=4, samples=200)
    >>> gate.decide(np.array([1., 1, 0, 1, 1, 0]), np.array([1., 0, 0, 1, 1, 0])).passed
    True
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from sessrec.data.periods import iso
from sessrec.metrics.ranks import rank_values

DRAWS_PER_CHUNK = 1 << 22  # resampled pair indices held at once (16 MiB of int32)


def check_unseen(window: str, starts: float, trained: list[tuple[str, float | None, str]]) -> None:
    """Refuse in one line a comparison window that starts at or before the end of a compared model's training data.

    Args:
        window: the comparison window in words, for the message (``the test window (--test_from)``).
        starts: its start, epoch seconds: the test sessions end at or after it.
        trained: each compared model in words, the time (epoch seconds) of the last event it trained on, and
            where that is recorded; None: not recorded (refused: the window cannot be shown to be unseen).
    """
    for model, end, where in trained:
        if end is None:
            raise ValueError(f"{where}: {model} records no train_end (when its training data ends), so the gate cannot "
                             "tell whether it would compare on sessions it trained on; train it with sessrec fit on "
                             "sessions with timestamps")
        if starts <= end:
            raise ValueError(f"{window} starts {iso(starts)}, not after the last event {model} trained on ({iso(end)}, "
                             f"train_end in {where}): the gate would compare on sessions it trained on; start the "
                             f"window after {iso(end)}")


@dataclass(frozen=True)
class Comparison:
    """The candidate against one reference model on the same test pairs.

    Args:
        reference: which model, in words (``the current model (v000004)``).
        difference: mean over the pairs of candidate - reference.
        low: the (1 - confidence) quantile of the bootstrap means of the difference: the one-sided
            lower confidence bound the gate tests.
        high: the confidence quantile of the same means.
    """

    reference: str
    difference: float
    low: float
    high: float

    def holds(self, tolerance: float) -> bool:
        """The candidate trails this reference by less than `tolerance`, at the gate's confidence."""
        return self.low > -tolerance

    def describe(self, tolerance: float) -> str:
        """The comparison in words, e.g. ``trails the current model (v000004) by 0.0081 [0.0052, 0.0110]``."""
        if self.difference < 0:  # the trailing amount, with its interval
            said = f"trails {self.reference} by {-self.difference:.4f} [{-self.high:.4f}, {-self.low:.4f}]"
        else:
            said = f"leads {self.reference} by {self.difference:.4f} [{self.low:.4f}, {self.high:.4f}]"
        if self.holds(tolerance):
            return said
        if -self.high > tolerance:
            return f"{said}: more than the tolerance {tolerance:g}"
        return f"{said}: it may trail by more than the tolerance {tolerance:g}"


@dataclass(frozen=True)
class GateDecision:
    """What the gate decided, and why.

    Args:
        passed: the candidate may be promoted.
        reason: the decision in words.
        pairs: test pairs compared.
        versus_current: the candidate against the current model.
        versus_best: the candidate against the best promoted model; None when that is the current model.
        new_best: the candidate, once promoted, is the new best (the anchor of later turns): it
            passed and its mean is at least the best's (the current model's when `versus_best` is None).
    """

    passed: bool
    reason: str
    pairs: int
    versus_current: Comparison
    versus_best: Comparison | None
    new_best: bool


@dataclass(frozen=True)
class Gate:
    """When a candidate replaces the current model.

    Args:
        metric: the per-pair test metric compared (``recall@20``, ``ndcg@20``, ``mrr@20``; ``mrr`` for a DLRM).
        tolerance: how much the candidate may trail the current and the best promoted model, in [0, 1) (0: it
            must be at least as good), at the confidence below.
        confidence: of the one-sided lower bound of each mean difference (e.g. 0.95).
        min_pairs: fewer test pairs than this: refuse (too few to tell a loss from noise).
        samples: bootstrap resamples of the test pairs.
        seed: of the resampling (the same seed and pairs give the same decision).
    """

    metric: str = "recall@20"
    tolerance: float = 0.005
    confidence: float = 0.95
    min_pairs: int = 1000
    samples: int = 2000
    seed: int = 0

    def __post_init__(self) -> None:
        rank_values(torch.ones(1), self.metric)  # refuses a metric that is not a mean over test pairs
        if not self.tolerance >= 0:
            raise ValueError(f"gate tolerance must be >= 0, got {self.tolerance}")
        if self.tolerance >= 1:  # a per-pair metric is in [0, 1]: no candidate trails by 1 or more
            raise ValueError(f"gate tolerance must be below 1, got {self.tolerance!r}: {self.metric} of each test pair is "
                             "in [0, 1], so no candidate trails by 1 or more and every one would be promoted; a "
                             "tolerance is a share (0.005 for half a point)")
        if not 0.5 < self.confidence < 1:
            raise ValueError(f"gate confidence must be in (0.5, 1), got {self.confidence}")
        if self.min_pairs < 1 or self.samples < 1:
            raise ValueError(f"gate min_pairs and samples must be >= 1, got {self.min_pairs} and {self.samples}")

    def decide(
        self, candidate: np.ndarray, current: np.ndarray, best: np.ndarray | None = None, *,
        current_name: str = "the current model", best_name: str = "the best promoted",
    ) -> GateDecision:
        """Compare per-pair metric values (P,) of the candidate with the current model's and the best's.

        Args:
            candidate: the candidate's metric on the P test pairs.
            current: the current model's metric on the same pairs, in the same order.
            best: the best promoted model's, likewise; None when it is the current one.
            current_name: the current model in the decision's words.
            best_name: the best promoted model in the decision's words.
        """
        arrays = {"candidate": candidate, "current": current} | ({} if best is None else {"best": best})
        arrays = {name: np.asarray(a, dtype=np.float64) for name, a in arrays.items()}
        n = len(arrays["candidate"])
        for name, a in arrays.items():
            if a.shape != (n,) or not np.isfinite(a).all():
                raise ValueError(f"gate: the {name}'s per-pair values must be {n} finite numbers, got shape {a.shape}")
        if n == 0:
            raise ValueError("gate: no test pairs to compare")
        references = [(current_name, arrays["current"])] + ([] if best is None else [(best_name, arrays["best"])])
        diffs = np.stack([arrays["candidate"] - values for _, values in references])  # (R, P)
        lows, highs = self._bounds(diffs)
        found = [Comparison(name, float(d.mean()), float(lo), float(hi))
                 for (name, _), d, lo, hi in zip(references, diffs, lows, highs)]
        versus_current, versus_best = found[0], (found[1] if best is not None else None)
        failing = [c for c in found if not c.holds(self.tolerance)]
        passed = n >= self.min_pairs and not failing
        anchor = versus_best if versus_best is not None else versus_current
        return GateDecision(
            passed=passed, reason=self._reason(n, found, failing), pairs=n, versus_current=versus_current,
            versus_best=versus_best, new_best=passed and anchor.difference >= 0,
        )

    def _bounds(self, diffs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(R,) lower and upper quantiles of the bootstrap means of each row of `diffs` (R, P); the
        resampled pairs are the same for every row."""
        n = diffs.shape[1]
        rng = np.random.default_rng(self.seed)
        means = np.empty((len(diffs), self.samples))
        rows = max(1, DRAWS_PER_CHUNK // n)
        dtype = np.int32 if n < 2**31 else np.int64
        for start in range(0, self.samples, rows):
            stop = min(start + rows, self.samples)
            index = rng.integers(0, n, size=(stop - start, n), dtype=dtype)  # (b, P): the same pairs for every reference
            for r, diff in enumerate(diffs):  # row by row: a take from one row is several times faster than from (R, P)
                means[r, start:stop] = np.take(diff, index).mean(axis=1)
        return np.quantile(means, 1 - self.confidence, axis=1), np.quantile(means, self.confidence, axis=1)

    def _reason(self, n: int, found: list[Comparison], failing: list[Comparison]) -> str:
        if n < self.min_pairs:
            return f"only {n} test pairs, fewer than min_pairs {self.min_pairs}: too few to decide"
        if failing:
            return "; ".join(f"candidate {c.describe(self.tolerance)}" for c in failing)
        said = " and ".join(c.describe(self.tolerance) for c in found)
        return f"candidate {said}: within the tolerance {self.tolerance:g} at {self.confidence:.0%} confidence on {n} pairs"
