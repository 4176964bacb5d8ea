"""Trigger of a capture through YugabyteDB's CDC service: waits until the cluster's clock has
passed a data interval's end, the stream still known to the masters and not expired."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import psycopg

from airflow_provider_cdc.cdc.basics.readiness import Readiness
from airflow_provider_cdc.cdc.sources.yugabyte.lsn import ht_from_datetime
from airflow_provider_cdc.triggers.polling import DEFAULT_CHECK_TIMEOUT, poll_readiness
from airflow_provider_cdc.triggers.postgres_cdc import Login, LoginTrigger, bounded
from airflow_provider_cdc.version_compat import TriggerEvent

#: The YSQL node's clock in microseconds (a hybrid time is it << 12), as ``admin.current_hybrid_time``.
_CLOCK_SQL = "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint"


class YugabyteCdcServiceChangesTrigger(LoginTrigger):
    """Polls every ``poll_interval``: the masters still know ``stream_id`` (the RPC client, which
    has no async API, runs in a thread: ``asyncio.to_thread``, with its own connect and call
    timeouts of ``check_timeout``), and the YSQL node's clock (psycopg's async connection). Fires
    ``{"status": "success"}`` once the clock passed ``until`` (ISO-8601, UTC; None: at once),
    ``{"status": "error"}`` when the stream is gone, expired (``expires_ms``: when the capture's
    stored checkpoints expire unread, computed when the sensor deferred), or the cluster cannot
    be reached or does not answer within ``check_timeout`` seconds. The sensor's first check has
    already verified what cannot change while it waits (the stream's database, tables and
    checkpointing)."""

    def __init__(
        self,
        yugabytedb_conn_id: str,
        stream_id: str,
        until: str | None,
        poll_interval: float = 60.0,
        expires_ms: int | None = None,
        check_timeout: float = DEFAULT_CHECK_TIMEOUT,
        master_addresses: str | None = None,
    ):
        super().__init__()
        self.yugabytedb_conn_id = yugabytedb_conn_id
        self.stream_id = stream_id
        self.until = until
        self.poll_interval = poll_interval
        self.expires_ms = expires_ms
        self.check_timeout = check_timeout
        self.master_addresses = master_addresses  # the capture's, else the connection's extra

    @property
    def conn_id(self) -> str:  # type: ignore[override]
        return self.yugabytedb_conn_id

    async def watch(self, login: Login) -> AsyncIterator[TriggerEvent]:
        until = None if not self.until else datetime.fromisoformat(self.until)

        async def check() -> Any:
            try:
                return await self._check(login, until)
            except Exception as exc:  # the task fails with this message
                return TriggerEvent({"status": "error", "message": f"cannot read CDC stream {self.stream_id}: {exc}"})

        async for event in poll_readiness(self, check, self.poll_interval):
            yield event

    async def _check(self, login: Login, until: datetime | None) -> Readiness:
        where = login.describe()
        status = await bounded(asyncio.to_thread(self._stream_status), self.check_timeout, f"the masters of {where}")
        if status is None:
            return Readiness("failed", f"the masters know no CDC stream {self.stream_id!r} any more")
        if self.expires_ms is not None and time.time() * 1000 >= self.expires_ms:
            return Readiness(
                "failed", f"CDC stream {self.stream_id} was not read within the intent retention and has expired"
            )
        now_ht = await bounded(self._clock(login), self.check_timeout, where)
        if until is not None and now_ht < ht_from_datetime(until):
            return Readiness("waiting", f"the cluster's clock has not reached {until.isoformat()} yet")
        return Readiness("ready", f"stream {self.stream_id} can deliver", detail=status.to_dict())

    def _stream_status(self) -> Any:
        """The masters' view of the stream (None: unknown). Runs in a thread: it reads the Airflow
        connection and calls the masters synchronously, one attempt bounded by ``check_timeout``."""
        from airflow_provider_cdc.cdc.sources.yugabyte_cdc import admin
        from airflow_provider_cdc.cdc.sources.yugabyte_cdc.addresses import parse_addresses
        from airflow_provider_cdc.cdc.sources.yugabyte_cdc.client import RetryPolicy, YbCdcClient
        from airflow_provider_cdc.hooks.yugabyte_cdc import YugabyteCdcServiceHook

        hook = YugabyteCdcServiceHook(self.yugabytedb_conn_id, master_addresses=self.master_addresses)
        with YbCdcClient(
            parse_addresses(hook.master_addresses),
            self.stream_id,
            tls=hook.rpc_tls,
            timeout_seconds=self.check_timeout,
            retry=RetryPolicy(attempts=1),  # the next poll is the retry
        ) as client:
            return admin.stream_status(client)

    @staticmethod
    async def _clock(login: Login) -> int:
        """The YSQL node's clock as a hybrid time, read asynchronously (the engine's
        ``admin.current_hybrid_time`` over a synchronous connection)."""
        async with await psycopg.AsyncConnection.connect(await login.conninfo(), autocommit=True) as conn:
            cursor = await conn.execute(_CLOCK_SQL)
            return int((await cursor.fetchone())[0]) << 12
