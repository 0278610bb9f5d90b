"""Readers for the public session datasets' real formats, into Arrow tables.

- `read_events`: event logs (one row per interaction) in CSV/TSV (plain or compressed: .gz, .bz2, .zst, .lz4) or parquet,
  validated against a `Schema` (YOOCHOOSE/rsc15, DIGINETICA, trivago RecSys'19).
- `sessrec.data.srgnn.read_srgnn`: the SR-GNN/GCE-GNN pickles.
- `read_user_sequences`: one sequence per user, either ``user item`` pairs per line (SASRec,
  BERT4Rec) or ``user item item ...`` per line (S3-Rec).
"""

from __future__ import annotations

import codecs
import gzip
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from sessrec.data.columns import (
    BEYOND_INT64,
    MISSING_ADVICE,
    MissingIdError,
    SchemaError,
    first_failing_cast,
    first_not_decimal,
    missing_marker,
    no_such,
)
from sessrec.data.schema import Schema
from sessrec.data.times import (
    PLAUSIBLE_SECONDS,
    UNIT_WORDS,
    TimeUnit,
    check_plausible,
    parse_time_strings,
    shown_times,
)

NULL_VALUES = ["", "NA", "NaN", "null", "None"]  # what a CSV field holds for a missing value
BLOCK_BYTES = 1 << 20  # a text file's block, read at once; the first decides the column types (`first_block`)


# the first bytes of a compressed stream, by the extension that names its codec
MAGIC = {b"\x1f\x8b": ".gz", **{b"BZh%d" % level: ".bz2" for level in range(1, 10)}, b"\x28\xb5\x2f\xfd": ".zst",
         b"\x04\x22\x4d\x18": ".lz4"}


def compression(path: str | Path) -> str | None:
    """The codec Arrow's CSV readers decompress `path` with, named by its extension (``gzip`` for ``.gz``, ``bz2``,
    ``zstd`` for ``.zst``, ``lz4``), or None for a plain file. A file without a codec's extension that starts as a
    compressed stream does (a gzipped log named ``.csv``) is refused naming the extension to give it, since it would
    be parsed as text; so is a UTF-16 text file (Arrow reads UTF-8 only)."""
    try:
        return pa.Codec.detect(str(path)).name
    except (TypeError, ValueError):  # no codec's extension
        pass
    path = Path(path)
    if path.is_file():
        with open(path, "rb") as f:
            head = f.read(4)
        for magic, suffix in MAGIC.items():
            if head.startswith(magic) and not _is_parquet(path):
                raise SchemaError(f"{path}: the file is compressed ({suffix}) but its name does not end in {suffix}, so it "
                                  f"would be read as plain text; rename it {path.name}{suffix}")
        if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)) and not _is_parquet(path):
            raise SchemaError(f"{path}: the file is UTF-16 text (it starts with a UTF-16 byte-order mark, as Excel's "
                              "'Unicode text' does); text files are read as UTF-8: re-encode it (iconv -f UTF-16 -t UTF-8)")
    return None


def open_binary(path: Path):
    """`path` opened for reading bytes, decompressed as Arrow's CSV readers decompress it (`compression`)."""
    codec = compression(path)
    if codec == "gzip":
        return gzip.open(path, "rb")
    return open(path, "rb") if codec is None else pa.input_stream(str(path), compression=codec)


def _open_text_head(path: Path, n: int = 4096) -> str:
    """The first `n` bytes of a text file (plain, or compressed as `compression` names), as text. A compressed file cut
    short gives what it holds before the cut: reading the file then refuses it in one line naming it, wherever it was cut."""
    codec = compression(path)  # Arrow's streams raise OSError where gzip raises EOFError or zlib.error
    broken = (EOFError, zlib.error) if codec in (None, "gzip") else (EOFError, zlib.error, OSError)
    head = b""
    with open_binary(path) as f:
        try:
            while len(head) < n:
                part = f.read1(n - len(head))
                if not part:
                    break
                head += part
        except broken:  # a truncated or corrupt stream: the reader names the file
            pass
    return head.decode("utf-8", errors="replace")


JSON_SUFFIXES = (".json", ".jsonl", ".ndjson")  # JSON (lines), which no reader of event logs reads


def _sniff_delimiter(path: Path) -> str:
    """The field separator of a text file's header line (tab, semicolon, comma or bar: the most frequent); a JSON
    file (by its extension, under a compression's) is refused naming it, as no event log reader reads JSON."""
    path = Path(path)
    if (path.with_suffix("") if compression(path) else path).suffix in JSON_SUFFIXES:
        raise SchemaError(f"{path}: a JSON file; event logs are read from CSV/TSV files (plain or compressed) and parquet: "
                          "convert it (pyarrow.json.read_json, then pyarrow.parquet.write_table)")
    first = _open_text_head(path).splitlines()[0] if _open_text_head(path) else ""
    counts = {d: first.count(d) for d in ("\t", ";", ",", "|")}
    best = max(counts, key=counts.get)
    return best if counts[best] else ","


def check_delimiter(delimiter: str | None, owner: str) -> None:
    """Refuse a text-file separator that is not one character (Arrow's CSV reader takes one), naming `owner` and the
    value: ``'\\t'``, a tab written in single quotes in YAML, is two characters."""
    if delimiter is not None and len(delimiter) > 1:
        tab = ('; a tab is "\\t" in double quotes in YAML (in single quotes it is a backslash and a t)'
               if delimiter == "\\t" else "")
        raise ValueError(f"{owner}: delimiter must be one character (or null to find it from the header line), got "
                         f"{delimiter!r}{tab}")


def _is_parquet(path: Path) -> bool:
    return ".parquet" in path.name or path.suffix == ".pq"


def parquet_metadata(path: str | Path) -> pq.FileMetaData:
    """The footer of a parquet file; a file that is not one (empty, cut short, another format) is refused in one line
    naming it, as `read_table` refuses it."""
    try:
        return pq.read_metadata(path)
    except (pa.ArrowInvalid, OSError) as err:
        raise SchemaError(f"{path}: cannot be read as parquet: {err}") from err


def read_table(
    path: str | Path,
    delimiter: str | None = None,
    columns: list[str] | None = None,
    string_columns: list[str] | None = None,
    id_columns: list[str] | None = None,
) -> pa.Table:
    """Read a CSV/TSV (plain or compressed, `compression`) or parquet file into Arrow; errors name the file.

    Args:
        path: the file.
        delimiter: field separator of a text file; sniffed from the header when None.
        columns: read only these columns.
        string_columns: columns of a text file read as text, not inferred (ids beyond int64, categorical codes).
        id_columns: columns of ids of a text file: those whose first block holds integers are read as
            integers written as their decimals (`integer_columns`, `integer_ids`), the others inferred.
    """
    path = Path(path)
    if not path.exists():
        raise no_such(path)
    if path.is_dir():
        raise SchemaError(f"{path}: is a folder, expected a CSV/TSV or parquet file")
    try:
        if _is_parquet(path):
            return pq.read_table(path, columns=columns)
        compression(path)  # a compressed file misnamed as plain text is refused
        delim = delimiter or _sniff_delimiter(path)
        parse = pacsv.ParseOptions(delimiter=delim)
        integers = integer_columns(first_block(path, parse), id_columns or []) if id_columns else []
        convert = pacsv.ConvertOptions(
            include_columns=columns,
            column_types={c: pa.string() for c in [*(string_columns or []), *integers]},
            null_values=NULL_VALUES,
            strings_can_be_null=True,
        )
        table = pacsv.read_csv(path, read_options=pacsv.ReadOptions(block_size=BLOCK_BYTES), parse_options=parse,
                               convert_options=convert)
    except (pa.ArrowInvalid, OSError, UnicodeDecodeError) as err:
        raise SchemaError(f"{path}: cannot be read as {'parquet' if _is_parquet(path) else 'CSV'}: {err}") from err
    return integer_ids(table, integers, str(path))


def first_block(path: str | Path, parse: pacsv.ParseOptions) -> pa.Schema:
    """The column types Arrow infers from the first block (`BLOCK_BYTES`) of a text file, as every reader's `read_csv`
    and `open_csv` infer them."""
    return pacsv.open_csv(path, read_options=pacsv.ReadOptions(block_size=BLOCK_BYTES), parse_options=parse,
                          convert_options=pacsv.ConvertOptions(null_values=NULL_VALUES, strings_can_be_null=True)).schema


def integer_columns(inferred: pa.Schema, id_columns: list[str]) -> list[str]:
    """The `id_columns` of a text file whose first block (`inferred`, `first_block`) holds integers, or decimals. Read as
    text, `integer_ids` makes them integers: Arrow's own reading takes ``01050`` and ``0x41a`` for 1050 (one item with
    ``1050``), and a later block's text for a cause to read the whole column as text (`read_csv`) or to fail
    (`open_csv`); read as numbers, a column with one ``3.5`` would be refused naming its first value (``10.0`` for
    ``10``) and a 20-digit id as the double it rounds to, where `integer_ids` names the text of the file."""
    return [c for c in id_columns if inferred.names.count(c) == 1
            and (pa.types.is_integer(inferred.field(c).type) or pa.types.is_floating(inferred.field(c).type))]


def number_columns(inferred: pa.Schema, schema: Schema) -> list[str]:
    """The schema's number columns (`Schema.number_columns`) that the first block of a text file (`inferred`) holds
    integers in. A streamed reader (`open_csv`, a dask piece), typed by the first block, would refuse a decimal in a
    later block: it reads them as text, and `read_numbers` reads each batch's as the numbers written there."""
    return [c for c in schema.number_columns if inferred.names.count(c) == 1 and pa.types.is_integer(inferred.field(c).type)]


def read_numbers(table: pa.Table, names: list[str]) -> pa.Table:
    """`table` with its text columns `names` (`number_columns`) as int64 where every value of the batch is an
    integer, else as float64 (the type `read_csv` gives a column that holds a decimal), so that a message quotes a
    time as the file writes it (``1240``, not ``1240.0``); a column holding text that is no number stays text, for
    `Schema.validate` to name its first such value and its row. Validated, they are the same float64 numbers."""
    for name in names:
        at = table.schema.get_field_index(name)  # -1: absent, or twice (refused by `Schema.validate`)
        if at < 0:
            continue
        for kind in (pa.int64(), pa.float64()):
            try:
                table = table.set_column(at, name, pc.cast(table.column(at), kind))
                break
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                continue
    return table


_AS_TEXT = "read the ids as text (the schema's string_ids: true)"


def integer_ids(table: pa.Table, names: list[str], source: str, first_row: int = 0) -> pa.Table:
    """`table` with its text columns `names` (`integer_columns`) as int64, each id read only as the decimal
    it is written as (spaces around it aside); a one-line SchemaError naming `source`, the column, the
    value and its file row for an id written otherwise (``01050``, ``0x41a``), one that is no integer,
    and one beyond int64."""
    for name in names:
        if name not in table.column_names:
            continue
        col = table.column(name)
        text = pc.utf8_trim_whitespace(col)
        bad = first_failing_cast(text, pa.int64())
        if bad is not None:
            value, row = col[bad].as_py(), first_row + bad
            if missing_marker(text.slice(bad, 1))[0]:
                raise SchemaError(f"{source}: column {name!r} has a missing id {value!r} at row {row}; {MISSING_ADVICE}")
            if text[bad].as_py() == name:  # as `Schema.validate` refuses it where the ids are text
                raise SchemaError(f"{source}: row {row} repeats the header line (column {name!r} holds {name!r}): files "
                                  "concatenated with their header lines? drop that line")
            if pc.match_substring_regex(text[bad], r"^-?[0-9]+$").as_py():
                raise SchemaError(f"{source}: column {name!r} holds ids that do not fit int64 (e.g. {value} at row "
                                  f"{row}); {BEYOND_INT64}")
            first_ids = " as the column's first ids are" if bad or first_row else ""  # else the first id is the one
            raise SchemaError(f"{source}: column {name!r} has the id {value!r} at row {row}, not an integer{first_ids}; "
                              f"fix the row, or {_AS_TEXT}")
        ids = text.cast(pa.int64())
        at = first_not_decimal(text, ids)
        if at is not None:
            number = ids[at].as_py()
            raise SchemaError(f"{source}: column {name!r} has the id {col[at].as_py()!r} at row {first_row + at}, which "
                              f"reads as the integer {number}, as {str(number)!r} does; write it {number}, or {_AS_TEXT}")
        table = table.set_column(table.column_names.index(name), name, ids)
    return table


def read_events(path: str | Path, schema: Schema, delimiter: str | None = None) -> pa.Table:
    """Read an event log and validate it against `schema`.

    Args:
        path: ``.csv``/``.tsv``/``.txt``/``.dat`` (optionally ``.gz``, ``.bz2``, ``.zst``, ``.lz4``) or ``.parquet`` file.
        schema: column roles; only its columns are kept.
        delimiter: field separator for text files; sniffed from the header line when None.

    Returns:
        The validated table (see `Schema.validate`): ids as int64 or string, times as float seconds.
    """
    table = read_table(path, delimiter=delimiter, string_columns=schema.text_columns,
                       id_columns=schema.decimal_id_columns)
    try:
        return schema.validate(table, source=str(path))
    except MissingIdError as err:
        raise missing_id(err, path, delimiter) from err


def missing_id(err: MissingIdError, path: str | Path, delimiter: str | None = None, source: str | None = None) -> SchemaError:
    """The refusal of a null id at a file row (`MissingIdError`), naming the text of a CSV file's field there
    (an empty field, ``NA``, ``NaN``, ``null`` or ``None``: `NULL_VALUES`, which Arrow reads as null); `err` itself
    for a parquet file, whose null has no text. `source`: the file as the message names it (None: `path`)."""
    path = Path(path)
    if _is_parquet(path):
        return err
    parse = pacsv.ParseOptions(delimiter=delimiter or _sniff_delimiter(path))
    convert = pacsv.ConvertOptions(include_columns=[err.column], column_types={err.column: pa.string()},
                                   strings_can_be_null=False)
    seen = 0
    for batch in pacsv.open_csv(path, read_options=pacsv.ReadOptions(block_size=BLOCK_BYTES), parse_options=parse,
                                convert_options=convert):
        if seen + batch.num_rows > err.row:
            text = batch.column(0)[err.row - seen].as_py()
            return SchemaError(f"{source or path}: column {err.column!r} has a missing id {text!r} at row {err.row}"
                               f"{err.after}")
        seen += batch.num_rows
    return err


def _bad_pair(path: Path) -> str | None:
    """The refusal of the first line of a ``pairs`` file that is not ``user item`` (two integer ids and one space),
    naming the line, its text and what it looks like (another separator, a header line); None when every line is one
    (or the file cannot be read as text: the reader's own error says why)."""
    pair = re.compile(r"\d+ \d+\r?")
    try:
        with open_binary(path) as f:
            for number, raw in enumerate(f, 1):
                line = raw.decode("utf-8").rstrip("\n")
                if not line or pair.fullmatch(line):
                    continue
                fields = line.split()
                seps = [name for sep, name in (("\t", "tabs"), (",", "commas"), (";", "semicolons"), ("|", "bars"))
                        if sep in line]
                if seps:
                    hint = f"the line is separated by {seps[0]}; layout 'pairs' reads one space between the ids"
                elif number == 1 and len(fields) == 2 and not any(field.isdigit() for field in fields):
                    hint = ("a header line? layout 'pairs' reads files without one: remove it, or read the file with "
                            "layout 'events' and a schema naming its columns")
                elif len(fields) != 2:
                    hint = (f"{len(fields)} fields; layout 'pairs' reads one 'user item' pair a line (a 'user item item "
                            "...' file is layout 'lines')")
                else:
                    hint = "expected two non-negative integer ids separated by one space"
                return f"{path}: line {number}: {line!r} is not a 'user item' pair: {hint}"
    except (OSError, EOFError, UnicodeDecodeError, zlib.error):
        return None
    return None


def read_user_sequences(path: str | Path, layout: Literal["pairs", "lines"] = "pairs") -> pa.Table:
    """Read one-sequence-per-user text files as an event table (``session_id``, ``item_id``, ``position``).

    Args:
        path: text file, plain or compressed (`compression`).
        layout: ``pairs`` — one ``user item`` interaction per line, grouped by user in time order
            (SASRec ``Video.txt``, BERT4Rec ``beauty.txt``); ``lines`` — ``user item item ...``
            (S3-Rec ``Beauty.txt``).

    Returns:
        Events with the user as ``session_id`` and the within-user ``position`` as the time order.
    """
    path = Path(path)
    if layout not in ("pairs", "lines"):
        raise ValueError(f"layout must be 'pairs' or 'lines', got {layout!r}")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (a folder)") if path.exists() else no_such(path)
    if layout == "pairs":
        opts = pacsv.ReadOptions(column_names=["session_id", "item_id"])
        try:
            table = pacsv.read_csv(
                path,
                read_options=opts,
                parse_options=pacsv.ParseOptions(delimiter=" "),
                convert_options=pacsv.ConvertOptions(column_types={"session_id": pa.int64(), "item_id": pa.int64()}),
            )
        except (pa.ArrowInvalid, OSError) as err:
            raise SchemaError(_bad_pair(path) or f"{path}: expected 'user item' integer pairs per line: {err}") from err
        users = table.column("session_id").to_numpy()
        starts = np.flatnonzero(np.concatenate([[True], users[1:] != users[:-1]])) if len(users) else np.zeros(0, np.int64)
        _, first = np.unique(users[starts], return_index=True)
        if len(first) < len(starts):  # a user's lines come again after another user's
            row = int(starts[np.setdiff1d(np.arange(len(starts)), first)[0]])
            begun = int(starts[np.flatnonzero(users[starts] == users[row])[0]])
            raise SchemaError(f"{path}: column 'user' (the first id of a line) is not grouped by user: line {row + 1} has "
                              f"user {users[row]} again, whose lines began at line {begun + 1} and were followed by "
                              "another user's (expected each user's lines together, in time order)")
    elif layout == "lines":
        try:
            with open_binary(path) as f:
                data = f.read()
            bom = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0  # a byte-order mark, as the CSV readers skip it
            text = data[bom:].decode("utf-8")
        except UnicodeDecodeError as err:
            at = bom + err.start
            line = data.count(b"\n", 0, at) + 1
            raise SchemaError(f"{path}: line {line} is not valid UTF-8 text ({err.reason} at byte {at})") from err
        except (OSError, EOFError, zlib.error) as err:  # not gzip, a gzip stream cut short or corrupt
            raise SchemaError(f"{path}: cannot be read: {err}") from err
        lines = pa.array(text.splitlines(), type=pa.string())
        tokens = pc.split_pattern(pc.utf8_trim_whitespace(lines), " ")
        lengths = pc.list_value_length(tokens).to_numpy()
        if np.any(lengths < 2):
            row = int(np.flatnonzero(lengths < 2)[0])
            raise SchemaError(f"{path}: line {row + 1} has no items: {lines[row].as_py()!r}")
        offsets = tokens.offsets.to_numpy()
        digits = pc.match_substring_regex(tokens.values, r"^\d+$").to_numpy(zero_copy_only=False)
        if not digits.all():
            at = int(np.flatnonzero(~digits)[0])
            line = int(np.searchsorted(offsets, at, side="right"))
            raise SchemaError(
                f"{path}: line {line}: {tokens.values[at].as_py()!r} is not a non-negative integer id "
                "(expected 'user item item ...' separated by single spaces)"
            )
        try:
            flat = pc.cast(tokens.values, pa.int64()).to_numpy()
        except pa.ArrowInvalid as err:
            raise SchemaError(f"{path}: expected 'user item item ...' integers per line: {err}") from err
        line_users = flat[offsets[:-1]]
        users, first_line = np.unique(line_users, return_index=True)
        if len(users) < len(line_users):  # two lines of one user: which holds the later items is unknown
            again = int(np.setdiff1d(np.arange(len(line_users)), first_line)[0])
            first = int(first_line[np.searchsorted(users, line_users[again])])
            pairs = "; every line is one 'user item' pair: read the file with layout 'pairs'" if np.all(lengths == 2) else ""
            raise SchemaError(
                f"{path}: column 'user' (the first id of a line): line {again + 1} repeats user {line_users[again]} "
                f"of line {first + 1} (expected one line per user){pairs}"
            )
        is_user = np.zeros(len(flat), dtype=bool)
        is_user[offsets[:-1]] = True
        user = np.repeat(flat[offsets[:-1]], lengths - 1)
        table = pa.table({"session_id": user, "item_id": flat[~is_user]})
    sessions = table.column("session_id").to_numpy()
    starts = np.concatenate([[0], np.flatnonzero(sessions[1:] != sessions[:-1]) + 1])
    run_start = np.repeat(starts, np.diff(np.concatenate([starts, [len(sessions)]])))
    position = np.arange(len(sessions)) - run_start
    table = table.append_column("position", pa.array(position.astype(np.int64)))
    schema = Schema(session_id="session_id", item_id="item_id", timestamp=None, order_by="position")
    validated = schema.validate(table, source=str(path))
    return validated.set_column(2, "position", pa.array(position.astype(np.int64)))


def scan_events(
    path: str | Path, schema: Schema, delimiter: str | None = None, batch_rows: int = 1 << 20
) -> Iterator[pa.Table]:
    """`read_events` a batch at a time: validated tables of about `batch_rows` rows, in file order.

    The file is read as `read_table` reads it (the same CSV options, the same sniffed delimiter),
    streamed (``pyarrow.csv.open_csv``, parquet row groups), so memory holds a batch, not the file.
    Validation messages name the rows of the file.
    """
    path = Path(path)
    if not path.exists():
        raise no_such(path)
    if path.is_dir():
        raise SchemaError(f"{path}: is a folder, expected a CSV/TSV or parquet file")
    string_columns, integers, numbers = schema.text_columns, [], []
    try:
        if _is_parquet(path):
            parquet = pq.ParquetFile(path, pre_buffer=False)  # a pre-buffered file caches every row group it read
            names = parquet.schema_arrow.names
            columns = schema.columns if all(c in names for c in schema.columns) else None
            batches = parquet.iter_batches(batch_size=batch_rows, columns=columns)
        else:
            compression(path)  # a compressed file misnamed as plain text is refused
            parse = pacsv.ParseOptions(delimiter=delimiter or _sniff_delimiter(path))
            inferred = first_block(path, parse)
            integers, numbers = integer_columns(inferred, schema.decimal_id_columns), number_columns(inferred, schema)
            batches = pacsv.open_csv(  # blocks of read_csv's size: the column types inferred from the same first block
                path,
                read_options=pacsv.ReadOptions(block_size=BLOCK_BYTES),
                parse_options=parse,
                convert_options=pacsv.ConvertOptions(
                    column_types={c: pa.string() for c in [*string_columns, *integers, *numbers]},
                    null_values=NULL_VALUES,
                    strings_can_be_null=True,
                ),
            )
        row, pending, samples = 0, [], []
        for batch in batches:
            pending.append(batch)
            if sum(b.num_rows for b in pending) >= batch_rows:
                table = integer_ids(read_numbers(pa.Table.from_batches(pending), numbers), integers, str(path), row)
                events = schema.validate(table, source=str(path), first_row=row)
                samples.append(time_sample(table, events, schema, row))
                yield events
                row, pending = row + table.num_rows, []
        if pending:
            table = integer_ids(read_numbers(pa.Table.from_batches(pending), numbers), integers, str(path), row)
            events = schema.validate(table, source=str(path), first_row=row)
            samples.append(time_sample(table, events, schema, row))
            yield events
        elif row == 0:
            raise SchemaError(f"{path}: the file has no rows")
        check_time_samples(samples, schema, str(path))
    except MissingIdError as err:
        raise missing_id(err, path, delimiter) from err
    except (pa.ArrowInvalid, OSError, UnicodeDecodeError) as err:
        raise SchemaError(f"{path}: cannot be read as {'parquet' if _is_parquet(path) else 'CSV'}: {err}") from err


TimeSample = tuple[pa.Array, np.ndarray, np.ndarray, TimeUnit]


def _is_number(kind: pa.DataType) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_floating(kind)


def time_sample(raw: pa.Table, events: pa.Table, schema: Schema, first_row: int) -> TimeSample | None:
    """The rows of a batch that decide whether its times are plausible together with other batches:
    its first time inside 1990..2100, its first outside, its earliest and its latest (values as messages quote
    them, `shown_times`; seconds; file rows), and the unit they were read in (``datetime`` for timestamps, dates and
    ISO-8601 text); None without times. `check_time_samples` checks the batches' samples together."""
    if schema.timestamp is None:
        return None
    seconds = events.column(schema.timestamp).to_numpy()
    if not len(seconds):
        return None
    low, high = PLAUSIBLE_SECONDS
    inside = (seconds >= low) & (seconds < high)
    picks = {int(np.argmin(seconds)), int(np.argmax(seconds))}
    picks |= {int(np.argmax(flags)) for flags in (inside, ~inside) if flags.any()}
    rows = np.array(sorted(picks))
    values = raw.column(schema.timestamp).combine_chunks().take(pa.array(rows))
    numbers = _is_number(values.type)
    text = pa.types.is_string(values.type) or pa.types.is_large_string(values.type)
    numeric = numbers or text and schema.time_unit != "datetime" and not pc.all(parse_time_strings(values).is_valid()).as_py()
    return shown_times(values), seconds[rows], rows + first_row, schema.time_unit if numeric else "datetime"


def check_time_samples(samples: list[TimeSample | None], schema: Schema, source: str) -> None:
    """Refuse the times of batches that each passed `Schema.validate` but would not pass it together (some
    batches in 1990..2100, others before; text of ISO-8601 times in some, of numbers in others): the check of
    the whole file, on the rows that decide it."""
    kept = [s for s in samples if s is not None]
    if len(kept) < 2:
        return
    other = next((s for s in kept if s[3] != kept[0][3]), None)
    if other is not None:
        forms = [f"{s[0][0].as_py()!r} at row {s[2][0]} ("
                 + ("ISO-8601" if s[3] == "datetime" else f"{UNIT_WORDS[s[3]]} since the epoch, time_unit: {s[3]}")
                 + ")" for s in (kept[0], other)]
        raise SchemaError(f"{source}: column {schema.timestamp!r} holds times of two forms: {forms[0]} and {forms[1]}; "
                          "give the column one form")
    kinds = {s[0].type for s in kept}  # batches of integers beside batches with decimals (`read_numbers`): as floats
    common = kinds.pop() if len(kinds) == 1 else pa.float64() if all(map(_is_number, kinds)) else pa.string()
    values = pa.chunked_array([s[0].cast(common) for s in kept])
    seconds = np.concatenate([s[1] for s in kept])
    rows = np.concatenate([s[2] for s in kept])
    check_plausible(values, seconds, schema.timestamp, kept[0][3], source, rows)
