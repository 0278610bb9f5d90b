"""Scoring a file partition by partition, in this process or on the workers of a Dask cluster.

`Engine` (``local`` or ``dask``) runs a job on every partition of the input that has no part yet;
`PartsFolder` keeps the parts, their manifest by content (what makes a rerun resume) and joins them
in input order into an `OutputFile` (its format by its extension, its path checked before any
work); `predict_file` is ``sessrec predict --engine dask`` for a session model's directory.
``sessrec recommend`` runs a saved pipeline the same way (`sessrec.pipeline.offline`). No training
stack: a worker imports what scoring needs.
"""

from sessrec.scoring.engine import Engine, load_once
from sessrec.scoring.output import OutputFile
from sessrec.scoring.parts import PartsFolder, check_counts, check_settings, write_part
from sessrec.scoring.predict import TopKJob, predict_file, topk_table

__all__ = ["Engine", "OutputFile", "PartsFolder", "TopKJob", "check_counts", "check_settings", "load_once",
           "predict_file", "topk_table", "write_part"]
