"""The loop of a trigger that polls a source's readiness through a driver without an async API.

pyodbc (SQL Server) and the YugabyteDB CDC service's RPC client are synchronous: each check runs
in a thread (``asyncio.to_thread``, the pattern Airflow's providers use for such drivers), never in
the triggerer's event loop. psycopg has an async API, so the PostgreSQL and YugabyteDB (logical
replication) triggers use ``psycopg.AsyncConnection`` instead (triggers/postgres_cdc.py).

A check is bounded twice: the driver's own timeouts (``connect_timeout``, ODBC's login timeout,
the RPC client's) end a hung connection in its thread, and the trigger stops waiting for the
check after ``check_timeout`` seconds, firing an error event, even if the driver does not.
"""

from __future__ import annotations

import asyncio
import inspect
from abc import abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, ClassVar

from airflow_provider_cdc.version_compat import BaseHook, BaseTrigger, TriggerEvent

#: Seconds one check (connect and queries) may take before the trigger gives up with an error event.
DEFAULT_CHECK_TIMEOUT = 60.0


async def poll_readiness(
    trigger: BaseTrigger, check: Callable[[], Awaitable[Any]], poll_interval: float
) -> AsyncIterator[TriggerEvent]:
    """The wait of every readiness trigger: ``check()`` every ``poll_interval`` seconds until it
    returns an error event (fired as is) or a ``Readiness`` that is not "waiting" (its event)."""
    while True:
        readiness = await check()
        if isinstance(readiness, TriggerEvent):
            yield readiness
            return
        if readiness.state != "waiting":
            yield TriggerEvent(readiness.to_event())
            return
        trigger.log.info("%s", readiness.message)
        await asyncio.sleep(poll_interval)


class ArgumentsTrigger(BaseTrigger):
    """A trigger serialized as its constructor's arguments: each argument of ``__init__`` is kept
    as the attribute of the same name, and the triggerer re-creates the trigger from them."""

    def serialize(self) -> tuple[str, dict[str, Any]]:
        names = [name for name in inspect.signature(type(self).__init__).parameters if name != "self"]
        return f"{type(self).__module__}.{type(self).__qualname__}", {name: getattr(self, name) for name in names}


class ReadinessPollingTrigger(ArgumentsTrigger):
    """Loads the Airflow connection ``conn_id``, then calls :meth:`check` in a thread every
    ``poll_interval`` seconds until it is not "waiting", and fires its verdict
    (``Readiness.to_event()``); any failure, or a check that takes longer than ``check_timeout``
    seconds, fires ``{"status": "error"}`` with its message. Subclasses set ``conn_id``,
    ``poll_interval``, ``check_timeout`` and ``reading`` (what a failed check could not read), and
    supply :meth:`connection_info` and :meth:`check` (which passes ``check_timeout`` to its driver)."""

    reading: ClassVar[str] = "the source"
    conn_id: str
    poll_interval: float
    check_timeout: float

    @abstractmethod
    def connection_info(self, conn: Any) -> Any:
        """The engine's connection value of the Airflow connection."""

    @abstractmethod
    def check(self, info: Any) -> Any:
        """One reading: a :class:`~cdc.readiness.Readiness` (runs in a thread)."""

    async def run(self) -> AsyncIterator[TriggerEvent]:
        try:
            info = self.connection_info(await BaseHook.aget_connection(self.conn_id))
        except Exception as exc:  # report, don't swallow: the task fails with this message
            yield TriggerEvent({"status": "error", "message": f"cannot load connection {self.conn_id!r}: {exc}"})
            return
        async for event in poll_readiness(self, lambda: self._check_in_thread(info), self.poll_interval):
            yield event

    async def _check_in_thread(self, info: Any) -> Any:
        """One :meth:`check` in a thread, bounded by ``check_timeout``; a failure is an error event."""
        try:
            return await asyncio.wait_for(asyncio.to_thread(self.check, info), self.check_timeout)
        except asyncio.TimeoutError:
            return TriggerEvent(
                {
                    "status": "error",
                    "message": f"cannot read {self.reading}: the server did not answer within "
                    f"{self.check_timeout:g} s (check_timeout); is it overloaded or behind a firewall that "
                    "drops packets?",
                }
            )
        except Exception as exc:
            return TriggerEvent({"status": "error", "message": f"cannot read {self.reading}: {exc}"})
