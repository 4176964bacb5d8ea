"""The replication slot: its status, created or required, released, acknowledged (advanced), dropped;
the server's current WAL position and the heartbeat query that moves it.

Every function takes an open psycopg connection (autocommit) and returns plain values.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from airflow_provider_cdc.cdc.basics.errors import (
    CdcConfigurationError,
    ConcurrentCaptureError,
    SlotConfigurationError,
    SlotMissingError,
)
from airflow_provider_cdc.cdc.sources.postgres.lsn import Lsn, lsn_or_none

PLUGIN = "pgoutput"


@dataclass(frozen=True)
class SlotStatus:
    slot_name: str
    plugin: str | None
    slot_type: str
    database: str | None
    temporary: bool
    active: bool
    active_pid: int | None
    restart_lsn: Lsn | None
    confirmed_flush_lsn: Lsn | None
    wal_status: str | None
    safe_wal_size: int | None
    current_lsn: Lsn

    @property
    def pending_bytes(self) -> int | None:
        """WAL written since the last acknowledgement (an upper bound for pending changes)."""
        if self.confirmed_flush_lsn is None:
            return None
        return max(0, self.current_lsn - self.confirmed_flush_lsn)

    @property
    def retained_bytes(self) -> int | None:
        """WAL the server keeps for this slot."""
        if self.restart_lsn is None:
            return None
        return max(0, self.current_lsn - self.restart_lsn)

    @property
    def wal_lost(self) -> bool:
        return self.wal_status == "lost"

    def to_dict(self) -> dict:
        return {
            "slot_name": self.slot_name,
            "plugin": self.plugin,
            "active": self.active,
            "active_pid": self.active_pid,
            "restart_lsn": _text(self.restart_lsn),
            "confirmed_flush_lsn": _text(self.confirmed_flush_lsn),
            "wal_status": self.wal_status,
            "safe_wal_size": self.safe_wal_size,
            "current_lsn": str(self.current_lsn),
            "pending_bytes": self.pending_bytes,
            "retained_bytes": self.retained_bytes,
        }


def current_lsn(conn) -> Lsn:
    """The current WAL insert position: always a record boundary, so no record straddles it."""
    return Lsn(conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0])


SLOT_STATUS_SQL = """
    SELECT s.slot_name::text, s.plugin::text, s.slot_type, s.database::text, s.temporary, s.active,
           s.active_pid, s.restart_lsn::text, s.confirmed_flush_lsn::text, s.wal_status,
           s.safe_wal_size, pg_current_wal_insert_lsn()::text
    FROM pg_replication_slots s WHERE s.slot_name = %s
"""


#: Captured changes (Insert, Update, Delete, Truncate messages) among the next transactions.
PEEK_CHANGES_SQL = """
    SELECT count(*) FROM pg_logical_slot_peek_binary_changes(
        %s, NULL, %s, 'proto_version', '1', 'publication_names', %s)
    WHERE get_byte(data, 0) IN (73, 85, 68, 84)
"""


def slot_status(conn, slot: str) -> SlotStatus | None:
    row = conn.execute(SLOT_STATUS_SQL, (slot,)).fetchone()
    return None if row is None else slot_status_from_row(row)


def slot_status_from_row(row: Sequence) -> SlotStatus:
    return SlotStatus(
        slot_name=row[0],
        plugin=row[1],
        slot_type=row[2],
        database=row[3],
        temporary=row[4],
        active=row[5],
        active_pid=row[6],
        restart_lsn=lsn_or_none(row[7]),
        confirmed_flush_lsn=lsn_or_none(row[8]),
        wal_status=row[9],
        safe_wal_size=row[10],
        current_lsn=Lsn(row[11]),
    )


def require_slot(conn, slot: str, database: str) -> SlotStatus:
    status = slot_status(conn, slot)
    if status is None:
        raise SlotMissingError(
            f"replication slot {slot!r} does not exist. Run the setup task (CdcSetupOperator) "
            "to create it; if it existed before, it was dropped and changes since then are lost: "
            "re-snapshot (snapshot_mode='when_needed' or 'always')."
        )
    verify_slot(status, database)
    return status


def wait_for_slot_release(conn, slot: str, *, timeout: float = 30.0, poll: float = 0.2) -> SlotStatus | None:
    """Wait until no process streams from ``slot`` (or ``timeout`` passes), then return its status.

    Called with the capture lock held, so an active slot means either the walsender of a run
    that just died (the server notices a vanished client within moments) or a consumer outside
    this capture. The first clears itself; the second is named in the error.
    """
    deadline = time.monotonic() + timeout
    while True:
        status = slot_status(conn, slot)
        if status is None or not status.active:
            return status
        if time.monotonic() >= deadline:
            holder = conn.execute(
                "SELECT application_name, host(client_addr), backend_start, usename::text "
                "FROM pg_stat_activity WHERE pid = %s",
                (status.active_pid,),
            ).fetchone()
            who = (
                f"pid {status.active_pid} ({holder[0] or 'unknown application'}, role {holder[3]!r}, from "
                f"{holder[1] or 'local socket'}, connected since {holder[2]:%Y-%m-%d %H:%M:%S})"
                if holder
                else f"pid {status.active_pid}"
            )
            raise ConcurrentCaptureError(
                f"replication slot {slot!r} is being read by {who}, outside this capture's lock, for "
                f"more than {timeout:.0f}s. Another consumer (a second DAG with the same slot_name, "
                "pg_recvlogical, a replication client) is using the slot; stop it, or give this capture "
                "its own slot."
            )
        time.sleep(poll)


def verify_slot(status: SlotStatus, database: str) -> None:
    problems = slot_problems(status, database)
    if problems:
        raise SlotConfigurationError(problems[0])


def slot_problems(status: SlotStatus, database: str) -> list[str]:
    """Why an existing slot cannot serve this capture (wrong plugin or type, another database)."""
    problems = []
    if status.slot_type != "logical" or status.plugin != PLUGIN:
        problems.append(
            f"replication slot {status.slot_name!r} uses plugin {status.plugin!r} "
            f"({status.slot_type}); this capture needs a logical slot with {PLUGIN!r}. Use another "
            "slot name, or drop the slot if nothing else uses it."
        )
    if status.database != database:
        problems.append(
            f"replication slot {status.slot_name!r} belongs to database {status.database!r}, "
            f"not {database!r}; slots are per database: choose another slot name"
        )
    return problems


def ensure_slot(conn, slot: str, database: str) -> tuple[SlotStatus, bool]:
    """Create the logical slot if missing; verify it if present. Returns (status, created)."""
    status = slot_status(conn, slot)
    if status is not None:
        verify_slot(status, database)
        return status, False
    conn.execute("SELECT pg_create_logical_replication_slot(%s, %s)", (slot, PLUGIN))
    created = slot_status(conn, slot)
    if created is None:
        raise SlotMissingError(f"replication slot {slot!r} was created but is not in pg_replication_slots")
    return created, True


def drop_slot(conn, slot: str) -> bool:
    status = slot_status(conn, slot)
    if status is None:
        return False
    conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    return True


def run_heartbeat(conn, query: str) -> None:
    """Run the user's heartbeat action query in its own transaction (its effects are captured)."""
    import psycopg

    from airflow_provider_cdc.cdc.sources.postgres.connection import first_line

    try:
        with conn.transaction():
            conn.execute(query)
    except psycopg.OperationalError:
        raise
    except psycopg.Error as exc:
        hint = (
            " (the capture's sessions run with search_path = pg_catalog, pg_temp: name tables and your own "
            "functions with their schema, e.g. public.heartbeat)"
            if isinstance(exc, psycopg.errors.UndefinedTable | psycopg.errors.UndefinedFunction)
            else ""
        )
        raise CdcConfigurationError(
            f"heartbeat_action_query failed: {first_line(exc)}{hint}. Fix the query (it runs as the capture's "
            "role in the captured database before each window) or remove it."
        ) from None


def advance_slot(conn, slot: str, lsn: Lsn, *, release_timeout: float = 10.0) -> Lsn:
    """Acknowledge the slot up to ``lsn`` (never backwards). Returns the confirmed position.

    Right after a window's job closed its replication connection, the server may still show the
    slot active while its walsender exits (seconds on a loaded machine): wait for that first."""
    status = slot_status(conn, slot)
    if status is not None and status.active:
        status = wait_for_slot_release(conn, slot, timeout=release_timeout)
    if status is None:
        raise SlotMissingError(f"replication slot {slot!r} disappeared before it could be acknowledged")
    confirmed = status.confirmed_flush_lsn
    if confirmed is not None and confirmed >= lsn:
        return confirmed
    conn.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (slot, str(lsn)))
    after = slot_status(conn, slot)
    if after is None or after.confirmed_flush_lsn is None:
        raise SlotMissingError(f"replication slot {slot!r} was dropped while it was being advanced")
    if after.confirmed_flush_lsn < lsn:
        # pg_replication_slot_advance stops at the flushed WAL position; the target was flushed
        # when the window was read, so this only happens if the target was never flushed.
        raise SlotConfigurationError(f"slot {slot!r} could only be advanced to {after.confirmed_flush_lsn}, not {lsn}")
    return after.confirmed_flush_lsn


def _text(lsn: Lsn | None) -> str | None:
    return None if lsn is None else str(lsn)
