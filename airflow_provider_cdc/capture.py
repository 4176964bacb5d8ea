"""One capture's configuration, shared by its setup, snapshot, window and sensor tasks.

Operators take a capture object instead of repeating twenty parameters each; the capture's class
picks the source (:class:`PostgresCapture`, ...). It is validated when the DAG file is parsed,
without I/O and without importing Spark, so mistakes (an invalid prefix, a misspelt snapshot
mode, an unparsable table name) fail the DAG import with a clear message rather than a task at
3 a.m. The classes live in :mod:`airflow_provider_cdc.captures`; this module keeps the names
DAGs import.
"""

from airflow_provider_cdc.captures.base import NEW_TABLE_SNAPSHOT, OFFSET_STORES, Capture, SourceRun
from airflow_provider_cdc.captures.postgres import PostgresCapture
from airflow_provider_cdc.captures.sqlserver import SqlServerCapture
from airflow_provider_cdc.captures.yugabyte import YugabyteCapture
from airflow_provider_cdc.captures.yugabyte_cdc_service import YugabyteCdcServiceCapture

__all__ = [
    "NEW_TABLE_SNAPSHOT",
    "OFFSET_STORES",
    "Capture",
    "PostgresCapture",
    "SourceRun",
    "SqlServerCapture",
    "YugabyteCapture",
    "YugabyteCdcServiceCapture",
]
