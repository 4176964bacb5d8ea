"""Running a window's job for any source: each source's spec type and job entry, by connector name.

The operators build a source's job spec; the job runs in this process or under ``spark-submit``
(``spark_jobs/cdc_job.py``), which only has the spec's JSON: its ``connector`` names the source.
Sources are imported on first use, so the core loads none of them.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from importlib import import_module
from typing import Any

from airflow_provider_cdc.cdc.errors import CdcConfigurationError

log = logging.getLogger(__name__)

#: What a window job gets to make its Spark session (only when it needs one).
SparkProvider = Callable[[], Any]

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


def lazy_session(spark: Any) -> Callable[[], Any]:
    """A Spark session made on first use (a stream window on a local sink never needs one)."""

    @functools.cache
    def provider() -> Any:
        from airflow_provider_cdc.cdc.spark_session import get_or_create_session

        started = time.monotonic()
        session = get_or_create_session(spark)
        log.info("Spark session ready in %.1fs (master %s)", time.monotonic() - started, session.sparkContext.master)
        return session

    return provider


def recorded_run(spec: Any) -> dict[str, Any]:
    """What a commit entry keeps beyond the data: the scheduler run that planned the window and the
    offset it was planned from (planning.reconcile restores a lost offset from it)."""
    return {
        **({"run": spec.run} if spec.run else {}),
        **({"offset": spec.checkpoint} if spec.checkpoint else {}),
    }


def run_window(
    spec: Any,
    spark_provider: SparkProvider | None,
    *,
    snapshot: Callable[[Any, Callable[[], Any]], Any],
    stream: Callable[[Any, Callable[[], Any]], Any],
) -> Any:
    """Run a source's snapshot or stream job for ``spec`` (a Spark session made on first use unless
    given) and log what it committed; returns the commit-log entry."""
    from airflow_provider_cdc.cdc.naming import side_topics

    provider = spark_provider if spark_provider is not None else lazy_session(spec.spark)
    started = time.monotonic()
    entry = (snapshot if spec.window.kind == "snapshot" else stream)(spec, provider)
    log.info(
        "committed %s: %d events in %d dataset(s), %d transactions, %.1fs",
        entry.window.describe(),
        sum(d.events for d in entry.datasets if d.topic not in side_topics(spec.topic_prefix)),
        len(entry.datasets),
        entry.transactions,
        time.monotonic() - started,
    )
    return entry
