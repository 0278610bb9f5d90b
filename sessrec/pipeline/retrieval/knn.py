"""Deprecated path: `sessrec.pipeline.retrieval.knn` moved to `sessrec.pipeline.retrieval.baseline`.

Names taken from here warn (`DeprecationWarning`) and come from `sessrec.pipeline.retrieval.baseline`; this module goes in
the next release.
"""

from sessrec.saved.moved import forward

__getattr__ = forward(__name__)
