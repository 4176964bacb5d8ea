"""Sensor: wait until a capture's slot has something to capture."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow_provider_cdc.capture import PostgresCapture
from airflow_provider_cdc.cdc.sources.postgres.pending import slot_readiness
from airflow_provider_cdc.hooks.postgres_cdc import PostgresCdcHook
from airflow_provider_cdc.triggers.postgres_cdc import PostgresCdcChangesTrigger
from airflow_provider_cdc.version_compat import AirflowFailException, BaseSensorOperator, Context, PokeReturnValue


class PostgresCdcChangesSensor(BaseSensorOperator):
    """Succeeds once the capture's slot has pending changes; fails if the slot is missing or lost.

    :param capture: the capture's configuration
    :param min_pending_bytes: WAL bytes written since the slot's last acknowledgement that count
        as "something pending" (cheap: one catalog query)
    :param require_captured_change: additionally decode the pending WAL (``peek``) and wait for
        at least one insert/update/delete/truncate of a captured table. Precise, but it decodes
        from the slot's restart position on every poke.
    :param deferrable: wait in the triggerer instead of a worker slot (byte threshold only)
    """

    template_fields: Sequence[str] = ("min_pending_bytes",)

    def __init__(
        self,
        *,
        capture: PostgresCapture,
        min_pending_bytes: int = 1,
        require_captured_change: bool = False,
        deferrable: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.capture = capture
        self.min_pending_bytes = min_pending_bytes
        self.require_captured_change = require_captured_change
        self.deferrable = deferrable

    def poke(self, context: Context) -> PokeReturnValue:
        hook = PostgresCdcHook(self.capture.postgres_conn_id)
        slot = self.capture.resolved_slot_name
        status = hook.slot_status(slot)
        readiness = slot_readiness(status, slot, int(self.min_pending_bytes))
        if readiness.state == "failed":
            raise AirflowFailException(readiness.message)
        self.log.info("%s", readiness.message)
        if readiness.state != "ready":
            return PokeReturnValue(is_done=False)
        if self.require_captured_change:
            if status is not None and status.active:
                self.log.info("slot %r is being read by pid %s; waiting", slot, status.active_pid)
                return PokeReturnValue(is_done=False)
            changes = hook.count_pending_changes(slot, self.capture.resolved_publication_name)
            self.log.info("captured changes pending: %s", "yes" if changes else "none")
            if not changes:
                return PokeReturnValue(is_done=False)
        return PokeReturnValue(is_done=True, xcom_value=status.to_dict() if status else None)

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        result = self.poke(context)
        if result.is_done:
            return result.xcom_value
        self.defer(
            trigger=PostgresCdcChangesTrigger(
                self.capture.postgres_conn_id,
                self.capture.resolved_slot_name,
                int(self.min_pending_bytes),
                float(self.poke_interval),
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=float(self.timeout)),
        )

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        if event.get("status") != "success":
            raise AirflowFailException(event.get("message", "the slot check failed"))
        self.log.info("%s", event.get("message"))
        return event
