"""Crash safety of SQL Server captures: tasks killed (SIGKILL) at every step boundary and at random
moments, on the stand-in (docs/sqlserver-standin.md).

The harness is the PostgreSQL crash tests' (``tests/support/crash.py``), with the SQL Server
adapter (``tests/support/crash_sources.py``): each crash runs the real task in a child process
(``tests/support/crash_driver.py``) that is killed at a named fault point
(``airflow_provider_cdc.cdc.basics.faults``) or after a random delay; the next run, in this process,
must complete the work. After every recovery the harness checks that nothing was lost or
duplicated, that the transaction side table matches the events, that replaying the events gives
the source's tables (once the stand-in's capture job took in every commit), and that the offset
(an Airflow Variable) names the last committed window with nothing pending. The stand-in's proxy
and capture job run in this process, so they outlive the killed child; writers commit through the
stand-in while windows are read.

The suite runs a CI-sized sample: every fault point of a snapshot run (and a random moment), every
fault point of a stream window, two transient errors and three random moments with a concurrent
writer. The larger sweep, as for PostgreSQL:

    CDC_CRASH_SWEEP=200 ./scripts/test.sh tests/integration/sqlserver/test_crash_safety.py -k sweep

(``CDC_CRASH_SEED`` fixes the random choices, ``CDC_CRASH_REPORT=<file>`` writes a JSON report.)
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
import time

import pytest

from tests.support import crash as harness
from tests.support.crash import CrashCapture
from tests.support.crash_sources import SqlServerCrashSource, metadata_variables
from tests.support.sqlserver import SqlServerStandIn, StatementRecorder, workload
from tests.support.sqlserver.fixtures import DRIVER_IN_EXTRA_ALLOWED, airflow_connection

pytestmark = [pytest.mark.spark, pytest.mark.slow]

KEYS = workload.KEYS

# (point, n-th time reached): every boundary of a snapshot run (two tables).
SNAPSHOT_FAULTS = [
    ("operator.pending_saved", 1),
    ("snapshot.exported", 1),
    ("snapshot.table_written", 1),
    ("snapshot.table_written", 2),
    ("sink.committed", 1),
    ("operator.offset_saved", 1),
    ("operator.acknowledged", 1),  # SQL Server acknowledges nothing: the point is still reached
]
# Every boundary of a stream window; chunks of 3 changes, so a window writes several.
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
CHUNK = 3
#: Every statement sent to the module's stand-in (by the product, in the children too, and the tests).
RECORDER = StatementRecorder()


@pytest.fixture(scope="module")
def crash_source(request, clusters, spark, airflow_db):
    """One stand-in for the module (captures differ by topic prefix), its Airflow connection, the
    adapter, and one workload (its round numbers pick new keys: one counter per database)."""
    digest = hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:6]
    standin = SqlServerStandIn(clusters["pg15"], f"ss_crash_{digest}", recorder=RECORDER, poll_interval=0.05).start()
    try:
        workload.create(standin, customers=30, orders_per_customer=3)
        standin.wait_until_captured()
        conn_id = f"mssql_{standin.database}"
        with pytest.MonkeyPatch.context() as patch, metadata_variables():
            patch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", airflow_connection(standin))
            patch.setenv(*DRIVER_IN_EXTRA_ALLOWED)  # the crash children inherit it
            source = SqlServerCrashSource(standin, conn_id)
            yield source, harness.Workload(source)
    finally:
        standin.stop()


def _seed() -> int:
    return int(os.environ.get("CDC_CRASH_SEED", "20261123"))


def _child_span(seen: harness.StreamCycles) -> float:
    """Random kills land anywhere in a window task: up to the latest a fault point killed one
    (``operator.acknowledged``: the whole task)."""
    return max(seen.child, seen.catch_up)


@pytest.mark.parametrize(
    "crash",
    [{"point": p, "nth": n} for p, n in SNAPSHOT_FAULTS] + [{"kill_after": "random"}],
    ids=[f"{p}:{n}" for p, n in SNAPSHOT_FAULTS] + ["random"],
)
def test_a_snapshot_killed_at_any_step_is_completed_by_the_next_run(crash_source, tmp_path, crash):
    source, shared = crash_source
    writes = shared.fork()
    if crash.get("kill_after") == "random":
        # Spark's start-up in the child and the two tables take a few seconds: kill inside them.
        crash = {"kill_after": random.Random(_seed()).uniform(0.5, 8.0)}
    prefix = "snap_" + "_".join(str(v) for v in crash.values()).replace(".", "_")[:40]
    capture = CrashCapture.of(source, prefix, tmp_path / "lake", KEYS, chunk=CHUNK)
    outcome = harness.snapshot_crash(capture, writes, crash)
    assert outcome["killed"] or "kill_after" in crash


def test_stream_windows_killed_at_every_step_lose_and_duplicate_nothing(crash_source, tmp_path):
    source, shared = crash_source
    capture = CrashCapture.of(source, "stream", tmp_path / "lake", KEYS, chunk=CHUNK)
    capture.run("setup")
    capture.run("snapshot")
    writes = shared.fork()  # the transactions this capture streams
    rng = random.Random(_seed())
    cycles = (
        [{"fault": harness.fault(p, n)} for p, n in STREAM_FAULTS]
        # Transient errors (not kills) unwind normally: the retry must cope with what they leave.
        + [
            {"fault": harness.fault("window.chunk_written", 2, "raise")},
            {"fault": harness.fault("operator.offset_saved", 1, "raise")},
        ]
        # Random moments, one in each third of a window task, with a writer committing through the
        # stand-in meanwhile.
        + [{"random": True, "between": (i / 3, (i + 1) / 3)} for i in range(3)]
    )
    seen = harness.stream_crashes(capture, writes, cycles, rng, random_span=_child_span)
    print(f"outcomes {dict(seen.outcomes)}; the random kills left: {dict(seen.left)}")
    assert seen.outcomes["killed"] >= len(STREAM_FAULTS), seen.outcomes
    assert seen.counts is not None and seen.counts["transactions"] == writes.transactions


def test_an_incremental_snapshot_killed_at_every_step_loses_and_duplicates_nothing(crash_source, tmp_path):
    """The incremental snapshot's windows (chunks staged, emitted a window later, watermark rows in the
    signal table) killed at every boundary and at random moments, with a writer committing meanwhile."""
    source, shared = crash_source
    standin = source.standin
    standin.execute_tsql(
        "CREATE TABLE dbo.crash_signal (id varchar(42) NOT NULL PRIMARY KEY, type varchar(32) NOT NULL, "
        "data varchar(2048) NULL)"
    )
    standin.enable_table("dbo", "crash_signal")
    overrides = {"signal_table": "dbo.crash_signal", "incremental_chunk_size": 8, "incremental_chunks_per_run": 2}
    capture = CrashCapture.of(source, "incr", tmp_path / "lake", KEYS, chunk=CHUNK, overrides=overrides)
    capture.run("setup")
    capture.run("snapshot")
    writes = shared.fork()
    signal = json.dumps({"data-collections": ["dbo\\.(customers|orders)"]})
    standin.execute_tsql(
        "INSERT INTO dbo.crash_signal (id, type, data) VALUES ('resnap-1', 'execute-snapshot', ?)", (signal,)
    )
    harness.incremental_crashes(capture, writes, random.Random(_seed()), kills=2, kill_span=(0.5, 6.0), writer_rounds=1)
    from airflow_provider_cdc.cdc.sinks.reader import read_topic_arrow

    for table in KEYS:
        events = read_topic_arrow(str(capture.sink), "incr", f"incr.{table}").to_pylist()
        assert any(e["op"] == "r" and e["source"]["snapshot"] == "incremental" for e in events), table


@pytest.mark.skipif(not os.environ.get("CDC_CRASH_SWEEP"), reason="set CDC_CRASH_SWEEP=<n> for the long sweep")
@pytest.mark.timeout(4 * 3600)  # the suite's 15-minute limit is for ordinary tests
def test_crash_sweep(crash_source, tmp_path):
    """``CDC_CRASH_SWEEP`` crashes at random fault points, random occurrences, random moments."""
    source, shared = crash_source
    total, seed = harness.sweep_settings()
    rng = random.Random(seed)
    capture = CrashCapture.of(source, "sweep", tmp_path / "lake", KEYS, chunk=rng.choice([2, 3, 10]))
    capture.run("setup")
    capture.run("snapshot")
    report = harness.crash_sweep(
        capture,
        shared.fork(),
        lambda prefix: CrashCapture.of(source, prefix, tmp_path / prefix, KEYS, chunk=CHUNK),
        total=total,
        rng=rng,
        snapshot_faults=SNAPSHOT_FAULTS,
        stream_faults=STREAM_FAULTS,
        snapshot_kill_span=(0.5, 8.0),
        random_span=_child_span,
    )
    harness.write_report({"seed": seed, "source": "sqlserver", **report})


def test_the_session_of_a_killed_client_ends_and_releases_the_capture_lock(crash_source):
    """SQL Server ends the session of a client whose connection closed, releasing the locks it owned;
    a killed capture task must not keep its capture locked. (The stand-in's proxy passes the
    disconnect on: ``_Session.run`` shuts its sockets down before closing them, which wakes the
    other pump thread and lets PostgreSQL see the client go.)"""
    from airflow_provider_cdc.cdc.sources.sqlserver import admin

    source, _ = crash_source
    resource = admin.lock_resource("orphan")
    code = (
        "import pyodbc, time\n"
        f"conn = pyodbc.connect({source.standin.connection_string()!r}, autocommit=True)\n"
        f"conn.cursor().execute({admin.LOCK_SQL!r}, {resource!r}).fetchall()\n"
        "print('ready', flush=True)\n"
        "time.sleep(120)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        assert len(source.lock_holders(resource)) == 1
    finally:
        child.kill()
        child.communicate()
    deadline = time.monotonic() + 5
    while source.lock_holders(resource) and time.monotonic() < deadline:
        time.sleep(0.1)
    held = source.lock_holders(resource)
    for pid in held:  # leave nothing behind for the other tests
        source.standin.admin_query("SELECT pg_terminate_backend(%s)", (pid,))
    assert not held, "the killed client's session still holds the capture lock"


def test_every_statement_sent_is_tsql():
    """Last: what the product (also the killed tasks) and these tests sent to the stand-in parses as T-SQL."""
    if not RECORDER.statements():
        pytest.skip("no statement was sent: this checks the statements of the module's other tests")
    assert RECORDER.invalid() == []
