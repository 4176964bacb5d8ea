"""Slot health: how much WAL a capture's slot pins, and whether it is about to lose it.

A logical slot pins WAL from its ``restart_lsn`` on. With ``max_slot_wal_keep_size`` set, the
server invalidates the slot (``wal_status`` → ``lost``) once it would retain more than that;
without it, the slot can fill the disk. :func:`assess` turns one reading of
``pg_replication_slots`` into a verdict with thresholds, so an alert fires *before* either
happens. Pure: shared by the check operator and its trigger, unit-tested without a server.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError

if TYPE_CHECKING:  # annotations only: admin (psycopg, pyarrow) is not loaded when a DAG file is parsed
    from airflow_provider_cdc.cdc.sources.postgres.slots import SlotStatus

#: ``max_slot_wal_keep_size`` in bytes (-1: unlimited); readable without superuser.
KEEP_SIZE_SQL = "SELECT pg_size_bytes(current_setting('max_slot_wal_keep_size'))"


@dataclass(frozen=True)
class HealthThresholds:
    """When a slot counts as unhealthy (any one crossed fails the check).

    :param max_retained_fraction: retained WAL as a fraction of ``max_slot_wal_keep_size``
    :param max_retained_bytes: retained WAL in bytes (the only disk guard when the keep size is
        unlimited)
    :param max_lag_bytes: WAL written since the slot's last acknowledgement
    """

    max_retained_fraction: float = 0.8
    max_retained_bytes: int | None = None
    max_lag_bytes: int | None = None

    def __post_init__(self) -> None:
        if not 0 < self.max_retained_fraction <= 1:
            raise CdcConfigurationError(f"max_retained_fraction must be in (0, 1], got {self.max_retained_fraction!r}")
        for name in ("max_retained_bytes", "max_lag_bytes"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise CdcConfigurationError(f"{name} must be a positive number of bytes, got {value!r}")

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HealthThresholds:
        return cls(**data)


@dataclass(frozen=True)
class SlotHealth:
    slot_name: str
    problems: tuple[str, ...]
    warnings: tuple[str, ...] = ()
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def healthy(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        if self.problems:
            return f"slot {self.slot_name!r} is unhealthy: " + " ".join(self.problems)
        m = self.metrics
        keep = m.get("max_slot_wal_keep_size")
        limit = (
            "max_slot_wal_keep_size unlimited"
            if keep is None
            else f"{m.get('retained_fraction') or 0:.0%} of max_slot_wal_keep_size ({keep})"
        )
        return (
            f"slot {self.slot_name!r} is healthy (wal_status {m.get('wal_status')!r}): acknowledged up to "
            f"{m.get('confirmed_flush_lsn')}, {m.get('lag_bytes')} bytes behind the server "
            f"({_behind(m.get('lag_bytes'))}); "
            f"{m.get('retained_bytes')} bytes of WAL retained from restart_lsn {m.get('restart_lsn')}, {limit}. "
            "restart_lsn trails the acknowledged position: PostgreSQL moves it only to a running-transactions "
            "record decoded since the previous acknowledgement (one is logged every 15 s while WAL is written, "
            "and at checkpoints), so the slot keeps the last window's WAL plus what came since, and more while "
            "runs follow each other faster than those records"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "slot_name": self.slot_name,
            "healthy": self.healthy,
            "problems": list(self.problems),
            "warnings": list(self.warnings),
            "metrics": dict(self.metrics),
            "message": self.summary(),
        }


#: What the slot has right after a window: the window's end-of-window message (a 92-byte record,
#: 96 with alignment) where it was acknowledged, plus a running-transactions record or two.
_JUST_AFTER_A_WINDOW_BYTES = 256


def _behind(lag: Any) -> str:
    """Say what the bytes behind are, in terms that match their size."""
    if lag == 0:
        return "nothing written since the last acknowledgement"
    if isinstance(lag, int) and lag <= _JUST_AFTER_A_WINDOW_BYTES:
        return "about what a window leaves: its 96-byte end-of-window message and the server's own records since"
    return (
        "WAL the whole server wrote since the last window, in every database and table, captured or not; "
        "the next window reads past it"
    )


def assess(status: SlotStatus | None, slot_name: str, keep_size_bytes: int, thresholds: HealthThresholds) -> SlotHealth:
    """The verdict on one reading of the slot (``keep_size_bytes`` < 0: unlimited)."""
    if status is None:
        return SlotHealth(
            slot_name,
            (
                f"replication slot {slot_name!r} does not exist: run the capture's setup task; if it "
                "existed before, changes since it was dropped are lost (re-snapshot).",
            ),
        )
    retained, lag = status.retained_bytes, status.pending_bytes
    unlimited = keep_size_bytes < 0
    fraction = None if unlimited or retained is None or keep_size_bytes == 0 else retained / keep_size_bytes
    metrics = {
        "lag_bytes": lag,
        "retained_bytes": retained,
        "wal_status": status.wal_status,
        "safe_wal_size": status.safe_wal_size,
        "max_slot_wal_keep_size": None if unlimited else keep_size_bytes,
        "retained_fraction": None if fraction is None else round(fraction, 4),
        "active": status.active,
        "restart_lsn": None if status.restart_lsn is None else str(status.restart_lsn),
        "confirmed_flush_lsn": None if status.confirmed_flush_lsn is None else str(status.confirmed_flush_lsn),
        "current_lsn": str(status.current_lsn),
    }
    problems: list[str] = []
    warnings: list[str] = []  # none today; kept in the report for callers that read it
    if status.wal_status == "lost":
        problems.append(
            "Its WAL was removed (wal_status 'lost'): changes since the last window are gone. "
            "Re-snapshot (snapshot_mode='when_needed'), or drop the slot and start over."
        )
    elif status.wal_status == "unreserved":
        problems.append(
            f"It retains {retained} bytes, more than max_slot_wal_keep_size ({keep_size_bytes}); the "
            "next checkpoint removes WAL it still needs (wal_status 'unreserved'). Run the capture now."
        )
    elif fraction is not None and fraction >= thresholds.max_retained_fraction:
        problems.append(
            f"It retains {retained} bytes, {fraction:.0%} of max_slot_wal_keep_size ({keep_size_bytes}); "
            f"the server invalidates it after {status.safe_wal_size} more bytes of WAL. Run the capture "
            "more often, or raise max_slot_wal_keep_size."
        )
    if thresholds.max_retained_bytes is not None and retained is not None and retained >= thresholds.max_retained_bytes:
        problems.append(f"It retains {retained} bytes of WAL (limit {thresholds.max_retained_bytes}).")
    if thresholds.max_lag_bytes is not None and lag is not None and lag >= thresholds.max_lag_bytes:
        problems.append(f"It is {lag} bytes behind the server (limit {thresholds.max_lag_bytes}).")
    if status.plugin != "pgoutput" or status.slot_type != "logical":
        problems.append(f"It is not a logical pgoutput slot (plugin {status.plugin!r}).")
    return SlotHealth(slot_name, tuple(problems), tuple(warnings), metrics)
