"""A network traced to ONNX in memory, and run by onnxruntime on one thread.

`to_onnx` is ``torch.onnx.export(dynamo=True)`` (torch.export + onnxscript: every encoder but GRU4Rec
exports, `sessrec.lifecycle.export` says why) returning the model proto instead of writing a file;
`OnnxSession` runs serialized model bytes on the CPU with one intra- and one inter-op thread, as the
ranker's trees run (`sessrec.pipeline.scoring.tree_ensemble`). Both need the optional ``onnx``,
``onnxscript`` and ``onnxruntime`` packages, imported on first use. `max_abs_diff` is how an exported
graph is compared with eager PyTorch; `first_line` shortens an exporter's error to one line;
`example_items` and `example_times` are the sessions a session model is traced and checked on.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from sessrec.models.gru4rec import GRU4RecEncoder

MAX_BYTES = 1_800_000_000  # one ONNX file holds at most 2 GB (protobuf)
# encoder class -> why a network with it does not export to ONNX with torch 2.13 (`sessrec.lifecycle.export`)
ONNX_LIMITS: dict[type[nn.Module], str] = {
    GRU4RecEncoder: (
        "its GRU runs on a PackedSequence (pack_padded_sequence), whose state is sized by the data "
        "(batch_sizes[0]), a shape torch.export cannot trace, and its stable argsort (aten.sort.stable) "
        "has no ONNX translation in either exporter"
    ),
}


def onnx_limit(encoder: nn.Module) -> str | None:
    """Why a network with `encoder` does not export to ONNX (`ONNX_LIMITS`); None when it does."""
    return next((why for cls, why in ONNX_LIMITS.items() if isinstance(encoder, cls)), None)


def to_onnx(
    module: nn.Module,
    example: tuple[torch.Tensor, ...],
    input_names: Sequence[str],
    output_names: Sequence[str],
    dynamic_shapes: Any,
    opset: int | None = None,
) -> Any:
    """`module` traced on `example` as an ``onnx.ModelProto`` (its weights inside), `dynamic_shapes` as
    ``torch.export`` takes them.

    Raises:
        ValueError: the weights pass the 2 GB of one ONNX file.
        ModuleNotFoundError: onnx or onnxscript is not installed.
    """
    if sum(p.numel() * p.element_size() for p in module.parameters()) > MAX_BYTES:
        raise ValueError("its weights pass the 2 GB limit of one ONNX file (protobuf); external weight files are not supported here")
    program = torch.onnx.export(
        module, example, None, input_names=list(input_names), output_names=list(output_names),
        dynamic_shapes=dynamic_shapes, opset_version=opset, dynamo=True, external_data=False, verbose=False,
    )
    return program.model_proto


def opset_of(proto: Any) -> int:
    """The default-domain opset a model proto imports."""
    return next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))


class OnnxSession:
    """Serialized ONNX model bytes as an onnxruntime session on the CPU, one thread. Copies and pickles
    carry the bytes and build their own session.

    Args:
        data: the model (``ModelProto.SerializeToString()``).

    Raises:
        ValueError: onnxruntime cannot read `data` (one line).
    """

    def __init__(self, data: bytes) -> None:
        import onnxruntime as ort  # optional: the pipeline and deploy extras

        self.data = data
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        try:
            self.session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
        except Exception as err:  # onnxruntime's own error types (Fail, InvalidGraph, ...)
            raise ValueError(f"onnxruntime cannot read the graph: {first_line(err)}") from err
        self.input_names = [i.name for i in self.session.get_inputs()]

    def run(self, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """The graph's outputs for `inputs` (by input name)."""
        return self.session.run(None, dict(inputs))

    def __reduce__(self) -> tuple[type[OnnxSession], tuple[bytes]]:
        return OnnxSession, (self.data,)


def max_abs_diff(actual: np.ndarray, expected: np.ndarray) -> float:
    """Max |actual - expected| over the finite entries of `expected`; inf when the -inf entries differ."""
    finite = np.isfinite(expected)
    if actual.shape != expected.shape or not np.array_equal(np.isfinite(actual), finite):
        return float("inf")
    return float(np.abs(actual[finite] - expected[finite]).max()) if finite.any() else 0.0


def first_line(err: BaseException) -> str:
    """An exporter's summary of an error: its 'Exception summary' line if any, else its first line."""
    text = str(err)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if "## Exception summary" in text:
        after = text.split("## Exception summary", 1)[1]
        lines = [line.strip() for line in after.splitlines() if line.strip()] or lines
    line = re.sub(r"\x1b\[[0-9;]*m", "", lines[0] if lines else type(err).__name__)
    return line[:300]


def example_items(recommendable: torch.Tensor, batch: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """(B, L) right-aligned sessions of random recommendable ids (`recommendable`: (V,) bool), 1, 2, ... items
    long (cycling up to L), left-padded with 0: short sessions and padding, as requests bring them."""
    real = torch.nonzero(recommendable.cpu()).squeeze(1)  # (R,) item ids
    items = real[torch.randint(len(real), (batch, length), generator=generator)]
    sizes = torch.arange(batch) % length + 1
    return items.masked_fill(torch.arange(length) < (length - sizes).unsqueeze(1), 0)


def example_times(batch: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """(B, L) float64 event times in seconds rising by gaps of 1 s to about 3 days, so that an encoder's
    every time bucket is read."""
    gaps = torch.exp(torch.rand(batch, length, generator=generator, dtype=torch.float64) * 12.5)
    return 1.7e9 + gaps.cumsum(1)
