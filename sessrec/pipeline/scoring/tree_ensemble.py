"""`TreeEnsemble`: a LightGBM model's trees run by onnxruntime's ``TreeEnsemble`` operator (ai.onnx.ml opset 5).

LightGBM walks about 35 ns per tree and row on one thread; onnxruntime's tree kernel walks the same
trees in about two thirds of that (``benchmarks/pipeline_latency.py --profile``, ``rank_*_GBDTScorer``),
on inputs, thresholds and leaf values in float64, so its predictions are LightGBM's (the leaf values
summed in tree order). The graph is built from the model's `dump_model` once, in milliseconds. Where lleaves is
installed (``sessrec[fast-trees]``) and reproduces LightGBM, `GBDTScorer` runs the compiled trees instead
(`CompiledTrees`, on the same `rows`): 0.56x and 0.39x this operator's time at batch 256 on the benchmark
pipeline's 64 and 19 trees (225 against 402 and 58 against 148 µs a session), 0.69x and 0.60x a request.

Built only for the trees it reproduces exactly: one tree per round, numerical ``<=`` splits whose
missing values are NaN or none, constant leaves. `TreeEnsemble.of` returns None for any other
model (categorical splits, zero-as-missing, linear trees, several classes), which LightGBM then scores.
How LightGBM treats an input, and how each split is written here:

- a value within `ZERO` (1e-35 as a float32) of 0 is 0 (LightGBM keeps no such values in a row): zeroed
  before the trees;
- NaN at a split of missing type ``NaN`` goes the split's default side (``nodes_missing_value_tracks_true``);
- NaN at a split of missing type ``None`` is 0: it goes left when 0 <= threshold.

Shape letters: N rows, F features.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from sessrec.models.onnx_graph import OnnxSession

ZERO = float(np.float32(1e-35))  # LightGBM's kZeroThreshold, the float 1e-35f (1.0000000180025095e-35): values
# of this magnitude or less are 0 to its trees
ZERO32 = np.float32(1e-35)  # ZERO as a float32: a float32 is within ZERO of 0 iff within it


ONNXRUNTIME = (1, 21)  # the first onnxruntime with the TreeEnsemble operator


def _onnx() -> tuple[Any, Any] | None:
    """(onnx, onnxruntime), or None when either is not installed or onnxruntime predates `ONNXRUNTIME`."""
    try:
        import onnx
        import onnxruntime
    except ImportError:
        return None
    major, minor = (int(part) for part in onnxruntime.__version__.split(".")[:2])
    return (onnx, onnxruntime) if (major, minor) >= ONNXRUNTIME else None


class TreeEnsemble:
    """The trees of a LightGBM model up to a round, as an onnxruntime session of one thread (`predict` runs it
    on several at once for many rows).

    Args:
        dump: the model's `Booster.dump_model` up to that round (the trees' JSON).
    """

    def __init__(self, dump: dict[str, Any]) -> None:
        modules = _onnx()
        if modules is None:
            raise ImportError("TreeEnsemble needs onnx and onnxruntime >= 1.21: pip install 'sessrec[pipeline]'")
        onnx, _ = modules
        self.num_features = int(dump["max_feature_idx"]) + 1
        nodes: dict[str, list] = {key: [] for key in ("feature", "split", "tracks", "true", "true_leaf", "false", "false_leaf")}
        leaves: list[float] = []

        def add(tree: dict[str, Any]) -> tuple[int, int]:
            """Append `tree`'s nodes (depth first) and leaves; (its index among the nodes or leaves, 1 if a leaf)."""
            if "leaf_value" in tree:
                leaves.append(float(tree["leaf_value"]))
                return len(leaves) - 1, 1
            at = len(nodes["feature"])
            threshold = float(tree["threshold"])
            nodes["feature"].append(int(tree["split_feature"]))
            nodes["split"].append(threshold)
            nodes["tracks"].append(int(tree["default_left"]) if tree["missing_type"] == "NaN" else int(0.0 <= threshold))
            for key in ("true", "true_leaf", "false", "false_leaf"):
                nodes[key].append(0)
            nodes["true"][at], nodes["true_leaf"][at] = add(tree["left_child"])
            nodes["false"][at], nodes["false_leaf"][at] = add(tree["right_child"])
            return at, 0

        roots = []
        for info in dump["tree_info"]:
            tree = info["tree_structure"]
            if "leaf_value" in tree:  # a tree of one leaf: a split whose sides are both that leaf
                tree = {"split_feature": 0, "threshold": 0.0, "missing_type": "None", "default_left": True,
                        "left_child": tree, "right_child": tree}
            roots.append(add(tree)[0])
        tensor = lambda name, values, dtype: onnx.numpy_helper.from_array(np.asarray(values, dtype=dtype), name)  # noqa: E731
        node = onnx.helper.make_node(
            "TreeEnsemble", ["x"], ["y"], domain="ai.onnx.ml", aggregate_function=1, post_transform=0, n_targets=1,
            tree_roots=roots, nodes_featureids=nodes["feature"], nodes_splits=tensor("splits", nodes["split"], np.float64),
            nodes_modes=tensor("modes", np.zeros(len(nodes["split"])), np.uint8),  # 0: BRANCH_LEQ, x <= split goes true
            nodes_missing_value_tracks_true=nodes["tracks"], nodes_truenodeids=nodes["true"],
            nodes_trueleafs=nodes["true_leaf"], nodes_falsenodeids=nodes["false"], nodes_falseleafs=nodes["false_leaf"],
            leaf_targetids=[0] * len(leaves), leaf_weights=tensor("leaves", leaves, np.float64),
        )
        graph = onnx.helper.make_graph(
            [node], "trees", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.DOUBLE, [None, self.num_features])],
            [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.DOUBLE, [None, 1])],
        )
        # IR version 10: the oldest that holds ai.onnx.ml opset 5, and what onnxruntime 1.20 reads at most
        model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("ai.onnx.ml", 5)], ir_version=10)
        self.session = OnnxSession(model.SerializeToString())  # on the CPU, one thread
        self.num_trees = len(roots)

    @staticmethod
    def exact(dump: dict[str, Any]) -> bool:
        """Whether `TreeEnsemble` reproduces the model of this `dump_model` exactly (see the module docstring)."""
        if int(dump.get("num_tree_per_iteration", 1)) != 1 or dump.get("average_output", False):
            return False

        def plain(tree: dict[str, Any]) -> bool:
            if "leaf_value" in tree:
                return "leaf_coeff" not in tree  # a linear tree's leaf is a linear model
            return (tree["decision_type"] == "<=" and tree["missing_type"] in ("None", "NaN")
                    and plain(tree["left_child"]) and plain(tree["right_child"]))

        return all(plain(info["tree_structure"]) for info in dump["tree_info"])

    @classmethod
    def of(cls, booster: Any, rounds: int) -> TreeEnsemble | None:
        """The trees of LightGBM `booster` up to round `rounds`; None when onnxruntime (>= 1.21) is not installed
        or the trees hold splits it does not reproduce exactly (LightGBM scores those)."""
        if _onnx() is None:
            return None
        dump = booster.dump_model(num_iteration=rounds)
        return cls(dump) if cls.exact(dump) else None

    def predict(self, x: np.ndarray, threads: int = 1) -> np.ndarray:
        """(N,) float64: the sum of the trees' leaves of each of the (N, F) rows `x`, as LightGBM's `predict`:
        `run` of the `rows` of `x`."""
        return self.run(self.rows(x), threads)

    def rows(self, x: np.ndarray) -> np.ndarray:
        """The (N, F) rows `x` as the trees read them: a float64 copy whose near-zeros are 0 (the same for any
        ensemble of F features: several ensembles may `run` one preparation). float32 rows' near-zeros are found
        before the copy, against `ZERO32` (half the bytes read: 0.8x the preparation's time at a
        batch's 49,074 x 26)."""
        if x.ndim != 2 or x.shape[1] != self.num_features:
            raise ValueError(f"the trees read {self.num_features} features, got rows of shape {tuple(x.shape)}")
        if x.dtype == np.float32:
            near = np.abs(x) <= ZERO32
            rows = x.astype(np.float64)
        else:
            rows = np.array(x, dtype=np.float64)  # a copy: its near-zeros are zeroed
            near = np.abs(rows) <= ZERO
        if near.any():
            rows[near] = 0.0
        return rows

    def run(self, rows: np.ndarray, threads: int = 1) -> np.ndarray:
        """(N,) float64: the sum of the trees' leaves of each of the (N, F) prepared `rows` (`rows`).

        With `threads` > 1 the rows are split into that many runs of the session at once (onnxruntime
        releases the GIL), each row scored by one of them: the same floats as on one thread.
        """
        if rows.ndim != 2 or rows.shape[1] != self.num_features or rows.dtype != np.float64:
            raise ValueError(f"the trees run float64 rows of {self.num_features} features (TreeEnsemble.rows), "
                             f"got {rows.dtype} rows of shape {tuple(rows.shape)}")
        parts = np.array_split(rows, max(1, min(threads, len(rows))))
        if len(parts) == 1:
            return self.session.run({"x": rows})[0][:, 0]
        with ThreadPoolExecutor(len(parts)) as pool:
            return np.concatenate([out[0][:, 0] for out in pool.map(lambda part: self.session.run({"x": part}), parts)])
