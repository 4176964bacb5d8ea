"""Operator that reports a YugabyteDB capture's distance to its slot's expiry."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from airflow_provider_cdc.captures.yugabyte import YugabyteCapture
from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.offsets.base import load_offset
from airflow_provider_cdc.operators.base import CdcCaptureOperator, fail_fast_on_terminal_errors
from airflow_provider_cdc.version_compat import AirflowFailException, Context


class YugabyteCdcSlotHealthOperator(CdcCaptureOperator):
    """Fail *before* YugabyteDB expires the capture's slot.

    Reports the time since the capture last read the slot, the fraction of the intent retention
    (``capture.intent_retention_ms``) it has used, the time left before expiry and the slot's
    acknowledgement lag (XCom); fails (so Airflow's alerting fires) at ``max_retention_fraction``
    of the retention, or above ``max_lag_seconds`` of acknowledgement lag.

    :param capture: the YugabyteDB capture
    :param max_retention_fraction: fail at this fraction of the retention (default 0.5)
    :param max_lag_seconds: fail when the last acknowledged commit is older (default: no limit)
    """

    template_fields: Sequence[str] = ("max_retention_fraction", "max_lag_seconds")
    ui_color = "#ffe9c9"

    def __init__(
        self,
        *,
        capture: YugabyteCapture,
        max_retention_fraction: float = 0.5,
        max_lag_seconds: float | None = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(capture, YugabyteCapture):
            raise CdcConfigurationError(f"capture must be a YugabyteCapture, got {type(capture).__name__}")
        super().__init__(capture=capture, **kwargs)
        self.max_retention_fraction = max_retention_fraction
        self.max_lag_seconds = max_lag_seconds

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_provider_cdc.cdc.sources.yugabyte.health import assess_expiry
        from airflow_provider_cdc.cdc.sources.yugabyte.planning import last_read_ms

        capture: YugabyteCapture = self.capture  # type: ignore[assignment]
        with fail_fast_on_terminal_errors(capture):
            offset = load_offset(capture.store(), capture.topic_prefix, capture.OFFSET_TYPE)
            status = capture.hook().yb_slot_status(capture.resolved_slot_name)
        health = assess_expiry(
            status,
            capture.resolved_slot_name,
            last_read_ms=last_read_ms(offset),
            retention_ms=capture.intent_retention_ms,
            now_ms=int(time.time() * 1000),
            max_retention_fraction=float(self.max_retention_fraction),
            max_lag_ms=None if self.max_lag_seconds is None else int(float(self.max_lag_seconds) * 1000),
        )
        if not health.healthy:
            raise AirflowFailException(f"capture {capture.topic_prefix}: {health.message}")
        self.log.info("capture %s: %s", capture.topic_prefix, health.message)
        return health.to_dict()


class YugabyteCdcStreamHealthOperator(CdcCaptureOperator):
    """Fail *before* YugabyteDB expires the CDC stream of a :class:`YugabyteCdcServiceCapture`.

    Reports (XCom) whether the stream exists and serves the capture, the time since a window last
    read it, the fraction of the intent retention (``capture.intent_retention_ms``) used and the
    time left before expiry; fails (so Airflow's alerting fires) when the stream is gone or
    unusable, or at ``max_retention_fraction`` of the retention. An expired stream cannot be
    revived: a new stream and a re-snapshot (``snapshot_mode='when_needed'``) follow.

    :param capture: the CDC-service capture
    :param max_retention_fraction: fail at this fraction of the retention (default 0.5)
    """

    template_fields: Sequence[str] = ("max_retention_fraction",)
    ui_color = "#ffe9c9"

    def __init__(self, *, capture: Any, max_retention_fraction: float = 0.5, **kwargs: Any) -> None:
        from airflow_provider_cdc.captures.yugabyte_cdc_service import YugabyteCdcServiceCapture

        if not isinstance(capture, YugabyteCdcServiceCapture):
            raise CdcConfigurationError(f"capture must be a YugabyteCdcServiceCapture, got {type(capture).__name__}")
        super().__init__(capture=capture, **kwargs)
        self.max_retention_fraction = max_retention_fraction

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_provider_cdc.cdc.sources.yugabyte.health import check_fraction, expiry_problems
        from airflow_provider_cdc.cdc.sources.yugabyte_cdc import admin

        capture = self.capture
        fraction = float(self.max_retention_fraction)
        check_fraction(fraction)
        with fail_fast_on_terminal_errors(capture):
            offset = load_offset(capture.store(), capture.topic_prefix, capture.OFFSET_TYPE)
            hook = capture.hook()
            with hook.session() as conn:
                ids = admin.database_ids(conn, capture.resolve_tables(conn))
            with hook.cdc_client(capture.stream_id) as client:
                status = admin.stream_status(client)
        stream = f"CDC stream {capture.stream_id}"
        problems = admin.stream_problems(status, ids, capture.stream_id)
        if offset is not None and offset.stream_id not in (None, capture.stream_id):
            problems.append(f"the stored checkpoints belong to stream {offset.stream_id}: a re-snapshot is due")
        found, metrics = expiry_problems(
            stream,
            last_read_ms=None if offset is None else offset.last_read_ms,
            retention_ms=capture.intent_retention_ms,
            now_ms=int(time.time() * 1000),
            max_retention_fraction=fraction,
        )
        problems += found
        report = {
            "stream_id": capture.stream_id,
            "healthy": not problems,
            "problems": problems,
            **({} if status is None else {"stream": status.to_dict()}),
            **metrics,
        }
        if problems:
            raise AirflowFailException(f"capture {capture.topic_prefix}: " + "; ".join(problems))
        left = metrics.get("ms_to_expiry")
        self.log.info(
            "capture %s: %s healthy%s",
            capture.topic_prefix,
            stream,
            "" if left is None else f", {left / 3_600_000:.2f} h to expiry",
        )
        return report
