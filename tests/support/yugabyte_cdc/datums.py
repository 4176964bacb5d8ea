"""Column values as YB's CDC service sends them to a Debezium-sourced GetChanges.

``docdb_pgapi.cc`` (``SetValueFromQLBinaryHelper``): ``column_type`` is the PostgreSQL type oid;
bool -> ``datum_bool``, int2/int4 -> ``datum_int32``, int8 -> ``datum_int64``, float4 ->
``datum_float``, float8 -> ``datum_double``, everything else -> ``datum_string`` with the type's
output function text (timestamptz printed in GMT). A NULL carries no datum (unverified).
"""

from __future__ import annotations

import datetime
import re

from airflow_provider_cdc.cdc.sources.postgres.decoder import UNCHANGED_TOAST
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb

from .schema import Column

_TIMESTAMPTZ = 1184
_OFFSET = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)([+-]\d\d(?::?\d\d){0,2})$")


def datum(column: Column, value: bytes | None) -> pb.DatumMessagePB:
    message = pb.DatumMessagePB(column_name=column.name, column_type=column.type_oid)
    if value is None:
        return message
    text = value.decode()
    oid = column.type_oid
    if oid == 16:
        message.datum_bool = text == "t"
    elif oid in (21, 23):
        message.datum_int32 = int(text)
    elif oid == 20:
        message.datum_int64 = int(text)
    elif oid == 700:
        message.datum_float = float(text)
    elif oid == 701:
        message.datum_double = float(text)
    elif oid == _TIMESTAMPTZ:
        message.datum_string = in_gmt(text)
    else:
        message.datum_string = text
    return message


def tuple_of(columns: tuple[Column, ...], row: dict[str, object]) -> list[pb.DatumMessagePB]:
    """Datums for the given columns of a row; columns the row does not carry are left out."""
    return [
        datum(c, row[c.name])  # type: ignore[arg-type]
        for c in columns
        if c.name in row and row[c.name] is not UNCHANGED_TOAST
    ]


def in_gmt(text: str) -> str:
    """A timestamptz in PostgreSQL's text form, moved to +00 (the walsender's zone may differ)."""
    match = _OFFSET.match(text)
    if match is None or match.group(2) == "+00":
        return text  # infinity, BC dates, already GMT
    offset = match.group(2)
    sign = -1 if offset[0] == "-" else 1
    parts = [int(p) for p in re.findall(r"\d\d", offset)]
    delta = datetime.timedelta(hours=parts[0], minutes=parts[1] if len(parts) > 1 else 0)
    try:
        local = datetime.datetime.fromisoformat(match.group(1))
    except ValueError:
        return text
    utc = local - sign * delta
    out = utc.strftime("%Y-%m-%d %H:%M:%S")
    if utc.microsecond:
        out += f".{utc.microsecond:06d}".rstrip("0")
    return out + "+00"
