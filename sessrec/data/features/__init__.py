"""Deprecated path: `sessrec.data.features` moved to `sessrec.features`.

Names taken from here warn (`DeprecationWarning`) and come from `sessrec.features`; this module goes in
the next release.
"""

from sessrec.saved.moved import forward

__getattr__ = forward(__name__)
