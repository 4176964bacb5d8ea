"""Operator that reports a SQL Server capture's distance to the cleanup job's retention edge."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from airflow_provider_cdc.captures.sqlserver import SqlServerCapture
from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.sources.sqlserver.lsn import SqlServerLsn
from airflow_provider_cdc.offsets.base import load_offset
from airflow_provider_cdc.operators.base import CdcCaptureOperator, fail_fast_on_terminal_errors
from airflow_provider_cdc.version_compat import AirflowFailException, Context


class SqlServerCdcRetentionHealthOperator(CdcCaptureOperator):
    """Fail *before* the cleanup job purges changes the capture has not read.

    Reports the cleanup job's retention, the commit time of the oldest change after the stored
    offset, the fraction of the retention it has used and the time left before it is purged
    (XCom); fails (so Airflow's alerting fires) when that fraction reaches
    ``max_retention_fraction``, when no cleanup job exists, or when the retention cannot be read.

    The retention is read from ``msdb.dbo.cdc_jobs`` (needs a user and ``GRANT SELECT ON
    dbo.cdc_jobs`` in msdb; not on Azure SQL Database), else ``sys.sp_cdc_help_jobs`` (db_owner),
    else taken from ``retention_minutes``.

    :param capture: the SQL Server capture
    :param max_retention_fraction: fail at this fraction of the retention (default 0.8)
    :param retention_minutes: the cleanup job's retention, for a login that can read neither
        (set it to what ``sys.sp_cdc_change_job @retention`` was set to; default: read it)
    """

    template_fields: Sequence[str] = ("max_retention_fraction", "retention_minutes")
    ui_color = "#ffe9c9"

    def __init__(
        self,
        *,
        capture: SqlServerCapture,
        max_retention_fraction: float = 0.8,
        retention_minutes: int | None = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(capture, SqlServerCapture):
            raise CdcConfigurationError(f"capture must be a SqlServerCapture, got {type(capture).__name__}")
        super().__init__(capture=capture, **kwargs)
        self.max_retention_fraction = max_retention_fraction
        self.retention_minutes = retention_minutes

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_provider_cdc.cdc.sources.sqlserver.health import assess_retention

        capture: SqlServerCapture = self.capture  # type: ignore[assignment]
        with fail_fast_on_terminal_errors(capture):
            offset = load_offset(capture.store(), capture.topic_prefix, capture.OFFSET_TYPE)
            with capture.hook().session() as conn:
                health = assess_retention(
                    conn,
                    None if offset is None or offset.lsn is None else SqlServerLsn(offset.lsn),
                    max_fraction=float(self.max_retention_fraction),
                    now=datetime.now(timezone.utc),
                    server_time_zone=capture.server_time_zone,
                    retention_minutes=None if self.retention_minutes is None else int(self.retention_minutes),
                )
        if not health.healthy:
            raise AirflowFailException(f"capture {capture.topic_prefix}: {health.message}")
        self.log.info("capture %s: %s", capture.topic_prefix, health.message)
        return health.to_dict()
