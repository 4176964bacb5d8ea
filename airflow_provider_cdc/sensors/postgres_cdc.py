"""The sensor under its PostgreSQL name (DAGs written before there were two sources).

It is :class:`airflow_provider_cdc.sensors.cdc.CdcChangesSensor`, subclassed only for its name:
with a ``PostgresCapture`` it waits for pending WAL on the slot (and, with
``require_captured_change``, a captured change decoded from it).
"""

from airflow_provider_cdc.sensors.cdc import CdcChangesSensor


class PostgresCdcChangesSensor(CdcChangesSensor):
    """:class:`CdcChangesSensor` under its PostgreSQL name."""


__all__ = ["CdcChangesSensor", "PostgresCdcChangesSensor"]
