"""A fresh database per test, with helpers to build captures against it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from psycopg import sql

from airflow_provider_cdc.cdc.basics.window import Window
from airflow_provider_cdc.cdc.planning.spec import CaptureOptions, SparkOptions
from airflow_provider_cdc.cdc.sources.postgres import admin
from airflow_provider_cdc.cdc.sources.postgres.connection import PgConnectionInfo
from airflow_provider_cdc.cdc.sources.postgres.lsn import Lsn
from airflow_provider_cdc.cdc.sources.postgres.spec import PostgresJobSpec
from airflow_provider_cdc.cdc.sources.postgres.tables import TableRef
from airflow_provider_cdc.testing.postgres_cluster import PostgresCluster


@dataclass
class CaptureDatabase:
    cluster: PostgresCluster
    name: str
    slot: str = ""
    publication: str = ""
    created_roles: list[str] = field(default_factory=list)

    @classmethod
    def create(cls, cluster: PostgresCluster, name: str) -> CaptureDatabase:
        cluster.create_database(name)
        return cls(cluster, name, slot=f"slot_{name}"[:63], publication=f"pub_{name}")

    @property
    def info(self) -> PgConnectionInfo:
        return PgConnectionInfo(
            host=self.cluster.host,
            port=self.cluster.port,
            dbname=self.name,
            user=self.cluster.superuser,
            password=self.cluster.password,
            options=(("sslmode", "disable"),),  # the suite's clusters serve plain TCP on loopback
        )

    def connect(self, **kwargs):
        return self.cluster.connect(self.name, **kwargs)

    def execute(self, statement: str, params=None) -> None:
        with self.connect() as conn:
            conn.execute(statement, params)

    def current_lsn(self) -> Lsn:
        with self.connect() as conn:
            return admin.current_lsn(conn)

    def slot_status(self, slot: str | None = None) -> admin.SlotStatus | None:
        with self.connect() as conn:
            return admin.slot_status(conn, slot or self.slot)

    def setup_capture(self, tables: list[str]) -> admin.SlotStatus:
        """Publication for ``tables`` and the logical slot (what the setup operator does)."""
        refs = [TableRef.parse(t) for t in tables]
        with self.connect() as conn:
            admin.ensure_publication(conn, self.publication, refs)
            status, _ = admin.ensure_slot(conn, self.slot, self.name)
        return status

    def spec(
        self,
        tables: list[str],
        window: Window,
        sink: Path | str,
        *,
        prefix: str = "t",
        previous_commit_lsn: Lsn | None = None,
        **options,
    ) -> PostgresJobSpec:
        return PostgresJobSpec(
            topic_prefix=prefix,
            connection=self.info,
            slot_name=self.slot,
            publication_name=self.publication,
            tables=tuple(TableRef.parse(t) for t in tables),
            window=window,
            sink_path=str(sink),
            previous_commit_lsn=previous_commit_lsn,
            options=CaptureOptions(**options),
            spark=SparkOptions(master="local[2]"),
        )

    def drop(self) -> None:
        with self.cluster.connect() as conn:
            for (slot,) in conn.execute(
                "SELECT slot_name FROM pg_replication_slots WHERE database = %s", (self.name,)
            ).fetchall():
                for _ in range(50):
                    active = conn.execute(
                        "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,)
                    ).fetchone()
                    if not active or active[0] is None:
                        break
                    conn.execute("SELECT pg_terminate_backend(%s)", (active[0],))
                    time.sleep(0.1)
                # A temporary slot may vanish on its own meanwhile (its walsender exiting): no error then.
                conn.execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                    (slot,),
                )
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.name)))
            for role in self.created_roles:
                conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def stream_window(seq: int, start: Lsn, end: Lsn) -> Window:
    return Window(seq=seq, kind="stream", from_lsn=start, to_lsn=end, planned_at_ms=1_700_000_000_000 + seq)


def snapshot_window(seq: int) -> Window:
    return Window(seq=seq, kind="snapshot", from_lsn=None, to_lsn=None, planned_at_ms=1_700_000_000_000 + seq)
