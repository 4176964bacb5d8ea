"""Query-based watermark extraction: late commits inside the lookback, dedup of the overlap."""

from __future__ import annotations

from collections import Counter

import pytest

from airflow_provider_cdc.cdc.sinks.reader import read_topic_arrow
from airflow_provider_cdc.operators.query_extract import PostgresQueryExtractOperator
from tests.support.oracle import assert_same_state, replay, source_rows


@pytest.fixture
def source(db15, monkeypatch):
    conn_id = f"q_{db15.name}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", db15.cluster.airflow_uri(db15.name))
    db15.execute(
        "CREATE TABLE items (id int PRIMARY KEY, v text, created_at timestamptz NOT NULL DEFAULT clock_timestamp(), "
        "updated_at timestamptz NOT NULL DEFAULT clock_timestamp())"
    )
    db15.execute("INSERT INTO items (id, v) SELECT g, 'v' || g FROM generate_series(1, 100) g")
    return db15, conn_id


def extractor(conn_id, sink, prefix="q", **kwargs):
    return PostgresQueryExtractOperator(
        task_id=f"extract_{prefix}",
        postgres_conn_id=conn_id,
        table="public.items",
        cursor_column="updated_at",
        topic_prefix=prefix,
        sink_path=str(sink),
        offset_store="state_table",
        offset_table="public.query_offsets",
        **kwargs,
    )


def events(sink, prefix="q"):
    table = read_topic_arrow(str(sink), prefix, f"{prefix}.public.items")
    return [] if table is None else table.to_pylist()


def test_late_commits_inside_the_lookback_are_extracted_once(source, tmp_path):
    db, conn_id = source
    with_lookback = extractor(conn_id, tmp_path / "a", lookback=600, created_column="created_at")
    without = extractor(conn_id, tmp_path / "b", prefix="q0")
    first = with_lookback.execute({})
    without.execute({})
    assert first["rows"] == 100 and first["duplicates_dropped"] == 0
    with db.connect() as late:
        # A transaction takes its cursor value now and commits only after the next run read past it.
        late.execute("BEGIN")
        late.execute("INSERT INTO items (id, v) VALUES (1000, 'late')")
        db.execute("UPDATE items SET v = 'changed', updated_at = clock_timestamp() WHERE id = 5")
        second = with_lookback.execute({})
        without.execute({})
        late.execute("COMMIT")
    assert second["rows"] == 1 and second["duplicates_dropped"] == 99  # the band re-read, dropped
    third = with_lookback.execute({})
    assert third["rows"] == 1 and third["duplicates_dropped"] == 100  # the late row, once
    without.execute({})
    emitted = events(tmp_path / "a")
    counts = Counter(e["after"]["id"] for e in emitted)
    assert counts[1000] == 1 and counts[5] == 2 and set(counts.values()) <= {1, 2}
    assert {e["source"]["snapshot"] for e in emitted} == {"query"}
    ops = {e["after"]["id"]: e["op"] for e in emitted if e["window_id"] != "0000000001"}
    # The rule: c when created after the previous watermark, else u. The late row's creation time
    # precedes that watermark (that is what makes it late), so it is a u (documented).
    assert ops == {5: "u", 1000: "u"}
    with db.connect() as conn:
        assert_same_state(replay(emitted, ["id"]), source_rows(conn, "public.items", ["id"]))
    # Without a lookback the late row is lost: the watermark had passed its cursor value.
    assert 1000 not in {e["after"]["id"] for e in events(tmp_path / "b", "q0")}


def test_an_idle_run_keeps_the_watermark_and_the_overlap(source, tmp_path):
    db, conn_id = source
    op = extractor(conn_id, tmp_path, lookback=600, created_column="created_at")
    first = op.execute({})
    idle = op.execute({})
    assert idle["rows"] == 0 and idle["watermark"] == first["watermark"]
    db.execute("UPDATE items SET v = 'again', updated_at = clock_timestamp() WHERE id = 7")
    db.execute("INSERT INTO items (id, v) VALUES (2000, 'new')")
    later = op.execute({})
    assert later["rows"] == 2 and later["duplicates_dropped"] == 99
    ops = {e["after"]["id"]: e["op"] for e in events(tmp_path) if e["window_id"] == later["window_id"]}
    assert ops == {7: "u", 2000: "c"}


def test_bad_input_fails_before_anything_is_written(source, tmp_path):
    from airflow_provider_cdc.version_compat import AirflowFailException

    _, conn_id = source
    with pytest.raises(AirflowFailException, match="do not exist"):
        extractor(conn_id, tmp_path, created_column="nope").execute({})
    with pytest.raises(
        AirflowFailException, match=r"created_column .*id is integer, the cursor updated_at is timestamp"
    ):
        extractor(conn_id, tmp_path, created_column="id").execute({})
    with pytest.raises(AirflowFailException, match=r"cursor column .* is text"):
        PostgresQueryExtractOperator(
            task_id="bad",
            postgres_conn_id=conn_id,
            table="public.items",
            cursor_column="v",
            topic_prefix="qb",
            sink_path=str(tmp_path),
            offset_store="state_table",
            offset_table="public.query_offsets",
        ).execute({})
    assert not list(tmp_path.rglob("*.parquet"))


def test_ties_a_deleted_maximum_and_future_values_lose_and_repeat_nothing(source, tmp_path):
    db, conn_id = source
    op = extractor(conn_id, tmp_path)  # no lookback
    db.execute("UPDATE items SET updated_at = '2026-01-01 00:00:00+00'")  # every row tied
    assert op.execute({})["rows"] == 100
    # A later commit with the watermark's very value (a coarse clock): read, once.
    db.execute("INSERT INTO items (id, v, updated_at) VALUES (101, 'tie', '2026-01-01 00:00:00+00')")
    tie = op.execute({})
    assert (tie["rows"], tie["duplicates_dropped"]) == (1, 100)
    db.execute("UPDATE items SET v = 'later', updated_at = '2026-02-01 00:00:00+00' WHERE id = 5")
    assert op.execute({})["rows"] == 1
    # The row holding the maximum goes away: the watermark must not step back (and re-read).
    db.execute("DELETE FROM items WHERE id = 5")
    gone = op.execute({})
    assert gone["rows"] == 0 and gone["watermark"] == "2026-02-01 00:00:00+00"
    assert op.execute({})["rows"] == 0
    # A mistyped future value waits for its time; the rows written meanwhile are not skipped.
    db.execute("INSERT INTO items (id, v, updated_at) VALUES (102, 'typo', '2999-01-01 00:00:00+00')")
    db.execute("INSERT INTO items (id, v) VALUES (200, 'now')")
    assert op.execute({})["rows"] == 1
    db.execute("INSERT INTO items (id, v) VALUES (201, 'now')")
    last = op.execute({})
    assert last["rows"] == 1 and not last["watermark"].startswith("2999")
    counts = Counter(e["after"]["id"] for e in events(tmp_path))
    assert counts[5] == 2 and counts[102] == 0
    assert {i for i, n in counts.items() if n != 1} == {5}
    assert set(counts) == set(range(1, 102)) | {200, 201}


def test_a_seen_rows_path_edited_into_the_offset_is_refused(source, tmp_path):
    """Whoever may edit the stored offset points ``seen_path`` at another dataset of the sink
    (here the table's own events): its rows would silently drop matching rows from the next band."""
    import json

    from airflow_provider_cdc.offsets.state_table import PostgresStateTableOffsetStore

    db, conn_id = source
    op = extractor(conn_id, tmp_path, lookback=600, created_column="created_at")
    op.execute({})
    store = PostgresStateTableOffsetStore(conn_id, "public.query_offsets")
    document = json.loads(store.load("q"))
    seen = document["seen_path"]
    assert seen and "/window=0000000001/" in seen
    events_dir = "q.public.items/" + seen.split("/", 1)[1]
    for forged in (events_dir, "../elsewhere/window=0000000001/attempt=0123456789abcdef"):
        db.execute(
            "UPDATE public.query_offsets SET document = jsonb_set(document, '{seen_path}', to_jsonb(%s::text)) "
            "WHERE capture = 'q'",
            (forged,),
        )
        with pytest.raises(Exception, match=r"seen-rows path|does not stay inside the sink"):
            op.execute({})
    db.execute(
        "UPDATE public.query_offsets SET document = jsonb_set(document, '{seen_path}', to_jsonb(%s::text)) "
        "WHERE capture = 'q'",
        (seen,),
    )
    assert op.execute({})["duplicates_dropped"] == 100  # the genuine path still works
