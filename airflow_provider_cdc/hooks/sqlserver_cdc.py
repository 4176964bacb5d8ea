"""Hook for change capture from SQL Server: owns the connection, returns plain values.

Builds on Airflow's ``DbApiHook`` (common-sql): "Test connection", ``get_first``/``run`` and
OpenLineage's database identity come from there. Not on the ODBC provider's ``OdbcHook``: it
would be a new dependency whose value is its connection string, which passes a connection's
extras through as ODBC attributes and lets the ``driver`` extra choose the library loaded, the
two things this hook's allowlist and driver rule exist to prevent; nor on the MSSQL provider's
hook, which speaks pymssql, not ODBC.

Reuses Airflow's ``mssql`` (or ``odbc``) connection type: host, port, schema (= the database),
login and password. The ODBC driver is the DAG's (``SqlServerCapture(odbc_driver=...)``, this
hook's ``driver``; default Microsoft's "ODBC Driver 18 for SQL Server"). A connection's ``driver``
extra counts only where the deployment allows it (``[cdc] sqlserver_allow_driver_in_extra``, like
``[providers.odbc] allow_driver_in_extra`` of Airflow's ODBC provider): unixODBC loads whatever a
driver names, so whoever edits connections could otherwise run code on the workers. Other extras
are ODBC attributes from an allowlist (``Encrypt``, ``TrustServerCertificate``,
``ApplicationIntent`` ...: ``cdc/sources/sqlserver/connection.py``); Airflow's own keys are ignored.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import cached_property
from typing import Any

from airflow.providers.common.sql.hooks.sql import DbApiHook

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError, CdcTransientError
from airflow_provider_cdc.cdc.sources.sqlserver import admin
from airflow_provider_cdc.cdc.sources.sqlserver.connection import DEFAULT_DRIVER, SqlServerConnectionInfo, connect
from airflow_provider_cdc.hooks.extras import connection_extras, scrubbed_test
from airflow_provider_cdc.version_compat import airflow_conf

#: The provider's section of the Airflow configuration (declared in get_provider_info).
CONFIG_SECTION = "cdc"
#: May a connection's ``driver`` extra pick the ODBC driver? Default False (get_provider_info).
ALLOW_DRIVER_IN_EXTRA = "sqlserver_allow_driver_in_extra"
#: Extras that are Airflow's or other hooks' settings, not ODBC attributes.
_AIRFLOW_SETTINGS = frozenset({"connect_kwargs", "sqlalchemy_scheme", "placeholder", "sqlalchemy_driver"})


def driver_in_extra_allowed() -> bool:
    """The deployment's choice (read on each use: the triggerer and workers read their own config)."""
    return airflow_conf().getboolean(CONFIG_SECTION, ALLOW_DRIVER_IN_EXTRA, fallback=False)


def connection_info_from(conn: Any, driver: str | None = None) -> SqlServerConnectionInfo:
    """The engine's connection value of an Airflow ``mssql_cdc``, ``mssql`` or ``odbc`` connection;
    ``driver`` is the DAG's (trusted), the extra's ``driver`` is the connection editor's."""
    extra = connection_extras(conn)
    driver_extras = {str(key): value for key, value in extra.items() if str(key).strip().lower() == "driver"}
    options = tuple(
        (str(key), str(value))
        for key, value in extra.items()
        if str(key) not in driver_extras and str(key).lower() not in _AIRFLOW_SETTINGS
    )
    return SqlServerConnectionInfo(
        host=conn.host or "localhost",
        port=int(conn.port) if conn.port else None,
        database=conn.schema or "",
        user=conn.login or "",
        password=conn.password,
        driver=chosen_driver(getattr(conn, "conn_id", None), driver, driver_extras),
        options=options,
    )


def chosen_driver(conn_id: str | None, argument: str | None, driver_extras: Mapping[str, Any]) -> str:
    """The DAG's driver, else the default; the connection's ``driver`` extra only where the
    deployment allows it and the DAG named none. Where it is not allowed, an extra naming another
    driver is refused rather than ignored: its editor would connect through a driver they did not mean.
    Whichever it is, the engine takes only an installed driver's name, never a library's path."""
    trusted = argument or DEFAULT_DRIVER
    named = {str(value) for value in driver_extras.values()}
    if not named or named == {trusted}:
        return trusted
    key, value = next((k, str(v)) for k, v in driver_extras.items() if str(v) != trusted)
    if not driver_in_extra_allowed():
        raise CdcConfigurationError(
            f"Airflow connection {conn_id!r} names ODBC driver {value!r} in its {key!r} extra, which this deployment "
            "does not allow: whoever edits connections could make the workers load any library. Name the driver in "
            f"the DAG (SqlServerCapture(odbc_driver=...) or SqlServerCdcHook(driver=...); default {DEFAULT_DRIVER!r}) "
            f"and remove the extra; or, where connection editors are trusted with the workers, set [{CONFIG_SECTION}] "
            f"{ALLOW_DRIVER_IN_EXTRA} = True (AIRFLOW__{CONFIG_SECTION.upper()}__{ALLOW_DRIVER_IN_EXTRA.upper()})"
        )
    if argument is not None:
        return argument
    if len(named) > 1:
        raise CdcConfigurationError(
            f"Airflow connection {conn_id!r} names more than one ODBC driver in its extra "
            f"({', '.join(sorted(map(repr, driver_extras)))}): keep one 'driver'"
        )
    return value


# Connection failures that retrying cannot fix (SQL Server's login errors).
_REFUSALS = ("Login failed", "(18456)", "Cannot open database", "(4060)")


class SqlServerCdcHook(DbApiHook):
    """Sessions for SQL Server change capture: the capture lock, catalog reads, LSNs."""

    conn_name_attr = "sqlserver_conn_id"
    default_conn_name = "mssql_default"
    # Its own connection type (form fields in get_provider_info); mssql/odbc connections work too.
    conn_type = "mssql_cdc"
    hook_name = "SQL Server (change capture)"
    supports_autocommit = True
    _test_connection_sql = "SELECT 1"

    def __init__(self, sqlserver_conn_id: str = default_conn_name, *, driver: str | None = None, **kwargs: Any) -> None:
        super().__init__(**{**kwargs, self.conn_name_attr: sqlserver_conn_id})
        self.sqlserver_conn_id = sqlserver_conn_id
        self.driver = driver

    @cached_property
    def connection_info(self) -> SqlServerConnectionInfo:
        try:
            return connection_info_from(self.connection, self.driver)
        except CdcConfigurationError as exc:
            raise self._unusable(exc) from None

    def test_connection(self) -> tuple[bool, str]:
        """Connect as a capture task would (the DAG's driver, the allowlisted attributes) and run
        ``SELECT 1``: ``(True, ...)``, or ``(False, what failed)`` without the password."""
        return scrubbed_test(lambda: super(SqlServerCdcHook, self).test_connection(), self.connection.password)

    def get_openlineage_database_info(self, connection: Any) -> Any:
        """OpenLineage's naming of a SQL Server database: ``mssql://host:port``."""
        from airflow.providers.openlineage.sqlparser import DatabaseInfo

        return DatabaseInfo(
            scheme="mssql",
            authority=DbApiHook.get_openlineage_authority_part(connection, default_port=1433),
            database=connection.schema,
        )

    def get_conn(self):  # -> pyodbc.Connection
        """An autocommit pyodbc connection."""
        try:
            return connect(self.connection_info)
        except CdcConfigurationError as exc:  # a driver that is not installed
            raise self._unusable(exc) from None
        except CdcTransientError as exc:
            if not any(sign in str(exc) for sign in _REFUSALS):
                raise
            raise CdcConfigurationError(
                f"Airflow connection {self.sqlserver_conn_id!r} was refused by the server: {exc}. "
                "Fix the connection's login, password or database"
            ) from None

    def _unusable(self, exc: CdcConfigurationError) -> CdcConfigurationError:
        """The error, naming the Airflow connection (once)."""
        if repr(self.sqlserver_conn_id) in str(exc):
            return exc
        return type(exc)(f"Airflow connection {self.sqlserver_conn_id!r} cannot be used: {exc}")

    @contextmanager
    def session(self) -> Iterator[Any]:
        conn = self.get_conn()
        try:
            yield conn
        finally:
            conn.close()

    def server_info(self) -> admin.ServerInfo:
        with self.session() as conn:
            return admin.server_info(conn)

    @contextmanager
    def capture_lock(self, capture: str) -> Iterator[Any]:
        """Hold the capture's application lock for the block (fails fast if taken); yields the session."""
        with self.session() as conn:
            admin.try_capture_lock(conn, capture)
            try:
                yield conn
            finally:
                try:
                    admin.release_capture_lock(conn, capture)
                except Exception:
                    self.log.warning("capture lock session of %r was lost; the server released the lock", capture)
