"""The ADBC session a SQL window is read through, and what its errors mean.

A session runs on the ADBC driver manager's low-level API (its DB-API layer imports pandas and
polars), is opened with the capture's libpq settings and TLS rules, and never lets the password
into an error; a failed read is classified as the streaming path classifies
``START_REPLICATION``'s errors (:func:`sql_error`).
"""

from __future__ import annotations

import logging
from typing import Any

import pyarrow as pa
from adbc_driver_manager import Error as AdbcError

from airflow_provider_cdc.cdc.basics.errors import CdcError, CdcTransientError
from airflow_provider_cdc.cdc.sources.postgres import tls
from airflow_provider_cdc.cdc.sources.postgres.connection import PgConnectionInfo, SessionSettings
from airflow_provider_cdc.cdc.sources.postgres.replication import classify_start_error

log = logging.getLogger(__name__)

#: What the driver raises: its own errors, and Arrow's stream errors (an error raised while the
#: result is read comes through Arrow's stream interface as an OSError). Anything else (a signal
#: handler's exception, Airflow's task termination) passes through as itself.
DRIVER_ERRORS = (AdbcError, OSError, pa.ArrowException)


class SqlWindowUnavailable(CdcTransientError):
    """The server could not build the window's result (temporary files over ``temp_file_limit``,
    a full disk, out of memory): it materialises the whole result before sending a row, which the
    replication protocol does not. ``window_reader="auto"`` streams the window instead."""


def sql_error(slot: str, exc: BaseException, info: PgConnectionInfo) -> CdcError:
    """The error for a failed SQL read, classified as the streaming path classifies
    ``START_REPLICATION``'s (slot missing, in use, WAL removed), without the password."""
    message = _redacted(" ".join(str(exc).split()), info) or type(exc).__name__
    message = message.split("ERROR: ", 1)[-1].strip()  # ADBC's prefix ("[libpq] Execution error ...")
    sqlstate = getattr(exc, "sqlstate", None)
    code = sqlstate.encode() if isinstance(sqlstate, str) else _sqlstate_of(message)
    if code == b"42501":  # insufficient privilege: the streaming path needs the same attribute
        return CdcTransientError(
            f"cannot read replication slot {slot!r} on {info.describe()}: {message}. "
            "The role needs the REPLICATION attribute."
        )
    if code == b"42883":  # undefined function: a server without the logical decoding SQL functions
        return CdcError(
            f"the server at {info.describe()} has no logical decoding SQL functions ({message}); "
            "set window_reader='stream'"
        )
    if any(sign in message for sign in _CAPACITY_SIGNS):
        return SqlWindowUnavailable(
            f"the server has no room for what the SQL reader needs beside replication slot {slot!r} (a temporary "
            f"copy of the slot, a second session): {message}. window_reader='stream' reads the slot itself, on one "
            "session"
        )
    if (code or b"").startswith(b"53") or any(sign in message for sign in _RESOURCE_SIGNS):
        return SqlWindowUnavailable(
            f"the server could not materialise the window of replication slot {slot!r} for the SQL reader: "
            f"{message}. The result of a logical decoding SQL call is built whole on the server (work_mem, "
            "then temporary files of about the decoded output's size); window_reader='stream' reads it without"
        )
    error = classify_start_error(slot, message, code)
    if type(error) is CdcTransientError and any(sign in message for sign in _LOST_SIGNS):
        return CdcTransientError(
            f"lost the connection reading replication slot {slot!r} through SQL: {message}. Nothing was "
            "acknowledged: a retry reads the same window again"
        )
    if type(error) is CdcTransientError:  # not one of the slot's known states
        return CdcTransientError(f"reading replication slot {slot!r} through SQL failed: {message}")
    return error


#: The server's messages for the SQLSTATEs classified above: an error raised while reading the
#: result reaches Python through Arrow's stream interface, as an OSError without its SQLSTATE.
_MESSAGE_SQLSTATES = (
    ("function pg_logical_slot_peek_binary_changes(", b"42883"),
    ("does not exist", b"42704"),
    ("is active for PID", b"55006"),
    ("must be superuser or replication role", b"42501"),
    ("permission denied to use replication slots", b"42501"),
)


#: Messages of class 53 (insufficient resources) and of ``temp_file_limit`` (53400), for errors
#: that arrive without their SQLSTATE.
_RESOURCE_SIGNS = (
    "temp_file_limit",
    "could not write to file",
    "No space left on device",
    "out of memory",
    "could not extend file",
)


#: Slots or connections exhausted (53400, 53300): the temporary copies and the second range's
#: session need one more of each than streaming does.
_CAPACITY_SIGNS = (
    "all replication slots are in use",
    "too many clients already",
    "remaining connection slots are reserved",
)


#: A session ended under the reader (terminated, server shut down): libpq in COPY mode reports the
#: closed socket, not the server's FATAL text.
_LOST_SIGNS = ("server closed the connection", "terminating connection", "connection to server was lost")


def _sqlstate_of(message: str) -> bytes | None:
    return next((code for sign, code in _MESSAGE_SQLSTATES if sign in message), None)


def _redacted(text: str, info: PgConnectionInfo) -> str:
    if info.password:
        text = text.replace(info.password, "********")
    return text


class Session:
    """One ADBC PostgreSQL session, on the driver manager's low-level API: its DB-API layer imports
    pandas, polars and pyarrow.dataset when they are installed (~75 MiB of a worker's memory for
    nothing this reader uses). Connections start in autocommit, as ADBC specifies."""

    def __init__(self, conninfo: str):
        import adbc_driver_manager
        import adbc_driver_postgresql

        self._database = adbc_driver_postgresql.connect(conninfo)
        try:
            self._connection = adbc_driver_manager.AdbcConnection(self._database)
        except BaseException:
            self._database.close()
            raise

    def stream(self, query: str, options: dict[str, str] | None = None) -> tuple[Any, pa.RecordBatchReader]:
        """The statement running ``query`` (close it after its reader) and the result's batches."""
        statement = self.prepare(query, options)
        try:
            return statement, self.execute(statement)
        except BaseException:
            statement.close()
            raise

    def prepare(self, query: str, options: dict[str, str] | None = None) -> Any:
        """A statement of ``query`` not executed yet (another thread may cancel it once it runs)."""
        import adbc_driver_manager

        statement = adbc_driver_manager.AdbcStatement(self._connection)
        try:
            if options:
                statement.set_options(**options)
            statement.set_sql_query(query)
        except BaseException:
            statement.close()
            raise
        return statement

    @staticmethod
    def execute(statement: Any) -> pa.RecordBatchReader:
        """Run ``statement``: its result's batches (the driver releases the GIL while it waits)."""
        handle, _ = statement.execute_query()
        return pa.RecordBatchReader._import_from_c(handle.address)

    def rows(self, query: str) -> list[dict[str, Any]]:
        """The rows of a small result."""
        statement, reader = self.stream(query)
        try:
            return reader.read_all().to_pylist()
        finally:
            reader.close()
            statement.close()

    def cancel(self) -> None:
        """Cancel what the session is running (any statement, from another thread)."""
        self._connection.cancel()

    def close(self) -> None:
        try:
            self._connection.close()
            self._database.close()
        except DRIVER_ERRORS:  # the session is gone either way; the original error matters
            log.debug("closing the ADBC session failed", exc_info=True)


def connect(info: PgConnectionInfo, settings: SessionSettings | None = None) -> Session:
    """An ADBC PostgreSQL session with ``info`` (libpq conninfo: the capture's session settings
    and TLS rules, as :func:`.connection.connect`) and ``settings`` where the server has them;
    errors never carry the password."""

    def attempt(candidate: PgConnectionInfo) -> Session:
        try:
            return Session(candidate.conninfo())
        except Exception as exc:
            # ADBC's message may echo the connection string: never let the password out.
            raise _ConnectError(_redacted(" ".join(str(exc).split()), info)) from None

    try:
        conn = tls.open_connection(info, attempt, _ssl_in_use)
    except _ConnectError as exc:
        raise CdcTransientError(f"cannot connect to PostgreSQL at {info.describe()}: {exc}") from None
    # A peek runs to its end before it sends a row, and a backend notices a dead client only
    # when it writes: without this, a killed read would keep decoding (and hold the slot, as
    # "in use") for as long as the window takes. PostgreSQL 14+; older servers have no such setting.
    statement = (settings or SessionSettings()).with_exact(client_connection_check_interval="1000").statement()
    try:
        conn.rows(statement)  # type: ignore[arg-type]
    except DRIVER_ERRORS as exc:
        conn.close()
        message = _redacted(" ".join(str(exc).split()), info)
        raise CdcTransientError(f"setting up the SQL reader's session on {info.describe()} failed: {message}") from None
    except BaseException:
        conn.close()
        raise
    return conn


class _ConnectError(Exception):
    """A failed ADBC connection attempt, its message redacted (libpq's text for tls' checks)."""


def _ssl_in_use(conn: Session) -> bool:
    rows = conn.rows("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
    return bool(rows and rows[0]["ssl"])
