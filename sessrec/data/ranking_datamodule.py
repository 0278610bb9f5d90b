"""Deprecated path: `sessrec.data.ranking_datamodule` moved to `sessrec.tasks.clickout_data`.

Names taken from here warn (`DeprecationWarning`) and come from `sessrec.tasks.clickout_data`; this module goes in
the next release.
"""

from sessrec.saved.moved import forward

__getattr__ = forward(__name__)
