"""Conformance: publication refresh, tables not of interest and the restart time, as YugabyteDB's
sources describe them (docs/research/issue29/logical-replication.md §2, §3 rows 5/13/14, §4 cases
13 and 22). "S" cases drive the stand-in directly; "P" cases run the product's operators."""

from __future__ import annotations

import pytest

from tests.standin.test_yugabyte_publications import (
    HOUR_MS,
    create_slot,
    insert,
    make_tables,
    slot_stream_id,
    stream_error,
    streamed,
)
from tests.standin.test_yugabyte_standin import replication_command
from tests.support.yugabyte.fixtures import standin_for

VWAL_CLIENT = "src/postgres/src/backend/replication/logical/yb_virtual_wal_client.c"
VWAL = "src/yb/cdc/cdcsdk_virtual_wal.cc"


def publish(yb, statement: str) -> None:
    with yb.connect() as conn:
        conn.execute(statement)


# -- S: the stand-in against YugabyteDB's sources --------------------------------------------------


@pytest.mark.pg
def test_s_publication_change_applies_on_the_refresh_grid(yugabyte):
    """advanced-topic.md @ b11b78e3 §"Adding tables to publication" / "YugabyteDB semantics": "any
    changes made to the publication's tables list are not applied immediately … periodically
    refreshed … 900 seconds", on a grid ("A change made … at 8:01 am will be applied at 8:15 am");
    yb_virtual_wal_client.c (stored id 3494716845) ``InitVirtualWal`` reads the publication with
    ``yb_read_time`` = ``yb_last_pub_refresh_time``, ``YBCReadRecord`` re-reads it at
    ``publication_refresh_time``. Changes committed before the refresh: not streamed (§2.1, guess)."""
    make_tables(yugabyte, "t1", "t2")
    publish(yugabyte, "CREATE PUBLICATION p FOR TABLE t1")
    create_slot(yugabyte)
    publish(yugabyte, "ALTER PUBLICATION p ADD TABLE t2")
    insert(yugabyte, "t1", 1)
    insert(yugabyte, "t2", 1)
    assert streamed(yugabyte) == [("t1", 1)]
    yugabyte.pass_time(880_000)
    insert(yugabyte, "t2", 2)
    assert streamed(yugabyte) == [("t1", 1)]
    yugabyte.pass_time(20_000)
    insert(yugabyte, "t2", 3)
    assert streamed(yugabyte) == [("t1", 1), ("t2", 3)]


@pytest.mark.pg
def test_s_a_table_dropped_from_the_publication_streams_until_the_refresh(yugabyte):
    """Same sources: the slot's list is the publication as of the last refresh, both ways
    (``UpdatePublicationTableListInternal`` in cdcsdk_virtual_wal.cc, stored id 153333221, removes
    tables only at a refresh)."""
    make_tables(yugabyte, "t1", "t2")
    publish(yugabyte, "CREATE PUBLICATION p FOR TABLE t1, t2")
    yugabyte.set_flags(cdcsdk_publication_list_refresh_interval_secs=60)
    create_slot(yugabyte)
    publish(yugabyte, "ALTER PUBLICATION p DROP TABLE t2")
    insert(yugabyte, "t2", 1)
    assert streamed(yugabyte) == [("t2", 1)]
    yugabyte.pass_time(60_000)
    insert(yugabyte, "t2", 2)
    assert streamed(yugabyte) == [("t2", 1)]


@pytest.mark.pg
def test_s_from_2026_1_publication_changes_apply_at_commit(request, pg15):
    """Slot behavior by version (docs, EARLY ACCESS), row "Publication changes while streaming":
    "v2026.1 and later: applied at commit time with implicit publication";
    yb_virtual_wal_client.c ``InitVirtualWal`` (``ysql_yb_enable_implicit_dynamic_tables_logical_replication``)."""
    for yb in standin_for(request, pg15, release="2026.1.0.0", active_window_ms=1000):
        make_tables(yb, "t1", "t2")
        publish(yb, "CREATE PUBLICATION p FOR TABLE t1")
        create_slot(yb)
        publish(yb, "ALTER PUBLICATION p ADD TABLE t2")
        insert(yb, "t2", 1)
        assert streamed(yb) == [("t2", 1)]


@pytest.mark.pg
def test_s_case_22_unpolled_table_is_released_after_the_timeout(yugabyte):
    """§4 case 22: ``CDCSDKConsistentSnapshotTest.TestReleaseResourcesOnUnpolledTablets``
    (src/yb/integration-tests/cdcsdk_consistent_snapshot-test.cc, stored id 13066982): with
    ``cdcsdk_tablet_not_of_interest_timeout_secs`` passed, the polled tablet keeps its retention and
    ``UpdateCheckpoint`` on the unpolled one fails (``ASSERT_NOK``). Slot behavior table row "Tables not
    of interest": "even if it is added to the publication later". The error text is a guess."""
    make_tables(yugabyte, "t1", "t2")
    publish(yugabyte, "CREATE PUBLICATION p FOR TABLE t1")
    create_slot(yugabyte)
    assert streamed(yugabyte, 0.3) == []  # t1 polled
    yugabyte.pass_time(4 * HOUR_MS + 1000)
    insert(yugabyte, "t1", 1)
    assert streamed(yugabyte) == [("t1", 1)]  # the polled table keeps its changes
    publish(yugabyte, "ALTER PUBLICATION p ADD TABLE t2")
    yugabyte.pass_time(900_000)
    sqlstate, text = stream_error(yugabyte)
    assert sqlstate == "XX000" and f"is not of interest for stream ID {slot_stream_id(yugabyte)}" in text


@pytest.mark.pg
def test_s_skip_unqualified_tables_for_polling(request, pg15):
    """Slot behavior table row "Tables not of interest": ``cdc_skip_unqualified_tables_for_polling``
    "lets the slot skip such tables instead of failing", from v2025.2.7.0 / v2026.1.2.0."""
    for yb in standin_for(request, pg15, release="2025.2.7.0", active_window_ms=1000):
        make_tables(yb, "t1", "t2")
        publish(yb, "CREATE PUBLICATION p FOR TABLE t1")
        create_slot(yb)
        assert streamed(yb, 0.3) == []
        yb.set_flags(cdc_skip_unqualified_tables_for_polling=True)
        yb.pass_time(4 * HOUR_MS + 1000)
        publish(yb, "ALTER PUBLICATION p ADD TABLE t2")
        yb.pass_time(900_000)
        insert(yb, "t1", 1)
        insert(yb, "t2", 1)
        assert streamed(yb) == [("t1", 1)]


@pytest.mark.pg
def test_s_restart_time_moves_without_an_ack_only_when_nothing_is_unacknowledged(yugabyte):
    """§2.2 row "When the restart time advances" / §3 row 5: cdcsdk_virtual_wal.cc (stored id
    3553181996) ``cdcsdk_update_restart_time_when_nothing_to_stream`` (default true): "the restart time
    would be moved forward to the commit time of the most recently popped COMMIT / SAFEPOINT record …
    iff restart lsn is equal to the last shipped lsn", every ``cdcsdk_update_restart_time_interval_secs``."""
    make_tables(yugabyte, "t1", "other")
    publish(yugabyte, "CREATE PUBLICATION p FOR TABLE t1")
    create_slot(yugabyte)
    yugabyte.set_flags(cdcsdk_update_restart_time_interval_secs=0.2)

    def restart_ht() -> int:
        return yugabyte.admin_query("SELECT yb_restart_commit_ht FROM yb_standin.pg_replication_slots")[0][0]

    created = restart_ht()
    insert(yugabyte, "other", 1)
    assert streamed(yugabyte) == []
    advanced = restart_ht()
    assert advanced > created
    insert(yugabyte, "t1", 1)
    insert(yugabyte, "other", 2)
    assert streamed(yugabyte) == [("t1", 1)]  # shipped, never acknowledged
    assert restart_ht() == advanced


@pytest.mark.pg
def test_s_case_13_a_transaction_of_unpublished_tables_only_is_not_sent(yugabyte):
    """§4 case 13: TestPgReplicationSlot.java @ ee3043e0 ``consumptionOnSubsetOfColocatedTables``
    (``@Ignore``, PG11 era): colocated tables send an empty BEGIN/COMMIT for a transaction on an
    unpublished table; "for non-colocated tables the VWAL polls only published tables' tablets". The
    stand-in models non-colocated tables on the PG15 line: nothing is sent and no LSN is used."""
    yb = yugabyte
    make_tables(yb, "t1", "t3")
    publish(yb, "CREATE PUBLICATION p FOR TABLE t1")
    status, row = replication_command(yb, "CREATE_REPLICATION_SLOT s LOGICAL yboutput SEQUENCE NOEXPORT_SNAPSHOT")
    assert status == "ok", row
    snapshot_ht = yb.admin_query("SELECT snapshot_ht FROM yb_standin.slots")[0][0]
    while yb.current_ht() <= snapshot_ht:
        pass
    insert(yb, "t3", 1)
    insert(yb, "t1", 1)
    assert streamed(yb) == [("t1", 1)]
    # the only transaction sent got the first LSNs: B = 2, I = 3, C = 4 (t3's used none)
    assert yb.admin_query("SELECT begin_lsn, commit_lsn FROM yb_standin.slot_txn") == [(2, 4)]


# -- P: the product on the stand-in -------------------------------------------------------------------


def _dags(conn_id, sink, database, errors, tag: str, **overrides):
    from airflow.sdk import DAG

    from airflow_provider_cdc.operators.setup import CdcSetupOperator
    from airflow_provider_cdc.operators.snapshot import CdcSnapshotOperator
    from airflow_provider_cdc.operators.window import CdcWindowOperator
    from tests.integration.yugabyte.test_capture import make_capture
    from tests.support import airflow as af

    capture = make_capture(conn_id, sink, database, **overrides)
    args = {"on_failure_callback": af.failure_recorder(errors)}
    with DAG(
        f"yb_{database}_s{tag}", schedule="@hourly", start_date=af.START, catchup=False, default_args=args
    ) as first:
        CdcSetupOperator(task_id="setup", capture=capture) >> CdcSnapshotOperator(task_id="snapshot", capture=capture)
    with DAG(
        f"yb_{database}_w{tag}", schedule="@hourly", start_date=af.START, catchup=False, default_args=args
    ) as then:
        CdcWindowOperator(task_id="window", capture=capture)
    af.register(first)
    af.register(then)
    return first, then


@pytest.mark.airflow
@pytest.mark.spark
def test_p_a_first_window_later_than_4_hours_after_the_slot_is_refused(yugabyte_conn, tmp_path, monkeypatch):
    """§2.3 (the 4-hour clock runs from the slot's creation until its first poll): the product does
    not read a new slot before its snapshot is read (a slot's first poll may move its restart time and
    history retention past the snapshot's read time: ``cdcsdk_virtual_wal.cc``
    ``UpdateRestartTimeIfRequired``, whose ``last_restart_lsn_read_time_`` starts unset), so a first
    window later than ``cdcsdk_tablet_not_of_interest_timeout_secs`` after the slot's creation is
    refused as lost changes, before the stand-in's server fails it inside the stream (flag text,
    yb-tserver reference: "it should be polled at least once within this interval of stream / slot
    creation")."""
    import airflow_provider_cdc.captures.yugabyte as yb_capture
    import airflow_provider_cdc.operators.window as operators
    from tests.support import airflow as af
    from tests.support import yb_workload as workload

    standin, conn_id = yugabyte_conn
    workload.create(standin, customers=4)
    errors: dict = {}
    snapshot, window = _dags(conn_id, tmp_path, standin.database, errors, "")
    assert af.run(snapshot, 0, errors=errors).state == "success", errors
    standin.pass_time(5 * HOUR_MS)  # five hours pass for the server ...
    real_now = yb_capture.now_ms
    for module in (yb_capture, operators):  # ... and for the capture
        monkeypatch.setattr(module, "now_ms", lambda: real_now() + 5 * HOUR_MS)
    workload.mutate(standin, 1)
    assert af.run(window, 1, errors=errors).state == "failed"
    message = str(errors["window"])
    assert "cdcsdk_tablet_not_of_interest_timeout_secs" in message and "lost changes" in message, message


def test_a_snapshot_longer_than_the_not_of_interest_timeout_is_not_landed():
    """The same rule inside the snapshot job: a snapshot that ends after the timeout is refused before
    its commit (a re-run would only lose the tables again), naming the flag to raise."""
    from airflow_provider_cdc.cdc.basics.errors import SnapshotRequiredError
    from airflow_provider_cdc.cdc.sources.yugabyte.jobs import check_snapshot_duration

    check_snapshot_duration(0, 4 * HOUR_MS, 4 * HOUR_MS)
    with pytest.raises(SnapshotRequiredError, match="cdcsdk_tablet_not_of_interest_timeout_secs"):
        check_snapshot_duration(0, 4 * HOUR_MS + 1, 4 * HOUR_MS)


@pytest.mark.airflow
@pytest.mark.spark
def test_p_a_table_published_after_the_slot_is_refused_until_a_new_slot(yugabyte_conn, tmp_path):
    """§3 rows 13 and 14 (the heartbeat/fence table or a captured table added to the publication of an
    existing slot is invisible until the refresh, or for good once unqualified): setup names the cause
    and the fix instead of letting windows wait or miss rows; a window on that slot refuses too, and
    ``snapshot_mode='always'`` (a new slot after the publication) resolves it."""
    from tests.support import airflow as af
    from tests.support import yb_workload as workload

    standin, conn_id = yugabyte_conn
    workload.create(standin, customers=3, orders_per_customer=1)
    errors: dict = {}
    one = {"tables": ["public.customers"]}
    snapshot, window = _dags(conn_id, tmp_path, standin.database, errors, "1", **one)
    assert af.run(snapshot, 0, errors=errors).state == "success", errors
    assert af.run(window, 0, errors=errors).state == "success", errors

    both, window = _dags(conn_id, tmp_path, standin.database, errors, "2")  # orders joins the capture
    failed = af.run(both, 1, errors=errors)
    assert failed.state == "failed"
    message = str(errors["setup"])
    assert '"public"."orders"' in message and "after replication slot 'cdc_shop' was created" in message
    assert "cdcsdk_publication_list_refresh_interval_secs" in message and "snapshot_mode='always'" in message
    errors.clear()
    assert af.run(window, 1, errors=errors).state == "failed"
    assert "after replication slot 'cdc_shop' was created" in str(errors["window"])

    errors.clear()
    again, _ = _dags(conn_id, tmp_path, standin.database, errors, "3", snapshot_mode="always")
    result = af.run(again, 2, errors=errors)
    assert result.state == "success", errors
    assert result.xcom["snapshot"]["events"]["shop.public.orders"] == {"r": 3}
