"""SqlServerStandIn: the object product tests use to get an emulated SQL Server (tests only).

A PostgreSQL database holding the emulated CDC surface (catalog.sql), a capture job
(capture.py), and a T-SQL proxy (proxy.py) that psqlODBC connects to, as the ODBC driver
``ODBC_DRIVER`` the tests register (tests/support/odbc.py). Product code gets
``connection_string`` and calls ``pyodbc.connect`` on it like on SQL Server.
"""

from __future__ import annotations

import hashlib
import threading
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg

from .. import odbc
from ..odbc import ODBC_DRIVER
from . import capture
from . import types as sstypes
from .proxy import TsqlProxy
from .statements import StatementRecorder

if TYPE_CHECKING:  # any object with host, port, superuser, password, dsn(), connect(), create_database()
    from airflow_provider_cdc.testing.postgres_cluster import PostgresCluster

CATALOG_SQL = Path(__file__).with_name("catalog.sql")
CLOCK_SQL = Path(__file__).with_name("clock.sql")  # the server's zone and clock (settable)


class SqlServerStandIn:
    """An emulated SQL Server database with CDC, reached through pyodbc + psqlODBC + the proxy."""

    def __init__(
        self,
        cluster: PostgresCluster,
        database: str = "standin",
        *,
        server_name: str = "STANDIN",
        capture_lag: float = 0.0,
        poll_interval: float = 0.1,
        recorder: StatementRecorder | None = None,
        time_zone: str = "UTC",
        azure_sql_database: bool = False,
    ):
        """``time_zone``: the server operating system's zone (an IANA name), in which its clock
        functions and the capture job's ``cdc.lsn_time_mapping`` times are local (clock.sql)."""
        self.cluster = cluster
        # Azure SQL Database: no names into other databases (msdb.dbo.cdc_jobs fails with 40515).
        self.azure_sql_database = azure_sql_database
        self._time_zone = time_zone
        self.database = database
        self.server_name = server_name
        self.recorder = recorder if recorder is not None else StatementRecorder()
        self._capture_lag = capture_lag
        self._poll_interval = poll_interval
        self._admin: psycopg.Connection | None = None
        self._admin_lock = threading.Lock()
        self._columns: dict[tuple[str, str], dict[str, sstypes.ColumnType]] = {}
        self.proxy: TsqlProxy | None = None
        self.capture: capture.CaptureJob | None = None
        self._odbc = None

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> SqlServerStandIn:
        # The driver's entry (tests/conftest.py installs it at import; here for callers outside pytest,
        # which must still do it before their first ODBC use: check() says so).
        odbc.install()
        odbc.check()
        self.cluster.create_database(self.database)
        self._admin = psycopg.connect(self.cluster.dsn(self.database), autocommit=True)
        install(self._admin, self.server_name)
        self.set_time_zone(self._time_zone)
        self.capture = capture.CaptureJob(
            self.cluster.dsn(self.database), lag=self._capture_lag, poll_interval=self._poll_interval
        ).start()
        self.proxy = TsqlProxy(
            self.cluster.host,
            self.cluster.port,
            self.database,
            recorder=self.recorder,
            resolver=self._resolve,
            snapshot_allowed=self._snapshot_allowed,
            azure_sql_database=self.azure_sql_database,
        ).start()
        return self

    def stop(self, drop: bool = True) -> None:
        if self._odbc is not None:
            try:
                self._odbc.close()
            except Exception:
                pass
            self._odbc = None
        if self.capture is not None:
            self.capture.stop()
        if self.proxy is not None:
            self.proxy.stop()
        if self._admin is not None:
            capture.drop_slot(self._admin)
            self._admin.close()
            self._admin = None
        if drop:
            with self.cluster.connect() as conn:
                gating = []
                try:  # gating roles sp_cdc_enable_table created (catalog.sql: standin.created_roles)
                    with psycopg.connect(self.cluster.dsn(self.database), autocommit=True) as db:
                        gating = [r for (r,) in db.execute("SELECT role_name FROM standin.created_roles").fetchall()]
                except psycopg.Error:
                    pass
                conn.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
                for role in gating:
                    conn.execute(f'DROP ROLE IF EXISTS "{role}"')
                # the roles behind GRANT ... ON SCHEMA:: (catalog.sql, standin.schema_permission)
                prefix = "ssg_" + hashlib.md5(self.database.encode()).hexdigest()[:8] + "_"
                for (role,) in conn.execute(
                    "SELECT rolname FROM pg_roles WHERE starts_with(rolname, %s)", (prefix,)
                ).fetchall():
                    conn.execute(f'DROP ROLE IF EXISTS "{role}"')

    def __enter__(self) -> SqlServerStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- how the product reaches it -----------------------------------------------------------

    @property
    def driver(self) -> str:
        return ODBC_DRIVER

    def connection_string(self, user: str | None = None, password: str | None = None) -> str:
        """An ODBC connection string for ``pyodbc.connect``, pointing at the proxy. The driver's
        settings are its odbcinst.ini entry's (tests/support/odbc.py), so its name goes unbraced:
        psqlODBC looks the entry up under the value as written, braces included."""
        assert self.proxy is not None, "start() first"
        return (
            f"DRIVER={ODBC_DRIVER};SERVER=127.0.0.1;PORT={self.proxy.port};DATABASE={self.database};"
            f"UID={user or self.cluster.superuser};PWD={password if password is not None else self.cluster.password};"
        )

    def connect(self, autocommit: bool = True, **kwargs):
        import pyodbc

        return pyodbc.connect(self.connection_string(**kwargs), autocommit=autocommit)

    def execute_tsql(self, sql: str, params: tuple | list = ()):
        """Runs one T-SQL statement through pyodbc + the proxy (autocommit). Returns the rows if
        it produced a result set, else the row count."""
        if self._odbc is None:
            self._odbc = self.connect()
        cursor = self._odbc.cursor()
        try:
            cursor.execute(sql, *params) if params else cursor.execute(sql)
            if cursor.description is not None:
                return [tuple(row) for row in cursor.fetchall()]
            return cursor.rowcount
        finally:
            cursor.close()

    # -- CDC administration (the same T-SQL a DBA runs) -----------------------------------------

    def enable_db(self) -> None:
        self.execute_tsql("EXEC sys.sp_cdc_enable_db")

    def enable_table(
        self,
        source_schema: str,
        source_name: str,
        *,
        capture_instance: str | None = None,
        role_name: str | None = None,
        supports_net_changes: int | None = 0,
        index_name: str | None = None,
        captured_column_list: str | None = None,
    ) -> str:
        args = {
            "source_schema": source_schema,
            "source_name": source_name,
            "role_name": role_name,
            "capture_instance": capture_instance,
            "supports_net_changes": supports_net_changes,
            "index_name": index_name,
            "captured_column_list": captured_column_list,
        }
        sql = "EXEC sys.sp_cdc_enable_table " + ", ".join(
            f"@{k} = {_tsql_literal(v)}" for k, v in args.items() if v is not None or k == "role_name"
        )
        self.execute_tsql(sql)
        return capture_instance or f"{source_schema}_{source_name}"

    def disable_table(self, source_schema: str, source_name: str, capture_instance: str = "all") -> None:
        self.execute_tsql(
            f"EXEC sys.sp_cdc_disable_table @source_schema = {_tsql_literal(source_schema)}, "
            f"@source_name = {_tsql_literal(source_name)}, @capture_instance = {_tsql_literal(capture_instance)}"
        )

    def set_snapshot_isolation(self, on: bool) -> None:
        self.execute_tsql(f"ALTER DATABASE CURRENT SET ALLOW_SNAPSHOT_ISOLATION {'ON' if on else 'OFF'}")

    # -- capture and cleanup jobs -------------------------------------------------------------

    def wait_until_captured(self, timeout: float = 30.0) -> bytes | None:
        """Waits until the capture job has processed everything committed so far; returns the max LSN."""
        assert self.capture is not None
        with self._admin_lock:
            self.capture.wait_until_captured(self._admin, timeout)
            value = self._admin.execute("SELECT sys.fn_cdc_get_max_lsn()").fetchone()[0]
        return bytes(value) if value is not None else None

    def set_capture_lag(self, seconds: float) -> None:
        assert self.capture is not None
        self.capture.lag = seconds

    def pause_capture(self) -> None:
        """SQL Server Agent stopped: no capture; sys.dm_server_services reports the Agent stopped."""
        self._admin_execute("UPDATE standin.settings SET agent_running = false")

    def resume_capture(self) -> None:
        self._admin_execute("UPDATE standin.settings SET agent_running = true")
        if self.capture is not None:
            self.capture.poke()

    def cleanup(self, retention_minutes: int) -> bytes | None:
        """Runs the cleanup job now with this retention; returns the new low water mark (or None)."""
        value = self._admin_execute("SELECT standin.cleanup(%s)", (retention_minutes,))[0][0]
        return bytes(value) if value is not None else None

    # -- the server's clock ---------------------------------------------------------------------

    def set_time_zone(self, name: str) -> None:
        """The server's time zone (IANA name): GETDATE()/SYSDATETIME() and the capture job's commit
        times are local to it, DATEPART(TZOFFSET, SYSDATETIMEOFFSET()) is its offset now."""
        self._admin_execute("SELECT %s::timestamptz AT TIME ZONE %s", ("2000-01-01T00:00:00Z", name))  # a known zone
        self._admin_execute("UPDATE standin.clock SET time_zone = %s", (name,))
        self._time_zone = name

    def set_clock(self, at: datetime) -> None:
        """Sets the server's clock to the instant ``at`` (aware) from now on; it keeps running. The
        capture job renders a commit time with the offset in effect when it captures the commit:
        call ``wait_until_captured()`` before moving the clock."""
        assert at.tzinfo is not None, "an aware datetime"
        self._admin_execute(
            "UPDATE standin.clock SET clock_offset = %s::timestamptz - clock_timestamp()", (at.isoformat(),)
        )

    def reset_clock(self) -> None:
        self._admin_execute("UPDATE standin.clock SET clock_offset = interval '0'")

    def server_now(self) -> datetime:
        """The server's clock now (aware, UTC)."""
        value = self._admin_execute("SELECT standin.server_now()")[0][0]
        return value.astimezone(timezone.utc)

    def clock_offset(self) -> timedelta:
        return self._admin_execute("SELECT clock_offset FROM standin.clock")[0][0]

    # -- test helpers -------------------------------------------------------------------------

    def admin_query(self, sql: str, params: tuple = ()) -> list[tuple]:
        """PostgreSQL-side query on the stand-in database (for assertions on the emulation itself)."""
        return self._admin_execute(sql, params)

    def create_login(self, name: str, password: str) -> None:
        """A PostgreSQL role the product can connect as (``connection_string(user=..., password=...)``)."""
        from psycopg import sql as pgsql

        with self._admin_lock:
            self._admin.execute(pgsql.SQL("DROP ROLE IF EXISTS {}").format(pgsql.Identifier(name)))
            self._admin.execute(
                pgsql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(pgsql.Identifier(name), pgsql.Literal(password))
            )
            for schema in ("dbo", "sys", "cdc", "standin", "INFORMATION_SCHEMA"):
                self._admin.execute(
                    pgsql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(pgsql.Identifier(schema), pgsql.Identifier(name))
                )
            for schema in ("sys", "standin", "INFORMATION_SCHEMA"):
                self._admin.execute(
                    pgsql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA {} TO {}").format(
                        pgsql.Identifier(schema), pgsql.Identifier(name)
                    )
                )
            # msdb.dbo.cdc_jobs is in msdb, where a login has only what msdb grants it (grant_msdb_cdc_jobs)
            self._admin.execute(
                pgsql.SQL("REVOKE SELECT ON standin.msdb_cdc_jobs FROM {}").format(pgsql.Identifier(name))
            )
            self._admin.execute(
                pgsql.SQL(
                    "GRANT SELECT ON cdc.change_tables, cdc.captured_columns, cdc.index_columns, "
                    "cdc.lsn_time_mapping TO {}"
                ).format(pgsql.Identifier(name))
            )
            # sys.databases reads the data directory's PG_VERSION for create_date: any SQL Server login
            # can read sys.databases, so let this one call pg_stat_file (test-only emulation).
            self._admin.execute(
                pgsql.SQL("GRANT EXECUTE ON FUNCTION pg_catalog.pg_stat_file(text) TO {}").format(
                    pgsql.Identifier(name)
                )
            )

    def grant_msdb_cdc_jobs(self, name: str) -> None:
        """The DBA's ``USE msdb; CREATE USER [<login>] FOR LOGIN [<login>]; GRANT SELECT ON
        dbo.cdc_jobs TO [<login>];`` (the stand-in has no msdb database to USE; its msdb.dbo.cdc_jobs
        is standin.msdb_cdc_jobs, readable by superusers, sysadmin's stand-in, and by this grant)."""
        from psycopg import sql as pgsql

        self._admin_execute(
            pgsql.SQL("GRANT SELECT ON standin.msdb_cdc_jobs TO {}")
            .format(pgsql.Identifier(name))
            .as_string(self._admin)
        )

    def _admin_execute(self, sql: str, params: tuple = ()) -> list[tuple]:
        with self._admin_lock:
            cur = self._admin.execute(sql, params)
            return cur.fetchall() if cur.description is not None else []

    def _snapshot_allowed(self) -> bool:
        return bool(self._admin_execute("SELECT allow_snapshot_isolation FROM standin.settings")[0][0])

    def _resolve(self, tables: list[tuple[str, str]], column: str) -> sstypes.ColumnType | None:
        for attempt in range(2):
            for key in tables:
                found = self._columns.get(key, {}).get(column)
                if found is not None:
                    return found
            if attempt == 0:
                self._load_columns()
        return None

    def _load_columns(self) -> None:
        rows = self._admin_execute(
            "SELECT n.nspname, c.relname, d.column_name, d.declared FROM standin.declared_columns d "
            "JOIN pg_class c ON c.oid = d.relid JOIN pg_namespace n ON n.oid = c.relnamespace"
        )
        columns: dict[tuple[str, str], dict[str, sstypes.ColumnType]] = {}
        for schema, table, column, declared in rows:
            try:
                columns.setdefault((schema, table), {})[column] = sstypes.parse(declared)
            except sstypes.UnsupportedType:
                pass
        self._columns = columns


def install(conn: psycopg.Connection, server_name: str) -> None:
    """Creates the emulated SQL Server objects in the connected (empty) database."""
    database = conn.execute("SELECT current_database()").fetchone()[0]
    with conn.transaction():
        conn.execute("SET LOCAL check_function_bodies = off")  # functions reference views created later
        conn.execute(CATALOG_SQL.read_text())
        conn.execute(CLOCK_SQL.read_text())
        conn.execute(
            "INSERT INTO standin.settings (server_name, database_guid) VALUES (%s, %s)",
            (server_name, str(uuid.uuid4())),
        )
        # T-SQL's bit takes 1/0: let integers go into boolean columns and compare with booleans.
        conn.execute(
            "UPDATE pg_cast SET castcontext = 'a' WHERE castsource = 'int4'::regtype AND casttarget = 'bool'::regtype"
        )
        conn.execute(
            "CREATE FUNCTION standin.bool_eq_int(boolean, integer) RETURNS boolean LANGUAGE sql "
            "IMMUTABLE AS 'SELECT $1 = ($2 <> 0)'"
        )
        conn.execute(
            "CREATE FUNCTION standin.bool_ne_int(boolean, integer) RETURNS boolean LANGUAGE sql "
            "IMMUTABLE AS 'SELECT $1 <> ($2 <> 0)'"
        )
        conn.execute("CREATE OPERATOR sys.= (LEFTARG = boolean, RIGHTARG = integer, FUNCTION = standin.bool_eq_int)")
        conn.execute("CREATE OPERATOR sys.<> (LEFTARG = boolean, RIGHTARG = integer, FUNCTION = standin.bool_ne_int)")
        conn.execute(f'ALTER DATABASE "{database}" SET search_path = dbo, sys, pg_catalog')
    conn.execute("SET search_path = dbo, sys, pg_catalog")
    capture.create_slot(conn)


def _tsql_literal(value) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, (int, bool)):
        return str(int(value))
    return "N'" + str(value).replace("'", "''") + "'"
