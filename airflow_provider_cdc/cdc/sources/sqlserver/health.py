"""How close a SQL Server capture is to losing changes: the cleanup job's retention edge.

Nothing on SQL Server holds changes for a reader (PostgreSQL's slot does): the cleanup job deletes
change rows older than its retention (``msdb.dbo.cdc_jobs.retention``, minutes; 3 days by
default) whether a capture has read them or not. The oldest change this capture has not read is
the first commit at or after its stored position; once it is older than the retention, the next
cleanup purges it. The check reports how much of the retention that oldest unread change has
used, and the time left before it is purged, and fails at a configurable fraction.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any
from zoneinfo import ZoneInfo

from airflow_provider_cdc.cdc.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.sources.sqlserver import admin
from airflow_provider_cdc.cdc.sources.sqlserver.lsn import SqlServerLsn

RETENTION_SQL = "SELECT retention FROM msdb.dbo.cdc_jobs WHERE job_type = N'cleanup' AND database_id = DB_ID()"
OLDEST_UNREAD_SQL = "SELECT MIN(tran_end_time) FROM cdc.lsn_time_mapping WHERE start_lsn >= ?"


@dataclass(frozen=True)
class RetentionHealth:
    healthy: bool
    message: str
    retention_minutes: int | None
    oldest_unread: str | None  # commit time (UTC, ISO) of the oldest change not yet captured
    used_fraction: float | None  # of the retention, by that change's age
    seconds_to_purge: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def assess_retention(
    conn: Any, next_lsn: SqlServerLsn | None, *, max_fraction: float, now: datetime, server_time_zone: str = "UTC"
) -> RetentionHealth:
    if not 0 < max_fraction <= 1:
        raise CdcConfigurationError(f"max_retention_fraction must be in (0, 1], got {max_fraction!r}")
    retention = admin.value(conn, RETENTION_SQL)
    if retention is None:
        return RetentionHealth(
            False,
            "no cleanup job is configured for this database (msdb.dbo.cdc_jobs has no 'cleanup' row): change rows are "
            "never purged and the change tables grow without bound. Create it: EXEC sys.sp_cdc_add_job "
            "@job_type = N'cleanup'",
            None,
            None,
            None,
            None,
        )
    minutes = int(retention)
    if next_lsn is None:
        return RetentionHealth(True, "the capture has no stored position yet", minutes, None, 0.0, None)
    oldest = admin.value(conn, OLDEST_UNREAD_SQL, next_lsn.to_bytes())
    if oldest is None:
        return RetentionHealth(True, f"nothing unread (retention {minutes} min)", minutes, None, 0.0, None)
    if oldest.tzinfo is None:
        oldest = oldest.replace(tzinfo=ZoneInfo(server_time_zone))
    oldest = oldest.astimezone(timezone.utc)
    age = max(0.0, (now - oldest).total_seconds())
    fraction = age / (minutes * 60) if minutes > 0 else 1.0
    left = minutes * 60 - age
    summary = (
        f"the oldest unread change (committed {oldest:%Y-%m-%d %H:%M:%S} UTC) has used {fraction:.0%} of the cleanup "
        f"job's retention of {minutes} min; it is purged in about {max(left, 0) / 60:.0f} min"
    )
    if fraction >= max_fraction:
        return RetentionHealth(
            False,
            f"{summary}, past the limit of {max_fraction:.0%}: run the capture's windows (they are behind), or raise "
            "the retention (EXEC sys.sp_cdc_change_job @job_type = N'cleanup', @retention = <minutes>)",
            minutes,
            oldest.isoformat(),
            round(fraction, 4),
            left,
        )
    return RetentionHealth(True, summary, minutes, oldest.isoformat(), round(fraction, 4), left)
