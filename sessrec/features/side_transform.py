"""`SideFeatureTransform`: the side features of `sessrec.data.side.SideFeatures`, fitted on training sessions.

Categorical columns go through `Categorify`, continuous columns and time features through
`LogNormalize` (those normalised upstream, `SideFeatures.normalized`, through `AsGiven`), positions are counted from the start of each session; one `FeaturePipeline`
holds every fitted table and is saved as ``features.npz`` beside the checkpoint, so that
evaluation and scoring apply exactly the transforms of training.

Shape letters: E events (flat, session after session).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from sessrec.data import frame
from sessrec.data.columns import SchemaError, as_floats
from sessrec.data.side import POSITION, TIME_FEATURES, SideFeatures, SideInfoSpec
from sessrec.data.vocab import NUM_SPECIAL, OOV, PAD
from sessrec.features.feature_pipeline import FeaturePipeline, op_signatures
from sessrec.features.ops import AsGiven, Categorify, LogNormalize
from sessrec.saved.registry import config_of

_FLOAT32_MAX = float(np.finfo(np.float32).max)


class SideFeatureTransform:
    """Fitted transforms from session-table columns to per-event model features.

    Examples:
        >>> sessions = pa.table({"item_id": [[5, 6], [7]], "device": [["mobile", "mobile"], ["desktop"]]})
        >>> side = SideFeatureTransform(SideFeatures(categorical=["device"])).fit(sessions)
        >>> side.transform(sessions)["device"].tolist()
        [2, 2, 3]
    """

    def __init__(self, config: SideFeatures) -> None:
        self.config = config
        self.pipeline = FeaturePipeline(
            {
                **{c: Categorify(c, min_count=config.min_count, nulls=config.nulls) for c in config.categorical},
                **{c: AsGiven(c) if c in config.normalized else LogNormalize(c) for c in [*config.continuous, *config.time]},
            }
        )

    @property
    def fitted(self) -> bool:
        return self.pipeline.fitted

    def fit(self, sessions: pa.Table, source: str = "<sessions>") -> SideFeatureTransform:
        """Fit every transform on the (training) sessions."""
        columns = self._columns(sessions, source)
        for name, op in self.pipeline.ops.items():
            values, present = columns[name]
            try:
                op.fit({name: values if present is None else values[present]})
            except (ValueError, TypeError) as err:
                hint = "; a column normalised upstream goes under side_features.normalized" if isinstance(op, LogNormalize) else ""
                raise SchemaError(f"{source}: side feature {name!r}: {err}{hint}") from err
        self.pipeline.fitted = True
        return self

    def transform(self, sessions: pa.Table, source: str = "<sessions>") -> dict[str, np.ndarray]:
        """Per-event features (E,) by name: int64 ids (categorical) or float32 (continuous, 0 = missing)."""
        if not self.fitted:
            raise ValueError("SideFeatureTransform is not fitted: fit() on the training split, or load() one")
        columns = self._columns(sessions, source)
        out: dict[str, np.ndarray] = {}
        for name in self.config.sequence_features:
            if name == POSITION:
                out[name] = columns[name][0]
                continue
            op = self.pipeline.ops[name]
            values, present = columns[name]
            try:
                if present is None:
                    out[name] = np.asarray(op.transform({name: values}), dtype=np.int64)
                    continue
                given = np.zeros(0)
                if present.any():
                    given = np.asarray(op.transform({name: values[present]}), dtype=np.float64)
            except (ValueError, TypeError) as err:
                raise SchemaError(f"{source}: side feature {name!r}: {err}") from err
            beyond = np.abs(given) > _FLOAT32_MAX  # would read as inf, which the model refuses without naming the value
            if beyond.any():
                row = int(np.flatnonzero(present)[np.flatnonzero(beyond)[0]])
                _, offsets = frame.list_offsets(sessions.column(frame.ITEMS))
                raise SchemaError(
                    f"{source}: column {name!r} has the value {float(values[row])!r} at {_event(sessions, offsets, row)}, "
                    f"beyond the float32 range (magnitude up to {_FLOAT32_MAX:.3g}) the model reads a feature in; "
                    "scale the column"
                )
            dense = np.zeros(len(present), dtype=np.float32)
            dense[present] = given
            out[name] = dense
        return out

    @property
    def spec(self) -> SideInfoSpec:
        """Embedding sizes for the model (item vectors are added by the data module)."""
        categorical = {c: self.pipeline.ops[c].num_ids for c in self.config.categorical}
        if self.config.position:
            categorical[POSITION] = self.config.position + 1
        continuous = [*self.config.continuous, *self.config.time]
        return SideInfoSpec(categorical=categorical, continuous=continuous, looks_ahead=self.config.looks_ahead_features)

    def rules(self) -> tuple[pa.Table, dict[str, dict[str, Any]]]:
        """The fitted transforms as plain data, for a server without sessrec (`sessrec.lifecycle.export` writes them).

        Returns:
            The categories each categorical feature keeps: ``feature``, ``raw`` (the value as text, an integer as
            its decimal text, as `transform` matches integer codes with text ones) and ``id``; and per feature, in
            the order of `spec` (categorical, position, continuous, time), its rule as JSON-ready data: ``kind``,
            the raw ``column`` it reads, how a value becomes the model's input and what a missing one becomes.
        """
        if not self.fitted:
            raise ValueError("SideFeatureTransform is not fitted: fit() on the training split, or load() one")
        cfg, ops = self.config, self.pipeline.ops
        features, raw, ids = [], [], []
        out: dict[str, dict[str, Any]] = {}
        for name in cfg.categorical:
            op = ops[name]
            kept = np.flatnonzero(op.ids_ >= NUM_SPECIAL)
            kept = kept[np.argsort(op.ids_[kept])]
            keys = op.keys_.values
            text = isinstance(keys, pa.Array)
            raw += keys.take(pa.array(kept)).to_pylist() if text else [str(int(v)) for v in keys[kept]]
            features += [name] * len(kept)
            ids += op.ids_[kept].tolist()
            out[name] = {"kind": "categorical", "column": name, "values": "text" if text else "integer",
                         "ids": "the id of the row whose feature is this one and whose raw is the value as text (an "
                                "integer as its decimal text)",
                         "unseen": OOV, "missing": PAD if cfg.nulls == "pad" else "refused", "padding": PAD}
        if cfg.position:
            out[POSITION] = {"kind": "position", "cap": cfg.position,
                             "rule": "1 + min(p, cap - 1), p the 0-based place of the event in its whole session"}
        missing = "0.0 for a null or non-finite (NaN, inf) value"
        for name in [*cfg.continuous, *cfg.time]:
            op = ops[name]
            rule: dict[str, Any] = {"kind": "time", "of": name,
                                    "value": f"{TIME_FEATURES[name].description}, from the event times in seconds; "
                                             "missing where the session has no such event"} \
                if name in cfg.time else {"kind": "continuous", "column": name}
            if isinstance(op, LogNormalize):
                rule.update(transform="log_normalize", mean=op.mean_, std=op.std_,
                            rule="(log(1 + x) - mean) / std in float64, then float32; a negative x is refused")
            else:
                rule.update(transform="as_given", rule="x as float32")
            out[name] = {**rule, "missing": 0.0, "missing_rule": missing}
        table = pa.table({"feature": pa.array(features, pa.string()), "raw": pa.array(raw, pa.string()),
                          "id": pa.array(ids, pa.int64())})
        return table, out

    def save(self, path: str | os.PathLike) -> Path:
        """One ``.npz`` (written under a temporary name, then renamed) with every fitted table."""
        return self.pipeline.save(path)

    @classmethod
    def load(cls, path: str | os.PathLike, config: SideFeatures) -> SideFeatureTransform:
        """The transforms of a file `save` wrote; refused when they are not those `config` builds."""
        return cls(config).load_state_dict(FeaturePipeline.load(path).state_dict(), str(path))

    def state_dict(self) -> dict[str, Any]:
        """The fitted transforms (`FeaturePipeline.state_dict`): what a checkpoint carries."""
        return self.pipeline.state_dict()

    def load_state_dict(self, state: Mapping[str, Any], source: str = "the state dict") -> SideFeatureTransform:
        """Take the fitted transforms of a `state_dict`; returns self.

        Raises:
            ValueError: they are other transforms than this config builds (another recipe's),
                naming `source`.
        """
        if not isinstance(state, Mapping) or "config" not in state:
            raise ValueError(f"{source}: expected the state dict of side-feature transforms (keys 'config' and 'ops')")
        found = op_signatures(state["config"], source)
        expected = op_signatures(config_of(self.pipeline), source)
        if expected != found:
            raise ValueError(
                f"{source}: the saved side features {sorted(found)} do not match the recipe's {sorted(expected)} "
                f"(saved {found}, recipe {expected}); use the recipe the checkpoint was trained with"
            )
        self.pipeline.load_state_dict(state, source)
        return self

    # -- columns --------------------------------------------------------------------------
    def _columns(self, sessions: pa.Table, source: str) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
        """Flat (E,) values of each feature, and a (E,) bool presence mask for continuous ones."""
        cfg = self.config
        _, offsets = frame.list_offsets(sessions.column(frame.ITEMS))
        needed = [*cfg.categorical, *cfg.continuous] + ([frame.TIMES] if cfg.time else [])
        missing = [c for c in needed if c not in sessions.column_names]
        if missing:
            raise SchemaError(
                f"{source}: column {missing[0]!r} is missing for the side features; the sessions have "
                f"columns {sessions.column_names}. Carry it from the source or remove it from side_features."
            )
        out: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
        for name in cfg.categorical:
            values = self._flat(sessions, name, offsets, source)
            if cfg.nulls == "error" and values.null_count:
                row = int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0])
                raise SchemaError(
                    f"{source}: column {name!r} has a null value (None) at {_event(sessions, offsets, row)}; drop or "
                    "fill those rows, or set side_features.nulls: pad (nulls -> padding id 0)"
                )
            if pa.types.is_floating(values.type) or pa.types.is_boolean(values.type):
                bad = values.drop_null()[0].as_py() if len(values.drop_null()) else None
                raise SchemaError(
                    f"{source}: column {name!r} has dtype {values.type} (e.g. {bad!r}); a categorical side feature "
                    "needs integer or string codes: list it under side_features.continuous, or cast it"
                )
            out[name] = (values, None)
        for name in cfg.continuous:
            values = self._flat(sessions, name, offsets, source)
            if not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type) or pa.types.is_null(values.type)):
                bad = values.drop_null()[0].as_py() if len(values.drop_null()) else None
                raise SchemaError(
                    f"{source}: column {name!r} has dtype {values.type} (e.g. {bad!r}); a continuous side "
                    "feature needs numbers: list it under side_features.categorical, or cast it"
                )
            x = as_floats(values)  # an integer beyond 2**53 as the nearest float64; a null as NaN
            if name not in cfg.normalized and (x < 0).any():
                row = int(np.flatnonzero(x < 0)[0])
                raise SchemaError(
                    f"{source}: column {name!r} has a negative value {values[row].as_py()!r} at {_event(sessions, offsets, row)}; a "
                    "continuous side feature is log-normalised and needs values >= 0: a column normalised upstream goes "
                    "under side_features.normalized"
                )
            out[name] = (x, np.isfinite(x))
        if cfg.time:
            t = self._flat(sessions, frame.TIMES, offsets, source).cast(pa.float64()).to_numpy(zero_copy_only=False)
            gap = np.diff(t)  # (E - 1,) seconds between consecutive events
            same = np.ones(len(t), dtype=bool)
            same[offsets[:-1]] = False  # an event that starts its session has no predecessor
            since = np.full(len(t), np.nan)
            since[1:] = gap
            since[~same] = np.nan
            dwell = np.full(len(t), np.nan)
            dwell[:-1] = np.where(same[1:], gap, np.nan)
            for name, x in (("since_prev", since), ("dwell", dwell)):  # as TIME_FEATURES describes them
                if name in cfg.time:
                    out[name] = (x, np.isfinite(x))
        if cfg.position:
            lengths = np.diff(offsets)
            pos = np.arange(offsets[-1]) - np.repeat(offsets[:-1], lengths)
            out[POSITION] = (1 + np.minimum(pos, cfg.position - 1).astype(np.int64), None)
        return out

    @staticmethod
    def _flat(sessions: pa.Table, name: str, offsets: np.ndarray, source: str) -> pa.Array:
        values, off = frame.list_offsets(sessions.column(name))
        if not np.array_equal(off, offsets):
            raise SchemaError(f"{source}: column {name!r} does not hold one value per event of each session")
        return values


def _event(sessions: pa.Table, offsets: np.ndarray, row: int) -> str:
    """Where flat event `row` is: ``event <i> of session <id>`` (the session's position when the table has no ids)."""
    session = int(np.searchsorted(offsets, row, side="right") - 1)
    sid = sessions.column(frame.SESSION)[session].as_py() if frame.SESSION in sessions.column_names else session
    return f"event {row - offsets[session]} of session {sid!r}"
