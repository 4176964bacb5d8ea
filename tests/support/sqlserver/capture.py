"""The stand-in's capture job: committed changes -> cdc.<capture_instance>_CT, asynchronously.

Like SQL Server's capture agent job it runs apart from the writers: a thread reads committed
transactions from a logical replication slot (``test_decoding``), in commit order, and for each
transaction touching a captured table writes one ``cdc.lsn_time_mapping`` row and its change rows,
all with ``__$start_lsn`` = the transaction's commit LSN and ``__$seqval`` ordering the changes.
A transaction is only taken once it committed at least ``lag`` seconds ago (capture latency);
while paused (Agent stopped, or the capture job stopped) nothing is captured.

What SQL Server stores, and where the stand-in takes it from (docs/sqlserver-standin.md):

- An update of a column of a unique or clustered index (the primary key, a UNIQUE constraint) is a
  *deferred update*, stored as a delete (1) and an insert (2), not as 3/4: KB302341 ("If you update
  any column that is part of a unique or clustered index, SQL Server implements the update as a
  deferred update ... a pair of DELETE and INSERT operations"; trace flag 8207 changes that for
  single-row updates, and is off) and KB3030352 (CDC: "When you update a row, there are two rows in
  the change table, with delete and insert for __$operation").
- ``__$command_id`` orders a transaction's changes; ``__$seqval`` does not ("Should not be used for
  ordering. Instead, use the __$command_id column": Learn, cdc.<capture_instance>_CT). For a
  multi-row deferred update all of the statement's deletes come before its inserts in
  ``__$command_id`` order, while ``__$seqval`` keeps each row's delete and insert together
  (Debezium's SqlServerDataQueryModeIT, dbz#2012, run on SQL Server: "function mode keeps each
  row's delete and insert together ... direct mode records all deletes before its inserts"), and
  the delete and insert of a row carry different ``__$command_id`` values (Debezium's
  sqlserver.adoc, event_serial_no, dbz#2012). A single-row key update keeps one ``__$seqval`` for
  both rows (same source); rows of a multi-row one get two ("If we perform PK updates in bulk, the
  seqvals are different for the delete and insert events", debezium/debezium#7728).
- Within a row's pair the insert may come first in ``__$seqval`` order (KB3030352: "an insert
  operation may unexpectedly appear before a delete operation"). When, is a guess from the sibling
  feature's KB4135113 (change tracking reads the same log): the insert comes first when the unique
  value moves down ("changed from a larger to a smaller value ... the insert operation before the
  delete operation"), the delete first when it moves up.
- Statements are told apart by a transactional logical message that a statement-level trigger on
  every stand-in table writes before each INSERT/UPDATE/DELETE (``standin.statement_marker``).
- Columns a change row does not carry (Learn, cdc.fn_cdc_get_all_changes_<capture_instance>,
  Remarks): computed columns are always NULL; ``image``/``text``/``ntext`` are NULL when
  ``__$operation`` is 1 or 3; ``varbinary(max)``/``varchar(max)``/``nvarchar(max)`` are NULL when
  ``__$operation`` is 3 unless the column changed (and carry their value for 1).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import threading
import time
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation

import psycopg

from . import lsn as lsnlib

log = logging.getLogger(__name__)

SLOT = "standin_cdc_capture"  # prefix: each stand-in database has its own slot


def slot_name(conn: psycopg.Connection) -> str:
    """The capture job's slot of the connected database. Slots are cluster-wide, and a SQL Server
    instance runs one capture job per CDC-enabled database: several stand-in databases may share
    a cluster (test-only emulation)."""
    database = conn.info.dbname
    readable = re.sub(r"[^a-z0-9_]", "_", database.lower())[:30]
    return f"{SLOT}_{readable}_{hashlib.sha1(database.encode()).hexdigest()[:8]}"


_CHANGE = re.compile(r"^table (?P<table>.+?): (?P<op>INSERT|UPDATE|DELETE|TRUNCATE): ?(?P<rest>.*)$", re.DOTALL)
_FIELD = re.compile(
    r"(?P<name>\"(?:[^\"]|\"\")*\"|[^\s\[\"]+)\[(?P<type>[^\]]*)\]:(?P<value>'(?:[^']|'')*'|\S+)", re.DOTALL
)
_MESSAGE = re.compile(r"^message: transactional: 1 prefix: standin\.statement, ")
_COMMIT = re.compile(r"^COMMIT (?P<xid>\d+)(?: \(at (?P<ts>.+)\))?$")
_BEGIN = re.compile(r"^BEGIN (?P<xid>\d+)$")
_UNCHANGED = object()


def _parse_tuple(text: str) -> dict[str, object]:
    values: dict[str, object] = {}
    for m in _FIELD.finditer(text):
        name = m.group("name")
        if name.startswith('"'):
            name = name[1:-1].replace('""', '"')
        raw = m.group("value")
        if raw == "null":
            value: object = None
        elif raw == "unchanged-toast-datum":
            value = _UNCHANGED
        elif raw.startswith("'"):
            value = raw[1:-1].replace("''", "'")
        else:
            value = raw
        values[name] = value
    return values


@dataclass
class _Change:
    lsn: str
    table: str  # as test_decoding prints it: schema.table with quote_ident
    op: str
    old: dict[str, object] | None
    new: dict[str, object] | None


_STATEMENT = "STATEMENT"  # a _Change that only marks where the next statement starts


@dataclass
class _Transaction:
    xid: int
    begin_lsn: str
    commit_lsn: str = ""
    commit_time: str | None = None
    changes: list[_Change] = field(default_factory=list)


@dataclass
class _Instance:
    name: str
    table_key: str
    start_lsn: bytes
    columns: list[tuple[str, str]]  # (name, pg type) in captured-column ordinal order
    key_columns: list[str]
    unique_columns: frozenset[str] = frozenset()  # columns of the primary key or any unique index
    uncarried: dict[str, str] = field(default_factory=dict)  # column -> "computed" | "lob" | "max"


class CaptureJob:
    """Background capture thread for one stand-in database."""

    def __init__(self, dsn: str, *, lag: float = 0.0, poll_interval: float = 0.1):
        self.dsn = dsn
        self.lag = lag
        self.poll_interval = poll_interval
        self.paused = False
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._caught_up_to = 0  # WAL position (int) everything before which has been captured
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.scans = 0

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> CaptureJob:
        self._thread = threading.Thread(target=self._run, daemon=True, name="standin-capture")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def poke(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self._stop.is_set():
                try:
                    self._scan(conn)
                except Exception as error:  # keep the job alive, report in wait_until_captured
                    log.exception("stand-in capture scan failed")
                    self.error = error
                self._wake.wait(self.poll_interval)
                self._wake.clear()

    # -- waiting ------------------------------------------------------------------------------

    def wait_until_captured(self, dsn_conn: psycopg.Connection, timeout: float = 30.0) -> None:
        """Blocks until every transaction committed before the call has been through capture."""
        target = _pg_int(dsn_conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.error is not None:
                raise RuntimeError("the stand-in capture job failed") from self.error
            with self._lock:
                if self._caught_up_to >= target:
                    return
            self._wake.set()
            time.sleep(0.02)
        raise TimeoutError(f"capture did not reach {target:X} within {timeout}s (paused={self._is_paused(dsn_conn)})")

    def _is_paused(self, conn: psycopg.Connection) -> bool:
        running = conn.execute("SELECT agent_running AND capture_job_running FROM standin.settings").fetchone()[0]
        return self.paused or not running

    # -- one scan -----------------------------------------------------------------------------

    def _scan(self, conn: psycopg.Connection) -> None:
        if self._is_paused(conn):
            return
        started = time.time()
        target = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
        rows = conn.execute(
            "SELECT lsn::text, xid::text::bigint, data FROM pg_logical_slot_peek_changes(%s, %s::pg_lsn, NULL, "
            "'include-xids', '1', 'include-timestamp', '1', 'skip-empty-xacts', '1')",
            (slot_name(conn), target),
        ).fetchall()
        transactions = self._group(rows)
        instances = self._instances(conn)
        now = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()[0]
        done_to: str | None = None
        captured_tx = 0
        commands = 0
        complete = True
        for txn in transactions:
            if not txn.commit_lsn:
                complete = False  # still being decoded (should not happen: peek stops at commits)
                break
            committed_at = conn.execute(
                "SELECT extract(epoch FROM %s::timestamptz)::float8", (txn.commit_time,)
            ).fetchone()[0]
            if now - committed_at < self.lag:
                complete = False
                break
            n = self._capture(conn, txn, instances)
            if n:
                captured_tx += 1
                commands += n
            done_to = txn.commit_lsn
        if done_to is not None:
            conn.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (slot_name(conn), done_to))
        if captured_tx:
            last = max(
                (t for t in transactions if t.commit_lsn and _pg_int(t.commit_lsn) <= _pg_int(done_to)),
                key=lambda t: _pg_int(t.commit_lsn),
            )
            last_lsn = lsnlib.debezium_string(lsnlib.from_pg(last.commit_lsn))
            conn.execute(
                "INSERT INTO standin.log_scan_sessions (start_time, end_time, duration, start_lsn, "
                "current_lsn, end_lsn, "
                "tran_count, last_commit_lsn, last_commit_time, log_record_count, command_count, first_begin_cdc_lsn, "
                "last_commit_cdc_lsn, last_commit_cdc_time, latency) VALUES "
                "(standin.capture_time(to_timestamp(%s)), "
                "sys.getdate(), %s, %s, %s, %s, %s, %s, "
                "standin.capture_time(%s::timestamptz), %s, %s, %s, %s, "
                "standin.capture_time(%s::timestamptz), %s)",
                (
                    started,
                    int(time.time() - started),
                    last_lsn,
                    last_lsn,
                    last_lsn,
                    captured_tx,
                    last_lsn,
                    last.commit_time,
                    commands,
                    commands,
                    last_lsn,
                    last_lsn,
                    last.commit_time,
                    max(int(now - _epoch(conn, last.commit_time)), 0),
                ),
            )
        self.scans += 1
        if complete:
            with self._lock:
                self._caught_up_to = max(self._caught_up_to, _pg_int(target))

    @staticmethod
    def _group(rows) -> list[_Transaction]:
        transactions: list[_Transaction] = []
        current: _Transaction | None = None
        for lsn, _xid, data in rows:
            m = _BEGIN.match(data)
            if m:
                current = _Transaction(int(m.group("xid")), lsn)
                transactions.append(current)
                continue
            m = _COMMIT.match(data)
            if m and current is not None:
                current.commit_lsn = lsn
                current.commit_time = m.group("ts")
                current = None
                continue
            if _MESSAGE.match(data) and current is not None:
                current.changes.append(_Change(lsn, "", _STATEMENT, None, None))
                continue
            m = _CHANGE.match(data)
            if m and current is not None:
                op, rest = m.group("op"), m.group("rest")
                old = new = None
                if op == "UPDATE":
                    if rest.startswith("old-key: "):
                        old_text, new_text = rest[len("old-key: ") :].split(" new-tuple: ", 1)
                        old, new = _parse_tuple(old_text), _parse_tuple(new_text)
                    else:
                        new = _parse_tuple(rest)
                elif op == "INSERT":
                    new = _parse_tuple(rest)
                elif op == "DELETE":
                    old = _parse_tuple(rest)
                current.changes.append(_Change(lsn, m.group("table"), op, old, new))
        return transactions

    @staticmethod
    def _instances(conn: psycopg.Connection) -> dict[str, list[_Instance]]:
        rows = conn.execute(
            r"""SELECT ct.capture_instance, format('%s.%s', quote_ident(n.nspname), quote_ident(c.relname)),
                      ct.start_lsn,
                      (SELECT array_agg(cc.column_name::text ORDER BY cc.column_ordinal)
                         FROM cdc.captured_columns cc WHERE cc.object_id = ct.object_id),
                      (SELECT array_agg(format_type(a.atttypid, a.atttypmod) ORDER BY cc.column_ordinal)
                         FROM cdc.captured_columns cc
                         JOIN pg_attribute a ON a.attrelid = ct.object_id::oid AND a.attname = cc.column_name
                        WHERE cc.object_id = ct.object_id),
                      coalesce((SELECT array_agg(a.attname::text ORDER BY a.attnum) FROM pg_index i
                         JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
                        WHERE i.indrelid = c.oid AND i.indisprimary), '{}'),
                      coalesce((SELECT array_agg(DISTINCT a.attname::text) FROM pg_index i
                         JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
                        WHERE i.indrelid = c.oid AND i.indisunique), '{}'),
                      coalesce((SELECT array_agg(ARRAY[a.attname::text,
                                   CASE WHEN a.attgenerated <> '' THEN 'computed'
                                        WHEN d.declared IN ('text', 'ntext', 'image') THEN 'lob' ELSE 'max' END])
                         FROM pg_attribute a LEFT JOIN standin.declared_columns d
                           ON d.relid = a.attrelid AND d.column_name = a.attname
                        WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
                          AND (a.attgenerated <> '' OR d.declared IN ('text', 'ntext', 'image')
                               OR d.declared ~ '\(max\)$')), '{}')
               FROM cdc.change_tables ct JOIN pg_class c ON c.oid = ct.source_object_id::oid
               JOIN pg_namespace n ON n.oid = c.relnamespace"""
        ).fetchall()
        found: dict[str, list[_Instance]] = {}
        for name, key, start_lsn, cols, types, keys, unique, uncarried in rows:
            found.setdefault(key, []).append(
                _Instance(
                    name,
                    key,
                    bytes(start_lsn),
                    list(zip(cols or [], types or [])),
                    keys,
                    frozenset(unique),
                    dict(uncarried),
                )
            )
        return found

    def _capture(self, conn: psycopg.Connection, txn: _Transaction, instances: dict[str, list[_Instance]]) -> int:
        commit = lsnlib.from_pg(txn.commit_lsn)
        rows_by_instance: dict[str, list[tuple]] = {}
        slots: dict[str, int] = {}
        command_id = 0
        for statement in _statements(txn.changes):
            command_id = self._capture_statement(statement, instances, commit, slots, command_id, rows_by_instance)
        if not rows_by_instance:
            return 0
        with conn.transaction():
            for inst_name, rows in rows_by_instance.items():
                inst = next(i for group in instances.values() for i in group if i.name == inst_name)
                cols = "".join(f', "{c}"' for c, _ in inst.columns)
                casts = "".join(f", %s::{t}" for _, t in inst.columns)
                sql = (
                    f'INSERT INTO cdc."{inst_name}_CT" ("__$start_lsn", "__$end_lsn", "__$seqval", "__$operation", '
                    f'"__$update_mask"{cols}, "__$command_id") VALUES (%s, NULL, %s, %s, %s{casts}, %s)'
                )
                with conn.cursor() as cur:
                    cur.executemany(
                        sql,
                        [
                            (commit, seq, op, mask, *[_text(v) for v in values], cid)
                            for seq, op, mask, values, cid in rows
                        ],
                    )
            # Commit times in the server's local time, as datetime (clock.sql: standin.capture_time).
            conn.execute(
                "INSERT INTO cdc.lsn_time_mapping (start_lsn, tran_begin_time, tran_end_time, tran_id, tran_begin_lsn) "
                "VALUES (%s, standin.capture_time(%s::timestamptz), standin.capture_time(%s::timestamptz), %s, %s) "
                "ON CONFLICT (start_lsn) DO NOTHING",
                (commit, txn.commit_time, txn.commit_time, txn.xid.to_bytes(10, "big"), lsnlib.from_pg(txn.begin_lsn)),
            )
        return sum(len(r) for r in rows_by_instance.values())

    @staticmethod
    def _capture_statement(
        statement: list[_Change],
        instances: dict[str, list[_Instance]],
        commit: bytes,
        slots: dict[str, int],
        command_id: int,
        out: dict[str, list[tuple]],
    ) -> int:
        """One statement's change rows: ``(seqval, operation, mask, values, command_id)`` per instance.
        Returns the last ``__$command_id`` used. Deferred updates put all the statement's deletes
        before its inserts in ``__$command_id`` order (see the module docstring)."""

        def seqval(lsn: str) -> bytes:
            slot = slots.get(lsn, 0)
            slots[lsn] = slot + 1
            return lsnlib.from_pg(lsn, slot)

        captured = [(c, [i for i in instances.get(c.table, []) if i.start_lsn < commit]) for c in statement]
        captured = [(c, targets) for c, targets in captured if targets and c.op != "TRUNCATE"]
        splits = sum(1 for c, targets in captured if c.op == "UPDATE" and _is_deferred(c, targets[0]))
        later: list[tuple[_Change, list[_Instance], bytes, tuple]] = []  # the inserts of deferred updates
        for change, targets in captured:
            if change.op in ("INSERT", "DELETE"):
                command_id += 1
                operation, image = (2, change.new) if change.op == "INSERT" else (1, change.old)
                _emit(out, targets, seqval(change.lsn), operation, None, image, command_id)
                continue
            old = change.old or change.new
            new = {k: (old.get(k) if v is _UNCHANGED else v) for k, v in change.new.items()}
            if _is_deferred(change, targets[0]):
                first, second = seqval(change.lsn), None
                if splits > 1:
                    second = seqval(change.lsn)
                    if _moves_down(old, new, targets[0]):
                        first, second = second, first  # the insert is logged first (KB4135113)
                command_id += 1
                _emit(out, targets, first, 1, None, old, command_id)
                later.append((change, targets, second or first, new))
                continue
            command_id += 1
            seq = seqval(change.lsn)
            changed = {k for k in set(old) | set(new) if old.get(k) != new.get(k)}
            _emit(out, targets, seq, 3, changed, old, command_id)
            _emit(out, targets, seq, 4, changed, new, command_id)
        for _change, targets, seq, new in later:
            command_id += 1
            _emit(out, targets, seq, 2, None, new, command_id)
        return command_id


def _statements(changes: list[_Change]) -> list[list[_Change]]:
    """The transaction's changes cut at the statement markers."""
    out: list[list[_Change]] = [[]]
    for change in changes:
        if change.op == _STATEMENT:
            out.append([])
        else:
            out[-1].append(change)
    return [s for s in out if s]


def _is_deferred(change: _Change, inst: _Instance) -> bool:
    """An update of a column of a unique or clustered index (KB302341)."""
    if change.op != "UPDATE" or change.old is None:
        return False
    return any(
        change.old.get(c) != change.new.get(c) for c in inst.unique_columns if change.new.get(c) is not _UNCHANGED
    )


def _moves_down(old: dict[str, object], new: dict[str, object], inst: _Instance) -> bool:
    """Whether the first changed unique column's value gets smaller (guess, from KB4135113)."""
    for column in sorted(inst.unique_columns):
        before, after = old.get(column), new.get(column)
        if before != after and before is not None and after is not None:
            try:
                return Decimal(str(after)) < Decimal(str(before))
            except InvalidOperation:
                return str(after) < str(before)
    return False


def _emit(
    out: dict[str, list[tuple]],
    targets: list[_Instance],
    seqval: bytes,
    operation: int,
    changed: set[str] | None,
    image: dict[str, object],
    command_id: int,
) -> None:
    """One change row per instance; ``changed`` None: every column (insert, delete, deferred update)."""
    for inst in targets:
        names = [c for c, _ in inst.columns]
        ordinals = range(1, len(names) + 1) if changed is None else [i + 1 for i, c in enumerate(names) if c in changed]
        values = [_carried(inst, c, operation, changed, image.get(c)) for c in names]
        out.setdefault(inst.name, []).append((seqval, operation, _mask(len(names), ordinals), values, command_id))


def _carried(inst: _Instance, column: str, operation: int, changed: set[str] | None, value: object) -> object:
    """What SQL Server stores for a column (Learn, cdc.fn_cdc_get_all_changes_<capture_instance>,
    Remarks): computed columns always NULL; image/text/ntext NULL for 1 and 3; (max) types NULL for 3
    unless the column changed."""
    kind = inst.uncarried.get(column)
    if kind == "computed":
        return None
    if kind == "lob" and operation in (1, 3):
        return None
    if kind == "max" and operation == 3 and changed is not None and column not in changed:
        return None
    return value


def _text(value: object) -> str | None:
    return None if value is None or value is _UNCHANGED else str(value)


def _mask(ncols: int, ordinals) -> bytes:
    nbytes = max((ncols + 7) // 8, 1)
    value = 0
    for ordinal in ordinals:
        value |= 1 << (ordinal - 1)
    return value.to_bytes(nbytes, "big")


def _pg_int(pg_lsn: str) -> int:
    high, low = pg_lsn.split("/")
    return (int(high, 16) << 32) | int(low, 16)


def _epoch(conn: psycopg.Connection, ts: str) -> float:
    return conn.execute("SELECT extract(epoch FROM %s::timestamptz)::float8", (ts,)).fetchone()[0]


def create_slot(conn: psycopg.Connection) -> None:
    with contextlib.suppress(psycopg.errors.DuplicateObject):
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (slot_name(conn),))


def drop_slot(conn: psycopg.Connection) -> None:
    with contextlib.suppress(psycopg.Error):
        conn.execute("SELECT pg_drop_replication_slot(%s)", (slot_name(conn),))
