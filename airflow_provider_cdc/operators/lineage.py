"""OpenLineage for the capture operators: the source tables in, the landed datasets out.

Used by Airflow's OpenLineage provider through the operators' ``get_openlineage_facets_on_complete``
(its default extractor); imported only then, so the package works without the provider.

Naming follows the OpenLineage dataset naming spec: PostgreSQL ``postgres://host:port`` with
``database.schema.table``; SQL Server ``mssql://host:port`` with ``database.schema.table``.
YugabyteDB has no entry in the spec; its YSQL endpoint speaks PostgreSQL and every other
producer that reads it (through the Postgres provider, dbt, Spark's JDBC source) names it
``postgres://host:port``, so we do too, and the graph joins up. Outputs are named by
:mod:`airflow_provider_cdc.cdc.landed` (the same URIs as the Assets). Each output carries a
schema facet read from the Parquet footer of the last committed window's file for that dataset
(the real written schema: the Debezium envelope with this table's ``before``/``after``
columns); the inputs carry none, because the run does not keep the source's catalog and
reading it again after the task would cost a round trip per table for a facet the outputs
already describe. Nothing here reads a password.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa

from airflow_provider_cdc.cdc.landed import CURRENT_STATE, LandedDataset, capture_datasets, state_datasets
from airflow_provider_cdc.cdc.tables import TableRef

log = logging.getLogger(__name__)


def source_namespace(capture: Any) -> tuple[str, str]:
    """(namespace, database) of the capture's source, from its Airflow connection."""
    info = capture.hook().connection_info
    port = info.port or {"mssql": 1433}.get(capture.LINEAGE_SCHEME, 5432)
    database = getattr(info, "database", None) or getattr(info, "dbname", "")
    return f"{capture.LINEAGE_SCHEME}://{info.host}:{port}", database


def window_lineage(operator: Any) -> Any:
    """The snapshot's or window's lineage: source tables in; topics and side tables out."""
    from airflow.providers.common.compat.openlineage.facet import Dataset
    from airflow.providers.openlineage.extractors import OperatorLineage

    capture = operator.capture
    tables = _run_tables(operator)
    namespace, database = source_namespace(capture)
    inputs = [Dataset(namespace=namespace, name=f"{database}.{t.schema}.{t.name}") for t in tables]
    landed = capture_datasets(capture.sink_path, capture.topic_prefix, tables, messages=capture.LANDS_MESSAGES)
    schemas = _landed_schemas(capture.sink_path, capture.topic_prefix, {d.topic for d in landed})
    outputs = [_dataset(d, schemas.get(d.topic)) for d in landed]
    return OperatorLineage(inputs=inputs, outputs=outputs)


def state_lineage(operator: Any, tables: Sequence[TableRef]) -> Any:
    """The current-state fold's lineage: the topics in, the state tables out."""
    from airflow.providers.openlineage.extractors import OperatorLineage

    capture = operator.capture
    topics = capture_datasets(capture.sink_path, capture.topic_prefix, tables)
    schemas = _landed_schemas(capture.sink_path, capture.topic_prefix, {d.topic for d in topics})
    inputs = [_dataset(d, schemas.get(d.topic)) for d in topics if d.table is not None]
    outputs = [_dataset(d, _state_schema(d)) for d in state_datasets(operator.state_path, capture.topic_prefix, tables)]
    return OperatorLineage(inputs=inputs, outputs=outputs)


def _run_tables(operator: Any) -> tuple[TableRef, ...]:
    """The tables the run captured (include-list captures know them only after the run)."""
    return tuple(getattr(operator, "_run_tables", ()) or operator.capture.table_refs)


def _dataset(landed: LandedDataset, schema: pa.Schema | None) -> Any:
    from airflow.providers.common.compat.openlineage.facet import Dataset, SchemaDatasetFacet

    facets = {} if schema is None else {"schema": SchemaDatasetFacet(fields=[_field(f) for f in schema])}
    return Dataset(namespace=landed.namespace, name=landed.path, facets=facets)


def _field(field: pa.Field) -> Any:
    from airflow.providers.common.compat.openlineage.facet import SchemaDatasetFacetFields

    nested: Iterable[pa.Field] = ()
    if pa.types.is_struct(field.type):
        nested = list(field.type)
    elif pa.types.is_list(field.type) and pa.types.is_struct(field.type.value_type):
        nested = list(field.type.value_type)
    return SchemaDatasetFacetFields(name=field.name, type=str(field.type), fields=[_field(f) for f in nested])


def _landed_schemas(sink_path: str, topic_prefix: str, topics: set[str]) -> dict[str, pa.Schema]:
    """Each topic's schema as written by the newest committed window that wrote it (reads the
    commit log from the end and stops once every topic is found)."""
    from airflow_provider_cdc.cdc.sinks.commit_log import CommitLog
    from airflow_provider_cdc.cdc.sinks.storage import storage_for

    storage = storage_for(sink_path)
    found: dict[str, pa.Schema] = {}
    try:
        for entry in CommitLog(storage, topic_prefix).newest_first():
            for dataset in entry.datasets:
                if dataset.topic in topics and dataset.topic not in found and dataset.events:
                    schema = _parquet_schema(storage.uri(dataset.path))
                    if schema is not None:
                        found[dataset.topic] = schema
            if found.keys() >= topics:
                break
    except Exception as exc:  # lineage is best effort: never fail a finished task
        log.warning("OpenLineage: could not read the landed schemas: %s", exc)
    return found


def _state_schema(landed: LandedDataset) -> pa.Schema | None:
    assert landed.kind == CURRENT_STATE
    try:
        import pyarrow.dataset as ds

        return ds.dataset(landed.uri.removeprefix("file://"), format="parquet").schema
    except Exception:  # no state yet, or a store pyarrow cannot open here
        return None


def _parquet_schema(uri: str) -> pa.Schema | None:
    import pyarrow.dataset as ds

    dataset = ds.dataset(uri.removeprefix("file://"), format="parquet")
    files = dataset.files[:1]
    if not files:
        return None
    import pyarrow.parquet as pq

    return pq.read_schema(files[0], filesystem=dataset.filesystem).remove_metadata()
