"""Columns YugabyteDB's CDC service cannot send (extension types, user arrays, composites,
multiranges): the stand-in sends what the service sends (no datum, or ""), the capture refuses
them at setup, and a window takes their missing values as a decoding error, never as NULL."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from airflow_provider_cdc.captures.yugabyte_cdc_service import YugabyteCdcServiceCapture
from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError, DecodingError
from airflow_provider_cdc.cdc.basics.tables import TableRef
from airflow_provider_cdc.cdc.sources.postgres import admin as pg_admin
from airflow_provider_cdc.cdc.sources.postgres.types import TypeCache
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.records import relation_columns, row_image
from tests.standin.test_yugabyte_cdc_standin import Client, start_streaming
from tests.support.yugabyte_cdc import YugabyteCdcStandIn, airflow_connection, standin_for

pytestmark = pytest.mark.pg

TYPES = """
CREATE EXTENSION IF NOT EXISTS hstore;
CREATE TYPE mood AS ENUM ('sad', 'happy');
CREATE TYPE pair AS (a int, b text);
CREATE DOMAIN small_count AS int CHECK (VALUE >= 0);
"""
# hstore: an extension type; mood[]: a user array type; pair: a composite; int4multirange: a
# built-in type without a case in the service's switch
ODD = "CREATE TABLE odd (id int PRIMARY KEY, h hstore, moods mood[], p pair, spans int4multirange, v text)"
# what the service does send: an enum (anyenum), a domain (its base type), a range, arrays of built-ins
PLAIN = "CREATE TABLE plain (id int PRIMARY KEY, m mood, c small_count, r int4range, tags text[], v text)"


@pytest.fixture(scope="module")
def yb(request, clusters) -> Iterator[YugabyteCdcStandIn]:
    yield from standin_for(request, clusters["pg15"], tablets_per_table=1, rpc_heartbeat_interval=0.3)


@pytest.fixture(scope="module")
def tables(yb) -> str:
    with yb.connect() as conn:
        conn.execute(TYPES)
        conn.execute(ODD)
        conn.execute(PLAIN)
    yb.wait_caught_up()
    return yb.create_stream("CHANGE", "EXPLICIT", tables=["odd", "plain"])


def test_the_service_sends_no_value_or_an_empty_string_for_them(yb, tables):
    stream = tables
    client = Client(yb)
    try:
        tablet = yb.tablet_for("odd", 1)
        start = start_streaming(client, stream, [tablet])[tablet]
        with yb.connect() as conn:
            conn.execute("INSERT INTO odd VALUES (1, 'k=>v', '{happy}', ROW(1, 'x'), '{[1,3)}', 'a')")
            conn.execute("INSERT INTO odd VALUES (2, NULL, NULL, NULL, NULL, NULL)")
            catalog, _ = pg_admin.find_tables(conn, [TableRef("public", "odd")])
            types = TypeCache(conn)
            yb.wait_caught_up()
            records = client.changes(stream, tablet, start, need_schema_info=True).cdc_sdk_proto_records
            ddl = next(r.row_message for r in records if r.row_message.op == pb.RowMessage.DDL)
            # the schema record carries DocDB's stored type oids (SetColumnInfo)
            assert [(c.name, c.oid) for c in ddl.schema.column_info] == [
                ("id", 23), ("h", 0), ("moods", 0), ("p", 2249), ("spans", 4451), ("v", 25)
            ]  # fmt: skip
            inserts = [r.row_message for r in records if r.row_message.op == pb.RowMessage.INSERT]
            sent = [{d.column_name: (d.column_type, d.WhichOneof("datum")) for d in i.new_tuple} for i in inserts]
            # a value and a NULL look the same for the untyped and composite columns
            for row in sent:
                assert (row["h"], row["moods"], row["p"]) == ((0, None), (0, None), (2249, None)), row
            assert sent[0]["spans"] == (4451, "datum_string") and inserts[0].new_tuple[4].datum_string == ""
            # the product: columns matched to the catalog by name; the missing values are errors
            columns = relation_columns(ddl, types, catalog[TableRef("public", "odd")])
            assert [c.type.type_name for c in columns] == ["int4", "hstore", "_mood", "pair", "int4multirange", "text"]
            for insert in inserts:
                with pytest.raises(DecodingError, match=r"column 'h' \((public\.)?hstore\).*sent no value"):
                    row_image(insert, columns, ("id",))
    finally:
        client.close()


def test_columns_the_service_sends_arrive_with_their_values(yb, tables):
    stream = tables
    client = Client(yb)
    try:
        tablet = yb.tablet_for("plain", 1)
        start = start_streaming(client, stream, [tablet])[tablet]
        with yb.connect() as conn:
            conn.execute("INSERT INTO plain VALUES (1, 'happy', 5, '[1,3)', '{a,b}', 'x')")
            conn.execute("INSERT INTO plain VALUES (2, NULL, NULL, NULL, NULL, NULL)")
            catalog, _ = pg_admin.find_tables(conn, [TableRef("public", "plain")])
        yb.wait_caught_up()
        records = client.changes(stream, tablet, start, need_schema_info=True).cdc_sdk_proto_records
    finally:
        client.close()
    types = TypeCache()  # every column is the catalog's
    ddl = next(r.row_message for r in records if r.row_message.op == pb.RowMessage.DDL)
    # an enum is stored as anyenum, a domain as its base type (YbGetPrimitiveTypeOid)
    assert [c.oid for c in ddl.schema.column_info] == [23, 3500, 23, 3904, 1009, 25]
    table = catalog[TableRef("public", "plain")]
    columns = relation_columns(ddl, types, table)
    assert columns == table.columns  # by name: the enum and the domain keep the catalog's types
    inserts = [r.row_message for r in records if r.row_message.op == pb.RowMessage.INSERT]
    images = [row_image(i, columns, ("id",)).new for i in inserts]
    assert images == [(b"1", b"happy", b"5", b"[1,3)", b"{a,b}", b"x"), (b"2", None, None, None, None, None)]


def test_setup_refuses_them_and_names_each_column(yb, tables, airflow_db, monkeypatch, tmp_path):
    from airflow_provider_cdc.offsets.variable import VariableOffsetStore

    conn_id = f"ybc_uncarried_{yb.database}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", airflow_connection(yb))

    def capture(table: str) -> YugabyteCdcServiceCapture:
        return YugabyteCdcServiceCapture(
            yugabytedb_conn_id=conn_id,
            stream_id=tables,
            topic_prefix=f"unc_{table}",
            sink_path=str(tmp_path / table),
            tables=[f"public.{table}"],
            snapshot_mode="never",
            offset_store=VariableOffsetStore(key_prefix=f"cdc_offset_{conn_id}__"),
        )

    log = logging.getLogger(__name__)
    with pytest.raises(CdcConfigurationError) as refused:
        capture("odd").setup(log)
    message = str(refused.value)
    odd = '"public"."odd"'
    for column in ("h (public.hstore)", "moods (public.mood[])", "p (public.pair)", "spans (int4multirange)"):
        assert f"{odd}.{column}" in message, message
    assert "YugabyteCapture" in message and "change the columns' types" in message
    assert f"{odd}.v " not in message and f"{odd}.id " not in message
    described = capture("plain").setup(log)  # a capture without them is unaffected
    assert described["key_columns"] == {"public.plain": ["id"]}
