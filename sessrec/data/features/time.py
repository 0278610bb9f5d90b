"""Deprecated path: `sessrec.data.features.time` moved to `sessrec.features.time`.

Names taken from here warn (`DeprecationWarning`) and come from `sessrec.features.time`; this module goes in
the next release.
"""

from sessrec.saved.moved import forward

__getattr__ = forward(__name__)
