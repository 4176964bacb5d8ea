"""Sensor of every capture: wait until there is something to capture (or until it is complete).

What "ready" means is the source's (:meth:`Capture.readiness`): PostgreSQL's slot has pending WAL
(optionally a captured change, decoded); SQL Server's capture job has processed every commit up
to ``wait_until`` (default: the run's end, below), so an hourly window is complete when it runs;
YugabyteDB's clock has passed ``wait_until`` and its slot (or CDC stream) has not expired.
Deferrable: the wait moves to the triggerer (the source's trigger).

The run's end, ``wait_until``'s default: its data interval's end; in a run without a data interval
(``airflow dags trigger`` without a logical date, an asset-triggered run, ``dags test``) its
``run_after``, the time it was triggered: "wait until everything committed before this run was
asked for is captured". A template (``"{{ data_interval_end }}"``) fails to render in those runs,
so the default is resolved in Python, at run time.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from airflow_provider_cdc.captures.base import Capture
from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.utils.runs import run_end
from airflow_provider_cdc.version_compat import (
    AirflowFailException,
    BaseSensorOperator,
    Context,
    PokeReturnValue,
    airflow_conf,
)


class CdcChangesSensor(BaseSensorOperator):
    """Succeeds once the capture's source is ready for the next window; fails when it never will be
    (a missing or lost slot, CDC disabled).

    :param capture: the capture's configuration
    :param wait_until: a time the source must have captured up to (SQL Server: the capture job's
        newest commit time, ``sys.fn_cdc_map_lsn_to_time(sys.fn_cdc_get_max_lsn())``, must be at or
        after it; YugabyteDB: the server's hybrid time must have passed it). Templated; default
        (None): the run's end, its data interval's end, or its ``run_after`` in a run without a
        data interval (manual, asset-triggered, ``dags test``). PostgreSQL ignores it.
    :param min_pending_bytes: PostgreSQL: WAL bytes written since the slot's last acknowledgement
        that count as "something pending" (cheap: one catalog query)
    :param require_captured_change: PostgreSQL: additionally decode the pending WAL (``peek``) and
        wait for at least one insert/update/delete/truncate of a captured table
    :param deferrable: wait in the triggerer instead of a worker slot (default: Airflow's
        ``[operators] default_deferrable``, as Airflow's own sensors)
    """

    template_fields: Sequence[str] = ("min_pending_bytes", "wait_until")

    def __init__(
        self,
        *,
        capture: Capture,
        wait_until: str | datetime | None = None,
        min_pending_bytes: int = 1,
        require_captured_change: bool = False,
        deferrable: bool = airflow_conf().getboolean("operators", "default_deferrable", fallback=False),
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
        if self.wait_until is None:
            self.wait_until = run_end(context)
            self.log.info("wait_until (default): the run's end, %s", self.wait_until)
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
