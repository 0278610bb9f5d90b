"""Deprecated path: `sessrec.data.jagged` moved to `sessrec.embeddings.jagged`.

Names taken from here warn (`DeprecationWarning`) and come from `sessrec.embeddings.jagged`; this module goes in
the next release.
"""

from sessrec.saved.moved import forward

__getattr__ = forward(__name__)
