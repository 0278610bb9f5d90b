"""Export of trained models to ONNX and TorchScript, each with a JSON description of its tensors.

`export_session_model` writes a `SessionRecommender`'s scorer, `export_dlrm` a `ClickRanker`'s
(the artifacts of `sessrec.artifacts`); both write ``model.onnx`` (or ``model.pt``), the model's
vocabulary ``vocab.parquet`` (raw ids <-> the model ids the file reads and returns) and ``model.json``
(inputs and outputs: names, dtypes, shapes with symbolic axes; the ONNX opset; the vocabulary's
fingerprint and rows; for a session model that reads side features, how raw values become its inputs,
with their categories in ``side_features.parquet`` (`side_rules`); the version exported, for a versioned
model directory) into a directory, so the folder is all a server needs, whatever is promoted later. By default they check the written
file against eager PyTorch on a batch of another shape than the export example, so a file whose
batch or length axis came out fixed is refused at export time rather than found in serving.

Exporters (as they behave with torch 2.13, onnxscript 0.7 and onnxruntime 1.32):
- ONNX: ``torch.onnx.export(dynamo=True)`` (torch.export + onnxscript), the default and the
  recommended exporter. It gives symbolic batch and length axes from ``dynamic_shapes`` and
  exports every encoder but GRU4Rec. The TorchScript-based exporter (``dynamo=False``,
  deprecated) fails on SASRec (no translation of the in-place ``aten::__ior_``) and GRU4Rec.
- TorchScript: ``torch.jit.trace``. ``torch.jit.script`` compiles neither BERT nor SASRec; a trace
  keeps shapes symbolic here because no encoder branches on them in Python, and the export-time
  check on a batch of another shape guards that. torch 2.13 marks ``torch.jit`` deprecated (a
  DeprecationWarning on trace, save and load); it is still the one format that carries GRU4Rec.

Refused (a `ValueError` naming the encoder, the format and why): GRU4Rec to ONNX. Its GRU runs
on a ``PackedSequence`` whose state is sized by the data (``batch_sizes[0]``), which torch.export
cannot trace, and its stable ``argsort`` has no ONNX translation in either exporter. It exports
to TorchScript.

The traced functions and their inputs are `sessrec.lifecycle.scorers`' (`NextItemScorer`, `ExportedClickScorer`);
this module writes, checks and runs the files.

`export_model_dir` does the same for a model directory (``runs/<name>/model``, read without Lightning):
the current version of a versioned one, whose name ``model.json`` records.

Examples:
    >>> from sessrec.artifacts import SessionRecommender
    >>> recommender = SessionRecommender.from_pretrained("runs/xlnet/model")  # doctest: +SKIP
    >>> path = export_session_model(recommender, "exported/xlnet", "onnx", top_k=20)  # doctest: +SKIP
    >>> path.name  # doctest: +SKIP
    'model.onnx'
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch import nn

from sessrec.artifacts import ClickRanker, SessionRecommender, load_artifact
from sessrec.artifacts.model_directory import VOCAB
from sessrec.lifecycle.scorers import ExportedClickScorer, NextItemScorer, TensorSpec
from sessrec.models.onnx_graph import ONNX_LIMITS, first_line, max_abs_diff, opset_of, to_onnx
from sessrec.saved import versions
from sessrec.saved.atomic import (
    atomic_path,
    fsync_dir,
    new_folders,
    normal_modes,
    remove_abandoned,
    stage_name,
    write_text,
)
from sessrec.saved.directory import vocabulary_record
from sessrec.scoring.output import check_folder

Format = Literal["onnx", "torchscript"]
FILES = {"onnx": "model.onnx", "torchscript": "model.pt"}
SIDE_FEATURES = "side_features.parquet"  # the categories of a side-feature model's categorical features (maybe none)
TOLERANCE = 1e-4  # max abs difference of finite scores between the exported file and eager PyTorch

# (encoder class, format) -> why it cannot export with torch 2.13 (see the module docstring)
KNOWN_LIMITS: dict[tuple[type[nn.Module], str], str] = {
    (cls, "onnx"): f"{why}; export it with format='torchscript'" for cls, why in ONNX_LIMITS.items()
}


@dataclass
class ExportSpec:
    """What ``model.json`` says about an exported model: its file and tensors, the vocabulary written beside it
    (``{"file": "vocab.parquet", "fingerprint": "sha256:...", "rows": N}``), for a session model that reads side
    features how raw values become its inputs (`side_rules`; None: it reads none, or a DLRM) and the version of
    the model directory exported (None: a directory without versions, or an artifact exported from memory)."""

    format: str
    file: str
    opset: int | None
    model: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    notes: dict[str, object]
    vocab: dict[str, object]
    side_features: dict[str, object] | None
    version: str | None


# -- public functions ----------------------------------------------------------------------------
def export_session_model(
    recommender: SessionRecommender,
    out_dir: str | os.PathLike,
    format: Format = "onnx",
    top_k: int | None = None,
    opset: int | None = None,
    verify: bool = True,
    version: str | None = None,
) -> Path:
    """Write a session model's next-item scorer (`NextItemScorer`), its vocabulary and ``model.json`` into `out_dir`.

    Args:
        recommender: a trained session model (`SessionRecommender.from_pretrained`), read the way its
            objective and inference settings say. Its network is exported in eval mode and left in
            the mode it was in.
        out_dir: directory for ``model.onnx`` / ``model.pt``, ``vocab.parquet``, ``model.json`` and, for a model
            that reads side features, ``side_features.parquet`` (created).
        format: ``onnx`` or ``torchscript``.
        top_k: also output the K best items and their scores.
        opset: ONNX opset; None = the exporter's default (recorded in ``model.json``).
        verify: run the written file on a batch of another size and length than the export
            example, with a session longer than ``max_length`` and an unknown item, and raise
            RuntimeError unless its scores (and top items) match eager PyTorch to `TOLERANCE`
            (needs onnxruntime for ONNX).
        version: the version of the model directory `recommender` was read from, recorded in ``model.json``.

    Returns:
        The path of the model file.

    Raises:
        ValueError: the format is unknown, the encoder cannot be exported to it (the message
            says why, e.g. GRU4Rec to ONNX), the model reads side features without their fitted
            transforms (`side_rules`), or `out_dir` is a saved model or pipeline directory (`check_folder`).
    """
    scorer = NextItemScorer(recommender, top_k)  # refuses anything but a SessionRecommender
    side = side_rules(scorer, recommender)
    model = recommender.model
    encoder = model.encoder
    reason = next((why for (cls, fmt), why in KNOWN_LIMITS.items() if isinstance(encoder, cls) and fmt == format), None)
    if reason is not None:
        raise ValueError(f"{type(encoder).__name__} cannot be exported to {format}: {reason}")
    length = max(2, min(scorer.max_length, 6))  # >= 2: torch.export fixes axes of size 1
    example = scorer.example(3, length, seed=0)
    # checked on what the example lacks: another batch size, a session longer than the model reads (cut as served), an unknown item
    probe = scorer.example(5, scorer.max_length + 3, seed=1, unusual=True)
    return _export(scorer, scorer.forward, example, probe, out_dir, format, opset, verify, type(encoder).__name__,
                   recommender.vocab, version, side)


def export_dlrm(
    ranker: ClickRanker,
    out_dir: str | os.PathLike,
    format: Format = "onnx",
    opset: int | None = None,
    verify: bool = True,
    version: str | None = None,
) -> Path:
    """Write a DLRM's scorer (`ExportedClickScorer`: dense and padded sparse ids -> logits), its vocabulary and ``model.json``.

    Args:
        ranker: a trained click model (`ClickRanker.from_pretrained`); its network is exported in
            eval mode and left in the mode it was in.
        out_dir: directory for ``model.onnx`` / ``model.pt``, ``vocab.parquet`` and ``model.json`` (created).
        format: ``onnx`` or ``torchscript``.
        opset: ONNX opset; None = the exporter's default.
        verify: check the written file against the model's own forward (through `SparseFeatures`)
            on a batch of another size and hotness than the export example.
        version: the version of the model directory `ranker` was read from, recorded in ``model.json``.

    Returns:
        The path of the model file.
    """
    if not isinstance(ranker, ClickRanker):
        raise TypeError(f"export_dlrm exports a ClickRanker, got {type(ranker).__name__}")
    scorer = ExportedClickScorer(ranker)
    example, probe = scorer.example(3, 2, seed=0), scorer.example(7, 4, seed=1)
    return _export(scorer, scorer.eager, example, probe, out_dir, format, opset, verify, "DLRM", ranker.vocab, version)


def export_model_dir(
    model_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    format: Format = "onnx",
    top_k: int | None = None,
    verify: bool = True,
) -> Path:
    """Export the model of a model directory (``runs/<name>/model``): a session model or a DLRM.

    Args:
        model_dir: the model directory (`read_model_dir` reads it: the current version of a versioned one).
        out_dir: directory for the model file, ``vocab.parquet`` and ``model.json``.
        format: ``onnx`` or ``torchscript``.
        top_k: for a session model, also output the K best items.
        verify: check the written file against eager PyTorch (see `export_session_model`).

    Returns:
        The path of the model file.

    Raises:
        ValueError: `out_dir` is `model_dir` or inside it, or a saved model or pipeline directory (before the model
            is read).
        PermissionError: `out_dir` is a file or cannot be written (before the model is read).
    """
    check_folder(out_dir, "--out", [model_dir])
    artifact, version = read_model_dir(model_dir)
    if isinstance(artifact, ClickRanker):
        return export_dlrm(artifact, out_dir, format, verify=verify, version=version)
    return export_session_model(artifact, out_dir, format, top_k=top_k, verify=verify, version=version)


def read_model_dir(model_dir: str | os.PathLike) -> tuple[SessionRecommender | ClickRanker, str | None]:
    """The artifact of a model directory and the name of the version it was read from (None for a directory
    without versions): the pointer is read once, so a promotion meanwhile cannot pair one version's name
    with another's model."""
    folder = versions.resolve(model_dir)
    return load_artifact(folder), versions.version_of(folder)


def side_rules(scorer: NextItemScorer, recommender: SessionRecommender) -> tuple[pa.Table, dict[str, object]] | None:
    """What an export carries of the side features its graph reads (None: it reads none): the categories of each
    categorical feature (``side_features.parquet``) and the ``side_features`` section of ``model.json``, each input's
    rule from raw values (`SideFeatureTransform.rules`), so that a server holding the folder alone builds the inputs
    ``sessrec predict`` builds.

    Raises:
        ValueError: the model reads side features but `recommender` holds no fitted transforms of them.
    """
    names = [*scorer.categorical, *scorer.continuous]
    if not names:
        return None
    if recommender.side_transform is None:
        raise ValueError(f"the model reads the side features {names} but holds no fitted transforms of their raw values "
                         "(a model directory's features.npz): the export could not say how to build its inputs; export "
                         "the model directory sessrec fit wrote")
    table, rules = recommender.side_transform.rules()
    return table, {
        "file": SIDE_FEATURES,
        "sessions": "a session's events in time order (stable); every feature is computed over the whole session, then "
                    "items and features alike are cut to its latest max_length events (the graph cuts a longer one "
                    "itself); padding's values are not read",
        "inputs": {name: rules[name] for name in names},  # in the order of the graph's inputs
    }


# -- helpers -------------------------------------------------------------------------------------
@contextlib.contextmanager
def _eval_mode(module: nn.Module) -> Iterator[None]:
    """Eval mode and no autograd inside; every submodule back in its own mode after."""
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        for m, training in modes:
            m.training = training


STAGE = ".export-"  # an export's hidden folder in `out_dir`: .export-<host>-<pid>-<random> (`stage_name`)


def _export(
    scorer: NextItemScorer | ExportedClickScorer,
    reference: Callable[..., torch.Tensor | tuple[torch.Tensor, ...]],
    example: tuple[torch.Tensor, ...],
    probe: tuple[torch.Tensor, ...],
    out_dir: str | os.PathLike,
    format: str,
    opset: int | None,
    verify: bool,
    what: str,
    vocab: object,
    version: str | None,
    side: tuple[pa.Table, dict[str, object]] | None = None,
) -> Path:
    """Export `scorer` traced on `example`, check it on `probe` against `reference`, write `vocab` (and the side
    features' categories, `side_rules`) beside it and ``model.json`` (recording the vocabulary, the side features'
    rules and `version`). The files are written and checked in a hidden folder inside `out_dir` and moved into place
    only then, an earlier ``model.json`` removed first and the new one moved last: an export that fails (an exporter's
    error, a file that differs from eager PyTorch) leaves `out_dir` as it was, an earlier export in it whole, and no
    `out_dir` where there was none; one stopped among the moves leaves no ``model.json``."""
    if format not in FILES:
        raise ValueError(f"format must be one of {tuple(FILES)}, got {format!r}")
    out = Path(out_dir)
    check_folder(out, "out_dir")  # a file, a folder that refuses a new file, or a saved directory: before the trace
    with new_folders(out):  # a failed export removes the folders it created as well
        remove_abandoned(out, STAGE)
        stage = Path(tempfile.mkdtemp(prefix=f"{stage_name(STAGE)}-", dir=out))
        try:
            path = stage / FILES[format]
            inputs, outputs = scorer.inputs(), scorer.outputs()
            with _eval_mode(scorer):
                try:
                    if format == "onnx":
                        written_opset = _to_onnx(scorer, example, inputs, outputs, path, opset)
                    else:
                        written_opset = _to_torchscript(scorer, example, inputs, path)
                except ModuleNotFoundError:
                    raise  # an extra that is not installed (onnx, onnxscript): the command line names the extra
                except Exception as err:  # the exporters raise many types; one clear line, with the cause chained
                    raise ValueError(f"{what} cannot be exported to {format}: {first_line(err)}") from err
                if verify:
                    _verify(path, format, probe, reference(*probe), what)
            vocab.save(stage / VOCAB)
            if side is not None:
                pq.write_table(side[0], stage / SIDE_FEATURES)
            spec = ExportSpec(format, path.name, written_opset, type(scorer.model).__name__, inputs, outputs,
                              scorer.describe(), {"file": VOCAB, **vocabulary_record(vocab)},
                              None if side is None else side[1], version)
            write_text(path.with_suffix(".json"), json.dumps(asdict(spec), indent=2) + "\n")
            normal_modes(stage)
            written = [path.name, VOCAB, *([SIDE_FEATURES] if side is not None else []), path.with_suffix(".json").name]
            # an earlier export's model.json goes first: an export stopped among the moves (killed) leaves no description
            # beside files of two exports, which it would describe as its own
            (out / written[-1]).unlink(missing_ok=True)
            for name in written:  # model.json last
                os.replace(stage / name, out / name)
            for other in {*FILES.values(), SIDE_FEATURES} - set(written):  # what an export of another run wrote: replaced too
                (out / other).unlink(missing_ok=True)
            fsync_dir(out)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    return out / path.name

def _to_onnx(
    module: nn.Module,
    example: tuple[torch.Tensor, ...],
    inputs: list[TensorSpec],
    outputs: list[TensorSpec],
    path: Path,
    opset: int | None,
) -> int:
    """`to_onnx`, the named axes of `inputs` dynamic, written to `path`; returns the opset written."""
    dims: dict[str, torch.export.Dim] = {}  # one Dim per axis name: inputs that share a name share the axis
    per_input = tuple(
        {i: dims.setdefault(a, torch.export.Dim(a)) for i, a in enumerate(t.shape) if isinstance(a, str)} for t in inputs
    )
    # forward(first, *rest): torch.export sees (first, rest) once rest is not empty
    shapes = (per_input[0], per_input[1:]) if len(per_input) > 1 else per_input
    proto = to_onnx(module, example, [t.name for t in inputs], [t.name for t in outputs], shapes, opset)
    with atomic_path(path) as tmp:
        tmp.write_bytes(proto.SerializeToString())
    return opset_of(proto)


def _dtype_checked(x: torch.Tensor, dtype: torch.dtype, name: str, expected: str) -> torch.Tensor:
    """`x`, or an error naming the input when it is not of `dtype` (scripted: the check stays in a traced file)."""
    if x.dtype != dtype:
        raise ValueError("input " + name + " must be " + expected + " (model.json lists the inputs and their dtypes)")
    return x


class _DtypeChecked(nn.Module):
    """`module` behind a check of each input's dtype against `inputs`: a trace reads any dtype it is given, and
    float32 epoch seconds (multiples of 128 s) or int32 ids would give other scores without an error."""

    def __init__(self, module: nn.Module, inputs: list[TensorSpec]) -> None:
        super().__init__()
        self.module, self.inputs = module, inputs
        self.check = torch.jit.script(_dtype_checked)

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        return self.module(*(self.check(t, getattr(torch, s.dtype), s.name, s.dtype) for t, s in zip(tensors, self.inputs)))


def _to_torchscript(module: nn.Module, example: tuple[torch.Tensor, ...], inputs: list[TensorSpec], path: Path) -> None:
    """torch.jit.trace; shapes stay symbolic (checked by `_verify` on another shape), an input of another dtype
    than `inputs` say is refused."""
    with warnings.catch_warnings():
        # a TracerWarning says a Python value became a constant of the trace: `_verify` runs the file on
        # another shape, which is the check that warning asks for
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        traced = torch.jit.trace(_DtypeChecked(module, inputs), example, check_trace=False)
    with atomic_path(path) as tmp:
        torch.jit.save(traced, str(tmp))


def run_exported(path: str | os.PathLike, *inputs: torch.Tensor) -> list[np.ndarray]:
    """Run an exported file (by its suffix: onnxruntime for ``.onnx``, torch.jit for ``.pt``) on CPU."""
    path = Path(path)
    arrays = [t.detach().cpu() for t in inputs]
    if path.suffix == ".onnx":
        import onnxruntime as ort  # optional: the deploy extra

        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        return session.run(None, {n: a.numpy() for n, a in zip(names, arrays)})
    module = torch.jit.load(str(path), map_location="cpu")
    with torch.no_grad():
        out = module(*arrays)
    return [t.numpy() for t in (out if isinstance(out, tuple) else (out,))]


def _verify(
    path: Path, format: str, probe: tuple[torch.Tensor, ...], expected: torch.Tensor | tuple[torch.Tensor, ...], what: str
) -> None:
    """Raise RuntimeError (and remove the file) unless the file run on `probe` gives `expected` to `TOLERANCE`: its first
    output; with a session scorer's ``top_scores`` and ``top_items``, those too, the items as the eager scores rank them
    (an item whose eager score ties with the expected one's within `TOLERANCE` may take its place)."""
    expected = [t.detach().cpu().numpy() for t in (expected if isinstance(expected, tuple) else (expected,))]
    actual = run_exported(path, *probe)
    diff = max_abs_diff(actual[0], expected[0])
    if len(expected) == 3:  # scores, top_scores, top_items
        ranked = np.take_along_axis(expected[0], actual[2], axis=1)  # the eager scores of the file's top items
        diff = max(diff, max_abs_diff(actual[1], expected[1]), max_abs_diff(ranked, expected[1]))
    if not diff <= TOLERANCE:
        path.unlink(missing_ok=True)
        raise RuntimeError(
            f"the exported {what} ({format}) differs from eager PyTorch by {diff:.3g} (> {TOLERANCE}) on a batch "
            f"of shape {tuple(probe[0].shape)}, other than the export example's: an axis may have been fixed"
        )
