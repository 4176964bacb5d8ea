"""Columns a change row does not carry (Learn, cdc.fn_cdc_get_all_changes_<capture_instance>, Remarks):

- computed columns are always NULL: the capture leaves them out (snapshot and stream alike);
- ``image``/``text``/``ntext`` are NULL in a delete and in an update's before image: an unchanged
  column's before value is the after image's, a changed one's and a delete's is unavailable (the
  unavailable-value placeholder, as PostgreSQL's unchanged TOAST values);
- ``varchar(max)``/``nvarchar(max)``/``varbinary(max)`` are NULL in an update's before image unless
  the column changed: the after image's value then.

The stand-in's capture job stores those NULLs (tests/support/sqlserver/capture.py). Events and the
fold are checked for each case: insert, update of another column, update of the column, delete.
"""

from __future__ import annotations

import pytest

from airflow_provider_cdc.cdc.basics.naming import Topic
from airflow_provider_cdc.cdc.events.value_modes import DEFAULT_PLACEHOLDER
from airflow_provider_cdc.cdc.state.apply import apply_windows
from airflow_provider_cdc.cdc.state.jobs import read_state
from tests.integration.sqlserver.test_capture import capture_dag, make_capture
from tests.support import airflow as af
from tests.support.oracle import assert_same_state, events_of, replay, spark_rows

pytestmark = [pytest.mark.airflow, pytest.mark.spark]

TABLE = "dbo.notes"
COLUMNS = ("id", "n", "note", "memo", "blob")


def _current_state(spark, sink, table: str) -> dict[tuple, dict]:
    """The product's current-state table (the Spark fold of the committed windows), by id."""
    schema, name = table.split(".")
    where = {"topic_prefix": "shop", "topic": Topic.for_table("shop", schema, name), "state_path": str(sink / "state")}
    apply_windows(spark, sink_path=str(sink), **where)
    return spark_rows(read_state(spark, **where), ["id"])


def _source(standin) -> dict[tuple, dict]:
    conn = standin.connect()
    try:
        cursor = conn.cursor()
        cursor.execute(f"SELECT {', '.join(COLUMNS)} FROM {TABLE}")
        return {(row[0],): dict(zip(COLUMNS, row)) for row in cursor.fetchall()}
    finally:
        conn.close()


def _stored(standin) -> list[tuple]:
    return standin.admin_query(
        'SELECT "__$operation", id, note, memo, total FROM cdc."dbo_notes_CT" ORDER BY "__$start_lsn", "__$seqval", '
        '"__$operation"'
    )


@pytest.mark.parametrize("mode", ["function", "direct"])
def test_columns_a_change_row_does_not_carry(sqlserver_conn, spark, tmp_path, mode):
    standin, conn_id = sqlserver_conn
    standin.execute_tsql(
        f"CREATE TABLE {TABLE} (id int NOT NULL PRIMARY KEY, n int NOT NULL, note nvarchar(max) NULL, "
        "memo ntext NULL, blob image NULL, total AS (CAST(n * 2 AS int)) PERSISTED)"
    )
    standin.set_snapshot_isolation(True)
    standin.enable_db()
    standin.enable_table("dbo", "notes")
    x = standin.execute_tsql
    x(f"INSERT INTO {TABLE} (id, n, note, memo, blob) VALUES (1, 1, N'first', N'memo 1', 0x01)")
    standin.wait_until_captured()
    errors: dict = {}
    capture = make_capture(conn_id, tmp_path, standin.database, tables=[TABLE], data_query_mode=mode)
    dag = capture_dag(f"uncarried_{standin.database}", capture, errors)
    assert af.run(dag, 0, errors=errors).state == "success", errors

    x(f"INSERT INTO {TABLE} (id, n, note, memo, blob) VALUES (2, 5, N'second', N'memo 2', 0x02)")  # insert
    x(f"UPDATE {TABLE} SET n = 7 WHERE id = 2")  # update of another column
    x(f"UPDATE {TABLE} SET note = N'changed', memo = N'memo 2b', blob = 0x03 WHERE id = 2")  # of the columns
    x(f"INSERT INTO {TABLE} (id, n, note, memo, blob) VALUES (3, 1, N'third', N'memo 3', 0x04)")
    x(f"DELETE FROM {TABLE} WHERE id = 3")  # delete
    standin.wait_until_captured()

    # What SQL Server stores (the stand-in's model): computed NULL everywhere, ntext NULL for 1 and 3,
    # nvarchar(max) NULL for 3 unless it changed.
    stored = [row for row in _stored(standin) if row[1] in (2, 3)]
    assert stored == [
        (2, 2, "second", "memo 2", None),
        (3, 2, None, None, None),
        (4, 2, "second", "memo 2", None),
        (3, 2, "second", None, None),
        (4, 2, "changed", "memo 2b", None),
        (2, 3, "third", "memo 3", None),
        (1, 3, "third", None, None),
    ]

    assert af.run(dag, 1, errors=errors).state == "success", errors
    events = events_of(tmp_path, "shop", TABLE)
    assert all("total" not in (e["after"] or e["before"]) for e in events)  # computed: not captured
    stream = [(e["op"], (e["after"] or e["before"])["id"]) for e in events if e["op"] != "r"]
    assert stream == [("c", 2), ("u", 2), ("u", 2), ("c", 3), ("d", 3)]
    created, other, itself, _created3, deleted = [e for e in events if e["op"] != "r"]
    assert created["after"] == {"id": 2, "n": 5, "note": "second", "memo": "memo 2", "blob": b"\x02"}
    # update of another column: the unchanged LOB values are the after image's
    assert other["before"] == {"id": 2, "n": 5, "note": "second", "memo": "memo 2", "blob": b"\x02"}
    assert other["after"] == {"id": 2, "n": 7, "note": "second", "memo": "memo 2", "blob": b"\x02"}
    # update of the columns: nvarchar(max) carries its old value, ntext/image do not
    assert itself["before"] == {
        "id": 2,
        "n": 7,
        "note": "second",
        "memo": DEFAULT_PLACEHOLDER,
        "blob": DEFAULT_PLACEHOLDER.encode(),
    }
    assert itself["after"] == {"id": 2, "n": 7, "note": "changed", "memo": "memo 2b", "blob": b"\x03"}
    # delete: nvarchar(max) carries its value, ntext/image do not
    assert deleted["before"] == {
        "id": 3,
        "n": 1,
        "note": "third",
        "memo": DEFAULT_PLACEHOLDER,
        "blob": DEFAULT_PLACEHOLDER.encode(),
    }
    assert_same_state(replay(events, ["id"]), _source(standin))
    assert_same_state(_current_state(spark, tmp_path, TABLE), _source(standin))
