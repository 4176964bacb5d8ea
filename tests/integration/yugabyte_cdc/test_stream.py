"""Stream windows of the CDC-service source (``run_job``) against the YugabyteDB CDC-service
stand-in (docs/yugabytedb-cdc-standin.md): every change once, whole transactions, commit order,
and a replay equal to the table, across two windows and a leader move."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest

from airflow_provider_cdc.cdc.basics.tables import TableRef
from airflow_provider_cdc.cdc.basics.window import Window
from airflow_provider_cdc.cdc.planning.spec import CaptureOptions
from airflow_provider_cdc.cdc.sinks.reader import read_topic_arrow
from airflow_provider_cdc.cdc.sources.yugabyte.lsn import YbLsn
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.checkpoints import (
    TabletCheckpoints,
)
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.client import YbCdcClient
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.jobs import run_job
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.spec import YbCdcJobSpec
from tests.support.oracle import events_of, ordered, replay, source_rows
from tests.support.yugabyte_cdc import YugabyteCdcStandIn, standin_for
from tests.support.yugabyte_cdc.starts import start_streaming

pytestmark = pytest.mark.pg

PREFIX = "ybc"
COLUMNS = ("id", "v", "n")


def no_spark():
    raise AssertionError("a stream window on a local sink must not start Spark")


@pytest.fixture(scope="module")
def yb(request, clusters) -> Iterator[YugabyteCdcStandIn]:
    yield from standin_for(request, clusters["pg15"], rpc_heartbeat_interval=0.3)


def keys_per_tablet(yb: YugabyteCdcStandIn, table: str, candidates=range(1000, 1200)) -> dict[str, list[int]]:
    tablets = [t for t in yb.tablets(table) if not t["children"]]
    out: dict[str, list[int]] = {t["tablet_id"]: [] for t in tablets}
    for key, code in zip(candidates, yb.hash_codes(list(candidates))):
        out[next(t["tablet_id"] for t in tablets if t["start"] <= code < t["end"])].append(key)
    return out


def make_spec(yb, stream, table, sink, seq, from_ht, to_ht, tablets, record_type, previous=None) -> YbCdcJobSpec:
    return YbCdcJobSpec(
        topic_prefix=PREFIX,
        master_addresses=yb.master_addresses_flag,
        stream_id=stream,
        database=yb.database,
        tables=(TableRef("public", table),),
        window=Window(seq, "stream", YbLsn(from_ht), YbLsn(to_ht), 1_700_000_000_000 + seq),
        sink_path=str(sink),
        tablets=tablets,
        previous_commit_ht=previous,
        record_type=record_type,
        options=CaptureOptions(idle_timeout_seconds=20),
        tls=None,  # the stand-in's RPC ports are plaintext: said explicitly (the default is TLS)
    )


@pytest.fixture
def page_size(yb, request):
    """GetChanges pages of ``request.param`` records (small ones split transactions over pages)."""
    yb.set(changes_page_size=request.param)
    yield request.param
    yb.set(changes_page_size=500)


@pytest.mark.parametrize(
    ("record_type", "page_size"), [("CHANGE", 500), ("FULL_ROW_NEW_IMAGE", 2), ("ALL", 3)], indirect=["page_size"]
)
def test_two_windows_read_every_change_once_in_commit_order(yb, tmp_path, monkeypatch, record_type, page_size):
    table = f"t_{record_type.lower()}"
    with yb.connect() as conn:
        conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v text, n int)")
        conn.execute(f"INSERT INTO {table} SELECT g, 'v' || g, g * 10 FROM generate_series(1, 6) g")
    yb.wait_caught_up()
    stream = yb.create_stream(record_type, "EXPLICIT", tables=[table])
    tablets = start_streaming(yb, stream, table)
    assert len(tablets) == 3
    from_ht = yb.wait_caught_up() + 1
    with yb.connect() as conn:
        initial = source_rows(conn, f"public.{table}", ["id"])
    keys = keys_per_tablet(yb, table)
    a, b, c = (keys[t] for t in sorted(keys))

    # window 1: inserts, updates, a delete, a transaction on every tablet, a primary-key change
    with yb.connect() as conn:
        conn.execute(f"INSERT INTO {table} VALUES (%s, 'a', 1), (%s, 'b', 2)", (a[0], b[0]))
        conn.execute(f"UPDATE {table} SET n = n + 1 WHERE id = 1")
        conn.execute(f"UPDATE {table} SET v = 'changed' WHERE id = %s", (a[0],))
        conn.execute(f"DELETE FROM {table} WHERE id = 2")
        with conn.transaction():
            conn.execute(f"INSERT INTO {table} VALUES (%s, 'tx', 3), (%s, 'tx', 4), (%s, 'tx', 5)", (a[1], b[1], c[1]))
            conn.execute(f"UPDATE {table} SET n = 99 WHERE id = %s", (b[0],))
            conn.execute(f"DELETE FROM {table} WHERE id = 3")
        conn.execute(f"UPDATE {table} SET id = %s WHERE id = %s", (b[2], a[0]))  # key change across tablets
    end1 = yb.wait_caught_up()  # the cluster's time at run start: every commit above is at or below it
    with yb.connect() as conn:  # after the window's end: window 2
        conn.execute(f"INSERT INTO {table} VALUES (%s, 'late', 7)", (c[2],))
    yb.wait_caught_up()

    first = run_job(make_spec(yb, stream, table, tmp_path, 1, from_ht, end1 + 1, tablets, record_type), no_spark)
    events1 = topic(tmp_path, table)
    assert events1 and all(e["source"]["commit_time"] <= end1 for e in events1)
    assert not [e for e in events1 if e["after"] and e["after"]["id"] == c[2]]
    assert first.stats["changes"] == len(events1)

    # a leader move between the windows, then more changes, and another leader move inside window 2
    # (once the job has looked the leader up: its first GetChanges goes to the old leader)
    moved = sorted(tablets)[1]
    yb.move_leader(moved)
    lookups = Counter()
    real_leader = YbCdcClient.leader

    def leader(client, tablet_id, **kw):
        if kw.get("refresh") or tablet_id not in client._leaders:
            lookups[tablet_id] += 1  # asked from the masters
        address = real_leader(client, tablet_id, **kw)
        if tablet_id == moved and lookups[tablet_id] == 1:
            yb.move_leader(moved)  # right after the lookup: the address the client holds is stale
        return address

    monkeypatch.setattr(YbCdcClient, "leader", leader)
    with yb.connect() as conn:
        conn.execute(f"UPDATE {table} SET v = 'w2' WHERE id = %s", (b[1],))
        with conn.transaction():
            conn.execute(f"DELETE FROM {table} WHERE id = %s", (a[1],))
            conn.execute(f"UPDATE {table} SET n = -1 WHERE id = %s", (c[1],))
            conn.execute(f"INSERT INTO {table} VALUES (%s, 'w2', 8)", (b[3],))
    end2 = yb.wait_caught_up()

    state = first.stats["source_state"]
    tablets2 = TabletCheckpoints.from_json(state["tablets"])
    assert set(tablets2) == set(tablets)
    second = run_job(
        make_spec(yb, stream, table, tmp_path, 2, end1 + 1, end2 + 1, tablets2, None, previous=first.last_commit_lsn),
        no_spark,
    )
    assert lookups[moved] == 2  # the old leader refused; the new one was found and read
    events = topic(tmp_path, table)
    events2 = [e for e in events if e["window_id"] != events1[0]["window_id"]]
    assert events2 and all(end1 < e["source"]["commit_time"] <= end2 for e in events2)
    assert second.stats["changes"] == len(events2)

    # a window with no changes: nothing written, every tablet moves on to its end
    tablets3 = TabletCheckpoints.from_json(second.stats["source_state"]["tablets"])
    end3 = yb.wait_caught_up()
    third = run_job(
        make_spec(yb, stream, table, tmp_path, 3, end2 + 1, end3 + 1, tablets3, record_type, second.last_commit_lsn),
        no_spark,
    )
    assert third.stats["changes"] == 0 and third.transactions == 0
    ends3 = TabletCheckpoints.from_json(third.stats["source_state"]["tablets"])
    assert all(state.position.safe_hybrid_time >= end3 for state in ends3.values())
    assert topic(tmp_path, table) == events

    # every change once: (op, key, commit time) never repeats; the counts are the workload's
    identities = [(e["op"], key_of(e), e["source"]["commit_time"]) for e in events]
    assert len(identities) == len(set(identities))
    assert Counter(e["op"] for e in events1) == {"c": 6, "u": 3, "d": 3}
    assert Counter(e["op"] for e in events2) == {"c": 2, "u": 2, "d": 1}

    # commit order: the sink's order within each window is (commit time, total order)
    for window_events in (events1, events2):
        seen = [(e["source"]["commit_time"], e["transaction"]["total_order"]) for e in window_events]
        assert seen == sorted(seen)

    # transactions whole: the multi-tablet transaction is one transaction id, one window
    tx_events = [e for e in events1 if e["after"] and e["after"]["v"] == "tx"]
    assert len(tx_events) == 3
    (tx_id,) = {e["transaction"]["id"] for e in tx_events}
    members = [e for e in events if e["transaction"]["id"] == tx_id]
    assert len(members) == 5 and len({e["window_id"] for e in members}) == 1
    assert len({e["source"]["tablet_id"] for e in members}) == 3
    assert [e["transaction"]["total_order"] for e in members] == [1, 2, 3, 4, 5]
    side = read_topic_arrow(str(tmp_path), PREFIX, f"{PREFIX}.transaction").to_pylist()
    mine = [r for r in side if r["id"] == tx_id]
    assert sorted(r["status"] for r in mine) == ["BEGIN", "END"]
    (end_row,) = [r for r in mine if r["status"] == "END"]
    assert end_row["event_count"] == 5
    assert {d["data_collection"]: d["event_count"] for d in end_row["data_collections"]} == {f"public.{table}": 5}
    # every transaction's BEGIN and END, with counts that match its events
    by_tx = Counter(e["transaction"]["id"] for e in events)
    ends = {r["id"]: r["event_count"] for r in side if r["status"] == "END"}
    begins = Counter(r["id"] for r in side if r["status"] == "BEGIN")
    assert ends == dict(by_tx) and set(begins) == set(by_tx) and set(begins.values()) == {1}

    # the replay equals the table: the rows present at the (snapshot-less) start as a base image,
    # then the events; under CHANGE the columns an update did not send keep their previous value
    replayed = replay([*base_image(initial), *events], ["id"])
    with yb.connect() as conn:
        source = source_rows(conn, f"public.{table}", ["id"])
    assert source == {k: {c: v[c] for c in COLUMNS} for k, v in replayed.items()}
    if record_type == "CHANGE":
        assert any(e["unchanged_toast_columns"] for e in events if e["op"] == "u")
    else:
        assert not any(e["unchanged_toast_columns"] for e in events)


def base_image(rows: dict) -> list[dict]:
    """The table's rows at the stream's start as snapshot events that sort before every window."""
    return [
        {"op": "r", "before": None, "after": row, "window_id": "", "source": {"snapshot": "true"}, "transaction": None}
        for row in rows.values()
    ]


def topic(sink, table: str) -> list[dict]:
    return ordered(events_of(sink, PREFIX, f"public.{table}"))


def key_of(event: dict) -> int:
    return (event["after"] or event["before"])["id"]
