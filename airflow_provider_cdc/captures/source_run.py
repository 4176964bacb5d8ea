"""One run's session with a source: the interface the shared operators talk to during a run.

Each source's capture opens its own (:meth:`Capture.open_run <.base.Capture.open_run>`), holding
the capture lock; it answers the operators' questions (where does the source stand, where does a
window end, what does the job read) and acknowledges what landed where the source has something
to acknowledge.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from datetime import datetime
from typing import Any

from airflow_provider_cdc.cdc.basics.positions import Position
from airflow_provider_cdc.cdc.basics.tables import TableRef
from airflow_provider_cdc.cdc.basics.window import Window
from airflow_provider_cdc.cdc.planning.gaps import CaptureGap
from airflow_provider_cdc.cdc.planning.offset import CaptureOffset, OffsetIdentity
from airflow_provider_cdc.cdc.planning.plan import SnapshotDecision, StreamPlan


class SourceRun(ABC):
    """One run's session with the source (opened by :meth:`Capture.open_run`, holding the lock).

    ``identity`` pins the offset to this server and database; ``tables`` are the tables the run
    reads (resolved when the run starts)."""

    identity: OffsetIdentity
    tables: tuple[TableRef, ...]

    def __init__(self, capture: Any, hook: Any, conn: Any, identity: OffsetIdentity) -> None:
        self.capture = capture
        self.hook = hook
        self.conn = conn  # the session holding the capture lock
        self.identity = identity
        self.tables = ()

    @abstractmethod
    def status(self) -> Any:
        """The source's view of this capture now (PostgreSQL: the slot; None where it has none)."""

    @abstractmethod
    def unavailable(self, offset: CaptureOffset | None, status: Any) -> tuple[str, str] | None:
        """``(gap reason, why)`` when the source can no longer deliver the changes after ``offset``
        (a lost slot, purged change rows); None when it can."""

    @abstractmethod
    def prepare_snapshot(self, decision: SnapshotDecision, status: Any) -> None:
        """Make the source ready for a snapshot that is due (PostgreSQL: the slot it continues from)."""

    @abstractmethod
    def gap(self, decision: SnapshotDecision, offset: CaptureOffset | None, status: Any, now_ms: int) -> CaptureGap:
        """The record of changes lost, for a snapshot that re-snapshots because of them."""

    @abstractmethod
    def plan_stream(
        self, offset: CaptureOffset | None, requested: Position | None, now_ms: int, *, until: datetime | None = None
    ) -> StreamPlan:
        """The next stream window: ending at ``requested``, or after the last commit before ``until``
        (a UTC time; sources that map commit times to positions), or at the source's current position."""

    @abstractmethod
    def heartbeat(self, query: str) -> None:
        """Run ``heartbeat_action_query`` in its own transaction."""

    @abstractmethod
    def acknowledge(self, position: Position, saved: CaptureOffset | None = None) -> Position | None:
        """Tell the source everything before ``position`` landed (None: nothing to tell it).
        ``saved`` is the offset as just stored, for sources that acknowledge more than a position."""

    @abstractmethod
    def check_restored(self, offset: CaptureOffset) -> None:
        """``offset`` rests on the sink's commit log alone (the offset store lost or reset it): fail
        (:func:`cdc.planning.uncorroborated_position`) when the source's own record of what was
        acknowledged lags it, since catching up would move the source on the log's word. Sources
        that acknowledge nothing (SQL Server) have nothing to compare it with."""

    @abstractmethod
    def finish_landed(self, offset: CaptureOffset | None) -> None:
        """Before a replayed run reports: bring the acknowledgement up to the stored offset (a run
        stopped after storing it), failing when the source moved past it."""

    @abstractmethod
    def window_detail(self, window: Window, status: Any) -> str:
        """What the window's log line adds for this source (e.g. bytes of WAL and slot lag)."""

    @abstractmethod
    def lag(self) -> int | None:
        """How far the capture is behind after the window (bytes of WAL; None where unknown)."""

    @abstractmethod
    def job_spec(
        self,
        window: Window,
        offset: CaptureOffset | None,
        *,
        run: dict[str, Any] | None,
        checkpoint: dict[str, Any] | None,
        gap: CaptureGap | None = None,
    ) -> Any:
        """The job spec that reads ``window`` (``offset``: the offset it was planned from)."""


def common_spec_fields(
    source: Any,
    window: Window,
    offset: CaptureOffset | None,
    *,
    run: dict[str, Any] | None,
    checkpoint: dict[str, Any] | None,
    gap: CaptureGap | None,
    incremental: bool = True,
) -> dict[str, Any]:
    """The fields every source's job spec has (its :meth:`SourceRun.job_spec` adds its own);
    with ``incremental``, those of the incremental snapshot the window carries too. ``source``: a
    run (its ``capture`` and ``tables``)."""
    capture = source.capture
    fields = {
        "topic_prefix": capture.topic_prefix,
        "tables": source.tables,
        "window": window,
        "sink_path": capture.sink_path,
        "options": capture.run_options(),
        "spark": capture.spark_options(),
        "events": capture.event_settings(),
        "gap": gap,
        "run": run,
        "checkpoint": checkpoint,
    }
    if incremental:
        fields["incremental"] = offset.incremental if offset is not None and window.kind == "stream" else None
        fields["signal_table"] = capture.signal_table_ref
        fields["incremental_watermarks"] = capture.incremental_watermarks
    return fields


__all__ = ["SourceRun", "common_spec_fields"]
