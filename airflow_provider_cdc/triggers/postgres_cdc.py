"""Triggers that watch a capture's slot asynchronously: pending WAL, and slot health."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow_provider_cdc.cdc.sources.postgres import admin
from airflow_provider_cdc.cdc.sources.postgres.health import KEEP_SIZE_SQL, HealthThresholds, assess
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
        info = await _connection_info(self.postgres_conn_id)
        if isinstance(info, TriggerEvent):
            yield info
            return
        while True:
            reading = await _read_slot(info, self.slot_name)
            if isinstance(reading, TriggerEvent):
                yield reading
                return
            readiness: Readiness = slot_readiness(reading[0], self.slot_name, self.min_pending_bytes)
            if readiness.state != "waiting":
                yield TriggerEvent(readiness.to_event())
                return
            self.log.info("%s", readiness.message)
            await asyncio.sleep(self.poll_interval)


class PostgresCdcSlotHealthTrigger(BaseTrigger):
    """Watches a slot's health every ``poll_interval`` for ``watch_seconds``.

    Fires ``{"status": "unhealthy"}`` as soon as a threshold is crossed (or the slot is missing or
    lost), ``{"status": "healthy"}`` with the last reading when the watch ends, and
    ``{"status": "error"}`` when the database cannot be reached.
    """

    def __init__(
        self,
        postgres_conn_id: str,
        slot_name: str,
        thresholds: dict[str, Any],
        poll_interval: float = 60.0,
        watch_seconds: float = 0.0,
    ):
        super().__init__()
        self.postgres_conn_id = postgres_conn_id
        self.slot_name = slot_name
        self.thresholds = thresholds
        self.poll_interval = poll_interval
        self.watch_seconds = watch_seconds

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "postgres_conn_id": self.postgres_conn_id,
                "slot_name": self.slot_name,
                "thresholds": self.thresholds,
                "poll_interval": self.poll_interval,
                "watch_seconds": self.watch_seconds,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        info = await _connection_info(self.postgres_conn_id)
        if isinstance(info, TriggerEvent):
            yield info
            return
        thresholds = HealthThresholds.from_dict(self.thresholds)
        deadline = time.monotonic() + self.watch_seconds
        while True:
            reading = await _read_slot(info, self.slot_name)
            if isinstance(reading, TriggerEvent):
                yield reading
                return
            health = assess(reading[0], self.slot_name, reading[1], thresholds)
            if not health.healthy or time.monotonic() >= deadline:
                yield TriggerEvent({"status": "healthy" if health.healthy else "unhealthy", **health.to_dict()})
                return
            self.log.info("%s", health.summary())
            await asyncio.sleep(self.poll_interval)


async def _connection_info(conn_id: str) -> Any:
    """The connection's engine value, its TLS settled once (see cdc/sources/postgres/tls.py: the
    polls then connect alike, without probing or logging again), or an error event."""
    from airflow_provider_cdc.cdc.errors import CdcError
    from airflow_provider_cdc.cdc.sources.postgres.connection import resolve_tls
    from airflow_provider_cdc.hooks.postgres_cdc import connection_info_from

    try:
        info = connection_info_from(await BaseHook.aget_connection(conn_id))
    except Exception as exc:  # report, don't swallow: the task fails with this message
        return TriggerEvent({"status": "error", "message": f"cannot load connection {conn_id!r}: {exc}"})
    try:
        return await asyncio.to_thread(resolve_tls, info)
    except CdcError as exc:
        return TriggerEvent({"status": "error", "message": f"cannot connect with {conn_id!r}: {exc}"})


async def _read_slot(info: Any, slot_name: str) -> tuple[admin.SlotStatus | None, int] | TriggerEvent:
    """(slot status, max_slot_wal_keep_size in bytes) with psycopg's async connection."""
    import psycopg

    from airflow_provider_cdc.cdc.sources.postgres.connection import first_line

    try:
        async with await psycopg.AsyncConnection.connect(info.conninfo(), autocommit=True) as conn:
            cursor = await conn.execute(admin.SLOT_STATUS_SQL, (slot_name,))
            row = await cursor.fetchone()
            cursor = await conn.execute(KEEP_SIZE_SQL)
            keep = (await cursor.fetchone())[0]
    except psycopg.Error as exc:
        return TriggerEvent({"status": "error", "message": f"cannot read slot status: {first_line(exc)}"})
    return (None if row is None else admin.slot_status_from_row(row)), int(keep)
