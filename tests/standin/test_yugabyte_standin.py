"""The YugabyteDB stand-in (tests/support/yugabyte) behaves as YB's documented YSQL logical
replication does (docs/yugabytedb-standin.md), over real sockets on a real PostgreSQL 15."""

from __future__ import annotations

import itertools
import select
import struct
import time

import psycopg
import pytest
from psycopg import pq

from airflow_provider_cdc.cdc.sources.postgres.decoder import (
    UNCHANGED_TOAST,
    Begin,
    Commit,
    Delete,
    Insert,
    Relation,
    Update,
    decode_message,
)
from airflow_provider_cdc.cdc.sources.postgres.replication import ReplicationConnection, XLogData
from tests.support.yugabyte import YugabyteStandIn, expiry_message
from tests.support.yugabyte.fixtures import airflow_connection
from tests.support.yugabyte.releases import DEFAULT_RELEASE

pytestmark = pytest.mark.pg

EMPLOYEE = "CREATE TABLE employee (employee_id int PRIMARY KEY, employee_name text, employee_dept text)"


class Stream:
    """A raw libpq replication stream (the product's client never acknowledges; YB clients do)."""

    def __init__(self, yb: YugabyteStandIn, slot: str, start: str = "0/0", publication: str = "p"):
        self.conn = pq.PGconn.connect(yb.conninfo(replication=True).encode())
        assert self.conn.status == pq.ConnStatus.OK, self.conn.error_message
        command = (
            f"START_REPLICATION SLOT {slot} LOGICAL {start} (proto_version '1', publication_names '{publication}')"
        )
        self.conn.send_query(command.encode())
        result = self.conn.get_result()
        if result.status != pq.ExecStatus.COPY_BOTH:
            self.error = (
                result.error_field(pq.DiagnosticField.SQLSTATE).decode(),
                result.error_field(pq.DiagnosticField.MESSAGE_PRIMARY).decode(),
                (result.error_field(pq.DiagnosticField.MESSAGE_HINT) or b"").decode(),
            )
            self.conn.finish()
            return
        self.error = None
        self.conn.nonblocking = 1
        self.keepalives: list[int] = []

    def read(self, commits: int, timeout: float = 10.0) -> list[tuple[int, object]]:
        """(wal_start, decoded message) up to and including the ``commits``-th COMMIT."""
        out: list[tuple[int, object]] = []
        deadline = time.monotonic() + timeout
        while commits > 0:
            assert time.monotonic() < deadline, f"timed out; got {out}"
            nbytes, data = self.conn.get_copy_data(1)
            if nbytes == 0:
                select.select([self.conn.socket], [], [], 0.1)
                self.conn.consume_input()
                continue
            assert nbytes > 0, self.conn.error_message
            data = bytes(data)
            if data[:1] == b"k":
                self.keepalives.append(struct.unpack_from("!Q", data, 1)[0])
                continue
            message = decode_message(data[25:])
            out.append((struct.unpack_from("!Q", data, 1)[0], message))
            if isinstance(message, Commit):
                commits -= 1
        return out

    def quiet(self, seconds: float) -> list[object]:
        """The data messages that arrive within ``seconds`` (keepalives recorded, not returned)."""
        out = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            nbytes, data = self.conn.get_copy_data(1)
            if nbytes == 0:
                select.select([self.conn.socket], [], [], 0.1)
                self.conn.consume_input()
                continue
            data = bytes(data)
            if data[:1] == b"k":
                self.keepalives.append(struct.unpack_from("!Q", data, 1)[0])
            else:
                out.append(decode_message(data[25:]))
        return out

    def ack(self, flush: int) -> None:
        self.conn.put_copy_data(struct.pack("!cQQQqB", b"r", flush, flush, flush, 0, 0))
        self.conn.flush()
        time.sleep(0.3)  # processed by the stand-in between transactions

    def close(self) -> None:
        self.conn.finish()


def replication_command(yb: YugabyteStandIn, command: str):
    """(status, first row or error fields) of one replication command."""
    conn = pq.PGconn.connect(yb.conninfo(replication=True).encode())
    try:
        result = conn.exec_(command.encode())
        if result.status == pq.ExecStatus.TUPLES_OK:
            return "ok", [None if v is None else v.decode() for v in (result.get_value(0, i) for i in range(4))]
        return "error", (
            result.error_field(pq.DiagnosticField.SQLSTATE).decode(),
            result.error_field(pq.DiagnosticField.MESSAGE_PRIMARY).decode(),
        )
    finally:
        conn.finish()


def use_snapshot_slot(yb: YugabyteStandIn, command: str) -> list[str | None]:
    """``command`` (a USE_SNAPSHOT ``CREATE_REPLICATION_SLOT``) as YB's tests run it with the
    export-snapshot flag on: first in a REPEATABLE READ transaction on the replication connection
    (TestPgReplicationSlotSnapshotAction.java @ 6100a30b l.104-121). Returns its row once the clock
    has passed the slot's consistent time and its snapshot was taken (``waitForSnapshotTimeToPass``)."""
    conn = pq.PGconn.connect(yb.conninfo(replication=True).encode())
    try:
        assert conn.exec_(b"BEGIN TRANSACTION ISOLATION LEVEL REPEATABLE READ").status == pq.ExecStatus.COMMAND_OK
        result = conn.exec_(command.encode())
        assert result.status == pq.ExecStatus.TUPLES_OK, result.error_message
        row = [None if v is None else v.decode() for v in (result.get_value(0, i) for i in range(4))]
        assert conn.exec_(b"COMMIT").status == pq.ExecStatus.COMMAND_OK
    finally:
        conn.finish()
    deadline = time.monotonic() + 5
    while not yb.admin_query("SELECT boundary_lsn IS NOT NULL FROM yb_standin.slots WHERE slot_name = %s", (row[0],))[
        0
    ][0]:
        assert time.monotonic() < deadline, "the stand-in took no snapshot"
        time.sleep(0.02)
    return row


def in_stream_error(stream: Stream) -> tuple[str, str, str]:
    """(sqlstate, message, hint) of the ErrorResponse that ended ``stream`` after CopyBothResponse."""
    while (received := stream.conn.get_copy_data(0)[0]) == 0:
        select.select([stream.conn.socket], [], [], 0.1)
        stream.conn.consume_input()
    assert received == -1
    result = stream.conn.get_result()
    return tuple(
        (result.error_field(f) or b"").decode()
        for f in (pq.DiagnosticField.SQLSTATE, pq.DiagnosticField.MESSAGE_PRIMARY, pq.DiagnosticField.MESSAGE_HINT)
    )


def changes(frames) -> list[object]:
    return [m for _, m in frames if isinstance(m, (Insert, Update, Delete))]


def setup_employee(yb: YugabyteStandIn, identity: str | None = None) -> None:
    with yb.connect() as conn:
        conn.execute(EMPLOYEE)
        if identity:
            conn.execute(f"ALTER TABLE employee REPLICA IDENTITY {identity}")
        conn.execute("CREATE PUBLICATION p FOR TABLE employee")


def employee_workload(yb: YugabyteStandIn) -> None:
    with yb.connect() as conn:
        conn.execute("INSERT INTO employee VALUES (1001, 'Alice', 'Packaging')")
        conn.execute("UPDATE employee SET employee_name = 'Bob' WHERE employee_id = 1001")
        conn.execute("DELETE FROM employee WHERE employee_id = 1001")


# -- 1. hybrid time ------------------------------------------------------------------------------


def test_current_hybrid_time_is_unix_micros_shifted_and_strictly_increasing(yugabyte):
    with yugabyte.connect() as conn:
        values = [conn.execute("SELECT yb_get_current_hybrid_time_lsn()").fetchone()[0] for _ in range(50)]
        both = conn.execute("SELECT yb_get_current_hybrid_time_lsn(), yb_get_current_hybrid_time_lsn()").fetchone()
    assert all(b > a for a, b in itertools.pairwise(values))
    assert both[1] > both[0]
    assert abs((values[0] >> 12) - time.time() * 1_000_000) < 60_000_000
    assert values[0] & 0xFFF == 0


# -- 2. refused functions ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        "pg_logical_slot_get_changes('s', NULL, NULL)",
        "pg_logical_slot_peek_changes('s', NULL, NULL)",
        "pg_logical_slot_get_binary_changes('s', NULL, NULL)",
        "pg_logical_slot_peek_binary_changes('s', NULL, NULL)",
        "pg_replication_slot_advance('s', '0/10')",
        "pg_current_wal_lsn()",
        "pg_current_wal_insert_lsn()",
        "pg_current_wal_flush_lsn()",
    ],
)
def test_unsupported_functions_are_refused(yugabyte, call):
    with yugabyte.connect() as conn:
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="unsupported in YugabyteDB"):
            conn.execute(f"SELECT * FROM {call}")


def test_emit_message_works_but_is_never_streamed(yugabyte):
    setup_employee(yugabyte)
    replication_command(yugabyte, "CREATE_REPLICATION_SLOT s LOGICAL yboutput HYBRID_TIME")
    with yugabyte.connect() as conn:
        conn.execute("SELECT pg_logical_emit_message(true, 'x', 'hello')")
        with conn.transaction():
            conn.execute("SELECT pg_logical_emit_message(true, 'x', 'in txn')")
            conn.execute("INSERT INTO employee VALUES (1, 'a', 'b')")
        conn.execute("TRUNCATE employee")
        conn.execute("INSERT INTO employee VALUES (2, 'c', 'd')")
    stream = Stream(yugabyte, "s")
    try:
        frames = stream.read(2)
        kinds = [type(m).__name__ for _, m in frames]
        assert kinds == ["Begin", "Relation", "Insert", "Commit", "Begin", "Insert", "Commit"]
        assert stream.quiet(1.5) == []  # no TRUNCATE, no 'M', no empty transactions
        assert stream.keepalives, "keepalives about every second"
    finally:
        stream.close()


# -- 3. pg_replication_slots ---------------------------------------------------------------------


def test_replication_slots_view_has_yb_columns_and_only_standin_slots(yugabyte):
    with yugabyte.connect() as conn:
        conn.execute(
            "SELECT * FROM pg_create_logical_replication_slot('s_ht', 'yboutput', yb_lsn_type => 'HYBRID_TIME')"
        )
        conn.execute("SELECT * FROM pg_create_logical_replication_slot('s_seq', 'yboutput')")
        cur = conn.execute("SELECT * FROM pg_replication_slots ORDER BY slot_name")
        names = [d.name for d in cur.description]
        rows = [dict(zip(names, r)) for r in cur.fetchall()]
    assert names == [
        "slot_name", "plugin", "slot_type", "datoid", "database", "temporary", "active", "active_pid", "xmin",
        "catalog_xmin", "restart_lsn", "confirmed_flush_lsn", "wal_status", "safe_wal_size", "two_phase",
        "yb_stream_id", "yb_restart_commit_ht", "yb_lsn_type",
    ]  # fmt: skip
    assert [r["slot_name"] for r in rows] == ["s_ht", "s_seq"]  # the journal's real slot is not listed
    assert [r["yb_lsn_type"] for r in rows] == ["HYBRID_TIME", "SEQUENCE"]
    for row in rows:
        assert row["temporary"] is False and row["active"] is False and row["active_pid"] is None
        assert row["database"] == yugabyte.database and row["plugin"] == "yboutput"
        assert row["confirmed_flush_lsn"] == "0/2"
        assert len(row["yb_stream_id"]) == 32
        assert abs((row["yb_restart_commit_ht"] >> 12) - time.time() * 1e6) < 60e6
    real = {r[0] for r in yugabyte.admin_query("SELECT slot_name FROM pg_catalog.pg_replication_slots")}
    assert "s_ht" not in real


# -- 4. replica identity -------------------------------------------------------------------------


def test_replica_identity_as_yb_reports_it(yugabyte):
    with yugabyte.connect() as conn:
        for name in ("t_c", "t_d", "t_f", "t_n", "t_new"):
            conn.execute(f"CREATE TABLE {name} (k int PRIMARY KEY, v text)")
        conn.execute("ALTER TABLE t_c REPLICA IDENTITY CHANGE")
        conn.execute("ALTER TABLE t_d REPLICA IDENTITY DEFAULT")
        conn.execute("ALTER TABLE public.t_f REPLICA IDENTITY FULL")
        conn.execute("ALTER TABLE t_n REPLICA IDENTITY NOTHING")
        seen = dict(
            conn.execute(
                "SELECT relname::text, relreplident::text FROM pg_class WHERE relname LIKE 't\\_%' AND relkind = 'r'"
            )
        )
        conn.execute("CREATE PUBLICATION p FOR ALL TABLES")
        conn.execute("INSERT INTO t_n VALUES (1, 'x')")
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="does not have a replica identity"):
            conn.execute("UPDATE t_n SET v = 'y'")
    assert seen == {"t_c": "c", "t_d": "d", "t_f": "f", "t_n": "n", "t_new": "c"}
    real = dict(
        yugabyte.admin_query(
            "SELECT relname::text, relreplident::text FROM pg_catalog.pg_class "
            "WHERE relname LIKE 't\\_%' AND relkind = 'r'"
        )
    )
    assert real == {"t_c": "f", "t_d": "f", "t_f": "f", "t_n": "n", "t_new": "f"}


# -- 5. yb_read_time -----------------------------------------------------------------------------


def test_yb_read_time_reads_the_slot_consistent_point(yugabyte):
    setup_employee(yugabyte)
    with yugabyte.connect() as conn:
        conn.execute("INSERT INTO employee VALUES (1, 'before', 'x')")
    row = use_snapshot_slot(yugabyte, "CREATE_REPLICATION_SLOT s LOGICAL yboutput HYBRID_TIME USE_SNAPSHOT")
    ht = int(row[2])
    with yugabyte.connect() as conn:
        conn.execute("INSERT INTO employee VALUES (2, 'after', 'x')")
        assert ht == conn.execute("SELECT yb_restart_commit_ht FROM pg_replication_slots").fetchone()[0]
        conn.execute("SET yb_disable_catalog_version_check = true")
        for form in ("TO", "="):
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            conn.execute(f"SET LOCAL yb_read_time {form} '{ht} ht'")
            assert conn.execute("SELECT employee_id FROM employee ORDER BY 1").fetchall() == [(1,)]
            conn.execute("COMMIT")
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="only supports the consistent snapshot points"):
            conn.execute(f"SET LOCAL yb_read_time TO '{ht + 4096} ht'")
        conn.execute("ROLLBACK")
    stream = Stream(yugabyte, "s")
    try:
        assert [m.new[0] for m in changes(stream.read(1))] == [b"2"]  # strictly after the snapshot
    finally:
        stream.close()


# -- 6. yb_hash_code -----------------------------------------------------------------------------


def test_yb_hash_code_ranges_cover_every_row_once(yugabyte):
    with yugabyte.connect() as conn:
        conn.execute("CREATE TABLE h (k1 int, k2 text, v date, PRIMARY KEY (k1, k2))")
        conn.execute("INSERT INTO h SELECT i, 'k' || i, DATE '2024-01-01' + i FROM generate_series(1, 500) i")
        hashes = conn.execute("SELECT yb_hash_code(k1, k2), yb_hash_code(k1, k2) FROM h").fetchall()
        assert all(a == b and 0 <= a <= 65535 for a, b in hashes)
        assert conn.execute("SELECT yb_hash_code(v) BETWEEN 0 AND 65535 FROM h LIMIT 1").fetchone()[0]
        bounds = [0, 16384, 32768, 49152, 65536]
        seen = []
        for low, high in itertools.pairwise(bounds):
            seen += conn.execute(
                "SELECT k1 FROM h WHERE yb_hash_code(k1, k2) >= %s AND yb_hash_code(k1, k2) < %s", (low, high)
            ).fetchall()
        between = []
        for low, high in itertools.pairwise(bounds):
            between += conn.execute(
                "SELECT k1 FROM h WHERE yb_hash_code(k1, k2) BETWEEN %s AND %s", (low, high - 1)
            ).fetchall()
    assert sorted(seen) == sorted(between) == [(i,) for i in range(1, 501)]


# -- 7. advisory locks ---------------------------------------------------------------------------


def test_advisory_locks_pass_through(yugabyte):
    with yugabyte.connect() as a, yugabyte.connect() as b:
        assert a.execute("SELECT pg_try_advisory_lock(42)").fetchone()[0] is True
        assert b.execute("SELECT pg_try_advisory_lock(42)").fetchone()[0] is False
        assert a.execute("SELECT pg_advisory_unlock(42)").fetchone()[0] is True


def test_advisory_locks_refused_before_2025_1(pg15):
    yb = YugabyteStandIn(pg15, "yb_no_advisory_locks", advisory_locks=False).start()
    try:
        with yb.connect() as conn:
            assert "-YB-2024.2.4.0-b0" in conn.execute("SELECT version()").fetchone()[0]
            for call in ("pg_try_advisory_lock(42)", "pg_advisory_unlock(42)", "pg_advisory_lock(1, 2)"):
                with pytest.raises(
                    psycopg.errors.FeatureNotSupported, match="advisory locks are not yet implemented"
                ) as err:
                    conn.execute(f"SELECT {call}")
                assert "3642" in err.value.diag.message_hint
    finally:
        yb.stop()


# -- 8. SQL slot creation and drop ---------------------------------------------------------------


def test_sql_slot_creation_and_drop(yugabyte):
    setup_employee(yugabyte, "DEFAULT")
    with yugabyte.connect() as conn:
        row = conn.execute(
            "SELECT * FROM pg_create_logical_replication_slot('s', 'yboutput', temporary => false, "
            "yb_lsn_type => 'HYBRID_TIME')"
        ).fetchone()
        assert row == ("s", "0/2")
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="temporary replication slot is not yet supported"):
            conn.execute("SELECT * FROM pg_create_logical_replication_slot('t', 'yboutput', true)")
        with pytest.raises(psycopg.errors.DuplicateObject):
            conn.execute("SELECT * FROM pg_create_logical_replication_slot('s', 'yboutput')")
    stream = Stream(yugabyte, "s")
    stream.quiet(0.3)
    stream.close()
    with yugabyte.connect() as conn:
        assert conn.execute("SELECT active FROM pg_replication_slots").fetchone()[0] is True
        with pytest.raises(psycopg.errors.ObjectInUse, match='replication slot "s" is active'):
            conn.execute("SELECT pg_drop_replication_slot('s')")
        yugabyte.age_slot("s", 120_000)
        assert conn.execute("SELECT active FROM pg_replication_slots").fetchone()[0] is False
        conn.execute("SELECT pg_drop_replication_slot('s')")
        assert conn.execute("SELECT count(*) FROM pg_replication_slots").fetchone()[0] == 0
        with pytest.raises(psycopg.errors.UndefinedObject):
            conn.execute("SELECT pg_drop_replication_slot('s')")


# -- 9. CREATE_REPLICATION_SLOT ------------------------------------------------------------------


def test_create_replication_slot_answers(yugabyte):
    before = yugabyte.current_ht()
    status, row = replication_command(yugabyte, "CREATE_REPLICATION_SLOT s1 LOGICAL yboutput")
    assert status == "ok" and row[0] == "s1" and row[1] == "0/2" and row[3] == "yboutput"
    assert not row[2].isdigit()  # at 2025.2.2.0 a bare command exports (walsender.c @ d0352220)
    row = use_snapshot_slot(yugabyte, "CREATE_REPLICATION_SLOT s3 LOGICAL yboutput USE_SNAPSHOT")
    assert int(row[2]) > before  # USE_SNAPSHOT: the consistent HT in decimal
    assert replication_command(
        yugabyte, "CREATE_REPLICATION_SLOT s2 LOGICAL pgoutput NOEXPORT_SNAPSHOT HYBRID_TIME"
    ) == (
        "ok",
        ["s2", "0/2", None, "pgoutput"],
    )
    row = use_snapshot_slot(yugabyte, 'CREATE_REPLICATION_SLOT "Quoted" LOGICAL yboutput USE_SNAPSHOT SEQUENCE')
    assert row[0] == "Quoted"
    assert replication_command(yugabyte, "CREATE_REPLICATION_SLOT t TEMPORARY LOGICAL yboutput") == (
        "error",
        ("0A000", "temporary replication slot is not yet supported"),
    )
    assert replication_command(yugabyte, "CREATE_REPLICATION_SLOT t PHYSICAL") == (
        "error",
        ("0A000", "YSQL only supports logical replication slots"),
    )
    assert replication_command(yugabyte, "CREATE_REPLICATION_SLOT s1 LOGICAL yboutput")[1][0] == "42710"
    types = dict(yugabyte.admin_query("SELECT slot_name::text, lsn_type FROM yb_standin.slots"))
    assert types == {"s1": "SEQUENCE", "s2": "HYBRID_TIME", "s3": "SEQUENCE", "Quoted": "SEQUENCE"}
    conn = pq.PGconn.connect(yugabyte.conninfo(replication=True).encode())
    result = conn.exec_(b"IDENTIFY_SYSTEM")
    assert result.status == pq.ExecStatus.TUPLES_OK and result.nfields == 4
    conn.finish()


# -- 10. streaming -------------------------------------------------------------------------------


def test_hybrid_time_frames_under_change(yugabyte):
    setup_employee(yugabyte)
    replication_command(yugabyte, "CREATE_REPLICATION_SLOT s LOGICAL yboutput HYBRID_TIME")
    with yugabyte.connect() as conn:
        before = conn.execute("SELECT yb_get_current_hybrid_time_lsn()").fetchone()[0]
        employee_workload(yugabyte)
        after = conn.execute("SELECT yb_get_current_hybrid_time_lsn()").fetchone()[0]
    with ReplicationConnection(yugabyte.connection_info()) as rc:  # the product's client
        rc.start_logical("s", 0, {"proto_version": "1", "publication_names": "p"})
        frames = []
        for frame in rc.frames(idle_timeout=10):
            if isinstance(frame, XLogData):
                frames.append((frame.wal_start, decode_message(frame.payload)))
                if sum(isinstance(m, Commit) for _, m in frames) == 3:
                    break
    begins = [m for _, m in frames if isinstance(m, Begin)]
    commits = [m for _, m in frames if isinstance(m, Commit)]
    hts = [c.commit_lsn for c in commits]
    assert before < hts[0] < hts[1] < hts[2] < after
    assert [b.xid for b in begins] == [2, 3, 4]
    assert [b.final_lsn for b in begins] == hts
    assert [c.end_lsn for c in commits] == [ht + 1 for ht in hts]
    assert [b.commit_ts_us for b in begins] == [c.commit_ts_us for c in commits]
    assert abs(begins[0].commit_ts_us - (hts[0] >> 12)) < 1000
    relation = next(m for _, m in frames if isinstance(m, Relation))
    assert relation.replica_identity == "c"
    assert [c.is_replica_identity for c in relation.columns] == [True, False, False]
    txn = 0
    for wal_start, message in frames:
        if isinstance(message, Relation):
            assert wal_start == 0
        elif isinstance(message, Commit):
            assert wal_start == hts[txn] + 1
            txn += 1
        else:
            assert wal_start == hts[txn]
    insert, update, delete = changes(frames)
    assert insert.new == (b"1001", b"Alice", b"Packaging")
    assert update.old_kind is None and update.new == (b"1001", b"Bob", UNCHANGED_TOAST)
    assert delete.old_kind == "K" and delete.old == (b"1001", None, None)


def test_sequence_lsns(yugabyte):
    setup_employee(yugabyte)
    replication_command(yugabyte, "CREATE_REPLICATION_SLOT s LOGICAL yboutput SEQUENCE NOEXPORT_SNAPSHOT")
    with yugabyte.connect() as conn:
        conn.execute("INSERT INTO employee VALUES (1, 'a', 'b')")
        conn.execute("INSERT INTO employee VALUES (2, 'a', 'b'), (3, 'a', 'b')")
    stream = Stream(yugabyte, "s")
    try:
        frames = [(w, m) for w, m in stream.read(2) if not isinstance(m, Relation)]
    finally:
        stream.close()
    assert [w for w, _ in frames] == [2, 3, 5, 5, 6, 7, 9]
    begin1, _, commit1, begin2, _, _, commit2 = (m for _, m in frames)
    assert (begin1.final_lsn, begin1.xid, commit1.commit_lsn, commit1.end_lsn) == (4, 2, 4, 5)
    assert (begin2.final_lsn, begin2.xid, commit2.commit_lsn, commit2.end_lsn) == (8, 3, 8, 9)


def test_default_and_full_images_and_intra_transaction_before_image(yugabyte):
    with yugabyte.connect() as conn:
        for name, identity in (("e_d", "DEFAULT"), ("e_f", "FULL"), ("e_c", None)):
            conn.execute(EMPLOYEE.replace("employee", name, 1))
            if identity:
                conn.execute(f"ALTER TABLE {name} REPLICA IDENTITY {identity}")
        conn.execute("CREATE PUBLICATION p FOR TABLE e_d, e_f, e_c")
    replication_command(yugabyte, "CREATE_REPLICATION_SLOT s LOGICAL yboutput HYBRID_TIME")
    with yugabyte.connect() as conn:
        conn.execute("ALTER TABLE e_c REPLICA IDENTITY FULL")  # after the slot: frozen CHANGE for it
        for name in ("e_d", "e_f", "e_c"):
            conn.execute(f"INSERT INTO {name} VALUES (1001, 'Alice', 'Packaging')")
            conn.execute(f"UPDATE {name} SET employee_name = 'Bob' WHERE employee_id = 1001")
            conn.execute(f"DELETE FROM {name} WHERE employee_id = 1001")
        with conn.transaction():
            conn.execute("INSERT INTO e_f VALUES (7, 'x', 'y')")
            conn.execute("UPDATE e_f SET employee_dept = 'z' WHERE employee_id = 7")
    stream = Stream(yugabyte, "s")
    try:
        frames = stream.read(10)
    finally:
        stream.close()
    identities = {m.name: m.replica_identity for _, m in frames if isinstance(m, Relation)}
    assert identities == {"e_d": "d", "e_f": "f", "e_c": "c"}
    rows = changes(frames)
    full = (b"1001", b"Bob", b"Packaging")
    alice = (b"1001", b"Alice", b"Packaging")
    assert rows[1] == Update(rows[1].relation_oid, None, None, full)  # DEFAULT: full row, no old
    assert rows[2].old_kind == "K" and rows[2].old == (b"1001", None, None)
    assert rows[4] == Update(rows[4].relation_oid, "O", alice, full)  # FULL
    assert rows[5].old_kind == "O" and rows[5].old == full
    assert rows[7].new == (b"1001", b"Bob", UNCHANGED_TOAST)  # CHANGE (frozen at slot creation)
    intra = rows[10]
    assert intra.old_kind == "O" and intra.old == (None, None, None) and intra.new == (b"7", b"x", b"z")


def test_primary_key_update_is_delete_plus_insert(yugabyte):
    setup_employee(yugabyte)
    replication_command(yugabyte, "CREATE_REPLICATION_SLOT s LOGICAL yboutput HYBRID_TIME")
    with yugabyte.connect() as conn:
        conn.execute("INSERT INTO employee VALUES (1, 'a', 'b')")
        conn.execute("UPDATE employee SET employee_id = 2, employee_name = NULL WHERE employee_id = 1")
    stream = Stream(yugabyte, "s")
    try:
        frames = stream.read(2)
    finally:
        stream.close()
    _, delete, insert = changes(frames)
    assert isinstance(delete, Delete) and delete.old_kind == "K" and delete.old == (b"1", None, None)
    assert isinstance(insert, Insert) and insert.new == (b"2", None, b"b")
    assert len({w for w, m in frames if isinstance(m, (Delete, Insert))}) == 2  # two transactions' HTs


def test_pgoutput_slot_refuses_change_tables(yugabyte):
    setup_employee(yugabyte)
    replication_command(yugabyte, "CREATE_REPLICATION_SLOT s LOGICAL pgoutput HYBRID_TIME")
    oid = yugabyte.admin_query("SELECT 'employee'::regclass::oid")[0][0]
    stream = Stream(yugabyte, "s")
    assert stream.error is None  # YBCInitVirtualWal's refusal comes after CopyBothResponse
    assert in_stream_error(stream) == (
        "0A000",
        f"replica identity CHANGE (for table: {oid}) is not supported for output plugin pgoutput",
        "Consider using output plugin yboutput instead",
    )
    stream.close()


def test_deterministic_across_reconnects_and_restarts(yugabyte, pg15):
    setup_employee(yugabyte)
    replication_command(yugabyte, "CREATE_REPLICATION_SLOT h LOGICAL yboutput HYBRID_TIME")
    replication_command(yugabyte, "CREATE_REPLICATION_SLOT q LOGICAL yboutput SEQUENCE")
    employee_workload(yugabyte)

    def read_both():
        out = []
        for slot in ("h", "q"):
            stream = Stream(yugabyte, slot)
            try:
                out.append([(w, m) for w, m in stream.read(3)])
            finally:
                stream.close()
        return out

    first = read_both()
    assert read_both() == first
    yugabyte.stop(drop=False)
    yugabyte.start()
    assert read_both() == first
    # and later transactions continue the numbering
    with yugabyte.connect() as conn:
        conn.execute("INSERT INTO employee VALUES (5, 'e', 'f')")
    stream = Stream(yugabyte, "q")
    try:
        frames = stream.read(4)
    finally:
        stream.close()
    assert [m.xid for _, m in frames if isinstance(m, Begin)] == [2, 3, 4, 5]


# -- 11. acknowledgement -------------------------------------------------------------------------


def test_ack_semantics(yugabyte):
    setup_employee(yugabyte)
    replication_command(yugabyte, "CREATE_REPLICATION_SLOT s LOGICAL yboutput HYBRID_TIME")
    employee_workload(yugabyte)

    def slot_row():
        with yugabyte.connect() as conn:
            return conn.execute(
                "SELECT confirmed_flush_lsn::text, restart_lsn::text, yb_restart_commit_ht FROM pg_replication_slots"
            ).fetchone()

    initial = slot_row()
    stream = Stream(yugabyte, "s")
    commits = [m.commit_lsn for _, m in stream.read(3) if isinstance(m, Commit)]
    stream.ack(0)  # flush 0: no ack
    assert slot_row() == initial
    stream.ack(commits[0])
    stream.close()
    as_lsn = f"{commits[0] >> 32:X}/{commits[0] & 0xFFFFFFFF:X}"
    after = f"{(commits[0] + 1) >> 32:X}/{(commits[0] + 1) & 0xFFFFFFFF:X}"
    assert slot_row() == (as_lsn, after, commits[0])

    # a fresh session acking before it streamed anything: ignored (it starts past every transaction)
    past = commits[2] + 1
    stream = Stream(yugabyte, "s", f"{past >> 32:X}/{past & 0xFFFFFFFF:X}")
    assert stream.quiet(0.5) == []
    stream.ack(commits[2])
    stream.close()
    assert slot_row() == (as_lsn, after, commits[0])

    # unacked transactions come back whole, with the same LSNs and xids
    stream = Stream(yugabyte, "s")
    frames = stream.read(2)
    assert [m.commit_lsn for _, m in frames if isinstance(m, Commit)] == commits[1:]
    assert [m.xid for _, m in frames if isinstance(m, Begin)] == [3, 4]
    stream.ack(commits[2])
    stream.close()
    assert slot_row()[2] == commits[2]

    # starting at an acknowledged commit LSN re-sends nothing before it; at 0/0: the confirmed flush
    with yugabyte.connect() as conn:
        conn.execute("INSERT INTO employee VALUES (9, 'n', 'o')")
    stream = Stream(yugabyte, "s")
    assert [m.new[0] for m in changes(stream.read(1))] == [b"9"]
    stream.close()


# -- 12. expiry ----------------------------------------------------------------------------------


def test_expired_slot_refuses_to_stream_but_stays_listed(yugabyte):
    setup_employee(yugabyte)
    replication_command(yugabyte, "CREATE_REPLICATION_SLOT s LOGICAL yboutput HYBRID_TIME")
    stream = Stream(yugabyte, "s")
    assert stream.error is None
    stream.close()
    yugabyte.set_retention_ms(60_000)
    yugabyte.age_slot("s", 61_000)
    stream = Stream(yugabyte, "s")
    stream_id = yugabyte.admin_query("SELECT stream_id FROM yb_standin.slots")[0][0]
    assert stream.error is None  # after CopyBothResponse, as YBCInitVirtualWal's errors come
    error = in_stream_error(stream)
    stream.close()
    assert error[0] == "XX000"
    assert error[1].startswith(f"stream ID {stream_id} is expired for Tablet ID ")
    assert expiry_message(stream_id, 1).split(" Tablet")[0] in error[1]
    with yugabyte.connect() as conn:
        assert conn.execute("SELECT slot_name FROM pg_replication_slots").fetchall() == [("s",)]


# -- 13. no slot lock ----------------------------------------------------------------------------


def test_concurrent_start_replication_is_accepted(yugabyte):
    setup_employee(yugabyte)
    replication_command(yugabyte, "CREATE_REPLICATION_SLOT s LOGICAL yboutput HYBRID_TIME")
    employee_workload(yugabyte)
    first, second = Stream(yugabyte, "s"), Stream(yugabyte, "s")
    try:
        assert first.error is None and second.error is None
        assert first.read(3) == second.read(3)
    finally:
        first.close()
        second.close()


def test_airflow_connection(yugabyte):
    import json

    conn = json.loads(airflow_connection(yugabyte))
    assert conn["conn_type"] == "postgres" and conn["port"] == yugabyte.port and conn["schema"] == yugabyte.database


def test_generic_options_drop_command_read_time_call_and_schema_change(yugabyte):
    setup_employee(yugabyte)
    row = use_snapshot_slot(
        yugabyte, "CREATE_REPLICATION_SLOT s LOGICAL yboutput (SNAPSHOT 'use', LSN_TYPE 'HYBRID_TIME')"
    )
    assert row[2].isdigit()
    assert yugabyte.admin_query("SELECT lsn_type FROM yb_standin.slots") == [("HYBRID_TIME",)]
    with yugabyte.connect() as conn:
        conn.execute("INSERT INTO employee VALUES (1, 'a', 'b')")
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        conn.execute(f"CALL set_yb_read_time('{row[2]} ht')")  # the non-superuser route of YB's docs
        assert conn.execute("SELECT count(*) FROM employee").fetchone()[0] == 0
        conn.execute("COMMIT")
        conn.execute("ALTER TABLE employee ADD COLUMN salary int")
        conn.execute("INSERT INTO employee VALUES (2, 'c', 'd', 10)")
    stream = Stream(yugabyte, "s")
    try:
        frames = stream.read(2)
        stream.quiet(1.3)
        relations = [m for _, m in frames if isinstance(m, Relation)]
        assert [len(r.columns) for r in relations] == [3, 4]  # a fresh Relation after the DDL
        last_commit = [m for _, m in frames if isinstance(m, Commit)][-1]
        assert stream.keepalives and stream.keepalives[-1] == last_commit.commit_lsn
    finally:
        stream.close()
    conn = pq.PGconn.connect(yugabyte.conninfo(replication=True).encode())
    try:
        result = conn.exec_(b"DROP_REPLICATION_SLOT s")
        assert result.error_field(pq.DiagnosticField.SQLSTATE) == b"55006"  # polled just now: active
        yugabyte.age_slot("s", 120_000)
        assert conn.exec_(b"DROP_REPLICATION_SLOT s").status == pq.ExecStatus.COMMAND_OK
    finally:
        conn.finish()
    assert yugabyte.admin_query("SELECT count(*) FROM yb_standin.slots") == [(0,)]


def test_reports_a_yb_version(yugabyte):
    with yugabyte.connect() as conn:
        assert f"-YB-{DEFAULT_RELEASE}-b0" in conn.execute("SELECT version()").fetchone()[0]
        assert conn.execute("SHOW server_version").fetchone()[0].startswith("15.")
        assert conn.info.parameter_status("server_version").endswith(f"-YB-{DEFAULT_RELEASE}-b0")
        assert conn.info.server_version >= 150000


def test_replication_commands_follow_the_sessions_transaction_block(yugabyte):
    """The proxy answers CREATE_REPLICATION_SLOT itself but reports the session's real block state:
    'T' after a slot made inside a block, an aborted block refuses replication commands (PostgreSQL's
    walsender: 25P02), START_REPLICATION cannot run in a block (25001). Flag off: USE_SNAPSHOT is not
    checked (walsender.c @ d0352220)."""
    conn = pq.PGconn.connect(yugabyte.conninfo(replication=True).encode())
    try:
        conn.exec_(b"BEGIN TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        assert conn.exec_(b"CREATE_REPLICATION_SLOT a LOGICAL yboutput USE_SNAPSHOT").status == pq.ExecStatus.TUPLES_OK
        assert conn.transaction_status == pq.TransactionStatus.INTRANS
        start = conn.exec_(b"START_REPLICATION SLOT a LOGICAL 0/0 (proto_version '1', publication_names 'p')")
        assert start.error_field(pq.DiagnosticField.SQLSTATE) == b"25001"
        assert conn.transaction_status == pq.TransactionStatus.INERROR
        again = conn.exec_(b"CREATE_REPLICATION_SLOT b LOGICAL yboutput NOEXPORT_SNAPSHOT")
        assert again.error_field(pq.DiagnosticField.SQLSTATE) == b"25P02"
        assert conn.exec_(b"ROLLBACK").status == pq.ExecStatus.COMMAND_OK
        assert conn.transaction_status == pq.TransactionStatus.IDLE
        yugabyte.set_export_snapshot(False)
        result = conn.exec_(b"CREATE_REPLICATION_SLOT c LOGICAL yboutput HYBRID_TIME USE_SNAPSHOT")
        assert result.status == pq.ExecStatus.TUPLES_OK and result.get_value(0, 2).isdigit()
    finally:
        conn.finish()
    assert sorted(r[0] for r in yugabyte.admin_query("SELECT slot_name::text FROM yb_standin.slots")) == ["a", "c"]


def test_char_and_numeric_stream_without_their_typmod(yugabyte):
    # ybc_pggate.cc YBCPgGetCDCConsistentChanges rebuilds datums with typmod -1; DocDB keeps char(n)
    # right-trimmed (YbDatumToBPChar) and numeric normalized (YbDatumToDecimalText). A scan pads.
    with yugabyte.connect() as conn:
        conn.execute("CREATE TABLE c (k char(3) PRIMARY KEY, a numeric(14,4), w numeric, r char(3)[])")
        conn.execute("ALTER TABLE c REPLICA IDENTITY FULL")
        conn.execute("CREATE PUBLICATION p FOR TABLE c")
    replication_command(yugabyte, "CREATE_REPLICATION_SLOT s LOGICAL yboutput HYBRID_TIME")
    with yugabyte.connect() as conn:
        conn.execute("INSERT INTO c VALUES ('x', 1.5, 10.0, ARRAY['y'::char(3)])")
        assert conn.execute("SELECT k, a::text FROM c").fetchone() == ("x  ", "1.5000")  # a scan: padded
        conn.execute("DELETE FROM c")
    stream = Stream(yugabyte, "s")
    try:
        frames = stream.read(2)
    finally:
        stream.close()
    insert, delete = changes(frames)
    assert insert.new == (b"x", b"1.5", b"10", b'{"y  "}')  # arrays are stored whole: padded
    assert delete.old == insert.new
