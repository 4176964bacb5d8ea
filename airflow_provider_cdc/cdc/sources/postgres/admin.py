"""Slot and publication administration, preflight checks and slot status (plain SQL).

Every function takes an open psycopg connection (autocommit) and returns plain values. The
Airflow hook wraps these; the engine calls them directly. Identifiers always go through
``psycopg.sql.Identifier``; values are bound parameters.
"""

from __future__ import annotations

import difflib
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from psycopg import sql

from airflow_provider_cdc.cdc.basics.errors import (
    CdcConfigurationError,
    ConcurrentCaptureError,
    PublicationError,
    SlotConfigurationError,
    SlotMissingError,
    UnknownTableError,
)
from airflow_provider_cdc.cdc.basics.tables import select_tables
from airflow_provider_cdc.cdc.planning.incremental import signal_columns_problem
from airflow_provider_cdc.cdc.sources.postgres import PUBLICATION_MODES
from airflow_provider_cdc.cdc.sources.postgres.attached_code import (
    signal_table_write_problems,
    unsafe_signal_table_message,
)
from airflow_provider_cdc.cdc.sources.postgres.lsn import Lsn, lsn_or_none
from airflow_provider_cdc.cdc.sources.postgres.tables import (
    REPLICA_IDENTITY_NAMES,
    Column,
    TableInfo,
    TableRef,
    pg_identifier,
)
from airflow_provider_cdc.cdc.sources.postgres.types import resolve_types

PLUGIN = "pgoutput"
MIN_SERVER_VERSION = 140000  # pgoutput 'messages' option and streaming-safe protocol v1
GENERATED_COLUMNS_VERSION = 120000  # pg_attribute.attgenerated
_RELKINDS = {"v": "view", "m": "materialized view", "f": "foreign table", "S": "sequence", "c": "composite type"}


@dataclass(frozen=True)
class ServerInfo:
    version_num: int
    wal_level: str
    system_identifier: str
    database: str
    encoding: str
    user: str
    is_superuser: bool
    has_replication: bool
    max_replication_slots: int


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


def server_info(conn) -> ServerInfo:
    row = conn.execute(
        """
        SELECT current_setting('server_version_num')::int,
               current_setting('wal_level'),
               (SELECT system_identifier::text FROM pg_control_system()),
               current_database(),
               pg_encoding_to_char(d.encoding),
               current_user,
               r.rolsuper,
               r.rolreplication,
               current_setting('max_replication_slots')::int
        FROM pg_database d, pg_roles r
        WHERE d.datname = current_database() AND r.rolname = current_user
        """
    ).fetchone()
    return ServerInfo(*row)


def check_server(info: ServerInfo) -> list[str]:
    """Problems that make logical decoding impossible on this server, as actionable messages."""
    problems = []
    if info.version_num < MIN_SERVER_VERSION:
        problems.append(f"PostgreSQL {info.version_num // 10000} is too old: logical capture needs 14 or newer")
    if info.wal_level != "logical":
        problems.append(
            f"wal_level is '{info.wal_level}', it must be 'logical': set wal_level = logical in "
            "postgresql.conf (or rds.logical_replication = 1 on RDS) and restart the server"
        )
    if not (info.is_superuser or info.has_replication):
        problems.append(
            f"role {info.user!r} lacks the REPLICATION attribute: ALTER ROLE {sql_ident(info.user)} REPLICATION"
        )
    if info.encoding != "UTF8":
        problems.append(f"database encoding is {info.encoding}; change capture supports UTF8 databases only")
    if info.max_replication_slots < 1:
        problems.append("max_replication_slots is 0: raise it and restart the server")
    return problems


def describe_tables(conn, refs: Sequence[TableRef], *, kinds: str = "rp") -> dict[TableRef, TableInfo]:
    """Catalog description of each table; raises :class:`UnknownTableError` naming the missing.

    ``kinds``: the accepted ``pg_class.relkind`` values (query extraction also reads views)."""
    if not refs:
        raise CdcConfigurationError("no tables to capture")
    described, problems = find_tables(conn, refs, kinds=kinds)
    if problems:
        error, message = problems[0]
        raise error(message)
    return described


def find_tables(
    conn, refs: Sequence[TableRef], *, kinds: str = "rp"
) -> tuple[dict[TableRef, TableInfo], list[tuple[type[CdcConfigurationError], str]]]:
    """The catalog description of each of ``refs`` that exists and is of an accepted kind, and a
    problem (error class, message) for the missing ones and one for relations of another kind."""
    if not refs:
        return {}, []
    rows = conn.execute(
        """
        SELECT c.oid, n.nspname, c.relname, c.relkind, c.relreplident
        FROM unnest(%s::text[], %s::text[]) AS w(s, t)
        JOIN pg_namespace n ON n.nspname = w.s
        JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = w.t
        """,
        ([r.schema for r in refs], [r.name for r in refs]),
    ).fetchall()
    found = {TableRef(nsp, rel): (oid, kind, ident) for oid, nsp, rel, kind, ident in rows}
    problems: list[tuple[type[CdcConfigurationError], str]] = []
    missing = [r for r in refs if r not in found]
    if missing:
        problems.append((UnknownTableError, _missing_tables_message(conn, missing)))
    not_tables = [
        f"{r} (a {_RELKINDS.get(found[r][1], 'relation')})" for r in refs if r in found and found[r][1] not in kinds
    ]
    if not_tables and kinds != "rp":
        problems.append((CdcConfigurationError, f"these relations cannot be read: {', '.join(not_tables)}"))
    elif not_tables:
        problems.append(
            (
                CdcConfigurationError,
                f"only ordinary and partitioned tables can be captured; these are not: {', '.join(not_tables)}. "
                "Capture the underlying tables instead",
            )
        )
    refs = [r for r in refs if r in found and found[r][1] in kinds]
    if not refs:
        return {}, problems
    oids = [found[r][0] for r in refs]
    # generated columns (never replicated) exist from PostgreSQL 12; YugabyteDB 2024.2 and earlier
    # are PostgreSQL 11.2 underneath, whose pg_attribute has no attgenerated
    not_generated = "AND a.attgenerated = ''" if has_generated_columns(conn) else ""
    attributes = conn.execute(
        f"""
        SELECT a.attrelid, a.attname, a.atttypid::int8, a.atttypmod
        FROM pg_attribute a
        WHERE a.attrelid = ANY(%s) AND a.attnum > 0 AND NOT a.attisdropped {not_generated}
        ORDER BY a.attrelid, a.attnum
        """,
        (oids,),
    ).fetchall()
    types = resolve_types(conn, sorted({(type_oid, typmod) for _, _, type_oid, typmod in attributes}))
    columns: dict[int, list[Column]] = {oid: [] for oid in oids}
    for relid, name, type_oid, typmod in attributes:
        columns[relid].append(Column(name, types[(type_oid, typmod)]))
    keys: dict[int, dict[str, list[str]]] = {oid: {} for oid in oids}
    for relid, is_primary, names in conn.execute(
        """
        SELECT i.indrelid, i.indisprimary,
               array(SELECT a.attname
                     FROM unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
                     JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
                     ORDER BY k.ord)
        FROM pg_index i
        WHERE i.indrelid = ANY(%s) AND (i.indisprimary OR i.indisreplident)
        """,
        (oids,),
    ):
        keys[relid]["primary" if is_primary else "identity"] = list(names)
    out = {}
    for ref in refs:
        oid, _kind, ident = found[ref]
        key = keys[oid].get("primary") or keys[oid].get("identity") or []
        out[ref] = TableInfo(
            ref=ref,
            oid=oid,
            columns=tuple(columns[oid]),
            key_columns=tuple(key),
            replica_identity=ident,
            has_primary_key="primary" in keys[oid],
        )
    return out, problems


def has_generated_columns(conn) -> bool:
    """Whether the server's catalog has ``pg_attribute.attgenerated`` (PostgreSQL 12+). The version
    is the one the server reported at connection (``11.2-YB-2024.2...`` on YugabyteDB's PG11 line);
    a connection that does not say is taken as a current server."""
    version = getattr(getattr(conn, "info", None), "server_version", None)
    return not isinstance(version, int) or version == 0 or version >= GENERATED_COLUMNS_VERSION


def resolve_tables(
    conn, explicit: Sequence[TableRef], include: Sequence[str] = (), exclude: Sequence[str] = ()
) -> tuple[TableRef, ...]:
    """The captured tables: ``explicit`` ones, or every table of the catalog matching ``include``,
    minus ``exclude`` matches (:func:`cdc.tables.select_tables`)."""

    def catalog() -> list[TableRef]:
        return [
            TableRef(s, t)
            for s, t in conn.execute(
                """
                SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
                  AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%%'
                """
            )
        ]

    return select_tables(explicit, catalog, include, exclude, example="public\\.order.*")


def check_tables(conn, tables: Iterable[TableInfo]) -> list[str]:
    """Replica identity and privilege problems of captured tables."""
    problems = []
    tables = list(tables)
    for table in tables:
        ident = REPLICA_IDENTITY_NAMES.get(table.replica_identity, table.replica_identity)
        if table.replica_identity == "n":
            problems.append(
                f"{table.ref} has REPLICA IDENTITY NOTHING: updates and deletes cannot be captured "
                f"(and fail on the source once published). Run: ALTER TABLE {table.ref} REPLICA IDENTITY "
                "DEFAULT (with a primary key) or FULL"
            )
        elif table.replica_identity == "d" and not table.has_primary_key:
            problems.append(
                f"{table.ref} has no primary key and REPLICA IDENTITY {ident}: updates and deletes "
                f"cannot be captured. Add a primary key, or run: ALTER TABLE {table.ref} REPLICA IDENTITY FULL"
            )
        elif table.replica_identity == "i" and not table.key_columns:
            problems.append(f"{table.ref} uses REPLICA IDENTITY USING INDEX but the index is gone")
    if tables:
        role = sql_ident(conn.execute("SELECT current_user").fetchone()[0])
        for (schema,) in conn.execute(
            "SELECT DISTINCT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.oid = ANY(%s) AND NOT has_schema_privilege(n.oid, 'USAGE') ORDER BY 1",
            ([t.oid for t in tables],),
        ).fetchall():
            schema = sql_ident(schema)
            problems.append(f"the capture role cannot use schema {schema}: GRANT USAGE ON SCHEMA {schema} TO {role}")
        denied = conn.execute(
            "SELECT t FROM unnest(%s::oid[], %s::text[]) AS x(o, t) WHERE NOT has_table_privilege(o, 'SELECT')",
            ([t.oid for t in tables], [str(t.ref) for t in tables]),
        ).fetchall()
        for (name,) in denied:
            problems.append(f"the capture role cannot SELECT from {name}: GRANT SELECT ON {name} TO {role}")
        problems += row_security_problems(conn, tables)
    return problems


#: Captured tables whose row level security applies to the capture role: not a superuser, no
#: BYPASSRLS, and not (a member of) the table's owner, or the owner under FORCE ROW LEVEL SECURITY.
_ROW_SECURITY_SQL = """
SELECT w.name, c.relforcerowsecurity AND pg_has_role(c.relowner, 'USAGE'),
       array(SELECT p.polname::text FROM pg_policy p WHERE p.polrelid = c.oid ORDER BY 1)
FROM unnest(%s::oid[], %s::text[]) AS w(o, name)
JOIN pg_class c ON c.oid = w.o
WHERE c.relrowsecurity
  AND NOT (SELECT r.rolsuper OR r.rolbypassrls FROM pg_roles r WHERE r.rolname = current_user)
  AND (c.relforcerowsecurity OR NOT pg_has_role(c.relowner, 'USAGE'))
"""


def row_security_problems(conn, tables: Sequence[TableInfo]) -> list[str]:
    """Captured tables that row level security policies apply to, for the capture role: its sessions
    run with ``row_security = off``, so reading them fails (rather than running a policy's expression
    as the capture role, and leaving out the rows it hides)."""
    if not tables:
        return []
    role = sql_ident(conn.execute("SELECT current_user").fetchone()[0])
    problems = []
    for name, forced_owner, policies in conn.execute(
        _ROW_SECURITY_SQL, ([t.oid for t in tables], [str(t.ref) for t in tables])
    ).fetchall():
        named = f" (policies {', '.join(sql_ident(p) for p in policies)})" if policies else " (no policy: no row shown)"
        fix = (
            f"ALTER TABLE {name} NO FORCE ROW LEVEL SECURITY (the capture role owns it)"
            if forced_owner
            else f"have a superuser run ALTER ROLE {role} BYPASSRLS, or the table's owner "
            f"ALTER TABLE {name} DISABLE ROW LEVEL SECURITY"
        )
        problems.append(
            f"{name} has row level security enabled{named}, and it applies to the capture role: a policy would "
            "leave rows out of the snapshot and run its expression as the capture role, so the capture refuses to "
            f"read the table (its sessions run with row_security = off). The capture reads every row of a captured "
            f"table (logical decoding does anyway): {fix}"
        )
    return problems


def check_signal_table(conn, table: TableInfo, watermarks: str) -> list[str]:
    """Debezium's signal table: columns ``id``, ``type``, ``data`` (in that order), readable, and
    writable when the incremental snapshot writes its watermark rows into it."""
    example = f"CREATE TABLE {table.ref} (id varchar(64) PRIMARY KEY, type varchar(32) NOT NULL, data varchar(2048))"
    problem = signal_columns_problem([c.name for c in table.columns], str(table.ref), example)
    problems = [problem] if problem else []
    role = sql_ident(conn.execute("SELECT current_user").fetchone()[0])
    needed = {"message": ["SELECT"], "insert_insert": ["SELECT", "INSERT"]}.get(
        watermarks, ["SELECT", "INSERT", "DELETE"]
    )
    for privilege in needed:
        if not conn.execute("SELECT has_table_privilege(%s, %s)", (table.oid, privilege)).fetchone()[0]:
            problems.append(
                f"the capture role cannot {privilege} on signal table {table.ref}: "
                f"GRANT {privilege} ON {table.ref} TO {role}"
            )
    if watermarks != "message":  # the capture writes watermark rows: nothing may run as it there
        code = signal_table_write_problems(conn, table.ref)
        if code:
            problems.append(unsafe_signal_table_message(table.ref, watermarks, code))
    return problems


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
            f"replication slot {slot!r} does not exist. Run the setup task (PostgresCdcSetupOperator) "
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


def drop_publication(conn, name: str) -> bool:
    if publication_tables(conn, name) is None:
        return False
    conn.execute(f"DROP PUBLICATION {sql_ident(name)}")
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


def publication_tables(conn, name: str) -> tuple[bool, set[TableRef], dict[str, bool]] | None:
    """(all_tables, tables, publish flags) of a publication, or None if it does not exist."""
    row = conn.execute(
        "SELECT puballtables, pubinsert, pubupdate, pubdelete, pubtruncate FROM pg_publication WHERE pubname = %s",
        (name,),
    ).fetchone()
    if row is None:
        return None
    tables = {
        TableRef(s, t)
        for s, t in conn.execute(
            "SELECT schemaname::text, tablename::text FROM pg_publication_tables WHERE pubname = %s", (name,)
        )
    }
    flags = {"insert": row[1], "update": row[2], "delete": row[3], "truncate": row[4]}
    return row[0], tables, flags


def ensure_publication(conn, name: str, refs: Sequence[TableRef], mode: str = "filtered") -> str:
    """Create or verify the publication; returns what was done ('created', 'altered', 'verified').

    ``filtered`` creates ``FOR TABLE <captured>`` and adds missing captured tables to an existing
    publication; ``all_tables`` creates ``FOR ALL TABLES``; ``disabled`` never changes anything.
    """
    if mode not in PUBLICATION_MODES:
        raise CdcConfigurationError(
            f"publication_autocreate_mode {mode!r} is not one of {', '.join(PUBLICATION_MODES)}"
        )
    existing = publication_tables(conn, name)
    if existing is None:
        if mode == "disabled":
            raise PublicationError(_absent_publication(name, refs))
        _require_publication_privileges(conn, name, refs, mode, create=True)
        if mode == "all_tables":
            conn.execute(sql.SQL("CREATE PUBLICATION {} FOR ALL TABLES").format(sql.Identifier(name)))
        else:
            conn.execute(
                sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
                    sql.Identifier(name), sql.SQL(", ").join(pg_identifier(r) for r in refs)
                )
            )
        return "created"
    all_tables, tables, _flags = existing
    missing = [r for r in refs if not all_tables and r not in tables]
    if missing and mode == "filtered":
        _require_publication_privileges(conn, name, missing, mode, create=False)
        conn.execute(
            sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(
                sql.Identifier(name), sql.SQL(", ").join(pg_identifier(r) for r in missing)
            )
        )
        return "altered"
    verify_publication(conn, name, refs)
    return "verified"


def verify_publication(conn, name: str, refs: Sequence[TableRef]) -> None:
    existing = publication_tables(conn, name)
    if existing is None:
        raise PublicationError(f"publication {name!r} does not exist; run the setup task to create it")
    all_tables, tables, flags = existing
    missing = [r for r in refs if not all_tables and r not in tables]
    if missing:
        raise PublicationError(_tables_not_published(name, missing))
    off = [op for op in ("insert", "update", "delete") if not flags[op]]
    if off:
        raise PublicationError(_operations_not_published(name, off))


def publication_problems(conn, name: str, refs: Sequence[TableRef], mode: str = "filtered") -> list[str]:
    """What :func:`ensure_publication` would refuse, found without changing anything: a missing
    publication it may not create, tables it may not (or must not) add, operations not published."""
    existing = publication_tables(conn, name)
    if existing is None:
        if mode == "disabled":
            return [_absent_publication(name, refs)]
        problem = _publication_privilege_problem(conn, name, refs, mode, create=True)
        return [problem] if problem else []
    all_tables, tables, flags = existing
    problems = []
    missing = [r for r in refs if not all_tables and r not in tables]
    if missing and mode == "filtered":
        problem = _publication_privilege_problem(conn, name, missing, mode, create=False)
        problems += [problem] if problem else []
    elif missing:
        problems.append(_tables_not_published(name, missing))
    off = [op for op in ("insert", "update", "delete") if not flags[op]]
    if off:
        problems.append(_operations_not_published(name, off))
    return problems


def _absent_publication(name: str, refs: Sequence[TableRef]) -> str:
    return (
        f"publication {name!r} does not exist and publication_autocreate_mode is 'disabled'. "
        f"Create it: CREATE PUBLICATION {sql_ident(name)} FOR TABLE {', '.join(str(r) for r in refs)}"
    )


def _tables_not_published(name: str, missing: Sequence[TableRef]) -> str:
    tables = ", ".join(str(r) for r in missing)
    return (
        f"publication {name!r} does not contain {tables}; changes to them would be silently missed. "
        f"Run: ALTER PUBLICATION {sql_ident(name)} ADD TABLE {tables}"
    )


def _operations_not_published(name: str, off: Sequence[str]) -> str:
    return (
        f"publication {name!r} does not publish {', '.join(off)}; those changes would be missed. "
        f"Run: ALTER PUBLICATION {sql_ident(name)} SET (publish = 'insert, update, delete, truncate')"
    )


def _require_publication_privileges(conn, name: str, refs: Sequence[TableRef], mode: str, *, create: bool) -> None:
    """Fail naming the statements to run when the role may not create (or add tables to) the publication."""
    problem = _publication_privilege_problem(conn, name, refs, mode, create=create)
    if problem:
        raise PublicationError(problem)


def _publication_privilege_problem(conn, name: str, refs: Sequence[TableRef], mode: str, *, create: bool) -> str | None:
    """The statements to run when the role may not create (or add tables to) the publication."""
    user, database, superuser, can_create, owns_publication = conn.execute(
        "SELECT current_user, current_database(), r.rolsuper, has_database_privilege(current_database(), 'CREATE'), "
        "(SELECT pg_has_role(p.pubowner, 'USAGE') FROM pg_publication p WHERE p.pubname = %s) "
        "FROM pg_roles r WHERE r.rolname = current_user",
        (name,),
    ).fetchone()
    if superuser:
        return None
    role, tables = sql_ident(user), ", ".join(str(r) for r in refs)
    if create and mode == "all_tables":
        needs, fixes = "FOR ALL TABLES needs a superuser", []
        statement = f"CREATE PUBLICATION {sql_ident(name)} FOR ALL TABLES"
    else:
        not_owned = conn.execute(
            "SELECT w.s, w.t FROM unnest(%s::text[], %s::text[]) AS w(s, t) JOIN pg_namespace n ON n.nspname = w.s "
            "JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = w.t WHERE NOT pg_has_role(c.relowner, 'USAGE')",
            ([r.schema for r in refs], [r.name for r in refs]),
        ).fetchall()
        fixes = [f"ALTER TABLE {TableRef(s, t)} OWNER TO {role}" for s, t in not_owned]
        if create:
            needs = "CREATE PUBLICATION ... FOR TABLE needs CREATE on the database and ownership of every table"
            fixes[:0] = [] if can_create else [f"GRANT CREATE ON DATABASE {sql_ident(database)} TO {role}"]
            statement = f"CREATE PUBLICATION {sql_ident(name)} FOR TABLE {tables}"
        else:
            needs = "ALTER PUBLICATION ... ADD TABLE needs ownership of the publication and of the tables"
            fixes[:0] = [] if owns_publication else [f"ALTER PUBLICATION {sql_ident(name)} OWNER TO {role}"]
            statement = f"ALTER PUBLICATION {sql_ident(name)} ADD TABLE {tables}"
        if not fixes:
            return None
    return (
        f"role {user!r} may not {'create' if create else 'alter'} publication {name!r} ({needs}). "
        + (f"Run: {'; '.join(fixes)}. Or have" if fixes else "Have")
        + f" an administrator run: {statement}; and set publication_autocreate_mode='disabled'"
    )


def try_capture_lock(conn, capture: str) -> None:
    """Take the session-level advisory lock of a capture, or fail fast naming the holder."""
    key = _lock_key(capture)
    if conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()[0]:
        return
    holder = conn.execute(
        """
        SELECT a.pid, a.application_name, host(a.client_addr), a.backend_start
        FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
        WHERE l.locktype = 'advisory' AND l.granted
          AND l.objsubid = 1 AND ((l.classid::bigint << 32) | l.objid::bigint) = %s::bigint
        """,
        (key,),
    ).fetchone()
    who = (
        f"pid {holder[0]} ({holder[1] or 'unknown application'}, from {holder[2] or 'local socket'}, "
        f"connected since {holder[3]:%Y-%m-%d %H:%M:%S})"
        if holder
        else "another session"
    )
    raise ConcurrentCaptureError(
        f"capture {capture!r} is already running in {who}. Only one run per capture may read the "
        "slot at a time: set max_active_runs=1 on the DAG, and wait for the other run to finish."
    )


def release_capture_lock(conn, capture: str) -> None:
    conn.execute("SELECT pg_advisory_unlock(%s)", (_lock_key(capture),))


def sql_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _lock_key(capture: str) -> int:
    import hashlib

    digest = hashlib.blake2b(f"airflow-provider-cdc:{capture}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _missing_tables_message(conn, missing: list[TableRef]) -> str:
    known = [
        TableRef(s, t)
        for s, t in conn.execute(
            """
            SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema')
              AND n.nspname NOT LIKE 'pg_toast%%'
            """
        )
    ]
    names = {r.data_collection: r for r in known}
    parts = []
    for ref in missing:
        close = difflib.get_close_matches(ref.data_collection, list(names), n=3, cutoff=0.6)
        hint = f" (did you mean {', '.join(str(names[c]) for c in close)}?)" if close else ""
        parts.append(f"{ref}{hint}")
    return (
        f"table(s) not found or not visible to the capture role: {'; '.join(parts)}. "
        "Names follow PostgreSQL rules: unquoted parts are lower-cased, quote mixed-case names "
        '(\'"Sales"."Orders"\').'
    )


def _text(lsn: Lsn | None) -> str | None:
    return None if lsn is None else str(lsn)
