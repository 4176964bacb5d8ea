"""Whether a YugabyteDB capture's next window is due, without peeking at the slot (YugabyteDB cannot).

Pure: the sensor reads the slot and the offset, this decides. A window ending at ``wait_until``
(the run's data interval end) is complete once the server's hybrid time has passed it: every
transaction that commits later gets a later commit hybrid time. The slot must exist and must not
have expired (not read within the intent retention; YugabyteDB does not show expiry, so the
capture tracks its own last read).
"""

from __future__ import annotations

from datetime import datetime

from airflow_provider_cdc.cdc.basics.readiness import Readiness
from airflow_provider_cdc.cdc.sources.yugabyte.admin import YbSlotStatus
from airflow_provider_cdc.cdc.sources.yugabyte.lsn import ht_from_datetime


def slot_readiness(
    status: YbSlotStatus | None, slot: str, *, wait_until: datetime | None, expires_ms: int | None, now_ms: int
) -> Readiness:
    if status is None:
        return Readiness("failed", f"replication slot {slot!r} does not exist; run the setup and snapshot tasks")
    detail = status.to_dict()
    if expires_ms is not None and now_ms >= expires_ms:
        return Readiness(
            "failed",
            f"slot {slot!r} was not read within the intent retention and has expired; re-snapshot",
            detail=detail,
        )
    if wait_until is not None and status.current_ht < ht_from_datetime(wait_until):
        return Readiness("waiting", f"the server's clock has not reached {wait_until.isoformat()} yet")
    lag = status.ack_lag_ms
    return Readiness("ready", f"slot {slot!r}: last acknowledged commit {lag} ms ago", detail=detail)
