"""After training: export, serving and retraining of saved models.

- `sessrec.deploy.export`: ONNX and TorchScript files of a session model or DLRM (``sessrec export``).
- `sessrec.deploy.triton`: a Triton model repository (ONNX backend, dynamic batching).
- `sessrec.deploy.recommender`: `load_recommender`, a model or pipeline directory as raw ids in, raw ids out
  (per request ``encode``, per batch ``recommend_batch`` + ``decode``).
- `sessrec.deploy.server`: the HTTP server (``sessrec serve``): bounded admission, deadlines, hot reload;
  with `request` (one request's checks), `batching` (the model calls) and `request_metrics` (Prometheus).
- `sessrec.deploy.retrain`: warm-start retraining on a new time window with a quality gate (``sessrec retrain``).

Import the parts from their modules: export and serving need the optional ``deploy`` packages
(onnx, onnxscript, onnxruntime, fastapi, uvicorn, prometheus-client) that a training install lacks.
"""
