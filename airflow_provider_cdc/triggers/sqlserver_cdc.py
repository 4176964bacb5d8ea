"""Trigger that waits until SQL Server's capture job has processed a data interval."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

from airflow_provider_cdc.version_compat import BaseHook, BaseTrigger, TriggerEvent


class SqlServerCdcChangesTrigger(BaseTrigger):
    """Polls the capture job's position every ``poll_interval``; fires ``{"status": "success"}``
    once it passed ``until`` (ISO-8601, UTC; None: once it captured anything), ``{"status":
    "error"}`` when CDC is off or the database cannot be reached. pyodbc has no async API: each
    poll runs in a thread."""

    def __init__(
        self,
        sqlserver_conn_id: str,
        until: str | None,
        poll_interval: float = 60.0,
        driver: str | None = None,
        server_time_zone: str = "UTC",
    ):
        super().__init__()
        self.sqlserver_conn_id = sqlserver_conn_id
        self.until = until
        self.poll_interval = poll_interval
        self.driver = driver
        self.server_time_zone = server_time_zone

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "sqlserver_conn_id": self.sqlserver_conn_id,
                "until": self.until,
                "poll_interval": self.poll_interval,
                "driver": self.driver,
                "server_time_zone": self.server_time_zone,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow_provider_cdc.hooks.sqlserver_cdc import connection_info_from

        try:
            info = connection_info_from(await BaseHook.aget_connection(self.sqlserver_conn_id), self.driver)
        except Exception as exc:  # report, don't swallow: the task fails with this message
            yield TriggerEvent(
                {"status": "error", "message": f"cannot load connection {self.sqlserver_conn_id!r}: {exc}"}
            )
            return
        until = None if not self.until else datetime.fromisoformat(self.until)
        while True:
            try:
                readiness = await asyncio.to_thread(_check, info, until, self.server_time_zone)
            except Exception as exc:
                yield TriggerEvent({"status": "error", "message": f"cannot read the capture job's position: {exc}"})
                return
            if readiness.state != "waiting":
                yield TriggerEvent(readiness.to_event())
                return
            self.log.info("%s", readiness.message)
            await asyncio.sleep(self.poll_interval)


def _check(info: Any, until: datetime | None, zone: str) -> Any:
    from airflow_provider_cdc.cdc.sources.sqlserver.connection import connect
    from airflow_provider_cdc.cdc.sources.sqlserver.pending import capture_job_readiness

    conn = connect(info)
    try:
        return capture_job_readiness(conn, until, zone)
    finally:
        conn.close()
