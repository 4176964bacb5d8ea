"""The operators' outlet Assets and the ``extra`` of the asset events each run emits.

Every landed dataset is one Asset whose URI (and name) is its directory's URI
(:mod:`airflow_provider_cdc.cdc.sinks.landed`): stable across runs, unique wherever the data lands.
Captures that find their tables by pattern (``table_include_list``) cannot name them when the
DAG is parsed; their table datasets go through one ``AssetAlias`` per capture and operator kind
(``cdc:<prefix>`` / ``cdc-state:<prefix>``) and are attached to it by each run.

An event's ``extra`` says what the run landed in that dataset. A run that only reports a window
an earlier attempt landed (a retry after the sink commit, a backfill, a cleared run) still
succeeds, and Airflow emits an event for every outlet of a successful task; its extra says
``"replayed": true`` with the window ids it reports, so a consumer can tell that nothing new
landed (Airflow 3.3 has no way to leave an outlet without an event on success).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import Asset, AssetAlias

from airflow_provider_cdc.cdc.basics.tables import TableRef
from airflow_provider_cdc.cdc.sinks.landed import (
    CHANGE_EVENTS,
    MESSAGES,
    TRANSACTIONS,
    LandedDataset,
    capture_datasets,
    state_datasets,
)

if TYPE_CHECKING:  # for annotations only: utils sits below the captures
    from airflow_provider_cdc.captures.base import Capture

ASSET_GROUP = "cdc"


def as_asset(dataset: LandedDataset) -> Asset:
    extra = {"topic": dataset.topic, "kind": dataset.kind}
    if dataset.table is not None:
        extra["table"] = dataset.table.data_collection
    return Asset(name=dataset.uri, uri=dataset.uri, group=ASSET_GROUP, extra=extra)


def capture_alias(capture: Capture) -> AssetAlias:
    return AssetAlias(name=f"cdc:{capture.topic_prefix}", group=ASSET_GROUP)


def state_alias(capture: Capture) -> AssetAlias:
    return AssetAlias(name=f"cdc-state:{capture.topic_prefix}", group=ASSET_GROUP)


def window_datasets(capture: Capture, tables: Iterable[TableRef]) -> list[LandedDataset]:
    return capture_datasets(capture.sink_path, capture.topic_prefix, tables, messages=capture.LANDS_MESSAGES)


def window_outlets(capture: Capture) -> list[Asset | AssetAlias]:
    """The snapshot's and the window's outlets: each table's topic and the side tables."""
    if capture.tables_known_at_parse:
        return [as_asset(d) for d in window_datasets(capture, capture.table_refs)]
    side = [as_asset(d) for d in window_datasets(capture, ()) if d.kind != CHANGE_EVENTS]
    return [capture_alias(capture), *side]


def state_outlets(capture: Capture, state_path: str, tables: Sequence[TableRef] | None) -> list[Asset | AssetAlias]:
    if tables is None and not capture.tables_known_at_parse:
        return [state_alias(capture)]
    chosen = capture.table_refs if tables is None else tables
    return [as_asset(d) for d in state_datasets(state_path, capture.topic_prefix, chosen)]


def window_event_extras(
    capture: Capture, summary: dict[str, Any], tables: Iterable[TableRef]
) -> list[tuple[LandedDataset, dict[str, Any]]]:
    """What a snapshot or window run landed in each dataset (no credentials: names and counts)."""
    common = {
        "topic_prefix": capture.topic_prefix,
        "window_id": summary["window_id"],
        "window_kind": summary["kind"],
        "from_lsn": summary["from_lsn"],
        "to_lsn": summary["to_lsn"],
        "replayed": bool(summary.get("replayed", False)),
    }
    if summary.get("replayed"):
        common["windows"] = list(summary.get("windows", []))
    out = []
    for dataset in window_datasets(capture, tables):
        extra = {**common, "topic": dataset.topic}
        if dataset.kind == CHANGE_EVENTS:
            ops = dict(summary["events"].get(dataset.topic, {}))
            extra.update(events=sum(ops.values()), ops=ops)
        elif dataset.kind == TRANSACTIONS:
            extra.update(transactions=summary["transactions"])
        elif dataset.kind == MESSAGES:
            extra.update(events=summary.get("messages", 0))
        out.append((dataset, extra))
    return out


def emit_window_events(context: Any, capture: Capture, summary: dict[str, Any], tables: Iterable[TableRef]) -> None:
    """Put each dataset's extra on this run's asset events (through the alias for patterns)."""
    outlet_events = context.get("outlet_events")
    if outlet_events is None:  # run outside an Airflow task (a script, the crash harness): no events
        return
    for dataset, extra in window_event_extras(capture, summary, tables):
        asset = as_asset(dataset)
        if dataset.kind == CHANGE_EVENTS and not capture.tables_known_at_parse:
            outlet_events[capture_alias(capture)].add(asset, extra=extra)
        else:
            outlet_events[asset].extra.update(extra)


def emit_state_events(
    context: Any,
    capture: Capture,
    state_path: str,
    results: Sequence[dict[str, Any]],
    tables: Sequence[TableRef],
    *,
    via_alias: bool,
) -> None:
    """Each current-state table's event: the window it now reflects and what the fold did."""
    by_topic = {r["topic"]: r for r in results}
    outlet_events = context.get("outlet_events")
    if outlet_events is None:
        return
    for dataset in state_datasets(state_path, capture.topic_prefix, tables):
        result = by_topic.get(dataset.topic, {})
        extra = {
            "topic_prefix": capture.topic_prefix,
            "topic": dataset.topic,
            "window_id": result.get("window_id"),
            "action": result.get("action"),
            "rows": result.get("rows"),
        }
        if via_alias:
            outlet_events[state_alias(capture)].add(as_asset(dataset), extra=extra)
        else:
            outlet_events[as_asset(dataset)].extra.update(extra)
