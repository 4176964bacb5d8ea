"""Sensor of every capture: wait until there is something to capture (or until it is complete).

What "ready" means is the source's (:meth:`Capture.readiness`): PostgreSQL's slot has pending WAL
(optionally a captured change, decoded); SQL Server's capture job has processed every commit up
to ``wait_until`` (default: the run's data interval end), so an hourly window is complete when it
runs; YugabyteDB's clock has passed ``wait_until`` and its slot has not expired. Deferrable: the
wait moves to the triggerer (the source's trigger).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from airflow_provider_cdc.captures.base import Capture
from airflow_provider_cdc.cdc.errors import CdcConfigurationError
from airflow_provider_cdc.version_compat import AirflowFailException, BaseSensorOperator, Context, PokeReturnValue


class CdcChangesSensor(BaseSensorOperator):
    """Succeeds once the capture's source is ready for the next window; fails when it never will be
    (a missing or lost slot, CDC disabled).

    :param capture: the capture's configuration
    :param wait_until: a time the source must have captured up to (SQL Server: the capture job's
        newest commit time, ``sys.fn_cdc_map_lsn_to_time(sys.fn_cdc_get_max_lsn())``, must be at or
        after it; YugabyteDB: the server's hybrid time must have passed it). Templated; default
        ``{{ data_interval_end }}``. PostgreSQL ignores it.
    :param min_pending_bytes: PostgreSQL: WAL bytes written since the slot's last acknowledgement
        that count as "something pending" (cheap: one catalog query)
    :param require_captured_change: PostgreSQL: additionally decode the pending WAL (``peek``) and
        wait for at least one insert/update/delete/truncate of a captured table
    :param deferrable: wait in the triggerer instead of a worker slot
    """

    template_fields: Sequence[str] = ("min_pending_bytes", "wait_until")

    def __init__(
        self,
        *,
        capture: Capture,
        wait_until: str | datetime | None = "{{ data_interval_end }}",
        min_pending_bytes: int = 1,
        require_captured_change: bool = False,
        deferrable: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if not isinstance(capture, Capture):
            raise CdcConfigurationError(f"capture must be a capture object, got {type(capture).__name__}")
        self.capture = capture
        self.wait_until = wait_until
        self.min_pending_bytes = min_pending_bytes
        self.require_captured_change = require_captured_change
        self.deferrable = deferrable

    def poke(self, context: Context) -> PokeReturnValue:
        readiness = self.capture.readiness(self, context)
        if readiness.state == "failed":
            raise AirflowFailException(readiness.message)
        self.log.info("%s", readiness.message)
        return PokeReturnValue(is_done=readiness.state == "ready", xcom_value=readiness.detail or None)

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        result = self.poke(context)
        if result.is_done:
            return result.xcom_value
        self.defer(
            trigger=self.capture.readiness_trigger(self, context),
            method_name="execute_complete",
            timeout=timedelta(seconds=float(self.timeout)),
        )

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        if event.get("status") != "success":
            raise AirflowFailException(event.get("message", "the source check failed"))
        self.log.info("%s", event.get("message"))
        return event
