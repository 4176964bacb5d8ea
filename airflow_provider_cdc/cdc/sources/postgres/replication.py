"""A minimal client for PostgreSQL's streaming replication protocol (logical walsender).

Hand-written on psycopg 3's libpq binding (``psycopg.pq``) because psycopg 3 has no replication
API, and psycopg2's ``ReplicationCursor`` confirms ``flush_lsn = wal_end`` on its own whenever a
keepalive arrives and no unconfirmed data was received: it would acknowledge the slot past our
window before the sink commit. This client never reports a flush position on its own. PostgreSQL slots are
acknowledged only by ``pg_replication_slot_advance`` after the offset is durable (see
``admin.advance_slot``); YugabyteDB, which has no slot advance, through an explicit
:meth:`ReplicationConnection.confirm_flush` after the offset is durable.

Two uses: creating a (temporary) slot that exports a snapshot for the initial snapshot, and
streaming a slot's changes from a start LSN.
"""

from __future__ import annotations

import logging
import select
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from airflow_provider_cdc.cdc.basics.errors import (
    CdcError,
    CdcTransientError,
    ConcurrentCaptureError,
    SlotMissingError,
    WalLostError,
)
from airflow_provider_cdc.cdc.sources.postgres import tls
from airflow_provider_cdc.cdc.sources.postgres.connection import PgConnectionInfo, SessionSettings
from airflow_provider_cdc.cdc.sources.postgres.decoder import PG_EPOCH_OFFSET_US
from airflow_provider_cdc.cdc.sources.postgres.lsn import Lsn
from airflow_provider_cdc.cdc.sources.postgres.tables import quote_ident

log = logging.getLogger(__name__)

_WAL_START = struct.Struct("!Q")
_KEEPALIVE = struct.Struct("!QQB")
_STATUS_UPDATE = struct.Struct("!cQQQqB")


class StreamErrorResponse(CdcTransientError):
    """The server ended a stream with an ErrorResponse (after CopyBothResponse). Transient as a
    lost connection is, unless the caller knows the source's words (YugabyteDB reports the
    slot's expiry or a missing publication this way)."""

    def __init__(self, message: str, sqlstate: str, server_message: str):
        super().__init__(message)
        self.sqlstate = sqlstate
        self.server_message = server_message


@dataclass(frozen=True)
class SlotCreation:
    slot_name: str
    consistent_point: Lsn
    snapshot_name: str | None
    plugin: str


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs several times more per change
class XLogData:
    """One replication message: ``wal_start`` as sent by the walsender, and the payload."""

    wal_start: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class Keepalive:
    """The walsender has read (decoded) WAL up to ``wal_end``."""

    wal_end: int


class ReplicationConnection:
    """A ``replication=database`` connection. Not thread-safe except for the status sender."""

    def __init__(self, info: PgConnectionInfo):
        from psycopg import pq

        self._pq = pq
        self._info = info
        self._conn = tls.open_connection(info, _open_replication, lambda conn: bool(conn.ssl_in_use))
        self._lock = threading.Lock()
        self._streaming = False
        self._keeper: threading.Thread | None = None
        self._stop_keeper = threading.Event()

    # -- commands ---------------------------------------------------------------------------

    def create_slot(
        self,
        name: str,
        *,
        plugin: str = "pgoutput",
        temporary: bool = False,
        export_snapshot: bool = False,
        options: tuple[str, ...] | None = None,
        transaction: str | None = None,
    ) -> SlotCreation:
        """``CREATE_REPLICATION_SLOT``. With ``export_snapshot`` the snapshot stays importable
        (``SET TRANSACTION SNAPSHOT``) until this connection runs another command or closes.
        ``options`` replaces the snapshot keyword with the given legacy keywords (YugabyteDB's
        ``HYBRID_TIME USE_SNAPSHOT``). ``transaction`` is the ``BEGIN`` statement of a transaction
        block the command runs in, as its first command, committed right after (``USE_SNAPSHOT``
        where the server requires one: YugabyteDB with ``ysql_enable_pg_export_snapshot``)."""
        keywords = options if options is not None else ("EXPORT_SNAPSHOT" if export_snapshot else "NOEXPORT_SNAPSHOT",)
        command = (
            f"CREATE_REPLICATION_SLOT {quote_ident(name)}"
            f"{' TEMPORARY' if temporary else ''} LOGICAL {quote_ident(plugin)}"
            f"{''.join(' ' + k for k in keywords)}"
        )
        if transaction is None:
            result = self._execute(command)
        else:
            self._command(transaction)
            try:
                result = self._execute(command)
            except BaseException:
                self._conn.exec_(b"ROLLBACK")  # leave no failed transaction behind on the connection
                raise
            self._command("COMMIT")
        return SlotCreation(
            slot_name=result[0].decode(),
            consistent_point=Lsn(result[1].decode()),
            snapshot_name=result[2].decode() if result[2] else None,
            plugin=result[3].decode(),
        )

    def identify_system(self) -> tuple[str, str | None]:
        """``IDENTIFY_SYSTEM``: (system identifier, database)."""
        row = self._execute("IDENTIFY_SYSTEM")
        return (row[0] or b"").decode(), None if len(row) < 4 or row[3] is None else row[3].decode()

    def apply_settings(self, settings: SessionSettings) -> None:
        """Give the session ``settings`` where the server has them (a ``replication=database``
        walsender runs SQL before ``START_REPLICATION``)."""
        statement = settings.statement()
        if statement is None:
            return
        result = self._conn.exec_(statement.encode())
        if result.status != self._pq.ExecStatus.TUPLES_OK:
            names = ", ".join([*settings.exact, *settings.minimums])
            raise CdcTransientError(
                f"setting {names} failed on replication connection {self._info.describe()}: "
                f"{_error_text(result.error_message)}"
            )

    def start_logical(self, slot: str, start_lsn: int, options: dict[str, str]) -> None:
        """``START_REPLICATION SLOT ... LOGICAL``; the server skips transactions that committed
        before ``max(start_lsn, confirmed_flush_lsn)``."""
        rendered = ", ".join(f"{quote_ident(k)} '{v.replace(chr(39), chr(39) * 2)}'" for k, v in options.items())
        command = f"START_REPLICATION SLOT {quote_ident(slot)} LOGICAL {Lsn(start_lsn)} ({rendered})"
        pq = self._pq
        self._conn.send_query(command.encode())
        result = self._conn.get_result()
        if result is None or result.status != pq.ExecStatus.COPY_BOTH:
            message = _error_text(result.error_message if result else self._conn.error_message)
            sqlstate = result.error_field(pq.DiagnosticField.SQLSTATE) if result else None
            while self._conn.get_result() is not None:
                pass
            raise classify_start_error(slot, message, sqlstate)
        self._conn.nonblocking = 1
        self._streaming = True
        self._keeper = threading.Thread(target=self._send_status_periodically, daemon=True)
        self._keeper.start()

    def frames(self, *, idle_timeout: float) -> Iterator[XLogData | Keepalive]:
        """Replication frames as they arrive. Raises if nothing arrives for ``idle_timeout``."""
        from psycopg import OperationalError

        try:
            yield from self._frames(idle_timeout)
        except OperationalError as exc:  # the socket failed under libpq (no error from the server)
            raise self._lost(str(exc)) from None

    def _lost(self, message: str) -> CdcTransientError:
        return CdcTransientError(
            f"lost the replication connection to {self._info.describe()} while streaming: "
            f"{' '.join(message.split()).rstrip('.') or 'the server ended the stream'}. Nothing read on it was "
            "acknowledged; a retry streams the same changes again"
        )

    def _frames(self, idle_timeout: float) -> Iterator[XLogData | Keepalive]:
        # The hot loop of every stream window: one iteration per change, so it keeps to locals.
        conn = self._conn
        lock = self._lock
        get_copy_data = conn.get_copy_data
        unpack_wal_start = _WAL_START.unpack_from
        last_frame = time.monotonic()
        received = False
        while True:
            with lock:
                nbytes, data = get_copy_data(1)
            if nbytes > 0:
                received = True
                kind = data[0]
                if kind == 0x77:  # 'w' XLogData: wal_start, wal_end, send time, payload
                    yield XLogData(unpack_wal_start(data, 1)[0], bytes(data[25:]))
                elif kind == 0x6B:  # 'k' primary keepalive
                    wal_end, _send_time, reply_requested = _KEEPALIVE.unpack_from(data, 1)
                    if reply_requested:
                        self.send_status()
                    yield Keepalive(wal_end)
                continue
            if nbytes == 0:
                now = time.monotonic()
                if received:
                    last_frame, received = now, False
                elif now - last_frame > idle_timeout:
                    raise CdcTransientError(
                        f"no replication data or keepalive from {self._info.describe()} for "
                        f"{idle_timeout:.0f}s; the walsender may be stuck or the network down"
                    )
                select.select([conn.socket], [], [], 1.0)
                with lock:
                    conn.consume_input()
                continue
            # -1: the server ended the copy; -2: error
            result = conn.get_result()
            message = _error_text(result.error_message if result else conn.error_message)
            sqlstate = result.error_field(self._pq.DiagnosticField.SQLSTATE) if result else None
            if sqlstate is not None:  # the server's ErrorResponse: its callers may classify it
                primary = result.error_field(self._pq.DiagnosticField.MESSAGE_PRIMARY)
                raise StreamErrorResponse(str(self._lost(message)), sqlstate.decode(), _error_text(primary or b""))
            raise self._lost(message)

    def send_status(self) -> None:
        """A standby status update that reports no position: keeps the walsender from timing
        out without acknowledging anything (write/flush/apply are all InvalidXLogRecPtr)."""
        now = int(time.time() * 1_000_000) - PG_EPOCH_OFFSET_US
        message = _STATUS_UPDATE.pack(b"r", 0, 0, 0, now, 0)
        with self._lock:
            if self._streaming:
                self._conn.put_copy_data(message)
                self._conn.flush()

    def confirm_flush(self, flush_lsn: int) -> None:
        """A standby status update reporting ``flush_lsn`` as flushed: the acknowledgement of a
        source without ``pg_replication_slot_advance`` (YugabyteDB), sent only after the sink
        commit and the offset save. PostgreSQL captures never call it."""
        now = int(time.time() * 1_000_000) - PG_EPOCH_OFFSET_US
        message = _STATUS_UPDATE.pack(b"r", flush_lsn, flush_lsn, flush_lsn, now, 0)
        with self._lock:
            if not self._streaming:
                raise CdcError("confirm_flush needs a streaming replication connection")
            self._conn.put_copy_data(message)
            self._conn.flush()

    def close(self) -> None:
        self._stop_keeper.set()
        if self._keeper is not None:
            self._keeper.join(timeout=5)
        with self._lock:
            self._streaming = False
            self._conn.finish()

    def __enter__(self) -> ReplicationConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------------

    def _send_status_periodically(self, interval: float = 10.0) -> None:
        # While the consumer is busy writing a chunk it does not read the socket; these updates
        # reset the walsender's wal_sender_timeout so the connection survives long flushes.
        while not self._stop_keeper.wait(interval):
            try:
                self.send_status()
            except Exception:  # the main loop reports connection failures itself
                log.debug("status update failed", exc_info=True)
                return

    def _command(self, statement: str) -> None:
        """A statement without rows (``BEGIN``, ``COMMIT``) on the replication connection."""
        pq = self._pq
        result = self._conn.exec_(statement.encode())
        if result.status != pq.ExecStatus.COMMAND_OK:
            message = _error_text(result.error_message)
            raise CdcTransientError(
                f"{statement.split()[0]} failed on replication connection {self._info.describe()}: {message}"
            )

    def _execute(self, command: str) -> list[bytes | None]:
        pq = self._pq
        result = self._conn.exec_(command.encode())
        if result.status != pq.ExecStatus.TUPLES_OK:
            message = _error_text(result.error_message)
            sqlstate = result.error_field(pq.DiagnosticField.SQLSTATE)
            if sqlstate == b"42710":
                raise CdcError(f"replication slot already exists: {message}")
            raise CdcTransientError(f"replication command failed on {self._info.describe()}: {message}")
        return [result.get_value(0, i) for i in range(result.nfields)]


def classify_start_error(slot: str, message: str, sqlstate: bytes | None) -> CdcError:
    if sqlstate == b"42704":
        return SlotMissingError(f"replication slot {slot!r} does not exist: {message}")
    if sqlstate == b"55006":
        return ConcurrentCaptureError(
            f"replication slot {slot!r} is in use by another process ({message}); another run of this capture is active"
        )
    if "can no longer get changes" in message or "has been invalidated" in message or "removed" in message:
        return WalLostError(f"replication slot {slot!r} cannot stream: {message}")
    return CdcTransientError(f"START_REPLICATION on slot {slot!r} failed: {message}")


def _open_replication(info: PgConnectionInfo):  # -> psycopg.pq.PGconn
    """A ``replication=database`` libpq connection with ``info`` (as :func:`tls.open_connection`
    attempts it)."""
    from psycopg import pq

    conn = pq.PGconn.connect(info.conninfo(replication=True).encode())
    if conn.status != pq.ConnStatus.OK:
        message = _error_text(conn.error_message)
        conn.finish()
        raise CdcTransientError(
            f"cannot open a replication connection to {info.describe()}: {message}. "
            "The role needs the REPLICATION attribute and pg_hba.conf must allow it."
        )
    return conn


def _error_text(raw: bytes | None) -> str:
    text = (raw or b"").decode("utf-8", "replace").strip()
    return " ".join(text.split()) or "unknown error"
