"""Crash safety: capture tasks killed (SIGKILL) at every step boundary and at random moments.

Each crash runs the real task in a child process (``tests/support/crash_driver.py``) that is
killed at a named fault point (``airflow_provider_cdc.cdc.faults``) or after a random delay;
the next run, in this process, must complete the work. After every recovery the harness checks
that nothing was lost or duplicated (``tests/support/crash.py``).

The suite runs a CI-sized sample (8 snapshot crashes, 16 stream crashes). The larger sweep:

    CDC_CRASH_SWEEP=200 ./scripts/test.sh tests/integration/test_crash_safety.py -k sweep

(``CDC_CRASH_SEED`` fixes the random choices, ``CDC_CRASH_REPORT=<file>`` writes a JSON report.)

Results of the sweep are recorded in docs/reliability.md.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from airflow_provider_cdc.cdc.sinks.reader import committed_windows
from airflow_provider_cdc.testing import shop
from tests.support.crash import CrashCapture, prepare_shop

pytestmark = [pytest.mark.spark, pytest.mark.slow]

KEYS = {"public.customers": ["id"], "public.orders": ["id"], "public.order_items": ["order_id", "line_no"]}

# (point, n-th time reached): every boundary of a snapshot run.
SNAPSHOT_FAULTS = [
    ("operator.pending_saved", 1),
    ("snapshot.exported", 1),
    ("snapshot.table_written", 1),
    ("snapshot.table_written", 3),
    ("sink.committed", 1),
    ("operator.offset_saved", 1),
    ("operator.acknowledged", 1),
]
# Every boundary of a stream window; chunks of 10 changes, so a window writes several.
STREAM_FAULTS = [
    ("operator.pending_saved", 1),
    ("window.streaming", 1),
    ("window.chunk_written", 1),
    ("window.chunk_written", 3),
    ("window.read_done", 1),
    ("sink.committed", 1),
    ("operator.offset_saved", 1),
    ("operator.acknowledged", 1),
]


@pytest.fixture
def crash_db(db15, spark, monkeypatch):
    return db15, prepare_shop(db15, monkeypatch, "crash", customers=30, orders_per_customer=3)


class Workload:
    """Shop activity between (and during) runs; counts the transactions it commits."""

    def __init__(self, db):
        self.db = db
        self.round = 0
        self.transactions = 0
        self._lock = threading.Lock()

    def mutate(self) -> None:
        with self._lock:
            self.round += 1
            round_no = self.round
        with self.db.connect() as conn:
            made = shop.mutate(conn, round_no=round_no)
        with self._lock:
            self.transactions += made.transactions

    def in_background(self, rounds: int) -> threading.Thread:
        def work():
            for _ in range(rounds):
                self.mutate()

        thread = threading.Thread(target=work)
        thread.start()
        return thread


def _fault(point: str, nth: int, action: str = "kill") -> str:
    return f"{point}:{action}:{nth}"


def _snapshot_crash(db, conn_id, sink: Path, prefix: str, workload: Workload, crash: dict) -> dict:
    """One capture whose first snapshot is killed as ``crash`` says; then recovered and checked."""
    capture = CrashCapture(db, conn_id, prefix, sink, KEYS)
    capture.run("setup")
    baseline = workload.transactions
    if crash.get("kill_after") is not None:
        result = capture.child("snapshot", kill_after=crash["kill_after"])
        assert result.returncode in (-9, 0), result.describe()
    else:
        result = capture.child("snapshot", fault=_fault(crash["point"], crash["nth"]))
        assert result.killed, result.describe()
    # Changes made before the next run are in its snapshot, or streamed if the snapshot landed.
    landed = bool(committed_windows(str(sink), prefix))
    workload.mutate()
    if not landed:
        baseline = workload.transactions
    capture.run("snapshot")
    workload.mutate()
    capture.catch_up()
    counts = capture.verify(transactions=workload.transactions - baseline)
    return {"killed": result.killed, **counts}


@pytest.mark.parametrize(
    "crash",
    [{"point": p, "nth": n} for p, n in SNAPSHOT_FAULTS] + [{"kill_after": "random"}],
    ids=[f"{p}:{n}" for p, n in SNAPSHOT_FAULTS] + ["random"],
)
def test_a_snapshot_killed_at_any_step_is_completed_by_the_next_run(crash_db, tmp_path, crash):
    db, conn_id = crash_db
    if crash.get("kill_after") == "random":
        # Spark's start-up and the three tables take a few seconds: kill somewhere inside them.
        crash = {"kill_after": random.Random(db.name).uniform(0.5, 6.0)}
    workload = Workload(db)
    _snapshot_crash(db, conn_id, tmp_path / "lake", "crash", workload, crash)


def test_stream_windows_killed_at_every_step_lose_and_duplicate_nothing(crash_db, tmp_path):
    db, conn_id = crash_db
    capture = CrashCapture(db, conn_id, "crash", tmp_path / "lake", KEYS, chunk=10)
    capture.run("setup")
    capture.run("snapshot")
    workload = Workload(db)
    rng = random.Random(20261121)
    cycles = (
        [{"fault": _fault(p, n)} for p, n in STREAM_FAULTS]
        # Transient errors (not kills) unwind normally: the retry must cope with what they leave.
        + [
            {"fault": _fault("window.chunk_written", 2, "raise")},
            {"fault": _fault("operator.offset_saved", 1, "raise")},
        ]
        # Random moments, with writers committing while the window is read.
        + [{"random": True} for _ in range(6)]
    )
    outcomes = Counter()
    run_time = 1.0
    for cycle in cycles:
        workload.mutate()
        writer = workload.in_background(2) if cycle.get("random") else None
        if cycle.get("random"):
            result = capture.child("batch", kill_after=rng.uniform(0.0, run_time))
            assert result.returncode in (-9, 0), result.describe()
        else:
            result = capture.child("batch", fault=cycle["fault"])
            expected = 1 if cycle["fault"].split(":")[1] == "raise" else -9
            assert result.returncode == expected, result.describe()
            if expected == 1:
                assert "fault injected at" in result.stderr
        outcomes["killed" if result.killed else "failed" if result.returncode == 1 else "completed"] += 1
        if writer is not None:
            writer.join()
        started = time.monotonic()
        capture.catch_up()
        run_time = max(0.3, time.monotonic() - started)
        capture.verify(transactions=workload.transactions)
    assert outcomes["killed"] >= len(STREAM_FAULTS)


@pytest.mark.skipif(not os.environ.get("CDC_CRASH_SWEEP"), reason="set CDC_CRASH_SWEEP=<n> for the long sweep")
@pytest.mark.timeout(4 * 3600)  # the suite's 15-minute limit is for ordinary tests
def test_crash_sweep(crash_db, tmp_path):
    """``CDC_CRASH_SWEEP`` crashes at random fault points, random occurrences, random moments."""
    db, conn_id = crash_db
    total = int(os.environ["CDC_CRASH_SWEEP"])
    seed = int(os.environ.get("CDC_CRASH_SEED", "1"))
    rng = random.Random(seed)
    capture = CrashCapture(db, conn_id, "crash", tmp_path / "lake", KEYS, chunk=rng.choice([5, 10, 50]))
    capture.run("setup")
    capture.run("snapshot")
    workload = Workload(db)
    report: dict = {"seed": seed, "crashes": total, "by_point": Counter(), "outcomes": Counter()}
    run_time = 1.0
    started_sweep = time.monotonic()
    for i in range(total):
        kind = rng.random()
        if kind < 0.08:  # a snapshot crash, on a capture of its own
            if rng.random() < 0.5:
                point, nth = rng.choice(SNAPSHOT_FAULTS)
                crash, label = {"point": point, "nth": nth}, f"snapshot {point}:{nth}"
            else:
                crash, label = {"kill_after": rng.uniform(0.5, 6.0)}, "snapshot random"
            prefix = f"snap{i}"
            outcome = _snapshot_crash(db, conn_id, tmp_path / prefix, prefix, workload, crash)
            with db.connect() as conn:
                conn.execute(
                    "SELECT pg_drop_replication_slot(%s)", (CrashCapture(db, conn_id, prefix, tmp_path, KEYS).slot,)
                )
            report["by_point"][label] += 1
            report["outcomes"]["killed" if outcome["killed"] else "completed"] += 1
            continue
        workload.mutate()
        writer = workload.in_background(rng.randint(0, 3))
        if kind < 0.55:
            point, nth = rng.choice(STREAM_FAULTS)
            if point == "window.chunk_written":
                nth = rng.randint(1, 6)
            action = "raise" if rng.random() < 0.15 else "kill"
            result = capture.child("batch", fault=_fault(point, nth, action))
            label = f"stream {point}:{nth} ({action})"
        else:
            result = capture.child("batch", kill_after=rng.uniform(0.0, run_time))
            label = "stream random"
        assert result.returncode in (-9, 0, 1), result.describe()
        if result.returncode == 1:
            assert "fault injected at" in result.stderr, result.describe()
        report["by_point"][label] += 1
        report["outcomes"]["killed" if result.killed else "failed" if result.returncode == 1 else "completed"] += 1
        writer.join()
        started = time.monotonic()
        capture.catch_up()
        run_time = max(0.3, time.monotonic() - started)
        counts = capture.verify(transactions=workload.transactions)
    report.update(counts, minutes=round((time.monotonic() - started_sweep) / 60, 1))
    if os.environ.get("CDC_CRASH_REPORT"):
        Path(os.environ["CDC_CRASH_REPORT"]).write_text(json.dumps(report, indent=2, sort_keys=True))
