"""OpenLineage for the capture operators: the source tables in, the landed datasets out.

Used by Airflow's OpenLineage provider through the operators' ``get_openlineage_facets_on_complete``
(its default extractor); imported only then, so the package works without the provider.

Naming follows the OpenLineage dataset naming spec: PostgreSQL ``postgres://host:port`` with
``database.schema.table``; SQL Server ``mssql://host:port`` with ``database.schema.table``.
YugabyteDB has no entry in the spec; its YSQL endpoint speaks PostgreSQL and every other
producer that reads it (through the Postgres provider, dbt, Spark's JDBC source) names it
``postgres://host:port``, so we do too, and the graph joins up. Outputs are named by
:mod:`airflow_provider_cdc.cdc.sinks.landed` (the same URIs as the Assets). Each output carries a
schema facet read from the Parquet footer of the last committed window's file for that dataset
(the real written schema: the Debezium envelope with this table's ``before``/``after``
columns); the inputs carry none, because the run does not keep the source's catalog and
reading it again after the task would cost a round trip per table for a facet the outputs
already describe. Nothing here reads a password.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from airflow_provider_cdc.cdc.basics.naming import Topic
from airflow_provider_cdc.cdc.basics.tables import TableRef
from airflow_provider_cdc.cdc.sinks.landed import (
    CHANGE_EVENTS,
    CURRENT_STATE,
    MESSAGES,
    TRANSACTIONS,
    LandedDataset,
    capture_datasets,
    state_datasets,
)

if TYPE_CHECKING:  # pyarrow loads when lineage is reported, not when a DAG file is parsed
    import pyarrow as pa

log = logging.getLogger(__name__)


def source_namespace(capture: Any) -> tuple[str, str]:
    """(namespace, database) of the capture's source, from its Airflow connection."""
    info = capture.hook().connection_info
    port = info.port or {"mssql": 1433}.get(capture.LINEAGE_SCHEME, 5432)
    database = getattr(info, "database", None) or getattr(info, "dbname", "")
    return f"{capture.LINEAGE_SCHEME}://{info.host}:{port}", database


def window_lineage(operator: Any, task_instance: Any = None) -> Any:
    """The snapshot's or window's lineage: source tables in; topics and side tables out.

    After a run (``operator._ran``), only what it did: the tables a snapshot read, or whose
    changes a window landed, in; the datasets it landed rows in out. Nothing for a skipped run, a
    window that landed nothing, or a run that only reported what landed before. (A task object
    that did not run, e.g. the DAG's own, reports what the capture can read and land.)
    """
    from airflow.providers.common.compat.openlineage.facet import Dataset
    from airflow.providers.openlineage.extractors import OperatorLineage

    capture = operator.capture
    tables = _run_tables(operator)
    landed = capture_datasets(capture.sink_path, capture.topic_prefix, tables, messages=capture.LANDS_MESSAGES)
    if getattr(operator, "_ran", False):
        summary = operator._committed
        landed = [d for d in landed if summary is not None and _landed_rows(d, summary) > 0]
        if summary is None or summary["kind"] != "snapshot":  # a window read the changes it landed
            tables = tuple(d.table for d in landed if d.table is not None)
        if not landed:
            return no_lineage(operator, task_instance)
    namespace, database = source_namespace(capture)
    inputs = [Dataset(namespace=namespace, name=f"{database}.{t.schema}.{t.name}") for t in tables]
    schemas = _landed_schemas(capture.sink_path, capture.topic_prefix, {d.topic for d in landed})
    outputs = [_dataset(d, schemas.get(d.topic)) for d in landed]
    return OperatorLineage(inputs=inputs, outputs=outputs)


def state_lineage(operator: Any, tables: Sequence[TableRef], task_instance: Any = None) -> Any:
    """The current-state fold's lineage: the topics in, the state tables out."""
    from airflow.providers.openlineage.extractors import OperatorLineage

    capture = operator.capture
    if getattr(operator, "_ran", False):  # only the tables whose state this run changed
        changed = {r["topic"] for r in operator._state_results if state_written(r)}
        tables = [t for t in tables if Topic.for_table(capture.topic_prefix, t.schema, t.name).name in changed]
        if not tables:
            return no_lineage(operator, task_instance)
    topics = capture_datasets(capture.sink_path, capture.topic_prefix, tables)
    schemas = _landed_schemas(capture.sink_path, capture.topic_prefix, {d.topic for d in topics})
    inputs = [_dataset(d, schemas.get(d.topic)) for d in topics if d.table is not None]
    outputs = [_dataset(d, _state_schema(d)) for d in state_datasets(operator.state_path, capture.topic_prefix, tables)]
    return OperatorLineage(inputs=inputs, outputs=outputs)


class _NoFallback(list):
    """An empty dataset list the OpenLineage provider cannot fill with the task's outlets.

    When an operator's lineage has no datasets, the provider's ExtractorManager appends the task's
    declared outlets (``extract_inlets_and_outlets``): at START, before the run decided anything,
    that would claim every dataset the capture can land as written (also by a snapshot that then
    skips). The task's outlets stay as they are (Airflow emits its asset events from them)."""

    def append(self, item: Any) -> None:  # the provider's fallback: nothing is declared at start
        return None


def start_lineage(operator: Any) -> Any:
    """The START event's lineage: no datasets. What a run reads and writes is known only when it
    ends (a snapshot that is not due, a window with nothing to land, a replayed run do neither);
    the COMPLETE event reports it."""
    from airflow.providers.openlineage.extractors import OperatorLineage

    return OperatorLineage(inputs=_NoFallback(), outputs=_NoFallback())


#: The state job's actions that write a state version (cdc/state/apply.py, cdc/state/lake.py); the others
#: ("unchanged", "empty", and "time_travel": a past run reading a version that exists) write nothing.
STATE_WRITES = ("applied", "rebuilt")
#: What a lake table's MERGE did (cdc/state/merge.py): "empty" committed nothing.
MERGE_WRITES = ("merged", "rewritten")


def state_written(result: dict[str, Any]) -> bool:
    """Whether a state job's result (one topic) wrote a new version of its state table."""
    merge = result.get("merge")
    return result.get("action") in STATE_WRITES and (not merge or merge.get("action") in MERGE_WRITES)


def no_lineage(operator: Any, task_instance: Any) -> Any:
    """The lineage of a run that read and wrote nothing.

    When an operator returns no datasets, the OpenLineage provider reports the task's declared
    outlets and the assets its run put events on (a replayed run still sends each outlet's event
    with ``"replayed": true``) as its outputs. A run that landed nothing must not claim them: by
    now (the listener runs after the task's asset events were sent) this run's copy of the task
    (Airflow runs a copy of the DAG's task) drops its outlets, and its context its event list.
    """
    from airflow.providers.openlineage.extractors import OperatorLineage

    operator.outlets = []
    context = task_instance.get_template_context() if hasattr(task_instance, "get_template_context") else None
    if context is not None and context.get("outlet_events") is not None:
        context["outlet_events"] = type(context["outlet_events"])()
    return OperatorLineage()


def _landed_rows(dataset: LandedDataset, summary: dict[str, Any]) -> int:
    """What a committed window's summary says it landed in ``dataset``."""
    if dataset.kind == CHANGE_EVENTS:
        return sum(summary["events"].get(dataset.topic, {}).values())
    if dataset.kind == TRANSACTIONS:
        return int(summary.get("transactions") or 0)
    if dataset.kind == MESSAGES:
        return int(summary.get("messages") or 0)
    return 0


def _run_tables(operator: Any) -> tuple[TableRef, ...]:
    """The tables the run captured (include-list captures know them only after the run)."""
    return tuple(getattr(operator, "_run_tables", ()) or operator.capture.table_refs)


def _dataset(landed: LandedDataset, schema: pa.Schema | None) -> Any:
    from airflow.providers.common.compat.openlineage.facet import Dataset, SchemaDatasetFacet

    facets = {} if schema is None else {"schema": SchemaDatasetFacet(fields=[_field(f) for f in schema])}
    return Dataset(namespace=landed.namespace, name=landed.path, facets=facets)


def _field(field: pa.Field) -> Any:
    import pyarrow as pa
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
    if landed.kind != CURRENT_STATE:
        raise TypeError(f"_state_schema reads current-state datasets, not {landed.kind!r} ones")
    try:
        return _parquet_schema(landed.uri)
    except Exception:  # no state yet, or a store pyarrow cannot open here
        return None


def _parquet_schema(uri: str) -> pa.Schema | None:
    import pyarrow.dataset as ds

    from airflow_provider_cdc.cdc.sinks import object_store

    if object_store.is_object_store(uri):  # the store's own client (the active access), the key verbatim
        filesystem, path = object_store.filesystem(uri)
        dataset = ds.dataset(path, filesystem=filesystem, format="parquet")
    else:
        dataset = ds.dataset(uri.removeprefix("file://"), format="parquet")
    files = dataset.files[:1]
    if not files:
        return None
    import pyarrow.parquet as pq

    return pq.read_schema(files[0], filesystem=dataset.filesystem).remove_metadata()
