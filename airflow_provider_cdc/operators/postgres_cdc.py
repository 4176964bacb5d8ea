"""The operators under their PostgreSQL names (DAGs written before there were two sources).

They are the shared operators of :mod:`airflow_provider_cdc.operators.cdc`, subclassed only for
their names, with no logic of their own: the capture object (``PostgresCapture``) picks the source.
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

# Subclasses only for their names (task logs, the Airflow UI and existing DAGs show these); all
# behaviour is the shared operators'.


class PostgresCdcSetupOperator(CdcSetupOperator):
    """:class:`CdcSetupOperator` under its PostgreSQL name."""


class PostgresCdcSnapshotOperator(CdcSnapshotOperator):
    """:class:`CdcSnapshotOperator` under its PostgreSQL name."""


class PostgresCdcBatchOperator(CdcBatchOperator):
    """:class:`CdcBatchOperator` under its PostgreSQL name."""


class PostgresCdcCurrentStateOperator(CdcCurrentStateOperator):
    """:class:`CdcCurrentStateOperator` under its PostgreSQL name."""


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
