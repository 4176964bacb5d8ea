"""Hook for change capture from PostgreSQL: owns the connection, returns plain values.

Builds on Airflow's ``PostgresHook`` (so ``DbApiHook``'s "Test connection", ``get_first``/``run``,
RDS/Aurora and Azure IAM logins (the ``iam`` extra) and ``get_openlineage_database_info`` work as
they do for a ``postgres`` connection), but opens every session itself: psycopg 3, the
capture's session settings and TLS rules below. Its connection type is ``postgres_cdc``; plain
``postgres`` connections work the same. Extras are read by name from an allowlist
(``sslmode``, ``sslrootcert``, ``connect_timeout`` ...), never passed through: none loads code
into the worker or sets the session's server settings (``sslkey``'s ``engine:key`` form is
refused; see ``cdc/sources/postgres/connection.py``). Without an ``sslmode`` the connection uses
verified TLS; a server that offers none is refused unless it is on the worker's own host (see
``cdc/sources/postgres/tls.py``). Every session pins ``search_path`` and turns ``row_security``
off, so no other role's code runs as the capture role through a name or a policy.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from copy import deepcopy
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from airflow.providers.postgres.hooks.postgres import PostgresHook

from airflow_provider_cdc.cdc.basics.errors import (
    CdcConfigurationError,
    CdcTransientError,
    ServerConfigurationError,
    SlotConfigurationError,
)
from airflow_provider_cdc.cdc.basics.problems import Problems
from airflow_provider_cdc.cdc.sources.postgres import admin, tls
from airflow_provider_cdc.cdc.sources.postgres.connection import ALLOWED_OPTIONS, PgConnectionInfo, connect
from airflow_provider_cdc.cdc.sources.postgres.lsn import Lsn
from airflow_provider_cdc.cdc.sources.postgres.tables import TableInfo, TableRef, quote_ident
from airflow_provider_cdc.hooks.extras import connection_extras, scrubbed_test


@dataclass(frozen=True)
class PreflightReport:
    server: admin.ServerInfo
    tables: dict[TableRef, TableInfo]
    slot: admin.SlotStatus | None


def connection_info_from(conn: Any) -> PgConnectionInfo:
    """The engine's connection value of an Airflow ``postgres``, ``postgres_cdc`` or
    ``yugabytedb_cdc`` connection (allowlisted extras)."""
    extra = connection_extras(conn)
    options = tuple((key, str(extra[key])) for key in ALLOWED_OPTIONS if extra.get(key) is not None)
    default_port = 5433 if conn.conn_type == "yugabytedb_cdc" else 5432  # YSQL listens on 5433
    return PgConnectionInfo(
        host=conn.host or "localhost",
        port=int(conn.port or default_port),
        dbname=conn.schema or "",
        user=conn.login or "",
        password=conn.password,
        options=options,
    )


# Connection failures that retrying cannot fix.
_REFUSALS = ("password authentication failed", "no pg_hba.conf entry", "permission denied for database")


class PostgresCdcHook(PostgresHook):
    """Slot and publication administration, preflight checks and slot status."""

    conn_name_attr = "postgres_conn_id"
    default_conn_name = "postgres_default"
    # Its own connection type, for the form fields declared in get_provider_info; plain
    # ``postgres`` connections work the same (the type is not checked).
    conn_type = "postgres_cdc"
    hook_name = "PostgreSQL (change capture)"
    _test_connection_sql = "SELECT 1"

    def __init__(self, postgres_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        # By the subclass's attribute name (yugabytedb_conn_id ...): DbApiHook reads it from there.
        super().__init__(**{**kwargs, self.conn_name_attr: postgres_conn_id})
        self.postgres_conn_id = postgres_conn_id

    @cached_property
    def _configured_info(self) -> PgConnectionInfo:
        try:
            return connection_info_from(self.connection)
        except CdcConfigurationError as exc:  # an extra refused (sslkey=engine:key, an unknown sslmode)
            raise CdcConfigurationError(f"Airflow connection {self.postgres_conn_id!r}: {exc}") from None

    @property
    def connection_info(self) -> PgConnectionInfo:
        """The engine's connection value; with the ``iam`` extra, its login, port and password are a
        fresh IAM token's (``PostgresHook.get_iam_token``: AWS RDS/Aurora/Redshift or Azure; the
        token is short-lived, so it is asked for on each use, never cached)."""
        info = self._configured_info
        if not self.connection.extra_dejson.get("iam", False):
            return info
        login, token, port = self.get_iam_token(deepcopy(self.connection))
        return replace(info, user=login or info.user, password=token, port=int(port or info.port))

    def resolved_connection_info(self) -> PgConnectionInfo:
        """:attr:`connection_info` with the sslmode this task settled on (connecting once if it
        has not connected yet): what a job spec carries, so Spark jobs connect the same way
        without probing again."""
        return tls.resolve(self.connection_info, lambda _info: self.get_conn())

    def get_conn(self):  # -> psycopg.Connection
        """An autocommit psycopg connection with the capture's session settings (``search_path =
        pg_catalog, pg_temp``, ``row_security = off``, the value formats), over verified TLS unless
        the connection's extra asks for less. Replaces ``PostgresHook.get_conn``, which would pass
        every extra to libpq (see the module docstring)."""
        try:
            self.conn = connect(self.connection_info)
            return self.conn
        except CdcConfigurationError as exc:  # a certificate that does not verify, an unknown sslmode
            raise CdcConfigurationError(f"Airflow connection {self.postgres_conn_id!r}: {exc}") from None
        except CdcTransientError as exc:
            if not any(sign in str(exc) for sign in _REFUSALS):
                raise
            # Credentials and grants do not fix themselves: fail without retries, naming the connection.
            raise CdcConfigurationError(
                f"Airflow connection {self.postgres_conn_id!r} was refused by the server: {exc}. "
                "Fix the connection's login and password (or the server's pg_hba.conf)"
            ) from None

    def get_sqlalchemy_engine(self, engine_kwargs: dict[str, Any] | None = None) -> Any:
        """PostgresHook's engine (its URL picks the dialect), whose connections are this hook's
        :meth:`get_conn` sessions: SQLAlchemy and pandas reads get the same TLS rules, extras
        allowlist and session settings as the capture, not a plain libpq connection."""
        return super().get_sqlalchemy_engine({**(engine_kwargs or {}), "creator": self.get_conn})

    def test_connection(self) -> tuple[bool, str]:
        """Connect as a capture task would (same TLS rules and session settings) and run ``SELECT 1``:
        ``(True, ...)``, or ``(False, what failed)`` without the connection's password."""
        return scrubbed_test(lambda: super(PostgresCdcHook, self).test_connection(), self.connection.password)

    @contextmanager
    def session(self) -> Iterator[Any]:
        with self.get_conn() as conn:
            yield conn

    # -- checks ------------------------------------------------------------------------------

    def preflight(
        self, tables: Sequence[TableRef], *, slot_name: str | None, problems: Problems | None = None
    ) -> PreflightReport:
        """Check server, tables and (if given and present) the slot, changing nothing.

        Every problem found goes to ``problems`` (server problems first: nothing works without
        them; then unknown tables and other relations, replica identity and privileges, the
        slot). Without ``problems``, raises one error listing them all.
        """
        found = problems if problems is not None else Problems("the preflight check")
        with self.session() as conn:
            server = admin.server_info(conn)
            found.add(admin.check_server(server), ServerConfigurationError, "the server cannot do logical capture")
            described, catalog_problems = admin.find_tables(conn, list(tables))
            for error, message in catalog_problems:
                found.add([message], error)
            found.add(
                admin.check_tables(conn, described.values()), CdcConfigurationError, "captured tables are not ready"
            )
            slot = admin.slot_status(conn, slot_name) if slot_name else None
            if slot is not None:
                found.add(admin.slot_problems(slot, server.database), SlotConfigurationError)
        if problems is None:
            found.raise_if_any()
        return PreflightReport(server, described, slot)

    def publication_problems(self, name: str, tables: Sequence[TableRef], mode: str = "filtered") -> list[str]:
        """What creating or verifying the publication would refuse, found without changing anything."""
        with self.session() as conn:
            return admin.publication_problems(conn, name, list(tables), mode)

    def max_slot_wal_keep_size(self) -> int:
        """The server's ``max_slot_wal_keep_size`` in bytes (-1: unlimited)."""
        from airflow_provider_cdc.cdc.sources.postgres.health import KEEP_SIZE_SQL

        with self.session() as conn:
            return int(conn.execute(KEEP_SIZE_SQL).fetchone()[0])

    def server_info(self) -> admin.ServerInfo:
        with self.session() as conn:
            return admin.server_info(conn)

    def describe_tables(self, tables: Sequence[TableRef]) -> dict[TableRef, TableInfo]:
        with self.session() as conn:
            return admin.describe_tables(conn, list(tables))

    # -- administration ----------------------------------------------------------------------

    def ensure_publication(self, name: str, tables: Sequence[TableRef], mode: str = "filtered") -> str:
        """Create or verify the publication: returns 'created', 'altered' or 'verified'."""
        with self.session() as conn:
            return admin.ensure_publication(conn, name, list(tables), mode)

    def ensure_slot(self, slot_name: str) -> tuple[admin.SlotStatus, bool]:
        """Create the pgoutput slot if missing, verify it otherwise: (status, created)."""
        with self.session() as conn:
            return admin.ensure_slot(conn, slot_name, conn.info.dbname)

    def drop_slot(self, slot_name: str) -> bool:
        with self.session() as conn:
            return admin.drop_slot(conn, slot_name)

    # -- slot --------------------------------------------------------------------------------

    def slot_status(self, slot_name: str) -> admin.SlotStatus | None:
        with self.session() as conn:
            return admin.slot_status(conn, slot_name)

    def slot_reading(self, slot_name: str) -> tuple[admin.SlotStatus | None, int]:
        """The slot's status and ``max_slot_wal_keep_size`` in bytes (-1: unlimited)."""
        from airflow_provider_cdc.cdc.sources.postgres.health import KEEP_SIZE_SQL

        with self.session() as conn:
            return admin.slot_status(conn, slot_name), int(conn.execute(KEEP_SIZE_SQL).fetchone()[0])

    def current_lsn(self) -> Lsn:
        with self.session() as conn:
            return admin.current_lsn(conn)

    def advance_slot(self, slot_name: str, lsn: Lsn) -> Lsn:
        with self.session() as conn:
            return admin.advance_slot(conn, slot_name, lsn)

    def count_pending_changes(self, slot_name: str, publication_name: str, *, upto_changes: int = 1) -> int:
        """Captured row changes among the slot's next transactions (decodes WAL: not free)."""
        with self.session() as conn:
            return conn.execute(
                admin.PEEK_CHANGES_SQL, (slot_name, upto_changes, quote_ident(publication_name))
            ).fetchone()[0]

    @contextmanager
    def capture_lock(self, capture: str) -> Iterator[Any]:
        """Hold the capture's advisory lock for the duration of the block (fails fast if taken).

        Yields the session holding the lock, which callers may reuse for their own queries.
        """
        with self.session() as conn:
            admin.try_capture_lock(conn, capture)
            try:
                yield conn
            finally:
                if not conn.closed:
                    import psycopg

                    try:
                        admin.release_capture_lock(conn, capture)
                    except psycopg.OperationalError:
                        # The session died (server restarted, connection dropped) and its lock
                        # with it: do not hide the error the run is failing with, if any.
                        self.log.warning("capture lock session of %r was lost; the server released the lock", capture)
