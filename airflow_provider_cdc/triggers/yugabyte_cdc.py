"""Trigger that waits until a YugabyteDB server's clock has passed a data interval's end."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

from airflow_provider_cdc.version_compat import BaseHook, BaseTrigger, TriggerEvent


class YugabyteCdcChangesTrigger(BaseTrigger):
    """Polls the slot every ``poll_interval``; fires ``{"status": "success"}`` once the server's
    hybrid time passed ``until`` (ISO-8601, UTC; None: at once), ``{"status": "error"}`` when the
    slot is missing, has expired (``expires_ms``, tracked by the capture since YugabyteDB does not
    show it), or the server cannot be reached. psycopg's sync API runs in a thread."""

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

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow_provider_cdc.hooks.postgres_cdc import connection_info_from

        try:
            info = connection_info_from(await BaseHook.aget_connection(self.yugabytedb_conn_id))
        except Exception as exc:  # report, don't swallow: the task fails with this message
            yield TriggerEvent(
                {"status": "error", "message": f"cannot load connection {self.yugabytedb_conn_id!r}: {exc}"}
            )
            return
        until = None if not self.until else datetime.fromisoformat(self.until)
        while True:
            try:
                readiness = await asyncio.to_thread(_check, info, self.slot_name, until, self.expires_ms)
            except Exception as exc:
                yield TriggerEvent({"status": "error", "message": f"cannot read slot {self.slot_name!r}: {exc}"})
                return
            if readiness.state != "waiting":
                yield TriggerEvent(readiness.to_event())
                return
            self.log.info("%s", readiness.message)
            await asyncio.sleep(self.poll_interval)


def _check(info: Any, slot: str, until: datetime | None, expires_ms: int | None) -> Any:
    from airflow_provider_cdc.cdc.sources.postgres.connection import connect
    from airflow_provider_cdc.cdc.sources.yugabyte.admin import slot_status
    from airflow_provider_cdc.cdc.sources.yugabyte.pending import slot_readiness

    with connect(info) as conn:
        status = slot_status(conn, slot)
    return slot_readiness(status, slot, wait_until=until, expires_ms=expires_ms, now_ms=int(time.time() * 1000))
