"""A Triton Inference Server model repository for a trained network: ``model.onnx`` and ``config.pbtxt``.

    <out_dir>/<name>/config.pbtxt        platform "onnxruntime_onnx", inputs, outputs, dynamic batching
    <out_dir>/<name>/1/model.onnx        from `sessrec.lifecycle.export` (version 1)
    <out_dir>/<name>/1/vocab.parquet     the model's vocabulary (raw ids <-> the model ids it reads and returns)
    <out_dir>/<name>/1/side_features.parquet  for a model with side features, its categorical ones' categories (`side_rules`)
    <out_dir>/<name>/1/model.json        the export's description of its tensors, vocabulary and version

Axes: with ``max_batch_size > 0`` Triton adds the batch axis itself, so ``dims`` list the other
axes, -1 where the export left them symbolic (the session length, a sparse feature's ids). A
model whose only output axis is the batch (DLRM's logits) gets ``dims: [ 1 ]`` reshaped to ``[ ]``,
as Triton asks. The dynamic batcher only merges requests of the same shape: pad sessions to one
length (left padding, id 0, changes no score) for requests to batch together. No
``instance_group`` is written, so Triton places the model on the GPUs it finds, else on the CPU.

Shape letters as in `sessrec.lifecycle.export`.

Examples:
    >>> from sessrec.artifacts import SessionRecommender
    >>> triton_repository(SessionRecommender.from_pretrained("runs/xlnet/model"), "model_repository", "xlnet")  # doctest: +SKIP
    $ tritonserver --model-repository=model_repository
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from sessrec.artifacts import ClickRanker, SessionRecommender
from sessrec.lifecycle.export import export_dlrm, export_session_model
from sessrec.saved.atomic import write_text
from sessrec.saved.registry import check_integers
from sessrec.scoring.output import check_folder

TRITON_TYPES = {"int64": "TYPE_INT64", "int32": "TYPE_INT32", "float64": "TYPE_FP64", "float32": "TYPE_FP32", "float16": "TYPE_FP16", "bool": "TYPE_BOOL"}


def triton_repository(
    artifact: SessionRecommender | ClickRanker,
    out_dir: str | os.PathLike,
    name: str,
    max_batch_size: int = 64,
    max_queue_delay_microseconds: int = 100,
    top_k: int | None = 20,
    verify: bool = True,
    version: str | None = None,
) -> Path:
    """Export a trained model to ONNX into a Triton model repository and write its ``config.pbtxt``.

    Args:
        artifact: a `SessionRecommender` (inputs ``items`` [+ side features]; outputs ``scores``
            and, with `top_k`, ``top_scores``/``top_items``) or a `ClickRanker` (``dense`` + one ids
            input per sparse feature; output ``logits``), from ``from_pretrained`` of a model directory.
        out_dir: the model repository (created); other models in it are left alone.
        name: the model's name in Triton (its directory).
        max_batch_size: the largest batch Triton forms; 0 turns batching (and the dynamic batcher) off.
        max_queue_delay_microseconds: how long the dynamic batcher waits to fill a batch.
        top_k: for a session model, also output the K best items (None: scores only).
        verify: check the exported file against eager PyTorch (see `export_session_model`).
        version: the version of the model directory `artifact` was read from, recorded in ``model.json``
            (`sessrec.lifecycle.export.read_model_dir` gives both).

    Returns:
        The model's directory, ``<out_dir>/<name>``.

    Raises:
        PermissionError: `out_dir` is a file or cannot be written (before anything is exported).
    """
    if not re.fullmatch(r"[A-Za-z0-9_.\-]+", name):
        raise ValueError(f"model name must be letters, digits, '_', '.' or '-' (it is a directory), got {name!r}")
    check_integers({"max_batch_size": max_batch_size, "max_queue_delay_microseconds": max_queue_delay_microseconds},
                   minimum=0)
    check_folder(out_dir, "--out")
    model_dir = Path(out_dir) / name
    if isinstance(artifact, ClickRanker):
        path = export_dlrm(artifact, model_dir / "1", "onnx", verify=verify, version=version)
    elif isinstance(artifact, SessionRecommender):
        path = export_session_model(artifact, model_dir / "1", "onnx", top_k=top_k, verify=verify, version=version)
    else:
        raise TypeError(f"triton_repository exports a SessionRecommender or a ClickRanker, got {type(artifact).__name__}")
    spec = json.loads(path.with_suffix(".json").read_text())
    write_text(model_dir / "config.pbtxt", model_config(name, spec, max_batch_size, max_queue_delay_microseconds))
    return model_dir


def model_config(name: str, spec: dict, max_batch_size: int, max_queue_delay_microseconds: int) -> str:
    """``config.pbtxt`` text (protobuf text format of Triton's ``ModelConfig``) for an export's ``model.json``."""
    batched = max_batch_size > 0
    lines = [f"name: {json.dumps(name)}", 'platform: "onnxruntime_onnx"', f"max_batch_size: {max_batch_size}"]
    lines += _tensors("input", spec["inputs"], batched)
    lines += _tensors("output", spec["outputs"], batched)
    if batched:
        lines += ["dynamic_batching {", f"  max_queue_delay_microseconds: {max_queue_delay_microseconds}", "}"]
    return "\n".join(lines) + "\n"


def _tensors(kind: str, tensors: list[dict], batched: bool) -> list[str]:
    """One ``input [...]`` or ``output [...]`` block; the leading batch axis is Triton's when `batched`."""
    lines = [f"{kind} ["]
    for i, t in enumerate(tensors):
        shape = t["shape"][1:] if batched else t["shape"]
        dims = [d if isinstance(d, int) else -1 for d in shape]
        if t["dtype"] not in TRITON_TYPES:
            raise ValueError(f"{kind} {t['name']!r}: dtype {t['dtype']} has no Triton type here ({sorted(TRITON_TYPES)})")
        lines += ["  {", f"    name: {json.dumps(t['name'])}", f"    data_type: {TRITON_TYPES[t['dtype']]}"]
        if dims:
            lines.append(f"    dims: [ {', '.join(map(str, dims))} ]")
        else:  # only the batch axis: Triton wants one element, reshaped away
            lines += ["    dims: [ 1 ]", "    reshape: { shape: [ ] }"]
        lines.append("  }," if i < len(tensors) - 1 else "  }")
    return lines + ["]"]
