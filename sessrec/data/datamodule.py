"""Deprecated path: `sessrec.data.datamodule` moved to `sessrec.tasks.session_data`.

Names taken from here warn (`DeprecationWarning`) and come from `sessrec.tasks.session_data`; this module goes in
the next release.
"""

from sessrec.saved.moved import forward

__getattr__ = forward(__name__)
