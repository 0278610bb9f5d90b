"""`MerlinSource`: sessions from a Merlin / NVTabular dataset directory, read by its schema's tags.

This is what a Transformers4Rec (T4R) user has: parquet files whose rows are sessions, with the
session's items and per-event features as list columns, and a schema beside them. The schema is
the TensorFlow-Metadata ``Schema`` proto, read with ``tensorflow-metadata`` and protobuf from the
first of the files merlin-core itself looks for: ``.merlin/schema.json`` (merlin-core's JSON form,
whose ``extraMetadata`` entries are ``google.protobuf.Struct`` values written without their
``@type``), ``schema.json`` (the same form, as T4R ships it), ``schema.pbtxt`` (the text form,
including the ``[type.googleapis.com/google.protobuf.Struct] {...}`` form of current protobuf and
the ``type_url``/``value`` form of older NVTabular releases).

Tags are resolved as merlin-core resolves them (`merlin_tags`): names of Merlin's tags are read in
lower case, and the compound tags ``item_id``, ``session_id``, ``user_id`` and ``text_tokenized``
stand for their two parts, so a column tagged ``item`` + ``id`` (what merlin-core writes) is the
item column, as ``schema.select_by_tag(Tags.ITEM_ID)`` finds it. They map to the session table:

- ``item_id`` (one column, a list: ``list`` tag or list dtype): the session's items (``item_id``);
- ``session_id`` (at most one column, one value per row): the session id (``session_id``); row
  numbers when no column has the tag (NVTabular's Groupby leaves its key untagged);
- ``categorical`` or ``continuous`` list columns with one value per item: carried under their own
  names, ready for ``data.side_features.categorical`` / ``.continuous`` (`side_features()` names
  them); a column tagged neither, or one value per session (``user_id``, ``day-first`` ...), is
  not read.

The source's ``virtual`` setting (`VirtualSpec`) names a list column with one value per item whose
values mark non-product events (and the list columns that key them): those become virtual items.

Values are checked file by file, and a refusal names the file, the column and a value: session ids are
integers or text, none null or negative (as an event log's, `check_id`), each on one row of the whole directory
(a session on two rows is refused naming both), and so are item ids but the padding; a column
the schema declares ``INT`` may hold integer-valued doubles (NVTabular's ``ListSlice(pad=True)``
writes padded lists as doubles); they are read as int64, and any other double is refused. Item ids
may be integers or strings (the vocabulary maps either).

Shape letters: N sessions, E events (flat, session after session).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from google.protobuf import json_format, struct_pb2, text_format
from tensorflow_metadata.proto.v0 import schema_pb2

from sessrec.data import frame
from sessrec.data.columns import SchemaError, check_id, no_such
from sessrec.data.schema import VirtualSpec
from sessrec.data.side import SideFeatures
from sessrec.data.sources import SessionSource, SessionSplits, _tail_split

SCHEMA_FILES = (".merlin/schema.json", "schema.json", "schema.pbtxt")  # merlin-core's order
_SPLIT = re.compile(r"^(train|training|valid|validation|test)(?:[_\-.\d].*)?$")  # a folder or file stem naming its split
_SPLIT_NAMES = {"train": "train", "training": "train", "valid": "valid", "validation": "valid", "test": "test"}
_STRUCT_URL = "type.googleapis.com/google.protobuf.Struct"

# merlin.schema.Tags: the values merlin-core knows (read in lower case), and its compound tags
MERLIN_TAGS = frozenset({
    "categorical", "continuous", "list", "sequence", "text", "tokenized", "time", "embedding", "id", "user", "item",
    "session", "context", "target", "regression", "classification", "binary", "multi_class", "user_id", "item_id",
    "session_id", "text_tokenized", "binary_classification", "multi_class_classification",
})
COMPOUND_TAGS = {"user_id": ("user", "id"), "item_id": ("item", "id"), "session_id": ("session", "id"), "text_tokenized": ("text", "tokenized")}


def merlin_tags(tags: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Tags as merlin-core's ``TagSet`` normalises them: its own tags in lower case, compound tags as their parts.

    Examples:
        >>> merlin_tags(["ITEM_ID", "list", "MyTag"])
        ('item', 'id', 'list', 'MyTag')
    """
    out: list[str] = []
    for tag in tags:
        name = tag.lower() if tag.lower() in MERLIN_TAGS else tag
        for part in COMPOUND_TAGS.get(name, (name,)):
            if part not in out:
                out.append(part)
    return tuple(out)


# -- schema ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class MerlinColumn:
    """One feature of a Merlin schema.

    Args:
        name: the parquet column.
        dtype: the schema's ``type`` (``INT``, ``FLOAT``, ``BYTES``), or "" when absent.
        tags: the ``annotation.tag`` values as merlin-core normalises them (`merlin_tags`), sorted.
        is_list: the schema declares several values per row (a ``value_count``, the ``list`` or
            ``sequence`` tag, merlin-core's ``is_list`` or a two-dimensional ``_dims`` shape).
        int_min: the ``int_domain``'s lower bound, when given.
        int_max: the ``int_domain``'s upper bound, when given.
    """

    name: str
    dtype: str = ""
    tags: tuple[str, ...] = ()
    is_list: bool = False
    int_min: int | None = None
    int_max: int | None = None

    def has(self, tag: str) -> bool:
        """Whether the column carries `tag` as merlin-core's ``select_by_tag`` decides (all parts of a compound tag)."""
        return set(merlin_tags([tag])) <= set(self.tags)


@dataclass(frozen=True)
class MerlinSchema:
    """The features of a Merlin schema file and the file they came from."""

    columns: tuple[MerlinColumn, ...]
    path: str = "<schema>"

    def tagged(self, tag: str) -> list[MerlinColumn]:
        """The columns carrying `tag` (compound tags resolved as merlin-core resolves them), in schema order."""
        return [c for c in self.columns if c.has(tag)]

    def item_column(self, name: str | None = None) -> MerlinColumn:
        """The one column tagged ``item_id`` (or ``item`` + ``id``), or the tagged one named `name`.

        Raises:
            SchemaError: no column, or more than one, has the tag; `name` is not one of them.
        """
        items = self.tagged("item_id")
        if name is not None:
            chosen = [c for c in items if c.name == name]
            if not chosen:
                raise SchemaError(f"{self.path}: item_column {name!r} is not tagged item_id (or item + id); the tagged columns are {[c.name for c in items]}")
            return chosen[0]
        if not items:
            raise SchemaError(f"{self.path}: no column is tagged item_id (or item + id); tag the session's item list column, e.g. NVTabular's TagAsItemID")
        if len(items) > 1:
            raise SchemaError(
                f"{self.path}: {len(items)} columns are tagged item_id ({[c.name for c in items]}); "
                "keep the tag on one, or choose one with item_column"
            )
        return items[0]


def read_merlin_schema(path: str | Path) -> MerlinSchema:
    """Read a Merlin schema file: JSON (``.merlin/schema.json``, ``schema.json``) or protobuf text (``schema.pbtxt``).

    Both are parsed into tensorflow-metadata's ``Schema`` proto, JSON with protobuf's
    ``json_format`` (merlin-core's ``extraMetadata`` entries, bare ``Struct`` values, are given
    their ``@type``), text with ``text_format``.

    Examples:
        >>> import tempfile, pathlib
        >>> text = 'feature { name: "item_id-list" type: INT value_count { min: 1 max: 20 } '
        >>> text += 'int_domain { min: 1 max: 500 } annotation { tag: "item" tag: "id" tag: "list" } }'
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "schema.pbtxt"
        >>> _ = p.write_text(text)
        >>> read_merlin_schema(p).item_column()
        MerlinColumn(name='item_id-list', dtype='INT', tags=('id', 'item', 'list'), is_list=True, int_min=1, int_max=500)

    Raises:
        SchemaError: the file does not parse as that proto, or a feature has no name; one line naming the file.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise SchemaError(f"{path}: not UTF-8 text (byte {err.start}); a schema is JSON or protobuf text") from err
    proto = schema_pb2.Schema()
    try:
        if path.suffix == ".json":
            raw = json.loads(text)
            if not isinstance(raw, dict):
                raise SchemaError(f"{path}: expected a JSON object with a 'feature' list, got {type(raw).__name__}")
            json_format.ParseDict(_typed_any(raw), proto)
        else:
            text_format.Parse(text, proto)
    except json.JSONDecodeError as err:
        raise SchemaError(f"{path}: not valid JSON (line {err.lineno}: {err.msg})") from err
    except (json_format.ParseError, text_format.ParseError) as err:
        raise SchemaError(f"{path}: not a TensorFlow-Metadata schema: {' '.join(str(err).split())}") from err
    if not proto.feature:
        raise SchemaError(f"{path}: the schema lists no feature")
    return MerlinSchema(tuple(_column(f, path, i) for i, f in enumerate(proto.feature)), str(path))


def _typed_any(raw: dict[str, Any]) -> dict[str, Any]:
    """merlin-core's JSON with each ``extraMetadata`` entry in protobuf's JSON form of an ``Any`` holding a ``Struct``."""
    for feature in raw.get("feature", []) if isinstance(raw.get("feature"), list) else []:
        annotation = feature.get("annotation") if isinstance(feature, dict) else None
        extra = annotation.get("extraMetadata", annotation.get("extra_metadata")) if isinstance(annotation, dict) else None
        if isinstance(extra, list):
            annotation.pop("extra_metadata", None)
            annotation["extraMetadata"] = [
                e if isinstance(e, dict) and "@type" in e else {"@type": _STRUCT_URL, "value": e} for e in extra
            ]
    return raw


def _column(feature: schema_pb2.Feature, path: Path, index: int) -> MerlinColumn:
    if not feature.name:
        raise SchemaError(f"{path}: feature #{index} has no name")
    tags = tuple(sorted(merlin_tags(list(feature.annotation.tag))))  # a set, as merlin-core holds them
    extra: dict[str, Any] = {}
    for entry in feature.annotation.extra_metadata:
        struct = struct_pb2.Struct()
        if entry.Unpack(struct):
            extra.update(json_format.MessageToDict(struct))
    dims = extra.get("_dims")
    is_list = (
        feature.HasField("value_count") or feature.HasField("value_counts") or bool({"list", "sequence"} & set(tags))
        or extra.get("is_list") is True or (isinstance(dims, list) and len(dims) > 1)
    )
    domain = feature.int_domain if feature.HasField("int_domain") else None
    return MerlinColumn(
        name=feature.name,
        dtype=schema_pb2.FeatureType.Name(feature.type) if feature.type else "",
        tags=tags,
        is_list=is_list,
        int_min=domain.min if domain is not None and domain.HasField("min") else None,
        int_max=domain.max if domain is not None and domain.HasField("max") else None,
    )


# -- source ---------------------------------------------------------------------------------
class MerlinSource(SessionSource):
    """Sessions of a Merlin / NVTabular dataset directory (Transformers4Rec's input), read by schema tags.

    The directory holds its schema (`SCHEMA_FILES`, in that order, at its top, else in a ``train``
    folder: merlin-core writes ``.merlin/schema.json`` and ``schema.pbtxt`` beside the parquet
    files) and parquet files of sessions. Their split is respected:

    - files under a ``train``, ``valid`` or ``test`` folder, or named ``train*.parquet`` ...,
      form those splits; without test files the ``valid`` files are the test set (T4R evaluates on
      them) and validation is the latest `valid_fraction` of the training sessions;
    - with T4R's day folders (every split file under a folder named by an integer: ``1/train.parquet``,
      ``1/valid.parquet``, ``1/test.parquet``, ``2/...``, read in day order), the last day's test files
      (else its valid files) are the test set and, when it has test files, its valid files validate;
      every other file trains, the earlier days' valid and test files included, so no test session is
      from an earlier day than a training session;
    - otherwise every parquet file is read (in natural path order: ``part_2`` before ``part_10``)
      and the sessions, in file order, are split at the end: the last `test_fraction` test, the
      `valid_fraction` before it validation, as `SRGNNSource` splits its training sessions.

    Integer item ids equal to `padding_id` (NVTabular's padding, 0) are dropped with their side
    values (unless `virtual` marks the event), then sessions of fewer than `min_length` products.

    Args:
        path: the dataset directory.
        item_column: which ``item_id``-tagged column holds the sessions, when several have the tag.
        features: the side-feature columns to carry; None: every ``categorical`` or ``continuous``
            list column (other than the items) with one value per item.
        padding_id: the integer item id that marks padding; None keeps every id. String ids have
            no padding.
        min_length: drop sessions with fewer items.
        valid_fraction: latest share of the training sessions held out for validation when the
            directory has no validation files of its own (or uses them as the test set).
        test_fraction: latest share of all sessions tested on when the directory has no split.
        virtual: the list column (one value per item) and its values that mark non-product events, kept
            as virtual items keyed by the `VirtualSpec`'s key columns (list columns too), or dropped after
            the sessions are filtered when it does not keep them; None: every item is a product.

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
        virtual: VirtualSpec | None = None,
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
        self.virtual = virtual

    # -- what the directory holds -----------------------------------------------------------
    def schema(self) -> MerlinSchema:
        """The directory's schema: the first of `SCHEMA_FILES` found at its top, else in its ``train`` folder."""
        if not self.path.is_dir():
            raise no_such(self.path, "dataset directory")
        for folder in (self.path, self.path / "train"):
            for name in SCHEMA_FILES:
                if (folder / name).is_file():
                    return read_merlin_schema(folder / name)
        raise SchemaError(f"{self.path}: no {', '.join(SCHEMA_FILES)} in the directory (or its train folder)")

    def files(self) -> dict[str, list[Path]]:
        """Parquet files by split (``train``/``valid``/``test``; with day folders, `_by_day`'s), or under ``all`` when the
        directory has no split."""
        found = sorted(self.path.rglob("*.parquet"), key=_natural)
        if not found:
            raise SchemaError(f"{self.path}: no parquet file in the dataset directory")
        out: dict[str, list[Path]] = {}
        days: dict[Path, int | None] = {}
        for file in found:
            parts = [*file.relative_to(self.path).parent.parts, file.stem]
            at = next((i for i, p in enumerate(parts) if _SPLIT.match(p.lower())), None)
            split = "all" if at is None else _SPLIT_NAMES[_SPLIT.match(parts[at].lower()).group(1)]
            out.setdefault(split, []).append(file)
            days[file] = next((int(p) for p in parts[:at] if p.isascii() and p.isdigit()), None)
        if "all" in out and len(out) > 1:
            raise SchemaError(
                f"{self.path}: {out['all'][0]} belongs to no split while other files are under train/valid/test; "
                "move it into a split or out of the directory"
            )
        if "all" not in out and any(day is not None for day in days.values()):
            out = self._by_day(out, days)
        if "all" not in out and "train" not in out:
            raise SchemaError(f"{self.path}: the directory has {sorted(out)} files but no training files (train/ or train*.parquet)")
        return out

    def _by_day(self, out: dict[str, list[Path]], days: dict[Path, int | None]) -> dict[str, list[Path]]:
        """T4R's day folders: the last day's test files (else its valid files) are the test set and, with test files,
        its valid files validate; every other file trains (earlier days precede the test day), in day order."""
        undated = next((file for file, day in days.items() if day is None), None)
        if undated is not None:
            dated = next(file for file, day in days.items() if day is not None)
            raise SchemaError(
                f"{self.path}: {dated} is in day folder {days[dated]} while {undated} is in none; put every split "
                "file in a day folder (1/train.parquet, 1/valid.parquet, 2/...) or none"
            )
        last = max(days.values())
        held = {split: [f for f in out.get(split, []) if days[f] == last] for split in ("valid", "test")}
        if not held["valid"] and not held["test"]:
            raise SchemaError(
                f"{self.path}: the last day folder {last} has no valid or test files, so no held-out sessions follow "
                "the training ones; add its valid/test files or remove the day"
            )
        held_out = set(held["valid"] + held["test"])
        split = {"train": [f for f in days if f not in held_out]}  # `days` keeps the natural (day) order
        split.update({name: files for name, files in held.items() if files})
        return split

    def side_features(self, **settings: Any) -> SideFeatures:
        """`SideFeatures` naming the carried columns by their tags (categorical / continuous); `settings` go to it."""
        columns = self._columns(self.schema())[2]
        return SideFeatures(
            categorical=[c.name for c in columns if c.has("categorical")],
            continuous=[c.name for c in columns if not c.has("categorical")],
            **settings,
        )

    # -- reading ----------------------------------------------------------------------------
    def load(self) -> SessionSplits:
        schema = self.schema()
        columns = self._columns(schema)
        parts = {split: [(path, self._read_file(path, schema, *columns)) for path in paths] for split, paths in self.files().items()}
        if columns[1] is not None:
            _check_unique([(path, part.column(frame.SESSION)) for files in parts.values() for path, part in files], columns[1].name)
        read = {split: self._combine(files, columns[1] is None) for split, files in parts.items()}
        source = str(self.path)
        if self.virtual is not None:
            if not any(frame.virtual_flags(table).any() for table in read.values()):
                raise SchemaError(
                    f"{source}: column {self.virtual.column!r} never holds a value of virtual.values {list(self.virtual.values)} "
                    "in the kept sessions, so no event is virtual; give the values the column holds for non-product events"
                )
            if not self.virtual.keep:
                read = {split: frame.drop_virtual(table) for split, table in read.items()}
        if "all" in read:
            rest, test = _tail_split(read["all"], self.test_fraction)
            train, valid = _tail_split(rest, self.valid_fraction / (1.0 - self.test_fraction), str(self.path),
                                       f"valid_fraction {self.valid_fraction:g}")
        elif "test" in read:
            test = read["test"]
            if "valid" in read:
                train, valid = read["train"], read["valid"]
            else:
                train, valid = _tail_split(read["train"], self.valid_fraction, str(self.path),
                                           f"valid_fraction {self.valid_fraction:g}")
        elif "valid" in read:
            test = read["valid"]
            train, valid = _tail_split(read["train"], self.valid_fraction, str(self.path),
                                       f"valid_fraction {self.valid_fraction:g}")
        else:
            raise SchemaError(f"{source}: training files but no valid or test files; add valid/ (or test/) parquet files")
        for name, part in (("training", train), ("test", test)):
            if part.num_rows == 0:
                raise SchemaError(f"{source}: the {name} split has no session of {self.min_length} or more items")
        return SessionSplits(train=train, valid=valid, test=test, source=source)

    def _columns(self, schema: MerlinSchema) -> tuple[MerlinColumn, MerlinColumn | None, list[MerlinColumn]]:
        item = schema.item_column(self.item_column)
        sessions = [c for c in schema.tagged("session_id") if c.name != item.name]
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
                if c.is_list and c.name != item.name and (c.has("categorical") or c.has("continuous"))
            ]
        reserved = {frame.SESSION, frame.ITEMS, frame.TIMES, frame.VIRTUAL, frame.TARGETABLE}
        clash = [c.name for c in side if c.name in reserved]
        if clash:
            raise SchemaError(f"{schema.path}: side feature {clash[0]!r} has a name sessrec reserves {sorted(reserved)}; rename the column")
        return item, session, side

    def _combine(self, files: list[tuple[Path, pa.Table]], numbered: bool) -> pa.Table:
        """The sessions of a split's files (`_read_file`, file by file) in one table, of `min_length` items or more;
        `numbered`: the files have no session id column, so sessions are numbered by row across the files."""
        paths, parts = [path for path, _ in files], [part for _, part in files]
        where = str(paths[0]) if len(paths) == 1 else f"{paths[0].parent} ({len(paths)} files)"
        try:
            table = pa.concat_tables(parts, promote_options="permissive") if len(parts) > 1 else parts[0]
        except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
            raise SchemaError(f"{where}: the files' columns have types that do not combine: {' '.join(str(err).split())}") from err
        if numbered:  # row numbers across the split's files
            table = table.set_column(0, frame.SESSION, pa.array(np.arange(table.num_rows)))
        return frame.filter_lengths(table, self.min_length)

    def _read_file(
        self, path: Path, schema: MerlinSchema, item: MerlinColumn, session: MerlinColumn | None, side: list[MerlinColumn]
    ) -> pa.Table:
        marking = [c for c in (self.virtual.columns if self.virtual else []) if c != item.name]
        wanted = list(dict.fromkeys([item.name, *([session.name] if session else []), *(c.name for c in side), *marking]))
        try:
            names = pq.read_schema(path).names
            missing = [c for c in wanted if c not in names]
            table = None if missing else pq.read_table(path, columns=wanted)
        except (pa.ArrowInvalid, OSError) as err:
            raise SchemaError(f"{path}: cannot be read as parquet: {' '.join(str(err).split())}") from err
        if table is None:
            why = "named by the source's virtual setting" if missing[0] in marking else f"tagged in {schema.path}"
            raise SchemaError(f"{path}: column {missing[0]!r}, {why}, is missing; the file has columns {names}")
        items = table.column(item.name)
        if not (pa.types.is_list(items.type) or pa.types.is_large_list(items.type)):
            raise SchemaError(
                f"{path}: the item_id column {item.name!r} has dtype {items.type} (e.g. {_first(items)!r}), expected a list of "
                "items per session (group the events into sessions first, e.g. NVTabular's Groupby with 'list' aggregation)"
            )
        values, offsets = frame.list_offsets(items)
        values = _values(values, item, path, schema)
        virtual = np.zeros(len(values), dtype=bool)
        if self.virtual is not None:
            events = pa.table({c: self._per_item(table, c, offsets, path) for c in self.virtual.columns})
            virtual = self.virtual.marks(events, str(path))
        products = values.filter(pa.array(~virtual))
        if not (pa.types.is_integer(values.type) or pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
            raise SchemaError(f"{path}: column {item.name!r} holds {values.type} item ids (e.g. {_first(values)!r}); item ids are integers or strings")
        if products.null_count:
            at = np.flatnonzero(~virtual)[int(np.flatnonzero(products.is_null().to_numpy(zero_copy_only=False))[0])]
            row = int(np.searchsorted(offsets, at, side="right") - 1)
            raise SchemaError(f"{path}: column {item.name!r} has a null item id (None) in row {row}; fill or drop it")
        keep = np.ones(len(values), dtype=bool)
        if self.padding_id is not None and pa.types.is_integer(values.type) and len(values):
            keep = pc.not_equal(values, pa.scalar(self.padding_id, values.type)).fill_null(True).to_numpy(zero_copy_only=False)
            keep |= virtual
        session_of = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
        if pa.types.is_signed_integer(values.type):  # the products kept refused as an event log's are (a negative id)
            kept = keep & ~virtual
            check_id(pa.table({item.name: values.filter(pa.array(kept))}), item.name, str(path), session_of[kept])
        if self.virtual is not None:
            values = self.virtual.items(events, pa.chunked_array([products], products.type), virtual)
        counts = np.bincount(session_of[keep], minlength=len(offsets) - 1)
        new_offsets = pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
        mask = pa.array(keep)
        ids = check_id(table, session.name, str(path)).combine_chunks() if session else pa.array(np.arange(table.num_rows))
        out = {frame.SESSION: ids, frame.ITEMS: pa.ListArray.from_arrays(new_offsets, values.filter(mask))}
        for col in side:
            column = table.column(col.name)
            if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)):
                raise SchemaError(f"{path}: side feature {col.name!r} has dtype {column.type} (e.g. {_first(column)!r}), expected a list with one value per item")
            flat, off = frame.list_offsets(column)
            if not np.array_equal(off, offsets):
                row = int(np.flatnonzero(np.diff(off) != np.diff(offsets))[0])
                raise SchemaError(
                    f"{path}: side feature {col.name!r} has {int(np.diff(off)[row])} values in row {row}, "
                    f"where {item.name!r} has {int(np.diff(offsets)[row])} items; list only per-item columns in features"
                )
            out[col.name] = pa.ListArray.from_arrays(new_offsets, _values(flat, col, path, schema).filter(mask))
        if self.virtual is not None:
            out[frame.VIRTUAL] = pa.ListArray.from_arrays(new_offsets, pa.array(virtual).filter(mask))
        return pa.table(out)

    def _per_item(self, table: pa.Table, name: str, offsets: np.ndarray, path: Path) -> pa.Array:
        """The flat values of list column `name` (one value per item), refused when it is not one."""
        column = table.column(name)
        if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)):
            raise SchemaError(f"{path}: column {name!r} (virtual) has dtype {column.type} (e.g. {_first(column)!r}), "
                              "expected a list with one value per item")
        flat, off = frame.list_offsets(column)
        if not np.array_equal(off, offsets):
            row = int(np.flatnonzero(np.diff(off) != np.diff(offsets))[0])
            raise SchemaError(f"{path}: column {name!r} (virtual) has {int(np.diff(off)[row])} values in row {row}, "
                              f"where the items have {int(np.diff(offsets)[row])}")
        return flat


def _values(values: pa.Array, column: MerlinColumn, path: Path, schema: MerlinSchema) -> pa.Array:
    """The flat values of a column; integer-valued doubles as int64 where the schema says INT (NaN as null), other doubles
    refused, and so are those of 2^53 or more in magnitude: past it a double does not hold every integer, so ids written as
    doubles may have been rounded onto one another. Dictionary-encoded values are read as the values they encode."""
    if pa.types.is_dictionary(values.type):
        values = values.cast(values.type.value_type)
    if column.dtype != "INT" or not pa.types.is_floating(values.type):
        return values
    x = values.to_numpy(zero_copy_only=False)
    bad = ~np.isnan(x) & ((~np.isfinite(x)) | (np.floor(x) != x))
    if bad.any():
        raise SchemaError(
            f"{path}: column {column.name!r} holds {float(x[np.flatnonzero(bad)[0]])!r}, not an integer, where {schema.path} "
            f"declares it INT; write integer codes (e.g. Categorify before ListSlice)"
        )
    inexact = ~np.isnan(x) & (np.abs(x) >= 2.0**53)
    if inexact.any():
        raise SchemaError(
            f"{path}: column {column.name!r} holds {float(x[np.flatnonzero(inexact)[0]]):.0f} as a double, where {schema.path} "
            "declares it INT: doubles hold every integer only below 2^53, so ids written as doubles may have been rounded "
            "onto one another; write the column as int64"
        )
    missing = np.isnan(x)  # nulls and NaN: missing values, for the readers' null checks
    return pa.array(np.where(missing, 0, x).astype(np.int64), mask=missing if missing.any() else None)


def _check_unique(files: list[tuple[Path, pa.Array | pa.ChunkedArray]], column: str) -> None:
    """Refuse a session id on two rows of the dataset (`files`: each file's session ids, one per row, in reading order),
    naming both places: which row holds the session is ambiguous, and its recommendations would be written twice.
    Ids of files that differ in kind are compared as text (integer 10 and text "10" are one id)."""
    ids = [np.asarray(a.to_numpy(zero_copy_only=False)) for _, a in files]
    if len({a.dtype.kind for a in ids if len(a)}) > 1:
        ids = [a.astype(str) for a in ids]
    keys = np.concatenate(ids)
    file_of = np.repeat(np.arange(len(ids)), [len(a) for a in ids])
    row_of = np.concatenate([np.arange(len(a)) for a in ids])
    _, first = np.unique(keys, return_index=True)
    again = np.ones(len(keys), dtype=bool)
    again[first] = False
    if not again.any():
        return
    at = int(np.flatnonzero(again)[0])
    before = int(np.flatnonzero(keys[:at] == keys[at])[0])
    (f1, r1), (f2, r2) = (file_of[before], row_of[before]), (file_of[at], row_of[at])
    where = f"rows {r1} and {r2}" if f1 == f2 else f"row {r2}, and in row {r1} of {files[f1][0]}"
    raise SchemaError(
        f"{files[f2][0]}: column {column!r} has session {files[f2][1][int(r2)].as_py()!r} in {where}; "
        "each session needs one row (a Merlin dataset lists a session's events in one row), else which events are the "
        "session's is ambiguous and its recommendations would be written twice: group its events into one row, or "
        "give each session its own id"
    )


def _first(column: pa.Array | pa.ChunkedArray) -> Any:
    """A value of a column, for a message (the first non-null one)."""
    valid = column.drop_null()
    return valid[0].as_py() if len(valid) else None


def _natural(path: Path) -> list[Any]:
    """Sort key putting ``2/`` before ``10/`` (T4R's day folders) and ``part_2`` before ``part_10``."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(path))]
