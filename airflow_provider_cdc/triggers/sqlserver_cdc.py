"""Trigger that waits until SQL Server's capture job has processed a data interval."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow_provider_cdc.triggers.polling import ReadinessPollingTrigger


class SqlServerCdcChangesTrigger(ReadinessPollingTrigger):
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

    @property
    def conn_id(self) -> str:
        return self.sqlserver_conn_id

    @property
    def reading(self) -> str:  # type: ignore[override]
        return "the capture job's position"

    def connection_info(self, conn: Any) -> Any:
        from airflow_provider_cdc.hooks.sqlserver_cdc import connection_info_from

        return connection_info_from(conn, self.driver)

    def check(self, info: Any) -> Any:
        from airflow_provider_cdc.cdc.sources.sqlserver.connection import connect
        from airflow_provider_cdc.cdc.sources.sqlserver.pending import capture_job_readiness

        until = None if not self.until else datetime.fromisoformat(self.until)
        conn = connect(info)
        try:
            return capture_job_readiness(conn, until, self.server_time_zone)
        finally:
            conn.close()
