"""Deprecated path: `sessrec.data.array_backend` moved to `sessrec.features.backend`.

Names taken from here warn (`DeprecationWarning`) and come from `sessrec.features.backend`; this module goes in
the next release.
"""

from sessrec.saved.moved import forward

__getattr__ = forward(__name__)
