"""Trigger that waits until a YugabyteDB server's clock has passed a data interval's end."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import psycopg

from airflow_provider_cdc.cdc.basics.errors import CdcError
from airflow_provider_cdc.cdc.sources.postgres.connection import first_line
from airflow_provider_cdc.cdc.sources.yugabyte import admin
from airflow_provider_cdc.cdc.sources.yugabyte.pending import slot_readiness
from airflow_provider_cdc.triggers.polling import DEFAULT_CHECK_TIMEOUT, poll_readiness
from airflow_provider_cdc.triggers.postgres_cdc import Login, LoginTrigger, bounded
from airflow_provider_cdc.version_compat import TriggerEvent


class YugabyteCdcChangesTrigger(LoginTrigger):
    """Polls the slot every ``poll_interval`` with psycopg's async connection (YSQL speaks
    PostgreSQL's protocol: nothing blocks the triggerer's event loop, as in
    :class:`~.postgres_cdc.PostgresCdcChangesTrigger`); fires ``{"status": "success"}`` once the
    server's hybrid time passed ``until`` (ISO-8601, UTC; None: at once), ``{"status": "error"}``
    when the slot is missing, has expired (``expires_ms``, tracked by the capture since YugabyteDB
    does not show it), or the server cannot be reached or does not answer within ``check_timeout``
    seconds."""

    def __init__(
        self,
        yugabytedb_conn_id: str,
        slot_name: str,
        until: str | None,
        poll_interval: float = 60.0,
        expires_ms: int | None = None,
        check_timeout: float = DEFAULT_CHECK_TIMEOUT,
    ):
        super().__init__()
        self.yugabytedb_conn_id = yugabytedb_conn_id
        self.slot_name = slot_name
        self.until = until
        self.poll_interval = poll_interval
        self.expires_ms = expires_ms
        self.check_timeout = check_timeout

    @property
    def conn_id(self) -> str:  # type: ignore[override]
        return self.yugabytedb_conn_id

    async def watch(self, login: Login) -> AsyncIterator[TriggerEvent]:
        until = None if not self.until else datetime.fromisoformat(self.until)

        async def check() -> Any:
            status = await self._read_slot(login)
            if isinstance(status, TriggerEvent):
                return status
            now_ms = int(time.time() * 1000)
            return slot_readiness(status, self.slot_name, wait_until=until, expires_ms=self.expires_ms, now_ms=now_ms)

        async for event in poll_readiness(self, check, self.poll_interval):
            yield event

    async def _read_slot(self, login: Login) -> Any:
        """The slot's :class:`YbSlotStatus` (None: missing), or an error event."""

        async def read() -> Any:
            async with await psycopg.AsyncConnection.connect(await login.conninfo(), autocommit=True) as conn:
                cursor = await conn.execute(admin.SLOT_STATUS_SQL, (self.slot_name,))
                return admin.slot_status(_Fetched(await cursor.fetchone()), self.slot_name)

        try:
            return await bounded(read(), self.check_timeout, login.describe())
        except (psycopg.Error, CdcError, TimeoutError) as exc:
            message = first_line(exc) if isinstance(exc, psycopg.Error) else str(exc)
            return TriggerEvent({"status": "error", "message": f"cannot read slot {self.slot_name!r}: {message}"})


class _Fetched:
    """The row an async query fetched, shaped as the connection the engine's synchronous
    ``admin.slot_status(conn, slot)`` reads it from (one parser of the row for both paths)."""

    def __init__(self, row: Any) -> None:
        self._row = row

    def execute(self, *_: Any) -> _Fetched:
        return self

    def fetchone(self) -> Any:
        return self._row
