"""Serving trained models: raw-id sessions in, raw-id recommendations out, without the training stack.

- `sessrec.serving.recommender`: `load_recommender`, a model or pipeline directory as raw ids in, raw ids out
  (per request ``encode``, per batch ``recommend_batch`` + ``decode``).
- `sessrec.serving.app`: the HTTP app and its deadlines; with `admission` (the bounds, a 503 at arrival past
  them), `hot_reload` (the model and its canary swapped as their directory moves), `request` (one request's
  checks), `batching` (the model calls) and `request_metrics` (Prometheus).
- `sessrec.serving.server`: ``sessrec serve``, the app under uvicorn in one process or several workers on one port.
- `sessrec.serving.served_log`: `ServedLog`, what each request got, in rotating parquet files written off the
  request path (what ``sessrec monitor`` reads).

Import the parts from their modules: the server needs the optional ``deploy`` packages (fastapi,
uvicorn, prometheus-client) that a training install lacks.
"""
