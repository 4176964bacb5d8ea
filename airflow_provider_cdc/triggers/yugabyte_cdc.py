"""Trigger that waits until a YugabyteDB server's clock has passed a data interval's end."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from airflow_provider_cdc.triggers.polling import ReadinessPollingTrigger


class YugabyteCdcChangesTrigger(ReadinessPollingTrigger):
    """Polls the slot every ``poll_interval``; fires ``{"status": "success"}`` once the server's
    hybrid time passed ``until`` (ISO-8601, UTC; None: at once), ``{"status": "error"}`` when the
    slot is missing, has expired (``expires_ms``, tracked by the capture since YugabyteDB does not
    show it), or the server cannot be reached."""

    def __init__(
        self,
        yugabytedb_conn_id: str,
        slot_name: str,
        until: str | None,
        poll_interval: float = 60.0,
        expires_ms: int | None = None,
    ):
        super().__init__()
        self.yugabytedb_conn_id = yugabytedb_conn_id
        self.slot_name = slot_name
        self.until = until
        self.poll_interval = poll_interval
        self.expires_ms = expires_ms

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "yugabytedb_conn_id": self.yugabytedb_conn_id,
                "slot_name": self.slot_name,
                "until": self.until,
                "poll_interval": self.poll_interval,
                "expires_ms": self.expires_ms,
            },
        )

    @property
    def conn_id(self) -> str:
        return self.yugabytedb_conn_id

    @property
    def reading(self) -> str:  # type: ignore[override]
        return f"slot {self.slot_name!r}"

    def connection_info(self, conn: Any) -> Any:
        from airflow_provider_cdc.hooks.postgres_cdc import connection_info_from

        return connection_info_from(conn)

    def check(self, info: Any) -> Any:
        from airflow_provider_cdc.cdc.sources.postgres.connection import connect
        from airflow_provider_cdc.cdc.sources.yugabyte.admin import slot_status
        from airflow_provider_cdc.cdc.sources.yugabyte.pending import slot_readiness

        until = None if not self.until else datetime.fromisoformat(self.until)
        with connect(info) as conn:
            status = slot_status(conn, self.slot_name)
        now_ms = int(time.time() * 1000)
        return slot_readiness(status, self.slot_name, wait_until=until, expires_ms=self.expires_ms, now_ms=now_ms)
