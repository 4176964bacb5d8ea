"""SQL Server's CDC catalog: the server, capture instances, tables, LSN functions, preflight checks.

Every statement here is T-SQL sent through pyodbc with ``?`` parameters; identifiers are quoted
with brackets (:data:`cdc.tables.SQLSERVER_NAMES`) and values are bound. What each check
reports names the fix (the ``sys.sp_cdc_*`` call or the grant), like the PostgreSQL preflight.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from airflow_provider_cdc.cdc.basics.errors import (
    CdcConfigurationError,
    ConcurrentCaptureError,
    ServerConfigurationError,
    UnknownTableError,
)
from airflow_provider_cdc.cdc.basics.tables import SQLSERVER_NAMES, TableRef, find_column, select_tables
from airflow_provider_cdc.cdc.planning.incremental import signal_columns_problem
from airflow_provider_cdc.cdc.sources.sqlserver.connection import error_number, server_said
from airflow_provider_cdc.cdc.sources.sqlserver.lsn import SqlServerLsn, lsn_or_none
from airflow_provider_cdc.cdc.sources.sqlserver.types import CATALOG_SQL, SqlServerType

#: ``sys.databases.snapshot_isolation_state``: 1 = ON (0 OFF, 2 turning off, 3 turning on).
SNAPSHOT_ISOLATION_ON = 1


@dataclass(frozen=True)
class ServerInfo:
    database: str
    #: None where the login cannot see its database's row of sys.database_recovery_status
    #: (VIEW ANY DATABASE revoked from public): the offset's identity is unknown then.
    database_guid: str | None
    server_name: str
    version: str
    cdc_enabled: bool
    snapshot_isolation: bool
    login: str = ""

    def require_guid(self) -> str:
        """The database's GUID, the offset's identity; fails where the login cannot read it."""
        if self.database_guid is None:
            raise ServerConfigurationError(_guid_hidden(self))
        return self.database_guid


def _guid_hidden(info: ServerInfo) -> str:
    return (
        f"the capture login {quote(info.login)} cannot see database {quote(info.database)} in "
        "sys.database_recovery_status, whose GUID identifies the capture's offset (Microsoft: a database other "
        "than master and tempdb shows there only to its owner or with VIEW ANY DATABASE, which public holds unless "
        f"it was revoked). Run, in master: GRANT VIEW ANY DATABASE TO {quote(info.login)};"
    )


@dataclass(frozen=True)
class SqlColumn:
    name: str
    type: SqlServerType

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.type.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SqlColumn:
        return cls(data["name"], SqlServerType.from_json(data["type"]))


@dataclass(frozen=True)
class CaptureInstance:
    """One capture instance of a table (``cdc.change_tables``): its name, where its change rows
    start (``start_lsn``, raised by the cleanup job) and the columns it captures, in order."""

    name: str
    table: TableRef
    start_lsn: SqlServerLsn | None
    object_id: int
    index_name: str | None
    columns: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "table": self.table.to_json(),
            "start_lsn": None if self.start_lsn is None else int(self.start_lsn),
            "object_id": self.object_id,
            "index_name": self.index_name,
            "columns": list(self.columns),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CaptureInstance:
        return cls(
            name=data["name"],
            table=TableRef(*data["table"]),
            start_lsn=lsn_or_none(data.get("start_lsn")),
            object_id=int(data["object_id"]),
            index_name=data.get("index_name"),
            columns=tuple(data["columns"]),
        )


@dataclass(frozen=True)
class TableInfo:
    """A captured table: its columns (as the table has them now), key and capture instances
    (oldest first: after a schema change the newer one takes over at its ``start_lsn``)."""

    ref: TableRef
    columns: tuple[SqlColumn, ...]
    key_columns: tuple[str, ...]
    instances: tuple[CaptureInstance, ...]

    def column(self, name: str) -> SqlColumn:
        return find_column(self.columns, name)

    def to_json(self) -> dict[str, Any]:
        return {
            "ref": self.ref.to_json(),
            "columns": [c.to_json() for c in self.columns],
            "key_columns": list(self.key_columns),
            "instances": [i.to_json() for i in self.instances],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TableInfo:
        return cls(
            ref=TableRef(*data["ref"]),
            columns=tuple(SqlColumn.from_json(c) for c in data["columns"]),
            key_columns=tuple(data["key_columns"]),
            instances=tuple(CaptureInstance.from_json(i) for i in data["instances"]),
        )


def quote(name: str) -> str:
    return SQLSERVER_NAMES.quote(name)


def rows(conn: Any, statement: str, *params: Any) -> list[tuple]:
    cursor = conn.cursor()
    try:
        cursor.execute(statement, *params)
        return [tuple(r) for r in cursor.fetchall()]
    finally:
        cursor.close()


def value(conn: Any, statement: str, *params: Any) -> Any:
    found = rows(conn, statement, *params)
    return found[0][0] if found else None


# -- server ------------------------------------------------------------------------------------

SERVER_SQL = (
    "SELECT DB_NAME(), @@SERVERNAME, CAST(SERVERPROPERTY('ProductVersion') AS nvarchar(128)), "
    "d.is_cdc_enabled, d.snapshot_isolation_state, "
    "(SELECT CAST(r.database_guid AS nvarchar(36)) FROM sys.database_recovery_status r "
    "WHERE r.database_id = DB_ID()), SUSER_SNAME() "
    "FROM sys.databases d WHERE d.database_id = DB_ID()"
)


def server_info(conn: Any) -> ServerInfo:
    database, server, version, cdc_enabled, isolation, guid, login = rows(conn, SERVER_SQL)[0]
    return ServerInfo(
        database=database,
        database_guid=None if guid is None else str(guid).upper(),
        login=str(login or ""),
        server_name=server or "",
        version=version or "",
        cdc_enabled=bool(cdc_enabled),
        snapshot_isolation=int(isolation or 0) == SNAPSHOT_ISOLATION_ON,
    )


def check_server(info: ServerInfo, *, needs_snapshot_isolation: bool) -> list[str]:
    problems = [] if info.database_guid is not None else [_guid_hidden(info)]
    if not info.cdc_enabled:
        problems.append(
            f"change data capture is not enabled on database {quote(info.database)}. Run, as a member of "
            f"sysadmin: USE {quote(info.database)}; EXEC sys.sp_cdc_enable_db;"
        )
    if needs_snapshot_isolation and not info.snapshot_isolation:
        problems.append(
            f"snapshot_isolation_mode='snapshot' needs snapshot isolation on database {quote(info.database)}. Run: "
            f"ALTER DATABASE {quote(info.database)} SET ALLOW_SNAPSHOT_ISOLATION ON; (or choose "
            "snapshot_isolation_mode='read_committed', see docs/sqlserver.md)"
        )
    return problems


AGENT_SQL = "SELECT status_desc FROM sys.dm_server_services WHERE servicename LIKE N'SQL Server Agent%'"


def agent_running(conn: Any) -> bool | None:
    """Is SQL Server Agent (which runs the capture job) running? None when not visible (the view
    needs VIEW SERVER STATE; Azure SQL Database has no Agent and runs capture itself)."""
    try:
        status = value(conn, AGENT_SQL)
    except Exception:
        return None
    return None if status is None else str(status).lower() == "running"


# -- tables and capture instances --------------------------------------------------------------

INSTANCES_SQL = (
    "SELECT s.name, t.name, ct.capture_instance, ct.start_lsn, ct.object_id, ct.index_name, ct.create_date "
    "FROM cdc.change_tables ct "
    "JOIN sys.tables t ON ct.source_object_id = t.object_id "
    "JOIN sys.schemas s ON t.schema_id = s.schema_id "
    "ORDER BY s.name, t.name, ct.create_date, ct.capture_instance"
)
#: Computed columns are always NULL in change rows (Learn, cdc.fn_cdc_get_all_changes_<capture_instance>):
#: not captured (types.CATALOG_SQL leaves them out of the table too).
CAPTURED_COLUMNS_SQL = (
    "SELECT column_name FROM cdc.captured_columns WHERE object_id = ? AND is_computed = 0 ORDER BY column_ordinal"
)
#: Every captured column, computed ones included: reading change data needs SELECT on all of them.
ALL_CAPTURED_COLUMNS_SQL = "SELECT column_name FROM cdc.captured_columns WHERE object_id = ? ORDER BY column_ordinal"
#: Change tables written before SQL Server added __$command_id (KB3030352: a cumulative update of
#: 2012-2016, applied to existing change tables by sp_vupgrade_replication) lack the column.
WITHOUT_COMMAND_ID_SQL = (
    "SELECT ct.capture_instance FROM cdc.change_tables ct WHERE NOT EXISTS (SELECT 1 FROM sys.columns c "
    "WHERE c.object_id = ct.object_id AND c.name = N'__$command_id') ORDER BY ct.capture_instance"
)
_KEY_COLUMNS = (
    "SELECT c.name FROM sys.indexes i "
    "JOIN sys.index_columns ic ON ic.object_id = i.object_id AND ic.index_id = i.index_id "
    "JOIN sys.columns c ON c.object_id = ic.object_id AND c.column_id = ic.column_id "
    "JOIN sys.tables t ON t.object_id = i.object_id JOIN sys.schemas s ON s.schema_id = t.schema_id "
    "WHERE s.name = ? AND t.name = ? AND ic.key_ordinal > 0 AND "
)
#: The primary key's columns; with @index_name, that unique index's (Debezium's rule).
PRIMARY_KEY_SQL = _KEY_COLUMNS + "i.is_primary_key = 1 ORDER BY ic.key_ordinal"
INDEX_KEY_SQL = _KEY_COLUMNS + "i.name = ? ORDER BY ic.key_ordinal"
#: User tables a pattern may match: not SQL Server's own, not CDC's (its change tables, and
#: dbo.systranschemas, which sp_cdc_enable_db creates: Debezium leaves it out by name,
#: SqlServerConnectorConfig.SystemTablesPredicate, as its is_ms_shipped flag is not documented).
TABLES_SQL = (
    "SELECT s.name, t.name FROM sys.tables t JOIN sys.schemas s ON s.schema_id = t.schema_id "
    "WHERE t.is_ms_shipped = 0 AND s.name <> N'cdc' AND t.name <> N'systranschemas'"
)


def capture_instances(conn: Any) -> dict[TableRef, list[CaptureInstance]]:
    """Every capture instance of the database, per table, oldest first: by ``start_lsn``, and by
    ``create_date`` where a cleanup raised both of a table's instances to one low water mark (as
    Debezium picks the newest: ``ORDER BY ct.create_date DESC`` in SqlServerConnection). Never by
    name: a new instance may be named anything."""
    out: dict[TableRef, list[tuple[tuple[Any, ...], CaptureInstance]]] = {}
    for schema, table, name, start_lsn, object_id, index_name, created in rows(conn, INSTANCES_SQL):
        ref = TableRef(schema, table)
        columns = tuple(r[0] for r in rows(conn, CAPTURED_COLUMNS_SQL, object_id))
        instance = CaptureInstance(name, ref, lsn_or_none(start_lsn), int(object_id), index_name, columns)
        out.setdefault(ref, []).append(((instance.start_lsn or 0, created), instance))
    return {ref: [i for _, i in sorted(found, key=lambda pair: pair[0])] for ref, found in out.items()}


def resolve_tables(
    conn: Any, explicit: Sequence[TableRef], include: Sequence[str] = (), exclude: Sequence[str] = ()
) -> tuple[TableRef, ...]:
    """The captured tables: ``explicit`` ones, or every user table matching ``include``, minus
    ``exclude`` matches (:func:`cdc.tables.select_tables`)."""
    return select_tables(
        explicit, lambda: [TableRef(s, t) for s, t in rows(conn, TABLES_SQL)], include, exclude, example="dbo\\.order.*"
    )


def table_columns(conn: Any, ref: TableRef) -> tuple[SqlColumn, ...]:
    return tuple(
        SqlColumn(name, SqlServerType(str(type_name).lower(), int(max_length), int(precision), int(scale)))
        for name, type_name, max_length, precision, scale, _nullable, _computed in rows(
            conn, CATALOG_SQL, ref.schema, ref.name
        )
    )


def describe_tables(
    conn: Any, refs: Sequence[TableRef], *, cdc_enabled: bool = True
) -> tuple[dict[TableRef, TableInfo], list[str]]:
    """The catalog description of each of ``refs``, and a problem (with its fix) for each that
    cannot be captured: missing (with the likely intended name), a view, no capture instance, no
    key, a key column the instance does not capture, a captured column missing. With
    ``cdc_enabled`` False (CDC is not enabled on the database, so there is no ``cdc`` schema) every
    existing table is reported as needing its capture instance, to be created after the database's."""
    try:
        instances = capture_instances(conn) if cdc_enabled else {}
    except Exception as exc:
        if error_number(exc) != 229:
            raise
        user = quote(str(value(conn, USER_SQL)))
        return {}, [
            f"the capture login (database user {user}) cannot read CDC's catalog (cdc.change_tables: "
            f"{server_said(exc)}), where the capture instances are listed. "
            f"Run: GRANT SELECT ON SCHEMA::[cdc] TO {user};"
        ]
    existing = {TableRef(s, t) for s, t in rows(conn, TABLES_SQL)}
    found: dict[TableRef, TableInfo] = {}
    problems: list[str] = []
    missing = [r for r in refs if r not in existing]
    if missing:
        problems.append(_missing_tables(conn, missing, existing))
    for ref in refs:
        if ref in missing:
            continue
        name = ref.quoted(SQLSERVER_NAMES)
        table_instances = tuple(instances.get(ref, ()))
        if not table_instances:
            problems.append(
                f"table {name} has no capture instance: CDC is not enabled on it. Run: {_enable_table(ref)}"
            )
            continue
        # Only columns some capture instance records (@captured_column_list): the others have no change
        # data, so events (the snapshot's too) leave them out, as Debezium does (docs/sqlserver-standin.md).
        captured = {c for instance in table_instances for c in instance.columns}
        source_columns = table_columns(conn, ref)
        columns = tuple(c for c in source_columns if c.name in captured)
        newest = table_instances[-1]
        index_name = newest.index_name
        key = tuple(
            r[0]
            for r in (
                rows(conn, INDEX_KEY_SQL, ref.schema, ref.name, index_name)
                if index_name
                else rows(conn, PRIMARY_KEY_SQL, ref.schema, ref.name)
            )
        )
        if not key:
            unique = [r[0] for r in rows(conn, UNIQUE_INDEXES_SQL, ref.schema, ref.name)]
            index = unique[0] if unique else "<a unique index>"
            problems.append(
                f"table {name} has no primary key and its capture instance {newest.name!r} names no unique index "
                f"(@index_name): change events need a key. Add a primary key (ALTER TABLE {name} ADD PRIMARY KEY "
                f"(<key columns>)), or re-create the capture instance on a unique index"
                f"{' (the table has ' + ', '.join(map(quote, unique)) + ')' if unique else ''}: "
                f"{_disable_table(ref, newest.name)} {_enable_table(ref, newest.name, index_name=index)}"
            )
            continue
        names = {c.name for c in source_columns}
        gone = [c for c in newest.columns if c not in names]
        if gone:
            problems.append(
                f"capture instance {newest.name!r} of {name} captures column(s) {', '.join(map(quote, gone))} "
                "the table no longer has. Create a capture instance for the table's current columns (at most two "
                f"per table; the capture switches to it): {_enable_table(ref, '<new instance name>')} Once this "
                f"capture has read past its start, drop the old one: {_disable_table(ref, newest.name)}"
            )
        uncaptured_keys = [k for k in key if k not in newest.columns]
        if uncaptured_keys:
            captured = [*newest.columns, *(k for k in uncaptured_keys if k in names)]
            problems.append(
                f"capture instance {newest.name!r} of {name} does not capture key column(s) "
                f"{', '.join(map(quote, uncaptured_keys))}: change events need the key. Re-create it with the key "
                f"in @captured_column_list: {_disable_table(ref, newest.name)} "
                + _enable_table(
                    ref, newest.name, index_name=index_name, captured_column_list=", ".join(map(quote, captured))
                )
            )
            continue
        found[ref] = TableInfo(ref, columns, key, table_instances)
    return found, problems


UNIQUE_INDEXES_SQL = (
    "SELECT i.name FROM sys.indexes i JOIN sys.tables t ON t.object_id = i.object_id "
    "JOIN sys.schemas s ON s.schema_id = t.schema_id "
    "WHERE s.name = ? AND t.name = ? AND i.is_unique = 1 AND i.is_primary_key = 0 ORDER BY i.name"
)
VIEWS_SQL = (
    "SELECT s.name, o.name FROM sys.objects o JOIN sys.schemas s ON s.schema_id = o.schema_id WHERE o.type = 'V'"
)


def _missing_tables(conn: Any, missing: Sequence[TableRef], existing: set[TableRef]) -> str:
    """The tables not found, each with what it probably is: a view, or a misspelt table."""
    views = {TableRef(s, t) for s, t in rows(conn, VIEWS_SQL)}
    described = []
    for ref in missing:
        text = ref.quoted(SQLSERVER_NAMES)
        if ref in views:
            text += " (a view: change data capture records tables only; capture the tables it reads instead)"
        else:
            guess = _closest(ref, existing)
            if guess is not None:
                text += f" (did you mean {guess.quoted(SQLSERVER_NAMES)}?)"
        described.append(text)
    return (
        f"these tables do not exist (or are not visible to the capture login): {', '.join(described)}. Check the "
        "spelling and the schema (a name without one is in dbo); quote names that contain dots or spaces with "
        "brackets: [my.schema].[my table]"
    )


def _closest(ref: TableRef, candidates: set[TableRef]) -> TableRef | None:
    """The existing table ``ref`` most likely meant: the same name in another case, else the
    closest spelling (as ``schema.table``), else the same name in another schema."""
    import difflib

    by_name = {c.data_collection.lower(): c for c in sorted(candidates)}
    wanted = ref.data_collection.lower()
    if wanted in by_name:
        return by_name[wanted]
    close = difflib.get_close_matches(wanted, list(by_name), n=1, cutoff=0.75)
    if close:
        return by_name[close[0]]
    same_name = sorted(c for c in candidates if c.name.lower() == ref.name.lower())
    return same_name[0] if len(same_name) == 1 else None


def _enable_table(
    ref: TableRef,
    capture_instance: str | None = None,
    *,
    index_name: str | None = None,
    captured_column_list: str | None = None,
) -> str:
    """The ``sys.sp_cdc_enable_table`` call that creates a capture instance of ``ref``."""
    arguments = [f"@source_schema = {_nstring(ref.schema)}", f"@source_name = {_nstring(ref.name)}"]
    if capture_instance is not None:
        arguments.append(f"@capture_instance = {_nstring(capture_instance)}")
    if index_name is not None:
        arguments.append(f"@index_name = {_nstring(index_name)}")
    if captured_column_list is not None:
        arguments.append(f"@captured_column_list = {_nstring(captured_column_list)}")
    arguments.append("@role_name = NULL")
    return f"EXEC sys.sp_cdc_enable_table {', '.join(arguments)};"


def _disable_table(ref: TableRef, capture_instance: str) -> str:
    return (
        f"EXEC sys.sp_cdc_disable_table @source_schema = {_nstring(ref.schema)}, @source_name = "
        f"{_nstring(ref.name)}, @capture_instance = {_nstring(capture_instance)};"
    )


def _nstring(text: str) -> str:
    return f"N'{_literal(text)}'"


#: The database user the capture login maps to (the grantee of the grants the checks name).
USER_SQL = "SELECT USER_NAME()"
ROLE_SQL = "SELECT role_name FROM cdc.change_tables WHERE capture_instance = ?"


def check_table_access(conn: Any, tables: Sequence[TableRef]) -> list[str]:
    """Can the capture login read each table (the snapshot does)? Error 229 otherwise, or 230 where
    SELECT was granted on some of its columns only (the snapshot reads them all)."""
    denied = []
    for ref in tables:
        try:
            rows(conn, f"SELECT TOP (0) * FROM {ref.quoted(SQLSERVER_NAMES)}")
        except Exception as exc:
            number = error_number(exc)
            if number == 208:  # no such table: reported by describe_tables
                continue
            if number not in (229, 230):
                raise
            denied.append(ref)
    if not denied:
        return []
    user = quote(str(value(conn, USER_SQL)))
    return [
        f"the capture login (database user {user}) cannot SELECT from {_names(denied)}, which the snapshot reads "
        f"(SQL Server error 229 or 230). Run: "
        + " ".join(f"GRANT SELECT ON {r.quoted(SQLSERVER_NAMES)} TO {user};" for r in denied)
    ]


def check_change_access(conn: Any, tables: Sequence[TableInfo]) -> list[str]:
    """Can the capture login read each capture instance's changes? SELECT on the change tables (the
    cdc schema; error 229 otherwise), and, for ``sys.fn_cdc_get_min_lsn`` and the change functions,
    SELECT on the source table's captured columns and membership of the gating role (the function
    returns 0x00 to a caller without them: :func:`instance_access_problem`)."""
    denied: list[tuple[str, str]] = []
    unauthorized: list[str] = []
    for table in tables:
        for instance in table.instances:
            try:
                rows(conn, f"SELECT TOP (0) __$start_lsn FROM cdc.{quote(instance.name + '_CT')}")
            except Exception as exc:
                if error_number(exc) != 229:
                    raise
                denied.append((instance.name, server_said(exc)))
            found = lsn_or_none(value(conn, MIN_LSN_SQL, instance.name))
            unreadable = found is None or int(found) == 0
            problem = instance_access_problem(conn, instance.name, table_denial_reported=True) if unreadable else None
            if problem is not None:
                unauthorized.append(problem)
    if not denied:
        return unauthorized
    user = quote(str(value(conn, USER_SQL)))
    roles = sorted({str(r) for name, _ in denied for r in [value(conn, ROLE_SQL, name)] if r})
    fix = f"GRANT SELECT ON SCHEMA::[cdc] TO {user};"
    if roles:
        fix += " " + " ".join(f"ALTER ROLE {quote(r)} ADD MEMBER {user};" for r in roles) + " (the gating role)"
    names = ", ".join(repr(name) for name, _ in denied)
    return [
        f"the capture login (database user {user}) cannot read the changes of capture instance(s) {names}: "
        f"{denied[0][1]}. Run: {fix}",
        *unauthorized,
    ]


def check_signal_table(conn: Any, table: TableInfo, watermarks: str) -> list[str]:
    """Debezium's signal table on SQL Server: columns ``id``, ``type``, ``data`` (in that order),
    CDC-enabled with a capture instance that captures them (signals and watermarks are read from
    its change table), and writable: the incremental snapshot writes its watermark rows into it."""
    name = table.ref.quoted(SQLSERVER_NAMES)
    example = f"CREATE TABLE {name} (id varchar(42) PRIMARY KEY, type varchar(32) NOT NULL, data varchar(2048))"
    problem = signal_columns_problem([c.name for c in table.columns], name, example)
    problems = [problem] if problem else []
    instance = table.instances[-1]  # describe_tables reports a table without one
    missing = [c for c in ("id", "type", "data") if c not in instance.columns]
    if missing:
        problems.append(
            f"capture instance {instance.name!r} of signal table {name} does not capture {', '.join(missing)}: "
            "enable it without a @captured_column_list (or with all three)"
        )
    needed = ["INSERT", "DELETE"] if watermarks == "insert_delete" else ["INSERT"]
    user = quote(str(value(conn, USER_SQL)))
    for permission in needed:
        if not value(conn, "SELECT HAS_PERMS_BY_NAME(?, 'OBJECT', ?)", name, permission):
            problems.append(
                f"the capture login (database user {user}) cannot {permission} into signal table {name}, where the "
                f"incremental snapshot writes its watermark rows. Run: GRANT {permission} ON {name} TO {user};"
            )
    return problems


def check_agent(conn: Any) -> list[str]:
    running = agent_running(conn)
    if running is False:
        return [
            "SQL Server Agent is not running: the capture job that fills the change tables runs under it, so no "
            "change would arrive. Start the SQL Server Agent service (and the capture job: "
            "EXEC sys.sp_cdc_start_job @job_type = N'capture';)"
        ]
    return []


def _names(refs: Sequence[TableRef]) -> str:
    return ", ".join(r.quoted(SQLSERVER_NAMES) for r in refs)


def _literal(text: str) -> str:
    return text.replace("'", "''")


# -- LSNs ----------------------------------------------------------------------------------------


def max_lsn(conn: Any) -> SqlServerLsn | None:
    """``sys.fn_cdc_get_max_lsn()``: the newest commit the capture job has processed."""
    return lsn_or_none(value(conn, "SELECT sys.fn_cdc_get_max_lsn()"))


def min_lsn(conn: Any, instance: str) -> SqlServerLsn | None:
    """``sys.fn_cdc_get_min_lsn``: the oldest change an instance still holds (None: no such instance).

    The function returns 0x00 both for an instance that does not exist and for a caller not
    authorized to read its changes (Microsoft's page for it, Remarks): the second is told apart
    with ``cdc.change_tables`` and fails with the grants to add, never taken for "disabled"."""
    found = lsn_or_none(value(conn, MIN_LSN_SQL, instance))
    if found is not None and int(found) != 0:
        return found
    problem = instance_access_problem(conn, instance)
    if problem is not None:
        raise ServerConfigurationError(problem)
    return None


MIN_LSN_SQL = "SELECT sys.fn_cdc_get_min_lsn(?)"
#: LEFT JOINs: SQL Server shows a table in sys.tables only to a login with some permission on it
#: (metadata visibility), and the instance exists whether the login sees its table or not.
INSTANCE_SOURCE_SQL = (
    "SELECT ct.role_name, s.name, t.name, ct.object_id FROM cdc.change_tables ct "
    "LEFT JOIN sys.tables t ON t.object_id = ct.source_object_id LEFT JOIN sys.schemas s ON s.schema_id = t.schema_id "
    "WHERE ct.capture_instance = ?"
)
IS_MEMBER_SQL = "SELECT IS_MEMBER(?)"
COLUMN_SELECT_SQL = "SELECT HAS_PERMS_BY_NAME(?, 'OBJECT', 'SELECT', ?, 'COLUMN')"
TABLE_SELECT_SQL = "SELECT HAS_PERMS_BY_NAME(?, 'OBJECT', 'SELECT')"


def instance_access_problem(conn: Any, instance: str, *, table_denial_reported: bool = False) -> str | None:
    """Why the capture login may not read ``instance``'s changes, with the grants that fix it; None
    when it may, or when the instance does not exist. Reading change data needs SELECT on every
    captured column of the source table and, with a gating role, membership of it (sysadmin and
    db_owner need neither): Microsoft's pages for ``sys.fn_cdc_get_min_lsn`` and
    ``cdc.fn_cdc_get_all_changes_<capture_instance>``, Permissions. With ``table_denial_reported``
    (the preflight's :func:`check_table_access` names ``GRANT SELECT`` on a table the login cannot
    read at all) that grant is not repeated here."""
    user = quote(str(value(conn, USER_SQL)))
    try:
        listed = rows(conn, INSTANCE_SOURCE_SQL, instance)
    except Exception as exc:
        if error_number(exc) != 229:
            raise
        return (
            f"the capture login (database user {user}) cannot read cdc.change_tables, so it cannot tell whether "
            f"capture instance {instance!r} exists ({server_said(exc)}). Run: GRANT SELECT ON SCHEMA::[cdc] TO {user};"
        )
    if not listed:
        return None
    role, schema, table, object_id = listed[0]
    fixes = []
    if role and value(conn, IS_MEMBER_SQL, str(role)) != 1:
        fixes.append(f"ALTER ROLE {quote(str(role))} ADD MEMBER {user}; (the instance's gating role)")
    if table is None:  # no permission on the table at all: SQL Server hides it from the login
        fixes.append(f"GRANT SELECT ON <the source table of {instance!r}> TO {user}; (the login cannot see the table)")
        return _not_authorized(user, instance, f"its source table (invisible to {user})", fixes)
    source = f"{quote(str(schema))}.{quote(str(table))}"
    columns = [str(r[0]) for r in rows(conn, ALL_CAPTURED_COLUMNS_SQL, object_id)]
    denied = [c for c in columns if value(conn, COLUMN_SELECT_SQL, source, c) != 1]
    if denied and table_denial_reported and value(conn, TABLE_SELECT_SQL, source) != 1:
        denied = []  # the table's own GRANT SELECT is in the preflight already
    if denied:
        fixes.append(
            f"GRANT SELECT ON {source} TO {user}; (or SELECT on its captured columns {', '.join(map(quote, denied))})"
        )
    if not fixes:
        return None
    return _not_authorized(user, instance, source, fixes)


def _not_authorized(user: str, instance: str, source: str, fixes: list[str]) -> str:
    return (
        f"the capture login (database user {user}) is not authorized to read the changes of capture instance "
        f"{instance!r} of {source} (sys.fn_cdc_get_min_lsn returns 0x00 for it, as for an instance that does not "
        f"exist; the instance exists): reading change data needs SELECT on every captured column of the source "
        f"table (computed ones included) and membership of the instance's gating role. Run: {' '.join(fixes)}"
    )


def check_command_ids(conn: Any, tables: Sequence[TableInfo]) -> list[str]:
    """Every instance's change table has ``__$command_id``: both query modes order by it."""
    names = {i.name for t in tables for i in t.instances}
    lacking = [str(r[0]) for r in rows(conn, WITHOUT_COMMAND_ID_SQL) if str(r[0]) in names]
    if not lacking:
        return []
    return [
        f"the change table(s) of capture instance(s) {', '.join(map(repr, lacking))} have no __$command_id column, "
        "which orders the changes inside a transaction (Microsoft: __$seqval must not be used for that). SQL Server "
        "added it in a cumulative update of 2012, 2014 and 2016 (KB3030352) and adds it to existing change tables "
        "through sp_vupgrade_replication, which does not run on an Always On secondary or without the replication "
        "components. Apply that update, then run, as sysadmin: EXEC sp_vupgrade_replication;"
    ]


MAP_OPERATORS = (
    "largest less than",
    "largest less than or equal",
    "smallest greater than",
    "smallest greater than or equal",
)


def map_time_to_lsn(conn: Any, operator: str, when: datetime) -> SqlServerLsn | None:
    """``sys.fn_cdc_map_time_to_lsn``: commits by their ``tran_end_time`` (server local time)."""
    if operator not in MAP_OPERATORS:
        raise CdcConfigurationError(f"relational operator {operator!r} is not one of {', '.join(MAP_OPERATORS)}")
    found = lsn_or_none(value(conn, "SELECT sys.fn_cdc_map_time_to_lsn(?, ?)", operator, when))
    return None if found is None or int(found) == 0 else found


def lsn_times(conn: Any, low: SqlServerLsn, high: SqlServerLsn) -> dict[int, tuple[datetime, bytes | None]]:
    """Commit time and transaction id of every commit in ``[low, high]`` (``cdc.lsn_time_mapping``)."""
    return {
        int(SqlServerLsn(start)): (end_time, tran_id)
        for start, end_time, tran_id in rows(
            conn,
            "SELECT start_lsn, tran_end_time, tran_id FROM cdc.lsn_time_mapping "
            "WHERE start_lsn >= ? AND start_lsn <= ? ORDER BY start_lsn",
            low.to_bytes(),
            high.to_bytes(),
        )
    }


# -- the capture lock ----------------------------------------------------------------------------

#: sp_getapplock's return code: >= 0 granted (0 at once, 1 after waiting), < 0 not (-1 timed out, -2
#: cancelled, -3 deadlock victim, -999 call error): learn.microsoft.com/en-us/sql/relational-databases/
#: system-stored-procedures/sp-getapplock-transact-sql, "Return code values". SET NOCOUNT ON keeps row
#: counts (of the procedure's own statements too) from arriving as results before the SELECT; it is set
#: back to SQL Server's default (OFF) before the SELECT, so the session is left as it was.
LOCK_SQL = (
    "SET NOCOUNT ON; "
    "DECLARE @result int; "
    "EXEC @result = sys.sp_getapplock @Resource = ?, @LockMode = N'Exclusive', @LockOwner = N'Session', "
    "@LockTimeout = 0; "
    "SET NOCOUNT OFF; "
    "SELECT @result AS lock_result"
)
UNLOCK_SQL = "EXEC sys.sp_releaseapplock @Resource = ?, @LockOwner = N'Session'"


def lock_resource(capture: str) -> str:
    digest = hashlib.blake2b(capture.encode(), digest_size=8).hexdigest()
    return f"airflow-provider-cdc:{digest}"


def try_capture_lock(conn: Any, capture: str) -> None:
    """Take the capture's application lock (``sp_getapplock``, owned by the session) or fail at once."""
    found = first_result(conn, LOCK_SQL, lock_resource(capture))[1]
    result = found[0][0] if found else None
    if result is None or int(result) < 0:
        raise ConcurrentCaptureError(
            f"capture {capture!r} is already running in another session (it holds the SQL Server application lock "
            f"{lock_resource(capture)!r}). Only one run per capture may read at a time: set max_active_runs=1 on "
            "the DAG, and wait for the other run to finish."
        )


def first_result(conn: Any, batch: str, *params: Any) -> tuple[list[str], list[tuple]]:
    """The column names and rows of a batch's (or a procedure's) first result with columns: results
    without columns (row counts a server or driver still sends) are skipped with ``nextset``."""
    cursor = conn.cursor()
    try:
        cursor.execute(batch, *params)
        while cursor.description is None:
            if not cursor.nextset():
                return [], []
        return [d[0] for d in cursor.description], [tuple(r) for r in cursor.fetchall()]
    finally:
        cursor.close()


def release_capture_lock(conn: Any, capture: str) -> None:
    rows_affected = conn.cursor()
    try:
        rows_affected.execute(UNLOCK_SQL, lock_resource(capture))
    finally:
        rows_affected.close()


def require_tables(found: dict[TableRef, TableInfo], refs: Sequence[TableRef], problems: list[str]) -> None:
    """Raise the problems describing ``refs`` found (used where no preflight collected them)."""
    if problems:
        raise UnknownTableError("; ".join(problems))
    missing = [r for r in refs if r not in found]
    if missing:
        raise UnknownTableError(f"tables not found: {_names(missing)}")
