"""PostgreSQL column types → Arrow types, and text values → typed Arrow arrays.

Both capture paths see PostgreSQL's *text output* of every value: the stream because pgoutput
sends text tuples, the snapshot because it reads ``COPY ... (FORMAT csv)``. Both run the same
:func:`cast_text` on those strings, so a row is identical whichever path it came from. Every
session that produces text sets the same output settings (:data:`SESSION_SETTINGS`), because
text forms of timestamps, bytea and floats depend on them.

Types without a mapping keep their text form (a string column), never a crash or a null.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_cdc.cdc.errors import CdcError

#: Session settings every capture connection uses, so text forms are deterministic.
SESSION_SETTINGS: dict[str, str] = {
    "TimeZone": "UTC",
    "DateStyle": "ISO, MDY",
    "IntervalStyle": "iso_8601",
    "bytea_output": "hex",
    "extra_float_digits": "3",
    "client_encoding": "UTF8",
}

# Built-in type OIDs (pg_type.oid is stable for built-in types).
BOOL, BYTEA, CHAR, NAME, INT8, INT2, INT4, TEXT, OID = 16, 17, 18, 19, 20, 21, 23, 25, 26
JSON, FLOAT4, FLOAT8, BPCHAR, VARCHAR, DATE = 114, 700, 701, 1042, 1043, 1082
TIMESTAMP, TIMESTAMPTZ, NUMERIC, UUID, JSONB = 1114, 1184, 1700, 2950, 3802

MAX_ARROW_DECIMAL_PRECISION = 38  # also Spark's DecimalType limit

_FIXED_TYPES: dict[int, pa.DataType] = {
    BOOL: pa.bool_(),
    INT2: pa.int16(),
    INT4: pa.int32(),
    INT8: pa.int64(),
    OID: pa.int64(),
    FLOAT4: pa.float32(),
    FLOAT8: pa.float64(),
    DATE: pa.date32(),
    TIMESTAMP: pa.timestamp("us"),
    TIMESTAMPTZ: pa.timestamp("us", tz="UTC"),
    BYTEA: pa.binary(),
}


class ValueConversionError(CdcError):
    """A source value has no representation in the column's mapped type."""


@dataclass(frozen=True)
class PgType:
    """A column's type as PostgreSQL describes it: type OID and type modifier (``atttypmod``)."""

    oid: int
    modifier: int = -1
    name: str = ""

    def numeric_precision_scale(self) -> tuple[int, int] | None:
        """(precision, scale) of a constrained ``numeric``; ``None`` when unconstrained."""
        if self.oid != NUMERIC or self.modifier < 4:
            return None
        packed = self.modifier - 4
        scale = packed & 0x7FF
        if scale & 0x400:  # PostgreSQL 15+ allows negative scales (11-bit two's complement)
            scale -= 0x800
        return (packed >> 16) & 0xFFFF, scale


def arrow_type(pg_type: PgType) -> pa.DataType:
    """The Arrow (and so Spark and Parquet) type a column is captured as."""
    fixed = _FIXED_TYPES.get(pg_type.oid)
    if fixed is not None:
        return fixed
    if pg_type.oid == NUMERIC:
        precision_scale = pg_type.numeric_precision_scale()
        if precision_scale is not None:
            precision, scale = precision_scale
            if 0 <= scale <= precision <= MAX_ARROW_DECIMAL_PRECISION:
                return pa.decimal128(precision, scale)
    # Unconstrained or wide numeric, text types, uuid, json(b) and every unmapped type keep
    # PostgreSQL's text form, which is lossless.
    return pa.string()


def cast_text(values: pa.Array, pg_type: PgType, *, column: str, table: str) -> pa.Array:
    """Convert PostgreSQL text output (a string array, nulls allowed) to the mapped type."""
    target = arrow_type(pg_type)
    try:
        return _convert(values, pg_type, target)
    except (pa.ArrowInvalid, ValueError) as exc:
        bad = _first_unconvertible(values, target, pg_type)
        raise ValueConversionError(
            f"column {column!r} of {table}: value {bad!r} of type {pg_type.name or pg_type.oid} "
            f"cannot be represented as {target} ({exc}). Special values such as NaN, infinity, "
            "BC dates and years beyond 9999 are handled by the full type matrix; until then "
            "exclude the column or cast it to text in a view."
        ) from exc


def _convert(values: pa.Array, pg_type: PgType, target: pa.DataType) -> pa.Array:
    if pa.types.is_string(target):
        return values
    if pg_type.oid == BOOL:
        return pc.equal(values, "t")
    if pg_type.oid == BYTEA:
        return _bytea_from_hex(values)
    return pc.cast(values, target)


def _bytea_from_hex(values: pa.Array) -> pa.Array:
    # bytea_output=hex is forced per session, so every value is '\x' + hex digits.
    decoded = [None if v is None else bytes.fromhex(v[2:]) for v in values.to_pylist()]
    return pa.array(decoded, type=pa.binary())


def _first_unconvertible(values: pa.Array, target: pa.DataType, pg_type: PgType) -> str | None:
    for value in values.to_pylist():
        if value is None:
            continue
        try:
            _convert(pa.array([value], pa.string()), pg_type, target)
        except (pa.ArrowInvalid, ValueError):
            return value
    return None
