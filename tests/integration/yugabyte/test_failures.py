"""YugabyteDB's failure modes on the stand-in: retransmission after a lost acknowledgement, expiry,
the row-lock fallback of the capture lock, and bad input (each a clear error, nothing written)."""

from __future__ import annotations

import pytest

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError, ConcurrentCaptureError
from airflow_provider_cdc.cdc.sinks.commit_log import CommitLog
from airflow_provider_cdc.cdc.sinks.storage import storage_for
from tests.integration.yugabyte.test_capture import (
    assert_reproduces_source,
    capture_dag,
    make_capture,
    slot_row,
)
from tests.support import airflow as af
from tests.support import yb_workload as workload
from tests.support.oracle import events_of

pytestmark = [pytest.mark.airflow, pytest.mark.spark]


def committed_windows(sink) -> list:
    return CommitLog(storage_for(str(sink)), "shop").committed()


def test_a_lost_acknowledgement_retransmits_and_nothing_is_doubled(yugabyte_conn, tmp_path, monkeypatch):
    from airflow_provider_cdc.captures import yugabyte as captures

    standin, conn_id = yugabyte_conn
    workload.create(standin)
    errors: dict = {}
    dag = capture_dag(f"yb_{standin.database}", make_capture(conn_id, tmp_path, standin.database), errors)
    assert af.run(dag, 0, errors=errors).state == "success", errors
    confirmed = slot_row(standin)["confirmed_flush_lsn"]

    # The acknowledgement is lost (the worker died after the offset save): the slot stays behind.
    with monkeypatch.context() as patched:
        patched.setattr(captures.YugabyteRun, "acknowledge", lambda self, position, saved=None: None)
        made = workload.mutate(standin, 1)
        second = af.run(dag, 1, errors=errors)
        assert second.state == "success", errors
        assert slot_row(standin)["confirmed_flush_lsn"] == confirmed

    # The next window starts at its own start (YugabyteDB filters what commits before it); its
    # acknowledgement streams the unacknowledged transactions again and confirms past them.
    later = workload.mutate(standin, 2)
    third = af.run(dag, 2, errors=errors)
    assert third.state == "success", errors
    assert {op: sum(c.get(op, 0) for c in third.xcom["window"]["events"].values()) for op in "cud"} == later
    assert slot_row(standin)["confirmed_flush_lsn"] != confirmed
    assert_reproduces_source(standin, tmp_path)
    ops = [e["op"] for e in events_of(tmp_path, "shop", "public.customers") if e["op"] != "r"]
    assert ops.count("u") == made["u"] - 4 + later["u"] - 4  # four of each round's updates are orders'


def test_an_expired_slot_fails_or_resnapshots(yugabyte_conn, tmp_path):
    standin, conn_id = yugabyte_conn
    workload.create(standin)
    errors: dict = {}
    capture = make_capture(conn_id, tmp_path, standin.database, intent_retention_ms=7_200_000)
    dag = capture_dag(f"yb_{standin.database}", capture, errors)
    assert af.run(dag, 0, errors=errors).state == "success", errors

    # Nobody read the slot for longer than the retention: YugabyteDB expired it.
    standin.set_retention_ms(7_200_000)
    standin.age_slot("cdc_shop", 3 * 3_600_000)
    _age_last_read(capture, 3 * 3_600_000)
    workload.mutate(standin, 1)
    failed = af.run(dag, 1, errors=errors)
    assert failed.state == "failed"
    assert "expired" in str(errors.get("window")), errors
    before = len(committed_windows(tmp_path))

    # when_needed: a new snapshot (a new slot) with the gap recorded.
    errors.clear()
    recovering = capture_dag(
        f"yb2_{standin.database}",
        make_capture(conn_id, tmp_path, standin.database, intent_retention_ms=7_200_000, snapshot_mode="when_needed"),
        errors,
    )
    again = af.run(recovering, 2, errors=errors)
    assert again.state == "success", errors
    assert again.xcom["snapshot"]["gap"]["reason"] == "slot_expired"
    assert len(committed_windows(tmp_path)) == before + 2  # the snapshot and the window after it
    assert_reproduces_source(standin, tmp_path)


def _age_last_read(capture, ms: int) -> None:
    from dataclasses import replace

    from airflow.models import Variable  # outside a task: the metadata database's Variable

    key = capture.store().key(capture.topic_prefix)
    offset = capture.OFFSET_TYPE.from_json(Variable.get(key))
    state = dict(offset.extra["source_state"])
    state["last_read_ms"] -= ms
    Variable.set(key, replace(offset, extra={**offset.extra, "source_state": state}).to_json())


def test_the_capture_lock_falls_back_to_a_row_lock_without_advisory_locks(request, pg15, airflow_db, tmp_path):
    import logging

    from airflow.sdk import Connection

    from tests.support.yugabyte.fixtures import standin_for

    generator = standin_for(request, pg15, advisory_locks=False)
    standin = next(generator)
    try:
        workload.create(standin, customers=1, orders_per_customer=0)
        capture = make_capture("unused", tmp_path, standin.database)
        hook = capture.hook()
        # The stand-in, not a stored connection: the hook's connection (no extra) and what it resolves to.
        hook._connection = Connection(conn_id="unused", conn_type="yugabytedb_cdc")
        hook.__dict__["_configured_info"] = standin.connection_info()
        capture.hook = lambda: hook  # type: ignore[method-assign]
        with capture.open_run(logging.getLogger("test")):
            with pytest.raises(ConcurrentCaptureError, match="already running"):
                with capture.open_run(logging.getLogger("test")):
                    pass
        with capture.open_run(logging.getLogger("test")):  # released with the first run
            pass
        rows = standin.admin_query("SELECT capture FROM public.airflow_cdc_locks")
        assert rows == [("shop",)]
    finally:
        next(generator, None)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"lsn_type": "sequence"}, "lsn_type 'sequence' is not one of HYBRID_TIME, SEQUENCE"),
        ({"message_prefix_include_list": ["app"]}, "never streams logical messages"),
        ({"intent_retention_ms": 10}, "intent_retention_ms"),
        ({"read_time_procedure": "x; DROP TABLE t"}, "read_time_procedure"),
        ({"heartbeat_table": "a.b.c"}, "heartbeat_table"),
    ],
)
def test_bad_settings_fail_at_dag_parse(overrides, message, tmp_path):
    with pytest.raises(CdcConfigurationError, match=message):
        make_capture("yb", tmp_path, "db", **overrides)


def test_setup_refuses_tables_without_a_primary_key_and_a_slot_of_another_plugin(yugabyte_conn, tmp_path):
    standin, conn_id = yugabyte_conn
    with standin.connect() as conn:
        conn.execute("CREATE TABLE public.keyless (a int, b text)")
    from airflow_provider_cdc.cdc.sources.postgres.replication import ReplicationConnection

    with ReplicationConnection(standin.connection_info()) as replication:
        replication.create_slot("cdc_shop", plugin="pgoutput", options=("HYBRID_TIME",))
    capture = make_capture(conn_id, tmp_path / "lake", standin.database, tables=["public.keyless"])
    with pytest.raises(CdcConfigurationError) as raised:
        capture.setup(__import__("logging").getLogger("test"))
    text = str(raised.value)
    assert '"public"."keyless" has no primary key' in text
    assert "uses plugin 'pgoutput'" in text
    assert not (tmp_path / "lake").exists() or not any((tmp_path / "lake").iterdir())
    assert standin.admin_query("SELECT to_regclass('public.airflow_cdc_heartbeat')") == [(None,)]


def test_the_sensor_and_its_trigger_wait_for_the_server_clock_and_fail_on_a_missing_slot(yugabyte_conn, tmp_path):
    import asyncio
    import json
    import time
    from datetime import datetime, timedelta, timezone

    from airflow.sdk import DAG

    from airflow_provider_cdc.sensors.cdc import CdcChangesSensor
    from airflow_provider_cdc.triggers.yugabyte_cdc import YugabyteCdcChangesTrigger

    standin, conn_id = yugabyte_conn
    workload.create(standin, customers=1, orders_per_customer=0)
    errors: dict = {}
    capture = make_capture(conn_id, tmp_path, standin.database)
    assert af.run(capture_dag(f"yb_{standin.database}", capture, errors), 0, errors=errors).state == "success"
    soon = datetime.now(timezone.utc) + timedelta(seconds=1.5)
    with DAG(f"sensor_{standin.database}", schedule=None, start_date=af.START) as dag:
        sensor = CdcChangesSensor(
            task_id="wait", capture=capture, wait_until=soon.isoformat(), mode="reschedule", poke_interval=1, timeout=5
        )
    af.register(dag)
    assert not sensor.poke({}).is_done
    time.sleep(1.6)
    done = sensor.poke({})
    assert done.is_done and done.xcom_value["yb_lsn_type"] == "HYBRID_TIME"

    async def first_event(trigger):
        async for event in trigger.run():
            return event.payload

    later = (datetime.now(timezone.utc) + timedelta(seconds=1)).isoformat()
    path, kwargs = YugabyteCdcChangesTrigger(conn_id, "cdc_shop", later, poll_interval=0.3).serialize()
    assert path == "airflow_provider_cdc.triggers.yugabyte_cdc.YugabyteCdcChangesTrigger"
    assert standin.cluster.password not in json.dumps(kwargs)
    event = asyncio.run(asyncio.wait_for(first_event(YugabyteCdcChangesTrigger(**kwargs)), 30))
    assert event["status"] == "success", event
    missing = YugabyteCdcChangesTrigger(conn_id, "no_such_slot", None, poll_interval=0.3)
    event = asyncio.run(asyncio.wait_for(first_event(missing), 30))
    assert event["status"] == "error" and "does not exist" in event["message"]
    expired = YugabyteCdcChangesTrigger(conn_id, "cdc_shop", None, poll_interval=0.3, expires_ms=1)
    event = asyncio.run(asyncio.wait_for(first_event(expired), 30))
    assert event["status"] == "error" and "expired" in event["message"]


def test_errors_inside_the_stream_are_classified_for_the_fence_and_the_acknowledgement(yugabyte):
    """YugabyteDB sends CopyBothResponse before YBCInitVirtualWal (walsender.c @ d0352220,
    StartLogicalReplication), so a missing publication, pgoutput with REPLICA IDENTITY CHANGE and an
    expired slot arrive as an ErrorResponse inside the stream: each is the terminal error a refused
    START would be, not a lost connection retried forever (research §3 row 3)."""
    from airflow_provider_cdc.cdc.basics.errors import PublicationError, SlotConfigurationError, WalLostError
    from airflow_provider_cdc.cdc.sources.postgres.replication import ReplicationConnection
    from airflow_provider_cdc.cdc.sources.postgres.tables import TableRef
    from airflow_provider_cdc.cdc.sources.yugabyte import admin

    info = yugabyte.connection_info()
    with yugabyte.connect() as conn:
        conn.execute("CREATE TABLE t (k int PRIMARY KEY)")
        conn.execute("CREATE PUBLICATION p FOR TABLE t")
    with ReplicationConnection(info) as replication:
        replication.create_slot("s", plugin="yboutput", options=("HYBRID_TIME", "NOEXPORT_SNAPSHOT"))
        replication.create_slot("pg", plugin="pgoutput", options=("HYBRID_TIME", "NOEXPORT_SNAPSHOT"))
    with pytest.raises(PublicationError, match='publication "missing" does not exist'):
        admin.acknowledge(info, "s", "missing", 1, timeout=5)
    with pytest.raises(SlotConfigurationError, match="is not supported for output plugin pgoutput"):
        admin.find_fence(info, "pg", "p", 0, TableRef("public", "t"), "w", timeout=5)
    yugabyte.set_retention_ms(60_000)
    yugabyte.age_slot("s", 61_000)
    with pytest.raises(WalLostError, match="expired"):
        admin.find_fence(info, "s", "p", 0, TableRef("public", "t"), "w", timeout=5)


@pytest.fixture
def flag_off_conn(request, pg15, airflow_db, spark, monkeypatch):
    """A 2025.1 stand-in (export-snapshot flag off) whose slots' consistent time is not ahead of the
    clock: what the product did before slot creation in a transaction and the read-time wait."""
    from tests.support.yugabyte.fixtures import airflow_connection, standin_for

    for standin in standin_for(request, pg15, active_window_ms=1000, release="2025.1.0.0", clock_skew_ms=0):
        conn_id = f"yb_{standin.database}"
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", airflow_connection(standin))
        yield standin, conn_id


def test_an_expiry_the_capture_did_not_foresee_fails_the_window_as_lost(flag_off_conn, tmp_path):
    """The slot expired (YB's clock) while the capture's own record of its last read says it should
    not have: the window's stream gets the expiry inside COPY BOTH and fails terminally (WalLostError),
    not as a lost connection (research §3 row 3)."""
    from airflow_provider_cdc.cdc.basics.errors import WalLostError

    standin, conn_id = flag_off_conn
    workload.create(standin, customers=5, orders_per_customer=1)
    errors: dict = {}
    capture = make_capture(conn_id, tmp_path, standin.database, intent_retention_ms=7_200_000)
    dag = capture_dag(f"yb_{standin.database}", capture, errors)
    assert af.run(dag, 0, errors=errors).state == "success", errors
    standin.set_retention_ms(7_200_000)
    standin.age_slot("cdc_shop", 3 * 3_600_000)
    workload.mutate(standin, 1)
    assert af.run(dag, 1, errors=errors).state == "failed"
    # terminal: failed without retries (a transient error would be "lost the replication connection")
    assert str(errors.get("window")).startswith(f"{WalLostError.__name__}: replication slot 'cdc_shop' expired"), errors


def test_a_consistent_point_of_0_0_starts_a_sequence_stream_at_the_slots_confirmed_position(request, pg15):
    """Early PG11-line walsenders answer ``consistent_point`` 0/0 ("Send "0/0" as the consistent wal
    location instead of a NULL value", walsender.c @ 04140979 / 7e22b285, research §3 row 1a): the
    SEQUENCE stream's start is then the new slot's ``confirmed_flush_lsn`` (0/2), not 0/0, or the
    first window would start before the slot's confirmed position (OffsetMismatchError)."""
    from airflow_provider_cdc.cdc.sources.yugabyte import admin
    from tests.support.yugabyte.fixtures import standin_for

    generator = standin_for(request, pg15, release="2024.1.0.0", clock_skew_ms=0)
    standin = next(generator)
    try:
        status, _ht, point = admin.create_slot(standin.connection_info(), "s", "SEQUENCE")
        assert point == int(status.confirmed_flush_lsn) == 2
    finally:
        next(generator, None)
