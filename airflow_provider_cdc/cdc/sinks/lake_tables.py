"""A sink's lake tables: the Iceberg or Delta :class:`.formats.TableFormat` of a sink by name,
and setup's check that the format's library is installed and its catalog answers.

Above ``delta`` and ``iceberg`` (it opens them, on first use), which stand on ``formats``: the
names, tags and commits every format shares.
"""

from __future__ import annotations

from collections.abc import Mapping

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.sinks.formats import DELTA, ICEBERG, PARQUET, TableFormat, check_sink_format


def check_table_sink_ready(sink_format: str, table_catalog: Mapping[str, str]) -> None:
    """At setup, before anything is created: the format's library is installed and a named
    Iceberg catalog answers (the default SQLite catalog is created with the first table)."""
    if sink_format == PARQUET:
        return
    module, extra = ("deltalake", "delta") if sink_format == DELTA else ("pyiceberg.catalog.sql", "iceberg")
    try:
        __import__(module)
    except ImportError as exc:
        raise CdcConfigurationError(
            f"sink_format={sink_format!r} needs {module.split('.')[0]} ({exc}): install "
            f"'airflow-provider-cdc[{extra}]' where the tasks and Spark jobs run"
        ) from None
    if sink_format == ICEBERG and table_catalog:
        from airflow_provider_cdc.cdc.sinks.iceberg import open_catalog  # the provider's FileIO, see there
        from airflow_provider_cdc.cdc.sinks.storage import create_private_sqlite

        create_private_sqlite(table_catalog.get("uri"))  # opening a SQLite catalog creates its file
        try:
            open_catalog("cdc", table_catalog).list_namespaces()
        except CdcConfigurationError:
            raise
        except Exception as exc:
            # The catalog's own message may quote its properties: name only the error's type.
            raise CdcConfigurationError(
                f"the Iceberg catalog in table_catalog cannot be reached ({type(exc).__name__}); check its "
                "uri and type (pyiceberg catalog properties)"
            ) from None


def table_format(
    sink_format: str, base_path: str, topic_prefix: str, options: Mapping[str, str] | None = None
) -> TableFormat | None:
    """The table format of a sink (None for plain Parquet)."""
    check_sink_format(sink_format)
    if sink_format == PARQUET:
        return None
    if sink_format == DELTA:
        from airflow_provider_cdc.cdc.sinks.delta import DeltaTables

        return DeltaTables(base_path, topic_prefix, options)
    from airflow_provider_cdc.cdc.sinks.iceberg import IcebergTables

    return IcebergTables(base_path, topic_prefix, options)
