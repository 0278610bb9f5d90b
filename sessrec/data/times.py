"""Event times: a column of numbers in a unit, timestamps or ISO-8601 text, as float64 seconds since the epoch,
and the rule that a numeric time must fall between 1990 and 2100 in its unit (`PLAUSIBLE_SECONDS`)."""

from __future__ import annotations

from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sessrec.data.columns import NUMBER, Rows, SchemaError, as_floats, bad_example, check_text, file_row

TimeUnit = Literal["s", "ms", "us", "ns", "datetime"]


_UNIT_SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


def shown_times(col: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """A time column as its messages quote it: timestamps and dates as their text (``'1900-01-01 00:00:00'``),
    numbers and text as they are."""
    return pc.cast(col, pa.string()) if pa.types.is_timestamp(col.type) or pa.types.is_date(col.type) else col


def parse_time(table: pa.Table, name: str, unit: TimeUnit, source: str, rows: Rows = 0) -> pa.ChunkedArray:
    """Return event times as float64 seconds since the epoch.

    A negative time is refused: it is a placeholder for a missing time (-1, 1900-01-01) far more often
    than a time before 1970, and it would sort the event first in its session. Times of every kind are
    then held to `check_plausible`.
    """
    col = table.column(name)
    if pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
        col = check_text(col, name, source, rows)
    typ = col.type
    numbers = col  # the column's numbers (its values, or its text read as numbers); messages quote `col`
    text = pa.types.is_string(typ) or pa.types.is_large_string(typ)
    if pa.types.is_timestamp(typ) or pa.types.is_date(typ):
        stamps = col if pa.types.is_timestamp(typ) else pc.cast(col, pa.timestamp("s" if pa.types.is_date32(typ) else "ms"))
        # counted in the column's own unit (UTC): a cast to another unit would refuse nanoseconds it cannot hold
        seconds = pc.cast(stamps, pa.int64()).to_numpy(zero_copy_only=False) * _UNIT_SECONDS[stamps.type.unit]
        nulls = col.is_null().to_numpy(zero_copy_only=False)
        col = shown_times(col)
    elif text:
        nulls = col.is_null().to_numpy(zero_copy_only=False)
        if nulls.any():
            value, row = bad_example(col, nulls, rows)
            raise SchemaError(f"{source}: column {name!r} has a missing timestamp {value!r} at row {row}")
        parsed = parse_time_strings(col)
        iso = parsed.is_valid().to_numpy(zero_copy_only=False)
        if iso.all():
            seconds = pc.cast(parsed, pa.int64()).to_numpy(zero_copy_only=False) * 1e-6
        else:
            numbers = _numeric_time_text(col, iso, name, unit, source, rows)
    elif not (pa.types.is_integer(typ) or pa.types.is_floating(typ)):
        raise SchemaError(
            f"{source}: column {name!r} has dtype {typ} (e.g. {col[0].as_py()!r} at row {file_row(rows, 0)}), "
            "which is not a timestamp; "
            "expected numbers, timestamps or ISO-8601 text"
        )
    numeric = pa.types.is_integer(numbers.type) or pa.types.is_floating(numbers.type)
    if numeric:
        if unit == "datetime":
            raise SchemaError(
                f"{source}: column {name!r} holds numbers (e.g. {col[0].as_py()!r} at row {file_row(rows, 0)}); "
                "set time_unit to s, ms, us or ns"
            )
        seconds = as_floats(numbers) * _UNIT_SECONDS[unit]
        nulls = ~np.isfinite(seconds)
    negative = ~nulls & (seconds < 0)
    if negative.any():
        value, row = bad_example(col, negative, rows)
        raise SchemaError(
            f"{source}: column {name!r} has a negative timestamp {value!r} at row {row} (before 1970); "
            "drop or fill those rows"
        )
    if nulls.any():
        value, row = bad_example(col, nulls, rows)
        raise SchemaError(f"{source}: column {name!r} has a missing timestamp {value!r} at row {row}")
    check_plausible(col, seconds, name, unit if numeric else "datetime", source, rows)
    return pa.chunked_array([pa.array(np.asarray(seconds, dtype=np.float64))])


UNIT_WORDS = {"s": "seconds", "ms": "milliseconds", "us": "microseconds", "ns": "nanoseconds"}
_ISO_FORM = "ISO-8601 (2016-05-09 or 2016-05-09T10:51:09Z)"


def _numeric_time_text(col: pa.ChunkedArray, iso: np.ndarray, name: str, unit: TimeUnit, source: str,
                       rows: Rows) -> pa.ChunkedArray:
    """A text column of times that are not all ISO-8601 (`iso`: those that are): numbers as text, read in the
    numeric `unit` (float64); else a one-line SchemaError naming the first value that does not parse.

    The column's first value tells its form (numbers in `unit`, or ISO-8601): the first value of another
    form is named, with the form expected; a first value of neither form is named itself.
    """
    number = pc.match_substring_regex(col, NUMBER).to_numpy(zero_copy_only=False)
    numeric_unit = unit != "datetime"
    if numeric_unit and number.all():
        return pc.cast(pc.utf8_trim_whitespace(col), pa.float64())
    numbers = f"a number of {UNIT_WORDS[unit]} since the epoch (time_unit: {unit})" if numeric_unit else ""
    first = f"{col[0].as_py()!r} at row {file_row(rows, 0)}"
    if numeric_unit and number[0]:
        bad, expected = ~number, f"{numbers}, as {first} is"
    elif iso[0]:
        bad, expected = ~iso, f"{_ISO_FORM}, as {first} is"
    elif numeric_unit:
        bad, expected = ~iso & ~number, f"{_ISO_FORM} or {numbers}"
    else:
        bad, expected = ~iso, f"{_ISO_FORM} with time_unit: datetime (for numbers set time_unit to s, ms, us or ns)"
    value, row = bad_example(col, bad, rows)
    raise SchemaError(f"{source}: column {name!r} has an unparsable timestamp {value!r} at row {row}; expected {expected}")


PLAUSIBLE_SECONDS = (631_152_000.0, 4_102_444_800.0)  # 1990-01-01 and 2100-01-01 (UTC), seconds since the epoch
_SECONDS_PER_YEAR = 31_556_952.0


def check_plausible(col: pa.ChunkedArray, seconds: np.ndarray, name: str, unit: TimeUnit, source: str, rows: Rows) -> None:
    """Refuse times (`seconds`, of the numbers of `col` in `unit`, or of its timestamps, dates or ISO-8601 text:
    ``datetime``) that fall outside 1990..2100 (`PLAUSIBLE_SECONDS`).

    A time after 2100 is always refused; so is a time before 1990 in a column that has times in
    1990..2100, or whose numbers all fall in that range under another unit (seconds read as ms).
    A column whose times no unit places in the range holds relative times (seconds from a
    start, as in toy data) and passes.

    Raises:
        SchemaError: naming the file, the column, the first implausible value, its year (under
            `unit`), and the unit that would fit when there is one.
    """
    low, high = PLAUSIBLE_SECONDS
    inside = (seconds >= low) & (seconds < high)
    if inside.all():
        return
    fits = []
    if unit != "datetime":
        raw_low, raw_high = seconds.min() / _UNIT_SECONDS[unit], seconds.max() / _UNIT_SECONDS[unit]
        fits = [u for u, f in _UNIT_SECONDS.items() if u != unit and low <= raw_low * f and raw_high * f < high]
    late = seconds >= high
    if not (late.any() or inside.any() or fits):
        if unit != "datetime":
            _refuse_dates_as_numbers(col, seconds / _UNIT_SECONDS[unit], name, unit, source, rows)
        return
    bad = late if late.any() else ~inside
    value, row = bad_example(col, bad, rows)
    year = int(np.floor(1970 + float(seconds[np.flatnonzero(bad)[0]]) / _SECONDS_PER_YEAR))
    fix = (f"it looks like {fits[0]}; set time_unit: {fits[0]}" if fits
           else "fix or drop the rows" + ("" if unit == "datetime" else ", or set time_unit to the column's unit"))
    read = "in" if unit == "datetime" else f"read with time_unit: {unit} as"
    raise SchemaError(
        f"{source}: column {name!r} has the time {value!r} at row {row}, {read} the year "
        f"{f'{year:,}' if year >= 10_000 else year} (outside 1990..2100); {fix}"
    )


def _refuse_dates_as_numbers(col: pa.ChunkedArray, numbers: np.ndarray, name: str, unit: TimeUnit, source: str,
                             rows: Rows) -> None:
    """Refuse a column of relative times whose every number is a date written as digits (YYYYMMDD in 1990..2099:
    20240115), which would be read as seconds from a start (one day a second apart, a month 70 to 100 apart)."""
    whole = np.round(numbers)
    if not len(numbers) or not np.array_equal(whole, numbers):
        return
    year, month_day = np.divmod(whole.astype(np.int64), 10_000)
    month, day = np.divmod(month_day, 100)
    if ((year >= 1990) & (year < 2100) & (month >= 1) & (month <= 12) & (day >= 1) & (day <= 31)).all():
        value, row = bad_example(col, np.ones(len(numbers), dtype=bool), rows)
        raise SchemaError(
            f"{source}: column {name!r} has the time {value!r} at row {row}, and every time of it is a date written as "
            f"digits (YYYYMMDD), which time_unit: {unit} reads as {UNIT_WORDS[unit]} from a start; give the dates as "
            "text (2024-01-15), as a date or timestamp column, or as seconds since the epoch"
        )


_UTC_OFFSET = r"(?P<sign>[+-])(?P<hours>\d{2})(?::?(?P<minutes>\d{2}))?$"  # after a time of day: +02:00, -0130, +01
_OFFSET_AFTER_TIME = r"[T ]\d{2}(:\d{2}(:\d{2}(\.\d+)?)?)?[+-]\d{2}(:?\d{2})?$"  # 10:51:09+02:00, 10-05, 10:51+0130
_ISO_FORMATS = ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H",
                "%Y-%m-%d %H")


def parse_time_strings(col: pa.ChunkedArray) -> pa.ChunkedArray:
    """ISO-8601 strings to timestamp[us] (UTC); unparsable entries become null.

    The forms Arrow's CSV reader takes: a date, or a date and a time to the hour, the minute or the
    second. Fractional seconds are kept to the microsecond (YOOCHOOSE clicks are ``...T10:51:09.277Z``):
    strptime has no directive for them, so they are parsed apart and added back. A UTC offset after
    the time of day (``Z``, ``+02:00``, ``-0130``, ``+01``) is taken off, as Arrow's CSV reader takes it off.
    """
    text = pc.replace_substring_regex(col, r"(Z|[+-]00:?00)$", "")
    east = None  # minutes east of UTC of each time with an offset
    zoned = pc.match_substring_regex(text, _OFFSET_AFTER_TIME)
    if pc.any(zoned).as_py():
        offset = pc.extract_regex(pc.if_else(zoned, text, pa.scalar(None, pa.string())), _UTC_OFFSET)
        given = pc.struct_field(offset, "minutes")  # empty for an offset of hours
        minutes = pc.add(pc.multiply(pc.cast(pc.struct_field(offset, "hours"), pa.int64()), 60),
                         pc.cast(pc.if_else(pc.equal(given, ""), "0", given), pa.int64()))
        east = pc.if_else(pc.equal(pc.struct_field(offset, "sign"), "-"), pc.negate(minutes), minutes).fill_null(0)
        text = pc.if_else(zoned, pc.replace_substring_regex(text, r"[+-]\d{2}(:?\d{2})?$", ""), text)
    whole = pc.replace_substring_regex(text, r"\.\d+$", "")
    out = None
    for fmt in _ISO_FORMATS:  # until every text parses: a column of one form is read by one of them
        parsed = pc.strptime(whole, format=fmt, unit="us", error_is_null=True)
        out = parsed if out is None else pc.coalesce(out, parsed)
        if out.null_count == whole.null_count:
            break
    digits = pc.struct_field(pc.extract_regex(text, r"\.(?P<frac>\d+)$"), "frac")
    micros = pc.cast(pc.utf8_slice_codeunits(pc.utf8_rpad(digits, width=6, padding="0"), 0, 6), pa.int64())
    local = pc.add(pc.cast(out, pa.int64()), micros.fill_null(0))
    return pc.cast(local if east is None else pc.subtract(local, pc.multiply(east, 60_000_000)), pa.timestamp("us"))
