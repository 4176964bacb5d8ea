"""Which column types YugabyteDB's CDC service can send to a ``GetChanges`` client.

DocDB stores each YSQL column with a *stored* type oid, chosen when the table is created
(``YbDataTypeFromOidMod`` / ``YbGetPrimitiveTypeOid``, yb_type.c): a type in YB's type table keeps
its own oid (every built-in type); otherwise a domain becomes its base type, an enum
``anyenum``, a composite ``record``, a range ``anyrange``, and any other base type (extension
types such as hstore, citext, ltree, vector; user array types such as ``mood[]``) the untyped
entity with oid 0. The CDC service sends a value by that stored oid
(``cdcsdk_producer.cc`` ``AddColumnToMap``, ``docdb_pgapi.cc`` ``SetValueFromQLBinaryHelper``):

- oid 0: no datum at all, as for NULL, so a value and NULL cannot be told apart;
- ``record`` (composite columns): no datum while the tablet servers'
  ``cdc_disable_sending_composite_values`` is true (the default; YB's composite decoding is
  broken, #25221);
- an oid outside the service's switch (the multiranges, ``jsonpath``, ``xid8``, ``pg_snapshot``,
  ``refcursor``, ``regcollation`` and their arrays...): ``datum_string = ""``.

Such columns cannot be captured through the service; the logical-replication capture
(``YugabyteCapture``) reads them through YSQL's output functions.
"""

from __future__ import annotations

from collections.abc import Iterable

from airflow_provider_cdc.cdc.sources.postgres.tables import TableInfo
from airflow_provider_cdc.cdc.sources.postgres.types import PgType

RECORD = 2249
ANYENUM = 3500
ANYRANGE = 3831
FIRST_NORMAL_OID = 16384  # oids below: built-in types, all in YB's type table

#: Stored oids ``SetValueFromQLBinaryHelper`` decodes (its ``case`` labels, without ``record``,
#: whose values are off by default, and ``record[]``, always sent as "").
SENT_OIDS = frozenset(
    {
        # scalars and pseudo-types
        16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 114, 142, 325, 600, 601, 602, 603, 604,
        628, 650, 700, 701, 718, 774, 790, 829, 869, 1033, 1042, 1043, 1082, 1083, 1114, 1184, 1186, 1266,
        1560, 1562, 1700, 2202, 2203, 2204, 2205, 2206, 2275, 2276, 2277, 2278, 2279, 2280, 2281, 2283,
        2776, 2950, 2970, 3115, 3220, 3310, 3500, 3614, 3615, 3642, 3734, 3769, 3802, 3831, 3904, 3906,
        3908, 3910, 3912, 3926, 4089, 4096,
        # arrays of built-in types
        143, 199, 629, 651, 719, 775, 791, 1000, 1001, 1002, 1003, 1005, 1006, 1007, 1008, 1009, 1010,
        1011, 1012, 1013, 1014, 1015, 1016, 1017, 1018, 1019, 1020, 1021, 1022, 1027, 1028, 1034, 1040,
        1041, 1115, 1182, 1183, 1185, 1187, 1231, 1263, 1270, 1561, 1563, 2207, 2208, 2209, 2210, 2211,
        2949, 2951, 3221, 3643, 3644, 3645, 3735, 3770, 3807, 3905, 3907, 3909, 3911, 3913, 3927, 4090,
        4097,
    }
)  # fmt: skip


def stored_oid(pg_type: PgType) -> int:
    """The type oid DocDB stores for a column of ``pg_type`` (``YbDataTypeFromOidMod``)."""
    resolved = pg_type.resolved()  # a domain is stored as its base type
    if resolved.kind == "c":
        return RECORD
    if resolved.oid < FIRST_NORMAL_OID:
        return resolved.oid
    if resolved.kind == "e":
        return ANYENUM
    if resolved.kind == "r":
        return ANYRANGE
    return 0  # extension base types and user array types: YBCVarLenByRefTypeEntity, InvalidOid


def why_not_sent(pg_type: PgType) -> str | None:
    """Why the CDC service cannot send values of ``pg_type`` (None: it can)."""
    oid = stored_oid(pg_type)
    if oid == 0:
        return "DocDB stores it untyped (oid 0), and the service sends no value for it, exactly as for NULL"
    if oid == RECORD:
        return (
            "a composite: the service sends NULL for it while the tablet servers' "
            "cdc_disable_sending_composite_values is true (the default)"
        )
    if oid not in SENT_OIDS:
        return "the service has no decoder for it and sends an empty string"
    return None


def datum_type_not_sent(column_type: int) -> bool:
    """Whether a datum's ``column_type`` (the stored oid) is one the service sends no value of."""
    return column_type not in SENT_OIDS


def uncarried_columns(tables: Iterable[TableInfo]) -> list[str]:
    """``schema.table.column (type): why`` for every column the service cannot send."""
    found = []
    for table in tables:
        for column in table.columns:
            why = why_not_sent(column.type)
            if why is not None:
                type_name = column.type.name or column.type.type_name or str(column.type.oid)
                found.append(f"{table.ref}.{column.name} ({type_name}): {why}")
    return found


def uncarried_problems(tables: Iterable[TableInfo]) -> list[str]:
    """The setup problem for columns the service cannot send, with the ways out (empty: none)."""
    found = uncarried_columns(tables)
    if not found:
        return []
    return [
        "YugabyteDB's CDC service cannot send the values of column(s) "
        + "; ".join(found)
        + ". Their changes would arrive as NULL or '' and be lost: capture these tables with the "
        "logical-replication YugabyteCapture (it reads values through YSQL), change the columns' types "
        "(e.g. to text or jsonb), or leave the tables out of this capture"
    ]


__all__ = [
    "ANYENUM",
    "RECORD",
    "SENT_OIDS",
    "datum_type_not_sent",
    "stored_oid",
    "uncarried_columns",
    "uncarried_problems",
    "why_not_sent",
]
