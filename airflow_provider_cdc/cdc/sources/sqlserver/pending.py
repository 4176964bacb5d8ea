"""Is there something to capture? The SQL Server answer shared by the sensor and its trigger.

The capture job fills the change tables asynchronously, so a window that should hold a whole
data interval waits until the job has processed every commit up to the interval's end: the
commit time of its newest LSN (``sys.fn_cdc_map_lsn_to_time(sys.fn_cdc_get_max_lsn())``) is at or
after it. On an idle database SQL Server's capture job still advances that time (it records
empty ``cdc.lsn_time_mapping`` rows); the stand-in the tests use does not (docs/sqlserver.md).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.basics.readiness import Readiness
from airflow_provider_cdc.cdc.sources.sqlserver import admin, server_clock


def capture_job_readiness(conn: Any, until: datetime | None, server_time_zone: str = "UTC") -> Readiness:
    """Ready once the capture job's newest commit is at or after ``until`` (UTC); without ``until``,
    once it has captured anything. Failed when CDC is off on the database."""
    server = admin.server_info(conn)
    if not server.cdc_enabled:
        return Readiness(
            "failed",
            f"change data capture is not enabled on database {admin.quote(server.database)}: nothing will arrive "
            "(EXEC sys.sp_cdc_enable_db)",
        )
    try:  # the commit time is local: read in the wrong zone, the sensor would fire early or late
        server_clock.check_server_zone(conn, server_time_zone)
    except CdcConfigurationError as exc:
        return Readiness("failed", str(exc))
    newest = admin.max_lsn(conn)
    agent = "" if admin.agent_running(conn) is not False else " (SQL Server Agent is not running: start it)"
    if newest is None:
        return Readiness("waiting", f"the capture job has not captured any transaction yet{agent}")
    local = admin.value(conn, "SELECT sys.fn_cdc_map_lsn_to_time(?)", newest.to_bytes())
    zone = server_clock.zone_of(server_time_zone)
    at = None if local is None else server_clock.resolve_at(conn, zone, newest.to_bytes(), local)
    detail = {"max_lsn": str(newest), "captured_up_to": None if at is None else at.isoformat()}
    if until is None:
        return Readiness("ready", f"the capture job is at {newest} ({at})", detail=detail)
    if at is not None and at >= until:
        return Readiness("ready", f"the capture job has processed every commit up to {until} (at {at})", detail=detail)
    return Readiness("waiting", f"the capture job is at {at}, waiting for it to pass {until}{agent}", detail=detail)
