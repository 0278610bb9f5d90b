"""`FeaturePipeline`: named feature operations run in order, saved to and loaded from one file.

Its config is its operations' configs (``{"class_path", "init_args"}`` each, `config_of`); what
they learned is its `state_dict`. The file is one ``.npz``: a JSON header (format, version,
config) and every operation's fitted arrays under ``<position>/<name>``. Loading builds only
registered `FeatureOp` classes (`sessrec.saved.registry`) and unpickles nothing. A file of another
version is refused in one line naming its version.

Shape letters: E events (rows).
"""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Collection, Iterator, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa

from sessrec.features.backend import Array, column_names
from sessrec.features.ops import FORMAT, FeatureOp, NotFittedError
from sessrec.features.time import CyclicTimes, SessionTimes
from sessrec.saved.atomic import atomic_path
from sessrec.saved.registry import ConfigError, Configurable, config_of, instantiate

VERSION = 2


class FeaturePipeline(Configurable):
    """Named operations run in order; fitted on training data, saved to and loaded from one file.

    Each op sees the input columns plus the outputs of the ops before it (an output shadows an
    input column of the same name), so ``HashedCross`` can cross a ``Categorify`` output.
    Outputs are named after the op; ops with several outputs (`SessionTimes`, `CyclicTimes`)
    give ``<name>_<field>``.

    Examples:
        >>> import numpy as np
        >>> from sessrec.features import Categorify, CountEncoding
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

    def transform(self, frame: Any, skip: Collection[str] = ()) -> dict[str, Array]:
        """The features of the fitted ops, but those named in `skip` (whose outputs the caller has)."""
        if not self.fitted:
            raise NotFittedError("FeaturePipeline is not fitted: call fit() on training data, or load() one")
        return self._run(frame, fit=False, skip=skip)

    def _run(self, frame: Any, fit: bool, skip: Collection[str] = ()) -> dict[str, Array]:
        view = _View(frame)
        out: dict[str, Array] = {}
        for name, op in self.ops.items():
            if name in skip:
                continue
            result = op.fit_transform(view) if fit else op.transform(view)
            if isinstance(result, (SessionTimes, CyclicTimes)):
                produced = {f"{name}_{f.name}": getattr(result, f.name) for f in fields(result)}
            else:
                produced = {name: result}
            out.update(produced)
            view.extra.update(produced)
        return out

    # -- state ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``{"config": the ops' configs (plain data), "ops": {name: the op's fitted arrays}}``.

        The config travels with the arrays so that `load_state_dict` refuses the state of other
        operations, and so that a holder whose operations are chosen when fitting
        (`sessrec.pipeline.CandidateFeatures`) rebuilds them from it.
        """
        if not self.fitted:
            raise NotFittedError("FeaturePipeline is not fitted: nothing to save")
        return {"config": config_of(self), "ops": {name: op.state_dict() for name, op in self.ops.items()}}

    def load_state_dict(self, state: Mapping[str, Any], source: str = "the state dict") -> FeaturePipeline:
        """Take the fitted arrays of a `state_dict` of the same operations; returns self.

        Raises:
            ValueError: the state holds other operations (names, classes or arguments), or lacks
                an array of one; the message names `source`.
        """
        if not isinstance(state, Mapping) or not {"config", "ops"} <= state.keys():
            raise ValueError(f"{source}: expected a feature pipeline's state dict (keys 'config' and 'ops')")
        found, expected = op_signatures(state["config"], source), op_signatures(config_of(self), source)
        if found != expected:
            raise ValueError(f"{source}: holds the state of the feature ops {found}, not of these {expected}")
        arrays = state["ops"] if isinstance(state["ops"], Mapping) else {}
        for name, op in self.ops.items():
            try:
                op.load_state_dict(arrays.get(name, {}))
            except KeyError as err:
                raise ValueError(f"{source}: op {name!r} lacks its fitted array {err}") from None
        self.fitted = True
        return self

    # -- the file -------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> Path:
        """Write the config (JSON) and the fitted arrays to one ``.npz``, under a temporary name then renamed."""
        state = self.state_dict()
        header = json.dumps({"format": FORMAT, "version": VERSION, "config": state["config"]})  # ops in their order
        arrays = {"__pipeline__": np.frombuffer(header.encode(), dtype=np.uint8)}
        for i, name in enumerate(self.ops):
            arrays.update({f"{i}/{key}": np.asarray(value) for key, value in state["ops"][name].items()})
        with atomic_path(path) as tmp, open(tmp, "wb") as fh:
            np.savez(fh, **arrays)
        return Path(path)

    @classmethod
    def load(cls, file: str | os.PathLike | BinaryIO, source: str | os.PathLike | None = None) -> FeaturePipeline:
        """Read a file written by `save` (a path, or an open binary file named by `source`); a clear
        error for any other file."""
        source = str(file if source is None else source)
        arrays, header = _read(file, source)
        config = header.get("config")
        try:
            pipeline = instantiate(config, expected=cls, source=source, key="config")
        except ConfigError as err:
            raise ValueError(str(err)) from None
        ops = {name: {k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith(f"{i}/")}
               for i, name in enumerate(pipeline.ops)}
        return pipeline.load_state_dict({"config": config_of(pipeline), "ops": ops}, source)


def op_signatures(config: Any, source: str) -> dict[str, str]:
    """Op name -> ``ClassName({arguments as JSON})`` of a feature pipeline's config (`config_of`), for
    comparing two of them; one line naming `source` for anything else."""
    try:
        ops = config["init_args"]["ops"]
        return {name: f"{op['class_path'].rpartition('.')[2]}({json.dumps(op.get('init_args') or {}, sort_keys=True)})"
                for name, op in ops.items()}
    except (KeyError, TypeError, AttributeError):
        raise ValueError(f"{source}: the feature pipeline's config is not a FeaturePipeline config") from None


def _read(file: str | os.PathLike | BinaryIO, source: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Arrays and JSON header of a saved pipeline (`source` names it in errors)."""
    try:
        with np.load(file, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
        header = json.loads(arrays.pop("__pipeline__").tobytes().decode())
    except (OSError, ValueError, KeyError, AttributeError, zipfile.BadZipFile) as err:
        raise ValueError(f"{source}: not a sessrec feature pipeline ({type(err).__name__}: {err})") from err
    if not isinstance(header, dict) or header.get("format") != FORMAT or header.get("version") != VERSION:
        found = f"{header.get('format')!r} version {header.get('version')!r}" if isinstance(header, dict) else "another file"
        raise ValueError(f"{source}: a feature file {found}; this sessrec reads {FORMAT!r} version {VERSION}: "
                         "fit the features again with sessrec fit")
    return arrays, header


class _View(Mapping):
    """A frame plus the outputs of earlier ops: a mapping of columns (`get_column` finds one without listing them)."""

    def __init__(self, frame: Any) -> None:
        self.frame, self.extra = frame, {}
        self._names = column_names(frame)

    @property
    def columns(self) -> list[str]:
        return list(self.extra) + [n for n in self._names if n not in self.extra]

    def __iter__(self) -> Iterator[str]:
        return iter(self.columns)

    def __len__(self) -> int:
        return len(self.columns)

    def __contains__(self, name: object) -> bool:
        return name in self.extra or name in self._names

    def __getitem__(self, name: str) -> Any:
        if name in self.extra:
            return self.extra[name]
        return self.frame.column(name) if isinstance(self.frame, pa.Table) else self.frame[name]
