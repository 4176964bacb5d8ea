"""Hook for change capture from SQL Server: owns the connection, returns plain values.

Reuses Airflow's ``mssql`` (or ``odbc``) connection type: host, port, schema (= the database),
login and password. Extras: ``driver`` (the ODBC driver, default Microsoft's "ODBC Driver 18 for
SQL Server"), and any further ODBC attributes (``Encrypt``, ``TrustServerCertificate``,
``ApplicationIntent`` ...) passed verbatim; Airflow's own keys are ignored.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cached_property
from typing import Any

from airflow_provider_cdc.cdc.errors import CdcConfigurationError, CdcTransientError
from airflow_provider_cdc.cdc.sources.sqlserver import admin
from airflow_provider_cdc.cdc.sources.sqlserver.connection import DEFAULT_DRIVER, SqlServerConnectionInfo, connect
from airflow_provider_cdc.hooks.extras import connection_extras
from airflow_provider_cdc.version_compat import BaseHook

#: Extras that are Airflow's or other hooks' settings, not ODBC attributes.
_NOT_ODBC = frozenset({"driver", "dsn", "connect_kwargs", "sqlalchemy_scheme", "placeholder", "sqlalchemy_driver"})


def connection_info_from(conn: Any, driver: str | None = None) -> SqlServerConnectionInfo:
    """The engine's connection value of an Airflow ``mssql_cdc``, ``mssql`` or ``odbc`` connection."""
    extra = connection_extras(conn)
    options = tuple(
        (str(key), str(value)) for key, value in extra.items() if key.lower() not in _NOT_ODBC and value is not None
    )
    return SqlServerConnectionInfo(
        host=conn.host or "localhost",
        port=int(conn.port) if conn.port else None,
        database=conn.schema or "",
        user=conn.login or "",
        password=conn.password,
        driver=driver or extra.get("driver") or DEFAULT_DRIVER,
        options=options,
    )


# Connection failures that retrying cannot fix (SQL Server's login errors).
_REFUSALS = ("Login failed", "(18456)", "Cannot open database", "(4060)")


class SqlServerCdcHook(BaseHook):
    """Sessions for SQL Server change capture: the capture lock, catalog reads, LSNs."""

    conn_name_attr = "sqlserver_conn_id"
    default_conn_name = "mssql_default"
    # Its own connection type (form fields in get_provider_info); mssql/odbc connections work too.
    conn_type = "mssql_cdc"
    hook_name = "SQL Server (change capture)"

    def __init__(self, sqlserver_conn_id: str = default_conn_name, *, driver: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sqlserver_conn_id = sqlserver_conn_id
        self.driver = driver

    @cached_property
    def connection_info(self) -> SqlServerConnectionInfo:
        return connection_info_from(self.get_connection(self.sqlserver_conn_id), self.driver)

    def get_conn(self):  # -> pyodbc.Connection
        """An autocommit pyodbc connection."""
        try:
            return connect(self.connection_info)
        except CdcTransientError as exc:
            if not any(sign in str(exc) for sign in _REFUSALS):
                raise
            raise CdcConfigurationError(
                f"Airflow connection {self.sqlserver_conn_id!r} was refused by the server: {exc}. "
                "Fix the connection's login, password or database"
            ) from None

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
