"""Deprecated path: `sessrec.pipeline.batch` moved to `sessrec.pipeline.offline`.

Names taken from here warn (`DeprecationWarning`) and come from `sessrec.pipeline.offline`; this module goes in
the next release.
"""

from sessrec.saved.moved import forward

__getattr__ = forward(__name__)
