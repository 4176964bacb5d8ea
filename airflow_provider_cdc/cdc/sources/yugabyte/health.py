"""How close a YugabyteDB capture is to losing changes: the slot's expiry and acknowledgement lag.

YugabyteDB expires a slot that is not read for ``cdc_intent_retention_ms`` (8 h by default) and
shows it nowhere in SQL (only the tserver metric ``cdcsdk_expiry_time_ms``), so the capture keeps
its own record of its last read (the offset's ``source_state.last_read_ms``, written by every
window and snapshot) and compares it with the retention it is told. Pure: unit-tested without a
server.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.sources.yugabyte.admin import YbSlotStatus


@dataclass(frozen=True)
class SlotExpiryHealth:
    slot_name: str
    problems: tuple[str, ...]
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def healthy(self) -> bool:
        return not self.problems

    @property
    def message(self) -> str:
        if self.problems:
            return "; ".join(self.problems)
        left = self.metrics.get("ms_to_expiry")
        return f"slot {self.slot_name!r} healthy" + ("" if left is None else f", {left / 3_600_000:.2f} h to expiry")

    def to_dict(self) -> dict[str, Any]:
        return {"slot_name": self.slot_name, "healthy": self.healthy, "problems": list(self.problems), **self.metrics}


def assess_expiry(
    status: YbSlotStatus | None,
    slot_name: str,
    *,
    last_read_ms: int | None,
    retention_ms: int,
    now_ms: int,
    max_retention_fraction: float = 0.5,
    max_lag_ms: int | None = None,
) -> SlotExpiryHealth:
    """Fail at ``max_retention_fraction`` of the retention since the last read (default half: an
    hourly capture that missed a few runs still has time), or at an acknowledgement lag above
    ``max_lag_ms``."""
    check_fraction(max_retention_fraction)
    if status is None:
        return SlotExpiryHealth(slot_name, (f"replication slot {slot_name!r} does not exist",))
    problems, metrics = expiry_problems(
        f"slot {slot_name!r}",
        last_read_ms=last_read_ms,
        retention_ms=retention_ms,
        now_ms=now_ms,
        max_retention_fraction=max_retention_fraction,
    )
    metrics = {"ack_lag_ms": status.ack_lag_ms, **status.to_dict(), **metrics}
    lag = status.ack_lag_ms
    if max_lag_ms is not None and lag is not None and lag > max_lag_ms:
        problems.append(f"slot {slot_name!r}: last acknowledged commit {lag} ms ago (> {max_lag_ms} ms)")
    return SlotExpiryHealth(slot_name, tuple(problems), metrics)


def check_fraction(max_retention_fraction: float) -> None:
    if not 0 < max_retention_fraction <= 1:
        raise CdcConfigurationError(f"max_retention_fraction must be in (0, 1], got {max_retention_fraction!r}")


def expiry_problems(
    subject: str, *, last_read_ms: int | None, retention_ms: int, now_ms: int, max_retention_fraction: float
) -> tuple[list[str], dict[str, Any]]:
    """What the time since the last read says about expiry (YugabyteDB expires slots and CDC
    streams alike): problems, and the metrics (retention, fraction used, time to expiry)."""
    problems: list[str] = []
    metrics: dict[str, Any] = {"retention_ms": retention_ms}
    if last_read_ms is None:
        return problems, metrics
    idle = max(0, now_ms - last_read_ms)
    fraction = idle / retention_ms
    metrics.update(
        last_read_ms=last_read_ms, retention_fraction=round(fraction, 4), ms_to_expiry=max(0, retention_ms - idle)
    )
    if idle >= retention_ms:
        problems.append(
            f"{subject} was last read {idle / 3_600_000:.2f} h ago, past the intent retention "
            f"({retention_ms / 3_600_000:.2f} h): YugabyteDB has expired it; the next window needs a "
            "re-snapshot (snapshot_mode='when_needed')"
        )
    elif fraction >= max_retention_fraction:
        problems.append(
            f"{subject} was last read {idle / 3_600_000:.2f} h ago, {fraction:.0%} of the intent "
            f"retention: it expires in {(retention_ms - idle) / 3_600_000:.2f} h unless a window runs"
        )
    return problems, metrics
