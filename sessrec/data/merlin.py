"""`MerlinSource`: sessions from a Merlin / NVTabular dataset directory, read by its schema's tags.

This is what a Transformers4Rec (T4R) user has: parquet files whose rows are sessions, with the
session's items and per-event features as list columns, and a schema beside them, either
``schema.json`` (merlin-core's JSON form of the TensorFlow-Metadata schema) or ``schema.pbtxt``
(its protobuf text form, as NVTabular writes it and T4R's examples ship it). The schema is read
without protobuf: `read_merlin_schema` parses the few fields used here (feature ``name``,
``type``, ``value_count``, ``int_domain`` min/max and ``annotation.tag``).

Tags map to the session table as follows:

- ``item_id`` (one column, a list: ``list`` tag or list dtype): the session's items (``item_id``);
- ``session_id`` (at most one column, one value per row): the session id (``session_id``); row
  numbers when no column has the tag;
- ``categorical`` or ``continuous`` list columns with one value per item: carried under their own
  names, ready for ``data.side_features.categorical`` / ``.continuous`` (`side_features()` names
  them); a column tagged neither, or one value per session (``user_id``, ``day_index`` ...), is
  not read.

Shape letters: N sessions, E events (flat, session after session).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sessrec.data import frame
from sessrec.data.schema import SchemaError
from sessrec.data.side import SideFeatures
from sessrec.data.sources import SessionSource, SessionSplits, _tail_split

SCHEMA_FILES = ("schema.json", "schema.pbtxt")
_SPLIT = re.compile(r"^(train|training|valid|validation|test)(?:[_\-.\d].*)?$")  # a folder or file stem naming its split
_SPLIT_NAMES = {"train": "train", "training": "train", "valid": "valid", "validation": "valid", "test": "test"}


# -- schema ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class MerlinColumn:
    """One feature of a Merlin schema.

    Args:
        name: the parquet column.
        dtype: the schema's ``type`` (``INT``, ``FLOAT``, ``BYTES``), or "" when absent.
        tags: the ``annotation.tag`` values, lower case.
        is_list: the schema declares several values per row (a ``value_count``, the ``list`` or
            ``sequence`` tag, or a two-dimensional ``_dims`` shape).
        int_min: the ``int_domain``'s lower bound, when given.
        int_max: the ``int_domain``'s upper bound, when given.
    """

    name: str
    dtype: str = ""
    tags: tuple[str, ...] = ()
    is_list: bool = False
    int_min: int | None = None
    int_max: int | None = None


@dataclass(frozen=True)
class MerlinSchema:
    """The features of a ``schema.json`` / ``schema.pbtxt`` and the file they came from."""

    columns: tuple[MerlinColumn, ...]
    path: str = "<schema>"

    def tagged(self, tag: str) -> list[MerlinColumn]:
        """The columns carrying `tag`, in schema order."""
        return [c for c in self.columns if tag in c.tags]

    def item_column(self, name: str | None = None) -> MerlinColumn:
        """The one column tagged ``item_id`` (or the tagged one named `name`).

        Raises:
            SchemaError: no column, or more than one, has the tag; `name` is not one of them.
        """
        items = self.tagged("item_id")
        if name is not None:
            chosen = [c for c in items if c.name == name]
            if not chosen:
                raise SchemaError(f"{self.path}: item_column {name!r} is not tagged item_id; the tagged columns are {[c.name for c in items]}")
            return chosen[0]
        if not items:
            raise SchemaError(f"{self.path}: no column is tagged item_id; tag the session's item list column 'item_id'")
        if len(items) > 1:
            raise SchemaError(
                f"{self.path}: {len(items)} columns are tagged item_id ({[c.name for c in items]}); "
                "keep the tag on one, or choose one with item_column"
            )
        return items[0]


def read_merlin_schema(path: str | Path) -> MerlinSchema:
    """Read a ``schema.json`` (merlin-core JSON) or ``schema.pbtxt`` (protobuf text format).

    Examples:
        >>> import tempfile, pathlib
        >>> text = 'feature { name: "item_id-list" type: INT value_count { min: 1 max: 20 } '
        >>> text += 'int_domain { min: 1 max: 500 } annotation { tag: "item_id" tag: "list" } }'
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "schema.pbtxt"
        >>> _ = p.write_text(text)
        >>> read_merlin_schema(p).columns[0]
        MerlinColumn(name='item_id-list', dtype='INT', tags=('item_id', 'list'), is_list=True, int_min=1, int_max=500)

    Raises:
        SchemaError: the file does not parse, or a feature has no name; the message names the file.
    """
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as err:
            raise SchemaError(f"{path}: not valid JSON (line {err.lineno}: {err.msg})") from err
        if not isinstance(raw, dict):
            raise SchemaError(f"{path}: expected a JSON object with a 'feature' list, got {type(raw).__name__}")
        features = raw.get("feature", [])
    else:
        features = parse_pbtxt(text, str(path)).get("feature", [])
    if not isinstance(features, list) or not features:
        raise SchemaError(f"{path}: the schema lists no feature")
    return MerlinSchema(tuple(_column(_snake(f), path, i) for i, f in enumerate(features)), str(path))


def _column(feature: Any, path: Path, index: int) -> MerlinColumn:
    if not isinstance(feature, dict) or not isinstance(_one(feature.get("name")), str):
        raise SchemaError(f"{path}: feature #{index} has no name")
    annotation = _one(feature.get("annotation")) or {}
    tags = annotation.get("tag", []) if isinstance(annotation, dict) else []
    tags = tuple(str(t).lower() for t in (tags if isinstance(tags, list) else [tags]))
    domain = _one(feature.get("int_domain")) or {}
    dims = _dims(annotation)
    is_list = bool("value_count" in feature or "value_counts" in feature or {"list", "sequence"} & set(tags)) or (dims is not None and len(dims) > 1)

    def bound(key: str) -> int | None:
        value = _one(domain.get(key)) if isinstance(domain, dict) else None
        try:
            return None if value is None else int(value)
        except (TypeError, ValueError) as err:
            raise SchemaError(f"{path}: feature {_one(feature['name'])!r}: int_domain {key} {value!r} is not an integer") from err

    return MerlinColumn(
        name=_one(feature["name"]),
        dtype=str(_one(feature.get("type")) or ""),
        tags=tags,
        is_list=is_list,
        int_min=bound("min"),
        int_max=bound("max"),
    )


def _dims(annotation: Any) -> list[Any] | None:
    """merlin-core's ``_dims`` shape (in ``annotation.extra_metadata``), when present."""
    extra = annotation.get("extra_metadata") if isinstance(annotation, dict) else None
    for entry in extra if isinstance(extra, list) else [extra]:
        if isinstance(entry, dict) and isinstance(entry.get("_dims"), list):
            return entry["_dims"]
    return None


def _one(value: Any) -> Any:
    """A singular field: the text format gives every field as a list of its occurrences."""
    return value[-1] if isinstance(value, list) and value else (None if isinstance(value, list) else value)


def _snake(value: Any) -> Any:
    """JSON keys as the proto's field names (``intDomain`` -> ``int_domain``), recursively."""
    if isinstance(value, dict):
        return {re.sub(r"(?<!^)(?=[A-Z])", "_", k).lower(): _snake(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_snake(v) for v in value]
    return value


_TOKEN = re.compile(
    r"""\s+|\#[^\n]*|(?P<str>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')|(?P<punct>[{}<>\[\]:,;])|(?P<word>[^\s{}<>\[\]:,;"'\#]+)"""
)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v"}


def _unescape(match: re.Match[str]) -> str:
    """One C-style escape of a text-format string: octal ``\\101``, hex ``\\x41``, ``\\n`` ... or the character itself."""
    code = match.group(1)
    if code[0] in "01234567":
        return chr(int(code, 8))
    if code[0] == "x" and len(code) > 1:
        return chr(int(code[1:], 16))
    return _ESCAPES.get(code, code)


def parse_pbtxt(text: str, source: str = "<pbtxt>") -> dict[str, list[Any]]:
    """Parse protobuf text format into nested dicts: field name -> list of values (one per occurrence).

    Messages (``name { ... }``, ``name: { ... }`` or ``< ... >``) become dicts, strings are
    unescaped (adjacent strings joined), numbers become int or float, other words (enum values,
    ``true``) stay text. Lists (``tag: ["a", "b"]``) add one value per element.

    Raises:
        SchemaError: a syntax error, with the file and line.
    """
    tokens: list[tuple[str, str, int]] = []
    pos, line = 0, 1
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            raise SchemaError(f"{source}:{line}: cannot read {text[pos:pos + 20]!r}")
        kind = match.lastgroup
        if kind is not None:
            tokens.append((kind, match.group(kind), line))
        line += match.group(0).count("\n")
        pos = match.end()
    tokens.append(("end", "", line))
    at = 0

    def fail(expected: str) -> SchemaError:
        kind, value, where = tokens[at]
        return SchemaError(f"{source}:{where}: expected {expected}, got {value!r}" if kind != "end" else f"{source}: expected {expected}, got the end of the file")

    def scalar() -> Any:
        nonlocal at
        kind, value, _ = tokens[at]
        if kind == "str":
            parts = []
            while tokens[at][0] == "str":
                raw = tokens[at][1][1:-1]
                parts.append(re.sub(r"\\([0-7]{1,3}|x[0-9a-fA-F]{1,2}|.)", _unescape, raw))
                at += 1
            return "".join(parts)
        if kind != "word":
            raise fail("a value")
        at += 1
        for convert in (int, float):
            try:
                return convert(value)
            except ValueError:
                pass
        return value

    def message(close: str | None) -> dict[str, list[Any]]:
        nonlocal at
        out: dict[str, list[Any]] = {}
        while True:
            kind, value, _ = tokens[at]
            if close is None and kind == "end":
                return out
            if kind == "punct" and value == close:
                at += 1
                return out
            if kind != "word":
                raise fail("a field name" + (f" or {close!r}" if close else ""))
            name = value
            at += 1
            colon = tokens[at][:2] == ("punct", ":")
            at += colon
            kind, value, _ = tokens[at]
            values = out.setdefault(name, [])
            if kind == "punct" and value in "{<":
                at += 1
                values.append(message("}" if value == "{" else ">"))
            elif not colon:
                raise fail(f"':' or '{{' after {name!r}")
            elif kind == "punct" and value == "[":
                at += 1
                while tokens[at][:2] != ("punct", "]"):
                    if tokens[at][:2] in (("punct", "{"), ("punct", "<")):
                        closing = "}" if tokens[at][1] == "{" else ">"
                        at += 1
                        values.append(message(closing))
                    else:
                        values.append(scalar())
                    if tokens[at][:2] == ("punct", ","):
                        at += 1
                    elif tokens[at][:2] != ("punct", "]"):
                        raise fail("',' or ']'")
                at += 1
            else:
                values.append(scalar())
            if tokens[at][0] == "punct" and tokens[at][1] in ",;":
                at += 1

    return message(None)


# -- source ---------------------------------------------------------------------------------
class MerlinSource(SessionSource):
    """Sessions of a Merlin / NVTabular dataset directory (Transformers4Rec's input), read by schema tags.

    The directory holds ``schema.json`` or ``schema.pbtxt`` (at its top, else in a ``train``
    folder) and parquet files of sessions. Their split is respected:

    - files under a ``train``, ``valid`` or ``test`` folder, or named ``train*.parquet`` ...
      (T4R's day folders ``1/train.parquet``, ``1/valid.parquet``, ``2/...``, read in day order),
      form those splits; without test files the ``valid`` files are the test set (T4R evaluates on
      them) and validation is the latest `valid_fraction` of the training sessions;
    - otherwise every parquet file is read (in path order) and the sessions, in file order, are
      split at the end: the last `test_fraction` test, the `valid_fraction` before it validation,
      as `SRGNNSource` splits its training sessions.

    Item ids equal to `padding_id` (NVTabular's padding, 0) are dropped with their side values,
    then sessions shorter than `min_length` are dropped.

    Args:
        path: the dataset directory.
        item_column: which ``item_id``-tagged column holds the sessions, when several have the tag.
        features: the side-feature columns to carry; None: every ``categorical`` or ``continuous``
            list column (other than the items) with one value per item.
        padding_id: the item id that marks padding; None keeps every id.
        min_length: drop sessions with fewer items.
        valid_fraction: latest share of the training sessions held out for validation when the
            directory has no validation files of its own (or uses them as the test set).
        test_fraction: latest share of all sessions tested on when the directory has no split.

    Examples:
        >>> source = MerlinSource("path/to/t4r_dataset")  # doctest: +SKIP
        >>> source.side_features()  # doctest: +SKIP
        SideFeatures(categorical=['category-list'], continuous=['price-list'], ...)
    """

    def __init__(
        self,
        path: str,
        item_column: str | None = None,
        features: list[str] | None = None,
        padding_id: int | None = 0,
        min_length: int = 2,
        valid_fraction: float = 0.1,
        test_fraction: float = 0.1,
    ) -> None:
        if not 0.0 <= valid_fraction < 1.0 or not 0.0 < test_fraction < 1.0 or valid_fraction + test_fraction >= 1.0:
            raise ValueError(
                f"need 0 <= valid_fraction, 0 < test_fraction and valid_fraction + test_fraction < 1; got {valid_fraction}, {test_fraction}"
            )
        if min_length < 1:
            raise ValueError(f"min_length must be >= 1, got {min_length}")
        self.path, self.item_column = Path(path), item_column
        self.features = None if features is None else list(features)
        self.padding_id, self.min_length = padding_id, min_length
        self.valid_fraction, self.test_fraction = valid_fraction, test_fraction

    # -- what the directory holds -----------------------------------------------------------
    def schema(self) -> MerlinSchema:
        """The directory's schema (``schema.json`` preferred over ``schema.pbtxt``)."""
        if not self.path.is_dir():
            raise FileNotFoundError(f"{self.path}: no such dataset directory")
        for folder in (self.path, self.path / "train"):
            for name in SCHEMA_FILES:
                if (folder / name).is_file():
                    return read_merlin_schema(folder / name)
        raise SchemaError(f"{self.path}: no schema.json or schema.pbtxt in the directory (or its train folder)")

    def files(self) -> dict[str, list[Path]]:
        """Parquet files by split (``train``/``valid``/``test``), or under ``all`` when the directory has no split."""
        found = sorted(self.path.rglob("*.parquet"), key=_natural)
        if not found:
            raise SchemaError(f"{self.path}: no parquet file in the dataset directory")
        out: dict[str, list[Path]] = {}
        for file in found:
            parts = [*file.relative_to(self.path).parent.parts, file.stem]
            split = next((_SPLIT_NAMES[m.group(1)] for p in parts if (m := _SPLIT.match(p.lower()))), "all")
            out.setdefault(split, []).append(file)
        if "all" in out and len(out) > 1:
            raise SchemaError(
                f"{self.path}: {out['all'][0]} belongs to no split while other files are under train/valid/test; "
                "move it into a split or out of the directory"
            )
        if "all" not in out and "train" not in out:
            raise SchemaError(f"{self.path}: the directory has {sorted(out)} files but no training files (train/ or train*.parquet)")
        return out

    def side_features(self, **settings: Any) -> SideFeatures:
        """`SideFeatures` naming the carried columns by their tags (categorical / continuous); `settings` go to it."""
        columns = self._columns(self.schema())[2]
        return SideFeatures(
            categorical=[c.name for c in columns if "categorical" in c.tags],
            continuous=[c.name for c in columns if "categorical" not in c.tags],
            **settings,
        )

    # -- reading ----------------------------------------------------------------------------
    def load(self) -> SessionSplits:
        schema = self.schema()
        files = self.files()
        read = {split: self._read(paths, schema) for split, paths in files.items()}
        source = str(self.path)
        if "all" in read:
            rest, test = _tail_split(read["all"], self.test_fraction)
            train, valid = _tail_split(rest, self.valid_fraction / (1.0 - self.test_fraction))
        elif "test" in read:
            test = read["test"]
            if "valid" in read:
                train, valid = read["train"], read["valid"]
            else:
                train, valid = _tail_split(read["train"], self.valid_fraction)
        elif "valid" in read:
            test = read["valid"]
            train, valid = _tail_split(read["train"], self.valid_fraction)
        else:
            raise SchemaError(f"{source}: training files but no valid or test files; add valid/ (or test/) parquet files")
        for name, part in (("training", train), ("test", test)):
            if part.num_rows == 0:
                raise SchemaError(f"{source}: the {name} split has no session of {self.min_length} or more items")
        return SessionSplits(train=train, valid=valid, test=test, source=source)

    def _columns(self, schema: MerlinSchema) -> tuple[MerlinColumn, MerlinColumn | None, list[MerlinColumn]]:
        item = schema.item_column(self.item_column)
        sessions = schema.tagged("session_id")
        if len(sessions) > 1:
            raise SchemaError(f"{schema.path}: {len(sessions)} columns are tagged session_id ({[c.name for c in sessions]}); keep the tag on one")
        session = sessions[0] if sessions else None
        if session is not None and session.is_list:
            raise SchemaError(f"{schema.path}: the session_id column {session.name!r} is a list; it must hold one id per session")
        if self.features is not None:
            by_name = {c.name: c for c in schema.columns}
            unknown = [f for f in self.features if f not in by_name]
            if unknown:
                raise SchemaError(f"{schema.path}: feature {unknown[0]!r} is not in the schema; its columns are {list(by_name)}")
            side = [by_name[f] for f in self.features]
        else:
            side = [
                c for c in schema.columns
                if c.is_list and c.name != item.name and ({"categorical", "continuous"} & set(c.tags))
            ]
        reserved = {frame.SESSION, frame.ITEMS, frame.TIMES, frame.VIRTUAL, frame.TARGETABLE}
        clash = [c.name for c in side if c.name in reserved]
        if clash:
            raise SchemaError(f"{schema.path}: side feature {clash[0]!r} has a name sessrec reserves {sorted(reserved)}; rename the column")
        return item, session, side

    def _read(self, paths: list[Path], schema: MerlinSchema) -> pa.Table:
        """The sessions of some parquet files: ``session_id``, ``item_id`` and the side-feature lists."""
        item, session, side = self._columns(schema)
        wanted = [item.name, *([session.name] if session else []), *(c.name for c in side)]
        parts = []
        for path in paths:
            try:
                names = pq.read_schema(path).names
                missing = [c for c in wanted if c not in names]
                if not missing:
                    parts.append(pq.read_table(path, columns=wanted))
            except (pa.ArrowInvalid, OSError) as err:
                raise SchemaError(f"{path}: cannot be read as parquet: {err}") from err
            if missing:
                raise SchemaError(f"{path}: column {missing[0]!r}, tagged in {schema.path}, is missing; the file has columns {names}")
        where = str(paths[0]) if len(paths) == 1 else f"{paths[0].parent} ({len(paths)} files)"
        try:
            table = pa.concat_tables(parts, promote_options="permissive") if len(parts) > 1 else parts[0]
        except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
            raise SchemaError(f"{where}: the files' columns have types that do not combine: {err}") from err
        items = table.column(item.name)
        if not (pa.types.is_list(items.type) or pa.types.is_large_list(items.type)):
            raise SchemaError(
                f"{where}: the item_id column {item.name!r} has dtype {items.type}, expected a list of items per session "
                "(group the events into sessions first, e.g. NVTabular's Groupby with 'list' aggregation)"
            )
        values, offsets = frame.list_offsets(items)
        if values.null_count:
            raise SchemaError(f"{where}: column {item.name!r} has a null item id; fill or drop it")
        keep = np.ones(len(values), dtype=bool)
        if self.padding_id is not None and len(values):
            keep = pc.not_equal(values, pa.scalar(self.padding_id, values.type)).to_numpy(zero_copy_only=False)
        session_of = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
        counts = np.bincount(session_of[keep], minlength=len(offsets) - 1)
        new_offsets = pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
        mask = pa.array(keep)
        ids = table.column(session.name).combine_chunks() if session else pa.array(np.arange(table.num_rows))
        out = {frame.SESSION: ids, frame.ITEMS: pa.ListArray.from_arrays(new_offsets, values.filter(mask))}
        for col in side:
            column = table.column(col.name)
            if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)):
                raise SchemaError(f"{where}: side feature {col.name!r} has dtype {column.type}, expected a list with one value per item")
            flat, off = frame.list_offsets(column)
            if not np.array_equal(off, offsets):
                row = int(np.flatnonzero(np.diff(off) != np.diff(offsets))[0])
                raise SchemaError(
                    f"{where}: side feature {col.name!r} has {int(np.diff(off)[row])} values in row {row}, "
                    f"where {item.name!r} has {int(np.diff(offsets)[row])} items; list only per-item columns in features"
                )
            out[col.name] = pa.ListArray.from_arrays(new_offsets, flat.filter(mask))
        return frame.filter_lengths(pa.table(out), self.min_length)


def _natural(path: Path) -> list[Any]:
    """Sort key putting ``2/`` before ``10/`` (T4R's day folders)."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(path))]
