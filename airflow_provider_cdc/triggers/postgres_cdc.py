"""Trigger that waits, asynchronously, for pending WAL on a capture's slot."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow_provider_cdc.cdc.sources.postgres import admin
from airflow_provider_cdc.cdc.sources.postgres.pending import Readiness, slot_readiness
from airflow_provider_cdc.version_compat import BaseHook, BaseTrigger, TriggerEvent


class PostgresCdcChangesTrigger(BaseTrigger):
    """Polls ``pg_replication_slots`` with psycopg's async connection every ``poll_interval``.

    Fires ``{"status": "success"}`` when enough WAL is pending, ``{"status": "error"}`` when the
    slot is missing, its WAL was lost, or the database cannot be reached.
    """

    def __init__(self, postgres_conn_id: str, slot_name: str, min_pending_bytes: int = 1, poll_interval: float = 60.0):
        super().__init__()
        self.postgres_conn_id = postgres_conn_id
        self.slot_name = slot_name
        self.min_pending_bytes = min_pending_bytes
        self.poll_interval = poll_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "postgres_conn_id": self.postgres_conn_id,
                "slot_name": self.slot_name,
                "min_pending_bytes": self.min_pending_bytes,
                "poll_interval": self.poll_interval,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        import psycopg

        from airflow_provider_cdc.hooks.postgres_cdc import connection_info_from

        try:
            info = connection_info_from(await BaseHook.aget_connection(self.postgres_conn_id))
        except Exception as exc:  # report, don't swallow: the sensor fails with this message
            yield TriggerEvent({"status": "error", "message": f"cannot load connection: {exc}"})
            return
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(info.conninfo(), autocommit=True) as conn:
                    cursor = await conn.execute(admin.SLOT_STATUS_SQL, (self.slot_name,))
                    row = await cursor.fetchone()
            except psycopg.Error as exc:
                message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                yield TriggerEvent({"status": "error", "message": f"cannot read slot status: {message}"})
                return
            status = None if row is None else admin.slot_status_from_row(row)
            readiness: Readiness = slot_readiness(status, self.slot_name, self.min_pending_bytes)
            if readiness.state != "waiting":
                yield TriggerEvent(readiness.to_event())
                return
            self.log.info("%s", readiness.message)
            await asyncio.sleep(self.poll_interval)
