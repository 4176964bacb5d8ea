"""Conformance cases: what a real SQL Server plus a correct product must do, from primary sources.

Each case names where its expectation comes from: an assertion of Debezium's SQL Server connector
integration tests (which run against a real SQL Server; file:line in debezium/debezium at
aad5519902997a3627fe296f77ea6d3452e9acce, ``debezium-connector-sqlserver/src/test/java/io/debezium/
connector/sqlserver/``, written ``<File>:<line>`` below) or a Microsoft Learn page. They run against
the stand-in (docs/sqlserver-standin.md) through the product's public API: ``SqlServerCapture`` and
the shared operators under ``dag.test()`` with real Spark, as test_capture.py does.

Where the product deliberately differs from Debezium (no tombstones; topics keep the table's name,
not Debezium's ``_``-sanitised one; a key is required), the case asserts the product's documented
form of the same fact (docs/sqlserver.md) and says so.

Most cases share one stand-in and two DAG runs (``stream``: a snapshot, then one window over a
scripted workload); the preflight, schema-change and purge cases start their own.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path

import pyodbc
import pytest

from airflow_provider_cdc.cdc.sinks.reader import read_topic_arrow
from tests.integration.sqlserver.test_capture import capture_dag, make_capture
from tests.support import airflow as af
from tests.support.oracle import events_of
from tests.support.sqlserver import SqlServerStandIn, StatementRecorder
from tests.support.sqlserver.fixtures import DRIVER_IN_EXTRA_ALLOWED, airflow_connection

pytestmark = [pytest.mark.airflow, pytest.mark.spark]

#: Debezium's tables (SqlServerConnectorIT.java:105-109, TransactionMetadataIT.java:53-58).
SPECIAL = "UAT WAG CZ$Fixed Asset ['1']"  # SpecialCharsInNamesIT.java:147
SPECIAL_REF = "dbo.[UAT WAG CZ$Fixed Asset ['1']]]"
#: AbstractSqlServerDatatypesTest.java: DDL_INT/FP/STRING/TIME, reduced to what the stand-in keeps
#: exactly (no 7th fractional digit, no code-page conversion of non-Unicode strings).
TYPE_TABLES = {
    "type_int": "id int not null, val_bit bit, val_tinyint tinyint, val_smallint smallint, val_int int, "
    "val_bigint bigint, primary key (id)",
    "type_fp": "id int not null, val_decimal decimal(6,3), val_numeric numeric, val_float float, val_real real, "
    "val_smallmoney smallmoney, val_money money, primary key (id)",
    "type_string": "id int not null, val_nchar nchar(3), val_nvarchar nvarchar(1000), val_ntext ntext, "
    "primary key (id)",
    "type_time": "id int not null, val_date date, val_time_p2 time(2), val_time time(4), val_datetime2 datetime2, "
    "val_datetime datetime, val_smalldatetime smalldatetime, primary key (id)",
}
TYPE_ROWS = {  # AbstractSqlServerDatatypesTest.java:495, 503, 510, 518
    "type_int": "INSERT INTO type_int VALUES (0, 1, 22, 333, 4444, 55555)",
    "type_fp": "INSERT INTO type_fp VALUES (0, 1.123, 2, 3.323, 4.323, 5.323, 6.323)",
    "type_string": "INSERT INTO type_string VALUES (0, N'c\u010d', N'vc\u010d', N't\u010d')",
    "type_time": "INSERT INTO type_time VALUES (0, '2018-07-13', '10:23:45.678', '10:23:45.6789', "
    "'2018-07-13 11:23:45.34', '2018-07-13 13:23:45.78', '2018-07-13 14:23:45')",
}
STREAM_TABLES = [
    "dbo.tablea",
    "dbo.tableb",
    "dbo.MyTableOne",
    SPECIAL_REF,
    "dbo.t1",
    "dbo.excluded_column_table_a",
    *(f"dbo.{t}" for t in TYPE_TABLES),
    "dbo.lobs",
]


def _name(prefix: str) -> str:
    return f"ss_conf_{prefix}_{hashlib.sha1(f'{os.getpid()}{prefix}'.encode()).hexdigest()[:6]}"


@dataclass
class Scenario:
    """A stand-in, its Airflow connection and a capture DAG with its sink; what its runs returned."""

    standin: SqlServerStandIn
    conn_id: str
    sink: Path
    runs: list = field(default_factory=list)
    errors: dict = field(default_factory=dict)

    def events(self, table: str) -> list[dict]:
        return events_of(str(self.sink), "shop", table)

    def streamed(self, table: str) -> list[dict]:
        """The table's stream events (not the snapshot's), in commit and transaction order."""
        found = [e for e in self.events(table) if e["op"] != "r"]
        return sorted(found, key=lambda e: (e["source"]["commit_lsn"], e["transaction"]["total_order"]))

    def transactions(self) -> list[dict]:
        table = read_topic_arrow(str(self.sink), "shop", "shop.transaction")
        return [] if table is None else table.to_pylist()


@pytest.fixture(scope="module")
def scenario_env(clusters, airflow_db, spark, tmp_path_factory):
    """Starts stand-ins on PostgreSQL 15, each with an Airflow connection; every statement any of
    them received must parse as T-SQL."""
    recorder = StatementRecorder()
    started: list[SqlServerStandIn] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(*DRIVER_IN_EXTRA_ALLOWED)

        def start(prefix: str) -> Scenario:
            standin = SqlServerStandIn(clusters["pg15"], _name(prefix), recorder=recorder, poll_interval=0.05).start()
            started.append(standin)
            conn_id = f"mssql_{standin.database}"
            mp.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", airflow_connection(standin))
            return Scenario(standin, conn_id, tmp_path_factory.mktemp(prefix))

        try:
            yield start
        finally:
            for standin in started:
                standin.stop()
    assert recorder.invalid() == []


def _run(scenario: Scenario, dag, hour: int):
    result = af.run(dag, hour, errors=scenario.errors)
    scenario.runs.append(result)
    return result


def _transaction(standin: SqlServerStandIn, statements: list[str]) -> None:
    conn = standin.connect(autocommit=False)
    try:
        cursor = conn.cursor()
        for statement in statements:
            cursor.execute(statement)
        conn.commit()
    finally:
        conn.close()


# -------------------------------------------------------------------------------------------- stream


@pytest.fixture(scope="module")
def stream(scenario_env) -> Scenario:
    """Debezium's fixtures on one database: snapshot (run 0), then a window (run 1) over the
    workloads of the cases below, each its own transaction(s)."""
    s = scenario_env("stream")
    sql = s.standin.execute_tsql
    for statement in (
        "CREATE TABLE tablea (id int primary key, cola varchar(30))",  # SqlServerConnectorIT.java:106
        "CREATE TABLE tableb (id int primary key, colb varchar(30))",  # SqlServerConnectorIT.java:107
        "CREATE TABLE MyTableOne (Id int primary key, ColA varchar(30))",  # CaseSensitivenessIT.java:56
        # SpecialCharsInNamesIT.java:147-148
        f"CREATE TABLE [{SPECIAL.replace(']', ']]')}] (id int primary key, [my col$a] varchar(30), "
        "[my col#b] varchar(30))",
        # TablesWithUniqueIndexOnlyIT.java:30-32 (the stand-in reads no NONCLUSTERED keyword)
        "CREATE TABLE t1 (key1 INT NOT NULL, key2 INT NOT NULL, data VARCHAR(255) NOT NULL, col4 INT NOT NULL)",
        "CREATE UNIQUE INDEX indexa ON t1 (col4)",
        "CREATE UNIQUE INDEX indexb ON t1 (key1, key2)",
        # SqlServerConnectorIT.java:1446-1447 (a comma added: the stand-in does not read `amount integer
        # primary key(id)`, a table constraint SQL Server accepts without one)
        "CREATE TABLE excluded_column_table_a (id int, name varchar(30), amount integer, primary key(id))",
        *(f"CREATE TABLE {table} ({ddl})" for table, ddl in TYPE_TABLES.items()),
        "CREATE TABLE lobs (id int primary key, n int, doc nvarchar(max), old ntext)",
    ):
        sql(statement)
    s.standin.enable_db()
    s.standin.set_snapshot_isolation(True)  # TestHelper.java:179
    for table in ("tablea", "tableb", "MyTableOne", SPECIAL, *TYPE_TABLES, "lobs"):
        s.standin.enable_table("dbo", table)
    # TablesWithUniqueIndexOnlyIT.java:62: key1, key2, data captured; the key is indexb's.
    s.standin.enable_table("dbo", "t1", index_name="indexb", captured_column_list="key1, key2, data")
    # SqlServerConnectorIT.java:1449-1450
    s.standin.enable_table(
        "dbo",
        "excluded_column_table_a",
        capture_instance="dbo_excluded_column_table_a",
        captured_column_list="id, name",
    )
    # The seed rows after CDC is enabled (Debezium inserts some before, SqlServerConnectorIT.java:108):
    # the stand-in's capture job writes no idle lsn_time_mapping rows, so without a captured change
    # fn_cdc_get_max_lsn() stays NULL (docs/sqlserver-standin.md, "LSNs and the capture job").
    for statement in (
        "INSERT INTO tablea VALUES(1, 'a')",  # SqlServerConnectorIT.java:108
        "INSERT INTO MyTableOne VALUES(1, 'a')",  # CaseSensitivenessIT.java:57
        f"INSERT INTO [{SPECIAL.replace(']', ']]')}] VALUES(1, 'a', 'b')",  # SpecialCharsInNamesIT.java:148
        "INSERT INTO t1 VALUES (1, 10, 'data1', 100)",  # TablesWithUniqueIndexOnlyIT.java:38
        "INSERT INTO excluded_column_table_a VALUES(10, 'a name', 100)",  # SqlServerConnectorIT.java:1448
        "INSERT INTO lobs VALUES(1, 1, N'long text', N'legacy text')",
        "INSERT INTO lobs VALUES(2, 1, N'to be deleted', N'legacy too')",
    ):
        sql(statement)
    s.standin.wait_until_captured()
    dag = capture_dag(
        f"conf_{s.standin.database}", make_capture(s.conn_id, s.sink, "stream", tables=STREAM_TABLES), s.errors
    )
    # The same tables read from the change tables directly (test_direct_mode_reads_the_same_events).
    direct = make_capture(
        s.conn_id, s.sink.with_name(s.sink.name + "_direct"), "direct", tables=STREAM_TABLES, data_query_mode="direct"
    )
    direct_dag = capture_dag(f"conf_direct_{s.standin.database}", direct, s.errors)
    assert _run(s, dag, 0).state == "success", s.errors
    assert af.run(direct_dag, 0, errors=s.errors).state == "success", s.errors

    # TransactionMetadataIT.java:88-96: one transaction of interleaved inserts, ids 10..14.
    _transaction(
        s.standin,
        [
            f"INSERT INTO tablea VALUES({i}, 'a')" if t == 0 else f"INSERT INTO tableb VALUES({i}, 'b')"
            for i in range(10, 15)
            for t in (0, 1)
        ],
    )
    # SqlServerConnectorIT.java:503-510: inserts, then one UPDATE of all of them.
    _transaction(s.standin, [f"INSERT INTO tableb VALUES({i}, 'b')" for i in range(200, 205)])
    sql("UPDATE tableb SET colb='z' WHERE id >= 200")
    # SqlServerConnectorIT.java:555-565 (updatePrimaryKey): key updates of both tables in one transaction.
    sql("INSERT INTO tableb VALUES(1, 'b')")
    _transaction(s.standin, ["UPDATE tablea SET id=100 WHERE id=1", "UPDATE tableb SET id=100 WHERE id=1"])
    sql("INSERT INTO MyTableOne VALUES(2, 'b')")  # CaseSensitivenessIT.java:100
    sql(f"INSERT INTO [{SPECIAL.replace(']', ']]')}] VALUES(2, 'c', 'd')")
    sql("INSERT INTO t1 VALUES (2, 20, 'data2', 200);")  # TablesWithUniqueIndexOnlyIT.java:97
    sql("INSERT INTO excluded_column_table_a VALUES(11, 'some_name', 120)")  # SqlServerConnectorIT.java:1459
    for statement in TYPE_ROWS.values():  # DatatypesFromStreamingIT: rows inserted while streaming
        sql(statement)
    sql("DELETE FROM tableb WHERE id BETWEEN 10 AND 14")  # SqlServerConnectorIT.java:204
    # One transaction changing one row three times (cdc.<capture_instance>_CT, __$command_id).
    _transaction(
        s.standin,
        [
            "INSERT INTO tablea VALUES(300, 'x')",
            "UPDATE tablea SET cola='y' WHERE id=300",
            "DELETE FROM tablea WHERE id=300",
        ],
    )
    sql("UPDATE lobs SET n = 2 WHERE id = 1")  # the LOB columns unchanged
    sql("DELETE FROM lobs WHERE id = 2")
    s.standin.wait_until_captured()
    assert _run(s, dag, 1).state == "success", s.errors
    assert af.run(direct_dag, 1, errors=s.errors).state == "success", s.errors
    return s


def test_transaction_metadata_orders_every_event_of_a_transaction(stream):
    """TransactionMetadataIT.java:105-117: a transaction of 10 interleaved inserts has one BEGIN and
    one END; its events carry the transaction id, total_order 1..10 in statement order and
    data_collection_order (counter + 1) / 2 per table; END counts 5 per table (Debezium names the
    collections ``testDB1.dbo.tablea``; the product ``dbo.tablea``, docs/sqlserver.md "Events")."""
    ids = range(10, 15)
    events = [e for t in ("dbo.tablea", "dbo.tableb") for e in stream.streamed(t) if e["op"] == "c"]
    mine = sorted((e for e in events if (e["after"]["id"] in ids)), key=lambda e: e["transaction"]["total_order"])
    assert len(mine) == 10
    assert len({e["transaction"]["id"] for e in mine}) == 1
    tx_id = mine[0]["transaction"]["id"]
    for counter, event in enumerate(mine, start=1):
        assert event["transaction"]["total_order"] == counter
        assert event["transaction"]["data_collection_order"] == (counter + 1) // 2
        assert event["source"]["table"] == ("tablea" if counter % 2 else "tableb")
    rows = [t for t in stream.transactions() if t["id"] == tx_id]
    assert sorted(r["status"] for r in rows) == ["BEGIN", "END"]
    end = next(r for r in rows if r["status"] == "END")
    assert end["event_count"] == 10
    assert {d["data_collection"]: d["event_count"] for d in end["data_collections"]} == {
        "dbo.tablea": 5,
        "dbo.tableb": 5,
    }


def test_update_carries_before_and_after_images(stream):
    """SqlServerConnectorIT.java:538-540 (update): each updated row is one ``u`` event, before the
    old values, after the new ones (``all update old``, Learn cdc.fn_cdc_get_all_changes_<ci>)."""
    updates = [e for e in stream.streamed("dbo.tableb") if e["op"] == "u"]
    assert sorted(e["after"]["id"] for e in updates) == list(range(200, 205))
    for event in updates:
        assert event["before"] == {"id": event["after"]["id"], "colb": "b"}
        assert event["after"]["colb"] == "z"


def test_key_update_is_a_delete_then_a_create_per_table(stream):
    """SqlServerConnectorIT.java:599-637 (updatePrimaryKey): ``UPDATE ... SET id=100 WHERE id=1`` is
    a delete of key 1 (before = old row, after null) then a create of key 100 (before null), for
    each table, in one transaction (Debezium adds a tombstone; the product has none)."""
    for table, column, value in (("dbo.tablea", "cola", "a"), ("dbo.tableb", "colb", "b")):
        moved = [
            e
            for e in stream.streamed(table)
            if e["op"] in "dc" and 100 in ((e["after"] or {}).get("id"), (e["before"] or {}).get("id"))
        ]
        assert [e["op"] for e in moved] == ["c"], moved  # key 100 appears once, as a create
        delete = next(e for e in stream.streamed(table) if e["op"] == "d" and e["before"]["id"] == 1)
        create = moved[0]
        assert delete["before"] == {"id": 1, column: value} and delete["after"] is None
        assert create["after"] == {"id": 100, column: value} and create["before"] is None
        assert delete["id"] == 1 and create["id"] == 100  # the key columns (flattened)
        assert delete["source"]["commit_lsn"] == create["source"]["commit_lsn"]
        assert delete["transaction"]["total_order"] < create["transaction"]["total_order"]


def test_mixed_case_names_are_kept(stream):
    """CaseSensitivenessIT.java:82-98, 100-118: ``MyTableOne (Id, ColA)`` keeps its case in the topic
    and in the field names, in the snapshot and in the stream."""
    events = stream.events("dbo.MyTableOne")
    assert [(e["op"], e["after"]) for e in events] == [("r", {"Id": 1, "ColA": "a"}), ("c", {"Id": 2, "ColA": "b"})]
    assert events[1]["source"]["table"] == "MyTableOne"


def test_special_characters_in_table_and_column_names(stream):
    """SpecialCharsInNamesIT.java:153-154, 108: a table named ``UAT WAG CZ$Fixed Asset ['1']`` with
    columns ``my col$a`` and ``my col#b`` is captured, values under the columns' own names
    (Debezium sanitises the topic to ``..._1__``; the product keeps the name, docs/naming)."""
    events = stream.events(f"dbo.{SPECIAL}")
    assert [(e["op"], e["after"]) for e in events] == [
        ("r", {"id": 1, "my col$a": "a", "my col#b": "b"}),
        ("c", {"id": 2, "my col$a": "c", "my col#b": "d"}),
    ]
    assert events[1]["source"]["table"] == SPECIAL


def test_unique_index_named_by_the_capture_instance_is_the_key(stream):
    """TablesWithUniqueIndexOnlyIT.java:94-101: a table without a primary key, captured with
    ``@index_name = indexb`` (key1, key2) and ``@captured_column_list = key1, key2, data``: events
    are keyed by key1 and key2, and col4 (not captured) is in no event."""
    events = stream.events("dbo.t1")
    assert [(e["op"], e["key1"], e["key2"]) for e in events] == [("r", 1, 10), ("c", 2, 20)]
    assert events[1]["after"] == {"key1": 2, "key2": 20, "data": "data2"}


def test_columns_the_capture_instance_excludes_are_in_no_event(stream):
    """SqlServerConnectorIT.java:1477-1483: ``@captured_column_list = id, name``: the snapshot's and
    the stream's events hold id and name only."""
    events = stream.events("dbo.excluded_column_table_a")
    assert [(e["op"], e["after"]) for e in events] == [
        ("r", {"id": 10, "name": "a name"}),
        ("c", {"id": 11, "name": "some_name"}),
    ]


def test_datatypes_from_streaming(stream):
    """AbstractSqlServerDatatypesTest.java:123-154 (DatatypesFromStreamingIT): the streamed values of
    SQL Server's numeric, Unicode string and date/time types, as written by SQL Server's rules
    (datetime in 1/300 s ticks: .78 stays .780; smalldatetime rounds 14:23:45 to 14:24; time(2)
    rounds .678 to .68; nchar pads). Debezium's values there are epoch numbers; the product's default
    ``time_precision='spark'`` gives the same instants as Spark values (docs/types-sqlserver.md)."""
    after = {t: stream.streamed(f"dbo.{t}")[0]["after"] for t in TYPE_TABLES}
    assert after["type_int"] == {
        "id": 0,
        "val_bit": True,
        "val_tinyint": 22,
        "val_smallint": 333,
        "val_int": 4444,
        "val_bigint": 55555,
    }
    assert after["type_fp"]["val_decimal"] == Decimal("1.123")
    assert after["type_fp"]["val_numeric"] == Decimal("2")
    assert after["type_fp"]["val_float"] == 3.323
    assert after["type_fp"]["val_real"] == pytest.approx(4.323, rel=1e-6)
    assert after["type_fp"]["val_smallmoney"] == Decimal("5.3230")
    assert after["type_fp"]["val_money"] == Decimal("6.3230")
    assert after["type_string"] == {
        "id": 0,
        "val_nchar": "c\u010d ",
        "val_nvarchar": "vc\u010d",
        "val_ntext": "t\u010d",
    }
    times = after["type_time"]
    assert times["val_date"] == date(2018, 7, 13)  # 17_725 days
    assert times["val_time_p2"] == 37_425_680_000  # µs: Time 37_425_680 ms
    assert times["val_time"] == 37_425_678_900  # MicroTime 37_425_678_900
    assert times["val_datetime2"] == datetime(2018, 7, 13, 11, 23, 45, 340000)  # 1_531_481_025_340 ms
    assert times["val_datetime"] == datetime(2018, 7, 13, 13, 23, 45, 780000)  # 1_531_488_225_780
    assert times["val_smalldatetime"] == datetime(2018, 7, 13, 14, 24)  # 1_531_491_840_000


def test_delete_carries_the_before_image(stream):
    """SqlServerConnectorIT.java:218-226 (createAndDelete): each deleted row is a ``d`` event whose
    before is the row and whose after is null."""
    deletes = [e for e in stream.streamed("dbo.tableb") if e["op"] == "d" and e["before"]["id"] >= 10]
    assert sorted(e["before"]["id"] for e in deletes) == list(range(10, 15))
    assert all(e["before"]["colb"] == "b" and e["after"] is None for e in deletes)


def test_changes_of_one_row_in_one_transaction_keep_statement_order(stream):
    """Learn, cdc.<capture_instance>_CT (``__$command_id``: the order of operations within a
    transaction; ``__$seqval``, in the current page, "should not be used for ordering") and
    SqlServerConnection.java:93 (Debezium's direct mode orders by it): an insert, an update and a
    delete of one row in one transaction come out as c, u, d in that order."""
    events = [
        e for e in stream.streamed("dbo.tablea") if 300 in ((e["after"] or {}).get("id"), (e["before"] or {}).get("id"))
    ]
    assert [e["op"] for e in events] == ["c", "u", "d"]
    assert [e["transaction"]["total_order"] for e in events] == [1, 2, 3]
    assert events[1]["before"]["cola"] == "x" and events[1]["after"]["cola"] == "y"


def test_direct_mode_reads_the_same_events(stream):
    """SqlServerConnectorIT.java:143-154 (createAndDeleteWithDataQueryModeDirect...): reading the
    change tables directly (``data.query.mode=direct``) gives the events the functions give. Both
    captures snapshot at the same LSN (nothing committed between their first runs), so their windows
    hold the same commits."""

    def strip(e: dict) -> tuple:
        return (e["op"], str(e["before"]), str(e["after"]), e["source"]["commit_lsn"], e["transaction"]["total_order"])

    for table in ("dbo.tablea", "dbo.tableb", "dbo.t1", f"dbo.{SPECIAL}"):
        direct = sorted(
            strip(e)
            for e in events_of(str(stream.sink.with_name(stream.sink.name + "_direct")), "shop", table)
            if e["op"] != "r"
        )
        function = sorted(strip(e) for e in stream.streamed(table))
        assert direct == function, table
        assert function, table


def test_lob_columns_follow_sql_servers_update_old_and_delete_rules(stream):
    """Learn, cdc.fn_cdc_get_all_changes_<capture_instance>, Remarks: text/ntext/image columns are
    NULL when ``__$operation`` = 1 or 3; varchar(max)/nvarchar(max)/varbinary(max) are NULL when
    ``__$operation`` = 3 unless the column changed, and hold their value at delete (1). The function
    returns exactly that for an update of another column and a delete. The product's events never
    carry a value SQL Server did not give: an unchanged column's before value is its after value (the
    update mask says it did not change), a text/ntext/image value of a delete is Debezium's
    unavailable-value placeholder (docs/sqlserver.md, "Columns a change row does not carry")."""
    rows = stream.standin.execute_tsql(
        "SELECT __$operation, id, doc, old FROM cdc.fn_cdc_get_all_changes_dbo_lobs("
        "sys.fn_cdc_get_min_lsn(N'dbo_lobs'), sys.fn_cdc_get_max_lsn(), N'all update old') "
        "ORDER BY __$start_lsn, __$seqval, __$operation"
    )
    assert [tuple(r) for r in rows][-3:] == [
        (3, 1, None, None),
        (4, 1, "long text", "legacy text"),
        (1, 2, "to be deleted", None),
    ]
    update = next(e for e in stream.streamed("dbo.lobs") if e["op"] == "u")
    assert update["after"] == {"id": 1, "n": 2, "doc": "long text", "old": "legacy text"}
    assert update["before"]["n"] == 1
    assert update["before"]["doc"] == "long text" and update["before"]["old"] == "legacy text"
    delete = next(e for e in stream.streamed("dbo.lobs") if e["op"] == "d")
    assert {k: delete["before"][k] for k in ("id", "n", "doc")} == {"id": 2, "n": 1, "doc": "to be deleted"}
    assert delete["before"]["old"] == "__debezium_unavailable_value"


def test_computed_columns_are_null_in_change_rows_and_left_out_of_every_event(scenario_env):
    """Learn, cdc.fn_cdc_get_all_changes_<capture_instance>, Remarks: "Computed columns that are
    included in a capture instance always have a value of NULL". The stand-in's change rows hold
    NULL; the product leaves computed columns out of the snapshot and the stream alike (a value no
    change row carries would go stale: docs/sqlserver.md, "Columns a change row does not carry")."""
    s = scenario_env("computed")
    s.standin.execute_tsql(
        "CREATE TABLE priced (id int primary key, qty int, price int, total AS (CAST(qty * price AS int)))"
    )
    s.standin.enable_db()
    s.standin.set_snapshot_isolation(True)
    s.standin.enable_table("dbo", "priced")
    s.standin.execute_tsql("INSERT INTO priced (id, qty, price) VALUES (1, 2, 3)")
    s.standin.wait_until_captured()
    dag = capture_dag(
        f"conf_{s.standin.database}", make_capture(s.conn_id, s.sink, "computed", tables=["dbo.priced"]), s.errors
    )
    assert _run(s, dag, 0).state == "success", s.errors
    s.standin.execute_tsql("INSERT INTO priced (id, qty, price) VALUES (2, 4, 5)")
    s.standin.wait_until_captured()
    assert _run(s, dag, 1).state == "success", s.errors
    raw = s.standin.execute_tsql("SELECT id, total FROM cdc.dbo_priced_CT WHERE __$operation = 2 ORDER BY id")
    assert [tuple(r) for r in raw] == [(1, None), (2, None)]
    assert s.standin.execute_tsql("SELECT total FROM priced WHERE id = 2")[0][0] == 20
    events = s.events("dbo.priced")
    assert [(e["op"], e["after"]["id"]) for e in events] == [("r", 1), ("c", 2)]
    assert all("total" not in e["after"] for e in events)


# ----------------------------------------------------------------------- schema change and purge


@pytest.fixture(scope="module")
def evolving(scenario_env) -> Scenario:
    """SchemaHistoryTopicIT.java:73-205 (streamingSchemaChanges), then
    SqlServerConnectorIT.java:2208-2262 (shouldDetectPurgedHistory): inserts; a column added and a
    second capture instance; inserts; a window; inserts the cleanup job purges before they are read;
    a window."""
    s = scenario_env("evolving")
    sql = s.standin.execute_tsql
    sql("CREATE TABLE tablea (id int primary key, cola varchar(30))")
    sql("CREATE TABLE tableb (id int primary key, colb varchar(30))")
    s.standin.enable_db()
    s.standin.set_snapshot_isolation(True)
    s.standin.enable_table("dbo", "tablea")
    s.standin.enable_table("dbo", "tableb")
    sql("INSERT INTO tablea VALUES(1, 'a')")
    s.standin.wait_until_captured()
    dag = capture_dag(
        f"conf_{s.standin.database}",
        make_capture(s.conn_id, s.sink, "evolving", tables=["dbo.tablea", "dbo.tableb"]),
        s.errors,
    )
    assert _run(s, dag, 0).state == "success", s.errors
    for i in range(10, 15):  # SchemaHistoryTopicIT.java:88-93
        sql(f"INSERT INTO tablea VALUES({i}, 'a')")
        sql(f"INSERT INTO tableb VALUES({i}, 'b')")
    # SchemaHistoryTopicIT.java:142-143 renames colb (sp_rename) before the second instance; the
    # stand-in emulates no sp_rename, so a column is added instead (the same switch of instance).
    sql("ALTER TABLE tableb ADD newcolb varchar(30)")
    s.standin.enable_table("dbo", "tableb", capture_instance="after_change")
    for i in range(20, 25):  # SchemaHistoryTopicIT.java:145-151
        sql(f"INSERT INTO tablea VALUES({i}, 'a2')")
        sql(f"INSERT INTO tableb(id, colb, newcolb) VALUES({i}, 'b', 'b2')")
    s.standin.wait_until_captured()
    _run(s, dag, 1)
    for i in range(30, 35):  # SqlServerConnectorIT.java:2247-2250, then the purge
        sql(f"INSERT INTO tablea VALUES({i}, 'a3')")
    s.standin.wait_until_captured()
    assert s.standin.cleanup(retention_minutes=0) is not None
    _run(s, dag, 2)
    return s


def test_a_second_capture_instance_carries_the_new_column_from_its_start(evolving):
    """SchemaHistoryTopicIT.java:169-170, 173-188: after the second capture instance, each table has
    all its changes (5 + 5), and tableb's changes recorded by the new instance carry the new column
    while the earlier ones (old instance) do not have it (null)."""
    run = evolving.runs[1]
    assert run.state == "success", evolving.errors
    a = [e["after"]["id"] for e in evolving.streamed("dbo.tablea")]
    assert a == [*range(10, 15), *range(20, 25)]
    b = evolving.streamed("dbo.tableb")
    assert [(e["after"]["id"], e["after"].get("newcolb")) for e in b] == [
        *((i, None) for i in range(10, 15)),
        *((i, "b2") for i in range(20, 25)),
    ]


def test_a_purge_past_the_offset_fails_the_window(evolving):
    """SqlServerConnectorIT.java:2256-2259 (shouldDetectPurgedHistory: the connector reports that the
    offset's LSN is no longer available), Learn sys.fn_cdc_get_min_lsn (the low endpoint moves on
    when cleanup runs; a range below it fails with error 313): with the default snapshot_mode the
    window fails with ChangesPurgedError and writes nothing (docs/sqlserver.md, "Purged changes")."""
    run = evolving.runs[2]
    assert run.state == "failed"
    assert "ChangesPurgedError" in run.error("window")
    assert not [e for e in evolving.streamed("dbo.tablea") if e["after"] and e["after"]["id"] >= 30]


# ----------------------------------------------------------------------------------- preflight


def _setup_dag(scenario: Scenario, name: str, conn_id: str, tables: list[str]):
    from airflow.sdk import DAG

    from airflow_provider_cdc.operators.setup import CdcSetupOperator

    capture = make_capture(conn_id, scenario.sink / name, name, tables=tables)
    with DAG(
        f"conf_{name}_{scenario.standin.database}",
        schedule=None,
        start_date=af.START,
        default_args={"on_failure_callback": af.failure_recorder(scenario.errors)},
    ) as dag:
        CdcSetupOperator(task_id="setup", capture=capture)
    af.register(dag)
    return dag


@dataclass
class Preflight:
    scenario: Scenario
    login: str
    password: str
    login_conn_id: str

    def setup(self, name: str, tables: list[str], *, as_login: bool = False) -> tuple[str, str]:
        """Runs the setup task alone; (state, its error or "")."""
        conn_id = self.login_conn_id if as_login else self.scenario.conn_id
        self.scenario.errors.pop("setup", None)
        result = af.run(_setup_dag(self.scenario, name, conn_id, tables), 0, errors=self.scenario.errors)
        return result.state, (result.error("setup") if "setup" in result.errors else "")


@pytest.fixture(scope="module")
def preflight(scenario_env) -> Preflight:
    """dbo.orders (captured) and Debezium's keyless table (SqlServerConnectorIT.java:2078-2080), and a
    login with SELECT on dbo.orders only: the product's setup checks against SQL Server's rules."""
    import json

    s = scenario_env("preflight")
    s.standin.execute_tsql("CREATE TABLE orders (id int primary key, note nvarchar(100))")
    s.standin.execute_tsql("CREATE TABLE keyless (id int, name varchar(30))")
    s.standin.enable_db()
    s.standin.enable_table("dbo", "orders")
    s.standin.enable_table("dbo", "keyless")
    s.standin.execute_tsql("INSERT INTO orders VALUES (1, N'x')")
    s.standin.wait_until_captured()
    login, password = f"pf_{s.standin.database}"[:63], "Pw-" + secrets.token_urlsafe(12)
    s.standin.create_login(login, password)
    s.standin.execute_tsql(f"GRANT SELECT ON dbo.orders TO {login}")
    conn = json.loads(airflow_connection(s.standin))
    conn_id = f"mssql_{login}"
    os.environ[f"AIRFLOW_CONN_{conn_id.upper()}"] = json.dumps({**conn, "login": login, "password": password})
    yield Preflight(s, login, password, conn_id)
    os.environ.pop(f"AIRFLOW_CONN_{conn_id.upper()}", None)


def test_a_table_without_a_key_is_refused_naming_the_unique_index_fix(preflight):
    """SqlServerConnectorIT.java:2102-2103 (keylessTable): Debezium captures a table without a key,
    with null message keys; the product requires a key (docs/sqlserver.md, "Every captured table
    needs a primary key, or a capture instance created with @index_name"), so setup refuses it and
    names the fix, sp_cdc_enable_table's @index_name (Learn, sys.sp_cdc_enable_table)."""
    state, error = preflight.setup("keyless", ["dbo.keyless"])
    assert state == "failed"
    assert "[dbo].[keyless] has no primary key" in error and "@index_name" in error


def test_snapshot_isolation_off_is_refused_naming_alter_database(preflight):
    """Learn, SET TRANSACTION ISOLATION LEVEL (SNAPSHOT: "ALLOW_SNAPSHOT_ISOLATION must be set to ON";
    otherwise error 3952) and Debezium's TestHelper.java:179 (every test database gets it): the default
    snapshot_isolation_mode='snapshot' needs it, and setup says how to turn it on."""
    preflight.scenario.standin.set_snapshot_isolation(False)
    state, error = preflight.setup("isolation", ["dbo.orders"])
    assert state == "failed"
    assert "SET ALLOW_SNAPSHOT_ISOLATION ON" in error
    preflight.scenario.standin.set_snapshot_isolation(True)
    assert preflight.setup("isolation_on", ["dbo.orders"]) == ("success", "")


def test_a_login_that_cannot_read_the_change_tables_is_refused(preflight):
    """SqlServerConnectorIT.java:1038-1057 (shouldReportConfigurationErrorForUserNotHavingAccessToCDCTable
    InInitialMode: a login without access to the change tables is a configuration error), Learn,
    cdc.fn_cdc_get_all_changes_<ci>, Permissions: setup fails naming the grant."""
    state, error = preflight.setup("no_cdc", ["dbo.orders"], as_login=True)
    assert state == "failed"
    assert "GRANT SELECT ON SCHEMA::[cdc]" in error


def test_a_stopped_agent_is_reported_to_a_login_with_view_server_state(preflight):
    """SqlServerConnection.java:157 (Debezium reads sys.dm_server_services, status 4 = running) and
    Learn, sys.dm_server_services (status 1 "Stopped"): setup as sysadmin fails saying the Agent, which
    runs the capture job, is not running."""
    preflight.scenario.standin.pause_capture()
    try:
        state, error = preflight.setup("agent", ["dbo.orders"])
    finally:
        preflight.scenario.standin.resume_capture()
    assert state == "failed"
    assert "SQL Server Agent is not running" in error


def test_without_view_server_state_the_agent_is_not_visible_and_not_a_problem(preflight):
    """Learn, sys.dm_server_services, Permissions ("Requires VIEW SERVER STATE permission on the
    server"; without it the query fails, error 300): a login with the required grants but not the
    optional VIEW SERVER STATE (docs/sqlserver.md) cannot see the Agent, so setup passes even while
    the Agent is stopped (the product treats the status as unknown)."""
    standin = preflight.scenario.standin
    standin.execute_tsql(f"GRANT SELECT ON SCHEMA::cdc TO {preflight.login}")
    conn = standin.connect(user=preflight.login, password=preflight.password)
    try:
        with pytest.raises(pyodbc.Error, match=r"VIEW SERVER STATE permission was denied.*\(300\)"):
            conn.cursor().execute("SELECT status_desc FROM sys.dm_server_services").fetchall()
    finally:
        conn.close()
    standin.pause_capture()
    try:
        assert preflight.setup("agent_hidden", ["dbo.orders"], as_login=True) == ("success", "")
    finally:
        standin.resume_capture()


def test_a_missing_table_whose_name_holds_a_number_in_parentheses_is_reported_as_missing(preflight):
    """Learn, "Database engine events and errors (0 to 999)", 208 "Invalid object name '%.*ls'." (the
    name as written, inside the message)
    and Learn, "Database identifiers" (a delimited identifier may hold any character): a capture
    naming ``[dbo].[orders (2)]``, which does not exist, fails setup saying the table does not exist,
    with the name SQL Server's message carries taken for no error number."""
    state, error = preflight.setup("missing_paren", ["dbo.[orders (2)]"])
    assert state == "failed"
    assert "these tables do not exist" in error and "[orders (2)]" in error
