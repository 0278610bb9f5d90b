"""Deprecated path: `sessrec.data.trivago` moved to `sessrec.datasets.trivago`.

Names taken from here warn (`DeprecationWarning`) and come from `sessrec.datasets.trivago`; this module goes in
the next release.
"""

from sessrec.saved.moved import forward

__getattr__ = forward(__name__)
