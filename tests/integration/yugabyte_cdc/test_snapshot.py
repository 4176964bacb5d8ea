"""Snapshots of the CDC-service source (``run_job`` on a snapshot window) against the YugabyteDB
CDC-service stand-in (docs/yugabytedb-cdc-standin.md) with real local Spark: every row of the
stream's snapshot once as an ``r`` event, nothing committed after the stream's creation, and a
stream window from the snapshot's end that makes the replay equal to the table."""

from __future__ import annotations

import base64
import json
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace

import pyarrow.parquet as pq
import pytest

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.basics.tables import TableRef
from airflow_provider_cdc.cdc.basics.window import Window
from airflow_provider_cdc.cdc.planning.spec import CaptureOptions
from airflow_provider_cdc.cdc.sinks.reader import committed_windows, read_topic_arrow
from airflow_provider_cdc.cdc.sources.yugabyte.lsn import YbLsn
from airflow_provider_cdc.cdc.sources.yugabyte_cdc import snapshot as snapshot_module
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.checkpoints import Checkpoint, TabletCheckpoints, TabletPosition
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.client import RetryPolicy, YbCdcClient
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.jobs import run_job
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.spec import YbCdcJobSpec
from tests.support.oracle import assert_same_state, events_of, ordered, replay, source_rows
from tests.support.yugabyte_cdc import YugabyteCdcStandIn, standin_for

pytestmark = [pytest.mark.pg, pytest.mark.spark]

PREFIX = "ybs"
PLANNED_AT = 1_700_000_000_000


@pytest.fixture(scope="module")
def yb(request, clusters) -> Iterator[YugabyteCdcStandIn]:
    yield from standin_for(request, clusters["pg15"], rpc_heartbeat_interval=0.3)


@pytest.fixture
def small_pages(yb):
    """Snapshot pages of two rows: a tablet's snapshot takes many ``GetChanges``."""
    yb.set(snapshot_batch_size=2)
    yield 2
    yb.set(snapshot_batch_size=250)


@pytest.fixture(scope="module")
def provider(spark):
    """The jobs' Spark provider: the suite's one local session."""
    return lambda: spark


def no_spark():
    raise AssertionError("a stream window on a local sink must not start Spark")


def snapshot_spec(yb, stream: str, tables: list[str], sink, seq: int = 1) -> YbCdcJobSpec:
    return YbCdcJobSpec(
        topic_prefix=PREFIX,
        master_addresses=yb.master_addresses_flag,
        stream_id=stream,
        database=yb.database,
        tables=tuple(TableRef("public", t) for t in tables),
        window=Window(seq, "snapshot", None, None, PLANNED_AT + seq),
        sink_path=str(sink),
        options=CaptureOptions(idle_timeout_seconds=20),
        tls=None,  # the stand-in's RPC ports are plaintext: said explicitly (the default is TLS)
    )


def stream_spec(yb, stream: str, tables: list[str], sink, seq: int, from_ht: int, to_ht: int, tablets) -> YbCdcJobSpec:
    return YbCdcJobSpec(
        topic_prefix=PREFIX,
        master_addresses=yb.master_addresses_flag,
        stream_id=stream,
        database=yb.database,
        tables=tuple(TableRef("public", t) for t in tables),
        window=Window(seq, "stream", YbLsn(from_ht), YbLsn(to_ht), PLANNED_AT + seq),
        sink_path=str(sink),
        tablets=tablets,
        options=CaptureOptions(idle_timeout_seconds=20),
        tls=None,
    )


def topic(sink, table: str) -> list[dict]:
    return ordered(events_of(sink, PREFIX, f"public.{table}"))


def rows_of(conn, table: str) -> dict[tuple, dict]:
    return source_rows(conn, f"public.{table}", ["id"])


def test_snapshot_reads_the_streams_snapshot_then_a_window_continues_it(yb, provider, small_pages, tmp_path):
    table, few, empty = "snap_items", "snap_few", "snap_empty"
    with yb.connect() as conn:
        conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v text, n int)")
        conn.execute(f"CREATE TABLE {few} (id int PRIMARY KEY, v text)")
        conn.execute(f"CREATE TABLE {empty} (id int PRIMARY KEY, v text)")
        conn.execute(f"INSERT INTO {table} SELECT g, 'v' || g, g * 10 FROM generate_series(1, 40) g")
        conn.execute(f"UPDATE {table} SET v = NULL WHERE id % 7 = 0")
        conn.execute(f"INSERT INTO {few} VALUES (1, 'only')")
    yb.wait_caught_up()
    stream = yb.create_stream("CHANGE", "EXPLICIT", tables=[table, few, empty])
    with yb.connect() as conn:
        at_creation = {t: rows_of(conn, t) for t in (table, few, empty)}
        # committed after the stream's creation: not in its snapshot, in the next window
        conn.execute(f"INSERT INTO {table} VALUES (101, 'late', 1), (102, 'late', 2)")
        conn.execute(f"UPDATE {table} SET n = -1 WHERE id IN (1, 2, 3)")
        with conn.transaction():
            conn.execute(f"DELETE FROM {table} WHERE id IN (4, 5)")
            conn.execute(f"INSERT INTO {few} VALUES (2, 'late')")
            conn.execute(f"INSERT INTO {empty} VALUES (1, 'late')")
    end = yb.wait_caught_up()

    entry = run_job(snapshot_spec(yb, stream, [table, few, empty], tmp_path), provider)

    # every row of the snapshot once, as an "r" event with the row's values, and nothing later
    ht = entry.stats["snapshot_ht"]
    assert entry.window.kind == "snapshot" and entry.window.to_lsn == YbLsn(ht + 1)
    assert ht < end
    snapshot = {t: topic(tmp_path, t) for t in (table, few, empty)}
    for name, events in snapshot.items():
        assert {e["op"] for e in events} <= {"r"}
        keys = [e["after"]["id"] for e in events]
        assert len(keys) == len(set(keys)), f"{name}: a row read twice"
        assert_same_state(replay(events, ["id"]), at_creation[name])
    assert len(snapshot[table]) == 40 and len(snapshot[few]) == 1 and snapshot[empty] == []
    assert entry.stats["rows"] == {
        f"{PREFIX}.public.{table}": 40,
        f"{PREFIX}.public.{few}": 1,
        f"{PREFIX}.public.{empty}": 0,
    }

    # the envelope: Debezium's snapshot rows with the YugabyteDB gRPC connector's source block
    tablet_ids = {t: {x["tablet_id"] for x in yb.tablets(t)} for t in (table, few, empty)}
    for event in snapshot[table] + snapshot[few]:
        source = event["source"]
        assert event["before"] is None and event["transaction"] is None
        assert source["snapshot"] == "true" and source["connector"] == "yugabytedb"
        assert source["db"] == yb.database and source["name"] == PREFIX
        assert source["commit_time"] == ht and source["record_time"] == ht
        assert source["ts_ms"] == (ht >> 12) // 1000 and event["ts_ms"] >= source["ts_ms"]
        assert source["txId"] is None and source["xmin"] is None
        assert source["sequence"] == json.dumps([None, source["lsn"]], separators=(",", ":"))
        term, index, key, write_id, time = source["lsn"].split(":")
        assert int(term) > 0 and int(index) > 0 and base64.b64decode(key) and (write_id, time) == ("0", "0")
        assert source["tablet_id"] == yb.tablet_for(source["table"], event["after"]["id"])
    assert len({e["source"]["lsn"] for e in snapshot[table]}) == 40  # each row's own position
    assert len({e["source"]["tablet_id"] for e in snapshot[table]}) == 3

    # where the stream continues: every tablet of the captured tables, at the snapshot's op id
    state = entry.stats["source_state"]
    assert state["stream_id"] == stream and state["last_read_ms"] > 0
    starts = TabletCheckpoints.from_json(state["tablets"])
    assert set(starts) == set().union(*tablet_ids.values())
    for tablet_id, start in starts.items():
        checkpoint = start.position.checkpoint
        assert (checkpoint.key, checkpoint.write_id, checkpoint.snapshot_time) == (b"", 0, 0)
        assert checkpoint.term > 0 and checkpoint.index > 0
        assert start.position.safe_hybrid_time == ht
        (owner,) = [t for t, ids in tablet_ids.items() if tablet_id in ids]
        assert start.table_ids == (yb.tablets(owner)[0]["table_id"],)
        # the bootstrap's own checkpoint, no SetCDCCheckpoint; the snapshot marked done (snapshot_done_key:
        # the row's snapshot key gone, its safe time the snapshot's), so the server holds no history for it
        server = yb.state(stream, tablet_id)
        assert tuple(server["checkpoint"]) == (checkpoint.term, checkpoint.index)
        assert server["snapshot_key"] is None and server["safe_time"] == ht

    # a stream window from the snapshot's end: exactly the changes after the stream's creation
    window = run_job(stream_spec(yb, stream, [table, few, empty], tmp_path, 2, ht + 1, end + 1, starts), no_spark)
    later = {t: [e for e in topic(tmp_path, t) if e["op"] != "r"] for t in (table, few, empty)}
    assert Counter(e["op"] for e in later[table]) == {"c": 2, "u": 3, "d": 2}
    assert Counter(e["op"] for e in later[few]) == {"c": 1} and Counter(e["op"] for e in later[empty]) == {"c": 1}
    assert all(ht < e["source"]["commit_time"] <= end for events in later.values() for e in events)
    assert window.stats["changes"] == 9
    with yb.connect() as conn:
        for name in (table, few, empty):
            assert_same_state(replay(topic(tmp_path, name), ["id"]), rows_of(conn, name))
    assert [w.window.kind for w in committed_windows(str(tmp_path), PREFIX)] == ["snapshot", "stream"]


def test_a_table_rewritten_after_the_streams_creation_is_named_as_rewritten(yb):
    # YB's DocDB table id is built from the relfilenode (pg_yb_utils.h YbGetRelfileNodeId), which a
    # table rewrite changes: the stream keeps listing the old table, whose tablets get no new rows.
    from airflow_provider_cdc.cdc.sources.yugabyte_cdc import admin

    table, kept = "snap_rewritten", "snap_kept"
    with yb.connect() as conn:
        conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, n int)")
        conn.execute(f"CREATE TABLE {kept} (id int PRIMARY KEY, n int)")
    yb.wait_caught_up()
    stream = yb.create_stream("CHANGE", "EXPLICIT", tables=[table, kept])
    refs = [TableRef("public", table), TableRef("public", kept)]
    with yb.connect() as conn, YbCdcClient(yb.master_addresses, stream, tls=None) as client:
        assert admin.stream_problems(admin.stream_status(client), admin.database_ids(conn, refs), stream) == []
        conn.execute(f"ALTER TABLE {table} ALTER COLUMN n TYPE bigint")  # a table rewrite
        conn.execute(f"INSERT INTO {table} VALUES (1, 1)")
        yb.wait_caught_up()
        ids = admin.database_ids(conn, refs)
        (problem,) = admin.stream_problems(admin.stream_status(client), ids, stream)
    assert f'"public"."{table}" was rewritten after CDC stream' in problem
    assert "create a new stream" in problem and kept not in problem
    # The stand-in made a new DocDB table for the rewritten one, with the id the product computed.
    assert {t["table_id"] for t in yb.tablets(table)} == {ids.tables[refs[0]]}


def test_a_captured_table_not_in_the_stream_fails_before_anything_lands(yb, provider, tmp_path):
    inside, outside = "snap_inside", "snap_outside"
    with yb.connect() as conn:
        conn.execute(f"CREATE TABLE {inside} (id int PRIMARY KEY, v text)")
        conn.execute(f"CREATE TABLE {outside} (id int PRIMARY KEY, v text)")
        conn.execute(f"INSERT INTO {inside} VALUES (1, 'a'), (2, 'b')")
        conn.execute(f"INSERT INTO {outside} VALUES (1, 'a')")
    yb.wait_caught_up()
    stream = yb.create_stream("CHANGE", "EXPLICIT", tables=[inside])
    with pytest.raises(CdcConfigurationError, match=r'"public"\."snap_outside" are not in CDC stream'):
        run_job(snapshot_spec(yb, stream, [inside, outside], tmp_path), provider)
    assert committed_windows(str(tmp_path), PREFIX) == []
    assert read_topic_arrow(str(tmp_path), PREFIX, f"{PREFIX}.public.{inside}") is None
    assert not list(tmp_path.rglob("*.parquet"))


def test_known_table_ids_leave_the_other_stream_tables_untouched(yb, provider, tmp_path):
    """With the captured tables' ids (the capture reads them from the YSQL catalog) the snapshot
    bootstraps only their tablets: a bootstrap makes the server keep a tablet's changes for the
    stream, so probing a table the capture never reads would hold them until the stream expires."""
    known, other, outside = "snap_known", "snap_other", "snap_elsewhere"
    with yb.connect() as conn:
        for name in (known, other, outside):
            conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v text)")
            conn.execute(f"INSERT INTO {name} SELECT g, 'v' || g FROM generate_series(1, 12) g")
    yb.wait_caught_up()
    ids = {name: yb.tablets(name)[0]["table_id"] for name in (known, other, outside)}

    def spec(stream: str, tables: list[str], sink, with_ids: bool) -> YbCdcJobSpec:
        base = snapshot_spec(yb, stream, tables, sink)
        if not with_ids:
            return base
        return replace(base, table_ids=tuple((TableRef("public", t), ids[t]) for t in tables))

    def states(stream: str, table: str) -> dict[str, tuple]:
        fields = ("start", "checkpoint", "snapshot_key", "polled")  # the stream's own, not the tablet's
        return {t["tablet_id"]: tuple(yb.state(stream, t["tablet_id"])[f] for f in fields) for t in yb.tablets(table)}

    def touched(stream: str, table: str, before: dict[str, tuple]) -> set[str]:
        """The tablets whose stream state (checkpoint, snapshot key, polling) moved since ``before``."""
        return {tablet for tablet, state in states(stream, table).items() if state != before[tablet]}

    stream = yb.create_stream("CHANGE", "EXPLICIT", tables=[known, other])
    before = {t: states(stream, t) for t in (known, other)}
    entry = run_job(spec(stream, [known], tmp_path / "ids", with_ids=True), provider)
    assert entry.stats["rows"] == {f"{PREFIX}.public.{known}": 12}
    assert touched(stream, known, before[known]) == set(before[known])
    assert touched(stream, other, before[other]) == set()
    starts = TabletCheckpoints.from_json(entry.stats["source_state"]["tablets"])
    assert set(starts) == {t["tablet_id"] for t in yb.tablets(known)}

    # Without them (an older spec) the other table's tablet is probed for its name: what the ids avoid.
    probing = yb.create_stream("CHANGE", "EXPLICIT", tables=[known, other])
    untouched = states(probing, other)
    run_job(spec(probing, [known], tmp_path / "probe", with_ids=False), provider)
    assert len(touched(probing, other, untouched)) == 1

    # A known id the stream lacks fails before any tablet is touched or anything lands.
    sink = tmp_path / "outside"
    narrow = yb.create_stream("CHANGE", "EXPLICIT", tables=[known])
    untouched = states(narrow, known)
    with pytest.raises(CdcConfigurationError, match=rf'"public"\."{outside}" are not in CDC stream {narrow}; '):
        run_job(spec(narrow, [known, outside], sink, with_ids=True), provider)
    assert touched(narrow, known, untouched) == set()
    assert committed_windows(str(sink), PREFIX) == [] and not list(tmp_path.glob("outside/**/*.parquet"))


def test_leader_moves_and_refusals_during_the_snapshot(yb, provider, small_pages, tmp_path, monkeypatch):
    table = "snap_moving"
    with yb.connect() as conn:
        conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v text)")
        conn.execute(f"INSERT INTO {table} SELECT g, 'row ' || g FROM generate_series(1, 300) g")
    yb.wait_caught_up()
    stream = yb.create_stream("CHANGE", "EXPLICIT", tables=[table])
    with yb.connect() as conn:
        expected = rows_of(conn, table)
    first, second, third = sorted(t["tablet_id"] for t in yb.tablets(table))
    terms = {t["tablet_id"]: t["term"] for t in yb.tablets(table)}

    # The driver has bootstrapped every tablet at its leader. Before the tasks run: one tablet's
    # leader moves (its tasks page at another server, in a new term, from the bootstrap's op id);
    # another's refuses twice as a former leader does; a third's keeps moving while the tasks run
    # (whether a move lands between two of its pages depends on timing; the outcome must not).
    real = snapshot_module.write_snapshot_tables
    stop = threading.Event()

    def mover() -> None:
        while not stop.wait(0.15):
            yb.move_leader(third)

    def write_snapshot_tables(*args, **kwargs):
        yb.move_leader(first)
        yb.fail_next(
            "GetChanges",
            f"Not leader for {second} NOT_LEADER",
            tablet_id=second,
            service_code="TABLET_NOT_FOUND",
            status_code="NOT_FOUND",
            times=2,
        )
        thread = threading.Thread(target=mover)
        thread.start()
        try:
            return real(*args, **kwargs)
        finally:
            stop.set()
            thread.join()

    monkeypatch.setattr(snapshot_module, "write_snapshot_tables", write_snapshot_tables)
    entry = run_job(snapshot_spec(yb, stream, [table], tmp_path), provider)

    events = topic(tmp_path, table)
    assert len(events) == 300 and {e["op"] for e in events} == {"r"}
    assert_same_state(replay(events, ["id"]), expected)
    moved = {t["tablet_id"]: t["term"] for t in yb.tablets(table)}
    # moved before the tasks; moved again and again while they ran
    assert moved[first] > terms[first] and moved[third] > terms[third] + 1
    # the refusals were answered to a task (none is left for this call)
    once = RetryPolicy(attempts=1)
    with YbCdcClient(yb.master_addresses, stream, retry=once, tls=None) as client:
        boot = entry.stats["source_state"]["tablets"][second]["lsn"]
        start = Checkpoint.parse(boot)
        page = Checkpoint(start.term, start.index, b"", -1, entry.stats["snapshot_ht"])
        assert client.get_changes(second, TabletPosition(page)).cdc_sdk_proto_records


TYPED = """
CREATE TABLE {name} (
    id int PRIMARY KEY,
    small smallint, regular integer, big bigint,
    exact numeric(14,4), loose numeric,
    label text, code varchar(12), letter char(3), flag boolean,
    ratio double precision, single real,
    at timestamp, at_tz timestamptz, day date, clock time,
    span interval, uid uuid, doc jsonb, raw bytea,
    tags text[], nums int[]
)
"""

TYPED_ROWS = [
    "(%s, 1, 2, 3, 1.5, 1.5, 'plain', 'c', 'abc', true, 0.25, 1.5, '2024-01-02 03:04:05',"
    " '2024-01-02 03:04:05+02', '2024-01-02', '12:34:56.789', '1 year 2 mons 3 days 04:05:06.5',"
    " 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{\"a\": 1}', '\\x00ff', '{a,\"b c\"}', '{1,2,3}')",
    "(%s, -32768, -2147483648, -9223372036854775808, -9999999999.9999, 0.000000000000000000001,"
    " '', '', '', false, -1e300, -3.4e38, '1970-01-01 00:00:00', '1999-12-31 23:59:59.999999-08', '0001-01-01',"
    " '00:00:00', '-3 days', '00000000-0000-0000-0000-000000000000', '[]', '\\x', '{}', '{NULL}')",
    "(%s, null, null, null, null, null, null, null, null, null, null, null, null, null, null, null, null,"
    " null, null, null, null, null)",
    "(%s, 32767, 2147483647, 9223372036854775807, 0, 12345678901234567890.123456789,"
    " 'line1\nline2, \"quoted\" and ''single''\ttab \\ backslash', 'ünï✓', 'x', true, 3.141592653589793, 0.1,"
    " '9999-12-31 23:59:59.999999', '2262-04-11 23:47:16.854775+00', '9999-12-31', '23:59:59.999999',"
    " 'PT0S', 'ffffffff-ffff-ffff-ffff-ffffffffffff', '{\"nested\": {\"k\": [1, \"two\", null, true]}}',"
    " '\\x0a0d2c22', '{\"ünï\",NULL}', '{-1,0,1}')",
]


def test_values_of_many_types_are_the_streams(yb, provider, tmp_path):
    """A row read by the snapshot and the same row inserted after it (read by a stream window)
    give identical values, and the replay equals the table."""
    table = "snap_typed"
    with yb.connect() as conn:
        conn.execute(TYPED.format(name=table))
        for i, row in enumerate(TYPED_ROWS):
            conn.execute(f"INSERT INTO {table} VALUES {row}", (i,))
    yb.wait_caught_up()
    stream = yb.create_stream("FULL_ROW_NEW_IMAGE", "EXPLICIT", tables=[table])
    with yb.connect() as conn:
        for i, row in enumerate(TYPED_ROWS):
            conn.execute(f"INSERT INTO {table} VALUES {row}", (100 + i,))
    end = yb.wait_caught_up()
    entry = run_job(snapshot_spec(yb, stream, [table], tmp_path), provider)
    ht = entry.stats["snapshot_ht"]
    starts = TabletCheckpoints.from_json(entry.stats["source_state"]["tablets"])
    run_job(stream_spec(yb, stream, [table], tmp_path, 2, ht + 1, end + 1, starts), no_spark)

    events = topic(tmp_path, table)
    by_id = {e["after"]["id"]: e for e in events}
    assert len(events) == len(by_id) == 2 * len(TYPED_ROWS)
    for i in range(len(TYPED_ROWS)):
        read, created = by_id[i], by_id[100 + i]
        assert (read["op"], created["op"]) == ("r", "c")
        assert {**read["after"], "id": 0} == {**created["after"], "id": 0}
    # the replay is the table (columns the capture represents differently from psycopg: below)
    special = ("single", "clock", "span", "tags", "nums")
    replayed = replay(events, ["id"])
    with yb.connect() as conn:
        source = rows_of(conn, table)
    assert_same_state(*({k: drop(r, special) for k, r in rows.items()} for rows in (replayed, source)))
    for key, row in source.items():
        single = row["single"]  # a real is a float32: compared at its precision
        assert replayed[key]["single"] == (None if single is None else pytest.approx(single, rel=1e-7))
        clock = row["clock"]
        micros = None if clock is None else ((clock.hour * 60 + clock.minute) * 60 + clock.second) * 10**6
        assert replayed[key]["clock"] == (None if clock is None else micros + clock.microsecond)
    # intervals as Debezium's microseconds (a month is 30.4375 days), arrays as PostgreSQL's text
    assert [by_id[i]["after"]["span"] for i in range(4)] == [37_091_106_500_000, -3 * 86_400 * 10**6, None, 0]
    assert [by_id[i]["after"]["tags"] for i in range(4)] == ['{a,"b c"}', "{}", None, "{ünï,NULL}"]
    assert [by_id[i]["after"]["nums"] for i in range(4)] == ["{1,2,3}", "{NULL}", None, "{-1,0,1}"]
    # the snapshot's files (one per tablet) and the window's have one schema
    files = sorted(p for p in tmp_path.rglob("*.parquet") if f"{PREFIX}.public.{table}" in str(p))
    schemas = {pq.read_schema(p).remove_metadata() for p in files}
    assert len(files) >= 4 and len(schemas) == 1


def drop(row: dict, columns: tuple[str, ...]) -> dict:
    return {k: v for k, v in row.items() if k not in columns}
