"""Triggers that watch a capture's slot asynchronously: pending WAL, and slot health.

They poll with psycopg's ``AsyncConnection``: nothing they do blocks the triggerer's event loop,
which runs every deferred task of the deployment. Each poll (connect and queries) is bounded by
``check_timeout``: the connection gets libpq's ``connect_timeout`` (unless its extra sets one) and
the poll as a whole is cancelled after it, so a server that accepts TCP but never answers ends the
wait with an error event instead of holding the trigger forever. (The synchronous steps run in a
thread, under the same bound: the TLS probe of a connection without an ``sslmode``, once, and,
with the ``iam`` extra, the IAM token asked for before each connection, as the task's hook does.)
What they need is imported with the module, which the triggerer loads once with the trigger's
class: nothing is imported inside ``run``, in the event loop, while other triggers wait.
"""

from __future__ import annotations

import asyncio
import math
import time
from abc import abstractmethod
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import psycopg

from airflow_provider_cdc.cdc.basics.errors import CdcError, CdcTransientError
from airflow_provider_cdc.cdc.sources.postgres import admin
from airflow_provider_cdc.cdc.sources.postgres.connection import PgConnectionInfo, first_line, resolve_tls
from airflow_provider_cdc.cdc.sources.postgres.health import KEEP_SIZE_SQL, HealthThresholds, assess
from airflow_provider_cdc.cdc.sources.postgres.pending import Readiness, slot_readiness
from airflow_provider_cdc.cdc.sources.postgres.tables import quote_ident
from airflow_provider_cdc.hooks.postgres_cdc import PostgresCdcHook, connection_info_from
from airflow_provider_cdc.triggers.polling import DEFAULT_CHECK_TIMEOUT, ArgumentsTrigger
from airflow_provider_cdc.version_compat import BaseHook, TriggerEvent

T = TypeVar("T")


class LoginTrigger(ArgumentsTrigger):
    """A trigger that logs in to a PostgreSQL-protocol server (PostgreSQL, YugabyteDB's YSQL)
    before its first poll: :meth:`watch` polls with the login until the one event it fires."""

    conn_id: str
    check_timeout: float

    async def run(self) -> AsyncIterator[TriggerEvent]:
        login = await trigger_login(self.conn_id, self.check_timeout)
        if isinstance(login, TriggerEvent):
            yield login
            return
        async for event in self.watch(login):
            yield event

    @abstractmethod
    def watch(self, login: Login) -> AsyncIterator[TriggerEvent]:
        """The polls after the login, until the one event the trigger fires."""


class SlotTrigger(LoginTrigger):
    """What both PostgreSQL slot triggers share: the connection and slot they watch, how often
    and how long a poll may take."""

    def __init__(self, postgres_conn_id: str, slot_name: str, poll_interval: float, check_timeout: float):
        super().__init__()
        self.postgres_conn_id = postgres_conn_id
        self.slot_name = slot_name
        self.poll_interval = poll_interval
        self.check_timeout = check_timeout

    @property
    def conn_id(self) -> str:  # type: ignore[override]
        return self.postgres_conn_id


class PostgresCdcChangesTrigger(SlotTrigger):
    """Polls ``pg_replication_slots`` with psycopg's async connection every ``poll_interval``.

    Fires ``{"status": "success"}`` when enough WAL is pending (and, with ``publication_name``,
    a captured change of the publication's tables is among it, decoded with ``peek``: the sensor's
    ``require_captured_change``), ``{"status": "error"}`` when the slot is missing, its WAL was
    lost, or the database cannot be reached or does not answer within ``check_timeout`` seconds.
    """

    def __init__(
        self,
        postgres_conn_id: str,
        slot_name: str,
        min_pending_bytes: int = 1,
        poll_interval: float = 60.0,
        publication_name: str | None = None,
        check_timeout: float = DEFAULT_CHECK_TIMEOUT,
    ):
        super().__init__(postgres_conn_id, slot_name, poll_interval, check_timeout)
        self.min_pending_bytes = min_pending_bytes
        self.publication_name = publication_name

    async def watch(self, login: Login) -> AsyncIterator[TriggerEvent]:
        while True:
            reading = await _read_slot(login, self.slot_name, self.check_timeout, self.publication_name)
            if isinstance(reading, TriggerEvent):
                yield reading
                return
            readiness: Readiness = slot_readiness(reading[0], self.slot_name, self.min_pending_bytes)
            readiness = _with_captured_change(readiness, reading, self.slot_name, self.publication_name)
            if readiness.state != "waiting":
                yield TriggerEvent(readiness.to_event())
                return
            self.log.info("%s", readiness.message)
            await asyncio.sleep(self.poll_interval)


class PostgresCdcSlotHealthTrigger(SlotTrigger):
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
        check_timeout: float = DEFAULT_CHECK_TIMEOUT,
    ):
        super().__init__(postgres_conn_id, slot_name, poll_interval, check_timeout)
        self.thresholds = thresholds
        self.watch_seconds = watch_seconds

    async def watch(self, login: Login) -> AsyncIterator[TriggerEvent]:
        thresholds = HealthThresholds.from_dict(self.thresholds)
        deadline = time.monotonic() + self.watch_seconds
        while True:
            reading = await _read_slot(login, self.slot_name, self.check_timeout)
            if isinstance(reading, TriggerEvent):
                yield reading
                return
            health = assess(reading[0], self.slot_name, reading[1], thresholds)
            if not health.healthy or time.monotonic() >= deadline:
                yield TriggerEvent({"status": "healthy" if health.healthy else "unhealthy", **health.to_dict()})
                return
            self.log.info("%s", health.summary())
            await asyncio.sleep(self.poll_interval)


@dataclass(frozen=True)
class Login:
    """How a trigger logs in: the connection's engine value (its TLS settled once) and, with the
    ``iam`` extra, the hook that asks for a token (``PostgresCdcHook.connection_info``, the task's
    own path: ``PostgresHook.get_iam_token``). The token is asked for before every connection, in a
    thread (the AWS/Azure SDK calls block), never in the event loop: it lasts minutes, a wait may
    last hours."""

    info: PgConnectionInfo
    iam_hook: PostgresCdcHook | None = None

    def describe(self) -> str:
        return self.info.describe()

    async def current(self) -> PgConnectionInfo:
        """:attr:`info`, with a fresh IAM token's login, port and password if the connection uses one."""
        if self.iam_hook is None:
            return self.info
        hook = self.iam_hook
        try:
            fresh = await asyncio.to_thread(lambda: hook.connection_info)
        except Exception as exc:  # the SDK's own error types: say what failed, as a CdcError
            raise CdcTransientError(f"cannot get an IAM token for {self.describe()}: {exc}") from exc
        return replace(self.info, user=fresh.user, password=fresh.password, port=fresh.port)

    async def conninfo(self) -> str:
        """A libpq connection string for one connection (a fresh token's, with the ``iam`` extra)."""
        return (await self.current()).conninfo()


async def trigger_login(conn_id: str, timeout: float) -> Login | TriggerEvent:
    """The connection's :class:`Login`, its TLS settled once (see cdc/sources/postgres/tls.py: the
    polls then connect alike, without probing or logging again), or an error event."""
    try:
        conn = await BaseHook.aget_connection(conn_id)
        info = with_connect_timeout(connection_info_from(conn), timeout)
        # The hook gets the connection loaded here: it does not load it again, synchronously.
        login = Login(info, PostgresCdcHook(conn_id, connection=conn) if _uses_iam(conn) else None)
    except Exception as exc:  # report, don't swallow: the task fails with this message
        return TriggerEvent({"status": "error", "message": f"cannot load connection {conn_id!r}: {exc}"})
    try:
        return await bounded(settle_tls(login), timeout, login.describe())
    except CdcError as exc:
        return TriggerEvent({"status": "error", "message": f"cannot connect with {conn_id!r}: {exc}"})
    except TimeoutError as exc:
        return TriggerEvent({"status": "error", "message": f"cannot connect with {conn_id!r}: {exc}"})


def _uses_iam(conn: Any) -> bool:
    """As ``PostgresCdcHook.connection_info`` reads it."""
    return bool(conn.extra_dejson.get("iam", False))


def with_connect_timeout(info: Any, timeout: float) -> Any:
    """``info`` with libpq's ``connect_timeout`` (whole seconds, at least 2, libpq's minimum) set to
    ``timeout`` unless the connection's extra sets its own."""
    if any(key == "connect_timeout" for key, _ in info.options):
        return info
    return replace(info, options=(*info.options, ("connect_timeout", str(max(2, math.ceil(timeout))))))


async def settle_tls(login: Login) -> Login:
    """``login`` with its TLS mode settled. The probe connects synchronously (the engine's TLS
    rules are shared with Spark's partitions): it runs once, in a thread, never in the event loop."""
    settled = await asyncio.to_thread(resolve_tls, await login.current())
    return replace(login, info=replace(login.info, resolved_sslmode=settled.resolved_sslmode))


async def bounded(step: Awaitable[T], timeout: float, where: str) -> T:
    """``step``, cancelled after ``timeout`` seconds with a :class:`TimeoutError` that says so."""
    try:
        return await asyncio.wait_for(step, timeout)
    except asyncio.TimeoutError:
        raise TimeoutError(
            f"the server at {where} did not answer within {timeout:g} s (check_timeout); is it overloaded or "
            "behind a firewall that drops packets?"
        ) from None


async def _read_slot(
    login: Login, slot_name: str, timeout: float, publication_name: str | None = None
) -> tuple[admin.SlotStatus | None, int, int | None] | TriggerEvent:
    """(slot status, max_slot_wal_keep_size in bytes, captured changes pending or None when not
    asked or not peekable now) with psycopg's async connection, within ``timeout`` seconds."""

    async def read() -> tuple[admin.SlotStatus | None, int, int | None]:
        async with await psycopg.AsyncConnection.connect(await login.conninfo(), autocommit=True) as conn:
            cursor = await conn.execute(admin.SLOT_STATUS_SQL, (slot_name,))
            row = await cursor.fetchone()
            cursor = await conn.execute(KEEP_SIZE_SQL)
            keep = (await cursor.fetchone())[0]
            status = None if row is None else admin.slot_status_from_row(row)
            changes = None
            if publication_name is not None and status is not None and not status.active:
                cursor = await conn.execute(admin.PEEK_CHANGES_SQL, (slot_name, 1, quote_ident(publication_name)))
                changes = int((await cursor.fetchone())[0])
        return status, int(keep), changes

    try:
        return await bounded(read(), timeout, login.describe())
    except psycopg.Error as exc:
        return TriggerEvent({"status": "error", "message": f"cannot read slot status: {first_line(exc)}"})
    except (CdcError, TimeoutError) as exc:
        return TriggerEvent({"status": "error", "message": f"cannot read slot status: {exc}"})


def _with_captured_change(
    readiness: Readiness, reading: tuple[Any, int, int | None], slot_name: str, publication_name: str | None
) -> Readiness:
    """The sensor's ``require_captured_change`` in the trigger (as ``PostgresCapture.readiness``)."""
    if publication_name is None or readiness.state != "ready":
        return readiness
    status, _, changes = reading
    if status is not None and status.active:
        return Readiness("waiting", f"slot {slot_name!r} is being read by pid {status.active_pid}; waiting")
    if not changes:
        return Readiness("waiting", f"{readiness.message}, but no captured change among them")
    return readiness
