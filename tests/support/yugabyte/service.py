"""The YB stand-in's service, run in a process of its own (``python -m tests.support.yugabyte.service``):
clients such as the product's ``ReplicationConnection`` call libpq's blocking functions, which hold
the GIL, so the proxy they talk to cannot live in the test process.

A proxy (proxy.py) in front of a real PostgreSQL database; SQL shims in schema ``yb_standin``
(catalog.sql) that the database's search_path puts before pg_catalog; a journal of every committed
transaction read from one real pgoutput slot (journal.py); YB walsender sessions over that journal
(stream.py). See docs/yugabytedb-standin.md.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
import uuid
from pathlib import Path

import psycopg
from psycopg import sql

from .journal import PUBLICATION, JournalReader, real_conninfo
from .proxy import YugabyteProxy
from .releases import (
    BEFORE_ADVISORY_LOCKS,
    DEFAULT_RELEASE,
    consistent_point,
    default_snapshot_action,
    export_snapshot_default,
    has_advisory_locks,
    publication_refresh_at_commit,
)
from .stream import StreamRefused

log = logging.getLogger(__name__)

CATALOG_SQL = Path(__file__).with_name("catalog.sql")

# YB's max_clock_skew_usec default (500 ms): a slot's consistent time is the upper bound of the
# cluster clock, up to this far ahead of a node's clock (Debezium QueryingSnapshotter.java l.58-62)
DEFAULT_CLOCK_SKEW_MS = 500

_ADVISORY = [
    ("pg_advisory_lock", "void"),
    ("pg_advisory_lock_shared", "void"),
    ("pg_advisory_xact_lock", "void"),
    ("pg_advisory_xact_lock_shared", "void"),
    ("pg_try_advisory_lock", "boolean"),
    ("pg_try_advisory_lock_shared", "boolean"),
    ("pg_try_advisory_xact_lock", "boolean"),
    ("pg_try_advisory_xact_lock_shared", "boolean"),
    ("pg_advisory_unlock", "boolean"),
    ("pg_advisory_unlock_shared", "boolean"),
]


# YB <= 2024.2 (src/postgres/src/backend/utils/adt/lockfuncs.c, YbRaiseAdvisoryLocksNotSupported)
_ADVISORY_HINT = "See https://github.com/yugabyte/yugabyte-db/issues/3642. React with thumbs up to raise its priority"


def _clock_us() -> int:
    """This host's clock in Unix microseconds (the clock yb_get_current_hybrid_time_lsn() reads)."""
    return time.time_ns() // 1000


class StandInService:
    """Installs the emulation in the database and serves it: journal reader + proxy."""

    def __init__(
        self,
        cluster,
        database: str = "yugabyte",
        *,
        retention_ms: int = 8 * 3600 * 1000,
        active_window_ms: int = 60_000,
        advisory_locks: bool | None = None,
        release: str | None = None,
        export_snapshot: bool | None = None,
        clock_skew_ms: int = DEFAULT_CLOCK_SKEW_MS,
    ):
        self.cluster = cluster
        self.database = database
        self.retention_ms = retention_ms
        self.active_window_ms = active_window_ms
        # the YB release the stand-in emulates (releases.py); ``advisory_locks=False`` alone means a
        # release before 2025.1, as before the release setting existed
        if release is None:
            release = BEFORE_ADVISORY_LOCKS if advisory_locks is False else DEFAULT_RELEASE
        self.release = release
        self.advisory_locks = has_advisory_locks(release) if advisory_locks is None else advisory_locks
        # the gflag ysql_enable_pg_export_snapshot: its release's default unless set (releases.py)
        self.export_snapshot = export_snapshot_default(release) if export_snapshot is None else export_snapshot
        # how far ahead of the clock a slot's consistent time may be (YB's max_clock_skew_usec)
        self.clock_skew_ms = clock_skew_ms
        self.journal_slot = "ybsj_" + hashlib.md5(database.encode()).hexdigest()[:20]
        self.closed = False
        self.proxy: YugabyteProxy | None = None
        self.journal: JournalReader | None = None
        self._admin: psycopg.Connection | None = None
        self._lock = threading.Lock()
        self._snapshots: dict[int, tuple[object, str, str]] = {}  # ht -> (replication PGconn, snapshot, slot)
        self._exported = threading.Condition(self._lock)  # a snapshot taken once the clock passed its time
        self._pending: set[int] = set()  # consistent HTs whose snapshot is still to be taken

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> StandInService:
        self._admin = psycopg.connect(self.real_conninfo(), autocommit=True)
        self._install()
        self.closed = False
        self.journal = JournalReader(self.cluster, self.database, self.journal_slot)
        self.journal.housekeeping = self._release_dropped_snapshots
        self.journal.start()
        self.proxy = YugabyteProxy(self, self.cluster.host, self.cluster.port).start()
        return self

    def stop(self) -> None:
        self.closed = True
        if self.proxy is not None:
            self.proxy.stop()
            self.proxy = None
        if self.journal is not None:
            self.journal.stop()
            self.journal = None
        with self._lock:
            for conn, _snapshot, _slot in self._snapshots.values():
                conn.finish()
            self._snapshots.clear()
        if self._admin is not None:
            self._admin.close()
            self._admin = None

    def real_conninfo(self) -> str:
        """Straight to PostgreSQL (no emulation): for the stand-in itself and assertions."""
        return real_conninfo(self.cluster, self.database)

    def current_ht(self) -> int:
        return self._admin_execute("SELECT yb_standin.yb_get_current_hybrid_time_lsn()")[0][0]

    # -- slots (called by the proxy) ----------------------------------------------------------

    def create_slot(self, name: str, plugin: str, *, lsn_type: str = "SEQUENCE", snapshot_action: str = "USE_SNAPSHOT"):
        """Returns the snapshot_name answer: the consistent HT (USE_SNAPSHOT), the exported
        snapshot's name (EXPORT_SNAPSHOT) or None (NOEXPORT_SNAPSHOT).

        The consistent HT is the clock plus ``clock_skew_ms``: YB picks the upper bound of the
        cluster's clocks, which "could be 0.5 seconds ahead of the time on some tserver nodes"
        (Debezium QueryingSnapshotter.java l.58-62; YB's TestPgReplicationSlot
        ``waitForSnapshotTimeToPass``). A USE_SNAPSHOT slot is answered at once and its snapshot
        taken once the clock has passed that time (so it holds every commit up to it, as a read at
        the HT would); an exported snapshot is taken before answering."""
        if self._admin_execute("SELECT 1 FROM yb_standin.slots WHERE slot_name = %s", (name,)):
            raise StreamRefused("42710", f'replication slot "{name}" already exists')
        ht = self.current_ht() + ((self.clock_skew_ms * 1000) << 12)
        if snapshot_action == "NOEXPORT_SNAPSHOT":
            # answered once the clock has passed the consistent time: a commit after the answer
            # streams (guess: YB's hybrid clock orders later commits after the consistent time)
            self._wait_clock_past(ht)
            self._register(name, plugin, lsn_type, ht, None)
            return None
        if snapshot_action == "EXPORT_SNAPSHOT" or self.clock_skew_ms <= 0:
            self._wait_clock_past(ht)
            snapshot = self._export(name, ht, (plugin, lsn_type))
            return str(ht) if snapshot_action == "USE_SNAPSHOT" else snapshot
        self._register(name, plugin, lsn_type, ht, None)
        with self._lock:
            self._pending.add(ht)
        threading.Thread(target=self._export_later, args=(name, ht), daemon=True, name="yb-export").start()
        return str(ht)

    def _wait_clock_past(self, ht: int) -> None:
        while (ahead_us := (ht >> 12) - _clock_us()) >= 0:
            time.sleep(ahead_us / 1e6 + 0.001)

    def _export_later(self, name: str, ht: int) -> None:
        try:
            self._wait_clock_past(ht)
            self._export(name, ht, None)
        except Exception:  # the slot was dropped meanwhile, or the service stops
            log.debug("no snapshot for slot %s", name, exc_info=True)
        finally:
            with self._exported:
                self._pending.discard(ht)
                self._exported.notify_all()

    def _export(self, name: str, ht: int, register: tuple[str, str] | None) -> str:
        """Export a real snapshot for slot ``name`` at ``ht``; ``register`` = (plugin, lsn_type) to
        register the slot with it, else the registered slot gets its boundary now."""
        from psycopg import pq

        conn = pq.PGconn.connect(real_conninfo(self.cluster, self.database, replication=True).encode())
        temp = "ybss_" + uuid.uuid4().hex[:24]
        result = conn.exec_(f"CREATE_REPLICATION_SLOT {temp} TEMPORARY LOGICAL pgoutput EXPORT_SNAPSHOT".encode())
        if result.status != pq.ExecStatus.TUPLES_OK:
            text = result.error_message.decode(errors="replace")
            conn.finish()
            raise StreamRefused("XX000", f"could not create the consistent snapshot: {text}")
        boundary, snapshot = result.get_value(0, 1).decode(), result.get_value(0, 2).decode()
        try:
            if register is not None:
                self._register(name, register[0], register[1], ht, boundary)
            elif not self._admin_execute(
                "UPDATE yb_standin.slots SET boundary_lsn = %s::pg_lsn WHERE slot_name = %s AND snapshot_ht = %s "
                "RETURNING 1",
                (boundary, name, ht),
            ):
                raise StreamRefused("42704", f'replication slot "{name}" does not exist')
        except BaseException:
            conn.finish()
            raise
        with self._lock:
            self._snapshots[ht] = (conn, snapshot, name)
        return snapshot

    def drop_slot(self, name: str) -> None:
        self._call("SELECT yb_standin.pg_drop_replication_slot(%s)", (name,))
        self._release_dropped_snapshots()

    def snapshot_for(self, ht: int, timeout: float = 10.0) -> str | None:
        """The exported snapshot of the slot whose consistent point is ``ht`` (waiting for one
        still being taken), or None."""
        deadline = time.monotonic() + timeout
        with self._exported:
            while True:
                held = self._snapshots.get(ht)
                if held is not None:
                    return held[1]
                for _conn, snapshot, _slot in self._snapshots.values():
                    if snapshot == str(ht):
                        return snapshot
                if ht not in self._pending or time.monotonic() >= deadline:
                    return None
                self._exported.wait(0.05)

    def read_time_refusal(self, ht: int) -> tuple[str, str] | None:
        """``(sqlstate, message)`` for ``SET LOCAL yb_read_time`` to a time after this node's clock
        ("The "SET LOCAL yb_read_time" will return an error if the time to be set is in the
        future", Debezium QueryingSnapshotter.java l.58-62). The text and SQLSTATE are a guess: no
        YB source for the check was found (newer servers may wait instead: wait event
        WaitForReadTime, yugabyte-db PR #28089)."""
        if (ht >> 12) < _clock_us():
            return None
        return "XX000", f"yb_read_time {ht} ht is in the future of this node's clock"

    def export_snapshot_enabled(self) -> bool:
        """The gflag ``ysql_enable_pg_export_snapshot`` now (a test may flip it)."""
        rows = self._admin_execute("SELECT value FROM yb_standin.gflags WHERE name = 'ysql_enable_pg_export_snapshot'")
        return self.export_snapshot if not rows else rows[0][0] == "true"

    def default_snapshot_action(self) -> str:
        return default_snapshot_action(self.release)

    def consistent_point(self) -> str:
        return consistent_point(self.release)

    def read_time_call_refusal(self, user: str, schema: str | None, name: str) -> tuple[str, str] | None:
        """``(sqlstate, message)`` when ``user`` may not ``CALL [schema.]name('<ht> ht')``, the
        non-superuser read-time route (docs/yugabytedb.md), as PostgreSQL and YB refuse it: the schema
        missing or without USAGE, no such procedure (one text argument), no EXECUTE on it, or a body
        that would run as a role that may not set ``yb_read_time`` (a superuser-only setting: the
        procedure must be SECURITY DEFINER and owned by a superuser). The proxy answers the call with
        the snapshot instead of running the body, so this is what the privileges decide. A superuser's
        call is rewritten whether or not the procedure exists (as before: the stand-in's own tests)."""
        superuser = self._admin_execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", (user,))
        if not superuser or superuser[0][0]:
            return None
        wanted = [schema] if schema else ["pg_catalog"]  # capture sessions: search_path pg_catalog, pg_temp
        schemas = self._admin_execute(
            "SELECT n.nspname, has_schema_privilege(%s, n.oid, 'USAGE') FROM unnest(%s::text[]) WITH ORDINALITY "
            "AS s(name, ord) JOIN pg_namespace n ON n.nspname = s.name ORDER BY s.ord",
            (user, wanted),
        )
        if schema is not None and not schemas:
            return "3F000", f'schema "{schema}" does not exist'
        if schema is not None and not schemas[0][1]:
            return "42501", f"permission denied for schema {schema}"
        usable = [n for n, usage in schemas if usage]
        found = self._admin_execute(
            "SELECT has_function_privilege(%s, p.oid, 'EXECUTE'), p.prosecdef, o.rolsuper "
            "FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace JOIN pg_roles o ON o.oid = p.proowner "
            "WHERE p.prokind = 'p' AND p.proname = %s AND n.nspname = ANY(%s) AND p.pronargs = 1 "
            "AND p.proargtypes[0] = 'text'::regtype ORDER BY array_position(%s, n.nspname::text) LIMIT 1",
            (user, name, usable, usable),
        )
        if not found:
            return "42883", f"procedure {schema + '.' if schema else ''}{name}(unknown) does not exist"
        may_execute, security_definer, owner_is_superuser = found[0]
        if not may_execute:
            return "42501", f"permission denied for procedure {name}"
        if not (security_definer and owner_is_superuser):
            return "42501", 'permission denied to set parameter "yb_read_time"'
        return None

    def _register(self, name, plugin, lsn_type, ht, boundary) -> None:
        self._call(
            "SELECT yb_standin.register_slot(%s, %s, %s, %s, %s::pg_lsn)",
            (name, plugin, lsn_type.upper(), ht, boundary),
        )

    def _call(self, statement: str, params: tuple) -> None:
        try:
            self._admin_execute(statement, params)
        except psycopg.Error as exc:
            diag = exc.diag
            raise StreamRefused(diag.sqlstate or "XX000", diag.message_primary or str(exc), diag.message_hint) from None

    def _release_dropped_snapshots(self) -> None:
        try:
            live = {r[0] for r in self._admin_execute("SELECT slot_name FROM yb_standin.slots")}
        except psycopg.Error:
            return
        with self._lock:
            for ht, (conn, _snapshot, slot) in list(self._snapshots.items()):
                if slot not in live:
                    conn.finish()
                    del self._snapshots[ht]

    def _admin_execute(self, statement: str, params: tuple = ()) -> list[tuple]:
        assert self._admin is not None, "start() first"
        with self._lock:
            cur = self._admin.execute(statement, params)
            return cur.fetchall() if cur.description is not None else []

    # -- installation -------------------------------------------------------------------------

    def _install(self) -> None:
        conn = self._admin
        with conn.transaction():
            conn.execute("SET LOCAL search_path = pg_catalog")
            conn.execute(CATALOG_SQL.read_text())
            conn.execute(
                "INSERT INTO yb_standin.settings VALUES (true, %s, %s, %s) ON CONFLICT (one) DO UPDATE SET "
                "retention_ms = excluded.retention_ms, active_window_ms = excluded.active_window_ms, "
                "advisory_locks = excluded.advisory_locks",
                (self.retention_ms, self.active_window_ms, self.advisory_locks),
            )
            # publication changes: at the periodic refresh up to 2025.2, at commit from 2026.1 (releases.py)
            conn.execute(
                "UPDATE yb_standin.settings SET refresh_at_commit = %s", (publication_refresh_at_commit(self.release),)
            )
            conn.execute("CREATE TABLE IF NOT EXISTS yb_standin.gflags (name text PRIMARY KEY, value text NOT NULL)")
            conn.execute(
                "INSERT INTO yb_standin.gflags VALUES ('ysql_enable_pg_export_snapshot', %s) "
                "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                (str(self.export_snapshot).lower(),),
            )
            self._install_pg_class(conn)
            self._install_advisory_locks(conn)
            conn.execute(
                "CREATE OR REPLACE FUNCTION yb_standin.version() RETURNS text LANGUAGE sql STABLE AS "
                "$$ SELECT 'PostgreSQL ' || current_setting('server_version') || %s "
                "|| ' on x86_64-pc-linux-gnu, compiled by clang, 64-bit' $$".replace("%s", f"'-YB-{self.release}-b0'")
            )
            conn.execute(
                "CREATE OR REPLACE FUNCTION yb_standin.yb_hash_code(value text) RETURNS integer LANGUAGE sql "
                "IMMUTABLE AS $$ SELECT hashtext(value) & 65535 $$"
            )
            conn.execute("DROP EVENT TRIGGER IF EXISTS yb_standin_create_table")
            conn.execute(
                "CREATE EVENT TRIGGER yb_standin_create_table ON ddl_command_end "
                "WHEN TAG IN ('CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO') "
                "EXECUTE FUNCTION yb_standin.on_create_table()"
            )
            for (relid,) in conn.execute(
                "SELECT c.oid::regclass::text FROM pg_class c LEFT JOIN yb_standin.identity i ON i.relid = c.oid "
                "WHERE yb_standin.is_user_table(c.oid) AND c.relreplident <> 'f' AND coalesce(i.ident, 'c') <> 'n'"
            ).fetchall():
                conn.execute(f"ALTER TABLE {relid} REPLICA IDENTITY FULL")
            if not conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (PUBLICATION,)).fetchone():
                conn.execute(f"CREATE PUBLICATION {PUBLICATION} FOR ALL TABLES")
            conn.execute(
                sql.SQL('ALTER DATABASE {} SET search_path = "$user", public, yb_standin, pg_catalog').format(
                    sql.Identifier(self.database)
                )
            )
        if not conn.execute(
            "SELECT 1 FROM pg_catalog.pg_replication_slots WHERE slot_name = %s", (self.journal_slot,)
        ).fetchone():
            conn.execute("SELECT pg_catalog.pg_create_logical_replication_slot(%s, 'pgoutput')", (self.journal_slot,))
        conn.execute("SET search_path = pg_catalog")

    @staticmethod
    def _install_pg_class(conn: psycopg.Connection) -> None:
        columns = [
            r[0]
            for r in conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = 'pg_catalog.pg_class'::regclass AND attnum > 0 "
                "AND NOT attisdropped ORDER BY attnum"
            ).fetchall()
        ]
        select = ", ".join(
            "CASE WHEN c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema', 'yb_standin') "
            "AND n.nspname NOT LIKE 'pg\\_%' THEN coalesce(i.ident, 'c') ELSE c.relreplident END AS relreplident"
            if name == "relreplident"
            else f"c.{name}"
            for name in columns
        )
        conn.execute(
            f"CREATE OR REPLACE VIEW yb_standin.pg_class AS SELECT {select} FROM pg_catalog.pg_class c "
            "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
            "LEFT JOIN yb_standin.identity i ON i.relid = c.oid"
        )
        conn.execute("GRANT SELECT ON yb_standin.pg_class TO PUBLIC")

    def _install_advisory_locks(self, conn: psycopg.Connection) -> None:
        signatures = [(name, args, returns) for name, returns in _ADVISORY for args in ("bigint", "integer, integer")]
        signatures.append(("pg_advisory_unlock_all", "", "void"))
        for name, args, returns in signatures:
            if self.advisory_locks:
                conn.execute(f"DROP FUNCTION IF EXISTS yb_standin.{name}({args})")
            else:
                conn.execute(
                    f"CREATE OR REPLACE FUNCTION yb_standin.{name}({args}) RETURNS {returns} LANGUAGE plpgsql AS "
                    f"$$ BEGIN RAISE EXCEPTION 'advisory locks are not yet implemented' USING "
                    f"ERRCODE = 'feature_not_supported', HINT = '{_ADVISORY_HINT}'; END $$"
                )


def main() -> None:
    """Serves until stdin closes (the test process stopped it or went away)."""
    import argparse
    import json
    import sys
    from types import SimpleNamespace

    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    config = json.loads(parser.parse_args().config)
    cluster = SimpleNamespace(**config.pop("cluster"))
    service = StandInService(cluster, config.pop("database"), **config).start()
    print(service.proxy.port, flush=True)
    try:
        sys.stdin.read()
    finally:
        service.stop()


if __name__ == "__main__":
    main()
