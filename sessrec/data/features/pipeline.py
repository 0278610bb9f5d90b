"""Deprecated path: `sessrec.data.features.pipeline` moved to `sessrec.features.pipeline`.

Names taken from here warn (`DeprecationWarning`) and come from `sessrec.features.pipeline`; this module goes in
the next release.
"""

from sessrec.saved.moved import forward

__getattr__ = forward(__name__)
