"""Maintenance of a capture's lake tables (``sink_format`` ``iceberg`` or ``delta``).

Every window adds a table commit with the window's files to each dataset it landed in, so an
hourly capture makes thousands of small files and commits a year. This operator compacts each
table's small files and expires history older than ``retain_hours`` (Iceberg: snapshot expiry
and the files only expired snapshots referenced; Delta: vacuum), typically from a daily DAG.

It holds the capture lock while it works, like a window run: a compaction racing a window's
commit would make one of them fail its optimistic commit. Time travel (``as_of``, reading a
window's version) only reaches back ``retain_hours``; the windows' rows themselves are kept.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from airflow_provider_cdc.captures.base import Capture
from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.basics.naming import Topic
from airflow_provider_cdc.operators.base import CdcCaptureOperator, fail_fast_on_terminal_errors
from airflow_provider_cdc.version_compat import Context


class CdcTableMaintenanceOperator(CdcCaptureOperator):
    """Compact a capture's lake tables and expire their old history.

    :param capture: a capture with ``sink_format`` ``"iceberg"`` or ``"delta"``
    :param compact: merge each table's small files
    :param retain_hours: history kept for time travel (None: expire nothing). Templated.
    """

    template_fields: Sequence[str] = ("retain_hours",)

    def __init__(
        self, *, capture: Capture, compact: bool = True, retain_hours: float | None = 7 * 24, **kwargs: Any
    ) -> None:
        super().__init__(capture=capture, **kwargs)
        if capture.sink_format == "parquet":
            raise CdcConfigurationError(
                f"capture {capture.topic_prefix!r} lands Parquet directories (sink_format='parquet'): "
                "table maintenance is for sink_format 'iceberg' or 'delta'"
            )
        self.compact = compact
        self.retain_hours = retain_hours

    def execute(self, context: Context) -> dict[str, Any]:
        # The tables' files may be on an object store: its access for delta-rs and pyiceberg.
        with fail_fast_on_terminal_errors(self.capture), self._object_store():
            return self._maintain()

    def _maintain(self) -> dict[str, Any]:
        from airflow_provider_cdc.cdc.sinks.formats import local_base
        from airflow_provider_cdc.cdc.sinks.lake_tables import table_format

        capture = self.capture
        retain = None if self.retain_hours in (None, "") else float(self.retain_hours)  # type: ignore[arg-type]
        if retain is not None and retain < 0:
            raise CdcConfigurationError(f"retain_hours must be 0 or more, got {retain}")
        tables = table_format(
            capture.sink_format, local_base(capture.sink_path), capture.topic_prefix, capture.catalog_properties()
        )
        if tables is None:
            raise CdcConfigurationError(
                f"capture {capture.topic_prefix!r} lands Parquet files (sink_format={capture.sink_format!r}): table "
                "maintenance applies to lake tables only (sink_format 'iceberg' or 'delta')"
            )
        done: dict[str, Any] = {}
        with capture.open_run(self.log) as source:  # the capture lock
            prefix = capture.topic_prefix
            topics = [Topic.for_table(prefix, r.schema, r.name) for r in source.tables]
            topics += [Topic.transactions(prefix), Topic.messages(prefix), Topic.gaps(prefix)]
            for topic in topics:
                if not tables.exists(topic):
                    continue
                result = tables.maintain(topic, compact=self.compact, retain_hours=retain)
                done[topic.name] = json.loads(json.dumps(result, default=str))  # XCom: plain values
                self.log.info("%s: %s", topic.name, _describe(done[topic.name]))
        return {"sink_format": capture.sink_format, "tables": done}


def _describe(result: Any) -> str:
    if isinstance(result, dict):
        return ", ".join(f"{k}={v if not isinstance(v, (list, dict)) else len(v)}" for k, v in result.items())
    return str(result)
