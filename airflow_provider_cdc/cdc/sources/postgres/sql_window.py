"""Reading a bounded stream window through the logical decoding SQL functions, into Arrow.

A window is "the slot up to ``to_lsn``", so it can be read literally with one
``pg_logical_slot_peek_binary_changes(slot, to_lsn, NULL, <pgoutput options>)``: the server
decodes exactly the window (the same transactions as the walsender, see below) and the ADBC
PostgreSQL driver reads the result as ``COPY ... TO STDOUT (FORMAT binary)``, parsed in C into
Arrow batches of ``lsn`` int64, ``xid`` int64 and ``data`` binary (one pgoutput message a row, in
stream order). No per-message Python, no replication framing.

What is true of the SQL functions (``logicalfuncs.c: pg_logical_slot_get_changes_guts``, and
measured in ``tests/integration/postgres/test_sql_window.py``):

- Every call decodes from the slot's ``restart_lsn`` and returns what commits after its
  ``confirmed_flush_lsn``; ``upto_lsn`` stops the decoding after the first WAL record that ends
  at or past it. A transaction comes back at its commit record, so the window holds exactly the
  transactions whose commit record starts before ``to_lsn``: the collector's rule (a ``Begin``
  whose ``final_lsn >= to_lsn`` ends the window) selects the same ones.
- The ``lsn`` column is the walsender's ``wal_start`` of the same message (both are the decoding
  context's write location: a transaction's first LSN for Begin, the change's LSN, the commit's
  end for Commit), so the collector sees identical input.
- ``peek`` never moves the slot's ``confirmed_flush_lsn`` (it may advance ``restart_lsn`` and
  ``catalog_xmin`` only up to what is already confirmed, as any reader does).
- ``upto_nchanges`` counts rows returned, checked after each WAL record: a transaction comes back
  whole at its commit however large. Chunked ``get`` on a temporary copy of the slot re-decodes
  from the copy's ``restart_lsn`` on every call, which moves only at ``xl_running_xacts`` records
  (every 15 s, at checkpoints): over a backlog written quickly the work is quadratic (measured:
  docs/architecture.md). One ``peek`` is both the fastest and the simplest.
- The result is materialised server-side (a tuplestore: ``work_mem``, then a temporary file of
  about the window's output size) before the first row is sent; see :data:`MAX_SQL_WINDOW_BYTES`.
  So a large window is read as two ranges split at an LSN (:func:`split_point`): the first by a
  peek ``upto_lsn`` the split point, the second by a peek of a temporary copy of the slot
  advanced to it, on a second session started at once, so the server builds the second result
  while the client decodes the first. A copy decodes from its ``restart_lsn`` (a transaction
  begun before the split point comes back whole) and returns what commits at or after its
  ``confirmed_flush_lsn`` (the split point): each transaction once.

The slot is never acknowledged here: a ``peek`` cannot, and the only consuming calls
(``pg_replication_slot_advance``, when the slot is behind the window's start, and to the split
point) run on *temporary copies* of the slot, dropped with their session (also when the process
is killed).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError, CdcError, CdcTransientError
from airflow_provider_cdc.cdc.sources.postgres.connection import PgConnectionInfo, SessionSettings, quote_literal
from airflow_provider_cdc.cdc.sources.postgres.sql_session import (
    DRIVER_ERRORS,
    Session,
    SqlWindowUnavailable,
    connect,
    sql_error,
)

log = logging.getLogger(__name__)

#: The batches' columns, in this order.
SCHEMA = pa.schema([("lsn", pa.int64()), ("xid", pa.int64()), ("data", pa.binary())])

#: ``window_reader="auto"`` reads a window through SQL only up to this many bytes of WAL: the
#: server materialises the whole result (a temporary file of about the window's output size,
#: ~200 bytes a change measured) before sending it, and a larger window streams instead. The
#: output can exceed the span (a transaction begun before the window comes back whole), so a
#: result the server cannot build (:class:`SqlWindowUnavailable`) also streams.
MAX_SQL_WINDOW_BYTES = 1024 * 1024 * 1024

#: Batches fetched ahead on a thread while the collector decodes (a bounded queue). One: it lets
#: a remote server keep sending while a chunk is converted; on the two-core bench machine, with the
#: server on the same cores, it changed neither the client's CPU per change nor the wall time
#: measurably, and each batch ahead costs its size in memory.
PREFETCH_BATCHES = 1
#: ADBC's batch size hint (bytes of COPY data per Arrow batch, ~5 000 changes). Up to three
#: batches are held at once (the one decoded, the one queued, the one the driver builds): 1 MiB
#: measured 20-25 MiB below 4 MiB in peak RSS at the same client CPU per change
#: (``bench/stream_window.py --changes 200000 --chunk 100000``, two runs each).
BATCH_SIZE_HINT_BYTES = 1024 * 1024


#: A window of at least this many bytes of WAL is read as two ranges (:func:`split_point`): the
#: server builds the second range's result on a second session while the client decodes the
#: first, instead of the client waiting for the whole window's result. Below it, the second
#: session's fixed cost (a connection, a slot copy) is more than the wait it saves.
SPLIT_MIN_BYTES = 32 * 1024 * 1024


def split_point(from_lsn: int, to_lsn: int, wal_block_size: int) -> int | None:
    """Where the window ``[from_lsn, to_lsn)`` is split in two ranges, or None (too small).

    A third into the window: the client starts on the first range early, and the server (both
    results built at once; the second decodes again from its copy's ``restart_lsn``, queueing the
    first range's changes and dropping them at their commits, without output) has the second
    ready before the client is done with the first; measured: docs/architecture.md.

    The middle of that WAL page, precisely: a peek ``upto_lsn = m`` decodes
    every record that *starts* before ``m`` (it stops after the first one ending at or past it,
    which starts before it because ``m`` is 8-byte aligned and not in a page header), and a copy
    of the slot advanced to ``m`` returns exactly the transactions whose commit record starts at
    or after ``m`` (and the non-transactional messages from there): the two ranges are the window,
    each transaction whole and once, also one that began before ``m``."""
    if to_lsn - from_lsn < max(SPLIT_MIN_BYTES, 4 * wal_block_size):
        return None
    third = from_lsn + (to_lsn - from_lsn) // 3
    return third - third % wal_block_size + wal_block_size // 2


def use_sql(window_reader: str, *, supported: bool, span_bytes: int) -> bool:
    """Whether a window of ``span_bytes`` of WAL is read through SQL (``supported``: the source
    has the SQL functions: PostgreSQL does, YugabyteDB does not)."""
    if window_reader == "sql" and not supported:
        raise CdcConfigurationError(
            "window_reader='sql' needs PostgreSQL's logical decoding SQL functions, which this source does not "
            "have (YugabyteDB always streams): set window_reader to 'auto' or 'stream'"
        )
    if not supported or window_reader == "stream":
        return False
    return window_reader == "sql" or span_bytes <= MAX_SQL_WINDOW_BYTES


def flush_through(conn: Any, to_lsn: int, *, timeout: float) -> None:
    """Return once the server's WAL is flushed up to ``to_lsn`` (``conn``: a psycopg session in
    autocommit).

    A window ends at the insert position, but a ``peek`` decodes only WAL already flushed (its
    ``end_of_wal`` is ``GetFlushRecPtr()`` when it starts) and returns without error short of
    ``upto_lsn``: a non-transactional message or the tail of an asynchronous commit would be
    silently left out of the window, and skipped by the next one. The walsender waits for the
    flush instead. A commit of a transaction with an xid under ``synchronous_commit = local``
    flushes all WAL before its commit record, so one such commit settles it at once."""
    if _flush_lsn(conn) >= to_lsn:
        return
    with conn.transaction():
        conn.execute("SET LOCAL synchronous_commit = local")
        conn.execute("SELECT txid_current()")  # an xid, so the commit writes and flushes a record
    deadline = time.monotonic() + timeout
    while (flushed := _flush_lsn(conn)) < to_lsn:
        if time.monotonic() > deadline:
            raise CdcTransientError(
                f"the server's WAL is flushed only up to {flushed >> 32:X}/{flushed & 0xFFFFFFFF:X}, before the "
                f"window's end {to_lsn >> 32:X}/{to_lsn & 0xFFFFFFFF:X}, after {timeout:.0f} s; retry the window"
            )
        time.sleep(0.01)


def _flush_lsn(conn: Any) -> int:
    return int(conn.execute("SELECT (pg_current_wal_flush_lsn() - '0/0'::pg_lsn)::bigint").fetchone()[0])


def window_query(slot: str, to_lsn: int, options: dict[str, str]) -> str:
    """The ``peek`` of ``slot`` up to ``to_lsn`` with pgoutput's ``options``, as SQL text (ADBC
    reads a query without parameters through COPY binary)."""
    opts = ", ".join(f"{quote_literal(k)}, {quote_literal(v)}" for k, v in options.items())
    return (
        "SELECT (lsn - '0/0'::pg_lsn)::bigint AS lsn, xid::text::bigint AS xid, data "
        f"FROM pg_logical_slot_peek_binary_changes({quote_literal(slot)}, "
        f"'{to_lsn >> 32:X}/{to_lsn & 0xFFFFFFFF:X}'::pg_lsn, NULL{', ' + opts if opts else ''})"
    )


class SqlWindowReader:
    """One ADBC session reading one window; use as a context manager (closing it ends the
    session, and with it any temporary slot copy)."""

    def __init__(self, info: PgConnectionInfo, *, prefetch: int | None = None, settings: SessionSettings | None = None):
        self._info = info
        self._settings = settings or SessionSettings()  # each session's (connection.decoding_settings)
        self._prefetch = PREFETCH_BATCHES if prefetch is None else prefetch
        self._conn: Any = None
        self._readers: list[Iterator[pa.RecordBatch]] = []
        self._later: list[_LaterRange] = []

    def __enter__(self) -> SqlWindowReader:
        self._conn = connect(self._info, self._settings)
        return self

    def __exit__(self, *exc: object) -> None:
        # Every reader first: a batch reader still open (an error left its generator suspended)
        # may have a fetch thread inside the driver's stream, and closing the connection under it
        # crashes the process (ADBC frees the stream the thread reads).
        readers, self._readers = self._readers, []
        for batches in readers:
            batches.close()  # type: ignore[attr-defined]
        later, self._later = self._later, []
        for part in later:
            part.close()
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def batches(
        self,
        slot: str,
        from_lsn: int,
        to_lsn: int,
        options: dict[str, str],
        *,
        confirmed_flush: int,
        split_at: int | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """The window ``[from_lsn, to_lsn)`` of ``slot`` as Arrow batches in stream order.
        ``confirmed_flush``: the slot's, at most ``from_lsn``; when it is behind (an offset saved
        whose acknowledgement did not happen), a temporary copy advanced to ``from_lsn`` is read,
        so the window starts where the walsender would start it. ``split_at`` (see
        :func:`split_point`): the window is read as ``[from_lsn, split_at)`` on this session and
        ``[split_at, to_lsn)`` on a second one, whose result the server builds meanwhile; if the
        second range fails before its first batch, :attr:`resume_lsn` says where it starts.
        Closed with the reader at the latest."""
        if self._conn is None:
            raise CdcError("SqlWindowReader used outside its 'with' block")
        if split_at is not None and not from_lsn < split_at < to_lsn:
            raise ValueError(f"split point {split_at} is not inside the window [{from_lsn}, {to_lsn})")
        batches = self._batches(slot, from_lsn, to_lsn, options, confirmed_flush, split_at)
        self._readers.append(batches)
        return batches

    #: Where the rest of the window starts when a later range failed before its first batch (a
    #: result the server could not build): everything before it was read. None otherwise.
    resume_lsn: int | None = None

    def split_point(self, from_lsn: int, to_lsn: int, *, confirmed_flush: int) -> int | None:
        """:func:`split_point` of the window with this server's WAL page size, or None when the
        server has no replication slot to spare for the second range's temporary copy (nor for
        the first range's, when the slot is behind the window's start)."""
        if self._conn is None:
            raise CdcError("SqlWindowReader used outside its 'with' block")
        (facts,) = self._conn.rows(
            "SELECT current_setting('wal_block_size')::int AS page, current_setting('max_replication_slots')::int"
            " - (SELECT count(*) FROM pg_replication_slots)::int AS spare"
        )
        needed = 2 if confirmed_flush < from_lsn else 1
        return split_point(from_lsn, to_lsn, int(facts["page"])) if int(facts["spare"]) >= needed else None

    def _batches(
        self,
        slot: str,
        from_lsn: int,
        to_lsn: int,
        options: dict[str, str],
        confirmed_flush: int,
        split_at: int | None,
    ) -> Iterator[pa.RecordBatch]:
        later = None
        if split_at is not None:  # started first: the server builds both results at once
            later = _LaterRange(
                self._info, slot, split_at, lambda copy: window_query(copy, to_lsn, options), self._settings
            )
            self._later.append(later)
        source = slot
        if confirmed_flush < from_lsn:
            try:
                source = _copy_at(self._conn, slot, _copy_name(slot), from_lsn)
            except DRIVER_ERRORS as exc:
                raise self._error(slot, exc) from None
            log.info("slot %r is behind the window's start: reading a temporary copy advanced to it", slot)
        statement, reader = self._execute(slot, window_query(source, to_lsn if split_at is None else split_at, options))
        yield from self._fetched(slot, statement, reader)
        if later is None:
            return
        started = False
        try:
            statement, reader = later.result()
            for batch in self._fetched(slot, statement, reader):
                started = True
                yield batch
        except SqlWindowUnavailable:  # (it comes with the first batch: the result is built before any row)
            if not started:
                self.resume_lsn = split_at
            raise

    def _fetched(self, slot: str, statement: Any, reader: pa.RecordBatchReader) -> Iterator[pa.RecordBatch]:
        if self._prefetch <= 0:
            yield from self._checked(slot, statement, reader)
        else:
            yield from _prefetched(self._checked(slot, statement, reader), self._prefetch, cancel=statement.cancel)

    def _execute(self, slot: str, query: str) -> tuple[Any, pa.RecordBatchReader]:
        """The statement (it owns the result: keep it open while reading) and its batch reader."""
        try:
            return self._conn.stream(query, _stream_options())
        except DRIVER_ERRORS as exc:  # a signal handler's exception (Airflow's task termination) stays itself
            raise self._error(slot, exc) from None

    def _checked(self, slot: str, statement: Any, reader: pa.RecordBatchReader) -> Iterator[pa.RecordBatch]:
        try:
            for batch in reader:
                if batch.num_rows:
                    yield _with_schema(batch)
        except DRIVER_ERRORS as exc:
            raise self._error(slot, exc) from None
        finally:
            reader.close()
            statement.close()

    def _error(self, slot: str, exc: BaseException) -> CdcError:
        return sql_error(slot, exc, self._info)


def _stream_options() -> dict[str, str]:
    return {"adbc.postgresql.batch_size_hint_bytes": str(BATCH_SIZE_HINT_BYTES)}


def _copy_name(slot: str) -> str:
    """A temporary copy's name, unique among the sessions of this process (names are per
    cluster; a temporary copy is dropped with its session)."""
    return f"{slot[:40]}_cdc_window_{threading.get_ident() % 10**9}_{next(_COPIES)}"


_COPIES = itertools.count()


def _copy_at(conn: Session, slot: str, copy: str, lsn: int) -> str:
    """A temporary copy of ``slot`` on ``conn``'s session, advanced to ``lsn`` (``slot`` itself
    never moves): a peek of it returns what commits from ``lsn`` on."""
    conn.rows(f"SELECT 1 FROM pg_copy_logical_replication_slot({quote_literal(slot)}, {quote_literal(copy)}, true)")
    target = f"'{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}'::pg_lsn"
    # Fast-forward: the WAL is read, no change is decoded or output (measured: docs/architecture.md).
    conn.rows(f"SELECT 1 FROM pg_replication_slot_advance({quote_literal(copy)}, {target})")
    return copy


class _LaterRange:
    """The window from ``start`` on, prepared on its own session in a thread: a temporary copy of
    the slot advanced to ``start``, and ``query(copy)`` executed, which returns once the server
    has built the result (the driver releases the GIL meanwhile). :meth:`result` waits for it."""

    def __init__(
        self,
        info: PgConnectionInfo,
        slot: str,
        start: int,
        query: Callable[[str], str],
        settings: SessionSettings,
    ):
        self._info, self._slot, self._start, self._query = info, slot, start, query
        self._settings = settings
        self._session: Session | None = None
        self._statement: Any = None
        self._outcome: tuple[Any, pa.RecordBatchReader] | BaseException | None = None
        self._taken = False
        self._closed = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._prepare, name="cdc-sql-window-range", daemon=True)
        self._thread.start()

    def _prepare(self) -> None:
        try:
            copy = self._opened()
            if copy is None:
                return
            with self._lock:
                if self._closed:
                    return
                self._statement = self._session.prepare(self._query(copy), _stream_options())  # type: ignore[union-attr]
            self._outcome = (self._statement, self._session.execute(self._statement))  # type: ignore[union-attr]
        except BaseException as exc:  # raised by result(), in the reading thread
            self._outcome = exc

    def _opened(self) -> str | None:
        """The second session and its temporary copy advanced to the range's start (None: closed
        meanwhile). Both need what the first range did not: one more connection and one more
        replication slot, which another client may have taken since :meth:`split_point` counted
        them, so a failure here is "this range cannot be read this way" (``auto`` streams it)."""
        try:
            session = self._session = connect(self._info, self._settings)
            with self._lock:
                if self._closed:
                    return None
            return _copy_at(session, self._slot, _copy_name(self._slot), self._start)
        except (CdcError, *DRIVER_ERRORS) as exc:
            detail = sql_error(self._slot, exc, self._info) if isinstance(exc, DRIVER_ERRORS) else exc
            raise SqlWindowUnavailable(
                f"could not open the second range of the window of replication slot {self._slot!r} (a second "
                f"session holding a temporary copy of the slot, one more of the server's connections and of "
                f"max_replication_slots): {detail}"
            ) from None

    def result(self) -> tuple[Any, pa.RecordBatchReader]:
        """The range's statement (close it after its reader) and batches; its error, classified."""
        self._thread.join()
        outcome = self._outcome
        if isinstance(outcome, CdcError):
            raise outcome
        if isinstance(outcome, DRIVER_ERRORS):
            raise sql_error(self._slot, outcome, self._info) from None
        if isinstance(outcome, BaseException):
            raise outcome
        if outcome is None:
            raise CdcError("the window's later range was closed before it was read")
        self._taken = True
        return outcome

    def close(self) -> None:
        """Stop the thread (cancelling its statement if the server is still building the result),
        then end the session, and with it the temporary copy."""
        with self._lock:
            self._closed = True
        while self._thread.is_alive():
            # The statement once it runs; before, the session's own calls (the copy's advance reads
            # a third of the window's WAL or more): a connection-level cancel stops either.
            running = self._statement if self._statement is not None else self._session
            if running is not None:
                with contextlib.suppress(*DRIVER_ERRORS):
                    running.cancel()
            self._thread.join(timeout=0.1)
        if not self._taken:  # (once taken, the reading generator closes them)
            if isinstance(self._outcome, tuple):
                self._outcome[1].close()
            if self._statement is not None:
                with contextlib.suppress(*DRIVER_ERRORS):
                    self._statement.close()
        if self._session is not None:
            self._session.close()


def _with_schema(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The batch with :data:`SCHEMA` exactly (ADBC adds PostgreSQL type names as field metadata)."""
    return pa.RecordBatch.from_arrays(batch.columns, schema=SCHEMA)


def _prefetched(
    batches: Iterator[pa.RecordBatch], depth: int, *, cancel: Callable[[], None]
) -> Iterator[pa.RecordBatch]:
    """``batches`` read ahead in a thread (ADBC's reader releases the GIL while it waits and
    parses), at most ``depth`` batches ahead of the consumer. When the consumer stops early (an
    error, a window end before the last batch), the statement is cancelled so a thread waiting in
    the driver returns, and the thread is joined before anything closes the stream."""
    done = object()
    slots: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def fetch() -> None:
        try:
            for batch in batches:
                while not stop.is_set():
                    try:
                        slots.put(batch, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            item: Any = done
        except BaseException as exc:  # handed to the consumer, raised there
            item = exc
        while not stop.is_set():
            try:
                slots.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    thread = threading.Thread(target=fetch, name="cdc-sql-window-fetch", daemon=True)
    thread.start()
    try:
        while True:
            item = slots.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join(timeout=0.2)
        if thread.is_alive():
            try:
                cancel()
            except DRIVER_ERRORS:  # nothing left to cancel
                log.debug("cancelling the window's statement failed", exc_info=True)
            thread.join()
        batches.close()  # type: ignore[attr-defined]
