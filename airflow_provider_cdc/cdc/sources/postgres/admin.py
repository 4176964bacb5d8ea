"""The source's administration (plain SQL): the server's checks, the captured tables found and
checked, the signal table, row security, the capture lock; and, at this one path, the slot's
(:mod:`.slots`) and the publication's (:mod:`.publications`) functions, which the hooks, the
captures and DAG authors (docs/operators.md) call as ``admin.ensure_slot`` and so on.

Every function takes an open psycopg connection (autocommit) and returns plain values. The
Airflow hook wraps these; the engine calls them directly. Identifiers always go through
``psycopg.sql.Identifier``; values are bound parameters.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from airflow_provider_cdc.cdc.basics.errors import (
    CdcConfigurationError,
    ConcurrentCaptureError,
    UnknownTableError,
)
from airflow_provider_cdc.cdc.basics.tables import select_tables
from airflow_provider_cdc.cdc.planning.incremental import signal_columns_problem
from airflow_provider_cdc.cdc.sources.postgres.attached_code import (
    signal_table_write_problems,
    unsafe_signal_table_message,
)
from airflow_provider_cdc.cdc.sources.postgres.publications import (
    drop_publication as drop_publication,
)
from airflow_provider_cdc.cdc.sources.postgres.publications import (
    ensure_publication as ensure_publication,
)
from airflow_provider_cdc.cdc.sources.postgres.publications import (
    publication_problems as publication_problems,
)
from airflow_provider_cdc.cdc.sources.postgres.publications import (
    publication_tables as publication_tables,
)
from airflow_provider_cdc.cdc.sources.postgres.publications import (
    verify_publication as verify_publication,
)
from airflow_provider_cdc.cdc.sources.postgres.slots import (
    PEEK_CHANGES_SQL as PEEK_CHANGES_SQL,
)
from airflow_provider_cdc.cdc.sources.postgres.slots import (
    PLUGIN as PLUGIN,
)
from airflow_provider_cdc.cdc.sources.postgres.slots import (
    SLOT_STATUS_SQL as SLOT_STATUS_SQL,
)
from airflow_provider_cdc.cdc.sources.postgres.slots import (
    SlotStatus as SlotStatus,
)
from airflow_provider_cdc.cdc.sources.postgres.slots import (
    advance_slot as advance_slot,
)
from airflow_provider_cdc.cdc.sources.postgres.slots import (
    current_lsn as current_lsn,
)
from airflow_provider_cdc.cdc.sources.postgres.slots import (
    drop_slot as drop_slot,
)
from airflow_provider_cdc.cdc.sources.postgres.slots import (
    ensure_slot as ensure_slot,
)
from airflow_provider_cdc.cdc.sources.postgres.slots import (
    require_slot as require_slot,
)
from airflow_provider_cdc.cdc.sources.postgres.slots import (
    run_heartbeat as run_heartbeat,
)
from airflow_provider_cdc.cdc.sources.postgres.slots import (
    slot_problems as slot_problems,
)
from airflow_provider_cdc.cdc.sources.postgres.slots import (
    slot_status as slot_status,
)
from airflow_provider_cdc.cdc.sources.postgres.slots import (
    slot_status_from_row as slot_status_from_row,
)
from airflow_provider_cdc.cdc.sources.postgres.slots import (
    verify_slot as verify_slot,
)
from airflow_provider_cdc.cdc.sources.postgres.slots import (
    wait_for_slot_release as wait_for_slot_release,
)
from airflow_provider_cdc.cdc.sources.postgres.tables import (
    REPLICA_IDENTITY_NAMES,
    Column,
    TableInfo,
    TableRef,
    sql_ident,
)
from airflow_provider_cdc.cdc.sources.postgres.types import resolve_types

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
