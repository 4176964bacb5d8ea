"""IcebergTables against real pyiceberg tables (SQLite catalog) in tmp_path."""

from __future__ import annotations

import datetime
import shutil
import tempfile
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.basics.naming import Topic
from airflow_provider_cdc.cdc.basics.window import window_id_for
from airflow_provider_cdc.cdc.events.envelope import TRANSACTION_BLOCK, TRUNCATE_FLAGS, UNCHANGED_LIST
from airflow_provider_cdc.cdc.sinks.formats import TableCommit, WindowTag
from airflow_provider_cdc.cdc.sinks.iceberg import CONFORMED_SUFFIX, IcebergTables
from airflow_provider_cdc.cdc.sinks.lake_tables import table_format

PREFIX = "shop"
ORDERS = Topic.for_table(PREFIX, "public", "orders")
SOURCE = pa.struct(
    [
        pa.field("version", pa.string()),
        pa.field("connector", pa.string()),
        pa.field("name", pa.string()),
        pa.field("ts_ms", pa.int64()),
        pa.field("db", pa.string()),
        pa.field("schema", pa.string()),
        pa.field("table", pa.string()),
        pa.field("lsn", pa.int64()),
    ]
)
V1 = pa.struct([pa.field("id", pa.int32()), pa.field("name", pa.string())])
V2 = pa.struct([pa.field("id", pa.int32()), pa.field("name", pa.string()), pa.field("email", pa.string())])


def events(seq: int, ids: list[int], value: pa.DataType = V1, **extra: pa.Array) -> pa.Table:
    """Debezium-like events of window ``seq``: before/after structs, source, op, flat key."""
    n = len(ids)
    names = [child.name for child in value]
    after = [{k: {"id": i, "name": f"n{i}", "email": f"{i}@x"}.get(k) for k in names} for i in ids]
    source = {"version": "1", "connector": "postgresql", "name": PREFIX, "ts_ms": 1, "db": "d", "schema": "public"}
    columns = {
        "before": pa.nulls(n, value),
        "after": pa.array(after, value),
        "source": pa.array([{**source, "table": "orders", "lsn": seq * 100 + k} for k in range(n)], SOURCE),
        "op": pa.array(["c"] * n),
        "ts_ms": pa.array([seq] * n, pa.int64()),
        "transaction": pa.nulls(n, TRANSACTION_BLOCK),
        "id": pa.array(ids, pa.int32()),
        "unchanged_toast_columns": pa.array([["name"] if i % 2 else None for i in ids], UNCHANGED_LIST),
        "truncate": pa.nulls(n, TRUNCATE_FLAGS),
        **extra,
        "window_id": pa.array([window_id_for(seq)] * n),
    }
    return pa.table(columns)


def stage(base: Path, seq: int, attempt: str, *tables: pa.Table, topic: Topic = ORDERS) -> list[str]:
    """Write ``tables`` as the Parquet sink stages a window attempt's files."""
    directory = base / topic.directory / f"window={window_id_for(seq)}" / f"attempt={attempt}"
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for k, table in enumerate(tables, 1):
        pq.write_table(table, directory / f"part-{k:05d}.parquet")
        paths.append(str(directory / f"part-{k:05d}.parquet"))
    return paths


def tag(seq: int, attempt: str) -> WindowTag:
    return WindowTag(PREFIX, seq, window_id_for(seq), "stream", str(seq), str(seq + 1), attempt, run_id=f"r{seq}")


def commit(tables: IcebergTables, base: Path, seq: int, attempt: str, *data: pa.Table) -> TableCommit | None:
    return tables.commit_window(ORDERS, stage(base, seq, attempt, *data), tag(seq, attempt))


def rows(tables: IcebergTables, **kwargs: object) -> list[tuple[str, int]]:
    table = tables.scan_arrow(ORDERS, **kwargs)
    assert table is not None
    return sorted(zip(table.column("window_id").to_pylist(), table.column("id").to_pylist()))


def mapped_id(mapping: object, *path: str) -> int | None:
    """The field id the table's name mapping gives a file column at ``path``."""
    fields = list(mapping)
    for name in path:
        field = next((f for f in fields if name in f.names), None)
        if field is None:
            return None
        fields = field.fields
    return field.field_id


@pytest.fixture
def tables(tmp_path: Path) -> IcebergTables:
    return IcebergTables(str(tmp_path), PREFIX)


def test_first_window_creates_the_table_in_the_dataset_directory(tables, tmp_path):
    assert not tables.exists(ORDERS) and tables.scan_arrow(ORDERS) is None
    result = commit(tables, tmp_path, 1, "a", events(1, [1, 2, 3]))

    table = tables.load(ORDERS)
    assert tables.exists(ORDERS) and table is not None
    assert table.name()[-3:] == ("shop", "public", "orders")
    assert table.location() == str(tmp_path / ORDERS.directory) == tables.table_uri(ORDERS)
    assert list((tmp_path / ORDERS.directory / "metadata").glob("*.metadata.json"))
    assert (tmp_path / "_cdc_catalog" / "iceberg.db").exists()
    assert result == TableCommit("iceberg", "shop.public.orders", table.current_snapshot().snapshot_id, 1, "a", 1, 3)
    summary = table.current_snapshot().summary
    assert summary.operation.value == "append"
    assert WindowTag.from_properties(summary.additional_properties) == tag(1, "a")
    assert [f.name for f in table.spec().fields] == ["window_id_trunc"]
    assert rows(tables) == [("0000000001", 1), ("0000000001", 2), ("0000000001", 3)]
    # registered in place, not rewritten
    staged = tmp_path / ORDERS.directory / "window=0000000001/attempt=a/part-00001.parquet"
    assert tables.data_files(ORDERS) == [str(staged)]
    first = tables.scan_arrow(ORDERS).to_pylist()[0]
    assert first["after"] == {"id": 1, "name": "n1"} and first["source"]["lsn"] == 100


def test_table_format_factory_and_side_topics(tmp_path):
    tables = table_format("iceberg", f"file://{tmp_path}", PREFIX)
    assert isinstance(tables, IcebergTables) and tables.base_path == str(tmp_path)
    transactions = Topic.transactions(PREFIX)
    tx = pa.table({"status": ["BEGIN"], "id": ["7"], "window_id": ["0000000001"]})
    tables.commit_window(transactions, stage(tmp_path, 1, "a", tx, topic=transactions), tag(1, "a"))
    assert tables.load(transactions).name()[-2:] == ("shop", "transaction")
    assert tables.scan_arrow(transactions).to_pylist() == [{"status": "BEGIN", "id": "7", "window_id": "0000000001"}]


def test_windows_append_and_a_retry_replaces_the_earlier_attempt(tables, tmp_path):
    commit(tables, tmp_path, 1, "a", events(1, [1, 2]))
    commit(tables, tmp_path, 2, "a", events(2, [3, 4]))
    retried = commit(tables, tmp_path, 2, "b", events(2, [5]), events(2, [6]))

    expected = [("0000000001", 1), ("0000000001", 2), ("0000000002", 5), ("0000000002", 6)]
    assert rows(tables) == expected
    assert retried.files_added == 2 and retried.rows_added == 2 and retried.files_removed == 1
    snapshot = tables.load(ORDERS).current_snapshot()
    assert retried.version == snapshot.snapshot_id and snapshot.summary.operation.value == "overwrite"
    assert len(tables.load(ORDERS).snapshots()) == 3  # one snapshot per window commit, add + delete together
    assert rows(tables, window_seqs=[2]) == expected[2:]
    assert rows(tables, window_seqs=[]) == []
    files = tables.data_files(ORDERS)
    assert sorted(Path(f).parent.name for f in files) == ["attempt=a", "attempt=b", "attempt=b"]

    # Another engine reads the same files: duckdb's iceberg extension needs a download (no
    # network here), so read the current snapshot's data files with read_parquet.
    metadata = tables.load(ORDERS).metadata_location
    try:
        duckdb.sql(f"select count(*) from iceberg_scan('{metadata}')").fetchall()
        via_iceberg = True
    except duckdb.Error:
        via_iceberg = False
    listed = ", ".join(f"'{f}'" for f in files)
    got = duckdb.sql(f"select window_id, id from read_parquet([{listed}], union_by_name=true) order by 1, 2").fetchall()
    assert got == expected, via_iceberg


def test_retry_with_no_files_removes_the_window_and_an_empty_window_commits_nothing(tables, tmp_path):
    assert tables.commit_window(ORDERS, [], tag(1, "a")) is None
    assert not tables.exists(ORDERS)
    commit(tables, tmp_path, 1, "a", events(1, [1]))
    commit(tables, tmp_path, 2, "a", events(2, [2]))
    assert tables.commit_window(ORDERS, [], tag(3, "a")) is None
    assert len(tables.load(ORDERS).snapshots()) == 2

    emptied = tables.commit_window(ORDERS, [], tag(2, "b"))
    assert emptied is not None and emptied.files_removed == 1 and emptied.files_added == 0
    assert rows(tables) == [("0000000001", 1)]
    assert not tables.holds_window(ORDERS, 2) and tables.holds_window(ORDERS, 1)


def test_committing_the_same_attempt_again_changes_nothing(tables, tmp_path):
    first = commit(tables, tmp_path, 1, "a", events(1, [1, 2]))
    again = commit(tables, tmp_path, 1, "a", events(1, [1, 2]))
    assert again == first
    assert len(tables.load(ORDERS).snapshots()) == 1 and len(rows(tables)) == 2


def test_a_snapshot_made_by_another_writer_keeps_retries_correct(tables, tmp_path):
    commit(tables, tmp_path, 1, "a", events(1, [1]))
    foreign = stage(tmp_path, 3, "elsewhere", events(3, [30]))
    tables.load(ORDERS).add_files(foreign)  # no cdc.newest-window-seq: the next commits look up
    commit(tables, tmp_path, 3, "a", events(3, [31]))
    commit(tables, tmp_path, 2, "a", events(2, [2]))
    commit(tables, tmp_path, 3, "b", events(3, [32]))
    assert rows(tables) == [("0000000001", 1), ("0000000002", 2), ("0000000003", 32)]


def test_history_tags_and_time_travel_to_a_window(tables, tmp_path):
    commit(tables, tmp_path, 1, "a", events(1, [1]))
    commit(tables, tmp_path, 2, "a", events(2, [2]))
    commit(tables, tmp_path, 2, "b", events(2, [3]))
    commit(tables, tmp_path, 3, "a", events(3, [4]))

    commits = tables.window_commits(ORDERS)
    assert sorted(commits) == [1, 2, 3]
    assert commits[2].attempt == "b" and commits[2].files_removed == 1 and commits[2].rows_added == 1
    snapshot = tables.window_snapshot(ORDERS, 2)
    assert snapshot == commits[2].version and tables.window_snapshot(ORDERS, 9) is None
    assert rows(tables, snapshot_id=snapshot) == [("0000000001", 1), ("0000000002", 3)]
    assert rows(tables, snapshot_id=commits[1].version) == [("0000000001", 1)]


def test_schema_evolves_by_the_merge_rules_and_the_name_mapping_follows(tables, tmp_path):
    commit(tables, tmp_path, 1, "a", events(1, [1]))
    # window 2: a table version with a new column inside before/after, and a new top-level column
    commit(tables, tmp_path, 2, "a", events(2, [2], V2, note=pa.array(["hi"])))
    # window 3: an ALTER inside the window, i.e. two files of different schemas
    commit(tables, tmp_path, 3, "a", events(3, [3]), events(3, [4], V2))

    table = tables.load(ORDERS)
    mapping = table.metadata.name_mapping()
    assert mapped_id(mapping, "after", "email") == table.schema().find_field("after.email").field_id
    assert mapped_id(mapping, "note") == table.schema().find_field("note").field_id
    got = {r["id"]: (r["after"].get("email"), r.get("note")) for r in tables.scan_arrow(ORDERS).to_pylist()}
    assert got == {1: (None, None), 2: ("2@x", "hi"), 3: (None, None), 4: ("4@x", None)}
    # every file registered as written: no type needed a rewrite
    assert not [f for f in tables.data_files(ORDERS) if f.endswith(CONFORMED_SUFFIX)]


def test_an_incompatible_type_change_rewrites_what_cannot_be_read(tables, tmp_path):
    as_text = pa.struct([pa.field("id", pa.string()), pa.field("name", pa.string())])
    commit(tables, tmp_path, 1, "a", events(1, [1]))
    # after.id int → text: Iceberg cannot promote it, so the field is replaced and window 1's
    # file (the only one holding the int) is rewritten as text in the same commit
    window2 = events(2, [2]).set_column(1, "after", pa.array([{"id": "two", "name": "n2"}], as_text))
    result = commit(tables, tmp_path, 2, "a", window2)
    assert str(tables.load(ORDERS).schema().find_field("after.id").field_type) == "string"
    got = {r["window_id"]: r["after"]["id"] for r in tables.scan_arrow(ORDERS).to_pylist()}
    assert got == {"0000000001": "1", "0000000002": "two"}
    assert len(tables.load(ORDERS).snapshots()) == 2 and result.files_added == 1 and result.rows_added == 1
    rewritten = [f for f in tables.data_files(ORDERS) if f.endswith(CONFORMED_SUFFIX)]
    assert len(rewritten) == 1 and "/window=0000000001/attempt=a/" in rewritten[0]

    # back to int in window 3: the table stays text, the new file is conformed beside the original
    commit(tables, tmp_path, 3, "a", events(3, [3]))
    got = {r["window_id"]: r["after"]["id"] for r in tables.scan_arrow(ORDERS).to_pylist()}
    assert got["0000000003"] == "3"
    window3 = [Path(f).name for f in tables.data_files(ORDERS) if "/window=0000000003/attempt=a/" in f]
    assert window3 == ["part-00001" + CONFORMED_SUFFIX]


def test_types_iceberg_cannot_store_are_cast_losslessly_or_refused(tables, tmp_path):
    ts_ns = pa.array([1_700_000_000_123_456_000], pa.timestamp("ns"))
    odd = events(
        1,
        [1],
        small=pa.array([7], pa.int16()),
        tiny=pa.array([7], pa.int8()),
        ms=pa.array([1_700_000_000_123], pa.timestamp("ms", tz="UTC")),
        unsigned=pa.array([4_000_000_000], pa.uint32()),
        huge=pa.array([2**64 - 1], pa.uint64()),
        half=pa.array([1.5], pa.float16()),
        nothing=pa.nulls(1),
        clock=pa.array([1000], pa.time32("ms")),
        ns=ts_ns,
        tags=pa.array([[("a", "1")]], pa.map_(pa.string(), pa.string())),
    )
    commit(tables, tmp_path, 1, "a", odd)
    row = tables.scan_arrow(ORDERS).to_pylist()[0]
    assert (row["small"], row["tiny"], row["unsigned"], row["half"]) == (7, 7, 4_000_000_000, 1.5)
    assert int(row["huge"]) == 2**64 - 1 and "nothing" not in row and row["tags"] == [("a", "1")]
    assert row["unchanged_toast_columns"] == ["name"]
    assert row["ms"] == datetime.datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=datetime.timezone.utc)
    assert row["clock"] == datetime.time(0, 0, 1) and row["ns"] == datetime.datetime(2023, 11, 14, 22, 13, 20, 123456)
    schema = tables.load(ORDERS).schema()
    assert str(schema.find_field("huge").field_type) == "decimal(20, 0)"
    assert [Path(f).name for f in tables.data_files(ORDERS)] == ["part-00001" + CONFORMED_SUFFIX]

    # a listing of the attempt that also holds the conformed copy registers it once
    again = stage(tmp_path, 5, "b", events(5, [5], unsigned=pa.array([1], pa.uint32())))
    shutil.copy(again[0], again[0].replace(".parquet", CONFORMED_SUFFIX))
    tables.commit_window(ORDERS, [again[0], again[0].replace(".parquet", CONFORMED_SUFFIX)], tag(5, "b"))
    assert rows(tables, window_seqs=[5]) == [("0000000005", 5)]

    # int16 and ms timestamps alone are read as Iceberg int and timestamp: registered as written
    commit(tables, tmp_path, 2, "a", events(2, [2], small=pa.array([8], pa.int16()), ms=odd.column("ms")))
    assert [Path(f).name for f in tables.data_files(ORDERS) if "window=0000000002" in f] == ["part-00001.parquet"]

    lossy = events(3, [3], ns=pa.array([1_700_000_000_123_456_789], pa.timestamp("ns")))
    with pytest.raises(CdcConfigurationError, match=r"column 'ns' .*time_precision_mode"):
        commit(tables, tmp_path, 3, "a", lossy)
    wide = events(4, [4], amount=pa.array([1], pa.decimal256(40, 2)))
    with pytest.raises(CdcConfigurationError, match=r"'amount'.*decimal_handling_mode"):
        commit(tables, tmp_path, 4, "a", wide)
    assert sorted(tables.window_commits(ORDERS)) == [1, 2, 5]  # the refused windows committed nothing


def test_maintain_compacts_expires_and_deletes_unreachable_files(tables, tmp_path):
    for seq in range(1, 5):
        commit(tables, tmp_path, seq, "a", events(seq, [seq]), events(seq, [seq + 10]))
    commit(tables, tmp_path, 4, "b", events(4, [40]))
    before = rows(tables)
    old_attempt = tmp_path / ORDERS.directory / "window=0000000004/attempt=a/part-00001.parquet"
    assert old_attempt.exists()

    done = tables.maintain(ORDERS, compact=True)
    assert done["files_compacted"] == 7 and done["files_written"] == 1
    assert rows(tables) == before and len(tables.data_files(ORDERS)) == 1
    assert tables.holds_window(ORDERS, 3) and not tables.holds_window(ORDERS, 5)

    # a retry of a compacted window: its rows leave the merged file, the other windows stay
    commit(tables, tmp_path, 2, "c", events(2, [22]))
    after_retry = sorted([r for r in before if r[0] != "0000000002"] + [("0000000002", 22)])
    assert rows(tables) == after_retry
    assert tables.window_commits(ORDERS)[2].attempt == "c"

    done = tables.maintain(ORDERS, retain_hours=-1 / 3600, compact=False)
    table = tables.load(ORDERS)
    assert done["snapshots_expired"] == 6  # windows 1-4, retry 4b, compaction (retry 2c is current)
    assert len(table.snapshots()) == 1 and done["files_deleted"] >= 10
    assert not old_attempt.exists()
    assert all(Path(f).exists() for f in tables.data_files(ORDERS))
    assert rows(tables) == after_retry
    # expiry took the window tags with the snapshots; the rows are still found, and replaced by a retry
    assert list(tables.window_commits(ORDERS)) == [2] and tables.holds_window(ORDERS, 1)
    commit(tables, tmp_path, 3, "d", events(3, [33]))
    assert rows(tables, window_seqs=[3]) == [("0000000003", 33)] and len(rows(tables)) == len(after_retry) - 1


def test_catalog_options_never_leak_credentials(tmp_path):
    options = {"type": "sql", "uri": "postgresql+psycopg://capture:s3cr3t-pw@127.0.0.1:1/cat", "password": "s3cr3t-pw"}
    tables = IcebergTables(str(tmp_path), PREFIX, options)
    assert "s3cr3t" not in repr(tables)
    with pytest.raises(CdcConfigurationError) as caught:
        tables.exists(ORDERS)
    assert "s3cr3t" not in str(caught.value) and caught.value.__cause__ is None


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(1, 4), st.lists(st.integers(0, 99), max_size=3)), min_size=1, max_size=7))
def test_the_table_always_holds_the_last_attempt_of_each_window(history):
    with tempfile.TemporaryDirectory() as directory:
        base = Path(directory)
        tables = IcebergTables(directory, PREFIX)
        last: dict[int, list[int]] = {}
        committer: dict[int, str] = {}  # the attempt whose commit holds each window
        for n, (seq, ids) in enumerate(history):
            files = stage(base, seq, f"t{n}", events(seq, ids)) if ids else []
            commit = tables.commit_window(ORDERS, files, tag(seq, f"t{n}"))
            # An attempt commits when it adds files or replaces an earlier attempt's; an empty
            # attempt of a window the table holds nothing of makes no commit.
            assert (commit is not None) == bool(ids or last.get(seq))
            if commit is not None:
                committer[seq] = f"t{n}"
            last[seq] = ids
        expected = sorted((window_id_for(seq), i) for seq, ids in last.items() for i in ids)
        assert (rows(tables) if tables.exists(ORDERS) else []) == expected
        commits = tables.window_commits(ORDERS)
        assert {seq: c.attempt for seq, c in commits.items()} == committer


def test_commit_overhead_against_writing_the_files(tables, tmp_path):
    commit(tables, tmp_path, 1, "a", events(1, [1]))
    data = [events(2, list(range(k * 50_000, (k + 1) * 50_000))) for k in range(3)]
    started = time.perf_counter()
    files = stage(tmp_path, 2, "a", *data)
    written = time.perf_counter() - started
    started = time.perf_counter()
    tables.commit_window(ORDERS, files, tag(2, "a"))
    committed = time.perf_counter() - started
    print(f"\nwrite 3 files x 50k events: {written * 1000:.0f} ms; iceberg commit: {committed * 1000:.0f} ms")
    assert len(rows(tables, window_seqs=[2])) == 150_000
