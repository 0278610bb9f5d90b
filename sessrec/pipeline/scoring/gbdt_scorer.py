"""`GBDTScorer`: LightGBM lambdarank over each session's candidates (the NVIDIA playbooks' ranker).

The model is saved as LightGBM's own text format (``model_to_string``), never pickled.
Shape letters: B sessions, K candidates, F dense features.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from sessrec.pipeline.candidate_features import RankingInputs
from sessrec.pipeline.scoring.scorer import RankerRows, Scorer, early_stopping_split


def _lightgbm():
    try:
        import lightgbm
    except ImportError as err:  # an optional dependency
        raise ImportError("GBDTScorer needs LightGBM: pip install lightgbm (or pip install 'sessrec[pipeline]')") from err
    return lightgbm


def _dataset(lgb: Any) -> type:
    """`lgb.Dataset` whose bins from a `lgb.Sequence` are found as from a matrix.

    From a matrix, LightGBM drops the features that no split of `min_data_in_leaf` rows per side
    could use (``feature_pre_filter``); from a `Sequence`, it builds the bins with only the
    parameters `Dataset.get_params` lists, which leave `min_data_in_leaf` out, and so filters by
    its default instead. The features kept decide what ``feature_fraction`` samples from: this
    class lists `min_data_in_leaf` too, so that both routes give the same trees.
    """

    class Dataset(lgb.Dataset):
        def get_params(self) -> dict[str, Any]:
            kept = super().get_params()
            if self.params is not None and "min_data_in_leaf" in self.params:
                kept["min_data_in_leaf"] = self.params["min_data_in_leaf"]
            return kept

    return Dataset


class SessionRows:
    """The valid rows of some sessions, grouped by session, as LightGBM reads a `lightgbm.Sequence`:
    by index (its sample for the bins, in increasing order) and by slice (the rows pushed in turn).

    The rows are built a chunk of sessions at a time (`RankerRows.chunk`) and only the chunk last
    read is kept, so no float copy of all rows exists. Use `of` (a `lightgbm.Sequence` subclass).

    Args:
        source: the sessions' features.
        sessions: (R,) the sessions whose valid rows these are, in that order.
    """

    def __init__(self, source: RankerRows, sessions: torch.Tensor) -> None:
        self.source, self.sessions = source, sessions
        counts = source.valid[sessions].sum(dim=1).cpu()
        ends = counts.cumsum(0)
        self.pieces = range(0, len(sessions), source.chunk)  # first session of each chunk
        self.starts = np.array([0, *(int(ends[lo - 1]) for lo in self.pieces[1:])], dtype=np.int64)  # first row of each
        self.total = int(ends[-1]) if len(ends) else 0
        self.held: tuple[int, np.ndarray] | None = None  # (chunk, its (rows, F) float32 features)

    @classmethod
    def of(cls, lgb: Any, source: RankerRows, sessions: torch.Tensor) -> SessionRows:
        """A `SessionRows` that is also a `lgb.Sequence` (LightGBM imported lazily)."""
        sequence = type("SessionSequence", (cls, lgb.Sequence), {})
        return sequence(source, sessions)

    def __len__(self) -> int:
        return self.total

    def _chunk(self, i: int) -> np.ndarray:
        if self.held is None or self.held[0] != i:
            lo = self.pieces[i]
            part = self.source.inputs(self.sessions[lo : lo + self.source.chunk])
            self.held = (i, part.dense[part.valid].cpu().numpy())
        return self.held[1]

    def __getitem__(self, index: int | slice) -> np.ndarray:
        if isinstance(index, slice):
            start, stop, step = index.indices(self.total)
            if step != 1:
                raise ValueError(f"SessionRows reads contiguous slices, got step {step}")
            first = int(np.searchsorted(self.starts, start, side="right")) - 1
            parts = []
            for i in range(max(first, 0), len(self.starts)):
                if self.starts[i] >= stop:
                    break
                rows = self._chunk(i)
                parts.append(rows[max(start - self.starts[i], 0) : stop - self.starts[i]])
            return np.concatenate(parts) if parts else np.zeros((0, len(self.source.names)), dtype=np.float32)
        index = int(index) + (self.total if index < 0 else 0)
        if not 0 <= index < self.total:
            raise IndexError(f"row {index} of {self.total}")
        i = int(np.searchsorted(self.starts, index, side="right")) - 1
        return self._chunk(i)[index - self.starts[i]].astype(np.float64)  # LightGBM samples bins from float64 rows


class GBDTScorer(Scorer):
    """Gradient-boosted trees, lambdarank objective, early-stopped on held-out sessions.

    Args:
        num_leaves: leaves per tree.
        learning_rate: shrinkage.
        max_rounds: boosting rounds at most.
        early_stopping: rounds without improvement of NDCG@20 on the held-out sessions.
        min_data_in_leaf: rows per leaf at least.
        feature_fraction: features sampled per tree.
        stop_fraction: share of the ranker's sessions held out for early stopping.
        threads: LightGBM threads.
        seed: seeds the split and LightGBM.
    """

    def __init__(
        self,
        num_leaves: int = 63,
        learning_rate: float = 0.05,
        max_rounds: int = 1000,
        early_stopping: int = 50,
        min_data_in_leaf: int = 50,
        feature_fraction: float = 0.8,
        stop_fraction: float = 0.15,
        threads: int = 2,
        seed: int = 0,
    ) -> None:
        self.params = {
            "objective": "lambdarank", "metric": "ndcg", "eval_at": [20], "num_leaves": num_leaves,
            "learning_rate": learning_rate, "min_data_in_leaf": min_data_in_leaf,
            "feature_fraction": feature_fraction, "bagging_fraction": 0.8, "bagging_freq": 1,
            "lambdarank_truncation_level": 30, "num_threads": threads, "seed": seed, "deterministic": True,
            "verbosity": -1,
        }
        self.max_rounds, self.early_stopping, self.stop_fraction, self.seed = max_rounds, early_stopping, stop_fraction, seed
        self.booster = None
        self.best_round = 0

    def fit(self, inputs: RankingInputs | RankerRows, labels: torch.Tensor) -> GBDTScorer:
        """Fit on the sessions' valid rows, binned by LightGBM a chunk of sessions at a time (`SessionRows`)."""
        lgb = _lightgbm()
        source = RankerRows.of(inputs)
        train, stop = early_stopping_split(labels, self.stop_fraction, self.seed, source.groups)
        sets = []
        for sessions in (train, stop):
            valid = source.valid[sessions]
            y = labels[sessions][valid].cpu().numpy()
            rows = SessionRows.of(lgb, source, sessions)
            sets.append(_dataset(lgb)(rows, y, group=valid.sum(dim=1).cpu().numpy(), feature_name=source.names,
                                      params={"min_data_in_leaf": self.params["min_data_in_leaf"]}, free_raw_data=True))
        sets[1].reference = sets[0]
        self.booster = lgb.train(
            self.params, sets[0], num_boost_round=self.max_rounds, valid_sets=[sets[1]],
            callbacks=[lgb.early_stopping(self.early_stopping, verbose=False)],
        )
        self.best_round = int(self.booster.best_iteration or self.booster.current_iteration())
        return self

    def score(self, inputs: RankingInputs) -> torch.Tensor:
        if self.booster is None:
            raise RuntimeError("GBDTScorer is not fitted")
        out = torch.full(inputs.valid.shape, float("-inf"), device=inputs.valid.device)
        x = inputs.dense[inputs.valid].cpu().numpy()  # LightGBM predicts on the host
        if len(x):
            predicted = torch.from_numpy(self.booster.predict(x, num_iteration=self.best_round))
            out[inputs.valid] = predicted.to(out.device, torch.float32)
        return out

    def state_dict(self) -> dict[str, Any]:
        """``model``: LightGBM's text format of the trees up to the best round (uint8), and ``best_round``."""
        if self.booster is None:
            raise RuntimeError("GBDTScorer is not fitted: nothing to save")
        text = self.booster.model_to_string(num_iteration=self.best_round)
        return {"model": np.frombuffer(text.encode(), dtype=np.uint8).copy(), "best_round": self.best_round}

    def load_state_dict(self, state: Mapping[str, Any]) -> GBDTScorer:
        self.booster = _lightgbm().Booster(model_str=np.asarray(state["model"], dtype=np.uint8).tobytes().decode())
        self.best_round = int(state["best_round"])
        return self
