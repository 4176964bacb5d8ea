"""The capture classes, under the import path DAGs use (the README and docs/index.md document it).

One capture's configuration is shared by its setup, snapshot, window and sensor tasks: operators
take a capture object instead of repeating twenty parameters each, and the capture's class picks
the source. It is validated when the DAG file is parsed, without I/O and without importing Spark,
so mistakes (an invalid prefix, a misspelt snapshot mode, an unparsable table name) fail the DAG
import with a clear message rather than a task at 3 a.m.

This module is the documented public entry point and holds no code: each class lives in
:mod:`airflow_provider_cdc.captures` (one module per source, on :mod:`~.captures.base`).
"""

from airflow_provider_cdc.captures.base import Capture
from airflow_provider_cdc.captures.postgres import PostgresCapture
from airflow_provider_cdc.captures.sqlserver import SqlServerCapture
from airflow_provider_cdc.captures.yugabyte import YugabyteCapture
from airflow_provider_cdc.captures.yugabyte_cdc_service import YugabyteCdcServiceCapture

__all__ = [
    "Capture",
    "PostgresCapture",
    "SqlServerCapture",
    "YugabyteCapture",
    "YugabyteCdcServiceCapture",
]
