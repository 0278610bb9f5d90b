"""Deprecated path: `sessrec.data.ranking` moved to `sessrec.datasets.clickout_rows`.

Names taken from here warn (`DeprecationWarning`) and come from `sessrec.datasets.clickout_rows`; this module goes in
the next release.
"""

from sessrec.saved.moved import forward

__getattr__ = forward(__name__)
