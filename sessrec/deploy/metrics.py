"""Deprecated path: `sessrec.deploy.metrics` moved to `sessrec.deploy.request_metrics`.

Names taken from here warn (`DeprecationWarning`) and come from `sessrec.deploy.request_metrics`; this module goes in
the next release.
"""

from sessrec.saved.moved import forward

__getattr__ = forward(__name__)
