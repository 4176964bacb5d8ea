"""CDC-service records → the pgoutput rows yboutput sends for the same change, and their values' text.

Records are built as YB's ``cdcsdk_producer.cc`` fills them: every tuple padded with empty entries
to the other's length (``AddTuple``, ``EquateOldAndNewTuple``), a NULL as a column with its type
and no datum, values in the datum fields ``docdb_pgapi.cc`` picks per type. The expected messages
are what yboutput sends for the same change, with the text PostgreSQL prints under the capture's
session settings; equal message bytes give equal events (the same buffers and codecs).
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_cdc.cdc.basics.errors import DecodingError
from airflow_provider_cdc.cdc.basics.tables import TableRef
from airflow_provider_cdc.cdc.events.settings import EventContext, EventSettings
from airflow_provider_cdc.cdc.events.value_modes import ValueModes
from airflow_provider_cdc.cdc.sources.postgres import values as pgv
from airflow_provider_cdc.cdc.sources.postgres.decoder import (
    UNCHANGED_TOAST,
    encode_delete,
    encode_insert,
    encode_update,
)
from airflow_provider_cdc.cdc.sources.postgres.events import TableEncoder
from airflow_provider_cdc.cdc.sources.postgres.stream_events import ChunkTransactions, StreamEventBuffer
from airflow_provider_cdc.cdc.sources.postgres.tables import Column, TableInfo
from airflow_provider_cdc.cdc.sources.postgres.types import PgType, TypeCache
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.records import (
    RowImage,
    ddl_key_columns,
    ddl_table,
    relation_columns,
    relation_oid,
    row_image,
)
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.values import (
    column_value,
    interval_iso8601,
    numeric_at_scale,
    pg_float_text,
)

Op = pb.RowMessage
U = UNCHANGED_TOAST
OID = 16384
INT4, TEXT = PgType(23, -1, "integer", "int4"), PgType(25, -1, "text", "text")
EMPLOYEE = (Column("employee_id", INT4), Column("employee_name", TEXT), Column("employee_dept", TEXT))
KEY = ("employee_id",)


def datum(name: str, oid: int = 25, **value) -> pb.DatumMessagePB:
    return pb.DatumMessagePB(column_name=name, column_type=oid, **value)


def emp(**values) -> list[pb.DatumMessagePB]:
    """Employee columns in YB's fill order (key first); a None value is a NULL (type, no datum)."""
    out = []
    for name, value in values.items():
        column = f"employee_{name}"
        if value is None:
            out.append(datum(column, 25, pg_type=25))
        elif isinstance(value, int):
            out.append(datum(column, 23, datum_int32=value))
        else:
            out.append(datum(column, 25, datum_string=value))
    return out


def pad(n: int) -> list[pb.DatumMessagePB]:
    return [pb.DatumMessagePB() for _ in range(n)]


def row(op: int, new: list | None = None, old: list | None = None) -> pb.RowMessage:
    new, old = new or [], old or []
    # YB pads both tuples to the same length with empty entries
    return pb.RowMessage(
        op=op,
        table="employee",
        pgschema_name="public",
        new_tuple=new + pad(len(old) - len(new)),
        old_tuple=old + pad(len(new) - len(old)),
    )


def payload(message: pb.RowMessage, record_type: int = pb.CHANGE) -> bytes:
    return row_image(message, EMPLOYEE, KEY, record_type).payload(OID)


# -- record types → pgoutput rows ---------------------------------------------------------------

INSERTED = encode_insert(OID, (b"1001", b"Alice", b"Packaging"))


@pytest.mark.parametrize("record_type", sorted(pb.CDCRecordType.values()))
def test_insert_is_the_whole_new_row_whatever_the_record_type(record_type: int) -> None:
    assert payload(row(Op.INSERT, emp(id=1001, name="Alice", dept="Packaging")), record_type) == INSERTED
    # a non-packed insert leaves NULL columns out: absent means NULL for an insert
    absent = row(Op.INSERT, emp(id=1001, name="Alice"))
    assert payload(absent, record_type) == encode_insert(OID, (b"1001", b"Alice", None))


def test_change_update_sends_key_and_changed_columns_the_rest_not_sent() -> None:
    update = row(Op.UPDATE, emp(id=1001, name="Bob"))
    assert payload(update) == encode_update(OID, None, None, (b"1001", b"Bob", U))
    # an explicit NULL is a value, not "not sent"
    nulled = row(Op.UPDATE, emp(id=1001, dept=None))
    assert payload(nulled) == encode_update(OID, None, None, (b"1001", U, None))


def test_change_delete_is_the_key_with_null_columns() -> None:
    delete = row(Op.DELETE, old=emp(id=1001))
    assert payload(delete) == encode_delete(OID, "K", (b"1001", None, None))


def test_full_row_new_image() -> None:
    update = row(Op.UPDATE, emp(id=1001, name="Bob", dept="Packaging"))
    assert payload(update, pb.FULL_ROW_NEW_IMAGE) == encode_update(OID, None, None, (b"1001", b"Bob", b"Packaging"))
    delete = row(Op.DELETE, old=emp(id=1001, name="Bob", dept=None))
    assert payload(delete, pb.FULL_ROW_NEW_IMAGE) == encode_delete(OID, "O", (b"1001", b"Bob", None))


def test_modified_columns_old_and_new_images() -> None:
    update = row(Op.UPDATE, emp(id=1001, name="Bob"), emp(id=1001, name="Alice"))
    expected = encode_update(OID, "O", (b"1001", b"Alice", U), (b"1001", b"Bob", U))
    assert payload(update, pb.MODIFIED_COLUMNS_OLD_AND_NEW_IMAGES) == expected
    assert payload(update, pb.PG_CHANGE_OLD_NEW) == expected
    delete = row(Op.DELETE, old=emp(id=1001))
    assert payload(delete, pb.MODIFIED_COLUMNS_OLD_AND_NEW_IMAGES) == encode_delete(OID, "K", (b"1001", None, None))


def test_all_sends_the_old_and_new_rows() -> None:
    update = row(Op.UPDATE, emp(id=1001, name="Bob", dept="Packaging"), emp(id=1001, name="Alice", dept="Packaging"))
    expected = encode_update(OID, "O", (b"1001", b"Alice", b"Packaging"), (b"1001", b"Bob", b"Packaging"))
    assert payload(update, pb.ALL) == payload(update, pb.PG_FULL) == expected
    delete = row(Op.DELETE, old=emp(id=1001, name="Bob", dept="Packaging"))
    assert payload(delete, pb.ALL) == encode_delete(OID, "O", (b"1001", b"Bob", b"Packaging"))
    assert payload(delete, pb.PG_DEFAULT) == encode_delete(OID, "K", (b"1001", None, None))


def test_a_before_image_yb_could_not_read_becomes_none() -> None:
    # cdc_send_null_before_image_if_not_exists: only padding (update) or only the key (delete)
    update = row(Op.UPDATE, emp(id=1001, name="Bob", dept="Packaging"), [])
    assert payload(update, pb.ALL) == encode_update(OID, None, None, (b"1001", b"Bob", b"Packaging"))
    delete = row(Op.DELETE, old=emp(id=1001))
    assert payload(delete, pb.ALL) == encode_delete(OID, "K", (b"1001", None, None))


def test_records_that_do_not_fit_the_table_fail() -> None:
    with pytest.raises(DecodingError, match="not in the table's schema"):
        payload(row(Op.INSERT, [datum("salary", 23, datum_int32=1)]))
    with pytest.raises(DecodingError, match="does not carry the key"):
        payload(row(Op.DELETE, old=emp(name="Bob")))
    with pytest.raises(DecodingError, match="twice"):
        payload(row(Op.INSERT, emp(id=1) + emp(id=2)))
    with pytest.raises(DecodingError, match="not a row change"):
        payload(row(Op.BEGIN))
    with pytest.raises(DecodingError, match="record type"):
        payload(row(Op.INSERT, emp(id=1)), 2)


def test_row_image_payloads_decode_as_pgoutput() -> None:
    image = RowImage("u", (b"1", U, None), (b"1", b"a", U), "O")
    assert image.payload(7) == encode_update(7, "O", (b"1", b"a", U), (b"1", U, None))


# -- the same events as the logical-replication source ------------------------------------------


def numeric(precision: int, scale: int) -> PgType:
    return PgType(1700, ((precision << 16) | scale) + 4, f"numeric({precision},{scale})", "numeric")


WIDE = (
    Column("id", INT4),
    Column("name", TEXT),
    Column("price", numeric(10, 2)),
    Column("ratio", PgType(701, -1, "double precision", "float8")),
    Column("small", PgType(700, -1, "real", "float4")),
    Column("at", PgType(1184, -1, "timestamp with time zone", "timestamptz")),
    Column("span", PgType(1186, -1, "interval", "interval")),
    Column("flag", PgType(16, -1, "boolean", "bool")),
    Column("data", PgType(17, -1, "bytea", "bytea")),
    Column("big", PgType(20, -1, "bigint", "int8")),
)
# What yboutput sends (PostgreSQL's output functions under the session settings) ...
LR_TEXT = (
    b"7",
    b"caf\xc3\xa9",
    b"12.50",
    b"0.1",
    b"1.1",
    b"2021-11-25 06:30:00+00",
    b"P1Y2M3DT4H5M6.5S",
    b"t",
    b"\\x0102",
    b"-9007199254740993",
)
# ... and the datums the CDC service fills for the same row (docdb_pgapi.cc)
YB_DATUMS = [
    pb.DatumMessagePB(column_name="id", column_type=23, datum_int32=7),
    pb.DatumMessagePB(column_name="name", column_type=25, datum_string="café"),
    pb.DatumMessagePB(column_name="price", column_type=1700, datum_string="12.5"),
    pb.DatumMessagePB(column_name="ratio", column_type=701, datum_double=0.1),
    pb.DatumMessagePB(column_name="small", column_type=700, datum_float=1.1),
    pb.DatumMessagePB(column_name="at", column_type=1184, datum_string="2021-11-25 06:30:00+00"),
    pb.DatumMessagePB(column_name="span", column_type=1186, datum_string="1 year 2 mons 3 days 04:05:06.5"),
    pb.DatumMessagePB(column_name="flag", column_type=16, datum_bool=True),
    pb.DatumMessagePB(column_name="data", column_type=17, datum_string="\\x0102"),
    pb.DatumMessagePB(column_name="big", column_type=20, datum_int64=-9007199254740993),
]
MODES = [
    ValueModes(),
    ValueModes(decimal="string", time_precision="adaptive", binary="hex", interval="string"),
    ValueModes(decimal="double", time_precision="connect", binary="base64"),
]


@pytest.mark.parametrize("modes", MODES, ids=lambda m: f"{m.decimal}-{m.time_precision}-{m.binary}-{m.interval}")
def test_events_are_identical_to_the_logical_replication_sources(modes: ValueModes) -> None:
    table = TableInfo(TableRef("public", "wide"), OID, WIDE, ("id",), "c", True)
    insert = pb.RowMessage(op=Op.INSERT, table="wide", new_tuple=YB_DATUMS, old_tuple=pad(len(YB_DATUMS)))
    update = pb.RowMessage(op=Op.UPDATE, table="wide", new_tuple=[YB_DATUMS[0], YB_DATUMS[6]], old_tuple=pad(2))
    ours = [row_image(insert, WIDE, ("id",)).payload(OID), row_image(update, WIDE, ("id",)).payload(OID)]
    lr_update = (b"7", U, U, U, U, U, b"P1Y2M3DT4H5M6.5S", U, U, U)
    yboutput = [encode_insert(OID, LR_TEXT), encode_update(OID, None, None, lr_update)]
    assert ours == yboutput

    def events(payloads: list[bytes]) -> pa.RecordBatch:
        context = EventContext("yb", "yugabyte", "0000000001", 1_700_000_000_000)
        buffer = StreamEventBuffer(TableEncoder(table, WIDE, EventSettings(modes=modes)), context)
        for total, message in enumerate(payloads, start=1):
            buffer.add(message, 100 + total, 0, total, total)
        return buffer.to_batch(ChunkTransactions.of([(1_700_000_000_000, None, 5, 200, "tx:200")]))

    batch = events(ours)
    assert batch.equals(events(yboutput))
    unchanged = ["name", "price", "ratio", "small", "at", "flag", "data", "big"]
    assert batch.column("unchanged_toast_columns").to_pylist() == [None, unchanged]  # the fold's patch


# -- values -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "single", "text"),
    [
        (1.0, False, "1"),
        (0.1, False, "0.1"),
        (-0.0, False, "-0"),
        (1e15, False, "1e+15"),
        (123456789012345.0, False, "123456789012345"),
        (0.0001, False, "0.0001"),
        (1e-05, False, "1e-05"),
        (1.7976931348623157e308, False, "1.7976931348623157e+308"),
        (5e-324, False, "5e-324"),
        (math.nan, False, "NaN"),
        (-math.inf, False, "-Infinity"),
        (1e6, True, "1e+06"),
        (100000.0, True, "100000"),
        (float(np.float32(1.1)), True, "1.1"),
        (float(np.float32(3.4028235e38)), True, "3.4028235e+38"),
    ],
)
def test_floats_print_as_postgresql_prints_them(value: float, single: bool, text: str) -> None:
    assert pg_float_text(value, single=single) == text


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_float8_text_is_shortest_and_exact(value: float) -> None:
    text = pg_float_text(value)
    assert float(text) == value
    mantissa = text.lstrip("-").split("e")[0].replace(".", "").strip("0")
    assert len(mantissa) <= len(repr(abs(value)).split("e")[0].replace(".", "").strip("0"))
    exponent = math.floor(math.log10(abs(value))) if value else 0
    assert ("e" in text) == (not -4 <= exponent < 15)


@given(st.floats(width=32, allow_nan=False, allow_infinity=False))
def test_float4_text_reads_back_as_the_same_float4(value: float) -> None:
    assert np.float32(pg_float_text(value, single=True)) == np.float32(value)


def _postgres_style(months: int, days: int, micros: int) -> str:
    """``EncodeInterval`` with ``IntervalStyle postgres`` (datetime.c), the YB tablet server's default."""

    def trunc(a: int, b: int) -> int:
        return abs(a) // b * (1 if a >= 0 else -1)

    year, mon = trunc(months, 12), months - trunc(months, 12) * 12
    hour = trunc(micros, 3_600_000_000)
    rest = micros - hour * 3_600_000_000
    minute = trunc(rest, 60_000_000)
    rest -= minute * 60_000_000
    sec, fsec = trunc(rest, 1_000_000), rest - trunc(rest, 1_000_000) * 1_000_000
    parts, is_zero, is_before = [], True, False
    for value, unit in ((year, "year"), (mon, "mon"), (days, "day")):
        if value:
            parts.append(f"{'+' if is_before and value > 0 else ''}{value} {unit}{'' if value == 1 else 's'}")
            is_before, is_zero = value < 0, False
    if is_zero or hour or minute or sec or fsec:
        minus = hour < 0 or minute < 0 or sec < 0 or fsec < 0
        seconds = f"{abs(sec):02d}" + (f".{abs(fsec):06d}".rstrip("0") if fsec else "")
        parts.append(f"{'-' if minus else '+' if is_before else ''}{abs(hour):02d}:{abs(minute):02d}:{seconds}")
    return " ".join(parts)


def test_intervals_are_rewritten_in_iso_8601() -> None:
    assert interval_iso8601("1 year 2 mons 3 days 04:05:06") == "P1Y2M3DT4H5M6S"
    assert interval_iso8601("00:00:00") == "PT0S"
    assert interval_iso8601("-1 days +04:05:06.5") == "P-1DT4H5M6.5S"
    assert interval_iso8601("-04:05:06") == "PT-4H-5M-6S"
    assert interval_iso8601("29 days") == "P29D"
    assert interval_iso8601("P29D") == "P29D"  # already ISO: unchanged
    with pytest.raises(DecodingError):
        interval_iso8601("@ 1 day")  # postgres_verbose


@given(
    st.integers(-(10**5), 10**5),
    st.integers(-(10**5), 10**5),
    st.integers(-(10**13), 10**13),
)
def test_interval_rewrite_keeps_the_value(months: int, days: int, micros: int) -> None:
    text = interval_iso8601(_postgres_style(months, days, micros))
    assert pgv.parse_interval(text) == (months, days, micros)


def test_column_values_by_datum_kind() -> None:
    text, numeric_type = PgType(25), numeric(10, 2)
    assert column_value(pb.DatumMessagePB(column_name="c", column_type=25, pg_type=25), text) is None
    assert column_value(pb.DatumMessagePB(column_name="c", datum_missing=True), text) is U
    assert column_value(pb.DatumMessagePB(column_name="c", datum_bool=False), PgType(16)) == b"f"
    assert column_value(pb.DatumMessagePB(column_name="c", datum_string="3"), numeric_type) == b"3.00"
    assert column_value(pb.DatumMessagePB(column_name="c", datum_bytes=b"\x01"), PgType(17)) == b"\\x01"
    interval_array = PgType(1187, category="A", element=PgType(1186))
    value = column_value(pb.DatumMessagePB(column_name="c", datum_string='{"1 day",NULL,00:00:01}'), interval_array)
    assert value == b"{P1D,NULL,PT1S}"
    with pytest.raises(DecodingError):
        column_value(pb.DatumMessagePB(column_name="c", datum_bytes=b"\x01"), text)


def test_numeric_is_padded_to_its_scale_never_rounded() -> None:
    assert numeric_at_scale("1.5", numeric(10, 2)) == "1.50"
    assert numeric_at_scale("-10", numeric(10, 2)) == "-10.00"
    assert numeric_at_scale("1.234", numeric(10, 2)) == "1.234"
    assert numeric_at_scale("NaN", numeric(10, 2)) == "NaN"
    assert numeric_at_scale("1.5", PgType(1700)) == "1.5"  # unconstrained: PostgreSQL keeps its own scale


# -- schema records -----------------------------------------------------------------------------


def test_ddl_columns_take_the_catalogs_order_and_modifiers() -> None:
    varchar = PgType(1043, 24, "character varying(20)", "varchar")
    catalog = TableInfo(
        TableRef("public", "t"),
        OID,
        (Column("note", varchar), Column("id", INT4), Column("price", numeric(10, 2))),
        ("id",),
        "c",
        True,
    )
    types = TypeCache(known={(c.type.oid, c.type.modifier): c.type for c in catalog.columns})
    info = [
        pb.CDCSDKColumnInfoPB(name="id", oid=23, is_key=True, is_hash_key=True),  # DocDB: key columns first
        pb.CDCSDKColumnInfoPB(name="note", oid=1043),
        pb.CDCSDKColumnInfoPB(name="price", oid=1700),
    ]
    ddl = pb.RowMessage(op=Op.DDL, table="t", pgschema_name="public", schema=pb.CDCSDKSchemaPB(column_info=info))
    assert relation_columns(ddl, types, catalog) == catalog.columns  # the same table version
    assert ddl_key_columns(ddl) == ("id",) and ddl_table(ddl) == TableRef("public", "t")
    # a column added after the catalog was read comes last; a changed type loses the modifier
    info.append(pb.CDCSDKColumnInfoPB(name="extra", oid=25))
    info[2].oid = 701
    changed = pb.RowMessage(op=Op.DDL, table="t", schema=pb.CDCSDKSchemaPB(column_info=info))
    assert [(c.name, c.type.oid, c.type.modifier) for c in relation_columns(changed, types, catalog)] == [
        ("note", 1043, 24),
        ("id", 23, -1),
        ("price", 701, -1),
        ("extra", 25, -1),
    ]
    with pytest.raises(DecodingError):
        relation_columns(pb.RowMessage(op=Op.INSERT), types)


def test_relation_oid_is_the_table_ids_tail() -> None:
    assert relation_oid("000033e8000030008000000000004000") == 0x4000
    with pytest.raises(DecodingError):
        relation_oid("orders")
