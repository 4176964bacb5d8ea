"""The datasets a capture lands, each with one stable URI (Airflow Assets, OpenLineage outputs).

A dataset's URI is its directory: ``file:///abs/sink/<topic dir>`` for a local sink path, the
sink URI plus ``/<topic dir>`` for a Hadoop URI (``s3a://bucket/cdc/shop.public.orders``). It
changes only when the sink path, topic prefix or table changes, so downstream schedules and
lineage graphs stay attached across runs and deployments. ``s3a``/``s3n`` are reported as
``s3`` (one object store, one name for it, as Airflow's and OpenLineage's S3 naming expect).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from airflow_provider_cdc.cdc.basics.naming import Topic, topic_location
from airflow_provider_cdc.cdc.basics.tables import TableRef
from airflow_provider_cdc.cdc.sinks.storage import is_uri

#: What a landed dataset holds.
CHANGE_EVENTS = "change_events"
TRANSACTIONS = "transactions"
MESSAGES = "messages"
CAPTURE_GAPS = "capture_gaps"
CURRENT_STATE = "current_state"

_SCHEME_ALIASES = {"s3a": "s3", "s3n": "s3"}


@dataclass(frozen=True)
class LandedDataset:
    """One dataset under a sink or state path."""

    kind: str
    topic: str  # the Debezium topic name (for a current-state table: the topic it folds)
    uri: str
    table: TableRef | None = None  # the source table, for change events and current state

    @property
    def namespace(self) -> str:
        """OpenLineage's dataset namespace: ``file`` or ``<scheme>://<authority>``."""
        parsed = urlparse(self.uri)
        return f"{parsed.scheme}://{parsed.netloc}" if parsed.netloc else parsed.scheme

    @property
    def path(self) -> str:
        """OpenLineage's dataset name: the path within the namespace."""
        return urlparse(self.uri).path


def base_uri(path: str) -> str:
    """The URI of a sink or state path (a local directory becomes an absolute ``file://`` URI)."""
    if is_uri(path):
        parsed = urlparse(path.rstrip("/"))
        scheme = _SCHEME_ALIASES.get(parsed.scheme, parsed.scheme)
        return scheme + path.rstrip("/")[len(parsed.scheme) :]
    return "file://" + str(Path(path).expanduser().absolute()).rstrip("/")


def dataset_uri(path: str, topic: Topic) -> str:
    return topic_location(base_uri(path), topic.directory)


def capture_datasets(
    sink_path: str,
    topic_prefix: str,
    tables: Iterable[TableRef],
    *,
    messages: bool = False,
) -> list[LandedDataset]:
    """Every dataset a capture writes under ``sink_path``: one per table, then the side tables.

    The capture-gap table is left out: it is written only when a gap is recorded, and an outlet
    that never changes would mislead a downstream schedule.
    """
    out = [
        LandedDataset(CHANGE_EVENTS, t.name, dataset_uri(sink_path, t), ref)
        for ref in tables
        for t in [Topic.for_table(topic_prefix, ref.schema, ref.name)]
    ]
    side = [(TRANSACTIONS, Topic.transactions(topic_prefix))]
    if messages:
        side.append((MESSAGES, Topic.messages(topic_prefix)))
    out.extend(LandedDataset(kind, t.name, dataset_uri(sink_path, t)) for kind, t in side)
    return out


def gap_dataset(sink_path: str, topic_prefix: str) -> LandedDataset:
    topic = Topic.gaps(topic_prefix)
    return LandedDataset(CAPTURE_GAPS, topic.name, dataset_uri(sink_path, topic))


def state_datasets(state_path: str, topic_prefix: str, tables: Iterable[TableRef]) -> list[LandedDataset]:
    """The current-state tables under ``state_path``, one per captured table."""
    return [
        LandedDataset(CURRENT_STATE, t.name, dataset_uri(state_path, t), ref)
        for ref in tables
        for t in [Topic.for_table(topic_prefix, ref.schema, ref.name)]
    ]
