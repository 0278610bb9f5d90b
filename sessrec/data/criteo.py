"""Deprecated path: `sessrec.data.criteo` moved to `sessrec.datasets.criteo`.

Names taken from here warn (`DeprecationWarning`) and come from `sessrec.datasets.criteo`; this module goes in
the next release.
"""

from sessrec.saved.moved import forward

__getattr__ = forward(__name__)
