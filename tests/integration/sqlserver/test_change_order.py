"""Order inside a transaction: SQL Server's deferred updates, whose __$seqval order is not the order
of the changes (docs/sqlserver.md, "Order inside a transaction").

An update of a primary-key or unique column is stored as a delete and an insert per row (KB302341,
KB3030352). In ``__$command_id`` order a statement's deletes all come before its inserts; in
``__$seqval`` order a row's delete and insert stay together and the insert may come first
(KB3030352, KB4135113; Debezium's SqlServerDataQueryModeIT, dbz#2012). The stand-in's capture job
stores them so (tests/support/sqlserver/capture.py). Whatever the query mode, the events must fold
to exactly the source table.
"""

from __future__ import annotations

import pytest

from airflow_provider_cdc.cdc.basics.naming import Topic
from airflow_provider_cdc.cdc.state.apply import apply_windows
from airflow_provider_cdc.cdc.state.jobs import read_state
from tests.integration.sqlserver.test_capture import capture_dag, make_capture
from tests.support import airflow as af
from tests.support.oracle import assert_same_state, events_of, replay, spark_rows

pytestmark = [pytest.mark.airflow, pytest.mark.spark]

ROWS = 1000  # T-SQL's row-value limit for one INSERT ... VALUES


def _table(standin, name: str) -> None:
    standin.execute_tsql(
        f"CREATE TABLE dbo.{name} (id int NOT NULL PRIMARY KEY, code int NOT NULL UNIQUE, label nvarchar(40) NULL)"
    )
    standin.set_snapshot_isolation(True)
    standin.enable_db()
    standin.enable_table("dbo", name)
    values = ", ".join(f"({i}, {i * 10}, N'row {i}')" for i in range(1, ROWS + 1))
    standin.execute_tsql(f"INSERT INTO dbo.{name} (id, code, label) VALUES {values}")
    standin.wait_until_captured()


def _current_state(spark, sink, table: str) -> dict[tuple, dict]:
    """The product's current-state table (the Spark fold of the committed windows), by id."""
    schema, name = table.split(".")
    where = {"topic_prefix": "shop", "topic": Topic.for_table("shop", schema, name), "state_path": str(sink / "state")}
    apply_windows(spark, sink_path=str(sink), **where)
    return spark_rows(read_state(spark, **where), ["id"])


def _source(standin, table: str) -> dict[tuple, dict]:
    conn = standin.connect()
    try:
        cursor = conn.cursor()
        cursor.execute(f"SELECT id, code, label FROM dbo.{table}")
        return {(row[0],): {"id": row[0], "code": row[1], "label": row[2]} for row in cursor.fetchall()}
    finally:
        conn.close()


def _capture_after(sqlserver_conn, tmp_path, mode: str, table: str, statements: list[str]) -> list[dict]:
    """Snapshot, then the statements in one transaction, then one window; the table's events."""
    standin, conn_id = sqlserver_conn
    _table(standin, table)
    errors: dict = {}
    capture = make_capture(conn_id, tmp_path, standin.database, tables=[f"dbo.{table}"], data_query_mode=mode)
    dag = capture_dag(f"order_{table}_{standin.database}", capture, errors)
    assert af.run(dag, 0, errors=errors).state == "success", errors
    conn = standin.connect(autocommit=False)
    try:
        for statement in statements:
            conn.cursor().execute(statement)
        conn.commit()
    finally:
        conn.close()
    standin.wait_until_captured()
    assert af.run(dag, 1, errors=errors).state == "success", errors
    return events_of(tmp_path, "shop", f"dbo.{table}")


def _change_rows(standin, instance: str) -> list[tuple[int, bytes, int, int]]:
    """The last transaction's change rows in __$seqval order: operation, seqval, command id, key."""
    rows = standin.admin_query(
        f'SELECT "__$operation", "__$seqval", "__$command_id", id FROM cdc."{instance}_CT" '
        f'WHERE "__$start_lsn" = (SELECT max("__$start_lsn") FROM cdc."{instance}_CT") '
        'ORDER BY "__$seqval", "__$operation"'
    )
    return [(op, bytes(seq), cid, key) for op, seq, cid, key in rows]


@pytest.mark.parametrize("mode", ["function", "direct"])
def test_a_primary_key_shift_over_many_rows_folds_to_the_source(sqlserver_conn, spark, tmp_path, mode):
    # UPDATE ... SET id = id + 1 over 1,000 rows: a delete and an insert per row. In __$seqval order
    # the insert of key k+1 (row k) comes before the delete of key k+1 (row k+1): applied in that
    # order, every key but the last would be deleted (KB3030352's primary key violation).
    standin, _ = sqlserver_conn
    events = _capture_after(sqlserver_conn, tmp_path, mode, "shift", ["UPDATE dbo.shift SET id = id + 1"])

    stored = _change_rows(standin, "dbo_shift")
    assert len(stored) == 2 * ROWS
    ops = [op for op, *_ in stored]
    assert ops[:4] == [1, 2, 1, 2]  # __$seqval order: each row's delete and insert together
    by_command = sorted(stored, key=lambda r: r[2])
    assert [op for op, *_ in by_command] == [1] * ROWS + [2] * ROWS  # __$command_id: deletes first
    stream = [e for e in events if e["op"] != "r"]
    assert sorted(e["op"] for e in stream) == ["c"] * ROWS + ["d"] * ROWS
    assert_same_state(replay(events, ["id"]), _source(standin, "shift"))
    assert_same_state(_current_state(spark, tmp_path, "dbo.shift"), _source(standin, "shift"))
    assert sorted(k for (k,) in _source(standin, "shift")) == list(range(2, ROWS + 2))


@pytest.mark.parametrize("mode", ["function", "direct"])
def test_an_update_of_a_unique_column_over_many_rows_folds_to_the_source(sqlserver_conn, spark, tmp_path, mode):
    # A unique non-key column moved down: a delete and an insert of the same key per row, the insert
    # first in __$seqval order (KB3030352, KB4135113). Applied in that order, every row would go.
    standin, _ = sqlserver_conn
    events = _capture_after(
        sqlserver_conn, tmp_path, mode, "codes", ["UPDATE dbo.codes SET code = code - 5, label = N'moved'"]
    )

    stored = _change_rows(standin, "dbo_codes")
    assert len(stored) == 2 * ROWS
    first = stored[:2]
    assert [op for op, *_ in first] == [2, 1] and first[0][3] == first[1][3]  # same key, insert first
    by_command = sorted(stored, key=lambda r: r[2])
    assert [op for op, *_ in by_command] == [1] * ROWS + [2] * ROWS
    source = _source(standin, "codes")
    assert len(source) == ROWS and {r["label"] for r in source.values()} == {"moved"}
    assert_same_state(replay(events, ["id"]), source)
    assert_same_state(_current_state(spark, tmp_path, "dbo.codes"), source)


@pytest.mark.parametrize("mode", ["function", "direct"])
def test_an_insert_then_a_delete_of_one_key_in_one_transaction_leaves_no_row(sqlserver_conn, spark, tmp_path, mode):
    # The opposite order, in two statements: insert-before-delete of one key is real here, and must
    # stay so (a rule that simply put deletes first would bring the row back).
    standin, _ = sqlserver_conn
    events = _capture_after(
        sqlserver_conn,
        tmp_path,
        mode,
        "brief",
        [
            f"INSERT INTO dbo.brief (id, code, label) VALUES ({ROWS + 1}, -1, N'brief')",
            f"DELETE FROM dbo.brief WHERE id = {ROWS + 1}",
            "UPDATE dbo.brief SET code = code + 1 WHERE id = 1",
        ],
    )
    source = _source(standin, "brief")
    assert (ROWS + 1,) not in source
    assert_same_state(replay(events, ["id"]), source)
    assert_same_state(_current_state(spark, tmp_path, "dbo.brief"), source)
