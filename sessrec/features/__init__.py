"""Feature engineering: operations fitted on training columns, applied to every split, saved to one file.

Each operation is a small class whose typed constructor arguments are its configuration and
whose input columns are named there. ``fit(frame)`` learns from the training split,
``transform(frame)`` applies what was learned to any split (unseen values get a documented
default), and ``fit_transform(frame)`` gives the training split's own features, which for
target encoding are out-of-fold. A `FeaturePipeline` runs named operations in order and saves
every fitted table to one ``.npz`` file, so scoring applies exactly the transforms of training.

A frame is a ``pyarrow.Table``, a dict of columns, or a pandas/cuDF DataFrame, one row per
event; columns are numpy, pyarrow, pandas, cuDF, CuPy or other array-API arrays (see
`sessrec.features.backend`). The array code is written once against the array API standard
and runs on NumPy (CPU) and CuPy (GPU); outputs live on the backend of the input. Integer
outputs are identical across backends; float outputs agree to rounding (a few ulp: ``sin``
and parallel sums are not bit-identical across devices).

Modules: `ops` (the base class, fitted keys and the column encoders), `time` (per-event
session and calendar features), `pipeline` (`FeaturePipeline` and its file format) and
`side_transform` (`SideFeatureTransform`: the model's side features, fitted on training sessions).
"""

from sessrec.features.feature_pipeline import FeaturePipeline
from sessrec.features.ops import (
    AsGiven,
    Categorify,
    CountEncoding,
    FeatureOp,
    HashedCross,
    LogNormalize,
    NotFittedError,
    TargetEncoding,
)
from sessrec.features.side_transform import SideFeatureTransform
from sessrec.features.time import (
    CyclicTime,
    CyclicTimes,
    SessionTimeFeatures,
    SessionTimes,
    session_offsets,
    session_times,
)

__all__ = [
    "AsGiven", "Categorify", "CountEncoding", "CyclicTime", "CyclicTimes", "FeatureOp", "FeaturePipeline", "HashedCross",
    "LogNormalize", "NotFittedError", "SessionTimeFeatures", "SessionTimes", "SideFeatureTransform", "TargetEncoding",
    "session_offsets", "session_times",
]
