"""SQL Server column types → Arrow types, and the values pyodbc returns → typed Arrow arrays.

A :class:`Codec` says how one column is read (:meth:`Codec.select`, the T-SQL expression for the
column) and how the Python values pyodbc returns for that expression become one Arrow array
(:meth:`Codec.to_arrow`). The snapshot reader and the change reader both use both, so a row is
identical whichever path it came from.

Most types are read as themselves. Types whose pyodbc value loses information or fails are read
as a string SQL Server prints exactly, which is then parsed here (vectorised, with Arrow
kernels):

* ``time``, ``datetime``, ``smalldatetime``, ``datetime2``, ``datetimeoffset``: ``CONVERT(varchar,
  [c], 121)`` (ODBC canonical: ``yyyy-mm-dd hh:mi:ss[.fffffff][ {+|-}hh:mm]``, the type's own
  fractional digits). pyodbc truncates 100 ns digits to microseconds and fails on
  ``datetimeoffset`` (ODBC type -155) without an output converter.
* ``xml``, ``sql_variant``: ``CAST([c] AS nvarchar(max))`` (pyodbc fails on ``sql_variant``,
  ODBC type -150; ``xml`` is read as text so no driver-specific handling is involved).
* ``hierarchyid``, ``geometry``, ``geography``: ``CAST([c] AS varbinary(max))``, their native
  serialisation (pyodbc fails on CLR types, ODBC type -151).
* types this module does not know: ``CAST([c] AS nvarchar(max))``.

How values are represented follows Debezium's handling modes (:class:`ValueModes`), plus the
Spark-native default ``time_precision='spark'``. A value without a representation in the chosen
type raises :class:`ValueConversionError` naming it, never a silent null. ``docs/types-sqlserver.md``
lists every mapping.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_cdc.cdc.events.value_modes import MAX_DECIMAL_PRECISION, ValueConversionError, ValueModes

__all__ = [
    "CATALOG_SQL",
    "MAPPED_TYPES",
    "Codec",
    "SqlServerType",
    "ValueConversionError",
    "codec_for",
    "text_codec",
]

MAX = -1  # sys.columns.max_length of (max) types


@dataclass(frozen=True)
class SqlServerType:
    """A column type as SQL Server's catalog describes it."""

    name: str  # sys.types.name of the base type, lower case: "int", "datetime2", "nvarchar", "decimal", ...
    max_length: int = 0  # sys.columns.max_length in BYTES (-1 for (max)); nvarchar(10) has 20
    precision: int = 0  # sys.columns.precision
    scale: int = 0  # sys.columns.scale (fractional-second digits for time/datetime2/datetimeoffset)

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", self.name.lower())

    def declared(self) -> str:
        """The type as it is declared: ``datetime2(7)``, ``nvarchar(max)``, ``decimal(18,4)``."""
        name = self.name
        if name in ("char", "varchar", "binary", "varbinary", "nchar", "nvarchar"):
            if self.max_length == MAX:
                return f"{name}(max)"
            length = self.max_length // 2 if name in ("nchar", "nvarchar") else self.max_length
            return f"{name}({length})"
        if name in ("decimal", "numeric"):
            return f"{name}({self.precision},{self.scale})"
        if name in ("time", "datetime2", "datetimeoffset"):
            return f"{name}({self.scale})"
        if name == "float" and self.precision not in (0, 53):
            return f"float({self.precision})"
        return name

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "max_length": self.max_length, "precision": self.precision, "scale": self.scale}

    @classmethod
    def from_json(cls, data: dict) -> SqlServerType:
        return cls(
            str(data["name"]),
            int(data.get("max_length", 0)),
            int(data.get("precision", 0)),
            int(data.get("scale", 0)),
        )


#: One row per column of one table (parameters: schema name, table name), in column order:
#: name, base type name, max_length, precision, scale, is_nullable, is_computed. Alias types
#: (``CREATE TYPE ... FROM``, ``sysname``) resolve to their system base type; CLR types
#: (hierarchyid, geometry, geography, user CLR types: system_type_id 240, which no sys.types row
#: has as its user_type_id) keep their own name. Computed columns are left out: SQL Server stores
#: them as NULL in every change row (Learn, cdc.fn_cdc_get_all_changes_<capture_instance>, Remarks),
#: so no event could carry their value; the snapshot leaves them out too, to match.
CATALOG_SQL = (
    "SELECT c.name, COALESCE(bt.name, t.name) AS type_name, c.max_length, c.[precision], c.scale, "
    "c.is_nullable, c.is_computed "
    "FROM sys.columns c "
    "JOIN sys.tables tb ON tb.object_id = c.object_id "
    "JOIN sys.schemas s ON s.schema_id = tb.schema_id "
    "JOIN sys.types t ON t.user_type_id = c.user_type_id "
    "LEFT JOIN sys.types bt ON bt.user_type_id = t.system_type_id AND t.user_type_id <> t.system_type_id "
    "WHERE s.name = ? AND tb.name = ? AND c.is_computed = 0 "
    "ORDER BY c.column_id"
)


#: Conversion of the Python values pyodbc returned (a list, None for NULL) to an Arrow array.
Converter = Callable[[Sequence[Any]], pa.Array]


@dataclass(frozen=True)
class Codec:
    """How one column is captured: the T-SQL that reads it, its Arrow type, and the conversion of
    what pyodbc returns for that T-SQL into an array of that type."""

    arrow_type: pa.DataType
    description: str  # for messages: "timestamp_ntz (datetime2(7))"
    convert: Converter = field(compare=False, repr=False)
    read: str = "{}"  # T-SQL template; "{}" is the quoted column reference
    hint: str = field(default="", compare=False, repr=False)  # how to capture a value that fails

    def select(self, column_sql: str) -> str:
        """The T-SQL expression reading the column (``column_sql``: an already-quoted ``[col]``)."""
        return self.read.format(column_sql)

    def to_arrow(self, values: Sequence[Any], *, column: str | None = None, table: str | None = None) -> pa.Array:
        """What pyodbc returned for :meth:`select` (None for NULL) as one array of ``arrow_type``.

        Raises :class:`ValueConversionError` naming the first value without a representation
        (and the column and table, when given)."""
        if isinstance(values, (pa.Array, pa.ChunkedArray)):
            values = values.to_pylist()
        try:
            array = self.convert(values)
        except _CONVERSION_ERRORS as exc:
            index, reason = _first_failure(self.convert, values)
            subject = "a value" if index is None else f"value {values[index]!r}"
            where = "" if column is None else f"column {column!r}" + (f" of {table}: " if table else ": ")
            raise ValueConversionError(
                f"{where}{subject} cannot be captured as {self.description} ({reason or exc}). "
                f"{self.hint or _DEFAULT_HINT}"
            ) from None
        if array.type != self.arrow_type:  # an all-null or empty input can come back untyped
            array = array.cast(self.arrow_type)
        return array


class _BadValue(ValueError):
    """A value that does not match the form its codec reads."""


_CONVERSION_ERRORS = (
    pa.ArrowInvalid,
    pa.ArrowTypeError,
    pa.ArrowNotImplementedError,
    ValueError,
    TypeError,
    ArithmeticError,
    KeyError,
)
_TEXT_HINT = "The column is already captured as text (column_text_list): exclude it to capture the table."
_DEFAULT_HINT = (
    "To capture it anyway, add the column to column_text_list to capture its text form, or exclude the column."
)


def _first_failure(convert: Converter, values: Sequence[Any]) -> tuple[int | None, Exception | None]:
    """The index of the first value ``convert`` rejects, and why (bisection: about 2n values
    converted, only on this error path)."""

    def failure(part: Sequence[Any]) -> Exception | None:
        try:
            convert(part)
        except _CONVERSION_ERRORS as exc:
            return exc
        return None

    lo, hi = 0, len(values)
    reason = failure(values) if hi else None
    if reason is None:
        return None, None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        left = failure(values[lo:mid])
        if left is not None:
            hi, reason = mid, left
            continue
        right = failure(values[mid:hi])
        if right is None:  # fails only in combination: not a per-value failure
            return None, None
        lo, reason = mid, right
    return lo, reason


# -- entry points --------------------------------------------------------------------------------


def codec_for(sql_type: SqlServerType, modes: ValueModes) -> Codec:
    """The codec of a column of ``sql_type`` under ``modes``."""
    builder = _BUILDERS.get(sql_type.name)
    if builder is None:
        return _unknown(sql_type)
    return builder(sql_type, modes)


def text_codec(sql_type: SqlServerType, modes: ValueModes) -> Codec:
    """The value as text, whatever the type (``column_text_list``).

    The column is read as :func:`codec_for` reads it (losslessly), and printed in one canonical
    form per type: ``CONVERT`` style 121 for times (the type's fractional digits; offsets as
    ``+hh:mm``), ``0x``-prefixed upper-case hex for binary data (style 1), the plain decimal with
    the column's scale, the shortest round-trip text of floats, ``1``/``0`` for bit."""
    base = codec_for(sql_type, ValueModes())
    name = sql_type.name
    what = f"text form (column_text_list) of {sql_type.declared()}"

    def make(function: Callable[[Sequence[Any]], pa.Array]) -> Codec:
        return Codec(pa.string(), what, function, read=base.read, hint=_TEXT_HINT)

    if name in _TEMPORAL_TEXT:
        kind, digits = _TEMPORAL_TEXT[name](sql_type)
        return make(lambda v: _temporal_text(_strings(v), kind, digits))
    if name == "date":
        return make(lambda v: _each(v, lambda d: d.isoformat(), pa.string()))
    if name == "bit":
        return make(lambda v: _each(v, lambda b: "1" if _bit(b) else "0", pa.string()))
    if name in _INTEGERS:
        return make(lambda v: _each(v, lambda i: str(int(i)), pa.string()))
    if name in ("decimal", "numeric", "money", "smallmoney"):
        scale = 4 if name in ("money", "smallmoney") else sql_type.scale
        return make(lambda v: _each(v, lambda d: _plain_decimal(d, scale), pa.string()))
    if name in ("real", "float"):
        if _is_real(sql_type):
            return make(lambda v: _each(v, lambda f: _float_text(np.float32(f)), pa.string()))
        return make(lambda v: _each(v, lambda f: _float_text(float(f)), pa.string()))
    if pa.types.is_binary(base.arrow_type) or name in _BINARY_TYPES:
        return make(lambda v: _each(v, lambda b: "0x" + bytes(b).hex().upper(), pa.string()))
    return make(base.convert)  # already text: strings, xml, uniqueidentifier, sql_variant, unknown types


# -- helpers -------------------------------------------------------------------------------------


def _each(values: Sequence[Any], function: Callable[[Any], Any], arrow_type: pa.DataType) -> pa.Array:
    """Per-value Python conversion (for types Arrow has no kernel for)."""
    return pa.array([None if v is None else function(v) for v in values], type=arrow_type)


def _strings(values: Sequence[Any]) -> pa.Array:
    """The values as an Arrow string array. Anything but str fails (a datetime, bytes: the codec's
    select() was not applied); pyodbc returns one Python type per column, so the type of the first
    value stands for all (Arrow itself rejects any other non-string, non-bytes value)."""
    first = next((v for v in values if v is not None), None)
    if first is not None and not isinstance(first, str):
        raise _BadValue("not the text Codec.select() reads: was the column read with it?")
    try:
        return pa.array(values, type=pa.string())
    except (pa.ArrowTypeError, pa.ArrowInvalid):
        raise _BadValue("not the text Codec.select() reads: was the column read with it?") from None


def _native(arrow_type: pa.DataType) -> Converter:
    return lambda values: pa.array(values, type=arrow_type)


def _codec(arrow_type: pa.DataType, what: str, sql_type: SqlServerType, convert: Converter, **kw: Any) -> Codec:
    return Codec(arrow_type, f"{what} ({sql_type.declared()})", convert=convert, **kw)


# -- numbers -------------------------------------------------------------------------------------

_INTEGERS = {"tinyint": pa.int16(), "smallint": pa.int16(), "int": pa.int32(), "bigint": pa.int64()}


def _bit(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    return {0: False, 1: True}[value]  # some drivers return bit as 0/1


def _bit_codec(sql_type: SqlServerType, modes: ValueModes) -> Codec:
    return _codec(pa.bool_(), "boolean", sql_type, lambda v: _each(v, _bit, pa.bool_()))


def _integer(sql_type: SqlServerType, modes: ValueModes) -> Codec:
    # tinyint is 0..255 in SQL Server: int16, as Debezium (Spark's ByteType is -128..127).
    arrow_type = _INTEGERS[sql_type.name]
    return _codec(arrow_type, str(arrow_type), sql_type, _native(arrow_type))


def _is_real(sql_type: SqlServerType) -> bool:
    return sql_type.name == "real" or 0 < sql_type.precision <= 24  # float(1..24) is real


def _float(sql_type: SqlServerType, modes: ValueModes) -> Codec:
    arrow_type = pa.float32() if _is_real(sql_type) else pa.float64()
    return _codec(arrow_type, str(arrow_type), sql_type, _native(arrow_type))


def _float_text(value: Any) -> str:
    return repr(float(value)) if not isinstance(value, np.float32) else str(value)


def _plain_decimal(value: Any, scale: int) -> str:
    """Debezium's string form (``BigDecimal.toPlainString()`` at the column's scale): ``1.50``.
    Zeros pad or trim the fraction to ``scale`` digits; other digits are never rounded away."""
    number = value if isinstance(value, Decimal) else Decimal(str(value))
    if not number.is_finite():
        raise _BadValue(f"not a finite decimal: {value!r}")
    head, _, tail = format(number, "f").partition(".")
    if len(tail) < scale:
        tail = tail.ljust(scale, "0")
    elif len(tail) > scale and not tail[scale:].strip("0"):
        tail = tail[: max(scale, 0)]
    if head == "-0" and not tail.strip("0"):
        head = "0"  # no negative zero
    return head + ("." + tail if tail else "")


def _decimal(sql_type: SqlServerType, modes: ValueModes) -> Codec:
    if sql_type.name == "money":
        precision, scale = 19, 4
    elif sql_type.name == "smallmoney":
        precision, scale = 10, 4
    else:
        precision, scale = sql_type.precision, sql_type.scale
    if modes.decimal == "double":
        return _codec(
            pa.float64(),
            "double (decimal_handling_mode=double)",
            sql_type,
            lambda v: _each(v, float, pa.float64()),
        )
    if modes.decimal == "string" or not 0 <= scale <= precision <= MAX_DECIMAL_PRECISION or precision == 0:
        reason = "decimal_handling_mode=string" if modes.decimal == "string" else "no decimal(p,s) fits"
        return _codec(
            pa.string(),
            f"exact decimal text ({reason})",
            sql_type,
            lambda v: _each(v, lambda d: _plain_decimal(d, scale), pa.string()),
        )
    arrow_type = pa.decimal128(precision, scale)

    def convert(values: Sequence[Any]) -> pa.Array:
        try:
            return pa.array(values, type=arrow_type)
        except pa.ArrowInvalid:
            raise _BadValue(f"more than {precision - scale} integer or {scale} fraction digits") from None

    return _codec(
        arrow_type,
        "decimal" if sql_type.name in ("decimal", "numeric") else f"decimal({precision},{scale})",
        sql_type,
        convert,
        hint="Use decimal_handling_mode='string' or 'double', or add the column to column_text_list.",
    )


# -- characters and binary data ------------------------------------------------------------------

_BINARY_TYPES = ("binary", "varbinary", "image", "timestamp", "rowversion", "hierarchyid", "geometry", "geography")


def _string(sql_type: SqlServerType, modes: ValueModes) -> Codec:
    return _codec(pa.string(), "string", sql_type, _strings)


def _cast_string(sql_type: SqlServerType, modes: ValueModes) -> Codec:
    # xml: its text (Debezium's io.debezium.data.Xml). sql_variant: SQL Server's conversion of
    # the base type's value to nvarchar (style 0: see docs/types-sqlserver.md).
    return _codec(pa.string(), "string", sql_type, _strings, read="CAST({} AS nvarchar(max))")


def _uniqueidentifier(sql_type: SqlServerType, modes: ValueModes) -> Codec:
    # As SQL Server prints it (upper case), whether pyodbc returns a str or a uuid.UUID.
    return _codec(pa.string(), "string", sql_type, lambda v: _each(v, lambda u: str(u).upper(), pa.string()))


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise _BadValue(f"not binary data: {type(value).__name__}")


def _binary(sql_type: SqlServerType, modes: ValueModes) -> Codec:
    read = "{}"
    if sql_type.name in ("hierarchyid", "geometry", "geography"):
        # CLR types: their native serialisation, lossless (SRID, Z/M, exact coordinates) and read
        # the same way on every server (ToString()/STAsText() lose the SRID and need CLR methods).
        # CAST(0x... AS geometry) in SQL Server turns it back into the value.
        read = "CAST({} AS varbinary(max))"
    if modes.binary == "base64":
        return _codec(
            pa.string(),
            "base64 string (binary_handling_mode=base64)",
            sql_type,
            lambda v: _each(v, lambda b: base64.b64encode(_as_bytes(b)).decode("ascii"), pa.string()),
            read=read,
        )
    if modes.binary == "hex":
        return _codec(
            pa.string(),
            "hex string (binary_handling_mode=hex)",
            sql_type,
            lambda v: _each(v, lambda b: _as_bytes(b).hex(), pa.string()),
            read=read,
        )
    return _codec(pa.binary(), "binary", sql_type, lambda v: _each(v, _as_bytes, pa.binary()), read=read)


def _unknown(sql_type: SqlServerType) -> Codec:
    return _codec(
        pa.string(),
        f"string (CAST AS nvarchar(max) of the unmapped type {sql_type.name!r})",
        sql_type,
        _strings,
        read="CAST({} AS nvarchar(max))",
        hint=f"The type {sql_type.name!r} has no mapping and its nvarchar form could not be read: exclude the column.",
    )


# -- time ----------------------------------------------------------------------------------------

NANOS_PER_SECOND = 1_000_000_000
_CLOCK = r"(?P<clock>(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d)(?:\.(?P<frac>\d{1,9}))?"
_LOCAL_TIMESTAMP = r"^(?P<date>\d{4}-\d{2}-\d{2})[ T]" + _CLOCK + "$"
_ZONED_TIMESTAMP = r"^(?P<date>\d{4}-\d{2}-\d{2})[ T]" + _CLOCK + r" ?(?P<offset>Z|[+-](?:0\d|1[0-4]):[0-5]\d)$"
_TIME = "^" + _CLOCK + "$"

# CONVERT(varchar(n), [c], 121): yyyy-mm-dd hh:mi:ss[.fffffff][ {+|-}hh:mm], the type's fractional digits
# (datetime and smalldatetime: 3). The lengths are each type's longest output.
_READ_TIME = "CONVERT(varchar(16), {}, 121)"
_READ_DATETIME = "CONVERT(varchar(23), {}, 121)"
_READ_DATETIME2 = "CONVERT(varchar(27), {}, 121)"
_READ_DATETIMEOFFSET = "CONVERT(varchar(34), {}, 121)"


def _extract(values: pa.Array, pattern: str) -> pa.StructArray:
    parts = pc.extract_regex(values, pattern)
    if parts.null_count != values.null_count:
        raise _BadValue("not in the form CONVERT(varchar, value, 121) prints")
    return parts


def _field(parts: pa.StructArray, name: str) -> pa.Array:
    """A group of :func:`_extract`'s result, null where the value is null."""
    return pc.struct_field(parts, name)


def _nanos_of_second(parts: pa.StructArray) -> pa.Array:
    """The fraction's digits as nanoseconds (a missing fraction is 0)."""
    return pc.cast(pc.utf8_rpad(_field(parts, "frac"), 9, "0"), pa.int64())


def _local_seconds(parts: pa.StructArray) -> pa.Array:
    """Seconds since 1970-01-01 00:00 of the written date and clock (any valid calendar date)."""
    text = pc.binary_join_element_wise(_field(parts, "date"), _field(parts, "clock"), " ")
    return pc.cast(pc.cast(text, pa.timestamp("s")), pa.int64())


def _offset_minutes(parts: pa.StructArray) -> pa.Array:
    offset = _field(parts, "offset")
    offset = pc.if_else(pc.equal(offset, "Z"), "+00:00", offset)
    hours = pc.cast(pc.utf8_slice_codeunits(offset, 1, 3), pa.int64())
    minutes = pc.cast(pc.utf8_slice_codeunits(offset, 4, 6), pa.int64())
    total = pc.add(pc.multiply(hours, 60), minutes)
    return pc.if_else(pc.starts_with(offset, "-"), pc.negate(total), total)


def _scaled(seconds: pa.Array, nanos: pa.Array, unit_nanos: int) -> pa.Array:
    """seconds and nanoseconds → whole units of ``unit_nanos`` (truncating the finer digits;
    the fraction is never negative, so this is the floor: towards the earlier instant)."""
    per_second = NANOS_PER_SECOND // unit_nanos
    if unit_nanos == 1:
        # Near int64's negative end, seconds * 10**9 overflows before the fraction is added:
        # borrow one second from negative instants so both terms stay in range.
        borrow = pc.cast(pc.and_(pc.less(seconds, 0), pc.greater(nanos, 0)), pa.int64())
        seconds = pc.add(seconds, borrow)
        nanos = pc.subtract(nanos, pc.multiply(borrow, NANOS_PER_SECOND))
    return pc.add_checked(pc.multiply_checked(seconds, per_second), pc.divide(nanos, unit_nanos))


def _epoch(values: Sequence[Any], unit_nanos: int, *, zoned: bool) -> pa.Array:
    """Units since 1970-01-01 (UTC for zoned values) of timestamps printed by CONVERT 121, int64."""
    parts = _extract(_strings(values), _ZONED_TIMESTAMP if zoned else _LOCAL_TIMESTAMP)
    seconds = _local_seconds(parts)
    if zoned:
        seconds = pc.subtract(seconds, pc.multiply(_offset_minutes(parts), 60))
    return _scaled(seconds, _nanos_of_second(parts), unit_nanos)


def _time_of_day(values: Sequence[Any], unit_nanos: int) -> pa.Array:
    """Units since midnight of times printed by CONVERT 121 (``hh:mi:ss[.fffffff]``), int64."""
    parts = _extract(_strings(values), _TIME)
    clock = _field(parts, "clock")
    hours, minutes, seconds = (
        pc.cast(pc.utf8_slice_codeunits(clock, start, start + 2), pa.int64()) for start in (0, 3, 6)
    )
    total = pc.add(pc.multiply(pc.add(pc.multiply(hours, 60), minutes), 60), seconds)
    return _scaled(total, _nanos_of_second(parts), unit_nanos)


def _zoned_timestamp_text(values: Sequence[Any]) -> pa.Array:
    """Debezium's ``ZonedTimestamp`` of a datetimeoffset: ISO-8601 with the offset as SQL Server
    wrote it, as Java's ``ISO_OFFSET_DATE_TIME`` prints an ``OffsetDateTime``: the fraction with
    trailing zeros removed (none when zero), ``Z`` for a zero offset."""
    parts = _extract(_strings(values), _ZONED_TIMESTAMP)
    _local_seconds(parts)  # validates the calendar date
    fraction = pc.utf8_rtrim(_field(parts, "frac"), "0")
    fraction = pc.if_else(pc.equal(fraction, ""), "", pc.binary_join_element_wise(".", fraction, ""))
    offset = _field(parts, "offset")
    zero = pc.is_in(offset, pa.array(["Z", "+00:00", "-00:00"]))
    offset = pc.if_else(zero, "Z", offset)
    return pc.binary_join_element_wise(_field(parts, "date"), "T", _field(parts, "clock"), fraction, offset, "").cast(
        pa.string()
    )


def _temporal_text(values: pa.Array, kind: str, digits: int) -> pa.Array:
    """The canonical CONVERT 121 text: ``digits`` fractional digits, offsets as ``+hh:mm``."""
    pattern = {"time": _TIME, "local": _LOCAL_TIMESTAMP, "zoned": _ZONED_TIMESTAMP}[kind]
    parts = _extract(values, pattern)
    if kind != "time":
        _local_seconds(parts)  # validates the calendar date
    fraction = pc.utf8_slice_codeunits(pc.utf8_rpad(_field(parts, "frac"), 9, "0"), 0, digits)
    text = _field(parts, "clock")
    if digits:
        text = pc.binary_join_element_wise(text, fraction, ".")
    if kind != "time":
        text = pc.binary_join_element_wise(_field(parts, "date"), text, " ")
    if kind == "zoned":
        offset = _field(parts, "offset")
        offset = pc.if_else(pc.is_in(offset, pa.array(["Z", "-00:00"])), "+00:00", offset)
        text = pc.binary_join_element_wise(text, offset, " ")
    return text.cast(pa.string())


_TEMPORAL_TEXT: dict[str, Callable[[SqlServerType], tuple[str, int]]] = {
    "time": lambda t: ("time", t.scale),
    "datetime2": lambda t: ("local", t.scale),
    "datetimeoffset": lambda t: ("zoned", t.scale),
    "datetime": lambda t: ("local", 3),
    "smalldatetime": lambda t: ("local", 0),
}

_NANO_HINT = (
    "int64 nanoseconds since 1970 reach only 1677-09-21..2262-04-11: use time_precision_mode='spark' "
    "(microseconds), or add the column to column_text_list."
)


def _date(sql_type: SqlServerType, modes: ValueModes) -> Codec:
    if modes.time_precision in ("adaptive", "adaptive_time_microseconds"):
        return _codec(
            pa.int32(),
            "int32 days since 1970-01-01 (io.debezium.time.Date)",
            sql_type,
            lambda v: pa.array(v, type=pa.date32()).cast(pa.int32()),
        )
    return _codec(pa.date32(), "date", sql_type, _native(pa.date32()))


def _time(sql_type: SqlServerType, modes: ValueModes) -> Codec:
    mode, digits = modes.time_precision, sql_type.scale

    def codec(arrow_type: pa.DataType, what: str, unit_nanos: int) -> Codec:
        def convert(values: Sequence[Any]) -> pa.Array:
            return _time_of_day(values, unit_nanos).cast(arrow_type)

        return _codec(arrow_type, what, sql_type, convert, read=_READ_TIME)

    if mode == "connect" or (mode == "adaptive" and digits <= 3):
        return codec(pa.int32(), "int32 ms since midnight (io.debezium.time.Time)", 1_000_000)
    if mode == "adaptive" and digits == 7:
        return codec(pa.int64(), "int64 ns since midnight (io.debezium.time.NanoTime)", 1)
    if mode == "spark":
        return codec(pa.int64(), "int64 µs since midnight (Spark has no time type)", 1000)
    return codec(pa.int64(), "int64 µs since midnight (io.debezium.time.MicroTime)", 1000)


def _timestamp(sql_type: SqlServerType, modes: ValueModes) -> Codec:
    """datetime, smalldatetime, datetime2(n): zone-less."""
    mode = modes.time_precision
    read = _READ_DATETIME2 if sql_type.name == "datetime2" else _READ_DATETIME
    digits = sql_type.scale if sql_type.name == "datetime2" else 3

    def codec(arrow_type: pa.DataType, what: str, unit_nanos: int, hint: str = "") -> Codec:
        def convert(values: Sequence[Any]) -> pa.Array:
            return _epoch(values, unit_nanos, zoned=False).cast(arrow_type)

        return _codec(arrow_type, what, sql_type, convert, read=read, hint=hint)

    if mode == "spark":
        return codec(pa.timestamp("us"), "timestamp_ntz", 1000)
    if mode == "connect":
        return codec(pa.timestamp("ms"), "timestamp_ntz in ms (org.apache.kafka.connect.data.Timestamp)", 1_000_000)
    if digits <= 3:
        return codec(pa.int64(), "int64 ms since 1970 (io.debezium.time.Timestamp)", 1_000_000)
    if digits <= 6:
        return codec(pa.int64(), "int64 µs since 1970 (io.debezium.time.MicroTimestamp)", 1000)
    return codec(pa.int64(), "int64 ns since 1970 (io.debezium.time.NanoTimestamp)", 1, _NANO_HINT)


def _datetimeoffset(sql_type: SqlServerType, modes: ValueModes) -> Codec:
    if modes.time_precision == "spark":
        return _codec(
            pa.timestamp("us", tz="UTC"),
            "timestamp (UTC)",
            sql_type,
            lambda v: _epoch(v, 1000, zoned=True).cast(pa.timestamp("us", tz="UTC")),
            read=_READ_DATETIMEOFFSET,
        )
    return _codec(
        pa.string(),
        "ISO-8601 string with the offset (io.debezium.time.ZonedTimestamp)",
        sql_type,
        _zoned_timestamp_text,
        read=_READ_DATETIMEOFFSET,
    )


_BUILDERS: dict[str, Callable[[SqlServerType, ValueModes], Codec]] = {
    "bit": _bit_codec,
    "tinyint": _integer,
    "smallint": _integer,
    "int": _integer,
    "bigint": _integer,
    "decimal": _decimal,
    "numeric": _decimal,
    "money": _decimal,
    "smallmoney": _decimal,
    "real": _float,
    "float": _float,
    "date": _date,
    "time": _time,
    "datetime": _timestamp,
    "smalldatetime": _timestamp,
    "datetime2": _timestamp,
    "datetimeoffset": _datetimeoffset,
    "char": _string,
    "varchar": _string,
    "nchar": _string,
    "nvarchar": _string,
    "sysname": _string,
    "text": _string,
    "ntext": _string,
    "xml": _cast_string,
    "sql_variant": _cast_string,
    "uniqueidentifier": _uniqueidentifier,
    "binary": _binary,
    "varbinary": _binary,
    "image": _binary,
    "timestamp": _binary,  # rowversion: sys.types calls it timestamp
    "rowversion": _binary,
    "hierarchyid": _binary,
    "geometry": _binary,
    "geography": _binary,
}

#: Type names with a mapping; any other type is read as ``CAST([c] AS nvarchar(max))`` (if SQL
#: Server refuses that cast, the SELECT fails: the reader can name such columns with this set).
MAPPED_TYPES = frozenset(_BUILDERS)
