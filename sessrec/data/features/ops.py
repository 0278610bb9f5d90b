"""Deprecated path: `sessrec.data.features.ops` moved to `sessrec.features.ops`.

Names taken from here warn (`DeprecationWarning`) and come from `sessrec.features.ops`; this module goes in
the next release.
"""

from sessrec.saved.moved import forward

__getattr__ = forward(__name__)
