"""YugabyteDB's side of a capture: the slot, the window's end and fence, the acknowledgement, the lock.

YugabyteDB's logical replication speaks PostgreSQL's protocol but differs where a batch capture
leans on it (docs/yugabytedb.md, "What YugabyteDB does not have"):

- no ``pg_current_wal_lsn``: a window ends at a hybrid time read at run start
  (``yb_get_current_hybrid_time_lsn()``), and a **fence** row committed right after it (in the
  capture's heartbeat table, which is published) guarantees a later commit, because the walsender
  never says it has caught up;
- no ``pg_replication_slot_advance``: the slot is acknowledged by a standby status update on a
  replication connection (:func:`acknowledge`), which YugabyteDB persists only for transactions
  streamed on that connection, so the acknowledgement streams the window's transactions again
  (headers only) up to the window's end;
- no slot lock and, before v2025.1, no advisory locks: the capture lock falls back to a row lock
  (:func:`take_capture_lock`);
- no exported snapshot: a snapshot reads at the slot's consistent hybrid time
  (``SET LOCAL yb_read_time``, :func:`enter_read_time`).

The fence row lives in :mod:`.fence` and the stream errors' classification in
:mod:`.stream_errors`; both are also at this path, where the captures call them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from airflow_provider_cdc.cdc.basics.errors import (
    CdcTransientError,
    ConcurrentCaptureError,
    DecodingError,
    SlotConfigurationError,
    SlotMissingError,
)
from airflow_provider_cdc.cdc.sources.postgres import admin as pg_admin
from airflow_provider_cdc.cdc.sources.postgres.connection import PgConnectionInfo
from airflow_provider_cdc.cdc.sources.postgres.decoder import Begin, Commit, decode_message
from airflow_provider_cdc.cdc.sources.postgres.replication import (
    Keepalive,
    ReplicationConnection,
    XLogData,
)
from airflow_provider_cdc.cdc.sources.postgres.tables import TableInfo, TableRef, pg_identifier, quote_ident
from airflow_provider_cdc.cdc.sources.yugabyte import LSN_TYPES  # noqa: F401 (re-exported)
from airflow_provider_cdc.cdc.sources.yugabyte import PLUGIN as PLUGIN
from airflow_provider_cdc.cdc.sources.yugabyte.fence import (
    ensure_heartbeat_table as ensure_heartbeat_table,
)
from airflow_provider_cdc.cdc.sources.yugabyte.fence import (
    find_fence as find_fence,
)
from airflow_provider_cdc.cdc.sources.yugabyte.fence import (
    heartbeat_table_sql as heartbeat_table_sql,
)
from airflow_provider_cdc.cdc.sources.yugabyte.fence import (
    table_exists as table_exists,
)
from airflow_provider_cdc.cdc.sources.yugabyte.fence import (
    write_fence as write_fence,
)
from airflow_provider_cdc.cdc.sources.yugabyte.lsn import YbLsn, ht_text, ht_to_unix_us
from airflow_provider_cdc.cdc.sources.yugabyte.stream_errors import (
    classified_stream_errors as classified_stream_errors,
)
from airflow_provider_cdc.cdc.sources.yugabyte.stream_errors import (
    in_stream_error as in_stream_error,
)
from airflow_provider_cdc.cdc.sources.yugabyte.stream_errors import (
    stream_error as stream_error,
)

log = logging.getLogger(__name__)

MAX_POSITION = (1 << 64) - 1

SLOT_STATUS_SQL = """
    SELECT s.slot_name::text, s.plugin::text, s.slot_type::text, s.database::text, s.active,
           s.restart_lsn::text, s.confirmed_flush_lsn::text, s.yb_stream_id::text,
           s.yb_restart_commit_ht::bigint, s.yb_lsn_type::text, yb_get_current_hybrid_time_lsn()
    FROM pg_replication_slots s WHERE s.slot_name = %s
"""


@dataclass(frozen=True)
class YbSlotStatus:
    """One reading of a slot in ``pg_replication_slots`` (YugabyteDB's columns included).

    ``active`` means "read within ``ysql_cdc_active_replication_slot_window_ms``", not "a reader is
    connected now" (YugabyteDB has no ``active_pid``)."""

    slot_name: str
    plugin: str
    slot_type: str
    database: str | None
    active: bool
    restart_lsn: YbLsn | None
    confirmed_flush_lsn: YbLsn | None
    stream_id: str | None
    restart_commit_ht: int | None
    lsn_type: str | None
    current_ht: int

    @property
    def ack_lag_ms(self) -> int | None:
        """How long ago the last acknowledged transaction committed (milliseconds)."""
        if not self.restart_commit_ht:
            return None
        return max(0, (ht_to_unix_us(self.current_ht) - ht_to_unix_us(self.restart_commit_ht)) // 1000)

    def to_dict(self) -> dict[str, Any]:
        return {
            "slot_name": self.slot_name,
            "plugin": self.plugin,
            "active": self.active,
            "restart_lsn": None if self.restart_lsn is None else str(self.restart_lsn),
            "confirmed_flush_lsn": None if self.confirmed_flush_lsn is None else str(self.confirmed_flush_lsn),
            "yb_stream_id": self.stream_id,
            "yb_restart_commit_ht": self.restart_commit_ht,
            "yb_lsn_type": self.lsn_type,
            "current_ht": self.current_ht,
            "ack_lag_ms": self.ack_lag_ms,
        }


def slot_status(conn: Any, slot: str) -> YbSlotStatus | None:
    row = conn.execute(SLOT_STATUS_SQL, (slot,)).fetchone()
    if row is None:
        return None
    return YbSlotStatus(
        slot_name=row[0],
        plugin=row[1],
        slot_type=row[2],
        database=row[3],
        active=bool(row[4]),
        restart_lsn=None if row[5] is None else YbLsn(row[5]),
        confirmed_flush_lsn=None if row[6] is None else YbLsn(row[6]),
        stream_id=row[7],
        restart_commit_ht=row[8],
        lsn_type=row[9],
        current_ht=int(row[10]),
    )


def current_ht(conn: Any) -> YbLsn:
    """The current hybrid time: a ``HYBRID_TIME`` slot's LSN for a commit now."""
    return YbLsn(int(conn.execute("SELECT yb_get_current_hybrid_time_lsn()").fetchone()[0]))


def slot_problems(status: YbSlotStatus, database: str, lsn_type: str) -> list[str]:
    problems = []
    if status.slot_type != "logical" or status.plugin != PLUGIN:
        problems.append(
            f"replication slot {status.slot_name!r} uses plugin {status.plugin!r}; this capture needs a "
            f"logical slot with {PLUGIN!r}: pgoutput cannot stream tables with REPLICA IDENTITY CHANGE, "
            "YugabyteDB's default (the server's hint: \"Consider using output plugin yboutput instead\"). "
            "Use another slot name, or drop the slot if nothing else uses it."
        )
    if status.database is not None and status.database != database:
        problems.append(
            f"replication slot {status.slot_name!r} belongs to database {status.database!r}, not {database!r}"
        )
    if status.lsn_type is not None and status.lsn_type != lsn_type:
        problems.append(
            f"replication slot {status.slot_name!r} has LSN type {status.lsn_type}, the capture is configured "
            f"for {lsn_type}: set lsn_type={status.lsn_type!r}, or drop the slot and re-snapshot"
        )
    return problems


def require_slot(conn: Any, slot: str, database: str, lsn_type: str) -> YbSlotStatus:
    status = slot_status(conn, slot)
    if status is None:
        raise SlotMissingError(
            f"replication slot {slot!r} does not exist. The snapshot task creates it (snapshot_mode "
            "'initial', 'when_needed' or 'always'); if it existed before, it was dropped and changes since "
            "then are lost: re-snapshot (snapshot_mode='when_needed' or 'always')."
        )
    problems = slot_problems(status, database, lsn_type)
    if problems:
        raise SlotConfigurationError(problems[0])
    return status


#: The transaction a slot is created in (TestPgReplicationSlotSnapshotAction.java
#: ``createReplicationSlotUseSnapshot``; Debezium-YB PostgresReplicationConnection.java l.541-546 does
#: the same in its parallel snapshot mode).
SLOT_TRANSACTION = "BEGIN TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY"

#: How far ahead of a node's clock a slot's consistent time may be, at most, before the capture
#: gives up waiting for it (YugabyteDB's max_clock_skew_usec defaults to 500 ms).
MAX_READ_TIME_WAIT_S = 30.0


def create_slot(info: PgConnectionInfo, slot: str, lsn_type: str) -> tuple[YbSlotStatus, int, int]:
    """Create the slot over the replication protocol with ``USE_SNAPSHOT``, so YugabyteDB keeps the
    history a snapshot at its consistent point needs (``pg_create_logical_replication_slot``
    creates it without). Returns the slot, its consistent hybrid time and its consistent point (the
    slot's first LSN: what a ``SEQUENCE`` slot's stream starts from)."""
    from airflow_provider_cdc.cdc.sources.postgres.connection import connect

    with ReplicationConnection(info) as replication:
        # Inside a REPEATABLE READ transaction, as its first command: what YugabyteDB requires of
        # USE_SNAPSHOT with ysql_enable_pg_export_snapshot on (the default from v2025.2.2.0), and
        # harmless with it off (the checks are skipped). YB's own test does the same, as does
        # Debezium-YB in its parallel snapshot mode.
        creation = replication.create_slot(
            slot, plugin=PLUGIN, options=(lsn_type, "USE_SNAPSHOT"), transaction=SLOT_TRANSACTION
        )
    with connect(info) as conn:
        status = slot_status(conn, slot)
        if status is not None and status.restart_commit_ht:
            # The consistent time may be ahead of the clock: nothing may plan a window ending
            # before the slot's start, or read at it, until it has passed.
            wait_for_read_time(conn, status.restart_commit_ht)
    if status is None:
        raise SlotMissingError(f"replication slot {slot!r} was created but is not listed in pg_replication_slots")
    # The consistent point is the slot's restart commit time (snapshot_name holds it too, as a
    # hybrid time on some releases and as an exported snapshot id on others).
    point = status.restart_commit_ht
    if not point and creation.snapshot_name and creation.snapshot_name.isdigit():
        point = int(creation.snapshot_name)
    if not point:
        raise SlotConfigurationError(
            f"replication slot {slot!r} reports no consistent hybrid time (yb_restart_commit_ht); "
            "this YugabyteDB release cannot snapshot at the slot's start"
        )
    consistent = int(creation.consistent_point)
    if consistent == 0 and status.confirmed_flush_lsn is not None:
        # Early releases answer 0/0 ("instead of a NULL value"); the new slot's confirmed position
        # is where its stream starts (0/2 on the releases that answer it).
        consistent = int(status.confirmed_flush_lsn)
    return status, int(point), consistent


def drop_slot(conn: Any, slot: str, *, timeout: float = 120.0, poll: float = 1.0) -> bool:
    """Drop the slot, waiting out YugabyteDB's "active" window after its last reader
    (``ysql_cdc_active_replication_slot_window_ms``) for at most ``timeout`` seconds."""
    import psycopg

    deadline = time.monotonic() + timeout
    while True:
        if slot_status(conn, slot) is None:
            return False
        try:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            return True
        except psycopg.errors.ObjectInUse as exc:
            if time.monotonic() >= deadline:
                raise ConcurrentCaptureError(
                    f"replication slot {slot!r} stayed active for {timeout:.0f}s and cannot be dropped "
                    f"({str(exc).strip()}). YugabyteDB counts a slot active for "
                    "ysql_cdc_active_replication_slot_window_ms after its last read; if another consumer "
                    "reads it, stop that consumer."
                ) from None
            time.sleep(poll)


def read_time_statement(ht: int, procedure: str | None) -> Any:
    """``SET LOCAL yb_read_time TO '<ht> ht'`` (superuser), or ``CALL <procedure>('<ht> ht')`` for a
    role that may not set it (the ``SECURITY DEFINER`` route of docs/yugabytedb.md)."""
    from psycopg import sql

    if procedure is None:
        return sql.SQL("SET LOCAL yb_read_time TO {}").format(sql.Literal(ht_text(ht)))
    schema, _, name = procedure.rpartition(".")
    target = sql.Identifier(schema, name) if schema else sql.Identifier(name)
    return sql.SQL("CALL {}({})").format(target, sql.Literal(ht_text(ht)))


def wait_for_read_time(conn: Any, ht: int, *, timeout: float = MAX_READ_TIME_WAIT_S) -> None:
    """Wait until this node's clock has passed hybrid time ``ht``. A slot's consistent time is the
    upper bound of the cluster's clocks and may be up to ``max_clock_skew_usec`` ahead of the node
    a session is on; ``SET LOCAL yb_read_time`` to a time in the future fails (Debezium-YB sleeps 1 s
    for this, QueryingSnapshotter.java l.58-70; YB's tests, ``waitForSnapshotTimeToPass``)."""
    deadline = time.monotonic() + timeout
    while (ahead_us := ht_to_unix_us(ht) - ht_to_unix_us(int(current_ht(conn)))) >= 0:
        if time.monotonic() + ahead_us / 1e6 > deadline:
            raise CdcTransientError(
                f"the snapshot's hybrid time {ht} is {ahead_us / 1e6:.1f}s ahead of the server's clock, more than "
                f"the {timeout:.0f}s the capture waits: check the cluster's clock synchronization "
                "(max_clock_skew_usec)"
            )
        time.sleep(ahead_us / 1e6 + 0.001)


def enter_read_time(conn: Any, ht: int, procedure: str | None = None) -> None:
    """Begin a read-only transaction on ``conn`` that sees the database as of hybrid time ``ht``.

    As a superuser, also ``yb_disable_catalog_version_check`` (what ``ysql_dump`` sets to read the
    catalog as of a time; Debezium's YugabyteDB snapshot does the same)."""
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    if procedure is None:
        conn.execute("SET LOCAL yb_disable_catalog_version_check = true")
    conn.execute(read_time_statement(ht, procedure))


# -- the server ------------------------------------------------------------------------------------


def server_info(conn: Any, info: PgConnectionInfo) -> pg_admin.ServerInfo:
    """The server's facts; the system identifier comes from ``IDENTIFY_SYSTEM`` (YugabyteDB has no
    ``pg_control_system()``), and ``wal_level`` says whether the server has hybrid-time LSNs."""
    row = conn.execute(
        """
        SELECT current_setting('server_version_num')::int,
               CASE WHEN to_regproc('yb_get_current_hybrid_time_lsn') IS NULL THEN 'no hybrid-time LSNs'
                    ELSE 'logical' END,
               current_database(),
               pg_encoding_to_char(d.encoding),
               current_user,
               r.rolsuper,
               r.rolreplication
        FROM pg_database d, pg_roles r
        WHERE d.datname = current_database() AND r.rolname = current_user
        """
    ).fetchone()
    with ReplicationConnection(info) as replication:
        system_identifier, _ = replication.identify_system()
    version, wal_level, database, encoding, user, superuser, replication_role = row
    return pg_admin.ServerInfo(
        version, wal_level, system_identifier, database, encoding, user, superuser, replication_role, 1
    )


def check_server(info: pg_admin.ServerInfo) -> list[str]:
    problems = []
    if info.wal_level != "logical":
        problems.append(
            "this server has no yb_get_current_hybrid_time_lsn(): YugabyteDB logical replication with "
            "HYBRID_TIME slots needs v2024.2 or newer (and ysql_yb_enable_replication_commands / "
            "ysql_yb_allow_replication_slot_lsn_types on)"
        )
    if not (info.is_superuser or info.has_replication):
        role = pg_admin.sql_ident(info.user)
        problems.append(f"role {info.user!r} lacks the REPLICATION attribute: ALTER ROLE {role} REPLICATION")
    if info.encoding != "UTF8":
        problems.append(f"database encoding is {info.encoding}; change capture supports UTF8 databases only")
    return problems


# -- acknowledgement -------------------------------------------------------------------------------


def acknowledge(
    info: PgConnectionInfo, slot: str, publication: str, flush: int, *, timeout: float = 60.0
) -> int | None:
    """Confirm the slot up to commit position ``flush`` (every transaction committed at or before it
    landed). Returns the last commit acknowledged, or None when no unacknowledged transaction is at
    or before ``flush``.

    YugabyteDB persists a flush only for transactions streamed on the same connection, so this
    streams from the slot's confirmed position, reads only message headers, and confirms once it
    reaches a commit past ``flush`` (the window's fence guarantees one) or after ``timeout``
    seconds without one. A partial acknowledgement is safe: what is not acknowledged comes back
    and the next window skips it by its commit position."""
    last: int | None = None
    with ReplicationConnection(info) as replication, classified_stream_errors(slot):
        replication.start_logical(slot, 0, {"proto_version": "1", "publication_names": quote_ident(publication)})
        deadline = time.monotonic() + timeout
        for frame in replication.frames(idle_timeout=max(timeout, 1.0)):
            if time.monotonic() > deadline:
                break
            if isinstance(frame, Keepalive) or not isinstance(frame, XLogData):
                continue
            kind = frame.payload[:1]
            if kind == b"B":
                begin = decode_message(frame.payload)
                if not isinstance(begin, Begin):
                    raise DecodingError(f"a 'B' message decoded as {type(begin).__name__}")
                if begin.final_lsn > flush:
                    break
            elif kind == b"C":
                commit = decode_message(frame.payload)
                if not isinstance(commit, Commit):
                    raise DecodingError(f"a 'C' message decoded as {type(commit).__name__}")
                if commit.commit_lsn <= flush:
                    last = commit.commit_lsn
        if last is not None:
            # The flush is the window's end itself: every transaction committed at or before it
            # landed, and YugabyteDB restarts after the last one it covers.
            replication.confirm_flush(flush)
            # Give the walsender a keepalive round to process it before the connection closes.
            time.sleep(0.2)
    return last


# -- checks ----------------------------------------------------------------------------------------


def check_tables(conn: Any, tables: Sequence[TableInfo]) -> list[str]:
    """PostgreSQL's replica identity and privilege checks, plus YugabyteDB's primary-key rule."""
    problems = pg_admin.check_tables(conn, tables)
    for table in tables:
        if not table.has_primary_key and table.replica_identity != "n":
            problems.append(
                f"{table.ref} has no primary key: YugabyteDB streams changes of tables with a primary key "
                "(yb_cdcsdk_stream_tables_without_primary_key is off before v2026.1). Add a primary key"
            )
    return problems


# -- the capture lock ------------------------------------------------------------------------------


def lock_table_sql(ref: TableRef) -> str:
    return f"CREATE TABLE IF NOT EXISTS {pg_identifier(ref).as_string(None)} (capture text PRIMARY KEY)"


def take_capture_lock(conn: Any, capture: str, *, info: PgConnectionInfo, lock_table: TableRef) -> Any:
    """The capture lock: the advisory lock (cluster-wide from YugabyteDB v2025.1), or where advisory
    locks are not implemented, a row lock (``FOR UPDATE NOWAIT``) held by an open transaction on a
    session of its own. Returns that session (to close on release), or None for the advisory lock."""
    import psycopg

    from airflow_provider_cdc.cdc.sources.postgres.connection import connect

    try:
        pg_admin.try_capture_lock(conn, capture)
        return None
    except psycopg.errors.FeatureNotSupported:
        log.info("advisory locks are not available on this server; taking the capture lock as a row lock")
    holder = connect(info)
    try:
        if not table_exists(holder, lock_table):  # made by an administrator: no CREATE on its schema needed
            holder.execute(lock_table_sql(lock_table))
        holder.execute(
            f"INSERT INTO {pg_identifier(lock_table).as_string(None)} (capture) VALUES (%s) ON CONFLICT DO NOTHING",
            (capture,),
        )
        holder.execute("BEGIN")
        holder.execute(
            f"SELECT 1 FROM {pg_identifier(lock_table).as_string(None)} WHERE capture = %s FOR UPDATE NOWAIT",
            (capture,),
        )
    except psycopg.errors.LockNotAvailable:
        holder.close()
        raise ConcurrentCaptureError(
            f"capture {capture!r} is already running (its row in {lock_table} is locked). Only one run per "
            "capture may read the slot at a time: set max_active_runs=1 on the DAG"
        ) from None
    except BaseException:
        holder.close()
        raise
    return holder


@contextmanager
def locked_session(hook: Any, capture: str, lock_table: TableRef) -> Iterator[Any]:
    """A YSQL session of ``hook`` holding ``capture``'s lock for the block (both YugabyteDB
    captures' runs): released at the end, or with the session if it died."""
    with hook.session() as conn:
        holder = take_capture_lock(conn, capture, info=hook.connection_info, lock_table=lock_table)
        try:
            yield conn
        finally:
            if not conn.closed:
                release_capture_lock(conn, capture, holder)
            elif holder is not None:
                holder.close()


def release_capture_lock(conn: Any, capture: str, holder: Any) -> None:
    if holder is not None:
        holder.close()  # ends the transaction holding the row lock
    else:
        pg_admin.release_capture_lock(conn, capture)
