"""The frame every source's window job runs in: the Spark session made on first use (a stream
window on a local sink never needs one), the scheduler run recorded in the commit entry, the
committed window logged.

A source's ``jobs.py`` passes its snapshot and stream readers to :func:`run_window`.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


#: What a window job gets to make its Spark session (only when it needs one).
SparkProvider = Callable[[], Any]


def lazy_session(spark: Any) -> Callable[[], Any]:
    """A Spark session made on first use (a stream window on a local sink never needs one)."""

    @functools.cache
    def provider() -> Any:
        from airflow_provider_cdc.cdc.basics.spark_session import get_or_create_session

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
    from airflow_provider_cdc.cdc.basics.naming import side_topics

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
