"""Windows landed as Delta tables with delta-rs: commits, retries, schema evolution, history."""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

deltalake = pytest.importorskip("deltalake")

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError  # noqa: E402
from airflow_provider_cdc.cdc.basics.naming import Topic  # noqa: E402
from airflow_provider_cdc.cdc.basics.window import window_id_for  # noqa: E402
from airflow_provider_cdc.cdc.sinks.delta import DeltaTables, time_travel_version  # noqa: E402
from airflow_provider_cdc.cdc.sinks.formats import WindowTag  # noqa: E402
from airflow_provider_cdc.cdc.sinks.lake_tables import table_format  # noqa: E402

PREFIX = "shop"
TOPIC = Topic.for_table(PREFIX, "public", "orders")
SOURCE = pa.struct([("connector", pa.string()), ("lsn", pa.int64()), ("table", pa.string())])
V1 = pa.struct([("id", pa.int32()), ("qty", pa.int32())])


def events(seq: int, ids: list[int], value_type: pa.DataType = V1, **extra: pa.Array) -> pa.Table:
    """Change events of ``ids`` (op c) in window ``seq``; ``after`` values from ``value_type``."""

    def value(i: int) -> dict:
        return {f.name: (i if f.name == "id" else _sample(f.type, i)) for f in value_type}

    n = len(ids)
    columns = {
        "before": pa.nulls(n, value_type),
        "after": pa.array([value(i) for i in ids], value_type),
        "source": pa.array([{"connector": "postgresql", "lsn": 100 + i, "table": "orders"} for i in ids], SOURCE),
        "op": pa.array(["c"] * n),
        "ts_ms": pa.array([1_700_000_000_000 + i for i in ids], pa.int64()),
        "id": pa.array(ids, pa.int32()),
        **extra,
        "window_id": pa.array([window_id_for(seq)] * n),
    }
    return pa.table(columns)


def _sample(t: pa.DataType, i: int) -> object:
    if pa.types.is_string(t):
        return f"v{i}"
    if pa.types.is_decimal(t):
        return None
    return i * 10


def stage(base: Path, seq: int, attempt: str, *tables: pa.Table, topic: Topic = TOPIC) -> list[str]:
    directory = base / topic.directory / f"window={window_id_for(seq)}" / f"attempt={attempt}"
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for n, table in enumerate(tables, 1):
        pq.write_table(table, directory / f"part-{n:05d}.parquet")
        paths.append(str(directory / f"part-{n:05d}.parquet"))
    return paths


def tag(seq: int, attempt: str) -> WindowTag:
    return WindowTag(PREFIX, seq, window_id_for(seq), "stream", f"0/{seq}", f"0/{seq + 1}", attempt, "run-1")


def land(tables: DeltaTables, base: Path, seq: int, attempt: str, *data: pa.Table):
    return tables.commit_window(TOPIC, stage(base, seq, attempt, *data), tag(seq, attempt))


def ids_by_window(table: pa.Table | None) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for row in (table or pa.table({"window_id": [], "id": []})).select(["window_id", "id"]).to_pylist():
        out.setdefault(row["window_id"], []).append(row["id"])
    return {k: sorted(v) for k, v in out.items()}


def duck_ids(files: list[str]) -> list[int]:
    if not files:  # a table whose windows were all replaced by empty attempts (DuckDB needs a file)
        return []
    rows = duckdb.sql(f"select id from read_parquet({files!r}, union_by_name=true) order by id").fetchall()
    return [r[0] for r in rows]


@pytest.fixture
def tables(tmp_path: Path) -> DeltaTables:
    return DeltaTables(str(tmp_path), PREFIX)


def test_first_window_creates_the_table_with_file_stats_and_the_window_tag(tmp_path, tables):
    assert not tables.exists(TOPIC)
    commit = land(tables, tmp_path, 1, "a", events(1, [1, 2, 3]))
    assert tables.exists(TOPIC)
    assert (commit.format, commit.version, commit.window_seq, commit.attempt) == ("delta", 0, 1, "a")
    assert (commit.files_added, commit.rows_added, commit.files_removed) == (1, 3, 0)
    assert commit.table == str(tmp_path / TOPIC.directory)

    table = deltalake.DeltaTable(commit.table)
    (add,) = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    assert add["path"] == "window=0000000001/attempt=a/part-00001.parquet"  # registered in place
    assert add["num_records"] == 3
    assert add["min.window_id"] == add["max.window_id"] == "0000000001"
    assert (add["min.id"], add["max.id"], add["null_count.id"]) == (1, 3, 0)
    assert table.transaction_version(f"airflow-provider-cdc/{PREFIX}") == 1
    (info,) = table.history()
    assert WindowTag.from_properties(info) == tag(1, "a")
    assert tables.window_commits(TOPIC) == {1: commit}
    assert ids_by_window(tables.scan_arrow(TOPIC)) == {"0000000001": [1, 2, 3]}


def test_factory_and_configuration_errors(tmp_path):
    assert isinstance(table_format("delta", f"file://{tmp_path}", PREFIX), DeltaTables)
    assert DeltaTables(f"file://{tmp_path}", PREFIX).table_uri(TOPIC) == str(tmp_path / TOPIC.directory)
    assert DeltaTables("s3a://bucket/lake/", PREFIX).table_uri(TOPIC) == f"s3://bucket/lake/{TOPIC.directory}"
    with pytest.raises(CdcConfigurationError, match="not hdfs:// ones"):
        DeltaTables("hdfs://namenode/lake", PREFIX)
    with pytest.raises(CdcConfigurationError, match="unknown Delta option"):
        DeltaTables(str(tmp_path), PREFIX, {"endpoint": "x"})
    odd = Topic.for_table(PREFIX, "public", "my table")  # directory 'shop.public.my%20table'
    with pytest.raises(CdcConfigurationError, match="contains '%'"):
        DeltaTables(str(tmp_path), PREFIX).exists(odd)


def test_table_properties_from_options(tmp_path):
    tables = DeltaTables(str(tmp_path), PREFIX, {"delta.logRetentionDuration": "interval 7 days"})
    land(tables, tmp_path, 1, "a", events(1, [1]))
    table = deltalake.DeltaTable(tables.table_uri(TOPIC))
    assert table.metadata().configuration["delta.logRetentionDuration"] == "interval 7 days"


def test_windows_append_and_a_retry_replaces_the_earlier_attempt(tmp_path, tables):
    land(tables, tmp_path, 1, "a", events(1, [1, 2]))
    land(tables, tmp_path, 2, "a", events(2, [3, 4]), events(2, [5]))
    retried = land(tables, tmp_path, 2, "b", events(2, [3, 6]))
    assert (retried.version, retried.files_added, retried.rows_added, retried.files_removed) == (2, 1, 2, 2)

    assert ids_by_window(tables.scan_arrow(TOPIC)) == {"0000000001": [1, 2], "0000000002": [3, 6]}
    assert ids_by_window(tables.scan_arrow(TOPIC, window_seqs=[2])) == {"0000000002": [3, 6]}
    assert tables.scan_arrow(TOPIC, window_seqs=[]).num_rows == 0
    files = tables.data_files(TOPIC)
    assert sorted(Path(f).relative_to(tmp_path / TOPIC.directory).as_posix() for f in files) == [
        "window=0000000001/attempt=a/part-00001.parquet",
        "window=0000000002/attempt=b/part-00001.parquet",
    ]
    # DuckDB 2.0's delta extension cannot be installed offline: read the current files instead.
    assert duck_ids(files) == [1, 2, 3, 6]

    commits = tables.window_commits(TOPIC)
    assert {s: (c.attempt, c.version) for s, c in commits.items()} == {1: ("a", 0), 2: ("b", 2)}
    assert tables.last_window_seq(TOPIC) == 2
    table = deltalake.DeltaTable(tables.table_uri(TOPIC))
    assert [WindowTag.from_properties(h).attempt for h in table.history()] == ["b", "a", "a"]


def test_committing_the_same_attempt_again_adds_nothing(tmp_path, tables):
    files = stage(tmp_path, 1, "a", events(1, [1, 2]))
    first = tables.commit_window(TOPIC, files, tag(1, "a"))
    assert tables.commit_window(TOPIC, files, tag(1, "a")) == first
    assert deltalake.DeltaTable(tables.table_uri(TOPIC)).version() == 0
    assert tables.scan_arrow(TOPIC).num_rows == 2


def test_empty_windows(tmp_path, tables):
    assert tables.commit_window(TOPIC, [], tag(1, "a")) is None
    assert not tables.exists(TOPIC)
    land(tables, tmp_path, 1, "a", events(1, [1]))
    assert tables.commit_window(TOPIC, [], tag(2, "a")) is None
    assert deltalake.DeltaTable(tables.table_uri(TOPIC)).version() == 0
    # An empty retry still removes what the earlier attempt committed.
    emptied = tables.commit_window(TOPIC, [], tag(1, "b"))
    assert (emptied.version, emptied.files_added, emptied.files_removed) == (1, 0, 1)
    assert tables.scan_arrow(TOPIC).num_rows == 0
    assert tables.window_commits(TOPIC)[1].attempt == "b"
    assert land(tables, tmp_path, 1, "c", events(1, [5])).files_removed == 0  # a table without files
    assert ids_by_window(tables.scan_arrow(TOPIC)) == {"0000000001": [5]}


def test_columns_added_between_and_inside_windows(tmp_path, tables):
    v2 = pa.struct([("id", pa.int32()), ("qty", pa.int32()), ("note", pa.string())])
    land(tables, tmp_path, 1, "a", events(1, [1]))
    # ALTER TABLE inside window 2: one file per table version, the second with a new column.
    commit = land(tables, tmp_path, 2, "a", events(2, [2]), events(2, [3], v2, channel=pa.array(["web"])))
    table = deltalake.DeltaTable(tables.table_uri(TOPIC))
    schema = pa.schema(table.schema().to_arrow())
    assert [f.name for f in schema.field("after").type] == ["id", "qty", "note"]
    assert schema.names[-1] == "channel"
    # A data-free schema commit, then the window's commit: staged files are registered as they are.
    assert commit.version == 2
    history = table.history()
    assert WindowTag.from_properties(history[1]) is None and history[1]["cdc.schema-for"] == "2/a"
    assert sorted(Path(f).name for f in tables.data_files(TOPIC)) == ["part-00001.parquet"] * 2 + ["part-00002.parquet"]

    rows = {r["id"]: r for r in tables.scan_arrow(TOPIC).to_pylist()}
    assert rows[1]["after"] == {"id": 1, "qty": 10, "note": None} and rows[1]["channel"] is None
    assert rows[3]["after"] == {"id": 3, "qty": 30, "note": "v3"} and rows[3]["channel"] == "web"
    assert duck_ids(tables.data_files(TOPIC)) == [1, 2, 3]

    land(tables, tmp_path, 3, "a", events(3, [4]))  # an older schema again: no schema commit
    assert deltalake.DeltaTable(tables.table_uri(TOPIC)).version() == 3


def test_a_retyped_column_rewrites_the_table_once_in_one_commit(tmp_path, tables):
    text = pa.struct([("id", pa.int32()), ("qty", pa.string())])
    land(tables, tmp_path, 1, "a", events(1, [1, 2]))
    land(tables, tmp_path, 2, "a", events(2, [3]))
    # ALTER COLUMN qty TYPE text, ADD COLUMN channel
    commit = land(tables, tmp_path, 3, "a", events(3, [4], text, channel=pa.array(["web"])))
    assert (commit.version, commit.files_added, commit.files_removed) == (3, 3, 2)  # after the schema commit
    assert tables.window_commits(TOPIC)[3] == commit
    table = deltalake.DeltaTable(tables.table_uri(TOPIC))
    assert table.transaction_version(f"airflow-provider-cdc/{PREFIX}") == 3
    schema = pa.schema(table.schema().to_arrow())
    assert schema.field("after").type.field("qty").type == pa.string() and schema.names[-1] == "channel"
    rows = {r["id"]: (r["after"]["qty"], r["channel"]) for r in tables.scan_arrow(TOPIC).to_pylist()}
    assert rows == {1: ("10", None), 2: ("20", None), 3: ("30", None), 4: ("v4", "web")}
    paths = sorted(os.path.relpath(f, tables.table_uri(TOPIC)) for f in tables.data_files(TOPIC))
    # Earlier windows' files were conformed beside the originals (so retries still find them).
    assert paths[0].startswith("window=0000000001/attempt=a/") and paths[0].endswith("-conformed.parquet")
    assert paths[1].startswith("window=0000000002/attempt=a/") and paths[1].endswith("-conformed.parquet")
    assert paths[2] == "window=0000000003/attempt=a/part-00001.parquet"
    assert time_travel_version(tables.table_uri(TOPIC), 1) == 0
    land(tables, tmp_path, 1, "b", events(1, [7]))  # a retry after the rewrite replaces the rewritten file
    assert ids_by_window(tables.scan_arrow(TOPIC))["0000000001"] == [7]


def test_a_file_of_another_type_inside_a_window_is_conformed(tmp_path, tables):
    wide = pa.struct([("id", pa.int32()), ("qty", pa.int64())])
    land(tables, tmp_path, 1, "a", events(1, [1], wide))
    files = stage(tmp_path, 2, "a", events(2, [2]))  # qty int32 under the table's int64
    commit = tables.commit_window(TOPIC, files, tag(2, "a"))
    assert commit.files_added == 1 and not os.path.exists(files[0])  # the staged original is replaced
    (rewritten,) = [f for f in tables.data_files(TOPIC) if "window=0000000002" in f]
    assert pq.read_schema(rewritten).field("after").type.field("qty").type == pa.int64()
    assert {r["id"]: r["after"]["qty"] for r in tables.scan_arrow(TOPIC).to_pylist()} == {1: 10, 2: 20}


def test_types_delta_lacks(tmp_path, tables):
    ts = dt.datetime(2024, 1, 2, 3, 4, 5, 123000)
    land(
        tables,
        tmp_path,
        1,
        "a",
        events(
            1,
            [1],
            u32=pa.array([4_000_000_000], pa.uint32()),
            missing=pa.nulls(1, pa.null()),
            ts_ms=pa.array([ts], pa.timestamp("ms")),
            ts_ns=pa.array([ts], pa.timestamp("ns")),
            ts_tz=pa.array([ts], pa.timestamp("us", tz="UTC")),
        ),
    )
    table = deltalake.DeltaTable(tables.table_uri(TOPIC))
    schema = pa.schema(table.schema().to_arrow())
    assert schema.field("u32").type == pa.int64() and schema.field("missing").type == pa.string()
    assert schema.field("ts_ms").type == pa.timestamp("us") and schema.field("ts_tz").type == pa.timestamp("us", "UTC")
    assert "timestampNtz" in table.protocol().reader_features
    (row,) = tables.scan_arrow(TOPIC).to_pylist()
    assert row["u32"] == 4_000_000_000 and row["missing"] is None
    assert row["ts_ms"] == row["ts_ns"] == ts
    assert duckdb.sql(f"select u32 from read_parquet({tables.data_files(TOPIC)!r})").fetchall() == [(4_000_000_000,)]

    with pytest.raises(CdcConfigurationError, match=r"'before\.at'.*time_precision_mode"):
        land(tables, tmp_path, 2, "a", events(2, [2], pa.struct([("id", pa.int32()), ("at", pa.time64("us"))])))
    with pytest.raises(CdcConfigurationError, match=r"'span'.*interval_handling_mode"):
        land(tables, tmp_path, 3, "a", events(3, [3], span=pa.array([dt.timedelta(1)], pa.duration("us"))))
    assert deltalake.DeltaTable(tables.table_uri(TOPIC)).version() == 0


def test_time_travel_to_a_window(tmp_path, tables):
    for seq in (1, 2, 3):
        land(tables, tmp_path, seq, "a", events(seq, [seq * 10]))
    land(tables, tmp_path, 2, "b", events(2, [21, 22]))
    assert tables.version_of(TOPIC, 2) == 3 and tables.version_of(TOPIC, 9) is None
    assert time_travel_version(tables.table_uri(TOPIC), 1) == 0
    table = deltalake.DeltaTable(tables.table_uri(TOPIC))
    table.load_as_version(time_travel_version(tables.table_uri(TOPIC), 3))
    assert ids_by_window(table.to_pyarrow_table()) == {"0000000001": [10], "0000000002": [20], "0000000003": [30]}


def test_history_after_checkpoint_and_log_cleanup(tmp_path, tables):
    for seq in (1, 2, 3):
        land(tables, tmp_path, seq, "a", events(seq, [seq]))
    land(tables, tmp_path, 3, "b", events(3, [3, 33]))
    table = deltalake.DeltaTable(tables.table_uri(TOPIC))
    table.create_checkpoint()
    log = Path(tables.table_uri(TOPIC)) / "_delta_log"
    for name in ("00000000000000000000.json", "00000000000000000001.json", "00000000000000000002.json"):
        (log / name).unlink()  # what cleanup_metadata does to commits past delta.logRetentionDuration
    commits = tables.window_commits(TOPIC)
    assert commits[3].version == 3 and commits[3].attempt == "b" and commits[3].rows_added == 2
    # Windows whose commits are gone: found from the current files, at the oldest version left.
    assert {s: (c.attempt, c.version, c.files_added, c.rows_added) for s, c in commits.items() if s < 3} == {
        1: ("a", 3, 1, 1),
        2: ("a", 3, 1, 1),
    }
    assert tables.last_window_seq(TOPIC) == 3
    land(tables, tmp_path, 4, "a", events(4, [4]))
    assert tables.last_window_seq(TOPIC) == 4 and tables.scan_arrow(TOPIC).num_rows == 5


def test_maintain_compacts_and_vacuums_and_a_retry_after_compaction_still_replaces(tmp_path, tables):
    for seq in (1, 2, 3):
        land(tables, tmp_path, seq, "a", events(seq, [seq, seq + 10]))
    result = tables.maintain(TOPIC, compact=True, retain_hours=0)
    assert result["compact"]["numFilesRemoved"] == 3 and result["compact"]["numFilesAdded"] == 1
    assert len(result["vacuumed"]) == 3  # the compacted originals
    assert len(tables.data_files(TOPIC)) == 1
    assert ids_by_window(tables.scan_arrow(TOPIC)) == {
        "0000000001": [1, 11],
        "0000000002": [2, 12],
        "0000000003": [3, 13],
    }
    retried = land(tables, tmp_path, 3, "b", events(3, [99]))
    assert retried.files_removed == 1
    assert ids_by_window(tables.scan_arrow(TOPIC)) == {
        "0000000001": [1, 11],
        "0000000002": [2, 12],
        "0000000003": [99],
    }
    assert duck_ids(tables.data_files(TOPIC)) == [1, 2, 11, 12, 99]
    assert tables.maintain(Topic.for_table(PREFIX, "public", "absent"), compact=True, retain_hours=0) == {}


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(1, 4), st.lists(st.integers(0, 50), max_size=3)), min_size=1, max_size=7))
@example(steps=[(1, [0]), (1, [])])  # the table's only window replaced by an empty attempt: no data files
def test_the_table_always_holds_the_last_attempt_of_each_window(steps):
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        tables = DeltaTables(tmp, PREFIX)
        expected: dict[int, list[int]] = {}
        for n, (seq, ids) in enumerate(steps):
            files = stage(base, seq, f"a{n}", events(seq, ids)) if ids else []
            tables.commit_window(TOPIC, files, tag(seq, f"a{n}"))
            if ids or seq in expected:
                expected[seq] = sorted(ids)
        want = {window_id_for(s): ids for s, ids in expected.items() if ids}
        assert ids_by_window(tables.scan_arrow(TOPIC)) == want
        if tables.exists(TOPIC):
            assert duck_ids(tables.data_files(TOPIC)) == sorted(i for ids in want.values() for i in ids)
            assert {s: c.attempt for s, c in tables.window_commits(TOPIC).items() if expected.get(s)} == {
                s: f"a{max(n for n, (q, _) in enumerate(steps) if q == s)}" for s in expected if expected[s]
            }


def test_stats_json_is_valid_for_every_added_file(tmp_path, tables):
    land(tables, tmp_path, 1, "a", events(1, [1, 2], note=pa.array(["x" * 40, None])))
    log = Path(tables.table_uri(TOPIC)) / "_delta_log" / "00000000000000000000.json"
    (add,) = [json.loads(line)["add"] for line in log.read_text().splitlines() if '"add"' in line]
    stats = json.loads(add["stats"])
    assert stats["numRecords"] == 2 and stats["nullCount"]["note"] == 1
    assert "note" not in stats["minValues"]  # a 40-character string would need truncation
    assert stats["minValues"]["window_id"] == stats["maxValues"]["window_id"] == "0000000001"


def test_a_data_file_forged_into_the_delta_log_outside_the_table_is_refused(tmp_path):
    """A sink writer appends a ``_delta_log`` commit whose ``add.path`` climbs out of the table: the
    next window's commit read that file and wrote a conformed copy beside it, outside the sink."""
    from airflow_provider_cdc.cdc.basics.errors import CdcStateError

    sink, outside = tmp_path / "lake", tmp_path / "outside"
    sink.mkdir()
    outside.mkdir()
    tables = DeltaTables(str(sink), PREFIX)
    land(tables, sink, 1, "a", events(1, [1, 2]))
    pq.write_table(events(9, [99]), outside / "secret.parquet")
    table_dir = sink / TOPIC.directory
    relative = os.path.relpath(outside / "secret.parquet", table_dir)
    assert relative.startswith("..")
    add = {"path": relative, "size": (outside / "secret.parquet").stat().st_size, "partitionValues": {},
           "modificationTime": 1, "dataChange": True}  # fmt: skip
    (table_dir / "_delta_log" / f"{1:020d}.json").write_text(json.dumps({"add": add}) + "\n")
    with pytest.raises(CdcStateError, match=r"lists a data file .* outside it"):
        land(tables, sink, 2, "b", events(2, [3]))
    assert sorted(p.name for p in outside.iterdir()) == ["secret.parquet"]  # nothing written beside it
