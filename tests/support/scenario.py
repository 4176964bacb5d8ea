"""A capture driven step by step for scenario tests: windows, events, current state."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from airflow_provider_cdc.cdc.basics.naming import Topic
from airflow_provider_cdc.cdc.sources.postgres import admin
from airflow_provider_cdc.cdc.sources.postgres.events import EventSettings
from airflow_provider_cdc.cdc.sources.postgres.jobs import run_job
from airflow_provider_cdc.cdc.state.apply import apply_windows
from airflow_provider_cdc.cdc.state.jobs import read_state
from airflow_provider_cdc.cdc.state.lake import apply_windows_by_merge
from tests.support.databases import CaptureDatabase, snapshot_window, stream_window
from tests.support.oracle import assert_same_state, events_of, replay, source_rows, spark_rows
from tests.support.readers import assert_readers_agree


def no_spark():
    raise AssertionError("this window must not need Spark")


class Scenario:
    def __init__(
        self,
        db: CaptureDatabase,
        tables: list[str],
        root: Path,
        *,
        spark=None,
        settings: EventSettings | None = None,
        chunk: int = 100_000,
        sink_format: str = "parquet",
    ):
        self.db, self.tables, self.spark = db, tables, spark
        self.sink, self.state_path = root / "lake", root / "state"
        self.settings = settings or EventSettings()
        self.chunk = chunk
        self.sink_format = sink_format
        self.seq = 0
        self.position = db.setup_capture(tables).confirmed_flush_lsn
        self.entries = []

    def _spec(self, window):
        spec = self.db.spec(
            self.tables, window, self.sink, max_changes_per_chunk=self.chunk, sink_format=self.sink_format
        )
        return replace(spec, events=self.settings)

    def snapshot(self):
        self.seq += 1
        entry = run_job(self._spec(snapshot_window(self.seq)))
        self._acknowledge(entry.window.to_lsn)
        self.entries.append(entry)
        return entry

    def window(self):
        self.seq += 1
        end = self.db.current_lsn()
        spec = self._spec(stream_window(self.seq, self.position, end))
        entry = run_job(spec, spark_provider=no_spark)
        if self.sink_format == "parquet":  # both window readers land the same events (the format does not matter)
            assert_readers_agree(spec, self.sink.parent / f"readers-{self.seq}")
        self._acknowledge(end)
        self.entries.append(entry)
        return entry

    def _acknowledge(self, lsn):
        with self.db.connect() as conn:
            admin.advance_slot(conn, self.db.slot, lsn)
        self.position = lsn

    def events(self, table: str, window=None) -> list[dict]:
        events = events_of(self.sink, "t", table)
        if window is not None:
            events = [e for e in events if e["window_id"] == window.window_id]
        return sorted(
            events,
            key=lambda e: (
                e["window_id"],
                e["source"]["commit_lsn"],
                e["transaction"]["total_order"] if e["transaction"] else 0,
            ),
        )

    def state(self, table: str):
        schema, name = table.split(".")
        topic = Topic.for_table("t", schema, name)
        where = {"topic_prefix": "t", "topic": topic, "state_path": str(self.state_path)}
        if self.sink_format == "parquet":
            apply_windows(self.spark, sink_path=str(self.sink), **where)
        else:  # the lake formats' state: a table of the same format, maintained by MERGE
            apply_windows_by_merge(self.spark, sink_path=str(self.sink), sink_format=self.sink_format, **where)
        return read_state(self.spark, sink_format=self.sink_format, **where)

    def assert_state_matches_source(self, table: str, keys: list[str], columns: list[str] | None = None) -> None:
        """Current-state table (Spark engine) and the Python replay both equal the source."""
        with self.db.connect() as conn:
            source = source_rows(conn, table, keys)
        if columns is not None:
            source = {k: {c: row[c] for c in columns} for k, row in source.items()}

        def project(rows):
            return {k: {c: row.get(c) for c in (columns or row)} for k, row in rows.items()}

        if self.spark is not None:
            assert_same_state(project(spark_rows(self.state(table), keys)), source)
        assert_same_state(project(replay(self.events(table), keys)), source)
