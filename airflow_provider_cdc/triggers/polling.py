"""The loop of a trigger that polls a source's readiness (the drivers have no async API)."""

from __future__ import annotations

import asyncio
from abc import abstractmethod
from collections.abc import AsyncIterator
from typing import Any, ClassVar

from airflow_provider_cdc.version_compat import BaseHook, BaseTrigger, TriggerEvent


class ReadinessPollingTrigger(BaseTrigger):
    """Loads the Airflow connection ``conn_id``, then calls :meth:`check` in a thread every
    ``poll_interval`` seconds until it is not "waiting", and fires its verdict
    (``Readiness.to_event()``); any failure fires ``{"status": "error"}`` with its message.
    Subclasses set ``conn_id``, ``poll_interval`` and ``reading`` (what a failed check could not
    read), and supply :meth:`connection_info` and :meth:`check`."""

    reading: ClassVar[str] = "the source"
    conn_id: str
    poll_interval: float

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
        while True:
            try:
                readiness = await asyncio.to_thread(self.check, info)
            except Exception as exc:
                yield TriggerEvent({"status": "error", "message": f"cannot read {self.reading}: {exc}"})
                return
            if readiness.state != "waiting":
                yield TriggerEvent(readiness.to_event())
                return
            self.log.info("%s", readiness.message)
            await asyncio.sleep(self.poll_interval)
