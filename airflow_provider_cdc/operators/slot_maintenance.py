"""Operators that look after a capture's slot: a health check that alerts before the server
invalidates it, and a guarded teardown."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow_provider_cdc._lazy import lazy_module
from airflow_provider_cdc.captures.postgres import PostgresCapture
from airflow_provider_cdc.cdc.basics.errors import ConcurrentCaptureError
from airflow_provider_cdc.cdc.sources.postgres.health import HealthThresholds, SlotHealth, assess
from airflow_provider_cdc.operators.base import CdcCaptureOperator, fail_fast_on_terminal_errors
from airflow_provider_cdc.version_compat import AirflowException, AirflowFailException, Context, airflow_conf

if TYPE_CHECKING:
    from airflow_provider_cdc.cdc.sources.postgres import admin
else:  # psycopg loads when the teardown runs, not when a DAG file is parsed
    admin = lazy_module("airflow_provider_cdc.cdc.sources.postgres.admin")


class PostgresCdcSlotHealthOperator(CdcCaptureOperator):
    """Report a capture slot's lag and fail *before* the server would invalidate it.

    Fails (so Airflow's alerting fires) when the slot is missing or lost, when its WAL is past
    ``max_slot_wal_keep_size`` (``unreserved``), or when a threshold is crossed; otherwise returns
    the metrics (lag and retained bytes, ``wal_status``, ``safe_wal_size`` ...) as XCom.

    :param capture: the capture whose slot is checked
    :param max_retained_fraction: fail when the slot retains this fraction of the server's
        ``max_slot_wal_keep_size`` (default 0.8)
    :param max_retained_bytes: fail when it retains this many bytes (use it when the keep size is
        unlimited, where a stalled slot fills the disk instead)
    :param max_lag_bytes: fail when the slot is this many bytes behind the server
    :param watch_seconds: keep watching this long, polling every ``poll_interval``, and fail the
        moment a threshold is crossed (0: check once). With ``deferrable=True`` the watch runs in
        the triggerer and holds no worker slot.
    """

    template_fields: Sequence[str] = ("max_retained_bytes", "max_lag_bytes", "watch_seconds")
    ui_color = "#ffe9c9"

    def __init__(
        self,
        *,
        capture: PostgresCapture,
        max_retained_fraction: float = 0.8,
        max_retained_bytes: int | None = None,
        max_lag_bytes: int | None = None,
        watch_seconds: float = 0,
        poll_interval: float = 60.0,
        deferrable: bool = airflow_conf().getboolean("operators", "default_deferrable", fallback=False),
        **kwargs: Any,
    ) -> None:
        super().__init__(capture=capture, **kwargs)
        self.max_retained_fraction = max_retained_fraction
        self.max_retained_bytes = max_retained_bytes
        self.max_lag_bytes = max_lag_bytes
        self.watch_seconds = watch_seconds
        self.poll_interval = poll_interval
        self.deferrable = deferrable
        HealthThresholds(max_retained_fraction=max_retained_fraction)  # fail at parse time

    def _thresholds(self) -> HealthThresholds:
        def as_bytes(value: Any) -> int | None:
            return None if value in (None, "", "None") else int(value)

        with fail_fast_on_terminal_errors():
            return HealthThresholds(
                max_retained_fraction=float(self.max_retained_fraction),
                max_retained_bytes=as_bytes(self.max_retained_bytes),
                max_lag_bytes=as_bytes(self.max_lag_bytes),
            )

    def execute(self, context: Context) -> dict[str, Any]:
        thresholds = self._thresholds()
        slot = self.capture.resolved_slot_name
        hook = self.hook()
        deadline = time.monotonic() + float(self.watch_seconds)
        while True:
            with fail_fast_on_terminal_errors():
                status, keep_size = hook.slot_reading(slot)
                health = assess(status, slot, keep_size, thresholds)
            if not health.healthy or time.monotonic() >= deadline:
                return self._verdict(health.to_dict())
            if self.deferrable:
                from airflow_provider_cdc.triggers.postgres_cdc import PostgresCdcSlotHealthTrigger

                self.defer(
                    trigger=PostgresCdcSlotHealthTrigger(
                        self.capture.postgres_conn_id,
                        slot,
                        thresholds.to_dict(),
                        float(self.poll_interval),
                        max(0.0, deadline - time.monotonic()),
                    ),
                    method_name="execute_complete",
                    timeout=timedelta(seconds=float(self.watch_seconds) + 3 * float(self.poll_interval) + 60),
                )
            self.log.info("%s", health.summary())
            time.sleep(min(float(self.poll_interval), max(0.0, deadline - time.monotonic())))

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        if event.get("status") == "error":
            raise AirflowException(event.get("message", "the slot health check could not run"))
        return self._verdict(event)

    def _verdict(self, report: dict[str, Any]) -> dict[str, Any]:
        for warning in report.get("warnings", ()):
            self.log.warning("%s", warning)
        if not report["healthy"]:
            raise AirflowFailException(report["message"])
        self.log.info("%s", report["message"])
        return report


class PostgresCdcTeardownOperator(CdcCaptureOperator):
    """Drop a capture's replication slot (and publication) — only when explicitly confirmed.

    Dropping the slot releases the WAL it pins and ends the capture: changes after that are not
    captured until a new slot and a new snapshot. Guards: ``confirm`` must equal the capture's
    ``topic_prefix`` (templated, e.g. ``"{{ params.confirm }}"`` for a manually triggered DAG);
    no run of the capture may be in progress (its lock is taken, and an active slot is refused).
    Sink data is never touched; the stored offset is deleted only with ``delete_offset=True``.

    :param capture: the capture to tear down
    :param confirm: the capture's topic prefix, typed again
    :param drop_publication: drop the capture's publication too (default True)
    :param delete_offset: delete the stored offset, so a new setup starts from a new snapshot
    """

    template_fields: Sequence[str] = ("confirm",)
    ui_color = "#ffd4d4"

    def __init__(
        self,
        *,
        capture: PostgresCapture,
        confirm: str,
        drop_publication: bool = True,
        delete_offset: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(capture=capture, **kwargs)
        self.confirm = confirm
        self.drop_publication = drop_publication
        self.delete_offset = delete_offset

    def execute(self, context: Context) -> dict[str, Any]:
        capture = self.capture
        if self.confirm != capture.topic_prefix:
            raise AirflowFailException(
                f"refusing to tear down capture {capture.topic_prefix!r}: confirm={self.confirm!r} does not "
                f"match its topic_prefix. Set confirm={capture.topic_prefix!r} to drop slot "
                f"{capture.resolved_slot_name!r}" + (" and its publication" if self.drop_publication else "")
            )
        hook = self.hook()
        with fail_fast_on_terminal_errors(), hook.capture_lock(capture.topic_prefix) as conn:
            status = admin.slot_status(conn, capture.resolved_slot_name)
            if status is not None and status.active:
                raise ConcurrentCaptureError(
                    f"replication slot {status.slot_name!r} is being read by pid {status.active_pid}: "
                    "stop that reader before tearing the capture down"
                )
            result = {
                "topic_prefix": capture.topic_prefix,
                "slot_dropped": admin.drop_slot(conn, capture.resolved_slot_name),
                "publication_dropped": (
                    admin.drop_publication(conn, capture.resolved_publication_name) if self.drop_publication else False
                ),
                "offset_deleted": False,
                "released_wal_bytes": None if status is None else status.retained_bytes,
            }
            if self.delete_offset:
                capture.store().delete(capture.topic_prefix)
                result["offset_deleted"] = True
        self.log.warning(
            "capture %s torn down: slot %r %s, publication %r %s, offset %s",
            capture.topic_prefix,
            capture.resolved_slot_name,
            "dropped" if result["slot_dropped"] else "was absent",
            capture.resolved_publication_name,
            "dropped" if result["publication_dropped"] else "kept",
            "deleted" if result["offset_deleted"] else "kept",
        )
        return result


__all__ = ["PostgresCdcSlotHealthOperator", "PostgresCdcTeardownOperator", "SlotHealth"]
