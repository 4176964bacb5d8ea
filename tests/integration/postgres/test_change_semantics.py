"""Change semantics scenarios: each checks the events and that the current state equals the source."""

from __future__ import annotations

import random
import string

import pytest

from airflow_provider_cdc.cdc.events.columns import ColumnRules
from airflow_provider_cdc.cdc.sinks.reader import read_topic_arrow
from airflow_provider_cdc.cdc.sources.postgres.events import EventSettings
from airflow_provider_cdc.cdc.sources.postgres.stream import MARKER_PREFIX
from tests.conftest import _database_fixture as database_fixture
from tests.support.scenario import Scenario

pytestmark = pytest.mark.spark


# Every scenario lands in each sink format (the events and the state must not depend on it); the
# formats do not depend on the server version, so they run on PostgreSQL 15 only.
RUNS = [("pg15", "parquet"), ("pg18", "parquet"), ("pg15", "iceberg"), ("pg15", "delta")]


@pytest.fixture(params=RUNS, ids=[f"{flavour}-{sink_format}" for flavour, sink_format in RUNS])
def run(request, clusters):
    yield from database_fixture(request, clusters[request.param[0]])


@pytest.fixture
def db(run):
    return run


@pytest.fixture
def sink_format(request) -> str:
    return request.node.callspec.params["run"][1]


PLACEHOLDER = "__debezium_unavailable_value"


def toasted(seed: int) -> str:
    rng = random.Random(seed)  # incompressible: stored out of line
    return "".join(rng.choice(string.ascii_letters) for _ in range(12_000))


def test_replica_identity_shapes_the_before_image(db, spark, tmp_path, sink_format):
    db.execute(
        "CREATE TABLE def (id int PRIMARY KEY, v text, n int);"
        "CREATE TABLE ful (id int, v text, n int); ALTER TABLE ful REPLICA IDENTITY FULL;"
        "CREATE TABLE idx (a int NOT NULL, b int NOT NULL, v text); CREATE UNIQUE INDEX idx_ab ON idx (a, b);"
        "ALTER TABLE idx REPLICA IDENTITY USING INDEX idx_ab;"
        "CREATE TABLE noth (id int PRIMARY KEY, v text); ALTER TABLE noth REPLICA IDENTITY NOTHING;"
    )
    scenario = Scenario(
        db, ["public.def", "public.ful", "public.idx", "public.noth"], tmp_path, spark=spark, sink_format=sink_format
    )
    with db.connect() as conn:
        for table in ("def", "ful"):
            conn.execute(f"INSERT INTO {table} VALUES (1, 'a', 1), (2, 'b', 2), (3, 'c', 3)")
        conn.execute("INSERT INTO idx VALUES (1, 1, 'a'), (2, 2, 'b'), (3, 3, 'c')")
        conn.execute("INSERT INTO noth VALUES (1, 'only inserts')")
        for table in ("def", "ful"):
            conn.execute(f"UPDATE {table} SET v = 'changed' WHERE id = 1")
            conn.execute(f"UPDATE {table} SET id = 20 WHERE id = 2")
            conn.execute(f"DELETE FROM {table} WHERE id = 3")
        conn.execute("UPDATE idx SET v = 'changed' WHERE a = 1")
        conn.execute("UPDATE idx SET b = 20 WHERE a = 2")
        conn.execute("DELETE FROM idx WHERE a = 3")
    window = scenario.window()

    def shapes(table):
        return [
            (e["op"], e["before"], e["after"]) for e in scenario.events(table, window) if e["op"] != "c" or e["before"]
        ]

    default = {(e["op"], e["id"]): e for e in scenario.events("public.def", window)}
    assert default[("u", 1)]["before"] is None  # DEFAULT: no old image unless the key changed
    assert default[("d", 2)]["before"] == {"id": 2, "v": None, "n": None}  # the old key only
    assert default[("d", 2)]["__debezium_newkey"] == {"id": 20}
    assert default[("c", 20)]["__debezium_oldkey"] == {"id": 2}
    assert default[("d", 3)]["before"] == {"id": 3, "v": None, "n": None}
    full = [e for e in scenario.events("public.ful", window) if e["op"] in ("u", "d")]
    assert [e["before"] for e in full] == [
        {"id": 1, "v": "a", "n": 1},
        {"id": 2, "v": "b", "n": 2},
        {"id": 3, "v": "c", "n": 3},
    ]  # FULL: the whole old row; no key, so the id change is an update
    by_index = {(e["op"], e["a"], e["b"]): e for e in scenario.events("public.idx", window)}
    assert by_index[("u", 1, 1)]["before"] is None
    assert by_index[("d", 2, 2)]["before"] == {"a": 2, "b": 2, "v": None}  # the index columns
    assert by_index[("c", 2, 20)]["__debezium_oldkey"] == {"a": 2, "b": 2}
    assert [e["op"] for e in scenario.events("public.noth", window)] == ["c"]
    assert shapes("public.noth") == []
    scenario.assert_state_matches_source("public.def", ["id"])
    scenario.assert_state_matches_source("public.idx", ["a", "b"])
    scenario.assert_state_matches_source("public.noth", ["id"])
    ful = sorted(tuple(sorted(r.asDict().items())) for r in scenario.state("public.ful").collect())
    with db.connect() as conn:
        source = sorted(
            tuple(sorted(zip(("id", "n", "v"), (r[0], r[2], r[1])))) for r in conn.execute("SELECT id, v, n FROM ful")
        )
    assert ful == source


def test_unchanged_toast_values(db, spark, tmp_path, sink_format):
    db.execute(
        "CREATE TABLE docs (id int PRIMARY KEY, title text, body text, raw bytea, tags text[]);"
        "CREATE TABLE docs_full (id int PRIMARY KEY, title text, body text);"
        "ALTER TABLE docs_full REPLICA IDENTITY FULL;"
    )
    with db.connect() as conn:
        for i in (1, 2):
            conn.execute(
                "INSERT INTO docs VALUES (%s, 't', %s, %s, %s)",
                (i, toasted(i), toasted(i + 10).encode(), [toasted(i + 20)]),
            )
            conn.execute("INSERT INTO docs_full VALUES (%s, 't', %s)", (i, toasted(i)))
    scenario = Scenario(db, ["public.docs", "public.docs_full"], tmp_path, spark=spark, sink_format=sink_format)
    scenario.snapshot()
    with db.connect() as conn:
        conn.execute("UPDATE docs SET title = 'new title' WHERE id = 1")  # toasted columns unchanged
        conn.execute("UPDATE docs SET body = 'short now' WHERE id = 2")  # one of them changed
        conn.execute("UPDATE docs_full SET title = 'new title' WHERE id = 1")
    window = scenario.window()
    docs = {e["id"]: e for e in scenario.events("public.docs", window)}
    assert docs[1]["unchanged_toast_columns"] == ["body", "raw", "tags"]
    assert docs[1]["after"]["body"] == PLACEHOLDER
    assert docs[1]["after"]["raw"] == PLACEHOLDER.encode()
    assert docs[1]["after"]["tags"] == [PLACEHOLDER]
    assert docs[2]["unchanged_toast_columns"] == ["raw", "tags"] and docs[2]["after"]["body"] == "short now"
    (full,) = scenario.events("public.docs_full", window)
    # REPLICA IDENTITY FULL: the old row carries the value, so nothing is missing.
    assert full["unchanged_toast_columns"] is None and full["after"]["body"] == toasted(1)
    scenario.assert_state_matches_source("public.docs", ["id"])
    scenario.assert_state_matches_source("public.docs_full", ["id"])


def test_truncate_in_the_middle_of_a_window(db, spark, tmp_path, sink_format):
    db.execute(
        "CREATE TABLE parent (id serial PRIMARY KEY, v text);"
        "CREATE TABLE child (id int PRIMARY KEY, parent_id int REFERENCES parent(id));"
    )
    scenario = Scenario(db, ["public.parent", "public.child"], tmp_path, spark=spark, sink_format=sink_format)
    with db.connect() as conn:
        conn.execute("INSERT INTO parent (v) VALUES ('a'), ('b')")
        conn.execute("INSERT INTO child VALUES (1, 1)")
        with conn.transaction():
            conn.execute("UPDATE parent SET v = 'changed' WHERE id = 1")
            conn.execute("TRUNCATE parent, child RESTART IDENTITY CASCADE")
            conn.execute("INSERT INTO parent (v) VALUES ('after')")
        conn.execute("INSERT INTO child VALUES (7, 1)")
    window = scenario.window()
    parent = scenario.events("public.parent", window)
    assert [e["op"] for e in parent] == ["c", "c", "u", "t", "c"]
    truncate = parent[3]
    assert truncate["truncate"] == {"cascade": True, "restart_identity": True}
    assert truncate["before"] is None and truncate["after"] is None and truncate["id"] is None
    assert [e["op"] for e in scenario.events("public.child", window)] == ["c", "t", "c"]
    tx = [r for r in read_topic_arrow(str(scenario.sink), "t", "t.transaction").to_pylist() if r["status"] == "END"]
    truncating = next(r for r in tx if r["id"] == truncate["transaction"]["id"])
    assert {c["data_collection"]: c["event_count"] for c in truncating["data_collections"]} == {
        "public.parent": 3,
        "public.child": 1,
    }
    scenario.assert_state_matches_source("public.parent", ["id"])
    scenario.assert_state_matches_source("public.child", ["id"])


def test_logical_decoding_messages(db, tmp_path, sink_format):
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    settings = EventSettings(message_prefix_exclude=("internal\\..*",))
    scenario = Scenario(db, ["public.t"], tmp_path, settings=settings, sink_format=sink_format)
    with db.connect() as conn:
        with conn.transaction():
            conn.execute("INSERT INTO t VALUES (1)")
            conn.execute("SELECT pg_logical_emit_message(true, 'orders', 'in transaction')")
            conn.execute("SELECT pg_logical_emit_message(true, 'internal.audit', 'filtered out')")
        conn.execute("SELECT pg_logical_emit_message(false, 'heartbeat', %s::bytea)", (b"\x00\xffbin",))
    window = scenario.window()
    messages = read_topic_arrow(str(scenario.sink), "t", "t.message").to_pylist()
    assert sorted((m["prefix"], m["message"]["content"]) for m in messages) == [
        ("heartbeat", b"\x00\xffbin"),
        ("orders", b"in transaction"),
    ]
    transactional = next(m for m in messages if m["prefix"] == "orders")
    assert transactional["op"] == "m" and transactional["transaction"]["total_order"] == 2
    assert transactional["source"]["txId"] is not None and transactional["source"]["table"] == ""
    other = next(m for m in messages if m["prefix"] == "heartbeat")
    assert other["transaction"] is None and other["source"]["txId"] is None
    assert MARKER_PREFIX not in {m["prefix"] for m in messages}
    (end,) = [r for r in read_topic_arrow(str(scenario.sink), "t", "t.transaction").to_pylist() if r["status"] == "END"]
    assert end["event_count"] == 2 and {c["data_collection"] for c in end["data_collections"]} == {
        "public.t",
        "message",
    }
    assert window.stats["messages"] == 2 and window.stats["messages_skipped"] == 1


def test_schema_changes_between_and_inside_windows(db, spark, tmp_path, sink_format):
    db.execute("CREATE TABLE items (id int PRIMARY KEY, name text, qty int, legacy text)")
    scenario = Scenario(db, ["public.items"], tmp_path, spark=spark, sink_format=sink_format)
    with db.connect() as conn:
        conn.execute("INSERT INTO items SELECT g, 'item ' || g, g, 'old' FROM generate_series(1, 20) g")
    scenario.snapshot()
    with db.connect() as conn:
        conn.execute("UPDATE items SET qty = qty + 1 WHERE id <= 5")
        conn.execute("ALTER TABLE items ADD COLUMN price numeric(8,2)")  # inside the window
        conn.execute("UPDATE items SET price = 9.99 WHERE id <= 10")
        conn.execute("ALTER TABLE items ALTER COLUMN qty TYPE bigint")
        conn.execute("UPDATE items SET qty = 5000000000 WHERE id = 1")
    first = scenario.window()
    with db.connect() as conn:
        conn.execute("ALTER TABLE items DROP COLUMN legacy")  # between windows
        conn.execute("ALTER TABLE items RENAME COLUMN name TO label")
        conn.execute("UPDATE items SET label = label || '!'")  # a rename is drop + add: rewrite to refresh
        conn.execute("ALTER TABLE items ALTER COLUMN qty TYPE text")
        conn.execute("UPDATE items SET qty = 'lots' WHERE id = 2")
        conn.execute("INSERT INTO items (id, label, qty, price) VALUES (100, 'new', '7', 1)")
    scenario.window()
    import pyarrow.parquet as pq

    dataset = first.dataset("t.public.items")
    if sink_format == "parquet":
        files = sorted((scenario.sink / dataset.path).glob("*.parquet"))
        versions = {tuple((f.name, str(f.type)) for f in pq.read_schema(f).field("after").type) for f in files}
        assert len(versions) == 3  # one window, three table versions, each written as it was
    else:  # a lake table has one schema: the merge of every version, its files conformed where types changed
        from airflow_provider_cdc.cdc.basics.naming import Topic
        from airflow_provider_cdc.cdc.sinks.lake_tables import table_format

        table = table_format(sink_format, str(scenario.sink), "t").scan_arrow(Topic.for_table("t", "public", "items"))
        after = table.schema.field("after").type
        assert {f.name for f in after} == {"id", "name", "qty", "legacy", "price", "label"}
        assert str(after.field("qty").type) == "string"
    assert dataset.events == 5 + 10 + 1
    merged = read_topic_arrow(str(scenario.sink), "t", "t.public.items").schema.field("after").type
    assert {f.name for f in merged} == {"id", "name", "qty", "legacy", "price", "label"}
    assert str(merged.field("qty").type) == "string"  # int → bigint → text: merged as text
    scenario.assert_state_matches_source("public.items", ["id"], columns=["id", "label", "qty", "price"])


def test_column_filters_and_masks_apply_to_snapshot_and_stream(db, spark, tmp_path, sink_format):
    db.execute("CREATE TABLE people (id int PRIMARY KEY, email varchar(40), ssn text, note text, secret text)")
    db.execute("INSERT INTO people VALUES (1, 'a@example.com', '123-45-6789', 'long note text', 's1')")
    rules = ColumnRules.from_options(
        exclude=["public\\.people\\.secret", "public\\.people\\.id"],  # the key is kept regardless
        debezium_properties={
            "column.mask.with.5.chars": "public.people.ssn",
            "column.mask.hash.SHA-256.with.salt.pepper": "public.people.email",
            "column.truncate.to.4.chars": "public.people.note",
        },
    )
    scenario = Scenario(
        db, ["public.people"], tmp_path, spark=spark, settings=EventSettings(columns=rules), sink_format=sink_format
    )
    scenario.snapshot()
    db.execute("INSERT INTO people VALUES (2, 'b@example.com', '987-65-4321', 'another note', 's2')")
    scenario.window()
    import hashlib

    for event in scenario.events("public.people"):
        after = event["after"]
        assert set(after) == {"id", "email", "ssn", "note"}
        assert after["ssn"] == "*****" and len(after["note"]) == 4
        plain = {1: "a@example.com", 2: "b@example.com"}[after["id"]]
        assert after["email"] == hashlib.sha256(("pepper" + plain).encode()).hexdigest()[:40]


def test_column_text_list_captures_values_the_mapped_type_cannot_hold(db, spark, tmp_path, sink_format):
    from airflow_provider_cdc.cdc.sources.postgres.types import ValueConversionError

    db.execute("CREATE TABLE odd (id int PRIMARY KEY, price numeric(10,2), grid int[])")
    db.execute("INSERT INTO odd VALUES (1, 'NaN', '{{1,2},{3,4}}')")
    failing = Scenario(db, ["public.odd"], tmp_path / "a", spark=spark, sink_format=sink_format)
    with pytest.raises(ValueConversionError, match="column_text_list"):
        failing.snapshot()
    rules = ColumnRules.from_options(as_text=["public\\.odd\\.(price|grid)"])
    db.execute(f"SELECT pg_drop_replication_slot('{db.slot}')")
    scenario = Scenario(
        db, ["public.odd"], tmp_path / "b", spark=spark, settings=EventSettings(columns=rules), sink_format=sink_format
    )
    scenario.snapshot()
    db.execute("INSERT INTO odd VALUES (2, 1.5, '{{5}}')")
    scenario.window()
    assert [(e["after"]["price"], e["after"]["grid"]) for e in scenario.events("public.odd")] == [
        ("NaN", "{{1,2},{3,4}}"),
        ("1.50", "{{5}}"),
    ]
