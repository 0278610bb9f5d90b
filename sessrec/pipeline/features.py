"""Deprecated path: `sessrec.pipeline.features` moved to `sessrec.pipeline.candidate_features`.

Names taken from here warn (`DeprecationWarning`) and come from `sessrec.pipeline.candidate_features`; this module goes in
the next release.
"""

from sessrec.saved.moved import forward

__getattr__ = forward(__name__)
