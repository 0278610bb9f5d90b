"""Where moved modules and renamed classes live now: the one table behind the deprecation shims and
the registry's reading of old class paths.

`MOVED` maps an old dotted path to its new one. A key is a module (every name in it moved with
it) or one name (``module.Name``, for a single class or function that moved or was renamed).
`new_path` applies it to a class path written in a saved directory or a recipe; `forward` builds
the module ``__getattr__`` of an old module path, which warns once per access with a
`DeprecationWarning` naming the new path and returns the object from there. The old paths are
removed in the release after the one that moved them.

Examples:
    >>> new_path("sessrec.data.features.ops.Categorify")
    'sessrec.features.ops.Categorify'
    >>> new_path("sessrec.data.TrivagoSource")
    'sessrec.datasets.trivago.TrivagoSource'
    >>> new_path("sessrec.models.GRU4RecEncoder") is None
    True
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from importlib import import_module
from typing import Any

MODULES = {
    "sessrec.data.array_backend": "sessrec.features.backend",
    "sessrec.data.features": "sessrec.features",
    "sessrec.data.features.ops": "sessrec.features.ops",
    "sessrec.data.features.pipeline": "sessrec.features.pipeline",
    "sessrec.data.features.time": "sessrec.features.time",
    "sessrec.data.trivago": "sessrec.datasets.trivago",
    "sessrec.data.clickouts": "sessrec.datasets.clickouts",
    "sessrec.data.criteo": "sessrec.datasets.criteo",
    "sessrec.data.ranking": "sessrec.datasets.clickout_rows",
    "sessrec.data.jagged": "sessrec.embeddings.jagged",
    "sessrec.data.datamodule": "sessrec.tasks.session_data",
    "sessrec.data.ranking_datamodule": "sessrec.tasks.clickout_data",
    "sessrec.pipeline.features": "sessrec.pipeline.candidate_features",
    "sessrec.pipeline.batch": "sessrec.pipeline.offline",
    "sessrec.pipeline.retrieval.knn": "sessrec.pipeline.retrieval.baseline",
    "sessrec.deploy.metrics": "sessrec.deploy.request_metrics",
}
# names that left the package namespace `sessrec.data` (``sessrec.data.X``), and renamed objects
NAMES = {
    **{f"sessrec.data.{name}": f"sessrec.features.{module}.{name}" for module, names in {
        "ops": ("Categorify", "CountEncoding", "HashedCross", "LogNormalize", "TargetEncoding"),
        "pipeline": ("FeaturePipeline",),
        "time": ("CyclicTime", "SessionTimeFeatures"),
    }.items() for name in names},
    "sessrec.data.SparseFeatures": "sessrec.embeddings.jagged.SparseFeatures",
    "sessrec.data.TrivagoSource": "sessrec.datasets.trivago.TrivagoSource",
    "sessrec.data.build_clickout_rows": "sessrec.datasets.clickouts.build_clickout_rows",
    "sessrec.data.generate_criteo": "sessrec.datasets.criteo.generate_criteo",
    "sessrec.data.RankingBatch": "sessrec.datasets.clickout_rows.RankingBatch",
    "sessrec.data.RankingVocab": "sessrec.datasets.clickout_rows.RankingVocab",
    "sessrec.data.SessionDataModule": "sessrec.tasks.session_data.SessionDataModule",
    "sessrec.data.ClickoutDataModule": "sessrec.tasks.clickout_data.ClickoutDataModule",
    "sessrec.deploy.export.DLRMScorer": "sessrec.deploy.export.ExportedClickScorer",
    **{f"sessrec.tasks.ranking.{name}": f"sessrec.metrics.{name}" for name in ("binary_auc", "clicked_ranks")},
    "sessrec.pipeline.evaluate": "sessrec.pipeline.training.evaluate_pipeline",
    "sessrec.pipeline.training.evaluate": "sessrec.pipeline.training.evaluate_pipeline",
    "sessrec.pipeline.candidates.Sessions": "sessrec.pipeline.candidates.RequestSessions",
    "sessrec.pipeline.Sessions": "sessrec.pipeline.candidates.RequestSessions",
}
MOVED = {**MODULES, **NAMES}


def new_path(path: str) -> str | None:
    """The current dotted path of the moved module or object at `path`, or None if it did not move."""
    if path in NAMES:
        return NAMES[path]
    module, _, name = path.rpartition(".")
    while module:
        if module in MODULES:
            return f"{MODULES[module]}.{name}"
        module, _, head = module.rpartition(".")
        name = f"{head}.{name}"
    return None


def load(path: str) -> Any:
    """The object at the dotted path ``module.name`` (the module imported)."""
    module, _, name = path.rpartition(".")
    return getattr(import_module(module), name)


def forward(old_module: str, own: Callable[[str], Any] | None = None) -> Callable[[str], Any]:
    """The module ``__getattr__`` of `old_module`: a moved name warns and is taken from its new place.

    Args:
        old_module: the dotted name of the module (``__name__``).
        own: the lookup of the names that still live in the module, tried first (raises
            AttributeError for others).
    """

    def __getattr__(name: str) -> Any:
        if own is not None:
            try:
                return own(name)
            except AttributeError:
                pass
        target = new_path(f"{old_module}.{name}")
        if target is None or name.startswith("__"):
            raise AttributeError(f"module {old_module!r} has no attribute {name!r}")
        warnings.warn(
            f"{old_module}.{name} moved to {target}; import it from there ({old_module}.{name} goes in the next release)",
            DeprecationWarning, stacklevel=2,
        )
        return load(target)

    return __getattr__
