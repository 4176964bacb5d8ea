"""How close a SQL Server capture is to losing changes: the cleanup job's retention edge.

Nothing on SQL Server holds changes for a reader (PostgreSQL's slot does): the cleanup job deletes
change rows older than its retention (``msdb.dbo.cdc_jobs.retention``, minutes; 3 days by
default) whether a capture has read them or not. The oldest change this capture has not read is
the first commit at or after its stored position; once it is older than the retention, the next
cleanup purges it. The check reports how much of the retention that oldest unread change has
used, and the time left before it is purged, and fails at a configurable fraction.

Where the retention comes from: ``msdb.dbo.cdc_jobs`` (a login reads it only with a user and a grant
in msdb; Azure SQL Database has no three-part names into msdb: error 40515), else
``sys.sp_cdc_help_jobs`` (needs db_owner; it works on Azure SQL Database), else a retention
configured on the operator. Without any of them the result says the retention is unknown and why.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.sources.sqlserver import admin, server_clock
from airflow_provider_cdc.cdc.sources.sqlserver.connection import error_number, server_said
from airflow_provider_cdc.cdc.sources.sqlserver.lsn import SqlServerLsn

RETENTION_SQL = "SELECT retention FROM msdb.dbo.cdc_jobs WHERE job_type = N'cleanup' AND database_id = DB_ID()"
#: The same configuration in the current database; db_owner only (Microsoft's page, Permissions).
HELP_JOBS_SQL = "EXEC sys.sp_cdc_help_jobs"
#: Errors that mean "this login cannot read it here", not "something broke": 229 permission denied,
#: 916 no user in msdb, 208 no such object, 2812 no such procedure, 40515 (Azure SQL Database) no names into another
#: database, 22904 "DBO privileges are required".
_NOT_READABLE = {229, 916, 208, 2812, 40515, 22904}
# The first commit by LSN, not MIN(tran_end_time): local times go back when the clocks do. Rows
# with tran_id 0x00 are the capture job's idle markers, not changes (Learn, cdc.lsn_time_mapping;
# Debezium filters them the same way, SqlServerConnection's GET_NTH_TRANSACTION_LSN_*).
OLDEST_UNREAD_SQL = (
    "SELECT TOP (1) start_lsn, tran_end_time FROM cdc.lsn_time_mapping "
    "WHERE start_lsn >= ? AND tran_id <> 0x00 ORDER BY start_lsn"
)


@dataclass(frozen=True)
class RetentionHealth:
    healthy: bool
    message: str
    retention_minutes: int | None
    oldest_unread: str | None  # commit time (UTC, ISO) of the oldest change not yet captured
    used_fraction: float | None  # of the retention, by that change's age
    seconds_to_purge: float | None
    #: msdb.dbo.cdc_jobs, sys.sp_cdc_help_jobs, configured (the operator's retention_minutes), unknown
    retention_source: str = "msdb.dbo.cdc_jobs"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Retention:
    minutes: int | None  # None: no cleanup job (source known) or unreadable (source "unknown")
    source: str
    why_unknown: str | None = None


def read_retention(conn: Any) -> Retention:
    """The cleanup job's retention from the first source this login can read."""
    reasons = []
    try:
        found = admin.rows(conn, RETENTION_SQL)
        return Retention(int(found[0][0]) if found and found[0][0] is not None else None, "msdb.dbo.cdc_jobs")
    except Exception as exc:
        if error_number(exc) not in _NOT_READABLE:
            raise
        reasons.append(f"msdb.dbo.cdc_jobs: {server_said(exc)}")
    try:
        jobs = _help_jobs(conn)
    except Exception as exc:
        if error_number(exc) not in _NOT_READABLE:
            raise
        reasons.append(f"sys.sp_cdc_help_jobs: {server_said(exc)}")
        return Retention(None, "unknown", "; ".join(reasons))
    cleanup = [job for job in jobs if str(job.get("job_type", "")).lower() == "cleanup"]
    retention = cleanup[0].get("retention") if cleanup else None
    return Retention(None if retention is None else int(retention), "sys.sp_cdc_help_jobs")


def _help_jobs(conn: Any) -> list[dict[str, Any]]:
    """``sys.sp_cdc_help_jobs``'s rows by column name (its first result with columns)."""
    names, found = admin.first_result(conn, HELP_JOBS_SQL)
    return [dict(zip((n.lower() for n in names), row)) for row in found]


def grants_for_retention(conn: Any) -> str:
    """What a DBA runs so that this login can read the cleanup job's retention."""
    user = admin.quote(str(admin.value(conn, admin.USER_SQL)))
    return (
        f"USE msdb; CREATE USER {user} FOR LOGIN {user}; GRANT SELECT ON dbo.cdc_jobs TO {user}; (SQL Server and "
        "Azure SQL Managed Instance; the login's name for FOR LOGIN if it differs from the user's; skip CREATE USER "
        "if the login has a user in msdb), or, on Azure SQL Database, where msdb cannot be named, membership of "
        f"db_owner for sys.sp_cdc_help_jobs (ALTER ROLE [db_owner] ADD MEMBER {user};), or set the operator's "
        "retention_minutes to the retention the cleanup job uses"
    )


def retention_access_warning(conn: Any) -> str | None:
    """The setup's note when the health check could not read the retention as this login (a
    capture itself never needs it: it detects purged changes by the instances' min LSNs)."""
    retention = read_retention(conn)
    if retention.source != "unknown":
        return None
    return (
        f"the capture login cannot read the CDC cleanup job's retention ({retention.why_unknown}), which "
        f"SqlServerCdcRetentionHealthOperator reports on. If you use it, run: {grants_for_retention(conn)}"
    )


def assess_retention(
    conn: Any,
    next_lsn: SqlServerLsn | None,
    *,
    max_fraction: float,
    now: datetime,
    server_time_zone: str = "UTC",
    retention_minutes: int | None = None,
) -> RetentionHealth:
    if not 0 < max_fraction <= 1:
        raise CdcConfigurationError(f"max_retention_fraction must be in (0, 1], got {max_fraction!r}")
    if retention_minutes is not None and int(retention_minutes) <= 0:
        raise CdcConfigurationError(
            f"retention_minutes must be a positive number of minutes, not {retention_minutes!r}"
        )
    retention = (
        Retention(int(retention_minutes), "configured") if retention_minutes is not None else read_retention(conn)
    )
    if retention.source == "unknown":
        return RetentionHealth(
            False,
            f"the CDC cleanup job's retention is unknown: this login can read neither of the places it is kept "
            f"({retention.why_unknown}), so the distance to it cannot be checked. Run: {grants_for_retention(conn)}",
            None,
            None,
            None,
            None,
            "unknown",
        )
    if retention.minutes is None:
        return RetentionHealth(
            False,
            f"no cleanup job is configured for this database ({retention.source} has no 'cleanup' row): change rows "
            "are never purged and the change tables grow without bound. Create it: EXEC sys.sp_cdc_add_job "
            "@job_type = N'cleanup'",
            None,
            None,
            None,
            None,
            retention.source,
        )
    return _assess(conn, next_lsn, retention, max_fraction=max_fraction, now=now, server_time_zone=server_time_zone)


def _assess(
    conn: Any,
    next_lsn: SqlServerLsn | None,
    retention: Retention,
    *,
    max_fraction: float,
    now: datetime,
    server_time_zone: str,
) -> RetentionHealth:
    minutes = int(retention.minutes or 0)
    source = retention.source
    if next_lsn is None:
        return RetentionHealth(True, "the capture has no stored position yet", minutes, None, 0.0, None, source)
    # The commit times are local: read in the wrong zone, the age would be off by the difference.
    server_clock.check_server_zone(conn, server_time_zone)
    found = admin.rows(conn, OLDEST_UNREAD_SQL, next_lsn.to_bytes())
    if not found:
        return RetentionHealth(True, f"nothing unread (retention {minutes} min)", minutes, None, 0.0, None, source)
    start_lsn, local = found[0]
    oldest = server_clock.resolve_at(conn, server_clock.zone_of(server_time_zone), bytes(start_lsn), local)
    age = max(0.0, (now - oldest).total_seconds())
    fraction = age / (minutes * 60) if minutes > 0 else 1.0
    left = minutes * 60 - age
    summary = (
        f"the oldest unread change (committed {oldest:%Y-%m-%d %H:%M:%S} UTC) has used {fraction:.0%} of the cleanup "
        f"job's retention of {minutes} min ({source}); it is purged in about {max(left, 0) / 60:.0f} min"
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
            source,
        )
    return RetentionHealth(True, summary, minutes, oldest.isoformat(), round(fraction, 4), left, source)
