"""Test oracle: rebuild a table from its committed change events and compare with the source.

Events are applied in commit order: snapshot rows (``op = r``) first, then stream events by
``(source.commit_lsn, transaction.total_order)``. Values are compared in a normalised Python
form, independently of the provider's type conversion (the source side uses psycopg's types).
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Iterable, Sequence
from decimal import Decimal
from typing import Any

from psycopg import sql

from airflow_provider_cdc.cdc.sinks.reader import read_topic_arrow


def events_of(sink: str, prefix: str, table: str) -> list[dict]:
    events = read_topic_arrow(str(sink), prefix, f"{prefix}.{table}")
    return [] if events is None else events.to_pylist()


def ordered(events: Iterable[dict]) -> list[dict]:
    """Window by window; inside a stream window by (commit LSN, position in the transaction)."""

    def key(event: dict) -> tuple:
        if event["op"] == "r" and not incremental(event):
            return (event["window_id"], 0, 0)
        order = event["transaction"]["total_order"] if event["transaction"] else 0
        source = event["source"]  # the YugabyteDB gRPC connector's block names the position commit_time
        commit = source["commit_lsn"] if "commit_lsn" in source else source.get("commit_time")
        return (event["window_id"], commit or 0, order)

    return sorted(events, key=key)


def replay(events: Iterable[dict], key_columns: Sequence[str]) -> dict[tuple, dict]:
    """Current state of a table after applying ``events`` in commit order.

    A snapshot window is a complete image of the table: it replaces what came before it
    (``snapshot_mode='always'`` or a re-snapshot by ``'when_needed'``).
    """
    state: dict[tuple, dict] = {}
    snapshot_window = None
    last_deleted: dict = {}
    for event in ordered(events):
        op, before, after = event["op"], event["before"], event["after"]
        unchanged = event.get("unchanged_toast_columns") or []
        if op == "r" and not incremental(event) and event["window_id"] != snapshot_window:
            snapshot_window = event["window_id"]
            state.clear()
        if op in ("r", "c", "u"):
            key = _key(after, key_columns)
            # Unchanged TOAST values keep the previous value: of this key, or of the old key
            # for a row that moved to a new key (Debezium's delete + create pair).
            previous = state.get(key)
            if op == "c" and event.get("__debezium_oldkey"):
                previous = last_deleted.get(tuple(event["__debezium_oldkey"][k] for k in key_columns))
            row = dict(after)
            for column in unchanged:
                row[column] = previous[column] if previous else None
            state[key] = row
        elif op == "d":
            key = _key(before, key_columns)
            last_deleted[key] = state.pop(key, None)
        elif op == "t":
            state.clear()
        else:
            raise AssertionError(f"unexpected op {op!r}")
    return state


def assert_history(
    events: Iterable[dict], key_columns: Sequence[str], *, ops: dict[str, int] | None = None, snapshots: int = 1
) -> None:
    """One table's event log is gapless and has no duplicates: exactly ``snapshots`` full
    snapshot windows, and every stream event applies to a state where it makes sense (a create of
    an absent key, an update or delete of a present one), which a lost or repeated window breaks.
    ``ops``: the expected number of ``c``/``u``/``d`` events (the workload's own counts)."""
    events = ordered(events)
    windows = {e["window_id"] for e in events if e["op"] == "r" and not incremental(e)}
    assert len(windows) == snapshots, f"{len(windows)} full snapshot window(s) {sorted(windows)}, expected {snapshots}"
    present: set[tuple] = set()
    counts = {"c": 0, "u": 0, "d": 0}
    for event in events:
        op = event["op"]
        if op == "r":
            present.add(_key(event["after"], key_columns))
            continue
        if op == "t":
            present.clear()
            continue
        counts[op] += 1
        if op == "c":
            key = _key(event["after"], key_columns)
            assert key not in present, f"create of {key} in window {event['window_id']}: the key already exists"
            present.add(key)
        else:
            key = _key(event["before"] or event["after"], key_columns)
            assert key in present, f"{op} of {key} in window {event['window_id']}: the key was never created"
            if op == "d":
                present.discard(key)
    if ops is not None:
        assert counts == {op: ops.get(op, 0) for op in counts}, f"stream events {counts}, the workload made {ops}"


def assert_source_blocks(events: Iterable[dict]) -> None:
    """Debezium's ``source.sequence`` is ``["<previous commit LSN>","<LSN>"]`` in decimal strings
    in every event (the first transaction of a window included), and a read row's event
    ``ts_ms`` is never before its ``source.ts_ms`` (the lag ``ts_ms - source.ts_ms`` is >= 0)."""
    first_of_window: dict[str, dict] = {}
    for event in ordered(events):
        source = event["source"]
        previous, lsn = json.loads(source["sequence"])
        assert previous is None or (isinstance(previous, str) and previous.isdigit()), source["sequence"]
        assert isinstance(lsn, str) and lsn.isdigit() and int(lsn) == source["lsn"], source["sequence"]
        if event["op"] == "r":
            assert event["ts_ms"] >= source["ts_ms"], f"read at {source['ts_ms']}, event ts_ms {event['ts_ms']}"
        elif previous is not None:
            assert int(previous) < source["commit_lsn"], source
        if event["op"] != "r" and event["transaction"]:
            first_of_window.setdefault(event["window_id"], event)
    # Every window after the first stream window knows the commit before it.
    for event in sorted(first_of_window.values(), key=lambda e: e["window_id"])[1:]:
        assert json.loads(event["source"]["sequence"])[0] is not None, event["source"]


def workload_ops(*rounds, table: str) -> dict[str, int]:
    """The ``c``/``u``/``d`` counts the shop workload rounds (``shop.mutate`` results) made in
    ``table`` (``public.orders`` or ``orders``: the workload names tables without their schema)."""
    table = table.split(".")[-1]
    return {
        "c": sum(r.inserts.get(table, 0) for r in rounds),
        "u": sum(r.updates.get(table, 0) for r in rounds),
        "d": sum(r.deletes.get(table, 0) for r in rounds),
    }


def incremental(event: dict) -> bool:
    """An ``op = r`` row of an incremental snapshot (ordered at its watermark) or of a query
    extraction: a point-in-time read of one row that resets nothing."""
    return event["source"]["snapshot"] in ("incremental", "query")


def source_rows(conn, table: str | tuple[str, str], key_columns: Sequence[str]) -> dict[tuple, dict]:
    schema, name = table.split(".", 1) if isinstance(table, str) else table
    cursor = conn.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(schema, name)))
    columns = [c.name for c in cursor.description]
    rows = [dict(zip(columns, row)) for row in cursor.fetchall()]
    return {_key(r, key_columns): r for r in rows}


def assert_same_state(replayed: dict[tuple, dict], source: dict[tuple, dict]) -> None:
    missing = sorted(set(source) - set(replayed))
    extra = sorted(set(replayed) - set(source))
    assert not missing and not extra, f"keys missing from events: {missing[:10]}, extra: {extra[:10]}"
    for key, row in source.items():
        got = {k: normalise(v) for k, v in replayed[key].items()}
        want = {k: normalise(v) for k, v in row.items()}
        assert got == want, f"row {key} differs:\n  events: {got}\n  source: {want}"


def normalise(value: Any) -> Any:
    """One comparable form for values from psycopg and from Arrow."""
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    if isinstance(value, str) and value[:1] in "{[":
        try:
            return json.dumps(json.loads(value), sort_keys=True)
        except ValueError:
            return value
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.timezone.utc)
    if isinstance(value, Decimal):
        # Unconstrained numeric arrives as its exact text; compare both sides as plain text.
        return format(value, "f")
    return value


def _key(row: dict, key_columns: Sequence[str]) -> tuple:
    return tuple(row[k] for k in key_columns)


def spark_rows(frame, key_columns: Sequence[str]) -> dict[tuple, dict]:
    """Rows of a Spark DataFrame keyed like :func:`source_rows`, via Arrow (keeps time zones)."""
    return {_key(r, key_columns): r for r in frame.toArrow().to_pylist()}
