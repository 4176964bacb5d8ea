"""Conformance: slot creation, snapshots, replica identities and streaming as YugabyteDB's own tests
and docs describe them (docs/research/issue29/logical-replication.md §4, cases 1-12 and 14-21; 13
and 22 are covered elsewhere). Each case names its origin. "S" cases drive the stand-in with libpq
as YugabyteDB's tests drive a server; "P" cases run the product's public API (the capture's
operators under ``dag.test()``), as the other integration tests do.

Sources (commits as the research cites them):

- ``TestPgReplicationSlotSnapshotAction.java`` = ``java/yb-pgsql/src/test/java/org/yb/pgsql/
  TestPgReplicationSlotSnapshotAction.java`` @ 6100a30b7a832ddfaa8f84429f75177b4944be21
- ``TestPgReplicationSlot.java`` = ``java/yb-pgsql/src/test/java/org/yb/pgsql/TestPgReplicationSlot.java``
  @ ee3043e0
- ``ysql_cdc_upgrade-test.cc`` = ``src/yb/integration-tests/upgrade-tests/ysql_cdc_upgrade-test.cc``
  (stored id 3654164927)
- Debezium-YB = ``debezium-connector-postgres/src/test/java/io/debezium/connector/postgresql/`` in
  yugabyte/debezium @ 52515b4ac
"""

from __future__ import annotations

import select
import time

import psycopg
import pytest
from psycopg import pq

from tests.integration.yugabyte.test_capture import assert_reproduces_source, capture_dag, make_capture
from tests.standin.test_yugabyte_standin import EMPLOYEE, Stream, changes
from tests.support import airflow as af
from tests.support import yb_workload as workload
from tests.support.oracle import events_of, ordered
from tests.support.yugabyte.fixtures import airflow_connection, standin_for

pytestmark = pytest.mark.pg

USE_IN_TXN = "CREATE_REPLICATION_SLOT ... (SNAPSHOT 'use') must be called inside a transaction"
RR = "BEGIN TRANSACTION ISOLATION LEVEL REPEATABLE READ"


class Session:
    """One replication connection (``replication=database``) running commands in turn."""

    def __init__(self, yb):
        self.conn = pq.PGconn.connect(yb.conninfo(replication=True).encode())
        assert self.conn.status == pq.ConnStatus.OK, self.conn.error_message

    def run(self, command: str):
        """("ok", first row), ("done", None) or ("error", (sqlstate, primary message))."""
        result = self.conn.exec_(command.encode())
        if result.status == pq.ExecStatus.TUPLES_OK:
            row = [result.get_value(0, i) for i in range(result.nfields)] if result.ntuples else []
            return "ok", [None if v is None else v.decode() for v in row]
        if result.status == pq.ExecStatus.COMMAND_OK:
            return "done", None
        return "error", (
            result.error_field(pq.DiagnosticField.SQLSTATE).decode(),
            result.error_field(pq.DiagnosticField.MESSAGE_PRIMARY).decode(),
        )

    @property
    def in_transaction(self) -> bool:
        return self.conn.transaction_status == pq.TransactionStatus.INTRANS

    def close(self) -> None:
        self.conn.finish()


@pytest.fixture
def session(yugabyte):
    opened = Session(yugabyte)
    yield opened
    opened.close()


def insert_employee(yb, key: int) -> None:
    with yb.connect() as conn:
        conn.execute("INSERT INTO employee VALUES (%s, 'e', 'd')", (key,))


def snapshot_taken(yb, slot: str) -> None:
    """Wait until the stand-in has taken the snapshot of ``slot``'s consistent time: it holds every
    commit up to that time, which may be up to the clock skew after the slot was created."""
    deadline = time.monotonic() + 5
    while not yb.admin_query("SELECT boundary_lsn IS NOT NULL FROM yb_standin.slots WHERE slot_name = %s", (slot,))[0][
        0
    ]:
        assert time.monotonic() < deadline
        time.sleep(0.02)


def make_employee(yb) -> None:
    with yb.connect() as conn:
        conn.execute(EMPLOYEE)
        conn.execute("CREATE PUBLICATION p FOR TABLE employee")


# -- creating a slot: the export-snapshot flag (the stand-in's default release, 2025.2.2.0, has it on)


def test_case_01_use_snapshot_outside_a_transaction_is_refused_with_the_flag_on(session):
    """S. TestPgReplicationSlotSnapshotAction.java:180-189 (testReplicationSlotUseSnapshotOutsideTxnBlock):
    with ysql_enable_pg_export_snapshot at its default (on), USE_SNAPSHOT outside a transaction
    fails; walsender.c @ d0352220 CreateReplicationSlot: ereport(ERROR) without errcode, XX000."""
    assert session.run("CREATE_REPLICATION_SLOT s LOGICAL yboutput USE_SNAPSHOT") == ("error", ("XX000", USE_IN_TXN))


@pytest.mark.parametrize(
    "begin, before, message",
    [
        (f"{RR} DEFERRABLE", None, "must not be called in a DEFERRABLE transaction"),
        ("BEGIN", None, "must be called in REPEATABLE READ isolation mode transaction"),
        (RR, "SELECT 1", "must be called before any query"),
        (RR, "SAVEPOINT a", "must not be called in a subtransaction"),
    ],
)
def test_case_01_use_snapshot_checks_in_the_walsenders_order(session, begin, before, message):
    """S. walsender.c @ d0352220 (stored id 53895850792) CreateReplicationSlot, the
    ``snapshot_action == CRS_USE_SNAPSHOT && (!IsYugaByteEnabled() || yb_enable_pg_export_snapshot)``
    block: DEFERRABLE, inside a transaction, REPEATABLE READ, before any query, not in a
    subtransaction. The failed command aborts the transaction."""
    assert session.run(begin)[0] == "done"
    if before:
        assert session.run(before)[0] in ("ok", "done")
    status, (sqlstate, text) = session.run("CREATE_REPLICATION_SLOT s LOGICAL yboutput HYBRID_TIME USE_SNAPSHOT")
    assert (status, sqlstate, text) == ("error", "XX000", f"CREATE_REPLICATION_SLOT ... (SNAPSHOT 'use') {message}")
    assert session.conn.transaction_status == pq.TransactionStatus.INERROR
    assert session.run("ROLLBACK")[0] == "done"


def test_case_02_use_snapshot_in_a_repeatable_read_transaction_reads_at_the_slot(yugabyte, session):
    """S. TestPgReplicationSlotSnapshotAction.java:104-121 (createReplicationSlotUseSnapshot): BEGIN
    REPEATABLE READ on the replication connection, then USE_SNAPSHOT; a row inserted later by
    another session is not visible in that transaction (YbUseSnapshotReadTime, walsender.c @ d0352220)."""
    make_employee(yugabyte)
    insert_employee(yugabyte, 1)
    assert session.run(RR) == ("done", None)
    status, row = session.run("CREATE_REPLICATION_SLOT s LOGICAL yboutput HYBRID_TIME USE_SNAPSHOT")
    assert status == "ok" and row[2].isdigit() and row[1] == "0/2"
    assert session.in_transaction  # ReadyForQuery 'T'
    snapshot_taken(yugabyte, "s")  # "later": after the consistent time (up to the clock skew ahead)
    insert_employee(yugabyte, 2)
    assert session.run("SELECT count(*) FROM employee") == ("ok", ["1"])
    assert session.run("COMMIT") == ("done", None)


def test_case_03_noexport_in_a_transaction_imposes_no_snapshot(yugabyte, session):
    """S. TestPgReplicationSlotSnapshotAction.java:82-102: NOEXPORT_SNAPSHOT inside a REPEATABLE READ
    transaction sets no read time, so another session's later insert is visible."""
    make_employee(yugabyte)
    insert_employee(yugabyte, 1)
    assert session.run(RR) == ("done", None)
    status, row = session.run("CREATE_REPLICATION_SLOT s LOGICAL yboutput NOEXPORT_SNAPSHOT")
    assert status == "ok" and row[2] is None
    insert_employee(yugabyte, 2)
    assert session.run("SELECT count(*) FROM employee") == ("ok", ["2"])
    session.run("COMMIT")


def test_case_04_an_exported_snapshot_hides_later_inserts(yugabyte, session):
    """S. TestPgReplicationSlotSnapshotAction.java:123-145: EXPORT_SNAPSHOT outside a transaction
    returns an id; ``SET TRANSACTION SNAPSHOT '<id>'`` in a REPEATABLE READ transaction of another
    session hides a later insert. (YB's id is ``<32hex>-<32hex>``; the stand-in's is PostgreSQL's.)"""
    make_employee(yugabyte)
    insert_employee(yugabyte, 1)
    status, row = session.run("CREATE_REPLICATION_SLOT s LOGICAL yboutput EXPORT_SNAPSHOT")
    assert status == "ok" and row[2] and not row[2].isdigit()
    insert_employee(yugabyte, 2)
    with yugabyte.connect() as conn:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        conn.execute(f"SET TRANSACTION SNAPSHOT '{row[2]}'")
        assert conn.execute("SELECT count(*) FROM employee").fetchone()[0] == 1
        conn.execute("COMMIT")


def test_case_06_export_snapshot_inside_a_transaction_is_refused(session):
    """S. TestPgReplicationSlotSnapshotAction.java:166-178; walsender.c @ d0352220: "%s must not be
    called inside a transaction", ``CREATE_REPLICATION_SLOT ... (SNAPSHOT 'export')``."""
    session.run(RR)
    assert session.run("CREATE_REPLICATION_SLOT s LOGICAL yboutput EXPORT_SNAPSHOT") == (
        "error",
        ("XX000", "CREATE_REPLICATION_SLOT ... (SNAPSHOT 'export') must not be called inside a transaction"),
    )


@pytest.mark.parametrize(
    "release, bare, use_outside",
    [
        # ysql_cdc_upgrade-test.cc DefaultBehaviorAfterUpgrade / RollbackBeforeFinalize: 2024.2.4.0
        ("2024.2.4.0", "ht", "ht"),
        ("2025.1.0.0", "ht", "ht"),  # the flag is a preview flag, off (snapshot-synchronization.md @ 169ad30f)
        # the current version: a bare command exports (walsender.c @ d0352220 has no YB override)
        ("2026.1.0.0", "id", USE_IN_TXN),
    ],
)
def test_cases_07_08_defaults_by_release(request, pg15, release, bare, use_outside):
    """S. ysql_cdc_upgrade-test.cc ``DefaultBehaviorAfterUpgrade``, ``RollbackBeforeFinalize``: before
    the flag's default changed, USE_SNAPSHOT outside a transaction returns a hybrid time (all
    digits); on the current version a bare ``CREATE_REPLICATION_SLOT ... LOGICAL pgoutput`` returns an
    exported id. With the flag off, EXPORT fails (issue yugabyte-db#30211)."""
    generator = standin_for(request, pg15, release=release, clock_skew_ms=0)
    yb = next(generator)
    session = Session(yb)
    try:
        status, row = session.run("CREATE_REPLICATION_SLOT a LOGICAL pgoutput")
        assert status == "ok" and row[2].isdigit() == (bare == "ht")
        status, answer = session.run("CREATE_REPLICATION_SLOT b LOGICAL pgoutput USE_SNAPSHOT")
        if use_outside == "ht":
            assert status == "ok" and answer[2].isdigit()
            assert session.run("CREATE_REPLICATION_SLOT c LOGICAL pgoutput EXPORT_SNAPSHOT") == (
                "error",
                ("XX000", "cannot export or import snapshot when ysql_enable_pg_export_snapshot is disabled."),
            )
        else:
            assert answer == ("XX000", use_outside)
    finally:
        session.close()
        next(generator, None)


def test_the_flag_overrides_the_release_default(yugabyte, session):
    """S. The gflag ``ysql_enable_pg_export_snapshot`` (a tserver flag; GUC ``yb_enable_pg_export_snapshot``,
    context sighup, in 2026.1): off, USE_SNAPSHOT needs no transaction (walsender.c @ d0352220)."""
    yugabyte.set_export_snapshot(False)
    status, row = session.run("CREATE_REPLICATION_SLOT s LOGICAL yboutput USE_SNAPSHOT")
    assert status == "ok" and row[2].isdigit()
    yugabyte.set_export_snapshot(True)
    assert session.run("CREATE_REPLICATION_SLOT t LOGICAL yboutput USE_SNAPSHOT")[1][1] == USE_IN_TXN


def test_case_09_10_temporary_and_physical_slots_are_refused(session):
    """S. TestPgReplicationSlot.java @ ee3043e0 ``replicationConnectionCreateTemporaryUnsupported``,
    ``replicationConnectionCreatePhysicalUnsupported``; walsender.c @ d0352220 (0A000)."""
    assert session.run("CREATE_REPLICATION_SLOT t TEMPORARY LOGICAL yboutput NOEXPORT_SNAPSHOT") == (
        "error",
        ("0A000", "temporary replication slot is not yet supported"),
    )
    assert session.run("CREATE_REPLICATION_SLOT t PHYSICAL") == (
        "error",
        ("0A000", "YSQL only supports logical replication slots"),
    )


def test_case_11_create_and_drop_from_different_sessions(yugabyte):
    """S. TestPgReplicationSlot.java @ ee3043e0 ``createAndDropFromDifferentTservers``: created with
    ``pg_create_logical_replication_slot``, dropped from another connection, created again."""
    with yugabyte.connect() as first, yugabyte.connect() as second:
        first.execute("SELECT * FROM pg_create_logical_replication_slot('test_slot', 'pgoutput')")
        second.execute("SELECT pg_drop_replication_slot('test_slot')")
        first.execute("SELECT * FROM pg_create_logical_replication_slot('test_slot', 'pgoutput')")
        assert first.execute("SELECT slot_name FROM pg_replication_slots").fetchall() == [("test_slot",)]


def test_case_12_sequence_lsns_and_the_delete_key(yugabyte, session):
    """S. TestPgReplicationSlot.java ``testReplicationConnectionConsumption`` (research id 3582508889):
    SEQUENCE slot, BEGIN final_lsn 0/4 xid 2, COMMIT 0/4 end 0/5; the next transaction B 0/7 xid 3;
    a DELETE's 'K' tuple carries the key, the other columns NULL."""
    make_employee(yugabyte)
    assert session.run(RR)[0] == "done"
    assert session.run("CREATE_REPLICATION_SLOT s LOGICAL yboutput SEQUENCE USE_SNAPSHOT")[0] == "ok"
    session.run("COMMIT")
    snapshot_taken(yugabyte, "s")  # the changes below come after the consistent time
    insert_employee(yugabyte, 1)
    with yugabyte.connect() as conn:
        conn.execute("DELETE FROM employee WHERE employee_id = 1")
    stream = Stream(yugabyte, "s")
    try:
        frames = stream.read(2)
    finally:
        stream.close()
    begins = [m for _, m in frames if type(m).__name__ == "Begin"]
    commits = [m for _, m in frames if type(m).__name__ == "Commit"]
    assert [(b.final_lsn, b.xid) for b in begins] == [(4, 2), (7, 3)]
    assert (commits[0].commit_lsn, commits[0].end_lsn) == (4, 5)
    delete = changes(frames)[-1]
    assert delete.old_kind == "K" and delete.old == (b"1", None, None)


def test_case_17_replica_identity_nothing_refuses_updates_and_deletes(yugabyte):
    """S. Debezium-YB ``YugabyteReplicaIdentityIT.java:238-281``: with REPLICA IDENTITY NOTHING on a
    published table, UPDATE and DELETE fail on the publisher."""
    with yugabyte.connect() as conn:
        conn.execute("CREATE TABLE a (k int PRIMARY KEY, v text)")
        conn.execute("ALTER TABLE a REPLICA IDENTITY NOTHING")
        conn.execute("CREATE PUBLICATION p FOR TABLE a")
        conn.execute("INSERT INTO a VALUES (1, 'x')")
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as update:
            conn.execute("UPDATE a SET v = 'y'")
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as delete:
            conn.execute("DELETE FROM a")
    assert 'cannot update table "a" because it does not have a replica identity and publishes updates' in str(
        update.value
    )
    assert 'cannot delete from table "a" because it does not have a replica identity and publishes deletes' in str(
        delete.value
    )


def test_a_future_read_time_is_refused_until_the_clock_passes_it(yugabyte, session):
    """S. The consistent time is the cluster clock's upper bound, up to max_clock_skew_usec (500 ms)
    ahead of a node ("could be 0.5 seconds ahead ... "SET LOCAL yb_read_time" will return an error if
    the time to be set is in the future": Debezium-YB QueryingSnapshotter.java:58-62 @ 52515b4ac;
    TestPgReplicationSlot.java @ ee3043e0 ``waitForSnapshotTimeToPass``). The error's text is a guess."""
    make_employee(yugabyte)
    session.run(RR)
    ht = int(session.run("CREATE_REPLICATION_SLOT s LOGICAL yboutput HYBRID_TIME USE_SNAPSHOT")[1][2])
    session.run("COMMIT")
    assert ht > yugabyte.current_ht()
    with yugabyte.connect() as conn:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        with pytest.raises(psycopg.errors.InternalError, match="in the future"):
            conn.execute(f"SET LOCAL yb_read_time TO '{ht} ht'")
        conn.execute("ROLLBACK")
        while yugabyte.current_ht() <= ht:
            pass
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        conn.execute(f"SET LOCAL yb_read_time TO '{ht} ht'")
        assert conn.execute("SELECT count(*) FROM employee").fetchone()[0] == 0
        conn.execute("COMMIT")


def test_errors_of_the_virtual_wal_arrive_after_copy_both_response(yugabyte):
    """S. walsender.c @ d0352220 StartLogicalReplication sends CopyBothResponse ('W') before
    ``YBCInitVirtualWal`` (yb_virtual_wal_client.c @ 250c6f1e: YBGetPublicationsByNames with
    missing_ok=false); a missing slot is refused before it (ReplicationSlotAcquire)."""
    make_employee(yugabyte)
    assert Stream(yugabyte, "nope").error == ("42704", 'replication slot "nope" does not exist', "")
    Session(yugabyte).run("CREATE_REPLICATION_SLOT s LOGICAL yboutput NOEXPORT_SNAPSHOT")
    stream = Stream(yugabyte, "s", publication="missing")
    try:
        assert stream.error is None  # COPY BOTH began
        while (received := stream.conn.get_copy_data(0)[0]) == 0:
            select.select([stream.conn.socket], [], [], 0.1)
            stream.conn.consume_input()
        assert received == -1  # the copy ended: no change came first
        result = stream.conn.get_result()
        assert result.error_field(pq.DiagnosticField.SQLSTATE) == b"42704"
        assert result.error_field(pq.DiagnosticField.MESSAGE_PRIMARY) == b'publication "missing" does not exist'
    finally:
        stream.close()


# -- P: the product on each release -------------------------------------------------------------


@pytest.fixture
def release_conn(request, pg15, airflow_db, spark, monkeypatch):
    """A stand-in of the release in ``request.param``, with its Airflow connection.

    2024.2 has no cluster-wide advisory locks, so the capture lock is a row lock held by an open
    transaction; the stand-in takes its snapshots with a PostgreSQL slot, which waits for every
    transaction holding an xid (YB's does not), so here the advisory lock stands in for it."""
    release = request.param
    options = {"advisory_locks": True} if release.startswith("2024.") else {}
    for standin in standin_for(request, pg15, active_window_ms=1000, release=release, **options):
        conn_id = f"yb_{standin.database}"
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", airflow_connection(standin))
        yield standin, conn_id


@pytest.mark.airflow
@pytest.mark.spark
@pytest.mark.parametrize("release_conn", ["2024.2.4.0", "2025.1.0.0", "2025.2.2.0", "2026.1.0.0"], indirect=True)
def test_case_01_p_the_snapshot_and_a_window_work_with_either_flag_setting(release_conn, tmp_path):
    """P. Case 1 (TestPgReplicationSlotSnapshotAction.java:180-189) and research §1.2: the product
    creates its slot inside a REPEATABLE READ transaction, so the snapshot works with
    ysql_enable_pg_export_snapshot on (2025.2.2.0, 2026.1) and off (2024.2.4.0, 2025.1.0.0), and
    reads at the consistent time only once the clock has passed it (it is up to max_clock_skew_usec
    ahead: Debezium-YB QueryingSnapshotter.java:58-70)."""
    standin, conn_id = release_conn
    workload.create(standin, customers=3, orders_per_customer=1)
    errors: dict = {}
    dag = capture_dag(f"yb_{standin.database}", make_capture(conn_id, tmp_path, standin.database), errors)
    result = af.run(dag, 0, errors=errors)
    assert result.state == "success", errors
    workload.mutate(standin, 1)
    assert af.run(dag, 1, errors=errors).state == "success", errors
    assert_reproduces_source(standin, tmp_path)


@pytest.mark.airflow
@pytest.mark.spark
def test_cases_16_18_20_21_p_change_identity_images_key_updates_and_a_new_column(yugabyte_conn, tmp_path):
    """P. Debezium-YB YugabyteReplicaIdentityIT.java:187-236 (CHANGE: UPDATE ``before`` null, an
    unchanged column absent, a column set to NULL present as null), :408-447 (CHANGE DELETE:
    ``before`` has the key, other columns null); YBRecordsStreamProducerIT.java:472-494 (a key
    update is delete, tombstone, insert) and :186-225 (a column added between runs streams)."""
    standin, conn_id = yugabyte_conn
    with standin.connect() as conn:
        conn.execute("CREATE TABLE public.items (id int PRIMARY KEY, a text, b text)")
        conn.execute("INSERT INTO public.items VALUES (1, 'a1', 'b1'), (2, 'a2', 'b2')")
    errors: dict = {}
    capture = make_capture(conn_id, tmp_path, standin.database, tables=["public.items"])
    dag = capture_dag(f"yb_{standin.database}", capture, errors)
    assert af.run(dag, 0, errors=errors).state == "success", errors
    with standin.connect() as conn:
        conn.execute("UPDATE public.items SET b = NULL WHERE id = 1")
        conn.execute("DELETE FROM public.items WHERE id = 2")
        conn.execute("UPDATE public.items SET id = 3 WHERE id = 1")
    assert af.run(dag, 1, errors=errors).state == "success", errors
    with standin.connect() as conn:
        conn.execute("ALTER TABLE public.items ADD COLUMN c int")
        conn.execute("INSERT INTO public.items VALUES (4, 'a4', 'b4', 44)")
    assert af.run(dag, 2, errors=errors).state == "success", errors
    events = [e for e in ordered(events_of(tmp_path, "shop", "public.items")) if e["op"] in ("c", "u", "d")]
    update, delete, key_delete, key_insert, added = events
    assert update["op"] == "u" and update["before"] is None
    assert update["after"]["b"] is None and update["unchanged_toast_columns"] == ["a"]
    assert delete["op"] == "d" and delete["before"]["id"] == 2 and delete["before"]["a"] is None
    assert [key_delete["op"], key_delete["before"]["id"], key_insert["op"], key_insert["after"]["id"]] == [
        "d",
        1,
        "c",
        3,
    ]
    assert added["op"] == "c" and added["after"]["c"] == 44
