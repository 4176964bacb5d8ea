"""SQL Server's CDC administration: the server and its Agent, access checks (tables, change
tables, signal table, command ids), the LSN functions, the capture lock (applock). The captured
tables and their capture instances are in :mod:`.tables`, the statement helpers in
:mod:`.connection`; both are also at this path, where the captures and hooks call them.

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
from airflow_provider_cdc.cdc.basics.tables import SQLSERVER_NAMES, TableRef
from airflow_provider_cdc.cdc.planning.incremental import signal_columns_problem
from airflow_provider_cdc.cdc.sources.sqlserver.connection import (
    USER_SQL as USER_SQL,
)
from airflow_provider_cdc.cdc.sources.sqlserver.connection import error_number, server_said
from airflow_provider_cdc.cdc.sources.sqlserver.connection import (
    quote as quote,
)
from airflow_provider_cdc.cdc.sources.sqlserver.connection import (
    rows as rows,
)
from airflow_provider_cdc.cdc.sources.sqlserver.connection import (
    value as value,
)
from airflow_provider_cdc.cdc.sources.sqlserver.lsn import SqlServerLsn, lsn_or_none
from airflow_provider_cdc.cdc.sources.sqlserver.tables import ALL_CAPTURED_COLUMNS_SQL, WITHOUT_COMMAND_ID_SQL
from airflow_provider_cdc.cdc.sources.sqlserver.tables import (
    CAPTURED_COLUMNS_SQL as CAPTURED_COLUMNS_SQL,
)
from airflow_provider_cdc.cdc.sources.sqlserver.tables import (
    CaptureInstance as CaptureInstance,
)
from airflow_provider_cdc.cdc.sources.sqlserver.tables import (
    SqlColumn as SqlColumn,
)
from airflow_provider_cdc.cdc.sources.sqlserver.tables import (
    TableInfo as TableInfo,
)
from airflow_provider_cdc.cdc.sources.sqlserver.tables import (
    capture_instances as capture_instances,
)
from airflow_provider_cdc.cdc.sources.sqlserver.tables import (
    describe_tables as describe_tables,
)
from airflow_provider_cdc.cdc.sources.sqlserver.tables import (
    resolve_tables as resolve_tables,
)
from airflow_provider_cdc.cdc.sources.sqlserver.tables import (
    table_columns as table_columns,
)

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
