"""YB's column values (``DatumMessagePB``) as the text PostgreSQL prints under the capture's settings.

The logical-replication sources receive every value as its text output in a session with
``SESSION_SETTINGS`` (:mod:`..postgres.types`: ``DateStyle ISO``, ``TimeZone UTC``,
``IntervalStyle iso_8601``, ``extra_float_digits 3``, ``bytea_output hex``), and the codecs convert
that text. For a ``GetChanges`` from a Debezium-type client the tablet server fills the datum as
``docdb_pgapi.cc`` ``SetValueFromQLBinaryHelper`` decides (yugabyte/yugabyte-db):

==============================  ============================  ==========================================
PostgreSQL type                 datum field                   here
==============================  ============================  ==========================================
bool                            ``datum_bool``                ``t`` / ``f`` (``boolout``)
int2, int4                      ``datum_int32``               decimal digits
int8, oid                       ``datum_int64``               decimal digits
float4, float8                  ``datum_float/_double``       PostgreSQL's shortest exact output
                                                              (:func:`pg_float_text`)
interval, interval[]            ``datum_string``              ``interval_out`` with the server's
                                                              default ``IntervalStyle postgres``:
                                                              rewritten as ``iso_8601``
numeric(p, s)                   ``datum_string``              ``numeric_out`` of YB's decimal, padded
                                                              to the column's scale (PostgreSQL always
                                                              prints ``s`` digits)
timestamptz (and its arrays,    ``datum_string``              printed with time zone ``GMT``
ranges)                                                       (``DecodeTZDatum``): ``...+00``, as UTC
every other type                ``datum_string``              the type's output function, unchanged
NULL                            no datum (only the type)      SQL NULL
==============================  ============================  ==========================================

Some columns the service cannot send (:mod:`.carried_types`): an untyped (oid 0) or composite
column comes with no datum whatever its value, and a type outside the service's switch with
``""``. Setup refuses such columns; should one reach a window anyway (a column added later),
its missing datum or empty text is a :class:`DecodingError`, never a NULL or an empty value.

A column an image does not carry is "not sent" (``UNCHANGED_TOAST``, pgoutput's ``'u'``): the
caller decides that from the tuple (:mod:`.records`); a datum with ``datum_missing`` set is taken
the same way. ``datum_bytes`` is never filled for YSQL by the code above; should it come, it is
accepted for ``bytea`` only.
"""

from __future__ import annotations

import math
import re

import numpy as np

from airflow_provider_cdc.cdc.basics.errors import DecodingError
from airflow_provider_cdc.cdc.sources.postgres import values as pgv
from airflow_provider_cdc.cdc.sources.postgres.decoder import UNCHANGED_TOAST, ColumnValue
from airflow_provider_cdc.cdc.sources.postgres.types import BYTEA, FLOAT4, INTERVAL, NUMERIC, PgType, numeric_at_scale
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.carried_types import datum_type_not_sent, why_not_sent
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb

INTERVAL_ARRAY = 1187  # _interval


def column_value(datum: pb.DatumMessagePB, pg_type: PgType) -> ColumnValue:
    """The value pgoutput would send for ``datum`` of a column of ``pg_type``: its text output
    (UTF-8), None for NULL, or ``UNCHANGED_TOAST`` for a value YB marks missing."""
    which = datum.WhichOneof("datum")
    if which is None or (which == "datum_string" and not datum.datum_string):
        _refuse_if_not_sent(datum, pg_type, which)
    if which is None:
        return None  # YB sends a NULL as the column's type with no datum (AddColumnToMap)
    resolved = pg_type.resolved()
    if which == "datum_string":
        return _string(datum.datum_string, resolved).encode("utf-8")
    if which == "datum_bool":
        return b"t" if datum.datum_bool else b"f"
    if which == "datum_int32":
        return str(datum.datum_int32).encode("ascii")
    if which == "datum_int64":
        return str(datum.datum_int64).encode("ascii")
    if which == "datum_double":
        return pg_float_text(datum.datum_double, single=resolved.oid == FLOAT4).encode("ascii")
    if which == "datum_float":
        return pg_float_text(datum.datum_float, single=True).encode("ascii")
    if which == "datum_missing":
        return UNCHANGED_TOAST if datum.datum_missing else None
    if which == "datum_bytes" and resolved.oid == BYTEA:
        return b"\\x" + datum.datum_bytes.hex().encode("ascii")
    raise DecodingError(
        f"column {datum.column_name!r}: a {which} value for type {resolved.name or resolved.oid} is not understood"
    )


def _refuse_if_not_sent(datum: pb.DatumMessagePB, pg_type: PgType, which: str | None) -> None:
    """A missing datum or an empty string of a type the service cannot send is no value at all:
    taking it for NULL or '' would silently replace the row's real value."""
    why = why_not_sent(pg_type)
    if why is None and datum_type_not_sent(datum.column_type):
        why = f"the service sends no value of stored type oid {datum.column_type}"
    if why is None:
        return
    got = "no value" if which is None else "an empty string"
    raise DecodingError(
        f"column {datum.column_name!r} ({pg_type.name or pg_type.type_name or pg_type.oid}): YugabyteDB's CDC "
        f"service sent {got}, which may stand for any value ({why}). Capture the table with the "
        "logical-replication YugabyteCapture, or change the column's type, and re-snapshot"
    )


def _string(text: str, pg_type: PgType) -> str:
    if pg_type.oid == INTERVAL:
        return interval_iso8601(text)
    if pg_type.oid == INTERVAL_ARRAY or (pg_type.element is not None and pg_type.element.resolved().oid == INTERVAL):
        return _interval_array(text)
    if pg_type.oid == NUMERIC:
        return numeric_at_scale(text, pg_type)
    return text


# -- floats --------------------------------------------------------------------------------------


def pg_float_text(value: float, *, single: bool = False) -> str:
    """``float8out`` / ``float4out`` with ``extra_float_digits > 0`` (PostgreSQL 12+): the shortest
    digits that read back as the same number (Ryu, ``src/common/d2s.c``, ``f2s.c``), in fixed
    notation for decimal exponents in ``[-4, 15)`` (float4: ``[-4, 6)``), else ``d.ddde±XX``."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    number = np.float32(value) if single else np.float64(value)
    mantissa, _, exponent = np.format_float_scientific(number, unique=True, trim="-").partition("e")
    sign = "-" if mantissa.startswith("-") else ""
    digits = mantissa.lstrip("-").replace(".", "")
    exp = int(exponent)
    if -4 <= exp < (6 if single else 15):
        if exp < 0:
            return f"{sign}0.{'0' * (-exp - 1)}{digits}"
        whole, fraction = digits[: exp + 1].ljust(exp + 1, "0"), digits[exp + 1 :]
        return f"{sign}{whole}.{fraction}" if fraction else f"{sign}{whole}"
    head = digits[0] + (f".{digits[1:]}" if len(digits) > 1 else "")
    return f"{sign}{head}e{'-' if exp < 0 else '+'}{abs(exp):02d}"


# -- numeric -------------------------------------------------------------------------------------


# -- intervals -----------------------------------------------------------------------------------

_POSTGRES_INTERVAL = re.compile(
    r"^(?:(?P<years>[+-]?\d+) years?(?: |$))?"
    r"(?:(?P<mons>[+-]?\d+) mons?(?: |$))?"
    r"(?:(?P<days>[+-]?\d+) days?(?: |$))?"
    r"(?:(?P<sign>[+-])?(?P<h>\d+):(?P<m>\d{2}):(?P<s>\d{2})(?:\.(?P<f>\d{1,6}))?)?$"
)
_USECS_PER_HOUR = 3600 * pgv.US_PER_SECOND
_USECS_PER_MINUTE = 60 * pgv.US_PER_SECOND


def interval_iso8601(text: str) -> str:
    """An interval printed with ``IntervalStyle postgres`` (``1 year 2 mons -3 days +04:05:06.5``)
    as PostgreSQL prints it with ``iso_8601`` (``P1Y2M-3DT4H5M6.5S``; ``EncodeInterval``).
    Text already in ISO form (a server with another default) is returned unchanged."""
    if text in (pgv.INFINITY, pgv.NEG_INFINITY) or text.startswith(("P", "-P")):
        return text
    match = _POSTGRES_INTERVAL.match(text)
    if not text or not match:
        raise DecodingError(f"not an interval in PostgreSQL's 'postgres' output style: {text!r}")
    groups = match.groupdict()
    months = int(groups["years"] or 0) * 12 + int(groups["mons"] or 0)
    days = int(groups["days"] or 0)
    micros = (int(groups["h"] or 0) * 3600 + int(groups["m"] or 0) * 60 + int(groups["s"] or 0)) * pgv.US_PER_SECOND
    micros += int((groups["f"] or "").ljust(6, "0") or 0)
    if groups["sign"] == "-":
        micros = -micros
    return _encode_iso8601(months, days, micros)


def _trunc_div(a: int, b: int) -> int:
    """C's integer division (towards zero), which ``EncodeInterval``'s fields follow."""
    quotient = abs(a) // abs(b)
    return quotient if (a >= 0) == (b >= 0) else -quotient


def _encode_iso8601(months: int, days: int, micros: int) -> str:
    year = _trunc_div(months, 12)
    mon = months - year * 12
    hour = _trunc_div(micros, _USECS_PER_HOUR)
    rest = micros - hour * _USECS_PER_HOUR
    minute = _trunc_div(rest, _USECS_PER_MINUTE)
    rest -= minute * _USECS_PER_MINUTE
    sec = _trunc_div(rest, pgv.US_PER_SECOND)
    fsec = rest - sec * pgv.US_PER_SECOND
    if not (year or mon or days or hour or minute or sec or fsec):
        return "PT0S"
    parts = ["P"]
    parts += [f"{v}{unit}" for v, unit in ((year, "Y"), (mon, "M"), (days, "D")) if v]
    if hour or minute or sec or fsec:
        parts.append("T")
    parts += [f"{v}{unit}" for v, unit in ((hour, "H"), (minute, "M")) if v]
    if sec or fsec:
        fraction = f".{abs(fsec):06d}".rstrip("0") if fsec else ""
        parts.append(f"{'-' if sec < 0 or fsec < 0 else ''}{abs(sec)}{fraction}S")
    return "".join(parts)


def _interval_array(text: str) -> str:
    """An ``interval[]``'s text with each element rewritten (ISO intervals never need quoting)."""
    try:
        elements = pgv.parse_array(text)
    except pgv.ParseError as exc:
        raise DecodingError(f"interval array {text!r}: {exc}") from None
    converted = ("NULL" if e is None else interval_iso8601(e) for e in elements)
    prefix = text[: text.index("=") + 1] if text.startswith("[") else ""
    return prefix + "{" + ",".join(converted) + "}"


__all__ = ["column_value", "interval_iso8601", "numeric_at_scale", "pg_float_text"]
