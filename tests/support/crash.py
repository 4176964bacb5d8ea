"""Crash-safety harness: run capture tasks in a child process, kill it, recover, check everything.

A :class:`CrashCapture` is one capture (prefix, slot, publication, sink, state-table offsets)
on a test database. ``child()`` runs a task in a separate Python process that is killed with
``SIGKILL`` at a named fault point or after a delay; ``run()`` runs a task in the test process
(the "next run" that must repair whatever the crash left). ``verify()`` checks every promise:

- the committed windows are numbered 1..n without gaps and stream windows are contiguous;
- no change event appears twice (stream: commit LSN + position in the transaction; snapshot:
  key within its window), and every transaction lies in exactly one window;
- the transaction side table has one BEGIN and one END per transaction, and END's counts
  equal the events written for it, per table;
- replaying the committed events gives exactly the source tables;
- the stored offset names the last committed window, nothing pending, and the slot is
  acknowledged there (nothing pinned behind it).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_provider_cdc.capture import PostgresCapture
from airflow_provider_cdc.cdc.errors import ConcurrentCaptureError
from airflow_provider_cdc.cdc.lsn import Lsn
from airflow_provider_cdc.cdc.sinks.reader import committed_windows, read_topic_arrow
from airflow_provider_cdc.cdc.sources.postgres.offset import PostgresOffset
from airflow_provider_cdc.operators.postgres_cdc import (
    PostgresCdcBatchOperator,
    PostgresCdcSetupOperator,
    PostgresCdcSnapshotOperator,
)
from airflow_provider_cdc.version_compat import AirflowSkipException
from tests.support.databases import CaptureDatabase
from tests.support.oracle import assert_same_state, assert_source_blocks, replay, source_rows

ROOT = Path(__file__).resolve().parents[2]
KILLED = -signal.SIGKILL
OPERATORS = {
    "setup": PostgresCdcSetupOperator,
    "snapshot": PostgresCdcSnapshotOperator,
    "batch": PostgresCdcBatchOperator,
}


def prepare_shop(db: CaptureDatabase, monkeypatch: Any, name: str, *, customers: int, orders_per_customer: int) -> str:
    """The shop schema with data and a ``cdc_state`` schema for state-table offsets in ``db``, and
    an Airflow connection to it (returns its id, ``<name>_<database>``)."""
    from airflow_provider_cdc.testing import shop

    with db.connect() as conn:
        shop.create_schema(conn)
        shop.seed(conn, customers=customers, orders_per_customer=orders_per_customer)
        conn.execute("CREATE SCHEMA cdc_state")
    conn_id = f"{name}_{db.name}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", db.cluster.airflow_uri(db.name))
    return conn_id


@dataclass
class ChildResult:
    returncode: int
    stdout: str
    stderr: str

    @property
    def killed(self) -> bool:
        return self.returncode == KILLED

    def describe(self) -> str:
        return f"exit {self.returncode}\n--- stderr (tail) ---\n{self.stderr[-3000:]}"


@dataclass
class CrashCapture:
    db: CaptureDatabase
    conn_id: str
    prefix: str
    sink: Path
    keys: dict[str, list[str]]
    chunk: int = 100_000
    offset_table: str = "cdc_state.offsets"
    overrides: dict[str, Any] = field(default_factory=dict)

    @property
    def slot(self) -> str:
        return f"slot_{self.prefix}_{self.db.name}"[:63]

    def fields(self) -> dict[str, Any]:
        return {
            "postgres_conn_id": self.conn_id,
            "tables": list(self.keys),
            "topic_prefix": self.prefix,
            "sink_path": str(self.sink),
            "slot_name": self.slot,
            "publication_name": f"pub_{self.prefix}",
            "offset_store": "state_table",
            "offset_table": self.offset_table,
            "spark_master": "local[2]",
            "max_changes_per_chunk": self.chunk,
            **self.overrides,
        }

    def capture(self) -> PostgresCapture:
        return PostgresCapture(**self.fields())

    # -- running -------------------------------------------------------------------------------

    def child(
        self, step: str, *, fault: str | None = None, kill_after: float | None = None, timeout: float = 600
    ) -> ChildResult:
        """Run ``step`` in a child process, with a fault (``point:action[:n]``) or killed with
        ``SIGKILL`` ``kill_after`` seconds after its imports finished (wherever it then is)."""
        env = dict(os.environ)
        env.pop("AIRFLOW_CDC_FAULT", None)
        if fault is not None:
            env["AIRFLOW_CDC_FAULT"] = fault
        config = {"step": step, "capture": self.fields()}
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.crash_driver", json.dumps(config)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        if kill_after is not None:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() == "ready":
                time.sleep(kill_after)
                proc.send_signal(signal.SIGKILL)
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        return ChildResult(proc.returncode, stdout, stderr)

    def run(self, step: str) -> dict | None:
        """Run ``step`` in this process (None if skipped); waits out a dying predecessor's lock."""
        operator = OPERATORS[step](task_id=step, capture=self.capture())
        deadline = time.monotonic() + 15
        while True:
            try:
                return operator.execute({})
            except AirflowSkipException:
                return None
            except ConcurrentCaptureError:
                # The killed child's session may take a moment to be reaped by the server.
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def catch_up(self) -> list[dict]:
        """Batch runs until the windows cover everything committed before this call."""
        target = self.db.current_lsn()
        summaries = []
        for _ in range(5):
            summary = self.run("batch")
            assert summary is not None
            summaries.append(summary)
            if Lsn(summary["to_lsn"]) >= target:
                return summaries
        raise AssertionError(f"five batch runs did not reach {target}: {summaries}")

    # -- checking ------------------------------------------------------------------------------

    def stored_offset(self) -> PostgresOffset | None:
        schema, table = self.offset_table.split(".")
        with self.db.connect() as conn:
            row = conn.execute(
                f'SELECT document::text FROM "{schema}"."{table}" WHERE capture = %s', (self.prefix,)
            ).fetchone()
        return None if row is None else PostgresOffset.from_json(row[0])

    def verify(self, *, transactions: int | None = None) -> dict[str, int]:
        """Check every invariant (see the module docstring); returns counts for reporting."""
        sink = str(self.sink)
        entries = committed_windows(sink, self.prefix)
        assert entries, "nothing was committed"
        assert [e.window.seq for e in entries] == list(range(1, len(entries) + 1)), "window numbers have gaps"
        for previous, entry in itertools.pairwise(entries):
            if entry.window.kind == "stream":
                assert entry.window.from_lsn == previous.window.to_lsn, (
                    f"{entry.window.describe()} does not start where {previous.window.describe()} ended"
                )

        stream_events: dict[str, list[dict]] = {}
        positions: Counter = Counter()
        windows_of_tx: dict[str, set[str]] = defaultdict(set)
        per_tx_table: Counter = Counter()
        for table, keys in self.keys.items():
            events = _rows(sink, self.prefix, f"{self.prefix}.{table}")
            snapshot_keys = Counter(
                (e["window_id"], tuple(e["after"][k] for k in keys)) for e in events if e["op"] == "r"
            )
            repeated = [k for k, n in snapshot_keys.items() if n > 1]
            assert not repeated, f"{table}: snapshot rows written twice: {repeated[:5]}"
            assert_source_blocks(events)
            stream_events[table] = [e for e in events if e["op"] != "r"]
            for e in stream_events[table]:
                positions[(e["source"]["commit_lsn"], e["transaction"]["total_order"])] += 1
                windows_of_tx[e["transaction"]["id"]].add(e["window_id"])
                per_tx_table[(e["transaction"]["id"], table)] += 1
            with self.db.connect() as conn:
                assert_same_state(replay(events, keys), source_rows(conn, table, keys))
        duplicated = [p for p, n in positions.items() if n > 1]
        assert not duplicated, f"change events written twice: {duplicated[:5]}"
        split = {tx: w for tx, w in windows_of_tx.items() if len(w) > 1}
        assert not split, f"transactions spread over windows: {split}"

        tx_rows = _rows(sink, self.prefix, f"{self.prefix}.transaction")
        begins = Counter(r["id"] for r in tx_rows if r["status"] == "BEGIN")
        ends = {r["id"]: r for r in tx_rows if r["status"] == "END"}
        assert all(n == 1 for n in begins.values()), "a transaction has two BEGIN rows"
        assert len(ends) == sum(1 for r in tx_rows if r["status"] == "END"), "a transaction has two END rows"
        assert set(begins) == set(ends), "BEGIN and END rows do not pair up"
        assert set(windows_of_tx) <= set(ends), "events of a transaction without side-table rows"
        for tx, end in ends.items():
            declared = {c["data_collection"]: c["event_count"] for c in end["data_collections"]}
            written = {t: n for (t_id, t), n in per_tx_table.items() if t_id == tx}
            assert declared == written, f"transaction {tx}: END says {declared}, events say {written}"
            assert end["event_count"] == sum(written.values())
            if tx in windows_of_tx:
                assert windows_of_tx[tx] == {end["window_id"]}
        if transactions is not None:
            assert len(ends) == transactions, f"{len(ends)} transactions captured, {transactions} committed"

        offset = self.stored_offset()
        assert offset is not None and offset.pending is None
        last = entries[-1].window
        assert (offset.window_seq, offset.lsn) == (last.seq, last.to_lsn), "the offset is not at the last window"
        if offset.snapshot_completed:  # a table joining later is found by this list, whatever crashed
            assert offset.extra.get("tables"), "the offset lost the list of snapshotted tables"
        status = self.db.slot_status(self.slot)
        assert status is not None and status.confirmed_flush_lsn == offset.lsn, "the slot is not acknowledged"
        return {
            "windows": len(entries),
            "transactions": len(ends),
            "change_events": sum(positions.values()),
        }


def _rows(sink: str, prefix: str, topic: str) -> list[dict]:
    table = read_topic_arrow(sink, prefix, topic)
    return [] if table is None else table.to_pylist()
