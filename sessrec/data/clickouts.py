"""Deprecated path: `sessrec.data.clickouts` moved to `sessrec.datasets.clickouts`.

Names taken from here warn (`DeprecationWarning`) and come from `sessrec.datasets.clickouts`; this module goes in
the next release.
"""

from sessrec.saved.moved import forward

__getattr__ = forward(__name__)
