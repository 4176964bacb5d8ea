"""Current-state tables built from committed events equal the source table at every window."""

from __future__ import annotations

import random
import string

import pytest

from airflow_provider_cdc.cdc.basics.naming import Topic
from airflow_provider_cdc.cdc.sources.postgres import admin
from airflow_provider_cdc.cdc.sources.postgres.jobs import run_job
from airflow_provider_cdc.cdc.state.apply import apply_windows
from airflow_provider_cdc.cdc.state.jobs import read_state
from tests.support.databases import snapshot_window, stream_window
from tests.support.oracle import assert_same_state, events_of, source_rows, spark_rows

pytestmark = pytest.mark.spark

TABLES = ["public.docs", "public.tags"]


def big_text(seed: int, size: int = 12_000) -> str:
    rng = random.Random(seed)  # incompressible, so PostgreSQL stores it out of line (TOAST)
    return "".join(rng.choice(string.ascii_letters) for _ in range(size))


def state_rows(spark, sink, state, table, keys):
    frame = read_state(spark, state_path=str(state), topic_prefix="t", topic=Topic.for_table("t", *table.split(".")))
    return spark_rows(frame, keys)


def multiset(rows) -> list:
    return sorted(tuple(sorted(r.items())) for r in rows)


class Capture:
    """Runs snapshot and windows with the engine, remembering the source at each window."""

    def __init__(self, db, sink):
        self.db, self.sink, self.seq, self.at = db, sink, 0, None
        self.source_at: dict[int, dict] = {}

    def snapshot(self):
        self.seq += 1
        entry = run_job(self.db.spec(TABLES, snapshot_window(self.seq), self.sink))
        with self.db.connect() as conn:
            admin.advance_slot(conn, self.db.slot, entry.window.to_lsn)
        self.at = entry.window.to_lsn
        self._remember()

    def window(self):
        self.seq += 1
        end = self.db.current_lsn()
        entry = run_job(self.db.spec(TABLES, stream_window(self.seq, self.at, end), self.sink))
        with self.db.connect() as conn:
            admin.advance_slot(conn, self.db.slot, end)
        self.at = end
        self._remember()
        return entry

    def _remember(self):
        with self.db.connect() as conn:
            self.source_at[self.seq] = {
                "docs": source_rows(conn, "public.docs", ["id"]),
                "tags": [dict(zip(("doc", "tag"), r)) for r in conn.execute("SELECT doc, tag FROM tags")],
            }


def test_state_follows_every_kind_of_change(db15, spark, tmp_path):
    db, sink, state = db15, tmp_path / "lake", tmp_path / "state"
    db.execute(
        "CREATE TABLE docs (id int PRIMARY KEY, title text, body text, version int);"
        "CREATE TABLE tags (doc int, tag text); ALTER TABLE tags REPLICA IDENTITY FULL;"
    )
    with db.connect() as conn:
        for i in range(1, 6):
            conn.execute("INSERT INTO docs VALUES (%s, %s, %s, 1)", (i, f"doc {i}", big_text(i)))
        conn.execute("INSERT INTO tags VALUES (1, 'a'), (1, 'a'), (2, 'b')")  # duplicates: a multiset
    db.setup_capture(TABLES)
    capture = Capture(db, sink)
    capture.snapshot()
    with db.connect() as conn:
        conn.execute("UPDATE docs SET title = 'renamed', version = 2 WHERE id = 1")  # body unchanged: TOAST
        conn.execute("UPDATE docs SET id = 10 WHERE id = 2")  # key change, body unchanged
        conn.execute("DELETE FROM docs WHERE id = 3")
        conn.execute("INSERT INTO docs VALUES (6, 'new', 'small body', 1)")
        conn.execute("DELETE FROM tags WHERE ctid = (SELECT min(ctid) FROM tags WHERE tag = 'a')")
        conn.execute("UPDATE tags SET tag = 'c' WHERE doc = 2")
    first = capture.window()
    assert first.stats["key_changes"] == 1
    events = {(e["op"], e["id"]): e for e in events_of(sink, "t", "public.docs") if e["window_id"] == first.window_id}
    assert events[("u", 1)]["unchanged_toast_columns"] == ["body"]
    assert events[("u", 1)]["after"]["body"] == "__debezium_unavailable_value"
    moved = events[("c", 10)]
    assert moved["__debezium_oldkey"] == {"id": 2} and moved["unchanged_toast_columns"] == ["body"]
    assert events[("d", 2)]["__debezium_newkey"] == {"id": 10}
    assert events[("d", 2)]["transaction"]["total_order"] + 1 == moved["transaction"]["total_order"]
    with db.connect() as conn:
        conn.execute("UPDATE docs SET version = version + 1 WHERE id = 10")  # body unchanged again
        conn.execute("TRUNCATE tags")
        conn.execute("INSERT INTO tags VALUES (10, 'after truncate')")
    capture.window()

    for _ in range(3):  # the first call applies every window, the next ones find nothing new
        result = apply_windows(
            spark,
            sink_path=str(sink),
            topic_prefix="t",
            topic=Topic.for_table("t", "public", "docs"),
            state_path=str(state),
        )
        apply_windows(
            spark,
            sink_path=str(sink),
            topic_prefix="t",
            topic=Topic.for_table("t", "public", "tags"),
            state_path=str(state),
        )
    assert result.action == "unchanged"  # applying again changes nothing
    assert_same_state(state_rows(spark, sink, state, "public.docs", ["id"]), capture.source_at[3]["docs"])
    tags = read_state(spark, state_path=str(state), topic_prefix="t", topic=Topic.for_table("t", "public", "tags"))
    assert multiset(r.asDict() for r in tags.collect()) == multiset(capture.source_at[3]["tags"])
    # The Arrow engine (no Spark) builds the same state, window by window or all at once.
    for table in ("docs", "tags"):
        for upto in (2, 3):
            apply_windows(
                None,
                sink_path=str(sink),
                topic_prefix="t",
                topic=Topic.for_table("t", "public", table),
                state_path=str(tmp_path / "arrow"),
                as_of_seq=None if upto == 3 else upto,
                engine="arrow",
            )
    assert_same_state(state_rows(spark, sink, tmp_path / "arrow", "public.docs", ["id"]), capture.source_at[3]["docs"])
    tags = read_state(
        spark, state_path=str(tmp_path / "arrow"), topic_prefix="t", topic=Topic.for_table("t", "public", "tags")
    )
    assert multiset(r.asDict() for r in tags.collect()) == multiset(capture.source_at[3]["tags"])

    # Rebuild as of the first stream window: the state at that time.
    topic = Topic.for_table("t", "public", "docs")
    rebuilt = apply_windows(
        spark, sink_path=str(sink), topic_prefix="t", topic=topic, state_path=str(state), as_of_seq=2
    )
    assert rebuilt.action == "rebuilt"
    as_of = read_state(spark, state_path=str(state), topic_prefix="t", topic=topic, window_seq=2)
    assert_same_state(spark_rows(as_of, ["id"]), capture.source_at[2]["docs"])
    current = read_state(spark, state_path=str(state), topic_prefix="t", topic=topic)
    assert current.count() == len(capture.source_at[3]["docs"])  # the rebuild did not move "current"


def test_incremental_application_matches_a_full_rebuild(db15, spark, tmp_path):
    db, sink = db15, tmp_path / "lake"
    db.execute(
        "CREATE TABLE docs (id int PRIMARY KEY, title text, body text, version int);"
        "CREATE TABLE tags (doc int PRIMARY KEY, tag text)"
    )
    db.execute("INSERT INTO docs SELECT g, 'd' || g, 'b', 0 FROM generate_series(1, 200) g")
    db.setup_capture(TABLES)
    capture = Capture(db, sink)
    capture.snapshot()
    topic = Topic.for_table("t", "public", "docs")
    rng = random.Random(5)
    for _ in range(4):
        with db.connect() as conn:
            for _ in range(40):
                roll, key = rng.random(), rng.randint(1, 260)
                if roll < 0.4:
                    conn.execute(
                        "INSERT INTO docs VALUES (%s, 'x', 'y', 0) "
                        "ON CONFLICT (id) DO UPDATE SET version = docs.version + 1",
                        (key,),
                    )
                elif roll < 0.7:
                    conn.execute("UPDATE docs SET version = version + 1, title = %s WHERE id = %s", (str(roll), key))
                elif roll < 0.85:
                    conn.execute(
                        "UPDATE docs SET id = %s WHERE id = %s AND NOT EXISTS (SELECT 1 FROM docs WHERE id = %s)",
                        (key + 1000, key, key + 1000),
                    )
                else:
                    conn.execute("DELETE FROM docs WHERE id = %s", (key,))
        capture.window()
        apply_windows(
            spark, sink_path=str(sink), topic_prefix="t", topic=topic, state_path=str(tmp_path / "incremental")
        )
        apply_windows(  # the Arrow engine, over its own previous versions
            None, sink_path=str(sink), topic_prefix="t", topic=topic, state_path=str(tmp_path / "arrow"), engine="arrow"
        )
    incremental = read_state(spark, state_path=str(tmp_path / "incremental"), topic_prefix="t", topic=topic)
    by_arrow = read_state(spark, state_path=str(tmp_path / "arrow"), topic_prefix="t", topic=topic)
    assert sorted(map(tuple, by_arrow.select(*incremental.columns).collect())) == sorted(
        map(tuple, incremental.collect())
    )
    apply_windows(spark, sink_path=str(sink), topic_prefix="t", topic=topic, state_path=str(tmp_path / "full"))
    full = read_state(spark, state_path=str(tmp_path / "full"), topic_prefix="t", topic=topic)
    assert sorted(map(tuple, incremental.collect())) == sorted(map(tuple, full.collect()))
    assert_same_state(spark_rows(full, ["id"]), capture.source_at[capture.seq]["docs"])
