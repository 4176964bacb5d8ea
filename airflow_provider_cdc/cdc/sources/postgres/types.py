"""PostgreSQL column types → Arrow types, and text values → typed Arrow arrays.

The stream sees PostgreSQL's *text output* of every value (pgoutput sends text tuples); the
snapshot reads a binary ``COPY`` in which fixed-width types come in their binary send form and
every other column as its text output. A :class:`Codec` converts text, and for the types the
snapshot reads in binary also the send form (``Codec.binary``, :mod:`.binary_values`), to the
same values, so a row is identical whichever path it came from. Every session that produces
text uses the same output settings (:data:`SESSION_SETTINGS`).

How values are represented follows Debezium's handling modes (:class:`ValueModes`), plus a
Spark-native default for time types. Types without a mapping keep their text form (a string
column), never a crash and never a silent null. ``docs/types.md`` lists every mapping.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_cdc.cdc.events.value_modes import (  # re-exported: PostgreSQL code imports them from here
    BINARY_MODES,
    DECIMAL_MODES,
    DEFAULT_PLACEHOLDER,
    HSTORE_MODES,
    INTERVAL_MODES,
    MAX_DECIMAL_PRECISION,
    TIME_PRECISION_MODES,
    ValueConversionError,
    ValueModes,
)
from airflow_provider_cdc.cdc.sources.postgres import binary_values as bv
from airflow_provider_cdc.cdc.sources.postgres import values as pgv

__all__ = [
    "BINARY_MODES",
    "DECIMAL_MODES",
    "DEFAULT_PLACEHOLDER",
    "HSTORE_MODES",
    "INTERVAL_MODES",
    "MAX_DECIMAL_PRECISION",
    "TIME_PRECISION_MODES",
    "ValueConversionError",
    "ValueModes",
]

#: Session settings every capture connection uses, so text forms are deterministic.
SESSION_SETTINGS: dict[str, str] = {
    "TimeZone": "UTC",
    "DateStyle": "ISO, MDY",
    "IntervalStyle": "iso_8601",
    "bytea_output": "hex",
    "extra_float_digits": "3",
    "lc_monetary": "C",
    "client_encoding": "UTF8",
}

# Built-in type OIDs (stable across PostgreSQL versions).
BOOL, BYTEA, CHAR, NAME, INT8, INT2, INT4, TEXT, OID = 16, 17, 18, 19, 20, 21, 23, 25, 26
JSON, XML, POINT, FLOAT4, FLOAT8, MONEY = 114, 142, 600, 700, 701, 790
BPCHAR, VARCHAR, DATE, TIME, TIMESTAMP, TIMESTAMPTZ = 1042, 1043, 1082, 1083, 1114, 1184
INTERVAL, TIMETZ, BIT, VARBIT, NUMERIC, UUID, JSONB = 1186, 1266, 1560, 1562, 1700, 2950, 3802

MONEY_PRECISION = 19  # money is an int64 of the smallest currency unit

# Debezium's encodings of ±infinity for numeric temporal representations.
POS_INFINITY_MICROS = 9223372036825200000
NEG_INFINITY_MICROS = -9223372036832400000
# Spark's TimestampType/DateType range: ±infinity map to its ends in the Spark-native mode.
SPARK_MAX_MICROS = pgv.days_from_civil(9999, 12, 31) * pgv.US_PER_DAY + pgv.US_PER_DAY - 1
SPARK_MIN_MICROS = pgv.days_from_civil(1, 1, 1) * pgv.US_PER_DAY
SPARK_MAX_DAYS = pgv.days_from_civil(9999, 12, 31)
SPARK_MIN_DAYS = pgv.days_from_civil(1, 1, 1)


@dataclass(frozen=True)
class PgType:
    """A column type as the catalog describes it (domains and arrays resolved)."""

    oid: int
    modifier: int = -1
    name: str = ""  # format_type(): "numeric(12,2)", "character varying(20)", "public.mood"
    type_name: str = ""  # pg_type.typname: "numeric", "hstore", "_int4"
    kind: str = "b"  # typtype: b base, d domain, e enum, r range, m multirange, c composite, p pseudo
    category: str = ""  # typcategory: A array, ...
    element: PgType | None = None
    base: PgType | None = None  # the base type of a domain (its own modifier applied)

    def resolved(self) -> PgType:
        """Follow domains down to their base type."""
        pg_type = self
        while pg_type.kind == "d" and pg_type.base is not None:
            base = pg_type.base
            if pg_type.modifier >= 0 and base.modifier < 0:
                base = replace(base, modifier=pg_type.modifier)
            pg_type = base
        return pg_type

    def precision(self, default: int = 6) -> int:
        """Fractional-second digits of time/timestamp types."""
        return self.modifier if 0 <= self.modifier <= 6 else default

    def numeric_precision_scale(self) -> tuple[int, int] | None:
        if self.modifier < 4:
            return None
        packed = self.modifier - 4
        scale = packed & 0x7FF
        if scale & 0x400:  # PostgreSQL 15+ allows negative scales (11-bit two's complement)
            scale -= 0x800
        return (packed >> 16) & 0xFFFF, scale


def numeric_at_scale(text: str, pg_type: PgType) -> str:
    """``text`` with as many fraction digits as a ``numeric(p, s)`` column prints (``s``): YugabyteDB
    stores numerics normalized, so both its walsender and its CDC service may drop trailing zeros.
    Never rounds: a value with more digits is left as it is."""
    precision_scale = pg_type.numeric_precision_scale()
    if precision_scale is None or precision_scale[1] <= 0 or not re.fullmatch(r"-?\d+(\.\d+)?", text):
        return text
    scale = precision_scale[1]
    whole, _, fraction = text.partition(".")
    return f"{whole}.{fraction.ljust(scale, '0')}" if len(fraction) < scale else text


#: Converter from a string array to the codec's Arrow type.
Converter = Callable[[pa.Array], pa.Array]


@dataclass(frozen=True)
class Codec:
    """How one column is captured: its Arrow type and the conversion from PostgreSQL text, and
    for types the snapshot reads in binary, the conversion from the binary send form to the
    same values (None: the snapshot reads the text form)."""

    arrow_type: pa.DataType
    description: str
    convert: Converter = field(compare=False, repr=False)
    placeholder: object = field(default=None, compare=False)  # unchanged-TOAST stand-in, or None
    binary: bv.BinaryDecoder | None = field(default=None, compare=False, repr=False)


def codec_for(pg_type: PgType, modes: ValueModes) -> Codec:
    pg_type = pg_type.resolved()
    if pg_type.category == "A" and pg_type.element is not None:
        codec = _array_codec(pg_type, modes)
    else:
        builder = _BY_OID.get(pg_type.oid) or _BY_NAME.get(pg_type.type_name)
        codec = builder(pg_type, modes) if builder is not None else _text(TEXT_FORM)
    return _with_placeholder(codec, modes)


def text_codec(modes: ValueModes) -> Codec:
    """PostgreSQL's text form, whatever the type (``column_text_list``)."""
    return _with_placeholder(_text("text form (column_text_list)"), modes)


def cast_binary(values: bv.BinaryColumn, codec: Codec, *, column: str, table: str) -> pa.Array:
    """Convert binary send forms with ``codec.binary`` (the same values :func:`cast_text` gives
    for their text forms, and the same error for a value the codec cannot represent)."""
    if codec.binary is None:
        raise RuntimeError(f"column {column!r} of {table}: its codec has no binary form")
    try:
        return codec.binary(values)
    except bv.BinaryValueError as exc:
        raise ValueConversionError(
            f"column {column!r} of {table}: value {exc.text!r} cannot be captured as {codec.description} "
            f"({exc}). {_hint(codec)}"
        ) from None


def cast_text(values: pa.Array, codec: Codec, *, column: str, table: str) -> pa.Array:
    """Convert PostgreSQL text output (a string array, nulls allowed) with ``codec``."""
    try:
        return codec.convert(values)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError, ArithmeticError) as exc:
        bad = _first_unconvertible(values, codec)
        raise ValueConversionError(
            f"column {column!r} of {table}: value {bad!r} cannot be captured as {codec.description} "
            f"({exc}). {_hint(codec)}"
        ) from None


def _hint(codec: Codec) -> str:
    text = "add the column to column_text_list to capture its text form"
    if pa.types.is_decimal(codec.arrow_type):
        return f"Use decimal_handling_mode='string' or 'double' to capture NaN, or {text}."
    if pa.types.is_list(codec.arrow_type):
        return f"Only one-dimensional arrays map to lists: {text}."
    return f"To capture it anyway, {text}, or exclude it."


def _first_unconvertible(values: pa.Array, codec: Codec) -> str | None:
    for value in values.to_pylist():
        if value is None:
            continue
        try:
            codec.convert(pa.array([value], pa.string()))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError, ArithmeticError):
            return value
    return None


# -- helpers -------------------------------------------------------------------------------------


TEXT_FORM = "text form"


def _text(description: str) -> Codec:
    return Codec(pa.string(), description, lambda values: values)


def _uuid(pg_type: PgType, modes: ValueModes) -> Codec:
    # Unmapped like any other type (its text form), but read in binary by the snapshot.
    return replace(_text(TEXT_FORM), binary=bv.uuid_text)


def _map_values(values: pa.Array, function: Callable[[str], object], arrow_type: pa.DataType) -> pa.Array:
    """Per-value Python conversion (for types Arrow has no kernel for)."""
    return pa.array([None if v is None else function(v) for v in values.to_pylist()], type=arrow_type)


def _with_specials(
    values: pa.Array,
    fast: Callable[[pa.Array], pa.Array],
    is_special: Callable[[pa.Array], pa.Array],
    slow: Callable[[str], object],
    arrow_type: pa.DataType,
) -> pa.Array:
    """Vectorised conversion, with a per-value fallback only for the rows ``is_special`` marks."""
    special = is_special(values)
    if not pc.any(special).as_py():
        return fast(values)
    normal = pc.if_else(special, pa.scalar(None, pa.string()), values)
    converted = fast(normal)
    slow_values = pa.array(
        [slow(v) if s else None for v, s in zip(values.to_pylist(), special.to_pylist())], type=arrow_type
    )
    return pc.if_else(special, slow_values, converted)


def _floor_divide(values: pa.Array, divisor: int) -> pa.Array:
    """Integer division rounding towards negative infinity (Java's floorDiv), for instants."""
    quotient = pc.divide(values, divisor)  # truncates towards zero for integers
    inexact_negative = pc.and_(pc.less(values, 0), pc.not_equal(pc.multiply(quotient, divisor), values))
    return pc.subtract(quotient, pc.cast(inexact_negative, values.type))


def _temporal_special(values: pa.Array) -> pa.Array:
    """BC dates, years beyond 9999 and ±infinity: outside what Arrow's ISO parser accepts.

    PostgreSQL writes every other date with a 4-digit, zero-padded year, so a character other
    than '-' at index 4 marks both ``[-]infinity`` and 5+ digit years (one cheap kernel instead
    of a regular expression: this runs on every timestamp of every chunk)."""
    return pc.fill_null(
        pc.or_(pc.ends_with(values, " BC"), pc.not_equal(pc.utf8_slice_codeunits(values, 4, 5), "-")),
        False,
    )


# -- numbers -------------------------------------------------------------------------------------


def _cast(arrow_type: pa.DataType, description: str, binary: bv.BinaryDecoder | None = None) -> Codec:
    return Codec(arrow_type, description, lambda values: pc.cast(values, arrow_type), binary=binary)


def _integer(arrow_type: pa.DataType, description: str, send_form: str) -> Callable[[PgType, ValueModes], Codec]:
    return lambda pg_type, modes: _cast(arrow_type, description, bv.integer(send_form, arrow_type))


def _float(arrow_type: pa.DataType, description: str, send_form: str) -> Callable[[PgType, ValueModes], Codec]:
    return lambda pg_type, modes: _cast(arrow_type, description, bv.floating(send_form, arrow_type))


def _bool(pg_type: PgType, modes: ValueModes) -> Codec:
    return Codec(pa.bool_(), "boolean", lambda values: pc.equal(values, "t"), binary=bv.boolean)


def _numeric(pg_type: PgType, modes: ValueModes) -> Codec:
    if modes.decimal == "double":
        return _cast(pa.float64(), "double (decimal_handling_mode=double)")
    if modes.decimal == "string":
        return _text("exact decimal text (decimal_handling_mode=string)")
    precision_scale = pg_type.numeric_precision_scale()
    if precision_scale is None:
        return _text("exact decimal text (unconstrained numeric has no fixed scale)")
    precision, scale = precision_scale
    if not 0 <= scale <= precision <= MAX_DECIMAL_PRECISION:
        return _text(f"exact decimal text (numeric({precision},{scale}) exceeds decimal(38))")
    arrow_type = pa.decimal128(precision, scale)
    # The snapshot reads numerics as text: decoding their base-10000 send form in numpy cost
    # about what the server saves by not printing them (measured: docs/benchmarks.md).
    return Codec(arrow_type, f"decimal({precision},{scale})", lambda values: pc.cast(values, arrow_type))


def _money(pg_type: PgType, modes: ValueModes) -> Codec:
    if modes.decimal == "double":
        return Codec(
            pa.float64(), "double", lambda v: _map_values(v, lambda t: float(pgv.parse_money(t)), pa.float64())
        )
    if modes.decimal == "string":
        return Codec(
            pa.string(), "decimal text", lambda v: _map_values(v, lambda t: str(pgv.parse_money(t)), pa.string())
        )
    arrow_type = pa.decimal128(MONEY_PRECISION, 2)
    return Codec(arrow_type, "decimal(19,2)", lambda v: _map_values(v, pgv.parse_money, arrow_type))


def _bit(pg_type: PgType, modes: ValueModes) -> Codec:
    if pg_type.oid == BIT and pg_type.modifier == 1:
        return Codec(pa.bool_(), "boolean (bit(1))", lambda values: pc.equal(values, "1"))
    return _text("string of 0 and 1")


# -- binary --------------------------------------------------------------------------------------


def _bytea_bytes(values: pa.Array) -> list[bytes | None]:
    # bytea_output=hex is forced per session, so every value is '\x' + hex digits.
    return [None if v is None else bytes.fromhex(v[2:]) for v in values.to_pylist()]


def _bytea(pg_type: PgType, modes: ValueModes) -> Codec:
    if modes.binary == "base64":
        return Codec(
            pa.string(),
            "base64 string",
            lambda v: pa.array(
                [None if b is None else base64.b64encode(b).decode() for b in _bytea_bytes(v)], pa.string()
            ),
        )
    if modes.binary == "hex":
        return Codec(pa.string(), "hex string", lambda v: pc.utf8_slice_codeunits(v, 2))
    return Codec(pa.binary(), "binary", lambda v: pa.array(_bytea_bytes(v), pa.binary()), binary=bv.raw_bytes)


# -- time ----------------------------------------------------------------------------------------


def _epoch_days(values: pa.Array, infinity: dict[str, int]) -> pa.Array:
    """Days since the epoch (int32), with ±infinity mapped through ``infinity``."""

    def slow(text: str) -> int:
        parsed = pgv.parse_date(text)
        return infinity[parsed] if isinstance(parsed, str) else parsed

    return _with_specials(
        values, lambda x: pc.cast(pc.cast(x, pa.date32()), pa.int32()), _temporal_special, slow, pa.int32()
    )


def _epoch_micros(values: pa.Array, zoned: bool, infinity: dict[str, int]) -> pa.Array:
    """Microseconds since the epoch (int64, UTC for timestamptz), ±infinity through ``infinity``."""

    def slow(text: str) -> int:
        parsed = pgv.parse_timestamp(text)
        return infinity[parsed] if isinstance(parsed, str) else parsed

    def fast(text: pa.Array) -> pa.Array:
        return pc.cast(pc.cast(text, pa.timestamp("us", tz="UTC" if zoned else None)), pa.int64())

    return _with_specials(values, fast, _temporal_special, slow, pa.int64())


def _date(pg_type: PgType, modes: ValueModes) -> Codec:
    if modes.time_precision in ("adaptive", "adaptive_time_microseconds"):
        limits = {pgv.INFINITY: 2**31 - 1, pgv.NEG_INFINITY: -(2**31)}
        return Codec(
            pa.int32(),
            "int32 days since epoch (io.debezium.time.Date)",
            lambda v: _epoch_days(v, limits),
            binary=lambda b: bv.epoch_days(b, limits),
        )
    limits = {pgv.INFINITY: SPARK_MAX_DAYS, pgv.NEG_INFINITY: SPARK_MIN_DAYS}
    return Codec(
        pa.date32(),
        "date",
        lambda v: _epoch_days(v, limits).cast(pa.date32()),
        binary=lambda b: bv.epoch_days(b, limits).cast(pa.date32()),
    )


def _timestamp(pg_type: PgType, modes: ValueModes) -> Codec:
    zoned = pg_type.oid == TIMESTAMPTZ
    mode = modes.time_precision
    if zoned and mode != "spark":
        return Codec(
            pa.string(),
            "ISO-8601 UTC string (io.debezium.time.ZonedTimestamp)",
            lambda v: _map_values(v, _zoned_timestamp_text, pa.string()),
        )
    if mode in ("spark", "connect"):
        # Spark-native types; ±infinity become the ends of Spark's timestamp range.
        unit = "ms" if mode == "connect" else "us"
        arrow_type = pa.timestamp(unit, tz="UTC" if zoned else None)
        limits = {pgv.INFINITY: SPARK_MAX_MICROS, pgv.NEG_INFINITY: SPARK_MIN_MICROS}

        # Both forms become the same epoch microseconds, then the same arithmetic.
        def finish(micros: pa.Array) -> pa.Array:
            return (_floor_divide(micros, 1000) if unit == "ms" else micros).cast(arrow_type)

        return Codec(
            arrow_type,
            f"timestamp[{unit}{', UTC' if zoned else ''}]",
            lambda v: finish(_epoch_micros(v, zoned, limits)),
            binary=lambda b: finish(bv.epoch_micros(b, limits, zoned=zoned)),
        )
    divisor = 1000 if pg_type.precision() <= 3 else 1
    limits = {pgv.INFINITY: POS_INFINITY_MICROS, pgv.NEG_INFINITY: NEG_INFINITY_MICROS}

    def finish_numeric(micros: pa.Array) -> pa.Array:
        return _floor_divide(micros, divisor) if divisor > 1 else micros

    name = "io.debezium.time.Timestamp (ms)" if divisor > 1 else "io.debezium.time.MicroTimestamp (µs)"
    return Codec(
        pa.int64(),
        f"int64 {name}",
        lambda v: finish_numeric(_epoch_micros(v, zoned, limits)),
        binary=lambda b: finish_numeric(bv.epoch_micros(b, limits, zoned=zoned)),
    )


def _zoned_timestamp_text(text: str) -> str:
    parsed = pgv.parse_timestamp(text)
    return parsed if isinstance(parsed, str) else pgv.format_zoned_timestamp(parsed)


def _time(pg_type: PgType, modes: ValueModes) -> Codec:
    mode = modes.time_precision
    if mode == "connect" or (mode == "adaptive" and pg_type.precision() <= 3):
        return Codec(
            pa.int32(),
            "int32 ms since midnight (io.debezium.time.Time)",
            lambda v: _map_values(v, lambda t: pgv.parse_time(t) // 1000, pa.int32()),
            binary=lambda b: pc.divide(bv.time_micros(b), 1000).cast(pa.int32()),  # never negative
        )
    return Codec(
        pa.int64(),
        "int64 µs since midnight (io.debezium.time.MicroTime)",
        lambda v: _map_values(v, pgv.parse_time, pa.int64()),
        binary=bv.time_micros,
    )


def _timetz(pg_type: PgType, modes: ValueModes) -> Codec:
    return Codec(
        pa.string(),
        "ISO-8601 UTC time string (io.debezium.time.ZonedTime)",
        lambda v: _map_values(v, lambda t: pgv.format_zoned_time(*pgv.parse_timetz(t)), pa.string()),
    )


def _interval(pg_type: PgType, modes: ValueModes) -> Codec:
    if modes.interval == "string":
        return _text("ISO-8601 duration string (io.debezium.time.Interval)")
    return Codec(
        pa.int64(),
        "int64 µs, 365.25/12-day months (io.debezium.time.MicroDuration)",
        lambda v: _map_values(v, pgv.interval_micros, pa.int64()),
    )


# -- structured ----------------------------------------------------------------------------------

POINT_TYPE = pa.struct([pa.field("x", pa.float64()), pa.field("y", pa.float64())])
HSTORE_MAP_TYPE = pa.map_(pa.string(), pa.string())


def _point(pg_type: PgType, modes: ValueModes) -> Codec:
    def convert(values: pa.Array) -> pa.Array:
        return pa.array(
            [None if v is None else dict(zip(("x", "y"), pgv.parse_point(v))) for v in values.to_pylist()],
            type=POINT_TYPE,
        )

    return Codec(POINT_TYPE, "struct<x double, y double> (io.debezium.data.geometry.Point)", convert)


def _hstore(pg_type: PgType, modes: ValueModes) -> Codec:
    if modes.hstore == "map":
        return Codec(HSTORE_MAP_TYPE, "map<string,string>", lambda v: _map_values(v, pgv.parse_hstore, HSTORE_MAP_TYPE))
    return Codec(
        pa.string(),
        "JSON object string (io.debezium.data.Json)",
        lambda v: _map_values(v, lambda t: json.dumps(dict(pgv.parse_hstore(t)), ensure_ascii=False), pa.string()),
    )


def _array_codec(pg_type: PgType, modes: ValueModes) -> Codec:
    if pg_type.element is None:
        raise TypeError(f"{pg_type} is not an array type")
    # An array column's type modifier belongs to its elements: numeric(5,2)[], varchar(10)[].
    element_type = pg_type.element
    if element_type.modifier < 0 <= pg_type.modifier:
        element_type = replace(element_type, modifier=pg_type.modifier)
    element = codec_for(element_type, modes)
    list_type = pa.list_(element.arrow_type)

    def convert(values: pa.Array) -> pa.Array:
        offsets, items = [0], []
        validity = []
        for text in values.to_pylist():
            if text is None:
                validity.append(False)
            else:
                validity.append(True)
                items.extend(pgv.parse_array(text))
            offsets.append(len(items))
        converted = element.convert(pa.array(items, pa.string()))
        mask = pa.array([not v for v in validity])
        return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), converted, type=list_type, mask=mask)

    return Codec(list_type, f"list<{element.description}>", convert)


def _with_placeholder(codec: Codec, modes: ValueModes) -> Codec:
    placeholder = modes.unavailable_value_placeholder
    arrow_type = codec.arrow_type
    if pa.types.is_string(arrow_type):
        value: object = placeholder
    elif pa.types.is_binary(arrow_type):
        value = bytes.fromhex(placeholder[4:]) if placeholder.startswith("hex:") else placeholder.encode()
    elif pa.types.is_list(arrow_type) and pa.types.is_string(arrow_type.value_type):
        value = [placeholder]
    else:
        value = None  # no room for a marker: null, and the column is listed as unchanged
    return replace(codec, placeholder=value)


_BY_OID: dict[int, Callable[[PgType, ValueModes], Codec]] = {
    BOOL: _bool,
    INT2: _integer(pa.int16(), "int16", ">i2"),
    INT4: _integer(pa.int32(), "int32", ">i4"),
    INT8: _integer(pa.int64(), "int64", ">i8"),
    OID: _integer(pa.int64(), "int64", ">u4"),  # unsigned: widened
    FLOAT4: _float(pa.float32(), "float32", ">f4"),
    FLOAT8: _float(pa.float64(), "float64", ">f8"),
    NUMERIC: _numeric,
    MONEY: _money,
    BIT: _bit,
    VARBIT: _bit,
    BYTEA: _bytea,
    DATE: _date,
    TIMESTAMP: _timestamp,
    TIMESTAMPTZ: _timestamp,
    TIME: _time,
    TIMETZ: _timetz,
    INTERVAL: _interval,
    POINT: _point,
    UUID: _uuid,
}

_BY_NAME: dict[str, Callable[[PgType, ValueModes], Codec]] = {
    "hstore": _hstore,  # an extension type: its OID differs per database
}


# -- catalog -------------------------------------------------------------------------------------

_TYPE_SQL = """
SELECT t.oid::int8, t.typname::text, t.typtype::text, t.typcategory::text, t.typelem::int8,
       t.typbasetype::int8, t.typtypmod, format_type(t.oid, NULL)
FROM pg_type t WHERE t.oid = ANY(%s::oid[])
"""


def resolve_types(conn, columns: list[tuple[int, int]]) -> dict[tuple[int, int], PgType]:
    """Resolve (type OID, modifier) pairs to :class:`PgType` trees (domains, arrays)."""
    rows: dict[int, tuple] = {}
    pending = {oid for oid, _ in columns}
    while pending:
        fetched = conn.execute(_TYPE_SQL, (sorted(pending),)).fetchall()
        for row in fetched:
            rows[row[0]] = row
        pending = {oid for row in fetched for oid in (row[4], row[5]) if oid and oid not in rows}

    def build(oid: int, modifier: int) -> PgType:
        row = rows.get(oid)
        if row is None:
            return PgType(oid, modifier)
        _, typname, typtype, category, elem, basetype, typtypmod, formatted = row
        return PgType(
            oid=oid,
            modifier=modifier,
            name=formatted,
            type_name=typname,
            kind=typtype,
            category=category,
            element=build(elem, -1) if category == "A" and elem else None,
            base=build(basetype, typtypmod) if typtype == "d" and basetype else None,
        )

    return {(oid, modifier): build(oid, modifier) for oid, modifier in columns}


class TypeCache:
    """Resolved column types by (OID, modifier); unknown ones are fetched from the catalog.

    Relation messages name types by OID only; a column added mid-window may use a type not seen
    when the window started, so the stream keeps a catalog connection to resolve it.
    """

    def __init__(self, conn=None, known: dict[tuple[int, int], PgType] | None = None):
        self._conn = conn
        self._known = dict(known or {})

    def get(self, oid: int, modifier: int) -> PgType:
        key = (oid, modifier)
        if key not in self._known:
            if self._conn is None:
                self._known[key] = PgType(oid, modifier)
            else:
                self._known.update(resolve_types(self._conn, [key]))
        return self._known[key]


__all__ = [
    "SESSION_SETTINGS",
    "Codec",
    "PgType",
    "TypeCache",
    "ValueConversionError",
    "ValueModes",
    "cast_binary",
    "cast_text",
    "codec_for",
    "resolve_types",
    "text_codec",
]
