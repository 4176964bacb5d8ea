"""Column values as YB's CDC service sends them to a Debezium-sourced GetChanges.

``cdcsdk_producer.cc`` ``AddColumnToMap``: ``if (!IsNull(ql_value) && col_schema.pg_type_oid() !=
0) SetValueFromQLBinaryWrapper(...) else set_column_type(col_schema.pg_type_oid())``: a NULL, and
any value of a column stored untyped (oid 0: extension types, user array types), carries no
datum. ``docdb_pgapi.cc`` ``SetValueFromQLBinaryHelper`` switches on the *stored* oid
(:func:`.schema.stored_oid`; ``column_type`` is that oid): bool -> ``datum_bool``, int2/int4 ->
``datum_int32``, int8/oid -> ``datum_int64``, float4 -> ``datum_float``, float8 ->
``datum_double``, ``RECORDOID`` (composites) -> nothing while ``cdc_disable_sending_composite_values``
is true (its default), ``record[]`` and every oid without a ``case`` (``default:``, "unsuppported
pg_type_oid") -> ``datum_string = ""``, everything else -> ``datum_string`` with the type's output
function text (timestamptz printed in GMT; an enum's label, a range's ``range_out``).
"""

from __future__ import annotations

import datetime
import re

from airflow_provider_cdc.cdc.sources.postgres.decoder import UNCHANGED_TOAST
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb

from .schema import Column

_TIMESTAMPTZ = 1184
_RECORD = 2249

#: The stored oids ``SetValueFromQLBinaryHelper`` has a ``case`` for (docdb_pgapi.cc @01b9a99b),
#: without ``record`` (composites) and ``record[]`` (2287, always ""), handled apart.
_SWITCH = frozenset(
    {
        16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 114, 142, 325, 600, 601, 602, 603, 604,
        628, 650, 700, 701, 718, 774, 790, 829, 869, 1033, 1042, 1043, 1082, 1083, 1114, 1184, 1186, 1266,
        1560, 1562, 1700, 2202, 2203, 2204, 2205, 2206, 2275, 2276, 2277, 2278, 2279, 2280, 2281, 2283,
        2776, 2950, 2970, 3115, 3220, 3310, 3500, 3614, 3615, 3642, 3734, 3769, 3802, 3831, 3904, 3906,
        3908, 3910, 3912, 3926, 4089, 4096,
        143, 199, 629, 651, 719, 775, 791, 1000, 1001, 1002, 1003, 1005, 1006, 1007, 1008, 1009, 1010,
        1011, 1012, 1013, 1014, 1015, 1016, 1017, 1018, 1019, 1020, 1021, 1022, 1027, 1028, 1034, 1040,
        1041, 1115, 1182, 1183, 1185, 1187, 1231, 1263, 1270, 1561, 1563, 2207, 2208, 2209, 2210, 2211,
        2949, 2951, 3221, 3643, 3644, 3645, 3735, 3770, 3807, 3905, 3907, 3909, 3911, 3913, 3927, 4090,
        4097,
    }
)  # fmt: skip
_OFFSET = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)([+-]\d\d(?::?\d\d){0,2})$")


def datum(column: Column, value: bytes | None) -> pb.DatumMessagePB:
    oid = column.stored_oid
    message = pb.DatumMessagePB(column_name=column.name, column_type=oid)
    if value is None or oid == 0 or oid == _RECORD:
        return message  # AddColumnToMap's else branch; RECORDOID: `break` before any datum
    if oid not in _SWITCH:
        message.datum_string = ""  # `default:` and `case RECORDARRAYOID:`
        return message
    text = value.decode()
    if oid == 16:
        message.datum_bool = text == "t"
    elif oid in (21, 23):
        message.datum_int32 = int(text)
    elif oid in (20, 26):
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
