"""`GBDTScorer`: LightGBM lambdarank over each session's candidates (the NVIDIA playbooks' ranker).

The model is saved as LightGBM's own text format (``model_to_string``), never pickled. Its trees run in the
fastest runtime that reproduces LightGBM's scores bit for bit (`GBDTScorer`'s ``threads``): compiled
(`CompiledTrees`), onnxruntime (`TreeEnsemble`), or LightGBM itself.
Shape letters: B sessions, K candidates, F dense features.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from sessrec.pipeline.candidate_features import RankingInputs
from sessrec.pipeline.scoring.compiled_trees import CompiledTrees
from sessrec.pipeline.scoring.scorer import (
    RankerRows,
    Scorer,
    check_dense,
    early_stopping_split,
    true_positions,
)
from sessrec.pipeline.scoring.tree_ensemble import TreeEnsemble
from sessrec.saved.registry import check_integers, check_numbers

ROWS_PER_THREAD = 20_000  # candidate rows per scoring thread: a request's few hundred take one


class HostRows:
    """The valid rows of one `RankingInputs` on the host, as the tree members of a blend read them: gathered
    (`x`, (N, F) float32) and prepared for the trees (`trees`, `TreeEnsemble.rows`) once, however many members
    score them.

    Args:
        inputs: the rows' inputs; `of` gives a new `HostRows` for other inputs.
    """

    def __init__(self, inputs: RankingInputs) -> None:
        self.inputs = inputs
        self._x: np.ndarray | None = None
        self._trees: np.ndarray | None = None

    @classmethod
    def of(cls, inputs: RankingInputs, rows: HostRows | None) -> HostRows:
        """`rows` when it holds the rows of `inputs`, else new ones."""
        return rows if rows is not None and rows.inputs is inputs else cls(inputs)

    @property
    def x(self) -> np.ndarray:
        """(N, F) float32: the dense features of the valid slots, row-major, gathered by `index_select` at their
        positions (0.45x a boolean index's time at a batch's 49,074 x 26 on the host)."""
        if self._x is None:
            dense, valid = self.inputs.dense, self.inputs.valid
            rows = dense.reshape(-1, dense.shape[-1]).index_select(0, true_positions(valid).to(dense.device))
            self._x = rows.cpu().numpy()  # the trees predict on the host
        return self._x

    def trees(self, ensemble: TreeEnsemble | CompiledTrees) -> np.ndarray:
        """`x` prepared for the trees (`TreeEnsemble.rows`), once for every ensemble."""
        if self._trees is None:
            self._trees = ensemble.rows(self.x)
        return self._trees  # an ensemble of another width refuses them (`TreeEnsemble.run`)


def _ensemble(booster: Any, rounds: int) -> TreeEnsemble | CompiledTrees | None:
    """The trees of `booster` up to round `rounds` as they run fastest with LightGBM's predictions: compiled
    (`CompiledTrees`), else in onnxruntime (`TreeEnsemble`), else None (LightGBM scores)."""
    return CompiledTrees.of(booster, rounds) or TreeEnsemble.of(booster, rounds)


def _lightgbm():
    try:
        import lightgbm
    except ImportError as err:  # an optional dependency
        raise ImportError("GBDTScorer needs LightGBM: pip install lightgbm (or pip install 'sessrec[pipeline]')") from err
    return lightgbm


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
        threads: LightGBM threads of the fit (None: the cores this process may run on). Scoring uses
            one thread per `ROWS_PER_THREAD` rows (one for a request), at most torch's (`torch.get_num_threads`);
            the trees run compiled (`CompiledTrees`: lleaves, ``pip install 'sessrec[fast-trees]'``) where it is
            installed and reproduces LightGBM's scores bit for bit, else in onnxruntime (`TreeEnsemble`) where it
            does, else in LightGBM; the same floats on any number of threads. In the benchmark pipeline's blend
            (``benchmarks/pipeline_latency.py``, members of 64 and 19 trees, 200 candidates a session, one thread)
            compiled, onnxruntime and LightGBM take 0.36, 0.53 and 0.70 ms and 0.09, 0.16 and 0.18 ms a request,
            225, 402 and 657 µs and 58, 148 and 138 µs a session at batch 256.
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
        threads: int | None = None,
        seed: int = 0,
    ) -> None:
        check_integers({"num_leaves": num_leaves}, "GBDTScorer ", minimum=2)
        check_integers({"max_rounds": max_rounds, "early_stopping": early_stopping, "min_data_in_leaf": min_data_in_leaf,
                        **({"threads": threads} if threads is not None else {})}, "GBDTScorer ")
        check_integers({"seed": seed}, "GBDTScorer ", minimum=0)
        check_numbers("GBDTScorer", {"learning_rate": (learning_rate, "positive"), "feature_fraction": (feature_fraction, "share"),
                                     "stop_fraction": (stop_fraction, "fraction")})
        self.params = {
            "objective": "lambdarank", "metric": "ndcg", "eval_at": [20], "num_leaves": num_leaves,
            "learning_rate": learning_rate, "min_data_in_leaf": min_data_in_leaf,
            "feature_fraction": feature_fraction, "bagging_fraction": 0.8, "bagging_freq": 1,
            "lambdarank_truncation_level": 30,
            "num_threads": threads if threads is not None else len(os.sched_getaffinity(0)), "seed": seed, "deterministic": True,
            "verbosity": -1,
        }
        self.max_rounds, self.early_stopping, self.stop_fraction, self.seed = max_rounds, early_stopping, stop_fraction, seed
        self.booster = None
        self.best_round = 0
        self._trees: TreeEnsemble | CompiledTrees | None | bool = False  # False: not built (yet); None: LightGBM scores

    def fit(self, inputs: RankingInputs | RankerRows, labels: torch.Tensor) -> GBDTScorer:
        """Fit on the sessions' valid rows (`RankerRows.valid_rows`, one matrix per side of the early-stopping split),
        stopping when NDCG@20 of the held-out sessions has not risen for `early_stopping` rounds."""
        lgb = _lightgbm()
        source = RankerRows.of(inputs)
        check_dense(self, source)
        train, stop = early_stopping_split(labels, self.stop_fraction, self.seed, source.groups)
        sets: list[Any] = []
        for sessions in (train, stop):
            valid = source.valid[sessions]
            y = labels[sessions][valid].cpu().numpy()
            sets.append(lgb.Dataset(source.valid_rows(sessions), y, group=valid.sum(dim=1).cpu().numpy(),
                                    feature_name=source.names, reference=sets[0] if sets else None, free_raw_data=True))
        self.booster = lgb.train(
            self.params, sets[0], num_boost_round=self.max_rounds, valid_sets=[sets[1]],
            callbacks=[lgb.early_stopping(self.early_stopping, verbose=False)],
        )
        self.best_round = int(self.booster.best_iteration or self.booster.current_iteration())
        self._trees = _ensemble(self.booster, self.best_round)
        return self

    def score(self, inputs: RankingInputs, rows: HostRows | None = None) -> torch.Tensor:
        """(B, K) scores, -inf at empty slots; `rows`: the valid rows of these `inputs` on the host, shared with
        the other tree members of a blend (`BlendScorer`), prepared there once."""
        if self.booster is None:
            raise RuntimeError("GBDTScorer is not fitted")
        out = torch.full(inputs.valid.shape, float("-inf"), device=inputs.valid.device)
        rows = HostRows.of(inputs, rows)
        x = rows.x
        if len(x):
            threads = min(torch.get_num_threads(), 1 + len(x) // ROWS_PER_THREAD)  # one for a request's rows
            trees = self.trees
            predicted = (trees.run(rows.trees(trees), threads) if trees is not None
                         else self.booster.predict(x, num_iteration=self.best_round, num_threads=threads))
            out[inputs.valid] = torch.from_numpy(predicted).to(out.device, torch.float32)
        return out

    @property
    def trees(self) -> TreeEnsemble | CompiledTrees | None:
        """The trees up to `best_round` compiled (`CompiledTrees`) or in onnxruntime (`TreeEnsemble`), the first that
        is installed and reproduces LightGBM's scores (built by `fit` and `load_state_dict`, and by the first call in
        a copy: compiled trees from the cache, 0.1-0.6 s for 64-216 trees); None where neither does."""
        if self._trees is False:
            self._trees = _ensemble(self.booster, self.best_round)
        return self._trees

    def __getstate__(self) -> dict[str, Any]:
        """The attributes but the trees' runtime (copies and pickles build their own)."""
        return {**self.__dict__, "_trees": False}

    def state_dict(self) -> dict[str, Any]:
        """``model``: LightGBM's text format of the trees up to the best round (uint8), and ``best_round``."""
        if self.booster is None:
            raise RuntimeError("GBDTScorer is not fitted: nothing to save")
        text = self.booster.model_to_string(num_iteration=self.best_round)
        return {"model": np.frombuffer(text.encode(), dtype=np.uint8).copy(), "best_round": self.best_round}

    def load_state_dict(self, state: Mapping[str, Any]) -> GBDTScorer:
        self.booster = _lightgbm().Booster(model_str=np.asarray(state["model"], dtype=np.uint8).tobytes().decode())
        self.best_round = int(state["best_round"])
        self._trees = _ensemble(self.booster, self.best_round)  # here, not in the first request (0.4 s for 210 trees)
        return self
