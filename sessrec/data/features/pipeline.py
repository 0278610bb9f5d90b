"""`FeaturePipeline`: named feature operations run in order, saved to and loaded from one file.

Shape letters: E events (rows).
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from dataclasses import fields
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa

from sessrec.data.array_backend import Array, column_names
from sessrec.saved.atomic import atomic_path
from sessrec.data.features.ops import (
    FORMAT,
    VERSION,
    Categorify,
    CountEncoding,
    FeatureOp,
    HashedCross,
    LogNormalize,
    NotFittedError,
    TargetEncoding,
)
from sessrec.data.features.time import CyclicTime, CyclicTimes, SessionTimeFeatures, SessionTimes

_OPS: dict[str, type[FeatureOp]] = {
    cls.__name__: cls
    for cls in (
        Categorify, CountEncoding, TargetEncoding, LogNormalize, HashedCross, SessionTimeFeatures, CyclicTime
    )
}  # the types a saved pipeline may name; anything else is refused at load


class FeaturePipeline:
    """Named operations run in order; fitted on training data, saved to and loaded from one file.

    Each op sees the input columns plus the outputs of the ops before it (an output shadows an
    input column of the same name), so ``HashedCross`` can cross a ``Categorify`` output.
    Outputs are named after the op; ops with several outputs (`SessionTimes`, `CyclicTimes`)
    give ``<name>_<field>``.

    Example:
        >>> pipe = FeaturePipeline({"cat": Categorify("c"), "n": CountEncoding("c")})
        >>> out = pipe.fit_transform({"c": np.array([4, 4, 9])})
        >>> out["cat"].tolist(), out["n"].tolist()
        ([2, 2, 3], [2, 2, 1])
    """

    def __init__(self, ops: dict[str, FeatureOp]) -> None:
        for name, op in ops.items():
            if not isinstance(op, FeatureOp):
                raise TypeError(f"feature op {name!r} must be a FeatureOp, got {type(op).__name__}")
        self.ops = dict(ops)
        self.fitted = False

    def fit(self, frame: Any) -> FeaturePipeline:
        self.fit_transform(frame)
        return self

    def fit_transform(self, frame: Any) -> dict[str, Array]:
        """Fit every op on the training frame; return its features (target encoding out-of-fold)."""
        out = self._run(frame, fit=True)
        self.fitted = True
        return out

    def transform(self, frame: Any) -> dict[str, Array]:
        if not self.fitted:
            raise NotFittedError("FeaturePipeline is not fitted: call fit() on training data, or load() one")
        return self._run(frame, fit=False)

    def _run(self, frame: Any, fit: bool) -> dict[str, Array]:
        view = _View(frame)
        out: dict[str, Array] = {}
        for name, op in self.ops.items():
            result = op.fit_transform(view) if fit else op.transform(view)
            if isinstance(result, (SessionTimes, CyclicTimes)):
                produced = {f"{name}_{f.name}": getattr(result, f.name) for f in fields(result)}
            else:
                produced = {name: result}
            out.update(produced)
            view.extra.update(produced)
        return out

    def save(self, path: str | os.PathLike) -> Path:
        """Write configs (JSON) and fitted arrays to one ``.npz``, under a temporary name then renamed."""
        if not self.fitted:
            raise NotFittedError("FeaturePipeline is not fitted: nothing to save")
        with atomic_path(path) as tmp, open(tmp, "wb") as fh:
            self._write(fh)
        return Path(path)

    def to_bytes(self) -> bytes:
        """The ``.npz`` `save` writes, in memory (a checkpoint carries it)."""
        if not self.fitted:
            raise NotFittedError("FeaturePipeline is not fitted: nothing to save")
        buffer = io.BytesIO()
        self._write(buffer)
        return buffer.getvalue()

    def _write(self, fh: BinaryIO) -> None:
        spec = [{"name": k, "op": type(op).__name__, "config": op.get_config()} for k, op in self.ops.items()]
        header = json.dumps({"format": FORMAT, "version": VERSION, "ops": spec}, sort_keys=True)
        arrays = {"__pipeline__": np.frombuffer(header.encode(), dtype=np.uint8)}
        for i, op in enumerate(self.ops.values()):
            arrays.update({f"{i}/{key}": np.asarray(value) for key, value in op.get_state().items()})
        np.savez(fh, **arrays)

    @classmethod
    def from_bytes(cls, data: bytes, source: str | os.PathLike) -> FeaturePipeline:
        """Read what `to_bytes` wrote; `source` names it in errors."""
        return cls._from_file(io.BytesIO(data), source)

    @classmethod
    def load(cls, path: str | os.PathLike) -> FeaturePipeline:
        """Read a pipeline written by `save`; a clear error for any other file."""
        return cls._from_file(path, path)

    @classmethod
    def _from_file(cls, file: str | os.PathLike | BinaryIO, path: str | os.PathLike) -> FeaturePipeline:
        arrays, header = _read(file, path)
        ops = {}
        for i, spec in enumerate(header["ops"]):
            name, kind = spec["name"], _OPS.get(spec["op"])
            if kind is None:
                known = sorted(_OPS)
                raise ValueError(f"{path}: op {name!r} has unknown type {spec['op']!r}; known: {known}")
            try:
                op = kind(**spec["config"])
            except (TypeError, ValueError) as err:
                raise ValueError(f"{path}: op {name!r} has a config this version cannot read: {err}") from err
            state = {k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith(f"{i}/")}
            if kind.stateful:
                try:
                    op.set_state(state)
                except KeyError as err:
                    raise ValueError(f"{path}: op {name!r} lacks its fitted array {err}") from err
            ops[name] = op
        pipe = cls(ops)
        pipe.fitted = True
        return pipe


def _read(file: str | os.PathLike | BinaryIO, path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Arrays and JSON header of a saved pipeline (`path` names it in errors)."""
    try:
        with np.load(file, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
        header = json.loads(arrays.pop("__pipeline__").tobytes().decode())
    except (OSError, ValueError, KeyError, AttributeError, zipfile.BadZipFile) as err:
        raise ValueError(f"{path}: not a sessrec feature pipeline ({type(err).__name__}: {err})") from err
    if header.get("format") != FORMAT or header.get("version") != VERSION:
        found = f"{header.get('format')!r} version {header.get('version')!r}"
        raise ValueError(f"{path}: a feature file {found}; this sessrec reads {FORMAT!r} version {VERSION}")
    return arrays, header


class _View:
    """A frame plus the outputs of earlier ops, readable like a dict of columns."""

    def __init__(self, frame: Any) -> None:
        self.frame, self.extra = frame, {}
        self._names = column_names(frame)

    @property
    def columns(self) -> list[str]:
        return list(self.extra) + [n for n in self._names if n not in self.extra]

    def __getitem__(self, name: str) -> Any:
        if name in self.extra:
            return self.extra[name]
        return self.frame.column(name) if isinstance(self.frame, pa.Table) else self.frame[name]
