"""Current state by MERGE (Iceberg, Delta) equals today's rebuild (``state.fold`` of every event).

Events are built window by window as the capture writes them (PostgreSQL's event layout, one
Parquet file per window) and read back as the state job reads them; after every window the state
table, read with pyiceberg / deltalake (and with duckdb over its data files), must equal the fold
of all events since the last snapshot window, as ``apply_windows`` rebuilds it.
"""

from __future__ import annotations

import datetime as dt
import tempfile
import uuid
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_cdc.cdc.basics.errors import CdcStateError
from airflow_provider_cdc.cdc.events.envelope import EventLayout
from airflow_provider_cdc.cdc.sinks.formats import WindowTag
from airflow_provider_cdc.cdc.sinks.spark_files import spark_read_merged
from airflow_provider_cdc.cdc.sources.postgres.events import SOURCE_BLOCK
from airflow_provider_cdc.cdc.state.arrow import ArrowFold, read_parquet_arrow
from airflow_provider_cdc.cdc.state.delta_table import DeltaStateTable
from airflow_provider_cdc.cdc.state.iceberg_table import IcebergStateTable
from airflow_provider_cdc.cdc.state.merge import merge_windows, read_state_as_of
from airflow_provider_cdc.cdc.state.spark_fold import fold
from airflow_provider_cdc.cdc.state.table_rows import plain_types
from airflow_provider_cdc.cdc.state.tables import StateTable

pytestmark = pytest.mark.spark

FORMATS = ("iceberg", "delta")
TOAST = "__debezium_unavailable_value"


class EventLog:
    """One captured table's change events, committed window by window as Parquet files."""

    def __init__(self, directory: Path, columns: dict[str, pa.DataType], keys: Sequence[str] = ()):
        self.directory = directory
        self.keys = tuple(keys)
        self.set_columns(columns)
        self.seq, self.lsn = 0, 1000
        self.kinds: dict[int, str] = {}
        self.paths: dict[int, str] = {}
        self.pending: list[dict] = []
        self._read: dict[tuple[int, int], Any] = {}

    def set_columns(self, columns: dict[str, pa.DataType]) -> None:
        """The table's columns from now on (an ALTER TABLE: later windows have this schema)."""
        self.layout = EventLayout(tuple(pa.field(n, t) for n, t in columns.items()), self.keys, SOURCE_BLOCK)

    # -- changes ---------------------------------------------------------------------------------

    def snapshot(self, rows: Sequence[dict]) -> int:
        self.pending = [self._event("r", None, row, snapshot="true", order=None) for row in rows]
        return self.commit("snapshot")

    def insert(self, row: dict) -> None:
        self._transaction([("c", None, row, {})])

    def update(self, before: dict, after: dict, unchanged: Sequence[str] = ()) -> None:
        """An UPDATE; ``unchanged`` TOAST columns carry the placeholder (their value is not in the WAL)."""
        old = before if not self.keys else None  # REPLICA IDENTITY DEFAULT: no before image
        self._transaction([("u", old, self._toasted(after, unchanged), {"unchanged": list(unchanged) or None})])

    def delete(self, row: dict) -> None:
        self._transaction([("d", self._identity(row), None, {})])

    def move(self, before: dict, after: dict, unchanged: Sequence[str] = ()) -> None:
        """A primary-key change: a delete of the old key then a create of the new one."""
        old, new = self._key(before), self._key(after)
        self._transaction(
            [
                ("d", self._identity(before), None, {"newkey": new}),
                ("c", None, self._toasted(after, unchanged), {"oldkey": old, "unchanged": list(unchanged) or None}),
            ]
        )

    def truncate(self) -> None:
        self._transaction([("t", None, None, {"truncate": {"cascade": False, "restart_identity": False}})])

    def commit(self, kind: str = "stream") -> int:
        self.seq += 1
        window_id = f"{self.seq:010d}"
        rows = [{**e, "window_id": window_id} for e in self.pending]
        self.pending = []
        path = self.directory / f"window={window_id}"
        path.mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(rows, schema=self.layout.schema), path / "part-0.parquet")
        self.kinds[self.seq], self.paths[self.seq] = kind, str(path)
        return self.seq

    # -- reading back ----------------------------------------------------------------------------

    def events(self, spark: Any, upto: int | None = None, since: int = 1) -> Any:
        """The events of windows ``since`` to ``upto`` (default: all), read as the state job reads
        the pending windows' files (schemas merged by name over those files only)."""
        span = (since, upto or self.seq)
        if span not in self._read:
            self._read[span] = spark_read_merged(spark, [p for s, p in self.paths.items() if span[0] <= s <= span[1]])
        return self._read[span]

    def events_arrow(self, since: int = 1) -> Any:
        """The same events, read as the Arrow engine reads them (state_arrow.read_parquet_arrow)."""
        return read_parquet_arrow([p for s, p in self.paths.items() if since <= s <= self.seq])

    def last_snapshot(self, upto: int) -> int:
        return max((s for s, k in self.kinds.items() if k == "snapshot" and s <= upto), default=1)

    def rebuild(self, spark: Any, upto: int | None = None) -> list[tuple]:
        """Today's state: the fold of every event since the last snapshot window (no base)."""
        upto = upto or self.seq
        return rows_of(plain_types(fold(spark, self.events(spark, upto, self.last_snapshot(upto)), None).toArrow()))

    def tag(self, seq: int | None = None) -> WindowTag:
        seq = seq or self.seq
        return WindowTag("t", seq, f"{seq:010d}", self.kinds[seq], None, None, "attempt1")

    # -- internals -------------------------------------------------------------------------------

    def _transaction(self, changes: list[tuple]) -> None:
        self.lsn += 100
        for order, (op, before, after, extra) in enumerate(changes, start=1):
            self.pending.append(self._event(op, before, after, order=order, **extra))

    def _event(
        self, op, before, after, *, order, snapshot="false", oldkey=None, newkey=None, unchanged=None, truncate=None
    ):
        image = after or before or {}
        flat = {flat: image.get(key) for key, flat in self.layout.flat_key_names.items()}
        source = {"version": "t", "connector": "postgresql", "name": "t", "ts_ms": 0, "snapshot": snapshot}
        source.update({"db": "db", "schema": "public", "table": "t", "lsn": self.lsn, "commit_lsn": self.lsn})
        event = {
            "before": before,
            "after": after,
            "source": source,
            "op": op,
            "ts_ms": 0,
            "transaction": None if order is None else {"id": str(self.lsn), "total_order": order},
            **flat,
            "unchanged_toast_columns": unchanged,
            "truncate": truncate,
        }
        if self.keys:
            event.update({"__debezium_oldkey": oldkey, "__debezium_newkey": newkey})
        return event

    def _key(self, row: dict) -> dict:
        return {k: row[k] for k in self.keys}

    def _identity(self, row: dict) -> dict:
        """The before image of a delete: the key (REPLICA IDENTITY DEFAULT) or the row (FULL)."""
        return {**dict.fromkeys(row), **self._key(row)} if self.keys else row

    @staticmethod
    def _toasted(row: dict, unchanged: Sequence[str]) -> dict:
        return {k: (TOAST if k in unchanged else v) for k, v in row.items()}


def rows_of(table: pa.Table) -> list[tuple]:
    """A table's rows as comparable tuples of (column, value) pairs, in a stable order."""
    return sorted((tuple(sorted(r.items())) for r in table.to_pylist()), key=repr)


def state_table(fmt: str, directory: Path, name: str = "docs", **options: Any) -> StateTable:
    if fmt == "iceberg":
        return IcebergStateTable(
            directory / "catalog.db", f"state.{name}", f"file://{directory}/iceberg/{name}", **options
        )
    return DeltaStateTable(str(directory / "delta" / name), **options)


def duckdb_rows(state: StateTable) -> list[tuple]:
    """The state as a third-party engine reads it: duckdb's read_parquet over the current data
    files (both formats are copy-on-write here: no delete files or deletion vectors)."""
    import duckdb

    files = [f.removeprefix("file://") for f in state.data_files()]
    table = duckdb.sql("SELECT * FROM read_parquet($files, union_by_name = true)", params={"files": files}).arrow()
    return rows_of(plain_types(table.read_all() if hasattr(table, "read_all") else table))


def apply(spark, log: EventLog, states: dict[str, StateTable], **kwargs: Any) -> dict[str, Any]:
    """Merge the newest window into every state table; each must then equal the rebuild."""
    expected = log.rebuild(spark)
    results = {}
    for fmt, state in states.items():
        # The pending window's events, as apply_windows reads them; "<format>+arrow": the Arrow engine's.
        arrow = fmt.endswith("+arrow")
        events = log.events_arrow(since=log.seq) if arrow else log.events(spark, since=log.seq)
        engine = ArrowFold() if arrow else None
        results[fmt] = merge_windows(
            spark, events, state, tag=log.tag(), keys=log.keys or None, engine=engine, **kwargs
        )
        assert rows_of(state.read_version()) == expected, f"{fmt} after window {log.seq}: {results[fmt]}"
    return results


# -- the core: every kind of change, window after window ----------------------------------------


@pytest.mark.slow
def test_merge_equals_the_rebuild_after_every_window(spark, tmp_path):
    log = EventLog(tmp_path / "events", {"id": pa.int32(), "title": pa.string(), "body": pa.string()}, ["id"])
    states = {fmt: state_table(fmt, tmp_path, target_file_size=4096) for fmt in FORMATS}
    # The same windows merged by the Arrow engine (state_arrow.ArrowFold) into tables of their own.
    states |= {f"{fmt}+arrow": state_table(fmt, tmp_path / "arrow", target_file_size=4096) for fmt in FORMATS}
    doc = {i: {"id": i, "title": f"doc {i}", "body": f"body {i}" * 50} for i in range(1, 9)}

    log.snapshot(list(doc.values()))
    assert {r.reason for r in apply(spark, log, states).values()} == {"snapshot"}

    log.insert({"id": 9, "title": "new", "body": "small"})
    log.update(doc[1], {**doc[1], "title": "renamed"})
    log.delete(doc[3])
    log.update(doc[2], {**doc[2], "title": "gone soon"})
    log.delete(doc[2])
    log.insert({"id": 10, "title": "ten", "body": "b"})
    log.update({}, {"id": 10, "title": "ten again", "body": "b"})
    log.commit()
    results = apply(spark, log, states)
    assert {r.action for r in results.values()} == {"merged"}
    assert {r.rows_deleted for r in results.values()} == {2}

    log.update(doc[4], {**doc[4], "title": "toast kept"}, unchanged=["body"])
    log.move(doc[5], {**doc[5], "id": 50, "title": "moved"}, unchanged=["body"])  # body from the old key
    log.move(doc[6], {**doc[6], "id": 60})
    log.update({}, {**doc[6], "id": 60, "title": "moved, then toast"}, unchanged=["body"])
    log.insert({"id": 11, "title": "short-lived", "body": ""})
    log.delete({"id": 11})
    log.commit()
    apply(spark, log, states)
    current = {r["id"]: r for r in states["delta"].read_version().to_pylist()}
    assert current[50]["body"] == doc[5]["body"] and 5 not in current
    assert current[4]["body"] == doc[4]["body"] and current[60]["body"] == doc[6]["body"]

    # ALTER TABLE ADD COLUMN: later events have the column; rows not changed since keep null.
    log.set_columns({"id": pa.int32(), "title": pa.string(), "body": pa.string(), "tags": pa.list_(pa.string())})
    log.update({}, {"id": 1, "title": "tagged", "body": "b1", "tags": ["a", "b"]})
    log.insert({"id": 12, "title": "twelve", "body": "b", "tags": []})
    log.commit()
    apply(spark, log, states)
    assert "tags" in states["iceberg"].schema().names and "tags" in states["delta"].schema().names
    for state in states.values():
        assert duckdb_rows(state) == rows_of(state.read_version())

    log.commit()  # a window without events of this table
    assert {r.action for r in apply(spark, log, states).values()} == {"empty"}

    log.update({}, {"id": 7, "title": "before the truncate", "body": "x", "tags": None})
    log.truncate()
    log.insert({"id": 100, "title": "after", "body": "big" * 100, "tags": None})
    log.update({}, {"id": 100, "title": "after, toast", "body": TOAST, "tags": ["t"]}, unchanged=["body"])
    log.commit()
    assert {r.reason for r in apply(spark, log, states).values()} == {"truncate"}

    log.insert({"id": 101, "title": "b", "body": "b", "tags": None})
    log.move({"id": 100}, {"id": 200, "title": "moved after truncate", "body": TOAST, "tags": None}, unchanged=["body"])
    log.commit()
    apply(spark, log, states)

    # A re-snapshot after the table lost its tags column: a complete image, schema included.
    log.set_columns({"id": pa.int32(), "title": pa.string(), "body": pa.string()})
    log.snapshot([{"id": i, "title": f"re {i}", "body": "r"} for i in (1, 200, 300)])
    assert {r.reason for r in apply(spark, log, states).values()} == {"snapshot"}
    assert "tags" not in states["iceberg"].schema().names

    log.update({}, {"id": 300, "title": "after the re-snapshot", "body": "r"})
    log.commit()
    apply(spark, log, states)
    for fmt, state in states.items():
        assert duckdb_rows(state) == log.rebuild(spark), fmt
        # Applying windows the table already holds changes nothing.
        version = state.version_for_window(log.seq)
        again = merge_windows(spark, log.events(spark), state, tag=log.tag(), keys=["id"])
        assert again.action == "unchanged" and state.version_for_window(log.seq) == version
        assert merge_windows(spark, log.events(spark), state, tag=log.tag(log.seq - 1)).action == "unchanged"


def test_composite_keys_of_several_types(spark, tmp_path):
    columns = {
        "tenant": pa.int64(),
        "code": pa.string(),
        "uid": pa.string(),  # a uuid, as text
        "at": pa.timestamp("us"),
        "amount": pa.decimal128(10, 2),
        "note": pa.string(),
    }
    keys = ["tenant", "code", "uid", "at"]
    log = EventLog(tmp_path / "events", columns, keys)
    states = {fmt: state_table(fmt, tmp_path, "ledger") for fmt in FORMATS}
    start = dt.datetime(2026, 1, 1, 8, 30, 0, 123456)

    def row(i: int, tenant: int = 1, **changes: Any) -> dict:
        uid = str(uuid.UUID(int=i * 7919))
        base = {"tenant": tenant, "code": f"o'c{i % 3}", "uid": uid, "at": start + dt.timedelta(minutes=i)}
        return {**base, "amount": Decimal(f"{i}.25"), "note": f"note {i}" * 20, **changes}

    rows = [row(i, tenant=1 + i % 2) for i in range(12)]
    log.snapshot(rows)
    apply(spark, log, states)

    log.update({}, {**rows[0], "amount": Decimal("99.99")})
    log.update({}, {**rows[1], "amount": Decimal("1.00")}, unchanged=["note"])
    log.delete(rows[2])
    log.insert(row(20, tenant=2))
    log.move(rows[3], {**rows[3], "at": rows[3]["at"] + dt.timedelta(days=1)}, unchanged=["note"])
    log.move(rows[4], {**rows[4], "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, "moved")), "code": "moved"})
    log.commit()
    results = apply(spark, log, states)
    assert {r.action for r in results.values()} == {"merged"}
    assert {r.affected_keys for r in results.values()} == {8}  # 6 keys changed, 2 of them moved

    log.delete({**rows[3], "at": rows[3]["at"] + dt.timedelta(days=1)})
    log.update({}, {**rows[5], "tenant": 1, "note": "same key, other values"})
    log.commit()
    apply(spark, log, states)
    for state in states.values():
        assert duckdb_rows(state) == log.rebuild(spark)


def test_keyless_tables_are_rewritten_as_multisets(spark, tmp_path):
    log = EventLog(tmp_path / "events", {"doc": pa.int32(), "tag": pa.string()})
    states = {fmt: state_table(fmt, tmp_path, "tags") for fmt in FORMATS}
    log.snapshot([{"doc": 1, "tag": "a"}, {"doc": 1, "tag": "a"}, {"doc": 2, "tag": "b"}])
    apply(spark, log, states)

    log.delete({"doc": 1, "tag": "a"})  # one of two equal rows
    log.update({"doc": 2, "tag": "b"}, {"doc": 2, "tag": "c"})
    log.insert({"doc": 3, "tag": "c"})
    log.insert({"doc": 3, "tag": "c"})
    log.commit()
    results = apply(spark, log, states)
    assert {(r.action, r.reason) for r in results.values()} == {("rewritten", "keyless")}
    expected = [{"doc": 1, "tag": "a"}, {"doc": 2, "tag": "c"}, {"doc": 3, "tag": "c"}, {"doc": 3, "tag": "c"}]
    assert rows_of(states["iceberg"].read_version()) == rows_of(pa.Table.from_pylist(expected))
    # Applying the window again would count its rows twice: the tag says it is already held.
    again = merge_windows(spark, log.events(spark), states["delta"], tag=log.tag())
    assert again.action == "unchanged"
    assert rows_of(states["delta"].read_version()) == log.rebuild(spark)


# -- what a window touches ------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_window_rewrites_only_the_files_of_its_keys(spark, tmp_path, fmt):
    log = EventLog(tmp_path / "events", {"id": pa.int64(), "status": pa.string(), "note": pa.string()}, ["id"])
    state = state_table(fmt, tmp_path, target_file_size=64 * 1024, row_group_rows=1000)
    log.snapshot([{"id": i, "status": "new", "note": f"order {i} " * 4} for i in range(20_000)])
    merge_windows(spark, log.events(spark), state, tag=log.tag())
    before = set(state.data_files())
    assert len(before) >= 5, before

    for i in range(19_990, 20_000):  # recent orders: the last file's keys
        log.update({}, {"id": i, "status": "shipped", "note": f"order {i} " * 4})
    log.delete({"id": 19_995})
    log.commit()
    result = merge_windows(spark, log.events(spark), state, tag=log.tag())
    after = set(state.data_files())
    assert result.action == "merged" and result.commit.files_removed == 1, result
    assert len(before - after) == 1 and len(before & after) == len(before) - 1
    assert rows_of(state.read_version()) == log.rebuild(spark)


@pytest.mark.parametrize("fmt", FORMATS)
def test_state_tables_are_written_with_zstd(spark, tmp_path, fmt):
    """Both formats compress the state's data files alike: delta-rs writes none at all unless its
    WriterProperties name a codec (about four times the bytes, docs/benchmarks.md), pyiceberg writes zstd."""
    log = EventLog(tmp_path / "events", {"id": pa.int64(), "note": pa.string()}, ["id"])
    state = state_table(fmt, tmp_path)
    log.snapshot([{"id": i, "note": f"order {i} " * 4} for i in range(2_000)])
    merge_windows(spark, log.events(spark), state, tag=log.tag())
    log.update({}, {"id": 5, "note": "changed"})
    log.commit()
    merge_windows(spark, log.events(spark), state, tag=log.tag())  # a MERGE's files too
    files = [f.removeprefix("file://") for f in state.data_files()]  # (the MERGE rewrote the first file)
    assert files
    for path in files:
        metadata = pq.ParquetFile(path).metadata
        codecs = {
            metadata.row_group(g).column(c).compression
            for g in range(metadata.num_row_groups)
            for c in range(metadata.num_columns)
        }
        assert codecs == {"ZSTD"}, (path, codecs)


# -- time travel ----------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_read_state_as_of_a_window(spark, tmp_path, fmt):
    log = EventLog(tmp_path / "events", {"id": pa.int32(), "v": pa.string()}, ["id"])
    state = state_table(fmt, tmp_path)
    log.snapshot([{"id": 1, "v": "a"}, {"id": 2, "v": "b"}])
    merge_windows(spark, log.events(spark), state, tag=log.tag())
    log.update({}, {"id": 1, "v": "a2"})
    log.insert({"id": 3, "v": "c"})
    log.commit()
    merge_windows(spark, log.events(spark), state, tag=log.tag())
    log.commit()  # no events: no commit
    merge_windows(spark, log.events(spark), state, tag=log.tag())
    log.delete({"id": 2})
    log.commit()
    merge_windows(spark, log.events(spark), state, tag=log.tag())

    for seq in range(1, log.seq + 1):
        assert rows_of(read_state_as_of(state, seq)) == log.rebuild(spark, seq), seq
    assert rows_of(read_state_as_of(state, 3)) == rows_of(read_state_as_of(state, 2))  # window 3 changed nothing
    with pytest.raises(CdcStateError, match="window 0"):
        read_state_as_of(state, 0)


# -- random DML ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_merge_equals_the_rebuild_for_random_dml(spark):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    op = st.tuples(st.sampled_from(["insert", "update", "toast", "delete", "move", "truncate"]), st.integers(0, 30))
    windows = st.lists(st.lists(op, min_size=1, max_size=8), min_size=1, max_size=3)

    @settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
    @given(fmt=st.sampled_from(FORMATS), initial=st.sets(st.integers(0, 30), max_size=8), windows=windows)
    def check(fmt, initial, windows):
        with tempfile.TemporaryDirectory() as directory:
            root = Path(directory)
            log = EventLog(root / "events", {"id": pa.int32(), "v": pa.int32(), "body": pa.string()}, ["id"])
            states = {fmt: state_table(fmt, root, "random")}  # one format per example: Spark is slow
            model = {i: {"id": i, "v": 0, "body": f"b{i}"} for i in sorted(initial)}
            log.snapshot(list(model.values()))
            apply(spark, log, states)
            for changes in windows:
                for n, (kind, key) in enumerate(changes):
                    _random_change(log, model, kind, key, n)
                log.commit()
                apply(spark, log, states)

    check()


def _random_change(log: EventLog, model: dict[int, dict], kind: str, key: int, n: int) -> None:
    """Apply one change to the model and log its events (only valid changes: as the source would)."""
    present = key in model
    if kind == "truncate":
        log.truncate()
        model.clear()
    elif kind == "insert" or not present:
        if not present:
            model[key] = {"id": key, "v": n, "body": f"new {key}.{n}"}
            log.insert(model[key])
    elif kind in ("update", "toast"):
        model[key] = {**model[key], "v": model[key]["v"] + 1}
        log.update({}, model[key], unchanged=["body"] if kind == "toast" else ())
    elif kind == "delete":
        log.delete(model.pop(key))
    elif (target := key + 31) not in model:  # move to a key no row has
        row = {**model.pop(key), "id": target}
        model[target] = row
        log.move({"id": key}, row, unchanged=["body"] if n % 2 else ())
