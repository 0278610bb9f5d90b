"""A trained model's life after ``sessrec fit``: export, retraining with a quality gate, versions.

- `sessrec.lifecycle.export`: ONNX and TorchScript files of a session model or DLRM (``sessrec export``), of the
  functions `sessrec.lifecycle.scorers` makes of them (`NextItemScorer`, `ExportedClickScorer`).
- `sessrec.lifecycle.triton`: a Triton model repository (ONNX backend, dynamic batching).
- `sessrec.lifecycle.retrain`: warm-start retraining on a new time window (``sessrec retrain``), gated by
  `sessrec.lifecycle.gate` (a paired bootstrap over `sessrec.lifecycle.paired_ranks`).
- `sessrec.lifecycle.monitor`: a served log joined with the events that followed (``sessrec monitor``): hit rate,
  MRR, coverage, unknown items and drift per model version and window, and the thresholds that start a retraining.

Import the parts from their modules: export needs the optional ``deploy`` packages (onnx, onnxscript,
onnxruntime) that a training install lacks.
"""
