"""YugabyteStandIn: an emulated YugabyteDB (YSQL logical replication) on PostgreSQL 15 (tests only).

The emulation is served by a child process (service.py: proxy, journal, YB walsender sessions) in
front of a real PostgreSQL database; this object starts and stops it, tells clients where it
listens, and offers the tests' controls (slot ageing, retention, active window) on its state.
See docs/yugabytedb-standin.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
from psycopg import sql

from .journal import real_conninfo

if TYPE_CHECKING:
    from airflow_provider_cdc.testing.postgres_cluster import PostgresCluster

_ROOT = Path(__file__).resolve().parents[3]


class YugabyteStandIn:
    """An emulated YugabyteDB database reached with psycopg/libpq at ``host``:``port``."""

    def __init__(
        self,
        cluster: PostgresCluster,
        database: str = "yugabyte",
        *,
        retention_ms: int = 8 * 3600 * 1000,
        active_window_ms: int = 60_000,
        advisory_locks: bool | None = None,
        release: str | None = None,
        export_snapshot: bool | None = None,
        clock_skew_ms: int | None = None,
    ):
        self.cluster = cluster
        self.database = database
        self.retention_ms = retention_ms
        self.active_window_ms = active_window_ms
        self.advisory_locks = advisory_locks
        self.release = release
        self.export_snapshot = export_snapshot  # ysql_enable_pg_export_snapshot; None: the release's default
        self.clock_skew_ms = clock_skew_ms  # max_clock_skew_usec / 1000; None: YB's default, 500
        self.journal_slot = "ybsj_" + hashlib.md5(database.encode()).hexdigest()[:20]
        self._process: subprocess.Popen | None = None
        self._port: int | None = None
        self._admin: psycopg.Connection | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> YugabyteStandIn:
        with self.cluster.connect() as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (self.database,)).fetchone()
        if not exists:
            self.cluster.create_database(self.database)
        config = {
            "cluster": {
                "host": self.cluster.host,
                "port": self.cluster.port,
                "superuser": self.cluster.superuser,
                "password": self.cluster.password,
            },
            "database": self.database,
            "retention_ms": self.retention_ms,
            "active_window_ms": self.active_window_ms,
            "advisory_locks": self.advisory_locks,
            "release": self.release,
            "export_snapshot": self.export_snapshot,
            **({} if self.clock_skew_ms is None else {"clock_skew_ms": self.clock_skew_ms}),
        }
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")]))}
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.yugabyte.service", json.dumps(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=_ROOT,
            env=env,
            text=True,
        )
        line = self._process.stdout.readline()
        if not line.strip().isdigit():
            self._process.kill()
            raise RuntimeError(f"the YugabyteDB stand-in did not start (exit {self._process.wait()})")
        self._port = int(line)
        self._admin = psycopg.connect(self.real_conninfo(), autocommit=True)
        return self

    def stop(self, drop: bool = True) -> None:
        """Stops the service; ``drop=False`` keeps the database and the emulation's state, so a new
        stand-in on the same database carries on (slots, their LSNs, xids and HTs persist)."""
        if self._admin is not None:
            self._admin.close()
            self._admin = None
        stop_service(self._process)
        self._process = None
        if drop:
            drop_database(self.cluster, self.database)

    def __enter__(self) -> YugabyteStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- how clients reach it -----------------------------------------------------------------

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def port(self) -> int:
        assert self._port is not None, "start() first"
        return self._port

    def conninfo(self, *, replication: bool = False, user: str | None = None, password: str | None = None) -> str:
        """A libpq connection string to the stand-in (``replication=database`` with ``replication``)."""
        from psycopg.conninfo import make_conninfo

        params = {
            "host": self.host,
            "port": self.port,
            "dbname": self.database,
            "user": user or self.cluster.superuser,
            "password": password if password is not None else self.cluster.password,
            "sslmode": "disable",
        }
        if replication:
            params["replication"] = "database"
        return make_conninfo("", **params)

    def connect(self, *, autocommit: bool = True, **kwargs) -> psycopg.Connection:
        """A psycopg connection through the stand-in, as the product makes them."""
        return psycopg.connect(self.conninfo(**kwargs), autocommit=autocommit)

    def connection_info(self, user: str | None = None, password: str | None = None):
        """The product's PgConnectionInfo for the stand-in."""
        from airflow_provider_cdc.cdc.sources.postgres.connection import PgConnectionInfo

        return PgConnectionInfo(
            host=self.host,
            port=self.port,
            dbname=self.database,
            user=user or self.cluster.superuser,
            password=password if password is not None else self.cluster.password,
            options=(("sslmode", "disable"),),  # the stand-in refuses TLS
        )

    def real_conninfo(self) -> str:
        """Straight to PostgreSQL, no emulation: for the stand-in's controls and assertions."""
        return real_conninfo(self.cluster, self.database)

    # -- test controls ------------------------------------------------------------------------

    def admin_query(self, statement: str, params: tuple = ()) -> list[tuple]:
        """A query straight on PostgreSQL (real catalogs, and the emulation's state in yb_standin)."""
        assert self._admin is not None, "start() first"
        cur = self._admin.execute(statement, params or None)
        return cur.fetchall() if cur.description is not None else []

    def age_slot(self, slot: str, ms: int) -> None:
        """Moves a slot's last poll (and creation) time ``ms`` into the past: expiry and ``active``."""
        self.admin_query(
            "UPDATE yb_standin.slots SET last_poll_ms = last_poll_ms - %s, created_ms = created_ms - %s "
            "WHERE slot_name = %s",
            (ms, ms, slot),
        )

    def set_retention_ms(self, ms: int) -> None:
        """``cdc_intent_retention_ms``: a slot not polled for this long is expired."""
        self.retention_ms = ms
        self.admin_query("UPDATE yb_standin.settings SET retention_ms = %s", (ms,))

    def set_active_window_ms(self, ms: int) -> None:
        """``ysql_cdc_active_replication_slot_window_ms``: ``active`` and the drop refusal."""
        self.active_window_ms = ms
        self.admin_query("UPDATE yb_standin.settings SET active_window_ms = %s", (ms,))

    def set_export_snapshot(self, enabled: bool) -> None:
        """The gflag ``ysql_enable_pg_export_snapshot`` (read at every CREATE_REPLICATION_SLOT)."""
        self.admin_query(
            "UPDATE yb_standin.gflags SET value = %s WHERE name = 'ysql_enable_pg_export_snapshot'",
            (str(enabled).lower(),),
        )

    #: YB flag -> column of yb_standin.settings (times in ms there)
    _FLAGS = {
        "cdcsdk_publication_list_refresh_interval_secs": ("pub_refresh_interval_ms", 1000),
        "cdcsdk_tablet_not_of_interest_timeout_secs": ("not_of_interest_ms", 1000),
        "cdc_skip_unqualified_tables_for_polling": ("skip_unqualified", None),
        "cdcsdk_update_restart_time_when_nothing_to_stream": ("update_restart_time", None),
        "cdcsdk_update_restart_time_interval_secs": ("restart_update_interval_ms", 1000),
    }

    def set_flags(self, **flags: float | bool) -> None:
        """Set YB flags of the publication refresh, the 4-hour rule and the restart time, by their
        YB names (seconds may be fractions). ``cdc_skip_unqualified_tables_for_polling`` exists
        from 2025.2.7.0 (2024.2-2025.2 line) and 2026.1.2.0 only."""
        from .releases import at_least

        for name, value in flags.items():
            column, scale = self._FLAGS[name]
            if name == "cdc_skip_unqualified_tables_for_polling" and self.release is not None:
                line_floor = "2026.1.2.0" if at_least(self.release, "2026.1") else "2025.2.7.0"
                if not at_least(self.release, line_floor):
                    raise ValueError(f"{name} does not exist in YugabyteDB {self.release} (from {line_floor})")
            stored = value if scale is None else int(value * scale)
            self.admin_query(f"UPDATE yb_standin.settings SET {column} = %s", (stored,))

    def pass_time(self, ms: int) -> None:
        """Let ``ms`` pass for the emulation: every slot's creation, last poll and publication
        refreshes, and every publication change, move that far into the past (refresh grid, the
        4-hour rule, expiry, ``active``). A refresh that falls due applies to the transactions
        journaled after this call: let earlier commits reach the journal first."""
        self.admin_query("SELECT yb_standin.pass_time(%s)", (ms,))

    def current_ht(self) -> int:
        """``yb_get_current_hybrid_time_lsn()``."""
        return self.admin_query("SELECT yb_standin.yb_get_current_hybrid_time_lsn()")[0][0]

    def wait_journaled(self, timeout: float = 10.0) -> None:
        """Waits until every transaction committed so far is journaled, i.e. streamable."""
        target = self.admin_query("SELECT pg_catalog.pg_current_wal_lsn()::text")[0][0]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            row = self.admin_query(
                "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_catalog.pg_replication_slots WHERE slot_name = %s",
                (target, self.journal_slot),
            )
            if row and row[0][0]:
                return
            time.sleep(0.02)
        raise TimeoutError("the YugabyteDB stand-in's journal did not catch up")


def stop_service(process: subprocess.Popen | None) -> None:
    """End a stand-in's child process: its stdin closing is its signal to stop; killed if it hangs."""
    if process is None:
        return
    try:
        process.stdin.close()
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def drop_database(cluster, database: str) -> None:
    """Drop a stand-in's database with the replication slots on it."""
    with cluster.connect() as conn:
        for (slot,) in conn.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE database = %s", (database,)
        ).fetchall():
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database)))
