"""Times as tasks are given them: a templated ``upto_time`` / ``wait_until`` as an aware UTC
datetime, and the clock in milliseconds (the engine's planning functions take ``now_ms``)."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError


def utc_time(value: Any, task_id: str) -> datetime | None:
    """``upto_time`` as an aware UTC datetime (a naive one is taken as UTC, like Airflow's times)."""
    if value in (None, ""):
        return None
    if isinstance(value, datetime):
        parsed = value
    else:
        try:
            parsed = datetime.fromisoformat(str(value).strip().replace("Z", "+00:00"))
        except ValueError:
            raise CdcConfigurationError(
                f"upto_time of task {task_id!r} is not an ISO-8601 timestamp: {value!r} "
                "(e.g. '2026-01-01T10:00:00+00:00' or '{{ data_interval_end }}')"
            ) from None
    return (parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=timezone.utc)).astimezone(timezone.utc)


def now_ms() -> int:
    """The wall clock in milliseconds since the epoch."""
    return int(time.time() * 1000)


__all__ = ["now_ms", "utc_time"]
