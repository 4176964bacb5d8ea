"""The operators under their PostgreSQL names (DAGs written before there were two sources).

They are the shared operators of :mod:`airflow_provider_cdc.operators.cdc`, with no logic of
their own: the capture object (``PostgresCapture``) picks the source.
"""

from airflow_provider_cdc.operators.cdc import (
    CdcBatchOperator,
    CdcCaptureOperator,
    CdcCurrentStateOperator,
    CdcSetupOperator,
    CdcSnapshotOperator,
    _CaptureOperator,
    airflow_signals,
    fail_fast_on_terminal_errors,
)

PostgresCdcSetupOperator = CdcSetupOperator
PostgresCdcSnapshotOperator = CdcSnapshotOperator
PostgresCdcBatchOperator = CdcBatchOperator
PostgresCdcCurrentStateOperator = CdcCurrentStateOperator

__all__ = [
    "CdcCaptureOperator",
    "PostgresCdcBatchOperator",
    "PostgresCdcCurrentStateOperator",
    "PostgresCdcSetupOperator",
    "PostgresCdcSnapshotOperator",
    "_CaptureOperator",
    "airflow_signals",
    "fail_fast_on_terminal_errors",
]
