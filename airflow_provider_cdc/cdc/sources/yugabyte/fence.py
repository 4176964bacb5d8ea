"""The window's fence: a row written to the heartbeat table at the window's end, so the window
ends on a change the slot will stream (YugabyteDB's slot has no position to stop at otherwise),
and found again in the stream.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from airflow_provider_cdc.cdc.basics.errors import (
    CdcConfigurationError,
    CdcTransientError,
    DecodingError,
)
from airflow_provider_cdc.cdc.sources.postgres.connection import PgConnectionInfo
from airflow_provider_cdc.cdc.sources.postgres.decoder import Begin, decode_message
from airflow_provider_cdc.cdc.sources.postgres.replication import (
    ReplicationConnection,
    XLogData,
)
from airflow_provider_cdc.cdc.sources.postgres.tables import TableRef, pg_identifier, quote_ident
from airflow_provider_cdc.cdc.sources.yugabyte.stream_errors import classified_stream_errors

log = logging.getLogger(__name__)


def heartbeat_table_sql(ref: TableRef) -> str:
    return (
        f"CREATE TABLE IF NOT EXISTS {pg_identifier(ref).as_string(None)} "
        "(capture text PRIMARY KEY, window_id text NOT NULL, written_at timestamptz NOT NULL DEFAULT now())"
    )


def ensure_heartbeat_table(conn: Any, ref: TableRef) -> None:
    """Create the heartbeat table unless it exists. An administrator may have created (and
    published) it: the capture role then needs SELECT, INSERT and UPDATE on it and no CREATE on its
    schema, which ``CREATE TABLE IF NOT EXISTS`` would check even for an existing table."""
    if not table_exists(conn, ref):
        conn.execute(heartbeat_table_sql(ref))


def table_exists(conn: Any, ref: TableRef) -> bool:
    """Whether ``ref`` exists, from the catalog (no privilege on its schema needed to ask)."""
    return (
        conn.execute(
            "SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s",
            (ref.schema, ref.name),
        ).fetchone()
        is not None
    )


def write_fence(conn: Any, ref: TableRef, capture: str, window_id: str) -> None:
    """Commit one row to the heartbeat table after the window's end was read: its commit comes later,
    so the window's reader sees a commit past the end and stops (the walsender never says it has
    caught up). The heartbeat table is published but not captured: its rows are never events."""
    import psycopg
    from psycopg import sql

    statement = sql.SQL(
        "INSERT INTO {} (capture, window_id, written_at) VALUES (%s, %s, now()) "
        "ON CONFLICT (capture) DO UPDATE SET window_id = EXCLUDED.window_id, written_at = EXCLUDED.written_at"
    ).format(pg_identifier(ref))
    try:
        with conn.transaction():
            conn.execute(statement, (capture, window_id))
    except psycopg.OperationalError:
        raise
    except psycopg.Error as exc:
        raise CdcConfigurationError(
            f"cannot write the window's fence row into heartbeat table {ref}: {str(exc).strip()}. Run the setup "
            f"task (it creates the table and publishes it), or GRANT SELECT, INSERT, UPDATE ON {ref} to the capture "
            "role (the upsert reads its key)"
        ) from None


def find_fence(
    info: PgConnectionInfo,
    slot: str,
    publication: str,
    start: int,
    heartbeat: TableRef,
    window_id: str,
    *,
    timeout: float = 120.0,
) -> int:
    """The commit LSN of the transaction that wrote ``window_id``'s fence row: where a window of a
    ``SEQUENCE`` slot ends (its LSNs are counters, so the end is found by reading up to the fence,
    headers and the heartbeat table's rows only)."""
    from airflow_provider_cdc.cdc.sources.postgres.decoder import Insert, Relation, Update

    fence_oid: int | None = None
    window_column: int | None = None
    begin: int | None = None
    deadline = time.monotonic() + timeout
    wanted = window_id.encode()
    with ReplicationConnection(info) as replication, classified_stream_errors(slot):
        replication.start_logical(slot, start, {"proto_version": "1", "publication_names": quote_ident(publication)})
        for frame in replication.frames(idle_timeout=max(timeout, 1.0)):
            if time.monotonic() > deadline:
                break
            if not isinstance(frame, XLogData) or not frame.payload:
                continue
            kind = frame.payload[:1]
            if kind == b"B":
                message = decode_message(frame.payload)
                if not isinstance(message, Begin):
                    raise DecodingError(f"a 'B' message decoded as {type(message).__name__}")
                begin = message.final_lsn
            elif kind == b"R":
                relation = decode_message(frame.payload)
                if not isinstance(relation, Relation):
                    raise DecodingError(f"an 'R' message decoded as {type(relation).__name__}")
                if (relation.namespace, relation.name) == (heartbeat.schema, heartbeat.name):
                    fence_oid = relation.oid
                    names = [c.name for c in relation.columns]
                    window_column = names.index("window_id") if "window_id" in names else None
            elif kind in (b"I", b"U") and fence_oid is not None and window_column is not None:
                change = decode_message(frame.payload)
                if not isinstance(change, (Insert, Update)):
                    raise DecodingError(f"an {kind!r} message decoded as {type(change).__name__}")
                if change.relation_oid == fence_oid and change.new[window_column] == wanted:
                    if begin is None:
                        raise DecodingError("a heartbeat change arrived before its transaction's Begin")
                    return begin
    raise CdcTransientError(
        f"the fence row of window {window_id} did not arrive on slot {slot!r} within {timeout:.0f}s; "
        "a retry plans the window again"
    )
