"""What the crash harness (``tests/support/crash.py``) needs to know about each source.

The harness itself is source-neutral: it runs capture tasks in a child process that is killed,
recovers in the test process, and checks the invariants on the sink's commit log and events. A
:class:`CrashSource` adapter supplies the rest, for one source database:

- ``build(fields)``: the capture from its JSON fields, in the child (``crash_driver``) and in the
  test process alike, and ``operator(step)``: the task class of ``setup``/``snapshot``/``batch``
  (``OPERATOR_NAMES``: PostgreSQL's named subclasses, SQL Server's and YugabyteDB's the shared
  operators);
- ``capture_fields(crash)``: the source's part of a capture's fields (connection, offset store);
- ``child_setup()``: what the child process prepares before it builds the capture;
  ``child_env(crash)``: environment the child gets on top of the test process's;
  ``after_child(crash)``: what the server would do once the child is gone (neither source needs
  anything: their servers end a closed connection's sessions themselves);
- ``settle()`` / ``position()``: wait until the source's change capture has taken in everything
  committed so far (SQL Server's capture job is asynchronous) / the position a stream window has
  to reach to cover it;
- ``source_rows(table, keys)``: the table's rows now (compared with the replayed events);
- ``stored_offset(crash)``: the stored offset, read from the test process;
- ``check_acknowledged(crash, offset)``: the source's side of "nothing pending" (PostgreSQL: the
  slot is acknowledged at the offset; SQL Server has nothing to acknowledge: no session still holds
  the capture lock, and the offset keeps the capture instances the next window checks; YugabyteDB:
  the slot is confirmed at the offset's end or behind it, never ahead, and no session holds the lock);
- ``check_events(table, events)``: checks of the event fields only this source has;
- ``mutate(round_no)``: one round of the source's workload, returning the transactions it committed
  (the concurrent writers run it from a thread);
- ``forget(crash)``: drop what a finished capture left on the source (PostgreSQL and YugabyteDB:
  its slot).

The stand-in sources (SQL Server, YugabyteDB through logical replication and through the CDC
service) share :class:`StandInCrashSource`: a workload module of the stand-in, offsets in Airflow
Variables, the capture lock read from PostgreSQL's ``pg_locks``. Both YugabyteDB paths take the
capture lock as YSQL's advisory lock (:class:`YsqlStandInCrashSource`). The CDC-service adapter
(:class:`YugabyteCdcCrashSource`) gives each capture a DB stream of its own, and its "nothing
pending" is the tablets' checkpoints stored on the server: never ahead of the stored offset's,
equal to them after a completed run.

The child driver finds the adapter by ``NAME`` in :data:`SOURCES`; it imports only this module
and the product, so the adapters import test-only helpers (the stand-in) lazily.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from airflow_provider_cdc.captures.base import Capture
    from airflow_provider_cdc.cdc.basics.positions import Position
    from airflow_provider_cdc.cdc.planning.offset import CaptureOffset
    from tests.support.crash import CrashCapture
    from tests.support.databases import CaptureDatabase
    from tests.support.sqlserver import SqlServerStandIn
    from tests.support.yugabyte import YugabyteStandIn
    from tests.support.yugabyte_cdc import YugabyteCdcStandIn


class CrashSource(ABC):
    """One source database as the crash harness sees it (see the module docstring)."""

    NAME: ClassVar[str]
    #: step name -> "module:Class" of the operator the step runs (imported where it runs).
    OPERATOR_NAMES: ClassVar[dict[str, str]]

    # -- in either process ----------------------------------------------------------------------

    @classmethod
    @abstractmethod
    def build(cls, fields: dict[str, Any]) -> Capture:
        """The capture of ``fields`` (JSON: what ``capture_fields`` and the harness put there)."""

    @classmethod
    def operator(cls, step: str) -> type:
        module, _, name = cls.OPERATOR_NAMES[step].partition(":")
        return getattr(importlib.import_module(module), name)

    @classmethod
    def child_setup(cls) -> None:
        """Prepare the child process before the capture is built (nothing by default)."""
        return None

    # -- in the test process --------------------------------------------------------------------

    def child_env(self, crash: CrashCapture) -> dict[str, str]:
        """Environment variables the child gets on top of this process's (none by default)."""
        return {}

    def after_child(self, crash: CrashCapture) -> None:
        """Once the child exited (or was killed): what the source's server does when a client dies
        (nothing by default: PostgreSQL, and SQL Server's stand-in through its proxy, end the
        sessions of a closed connection by themselves)."""
        return None

    @abstractmethod
    def capture_fields(self, crash: CrashCapture) -> dict[str, Any]:
        """The source's fields of ``crash``'s capture (JSON values only: they go to the child)."""

    def settle(self) -> None:
        """Wait until the source's change capture has everything committed so far (no-op where
        changes are capturable at commit)."""
        return None

    @abstractmethod
    def position(self) -> Position:
        """After ``settle``: a stream window ending at or after this covers every commit so far."""

    @abstractmethod
    def source_rows(self, table: str, keys: list[str]) -> dict[tuple, dict]:
        """The rows of ``table`` now, by key."""

    def stored_offset(self, crash: CrashCapture) -> CaptureOffset | None:
        from airflow_provider_cdc.offsets.base import load_offset

        capture = crash.capture()
        return load_offset(capture.store(), crash.prefix, capture.OFFSET_TYPE)

    @abstractmethod
    def check_acknowledged(self, crash: CrashCapture, offset: CaptureOffset) -> None:
        """The source holds nothing behind ``offset`` (the last committed window's end)."""

    def check_events(self, table: str, events: list[dict]) -> None:
        """Checks of one table's committed events that only this source's fields allow."""
        return None

    @abstractmethod
    def mutate(self, round_no: int) -> int:
        """One round of writes (``round_no`` is unique per database); returns its transactions."""

    def forget(self, crash: CrashCapture) -> None:
        """Drop what ``crash``'s capture holds on the source, once it is verified."""
        return None


# -- PostgreSQL --------------------------------------------------------------------------------


class PostgresCrashSource(CrashSource):
    """A test database with the shop schema; offsets in a state table; the capture's slot."""

    NAME = "postgres"
    OPERATOR_NAMES = {
        "setup": "airflow_provider_cdc.operators.setup:CdcSetupOperator",
        "snapshot": "airflow_provider_cdc.operators.snapshot:CdcSnapshotOperator",
        "batch": "airflow_provider_cdc.operators.window:CdcWindowOperator",
    }

    def __init__(self, db: CaptureDatabase, conn_id: str, offset_table: str = "cdc_state.offsets"):
        self.db = db
        self.conn_id = conn_id
        self.offset_table = offset_table

    @classmethod
    def build(cls, fields: dict[str, Any]) -> Capture:
        from airflow_provider_cdc.capture import PostgresCapture

        return PostgresCapture(**fields)

    def slot(self, prefix: str) -> str:
        return f"slot_{prefix}_{self.db.name}"[:63]

    def capture_fields(self, crash: CrashCapture) -> dict[str, Any]:
        return {
            "postgres_conn_id": self.conn_id,
            "slot_name": self.slot(crash.prefix),
            "publication_name": f"pub_{crash.prefix}",
            "offset_store": "state_table",
            "offset_table": self.offset_table,
        }

    def position(self) -> Position:
        return self.db.current_lsn()

    def source_rows(self, table: str, keys: list[str]) -> dict[tuple, dict]:
        from tests.support.oracle import source_rows

        with self.db.connect() as conn:
            return source_rows(conn, table, keys)

    def stored_offset(self, crash: CrashCapture) -> CaptureOffset | None:
        from airflow_provider_cdc.cdc.sources.postgres.offset import PostgresOffset

        schema, table = self.offset_table.split(".")
        with self.db.connect() as conn:
            row = conn.execute(
                f'SELECT document::text FROM "{schema}"."{table}" WHERE capture = %s', (crash.prefix,)
            ).fetchone()
        return None if row is None else PostgresOffset.from_json(row[0])

    def check_acknowledged(self, crash: CrashCapture, offset: CaptureOffset) -> None:
        status = self.db.slot_status(self.slot(crash.prefix))
        assert status is not None and status.confirmed_flush_lsn == offset.lsn, "the slot is not acknowledged"

    def check_events(self, table: str, events: list[dict]) -> None:
        from tests.support.oracle import assert_source_blocks

        assert_source_blocks(events)

    def mutate(self, round_no: int) -> int:
        from airflow_provider_cdc.testing import shop

        with self.db.connect() as conn:
            return shop.mutate(conn, round_no=round_no).transactions

    def forget(self, crash: CrashCapture) -> None:
        with self.db.connect() as conn:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (self.slot(crash.prefix),))


# -- the stand-ins (SQL Server, YugabyteDB) ----------------------------------------------------


class StandInCrashSource(CrashSource):
    """A source emulated by a stand-in over PostgreSQL (``standin``), with its test workload
    (``WORKLOAD``: a module with ``KEYS``, ``TRANSACTIONS_PER_ROUND``, ``mutate(standin, round_no)``
    and ``source_rows(standin, table)``).

    Offsets live in Airflow Variables (``VariableOffsetStore``, one key prefix per stand-in
    database). The Task SDK's ``Variable`` writes only from inside a running task, and the crash
    tasks run as bare ``operator.execute`` calls (in the child and in the test process), so
    :func:`metadata_variables` points the store's ``Variable`` at Airflow's ``models.Variable``:
    the same Variable rows in the metadata database, reached directly outside a task (and through
    the Task SDK inside one, as before). The store's own code, revision check included, is unchanged.
    """

    #: Both stand-in sources run the shared operators.
    OPERATOR_NAMES = {
        "setup": "airflow_provider_cdc.operators.setup:CdcSetupOperator",
        "snapshot": "airflow_provider_cdc.operators.snapshot:CdcSnapshotOperator",
        "batch": "airflow_provider_cdc.operators.window:CdcWindowOperator",
    }
    #: The test workload's module (imported where it runs).
    WORKLOAD: ClassVar[str]
    #: A harness-only field: the key prefix of the capture's Variable (not a capture field).
    VARIABLE_PREFIX = "offset_variable_prefix"

    def __init__(self, standin: Any, conn_id: str):
        self.standin = standin
        self.conn_id = conn_id

    @classmethod
    def workload(cls) -> Any:
        return importlib.import_module(cls.WORKLOAD)

    @classmethod
    def variable_store(cls, fields: dict[str, Any]) -> tuple[dict[str, Any], Any]:
        """``fields`` without the harness-only Variable prefix, and the offset store it names."""
        from airflow_provider_cdc.offsets.variable import VariableOffsetStore

        fields = dict(fields)
        return fields, VariableOffsetStore(key_prefix=fields.pop(cls.VARIABLE_PREFIX))

    @classmethod
    def child_setup(cls) -> None:
        _use_metadata_variables()

    def variable_fields(self) -> dict[str, Any]:
        return {self.VARIABLE_PREFIX: f"cdc_offset_{self.standin.database}__"}

    def source_rows(self, table: str, keys: list[str]) -> dict[tuple, dict]:
        workload = self.workload()
        assert workload.KEYS[table] == keys, f"{table}: keys {keys}, the workload's are {workload.KEYS[table]}"
        return workload.source_rows(self.standin, table)

    def mutate(self, round_no: int) -> int:
        workload = self.workload()
        workload.mutate(self.standin, round_no)
        return workload.TRANSACTIONS_PER_ROUND

    def admin_query(self, sql: str, params: tuple = ()) -> list[tuple]:
        """Rows of ``sql`` run straight on the PostgreSQL database behind the stand-in."""
        return self.standin.admin_query(sql, params)

    def advisory_lock_holders(self, key_sql: str, params: tuple) -> list[int]:
        """The stand-in's sessions (PostgreSQL backends) holding the bigint advisory lock whose key
        is ``key_sql`` (an SQL expression of ``params``), read straight on PostgreSQL."""
        rows = self.admin_query(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND granted "
            f"AND ((classid::bigint << 32) | objid::bigint) = ({key_sql})",
            params,
        )
        return [pid for (pid,) in rows]


# -- SQL Server (the stand-in) -----------------------------------------------------------------


class SqlServerCrashSource(StandInCrashSource):
    """The SQL Server stand-in (docs/sqlserver-standin.md) with ``workload``'s tables; offsets in
    Airflow Variables (see :class:`StandInCrashSource`).

    Nothing is needed after a killed child: like SQL Server, the stand-in ends the session of a
    client whose connection closed (its proxy passes the disconnect on to PostgreSQL), which
    releases the session's application lock (the capture lock); ``check_acknowledged`` checks it.
    """

    NAME = "sqlserver"
    WORKLOAD = "tests.support.sqlserver.workload"
    standin: SqlServerStandIn

    @classmethod
    def build(cls, fields: dict[str, Any]) -> Capture:
        from airflow_provider_cdc.captures.sqlserver import SqlServerCapture

        fields, store = cls.variable_store(fields)
        return SqlServerCapture(**fields, offset_store=store)

    def capture_fields(self, crash: CrashCapture) -> dict[str, Any]:
        return {"sqlserver_conn_id": self.conn_id, **self.variable_fields()}

    def settle(self) -> None:
        self.standin.wait_until_captured()

    def position(self) -> Position:
        from airflow_provider_cdc.cdc.sources.sqlserver.lsn import SqlServerLsn

        newest = self.standin.wait_until_captured()
        # Windows are [from, to) and end after the capture job's newest LSN.
        return SqlServerLsn(0) if newest is None else SqlServerLsn(newest).next()

    def check_acknowledged(self, crash: CrashCapture, offset: CaptureOffset) -> None:
        """Nothing to acknowledge on SQL Server (the change rows stay until the cleanup job). What
        a crash could leave instead: a session still holding the capture's application lock, or an
        offset (rolled forward from the commit log) that forgot the capture instances whose
        retention the next window checks."""
        from airflow_provider_cdc.cdc.sources.sqlserver.admin import lock_resource
        from tests.support.sqlserver import workload

        instances = (offset.extra.get("source_state") or {}).get("instances")
        tables = [t for t in crash.keys if t in workload.KEYS] + [crash.overrides.get("signal_table") or ""]
        expected = sorted(table.replace(".", "_") for table in tables if table)
        assert instances == expected, f"the offset keeps capture instances {instances}, expected {expected}"

        held = self.lock_holders(lock_resource(crash.prefix))
        assert not held, f"session(s) {held} still hold the capture lock of {crash.prefix!r}"

    def lock_holders(self, resource: str) -> list[int]:
        """The stand-in's sessions (PostgreSQL backends) holding the application lock ``resource``."""
        return self.advisory_lock_holders("hashtextextended('applock:' || %s, 0)", (resource,))

    def check_events(self, table: str, events: list[dict]) -> None:
        """Every stream event once by its SQL Server position (commit LSN, change LSN, serial);
        the events of one transaction share its commit LSN."""
        stream = [e for e in events if e["op"] != "r"]
        assert all(e["source"]["connector"] == "sqlserver" for e in events)
        seen = Counter(
            (e["source"]["commit_lsn"], e["source"]["change_lsn"], e["source"]["event_serial_no"]) for e in stream
        )
        twice = [p for p, n in seen.items() if n > 1]
        assert not twice, f"{table}: change events written twice: {twice[:5]}"
        commits: dict[str, set[str]] = {}
        for e in stream:
            commits.setdefault(e["transaction"]["id"], set()).add(e["source"]["commit_lsn"])
        split = {tx: lsns for tx, lsns in commits.items() if len(lsns) > 1}
        assert not split, f"{table}: a transaction's events name different commit LSNs: {split}"


# -- YugabyteDB (the stand-ins) ----------------------------------------------------------------


class YsqlStandInCrashSource(StandInCrashSource):
    """A YugabyteDB stand-in: the capture lock is YSQL's session-level advisory lock (PostgreSQL's
    key for the topic prefix), which a killed child's session releases as its backend ends."""

    def check_capture_lock_released(self, crash: CrashCapture) -> None:
        from airflow_provider_cdc.cdc.sources.postgres.admin import _lock_key

        held = self.advisory_lock_holders("%s::bigint", (_lock_key(crash.prefix),))
        assert not held, f"session(s) {held} still hold the capture lock of {crash.prefix!r}"


class YugabyteCrashSource(YsqlStandInCrashSource):
    """The YugabyteDB stand-in (docs/yugabytedb-standin.md) with ``yb_workload``'s tables; offsets
    in Airflow Variables (see :class:`StandInCrashSource`); each capture its own slot (``cdc_<prefix>``).

    The child reaches the stand-in's proxy (a TCP port of a service process the test process
    owns, which outlives the killed child) through the Airflow connection it gets in its
    environment (``child_env``). Nothing is needed after a killed child: the proxy passes the
    disconnect on to PostgreSQL, whose backend ends and releases the capture's advisory lock.
    Changes are streamable once committed (the stand-in's journal is waited for by the window's
    reader, which stops at the fence row), so ``settle`` is a no-op and a window planned after
    ``position`` (the server's hybrid time) covers every commit before it.

    "Acknowledged" (``check_acknowledged``): the slot's ``confirmed_flush_lsn`` is at the stored
    offset's end minus one, or behind it (the acknowledgement is best-effort: what it missed is
    retransmitted, skipped, and acknowledged by a later run), never ahead of it; and no session
    holds the capture lock. ``behind`` lists the checks that found the slot behind. The "never
    ahead" half is also checked right after every child (``after_child``), before any recovery: a
    killed task must not leave the slot confirmed past the offset it stored.
    """

    NAME = "yugabyte"
    WORKLOAD = "tests.support.yb_workload"
    standin: YugabyteStandIn

    def __init__(self, standin: YugabyteStandIn, conn_id: str):
        super().__init__(standin, conn_id)
        self.behind: list[str] = []

    @classmethod
    def build(cls, fields: dict[str, Any]) -> Capture:
        from airflow_provider_cdc.captures.yugabyte import YugabyteCapture

        fields, store = cls.variable_store(fields)
        return YugabyteCapture(**fields, offset_store=store)

    @staticmethod
    def slot(crash: CrashCapture) -> str:
        return crash.capture().resolved_slot_name  # type: ignore[attr-defined]

    def capture_fields(self, crash: CrashCapture) -> dict[str, Any]:
        return {"yugabytedb_conn_id": self.conn_id, "idle_timeout_seconds": 60.0, **self.variable_fields()}

    def child_env(self, crash: CrashCapture) -> dict[str, str]:
        from tests.support.yugabyte.fixtures import airflow_connection

        return {f"AIRFLOW_CONN_{self.conn_id.upper()}": airflow_connection(self.standin)}

    def after_child(self, crash: CrashCapture) -> None:
        """Nothing for the server to do (see the class docstring); check the slot is not ahead of
        what landed: the stored offset, or the commit log's last window where a killed child's
        offset write did not survive (the next run restores the offset from the log)."""
        from dataclasses import replace

        from airflow_provider_cdc.cdc.sinks.commit_log import CommitLog
        from airflow_provider_cdc.cdc.sinks.storage import storage_for

        offset = self.stored_offset(crash)
        if offset is None or offset.lsn is None or not self.has_slot(self.slot(crash)):
            return
        committed = CommitLog(storage_for(str(crash.sink)), crash.prefix).committed()
        landed = committed[-1].window.to_lsn if committed else None
        if landed is not None and int(landed) > int(offset.lsn):
            offset = replace(offset, lsn=landed)
        self.check_not_ahead(crash, offset)

    def position(self) -> Position:
        from airflow_provider_cdc.cdc.sources.yugabyte.lsn import YbLsn

        with self.standin.connect() as conn:
            return YbLsn(conn.execute("SELECT yb_get_current_hybrid_time_lsn()").fetchone()[0])

    def has_slot(self, slot: str) -> bool:
        with self.standin.connect() as conn:
            return (
                conn.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone() is not None
            )

    def confirmed_flush(self, slot: str) -> Position | None:
        """The slot's ``confirmed_flush_lsn`` as YugabyteDB lists it (the slot must exist)."""
        from airflow_provider_cdc.cdc.sources.yugabyte.lsn import YbLsn

        with self.standin.connect() as conn:
            row = conn.execute(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,)
            ).fetchone()
        assert row is not None, f"the slot {slot!r} is missing"
        return None if row[0] is None else YbLsn(row[0])

    def check_not_ahead(self, crash: CrashCapture, offset: CaptureOffset) -> Position:
        """The slot's confirmed flush, asserted at or before the offset's end minus one."""
        assert offset.lsn is not None
        confirmed = self.confirmed_flush(self.slot(crash))
        assert confirmed is not None and int(confirmed) <= int(offset.lsn) - 1, (
            f"the slot of {crash.prefix!r} is confirmed up to {confirmed}, ahead of the end of what landed "
            f"{offset.lsn} (minus one)"
        )
        return confirmed

    def check_acknowledged(self, crash: CrashCapture, offset: CaptureOffset) -> None:
        confirmed = self.check_not_ahead(crash, offset)
        if int(confirmed) < int(offset.lsn) - 1:  # type: ignore[arg-type]
            self.behind.append(f"{crash.prefix}: slot at {confirmed}, offset {offset.lsn}")
        self.check_capture_lock_released(crash)

    # YugabyteDB's events have PostgreSQL's source block (connector "postgresql", Debezium's
    # YugabyteDB connector's shape): the same checks.
    check_events = PostgresCrashSource.check_events

    def forget(self, crash: CrashCapture) -> None:
        """Drop the slot, waiting out the stand-in's active window after the last read."""
        from airflow_provider_cdc.cdc.sources.yugabyte.admin import drop_slot

        with self.standin.connect() as conn:
            drop_slot(conn, self.slot(crash), timeout=30, poll=0.2)


class YugabyteCdcCrashSource(YsqlStandInCrashSource):
    """The YugabyteDB CDC-service stand-in (docs/yugabytedb-cdc-standin.md) with ``yb_workload``'s
    tables; offsets in Airflow Variables (see :class:`StandInCrashSource`); each capture reads a
    DB stream of its own (EXPLICIT checkpoints, ``record_type``), made by :meth:`create_stream`
    before the capture's setup, as a DBA makes it with ``yb-admin create_change_data_stream``.

    The child reaches the stand-in's masters and tablet servers (ports of a service process the
    test process owns, which outlives the killed child) and its PostgreSQL, which holds the capture
    lock, through the Airflow connection it gets in its environment (``child_env``). Nothing is
    needed after a killed child: PostgreSQL ends the backend of a closed connection, which releases
    the capture's advisory lock, and the service drops a closed RPC connection.

    ``settle`` waits until the stand-in's tablet logs hold every commit, and ``position`` is the
    cluster's hybrid time read as the product reads it (a window planned after it ends after it).

    "Acknowledged" (``check_acknowledged``): the server's checkpoint of every tablet the offset
    polls (its ``cdc_state`` row: term and index, ``SetCDCCheckpoint`` after the offset save) equals
    the offset's, the offset names this capture's stream and nothing pending, and no session holds
    the capture lock. The "never ahead" half (no tablet's server checkpoint past the stored offset's:
    the server would release changes the sink lacks) is also checked right after every child
    (``after_child``), before any recovery, against whatever offset the killed task left stored.
    While no offset holds tablet checkpoints (a snapshot not landed yet), a snapshotting capture's
    server checkpoints must not be past the stream's start (its consistent snapshot's op id); a
    ``snapshot_mode='never'`` capture's first window checkpoints the tablets at their latest ops
    on the server before it stores them, which is where that capture starts.

    The events' ``source`` block is the YugabyteDB gRPC connector's: its commit position is
    ``commit_time``, where the harness's checks read PostgreSQL's ``commit_lsn`` (the apply order,
    and the key of "no event twice"); ``check_events``, which the harness runs on each table's
    events before those checks, copies ``commit_time`` to ``commit_lsn`` (as this source's own tests
    do before the oracle, ``tests/integration/yugabyte_cdc/test_stream.py``).
    """

    NAME = "yugabyte_cdc"
    WORKLOAD = "tests.support.yb_workload"
    standin: YugabyteCdcStandIn

    def __init__(self, standin: YugabyteCdcStandIn, conn_id: str, *, record_type: str = "CHANGE"):
        super().__init__(standin, conn_id)
        self.record_type = record_type
        self.streams: dict[str, str] = {}  # topic prefix -> its DB stream id

    @classmethod
    def build(cls, fields: dict[str, Any]) -> Capture:
        from airflow_provider_cdc.captures.yugabyte_cdc_service import YugabyteCdcServiceCapture

        fields, store = cls.variable_store(fields)
        return YugabyteCdcServiceCapture(**fields, offset_store=store)

    # -- the stand-in ----------------------------------------------------------------------------

    def airflow_connection(self) -> str:
        """The ``yugabytedb_cdc`` connection (JSON): YSQL is the stand-in's PostgreSQL, the extra
        names its masters."""
        from tests.support.yugabyte_cdc import airflow_connection

        return airflow_connection(self.standin)

    def create_stream(self, prefix: str) -> str:
        """A new DB stream of the workload's tables for the capture ``prefix`` (its consistent
        snapshot taken now)."""
        tables = list(self.workload().TABLES)
        self.streams[prefix] = self.standin.create_stream(self.record_type, "EXPLICIT", tables=tables)
        return self.streams[prefix]

    def stream(self, crash: CrashCapture) -> str:
        try:
            return self.streams[crash.prefix]
        except KeyError:
            raise AssertionError(f"capture {crash.prefix!r} has no stream: call create_stream first") from None

    def admin_query(self, sql: str, params: tuple = ()) -> list[tuple]:
        with self.standin.connect() as conn:
            cur = conn.execute(sql, params or None)
            return cur.fetchall() if cur.description is not None else []

    # -- the adapter -----------------------------------------------------------------------------

    def capture_fields(self, crash: CrashCapture) -> dict[str, Any]:
        return {
            "yugabytedb_conn_id": self.conn_id,
            "stream_id": self.stream(crash),
            "idle_timeout_seconds": 30.0,
            **self.variable_fields(),
        }

    def child_env(self, crash: CrashCapture) -> dict[str, str]:
        return {f"AIRFLOW_CONN_{self.conn_id.upper()}": self.airflow_connection()}

    def after_child(self, crash: CrashCapture) -> None:
        self.check_not_ahead(crash, self.stored_offset(crash))

    def settle(self) -> None:
        self.standin.wait_caught_up()

    def position(self) -> Position:
        from airflow_provider_cdc.cdc.sources.yugabyte.lsn import YbLsn
        from airflow_provider_cdc.cdc.sources.yugabyte_cdc.admin import current_hybrid_time

        with self.standin.connect() as conn:
            return YbLsn(current_hybrid_time(conn))

    def server_checkpoint(self, crash: CrashCapture, tablet_id: str) -> tuple[int, int]:
        """The (term, index) the server stores for the capture's stream on the tablet."""
        term, index = self.standin.state(self.stream(crash), tablet_id)["checkpoint"][:2]
        return term, index

    def check_not_ahead(
        self, crash: CrashCapture, offset: CaptureOffset | None
    ) -> dict[str, tuple[tuple[int, int], tuple[int, int]]]:
        """No tablet's server checkpoint is past the offset's (see the class docstring); returns
        ``{tablet: (server, offset)}`` for the tablets the offset polls."""
        tablets = offset.tablets.polled() if offset is not None else {}  # type: ignore[attr-defined]
        if not tablets:
            if crash.fields().get("snapshot_mode", "initial") != "never":
                for tablet_id in self.standin_tablets():
                    state = self.standin.state(self.stream(crash), tablet_id)
                    server, start = tuple(state["checkpoint"][:2]), tuple(state["start"][:2])
                    assert server <= start, (
                        f"{crash.prefix}: tablet {tablet_id} is checkpointed at {server} on the server before "
                        f"any window landed, past the stream's start {start}"
                    )
            return {}
        assert offset.stream_id == self.stream(crash), f"the offset's stream is {offset.stream_id}"  # type: ignore[union-attr,attr-defined]
        found, ahead = {}, {}
        for tablet_id, position in tablets.items():
            stored = (position.checkpoint.term, position.checkpoint.index)
            server = found[tablet_id] = self.server_checkpoint(crash, tablet_id), stored
            if server[0] > stored:
                ahead[tablet_id] = server
        assert not ahead, (
            f"{crash.prefix}: the server's checkpoints are ahead of the stored offset's (tablet: (server, offset)): "
            f"{ahead}"
        )
        return found

    def standin_tablets(self) -> list[str]:
        """The active tablets of the workload's tables."""
        return [
            t["tablet_id"] for table in self.workload().TABLES for t in self.standin.tablets(table) if not t["children"]
        ]

    def check_acknowledged(self, crash: CrashCapture, offset: CaptureOffset) -> None:
        assert offset.pending is None, f"the offset has a pending window: {offset.pending}"
        checkpoints = self.check_not_ahead(crash, offset)
        assert checkpoints, "the offset holds no tablet checkpoints"
        behind = {tablet: pair for tablet, pair in checkpoints.items() if pair[0] != pair[1]}
        assert not behind, (
            f"{crash.prefix}: after a completed run the server does not hold the offset's checkpoints "
            f"(tablet: (server, offset)): {behind}"
        )
        self.check_capture_lock_released(crash)

    def check_events(self, table: str, events: list[dict]) -> None:
        """The connector's ``source`` block; every stream event once by its origin (tablet, op id
        text with the record's write id), the events of a transaction at one commit time, and
        ``sequence`` ``[previous commit, lsn]`` with the previous commit before this one. Then
        ``commit_lsn`` := ``commit_time`` for the harness (see the class docstring)."""
        import json

        assert all(e["source"]["connector"] == "yugabytedb" for e in events), f"{table}: not the connector's block"
        stream = [e for e in events if e["op"] != "r"]
        seen = Counter((e["source"]["tablet_id"], e["source"]["lsn"]) for e in stream)
        twice = [p for p, n in seen.items() if n > 1]
        assert not twice, f"{table}: change events written twice: {twice[:5]}"
        commits: dict[str, set[int]] = {}
        for e in stream:
            source = e["source"]
            commits.setdefault(e["transaction"]["id"], set()).add(source["commit_time"])
            previous, lsn = json.loads(source["sequence"])
            assert lsn == source["lsn"], source
            assert previous is None or int(previous) < source["commit_time"], source
        split = {tx: times for tx, times in commits.items() if len(times) > 1}
        assert not split, f"{table}: a transaction's events name different commit times: {split}"
        for e in events:
            e["source"]["commit_lsn"] = e["source"]["commit_time"]


class _MetadataVariable:
    """Airflow's ``models.Variable`` with the Task SDK ``Variable``'s signature (what the offset
    store calls)."""

    @staticmethod
    def get(key: str, default: Any = None) -> Any:
        from airflow.models import Variable

        return Variable.get(key, default_var=default)

    @staticmethod
    def set(key: str, value: Any, description: str | None = None) -> None:
        from airflow.models import Variable

        Variable.set(key, value, description=description)

    @staticmethod
    def delete(key: str) -> None:
        from airflow.models import Variable

        Variable.delete(key)


def _use_metadata_variables() -> None:
    """For the rest of this process (the child's): see :class:`SqlServerCrashSource`."""
    from airflow_provider_cdc.offsets import variable

    variable.Variable = _MetadataVariable  # type: ignore[assignment]


@contextmanager
def metadata_variables() -> Iterator[None]:
    """For the block (the test process's): see :class:`SqlServerCrashSource`."""
    from airflow_provider_cdc.offsets import variable

    saved = variable.Variable
    variable.Variable = _MetadataVariable  # type: ignore[assignment]
    try:
        yield
    finally:
        variable.Variable = saved


SOURCES: dict[str, type[CrashSource]] = {
    s.NAME: s for s in (PostgresCrashSource, SqlServerCrashSource, YugabyteCrashSource, YugabyteCdcCrashSource)
}
