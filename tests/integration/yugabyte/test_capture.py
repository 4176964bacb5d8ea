"""The YugabyteDB source end to end on the stand-in: the shared operators under dag.test(), real Spark."""

from __future__ import annotations

import pytest

from airflow_provider_cdc.captures.yugabyte import YugabyteCapture
from airflow_provider_cdc.cdc.sinks.reader import read_topic_arrow
from airflow_provider_cdc.operators.setup import CdcSetupOperator
from airflow_provider_cdc.operators.snapshot import CdcSnapshotOperator
from airflow_provider_cdc.operators.window import CdcWindowOperator
from tests.support import airflow as af
from tests.support import yb_workload as workload
from tests.support.oracle import assert_same_state, events_of, replay
from tests.support.yugabyte.read_time_procedure import documented, with_role

pytestmark = [pytest.mark.airflow, pytest.mark.spark]


def make_capture(conn_id: str, sink, database: str, **overrides) -> YugabyteCapture:
    from airflow_provider_cdc.offsets.variable import VariableOffsetStore

    overrides.setdefault("offset_store", VariableOffsetStore(key_prefix=f"cdc_offset_{database}__"))
    overrides.setdefault("tables", list(workload.TABLES))
    return YugabyteCapture(
        yugabytedb_conn_id=conn_id,
        topic_prefix="shop",
        sink_path=str(sink),
        **{"spark_master": "local[2]", "idle_timeout_seconds": 60.0, **overrides},
    )


def capture_dag(dag_id: str, capture: YugabyteCapture, errors: dict, **window_kwargs):
    from airflow.sdk import DAG

    with DAG(
        dag_id,
        schedule="@hourly",
        start_date=af.START,
        catchup=False,
        max_active_runs=1,
        default_args={"on_failure_callback": af.failure_recorder(errors)},
    ) as dag:
        (
            CdcSetupOperator(task_id="setup", capture=capture)
            >> CdcSnapshotOperator(task_id="snapshot", capture=capture)
            >> CdcWindowOperator(task_id="window", capture=capture, **window_kwargs)
        )
    af.register(dag)
    return dag


def assert_reproduces_source(standin, sink) -> None:
    for table, keys in workload.KEYS.items():
        assert_same_state(replay(events_of(sink, "shop", table), keys), workload.source_rows(standin, table))


def slot_row(standin, slot: str = "cdc_shop") -> dict:
    with standin.connect() as conn:
        cursor = conn.execute(
            "SELECT confirmed_flush_lsn::text, yb_restart_commit_ht, yb_lsn_type, plugin FROM pg_replication_slots "
            "WHERE slot_name = %s",
            (slot,),
        )
        row = cursor.fetchone()
        return dict(zip([c.name for c in cursor.description], row)) if row else {}


def test_snapshot_and_windows_reproduce_the_source(yugabyte_conn, tmp_path):
    from airflow_provider_cdc.cdc.sources.yugabyte.lsn import YbLsn

    standin, conn_id = yugabyte_conn
    workload.create(standin)
    errors: dict = {}
    dag = capture_dag(f"yb_{standin.database}", make_capture(conn_id, tmp_path, standin.database), errors)

    first = af.run(dag, 0, errors=errors)
    assert first.state == "success", errors
    snapshot, window = first.xcom["snapshot"], first.xcom["window"]
    assert snapshot["events"] == {"shop.public.customers": {"r": 10}, "shop.public.orders": {"r": 20}}
    assert window["from_lsn"] == snapshot["to_lsn"]
    assert slot_row(standin)["plugin"] == "yboutput" and slot_row(standin)["yb_lsn_type"] == "HYBRID_TIME"
    assert_reproduces_source(standin, tmp_path)

    made = workload.mutate(standin, 1)
    second = af.run(dag, 1, errors=errors)
    assert second.state == "success", errors
    window = second.xcom["window"]
    total = {op: sum(c.get(op, 0) for c in window["events"].values()) for op in "cud"}
    assert total == made
    assert window["transactions"] == workload.TRANSACTIONS_PER_ROUND
    assert_reproduces_source(standin, tmp_path)
    # Acknowledged on a replication connection: the slot is confirmed at the window's end hybrid time.
    assert YbLsn(slot_row(standin)["confirmed_flush_lsn"]) == YbLsn(window["to_lsn"]) - 1

    # Under REPLICA IDENTITY CHANGE an update carries the key and what it changed; the rest is
    # listed as not sent, and an explicit NULL is a value, not "not sent".
    updates = [e for e in events_of(tmp_path, "shop", "public.customers") if e["op"] == "u"]
    renamed = next(e for e in updates if e["after"]["name"] == "renamed 1")
    assert renamed["before"] is None
    assert sorted(renamed["unchanged_toast_columns"]) == ["active", "balance", "email"]
    nulled = next(e for e in updates if "email" not in (e["unchanged_toast_columns"] or []))
    assert nulled["after"]["email"] is None and sorted(nulled["unchanged_toast_columns"]) == ["active", "name"]

    # The two-table transaction: one BEGIN/END pair whose counts name both tables.
    transactions = read_topic_arrow(str(tmp_path), "shop", "shop.transaction").to_pylist()
    ends = [t for t in transactions if t["status"] == "END" and t["window_id"] == window["window_id"]]
    assert len(ends) == workload.TRANSACTIONS_PER_ROUND
    both = [t for t in ends if len(t["data_collections"]) == 2]
    assert both, ends

    made = workload.mutate(standin, 2)
    third = af.run(dag, 2, errors=errors)
    assert third.state == "success", errors
    assert {op: sum(c.get(op, 0) for c in third.xcom["window"]["events"].values()) for op in "cud"} == made
    assert third.xcom["window"]["from_lsn"] == window["to_lsn"]
    assert_reproduces_source(standin, tmp_path)


def test_sequence_slots_end_each_window_at_its_fence(yugabyte_conn, tmp_path):
    """SEQUENCE slots number every record; a window ends before the transaction of its fence row,
    found by streaming to it when the window is planned."""
    standin, conn_id = yugabyte_conn
    workload.create(standin)
    errors: dict = {}
    capture = make_capture(conn_id, tmp_path, standin.database, lsn_type="SEQUENCE")
    dag = capture_dag(f"yb_{standin.database}", capture, errors)
    first = af.run(dag, 0, errors=errors)
    assert first.state == "success", errors
    assert slot_row(standin)["yb_lsn_type"] == "SEQUENCE"
    for round_no in (1, 2):
        made = workload.mutate(standin, round_no)
        run = af.run(dag, round_no, errors=errors)
        assert run.state == "success", errors
        window = run.xcom["window"]
        assert {op: sum(c.get(op, 0) for c in window["events"].values()) for op in "cud"} == made
        assert window["transactions"] == workload.TRANSACTIONS_PER_ROUND
        assert_reproduces_source(standin, tmp_path)
    # Acknowledged up to the last window: its end is the fence's commit position.
    from airflow_provider_cdc.cdc.sources.yugabyte.lsn import YbLsn

    assert YbLsn(slot_row(standin)["confirmed_flush_lsn"]) == YbLsn(window["to_lsn"]) - 1


def test_default_and_full_replica_identities_and_the_read_time_procedure(yugabyte_conn, tmp_path):
    """DEFAULT updates carry the full row and no before image, FULL ones both images; the snapshot
    reads through the SECURITY DEFINER procedure route (read_time_procedure)."""
    standin, conn_id = yugabyte_conn
    with standin.connect() as conn:
        conn.execute("CREATE TABLE public.d (id int PRIMARY KEY, a text, b int)")
        conn.execute("CREATE TABLE public.f (id int PRIMARY KEY, a text, b int)")
        conn.execute("ALTER TABLE public.d REPLICA IDENTITY DEFAULT")
        conn.execute("ALTER TABLE public.f REPLICA IDENTITY FULL")
        conn.execute("INSERT INTO public.d VALUES (1, 'x', 1), (2, 'y', 2)")
        conn.execute("INSERT INTO public.f VALUES (1, 'x', 1), (2, 'y', 2)")
        # The procedure exactly as docs/yugabytedb.md gives it (granted to the role the test runs
        # as). The stand-in's proxy turns the capture's CALL into its snapshot, so the body itself
        # runs in tests/integration/yugabyte/test_read_time_procedure.py, on plain PostgreSQL.
        conn.execute(with_role(documented(), standin.cluster.superuser))
    errors: dict = {}
    capture = make_capture(
        conn_id, tmp_path, standin.database, tables=["public.d", "public.f"], read_time_procedure="cdc.set_yb_read_time"
    )
    dag = capture_dag(f"yb_{standin.database}", capture, errors)
    first = af.run(dag, 0, errors=errors)
    assert first.state == "success", errors
    assert first.xcom["snapshot"]["events"] == {"shop.public.d": {"r": 2}, "shop.public.f": {"r": 2}}
    with standin.connect() as conn:
        for table in ("d", "f"):
            conn.execute(f"UPDATE public.{table} SET b = 10 WHERE id = 1")
            conn.execute(f"DELETE FROM public.{table} WHERE id = 2")
    second = af.run(dag, 1, errors=errors)
    assert second.state == "success", errors
    for table, before in (("d", None), ("f", {"id": 1, "a": "x", "b": 1})):
        events = [e for e in events_of(tmp_path, "shop", f"public.{table}") if e["op"] != "r"]
        update = next(e for e in events if e["op"] == "u")
        assert update["before"] == before
        assert update["after"] == {"id": 1, "a": "x", "b": 10}
        assert not update["unchanged_toast_columns"]
        delete = next(e for e in events if e["op"] == "d")
        expected = {"id": 2, "a": None, "b": None} if table == "d" else {"id": 2, "a": "y", "b": 2}
        assert delete["before"] == expected
