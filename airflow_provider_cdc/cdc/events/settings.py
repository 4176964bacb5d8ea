"""What every source's events share: the value and column settings, and one window's context."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from airflow_provider_cdc.cdc.events.columns import ColumnRules
from airflow_provider_cdc.cdc.events.value_modes import ValueModes


@dataclass(frozen=True)
class EventSettings:
    """How values are represented and which columns (and, on PostgreSQL, logical messages) are captured."""

    modes: ValueModes = field(default_factory=ValueModes)
    columns: ColumnRules = field(default_factory=ColumnRules)
    message_prefix_include: tuple[str, ...] = ()
    message_prefix_exclude: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {
            "modes": self.modes.to_dict(),
            "columns": self.columns.to_dict(),
            "message_prefix_include": list(self.message_prefix_include),
            "message_prefix_exclude": list(self.message_prefix_exclude),
        }

    @classmethod
    def from_dict(cls, data: dict) -> EventSettings:
        return cls(
            modes=ValueModes.from_dict(data.get("modes", {})),
            columns=ColumnRules.from_dict(data.get("columns", {})),
            message_prefix_include=tuple(data.get("message_prefix_include", ())),
            message_prefix_exclude=tuple(data.get("message_prefix_exclude", ())),
        )


@dataclass(frozen=True)
class EventContext:
    """Values shared by every event of one window."""

    topic_prefix: str
    database: str
    window_id: str
    ts_ms: int  # the window's planned time: fixed, so a re-run writes identical rows

    @classmethod
    def of_window(cls, topic_prefix: str, database: str, window: Any) -> EventContext:
        """The context of ``window`` (a :class:`~cdc.window.Window`)."""
        return cls(topic_prefix=topic_prefix, database=database, window_id=window.window_id, ts_ms=window.planned_at_ms)


def read_event_ts_ms(context: EventContext, source: dict) -> int:
    """The ``ts_ms`` of rows read by a query: never before the read's ``source.ts_ms`` (a read
    happens after the window was planned, and Debezium's lag ``ts_ms - source.ts_ms`` must not
    come out negative)."""
    return max(context.ts_ms, source["ts_ms"])
