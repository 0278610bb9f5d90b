"""`CompiledTrees`: a LightGBM model's trees compiled to machine code by lleaves (LLVM), where it is installed
(``pip install 'sessrec[fast-trees]'``) and reproduces LightGBM's predictions bit for bit.

The forest is one function that sums the trees' leaves in tree order from 0 in float64, as LightGBM does
(``fblocksize`` the number of trees: lleaves' cache blocks would sum each block apart, 2e-15 off), on the rows
`TreeEnsemble.rows` prepares (near-zeros 0; a split's NaN goes the side LightGBM sends it). The trees are
called, not inlined: inlining compiles 64, 106 and 216 trees of 63 leaves in 13, 75 and 210 s (superlinear)
for predictions 1.3x faster. On the benchmark pipeline's members of 64 and 19 trees the compiled trees take
0.56x and 0.39x onnxruntime's time a session at batch 256 and 0.69x and 0.60x a request (`GBDTScorer`).

Built only for the models `TreeEnsemble.exact` accepts, and used only when its predictions equal LightGBM's
(`np.array_equal`) on `probe_rows`: for every split, a row that reaches it with the split's feature at the
threshold, at the next float above it and NaN, and rows of infinities, zeros and near-zeros; otherwise `of`
returns None (and `GBDTScorer` runs onnxruntime's trees, or LightGBM's).

Compiling takes 0.8, 1.7 and 3.4 s of CPU for 64, 106 and 216 trees of 63 leaves, so the machine code is
cached in the user's cache directory (`cache_dir`: ``~/.cache/sessrec/trees``, or under ``$SESSREC_CACHE_DIR``)
under the sha256 of the model's text, the lleaves and llvmlite versions and the host CPU's name and features
(another CPU compiles its own), written to a temporary file and renamed into place (0.4-1.4 MB). An entry
carries the sha256 of its bytes, checked before they are loaded; an entry that fails it, cannot be read, or
whose predictions differ on the probe rows is compiled again. From the cache, `of` takes 0.12, 0.21 and 0.61 s
(mostly the probe rows' check).

Shape letters: N rows, F features.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from sessrec.pipeline.scoring.tree_ensemble import ZERO, TreeEnsemble

log = logging.getLogger(__name__)

MAGIC = b"sessrec-trees-1\n"  # a cache entry: MAGIC, the sha256 of the object code, the object code
# NaN, infinities, zeros, values LightGBM takes for 0 (at most ZERO) and the next past it
SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-36, -1e-40, ZERO, -ZERO, np.nextafter(ZERO, 1.0),
                     -np.nextafter(ZERO, 1.0), 1.0, -1.0])
FALLBACK = ": onnxruntime's trees (TreeEnsemble) or LightGBM score"


def _lleaves() -> tuple[Any, Any] | None:
    """(lleaves, llvmlite.binding), or None when either is not installed, or lleaves 1.3 or older beside an
    llvmlite without LLVM's legacy pass manager (0.45 on), which it compiles with."""
    try:
        import lleaves
        import llvmlite.binding
    except ImportError:
        return None
    release = tuple(int(part) for part in metadata.version("lleaves").split(".")[:2] if part.isdigit())
    if release <= (1, 3) and not hasattr(llvmlite.binding, "PassManagerBuilder"):
        return None
    return lleaves, llvmlite.binding


def cache_dir() -> Path:
    """Where compiled forests are kept: ``$SESSREC_CACHE_DIR/trees``, else ``$XDG_CACHE_HOME/sessrec/trees``,
    else ``~/.cache/sessrec/trees``."""
    if os.environ.get("SESSREC_CACHE_DIR"):
        return Path(os.environ["SESSREC_CACHE_DIR"]) / "trees"
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "sessrec" / "trees"


def cache_key(text: str, binding: Any) -> str:
    """The sha256 of the model's `text`, the lleaves and llvmlite versions and the host CPU's name and features."""
    try:
        features = binding.get_host_cpu_features().flatten()
    except RuntimeError:  # LLVM cannot tell this CPU's features: they are compiled for without any
        features = ""
    parts = [text, metadata.version("lleaves"), metadata.version("llvmlite"), binding.get_host_cpu_name(), features,
             "fblocksize=trees finline=0 fp64 large"]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def probe_rows(dump: dict[str, Any]) -> np.ndarray:
    """(N, F) float64 rows on which a forest must predict what LightGBM predicts: for every split of the trees
    of `dump` (`Booster.dump_model`), a row that follows the path to it (each feature on a split's side, others
    0) with the split's feature at the threshold, at the next float above it and NaN; then rows of `SPECIALS`
    (NaN, infinities, zeros, near-zeros) in every feature, seeded."""
    width = int(dump["max_feature_idx"]) + 1
    out: list[np.ndarray] = []

    def walk(node: dict[str, Any], row: np.ndarray) -> None:
        if "leaf_value" in node:
            return
        feature, threshold = int(node["split_feature"]), float(node["threshold"])
        for value in (threshold, np.nextafter(threshold, np.inf), np.nan):
            probe = row.copy()
            probe[feature] = value
            out.append(probe)
        for child, value in ((node["left_child"], threshold), (node["right_child"], np.nextafter(threshold, np.inf))):
            probe = row.copy()
            probe[feature] = value
            walk(child, probe)

    for info in dump["tree_info"]:
        walk(info["tree_structure"], np.zeros(width))
    g = np.random.default_rng(0)
    specials = SPECIALS[g.integers(0, len(SPECIALS), size=(256, width))]
    specials[: len(SPECIALS)] = SPECIALS[:, None]  # each special in every feature at once
    return np.vstack([*out, specials]) if out else specials


class CompiledTrees:
    """The trees of a LightGBM model up to a round, compiled by lleaves; `rows` and `run` as `TreeEnsemble`'s.

    Args:
        model: the compiled `lleaves.Model`.
        num_features: F, the features the trees read.
        num_trees: the trees summed.
    """

    def __init__(self, model: Any, num_features: int, num_trees: int) -> None:
        self.model, self.num_features, self.num_trees = model, num_features, num_trees

    @classmethod
    def of(cls, booster: Any, rounds: int, cache: Path | None = None) -> CompiledTrees | None:
        """The trees of LightGBM `booster` up to round `rounds`, compiled (or loaded from `cache`, default
        `cache_dir`); None when lleaves is not installed, fails, the trees hold splits `TreeEnsemble` does not
        reproduce, or its predictions on `probe_rows` differ from LightGBM's in any bit."""
        modules = _lleaves()
        if modules is None:
            return None
        dump = booster.dump_model(num_iteration=rounds)
        if not TreeEnsemble.exact(dump):
            return None
        text = booster.model_to_string(num_iteration=rounds)
        num_features, num_trees = int(dump["max_feature_idx"]) + 1, len(dump["tree_info"])
        probe = probe_rows(dump)
        expected = booster.predict(probe, num_iteration=rounds, num_threads=1)
        entry = (cache_dir() if cache is None else cache) / f"{cache_key(text, modules[1])}.trees"
        for cached in (True, False):
            try:
                model = _compile(modules[0], text, num_trees, entry, cached)
            except Exception as err:  # an lleaves or llvmlite that cannot compile here (llvmlite >= 0.45)
                log.warning("lleaves cannot %s the trees (%s: %s)%s", "load" if cached else "compile", type(err).__name__,
                            err, ": compiling them again" if cached else FALLBACK)
                continue
            if model is None:
                continue
            trees = cls(model, num_features, num_trees)
            if np.array_equal(trees.run(trees.rows(probe)), expected):
                return trees
            log.warning("lleaves' trees (%s) predict other floats than LightGBM%s", entry.name,
                        ": compiling them again" if cached else FALLBACK)
        return None

    def predict(self, x: np.ndarray, threads: int = 1) -> np.ndarray:
        """(N,) float64: the sum of the trees' leaves of each of the (N, F) rows `x`, as LightGBM's `predict`:
        `run` of the `rows` of `x`."""
        return self.run(self.rows(x), threads)

    def rows(self, x: np.ndarray) -> np.ndarray:
        """The (N, F) rows `x` as the trees read them: `TreeEnsemble.rows` (a float64 copy, near-zeros 0)."""
        return TreeEnsemble.rows(self, x)  # type: ignore[arg-type]  # it reads num_features only

    def run(self, rows: np.ndarray, threads: int = 1) -> np.ndarray:
        """(N,) float64: the sum of the trees' leaves of each of the (N, F) prepared `rows` (`rows`); with
        `threads` > 1 the rows are split into that many runs at once (the compiled code releases the GIL),
        each row scored by one of them: the same floats as on one thread."""
        if rows.ndim != 2 or rows.shape[1] != self.num_features or rows.dtype != np.float64:
            raise ValueError(f"the trees run float64 rows of {self.num_features} features (CompiledTrees.rows), "
                             f"got {rows.dtype} rows of shape {tuple(rows.shape)}")
        return self.model.predict(np.ascontiguousarray(rows), n_jobs=max(1, min(threads, len(rows))))


def _compile(lleaves: Any, text: str, num_trees: int, entry: Path, cached: bool) -> Any:
    """An `lleaves.Model` of the model `text`: from the cache `entry` when `cached` (None when it holds
    nothing sound), else compiled and written there (atomically; not at all where the folder is not writable)."""
    with tempfile.TemporaryDirectory(prefix="sessrec-trees-") as scratch:
        model_file, code_file = Path(scratch) / "model.txt", Path(scratch) / "code.o"
        model_file.write_text(text)
        if cached:
            try:
                data = entry.read_bytes()
            except OSError:
                return None
            head, digest, code = data[: len(MAGIC)], data[len(MAGIC) : len(MAGIC) + 32], data[len(MAGIC) + 32 :]
            if head != MAGIC or hashlib.sha256(code).digest() != digest:
                log.warning("the compiled trees in %s are damaged: compiling them again", entry)
                return None
            code_file.write_bytes(code)  # lleaves loads the object code from a path
        model = lleaves.Model(model_file=str(model_file))
        model.compile(cache=str(code_file), fblocksize=num_trees, finline=False)
        if not cached:
            _store(entry, code_file.read_bytes())
    return model


def _store(entry: Path, code: bytes) -> None:
    """Write `code` to the cache `entry`: to a temporary file of its folder, renamed into place."""
    name = None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=entry.parent, prefix=f".{entry.stem}.", delete=False) as out:
            name = out.name
            out.write(MAGIC + hashlib.sha256(code).digest() + code)
        os.replace(name, entry)
    except OSError as err:
        log.warning("the compiled trees cannot be cached in %s (%s): they are compiled at each load", entry.parent, err)
        if name is not None:
            Path(name).unlink(missing_ok=True)
