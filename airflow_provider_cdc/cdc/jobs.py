"""Running a window's job for any source: each source's spec type and job entry, by connector name.

The operators build a source's job spec; the job runs in this process or under ``spark-submit``
(``spark_jobs/cdc_job.py``), which only has the spec's JSON: its ``connector`` names the source.
Sources are imported on first use, so the core loads none of them.
"""

from __future__ import annotations

import logging
from importlib import import_module
from typing import Any

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.reading.window_job import SparkProvider

log = logging.getLogger(__name__)


# connector -> (job spec class, job entry point), as "module:name"
_SOURCES = {
    "postgresql": (
        "airflow_provider_cdc.cdc.sources.postgres.spec:PostgresJobSpec",
        "airflow_provider_cdc.cdc.sources.postgres.jobs:run_job",
    ),
    "sqlserver": (
        "airflow_provider_cdc.cdc.sources.sqlserver.spec:SqlServerJobSpec",
        "airflow_provider_cdc.cdc.sources.sqlserver.jobs:run_job",
    ),
    "yugabytedb": (
        "airflow_provider_cdc.cdc.sources.yugabyte.spec:YugabyteJobSpec",
        "airflow_provider_cdc.cdc.sources.yugabyte.jobs:run_job",
    ),
    "yugabytedb_grpc": (
        "airflow_provider_cdc.cdc.sources.yugabyte_cdc.spec:YbCdcJobSpec",
        "airflow_provider_cdc.cdc.sources.yugabyte_cdc.jobs:run_job",
    ),
}


def _load(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(import_module(module), name)


def _entry(connector: str) -> tuple[str, str]:
    try:
        return _SOURCES[connector]
    except KeyError:
        raise CdcConfigurationError(f"unknown connector {connector!r} (known: {', '.join(sorted(_SOURCES))})") from None


def spec_from_json(text: str) -> Any:
    """A window job's spec from its JSON (the connector it names picks the class)."""
    import json

    connector = json.loads(text).get("connector") or "postgresql"
    return _load(_entry(connector)[0]).from_json(text)


def run_window_job(spec: Any, spark_provider: SparkProvider | None = None) -> Any:
    """Run the window of ``spec`` (any source's job spec) and return its commit-log entry."""
    from airflow_provider_cdc.cdc.sinks import object_store

    # Every store client the job builds (Arrow, delta-rs, pyiceberg, the commit log) uses the
    # capture's object-store access.
    with object_store.using(spec.options.object_store):
        return _load(_entry(spec.connector)[1])(spec, spark_provider)
