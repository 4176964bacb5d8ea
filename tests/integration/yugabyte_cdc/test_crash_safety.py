"""Crash safety of YugabyteDB captures through the CDC service (``YugabyteCdcServiceCapture``):
tasks killed (SIGKILL) at step boundaries and at random moments, on the CDC-service stand-in
(docs/yugabytedb-cdc-standin.md).

The harness is the other sources' (``tests/support/crash.py``), with the CDC-service adapter
(``YugabyteCdcCrashSource`` in ``tests/support/crash_sources.py``): each crash runs the real task
(the shared operators) in a child process (``tests/support/crash_driver.py``) that reaches the
stand-in's masters and tablet servers over YB's RPC and is killed at a named fault point
(``airflow_provider_cdc.cdc.basics.faults``) or after a random delay; the next run, in this process,
must complete the work. After every recovery the harness checks that nothing was lost or
duplicated, that the transaction side table matches the events, that replaying the events gives
the source's tables, that the offset (an Airflow Variable) names the last committed window with
nothing pending, that every tablet's checkpoint stored on the server (``SetCDCCheckpoint``, after
the offset save) equals the offset's, and that no session holds the capture lock; right after every
child, before any recovery, that no tablet's server checkpoint is ahead of the offset the killed
task left stored (the server would release changes the sink lacks). The stand-in's service is a
process of this test process, so it outlives the killed child; writers commit while windows are read.

The suite runs a CI-sized sample (2 to 2.5 minutes on two cores):

- stream windows of a capture with ``snapshot_mode='never'``, started on empty tables: its first
  window checkpoints every tablet at its latest op on the server, and every row is written after
  that, so the tables are what the windows captured. That first window is itself killed once its
  tablets are checkpointed and stored with the pending window (the retry must start from those
  checkpoints, or the rows written meanwhile are lost). Then a window is killed at every boundary
  (``STREAM_FAULTS``), one fault raises instead (unwinding normally), and two random moments with
  a writer committing meanwhile;
- transient RPC errors on a snapshotted capture: a few retriable ``GetChanges`` failures the job's
  retries absorb, and a ``SetCDCCheckpoint`` failing every attempt after the offset save (the task
  fails; the server stays behind, never ahead; the next run stores the checkpoints);
- snapshots (``snapshot_mode='initial'``, each capture a stream of its own, whose consistent
  snapshot, taken when the stream is made, is what every attempt reads) killed at a sample of their
  boundaries (``SUITE_SNAPSHOT_FAULTS``). Every change committed after the stream was made is
  streamed, whether or not the killed snapshot landed.

The larger sweep: random fault points (every one of ``SNAPSHOT_FAULTS`` and ``STREAM_FAULTS``),
occurrences and moments, raised faults and transient RPC errors (``GetChanges`` or
``SetCDCCheckpoint``, absorbed or failing the task) on the stream windows of a snapshotted capture,
and now and then a snapshot of a capture (and stream) of its own:

    CDC_CRASH_SWEEP=200 ./scripts/test.sh tests/integration/yugabyte_cdc/test_crash_safety.py -k sweep

(``CDC_CRASH_SEED`` fixes the random choices, ``CDC_CRASH_REPORT=<file>`` writes a JSON report.)
"""

from __future__ import annotations

import hashlib
import os
import random
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_cdc.cdc.sources.yugabyte_cdc.client import RetryPolicy, YbCdcClient
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.transactions import ROW_OPS
from tests.support import crash as harness
from tests.support import yb_workload as workload
from tests.support.crash import KILLED, CrashCapture
from tests.support.crash_sources import YugabyteCdcCrashSource, metadata_variables
from tests.support.yugabyte_cdc import YugabyteCdcStandIn

pytestmark = [pytest.mark.spark, pytest.mark.slow]

KEYS = workload.KEYS

# (point, n-th time reached): every boundary of a snapshot run (two tables).
SNAPSHOT_FAULTS = [
    ("operator.pending_saved", 1),  # the pending snapshot window stored, nothing read
    ("snapshot.exported", 1),  # every tablet bootstrapped at the stream's snapshot, nothing written
    ("snapshot.table_written", 1),
    ("snapshot.table_written", 2),
    ("sink.committed", 1),
    ("operator.offset_saved", 1),  # the offset saved, the tablets' checkpoints not stored yet
    ("operator.acknowledged", 1),
]
#: The suite's sample of SNAPSHOT_FAULTS (all are in the sweep, with random moments), to keep the
#: suite's CI time within budget (a crash past ``snapshot.exported`` starts Spark in the child: some
#: 15-20 s on two cores): every tablet bootstrapped on the server and nothing read; one table written
#: (its pages sent with the bootstrap's checkpoint); the commit landed without the offset (the next
#: run takes the tablets' streaming starts from the commit entry). Left out: the pending window
#: alone and the offset saved without the server's checkpoints (the stream windows' cases reach the
#: same code), the second table's write (like the first), ``operator.acknowledged`` (the whole run).
SUITE_SNAPSHOT_FAULTS = [
    ("snapshot.exported", 1),
    ("snapshot.table_written", 1),
    ("sink.committed", 1),
]
# Every boundary of a stream window; chunks of 3 changes, so a window writes several.
STREAM_FAULTS = [
    ("operator.pending_saved", 1),  # the pending window stored with the tablets it starts from
    ("window.streaming", 1),  # the tablets' pagers open, nothing read
    ("window.chunk_written", 1),
    ("window.chunk_written", 3),
    ("window.read_done", 1),  # every tablet read to the window's end, nothing committed
    ("sink.committed", 1),
    ("operator.offset_saved", 1),  # the offset saved, the server's checkpoints not
    ("operator.acknowledged", 1),
]
CHUNK = 3
CUSTOMERS = 60
#: The CDC service's retriable failure the transient-error cycles inject.
NOT_READY = {"service_code": "LEADER_NOT_READY", "status_code": "LEADER_NOT_READY_TO_SERVE"}


def _seed() -> int:
    return int(os.environ.get("CDC_CRASH_SEED", "20261123"))


def _start(request, clusters, name: str, *, customers: int) -> YugabyteCdcStandIn:
    digest = hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:6]
    standin = YugabyteCdcStandIn(clusters["pg15"], f"ybc_crash_{name}_{digest}", rpc_heartbeat_interval=0.3).start()
    try:
        workload.create(standin, customers=customers, orders_per_customer=2)
        standin.wait_caught_up()
    except BaseException:
        standin.stop()
        raise
    return standin


def _adapter(standin: YugabyteCdcStandIn) -> Iterator[tuple[YugabyteCdcCrashSource, harness.Workload]]:
    """The adapter on ``standin``, its Airflow connection, and one workload (its round numbers
    pick new keys: one counter per database)."""
    source = YugabyteCdcCrashSource(standin, f"ybc_{standin.database}")
    with pytest.MonkeyPatch.context() as patch, metadata_variables():
        patch.setenv(f"AIRFLOW_CONN_{source.conn_id.upper()}", source.airflow_connection())
        yield source, harness.Workload(source)


@pytest.fixture
def empty_source(request, clusters, spark, airflow_db):
    """A stand-in whose tables have no rows yet (a ``snapshot_mode='never'`` capture starts on
    it, so every row is one its windows captured), for one test."""
    standin = _start(request, clusters, "never", customers=0)
    try:
        yield from _adapter(standin)
    finally:
        standin.stop()


@pytest.fixture(scope="module")
def seeded_source(request, clusters, spark, airflow_db):
    """One stand-in with seeded tables for the module's snapshotting captures (each has a stream,
    hence a consistent snapshot, of its own)."""
    standin = _start(request, clusters, "snap", customers=CUSTOMERS)
    try:
        yield from _adapter(standin)
    finally:
        standin.stop()


def new_capture(source: YugabyteCdcCrashSource, prefix: str, sink: Path, **overrides) -> CrashCapture:
    """A capture with a new stream of its own (made now, before its setup, as a DBA would)."""
    capture = CrashCapture.of(source, prefix, sink, KEYS, chunk=CHUNK, overrides=overrides)
    source.create_stream(prefix)
    return capture


def seed_rows(source: YugabyteCdcCrashSource, writes: harness.Workload, customers: int = CUSTOMERS) -> None:
    """The workload's seed (customers and two orders each, as ``yb_workload.create``) in one
    transaction, counted in ``writes``."""
    with source.standin.connect(autocommit=False) as conn:
        conn.execute(
            "INSERT INTO public.customers (id, name, email, balance, active) SELECT c, 'customer ' || c, "
            "'c' || c || '@example.com', c * 10 + 0.25, c %% 2 = 0 FROM generate_series(1, %s) c",
            (customers,),
        )
        conn.execute(
            "INSERT INTO public.orders (id, customer_id, amount, note) SELECT c * 100 + o, c, (c * 100 + o) / 10.0, "
            "CASE WHEN o = 0 THEN 'note ' || (c * 100 + o) END FROM generate_series(1, %s) c, generate_series(0, 1) o",
            (customers,),
        )
        conn.commit()
    writes.transactions += 1


def start_never_capture(
    source: YugabyteCdcCrashSource, writes: harness.Workload, prefix: str, sink: Path
) -> CrashCapture:
    """A ``snapshot_mode='never'`` capture on empty tables whose first window is killed once its
    tablets are checkpointed at their latest ops and stored with the pending window; then the
    seed is written and the retry (which must start from those checkpoints) covers it."""
    capture = new_capture(source, prefix, sink, snapshot_mode="never")
    capture.run("setup")
    result = capture.child("batch", fault=harness.fault("operator.pending_saved", 1))
    assert result.killed, result.describe()
    pending = capture.stored_offset()
    assert pending is not None and pending.pending is not None and len(pending.tablets.polled()) == 6, pending
    seed_rows(source, writes)  # lost, and the verify fails, if the retry started anywhere later
    capture.catch_up()
    capture.verify(transactions=writes.transactions)
    return capture


def _child_span(seen: harness.StreamCycles) -> float:
    """Random kills land anywhere in a window task: up to the latest a fault point killed one
    (``operator.acknowledged``: the whole task)."""
    return max(seen.child, seen.catch_up)


def test_stream_windows_killed_at_every_step_lose_and_duplicate_nothing(empty_source, tmp_path):
    source, writes = empty_source
    capture = start_never_capture(source, writes, "stream", tmp_path / "lake")
    rng = random.Random(_seed())
    cycles = (
        [{"fault": harness.fault(p, n)} for p, n in STREAM_FAULTS]
        # An error (not a kill) unwinds normally: the retry must cope with what it leaves (an error
        # after the offset save: the SetCDCCheckpoint failure of the transient-error test).
        + [{"fault": harness.fault("window.chunk_written", 2, "raise")}]
        # Random moments, one in each half of a window task, with a writer committing meanwhile.
        + [{"random": True, "between": (i / 2, (i + 1) / 2)} for i in range(2)]
    )
    seen = harness.stream_crashes(capture, writes, cycles, rng, random_span=_child_span, writer_rounds=1)
    print(f"outcomes {dict(seen.outcomes)}; the random kills left: {dict(seen.left)}")
    assert seen.outcomes["killed"] >= len(STREAM_FAULTS), seen.outcomes
    assert seen.counts is not None and seen.counts["transactions"] == writes.transactions


def rpc_failure(
    capture: CrashCapture, writes: harness.Workload, method: str, times: int, *, expected: tuple[int, ...], **where
) -> harness.ChildResult:
    """A round of writes, then a window task whose next ``times`` calls of ``method`` (on
    ``where``'s tablet) fail, retriably; ``expected``: its allowed exit codes (0: the job's retries
    absorbed them, 1: they ran out); then recovery and every check."""
    source: YugabyteCdcCrashSource = capture.source  # type: ignore[assignment]
    writes.mutate()
    source.standin.fail_next(method, f"injected {method} failure", times=times, **NOT_READY, **where)
    result = capture.child("batch")
    assert result.returncode in expected, result.describe()
    if result.returncode == 1:
        assert f"injected {method} failure" in result.stderr, result.describe()
    capture.catch_up()
    capture.verify(transactions=writes.transactions)
    return result


def test_transient_rpc_errors_are_retried_and_leave_nothing_ahead(seeded_source, tmp_path):
    """Retriable CDC-service errors: a few ``GetChanges`` failures the job's retries absorb, and a
    ``SetCDCCheckpoint`` that fails every attempt after the offset save. (``GetChanges`` failing
    every attempt fails the window before its commit, as a raised fault does: in the sweep.)"""
    source, shared = seeded_source
    capture = new_capture(source, "rpc", tmp_path / "lake", snapshot_mode="initial")
    capture.run("setup")
    capture.run("snapshot")
    writes = shared.fork()  # the transactions this capture streams

    # A few failures of one tablet's GetChanges: the job's retries absorb them.
    rpc_failure(capture, writes, "GetChanges", 3, expected=(0,), tablet_id=source.standin_tablets()[0])

    # Every attempt of SetCDCCheckpoint on a tablet the window moves fails after the offset save:
    # the task fails, the server keeps the tablet's previous checkpoint (behind, never ahead: the
    # harness checks every tablet after the child), and the next run stores the new one.
    acknowledged = capture.stored_offset()
    writes.mutate()
    source.settle()
    moved = source.standin.tablet_for("public.customers", 1000 * (writes.round + 1))  # the round's new customer
    source.standin.fail_next(
        "SetCDCCheckpoint",
        "injected SetCDCCheckpoint failure",
        times=RetryPolicy().attempts,
        tablet_id=moved,
        **NOT_READY,
    )
    result = capture.child("batch")
    assert result.returncode == 1 and "injected SetCDCCheckpoint failure" in result.stderr, result.describe()
    saved = capture.stored_offset()
    assert saved.pending is None and saved.window_seq == acknowledged.window_seq + 1, saved
    stored = saved.tablets[moved].position.checkpoint
    assert source.server_checkpoint(capture, moved) < (stored.term, stored.index), "the tablet's checkpoint moved"
    capture.catch_up()
    capture.verify(transactions=writes.transactions)


def snapshot_crash(capture: CrashCapture, writes: harness.Workload, crash: dict) -> dict:
    """A new capture (its stream just made) whose first snapshot is killed as ``crash`` says
    (``{"point", "nth"}`` or ``{"kill_after"}``); then recovered and checked. Unlike a slot's,
    the stream's snapshot is the one taken when it was made, for every attempt: what is committed
    after it is streamed, whether or not the killed snapshot landed."""
    baseline = writes.transactions  # the stream was made just now: what came before is in its snapshot
    capture.run("setup")
    if crash.get("kill_after") is not None:
        result = capture.child("snapshot", kill_after=crash["kill_after"])
        assert result.returncode in (KILLED, 0), result.describe()
    else:
        result = capture.child("snapshot", fault=harness.fault(crash["point"], crash["nth"]))
        assert result.killed, result.describe()
    writes.mutate()
    capture.run("snapshot")  # skipped when the killed one landed
    writes.mutate()
    capture.catch_up()
    counts = capture.verify(transactions=writes.transactions - baseline)
    return {"killed": result.killed, "elapsed": result.elapsed, **counts}


@pytest.mark.parametrize(
    "crash",
    [{"point": p, "nth": n} for p, n in SUITE_SNAPSHOT_FAULTS],
    ids=[f"{p}:{n}" for p, n in SUITE_SNAPSHOT_FAULTS],
)
def test_a_snapshot_killed_at_any_step_is_completed_by_the_next_run(seeded_source, tmp_path, crash):
    source, shared = seeded_source
    prefix = "snap_" + "_".join(str(v) for v in crash.values()).replace(".", "_")[:40]
    capture = new_capture(source, prefix, tmp_path / "lake", snapshot_mode="initial")
    outcome = snapshot_crash(capture, shared.fork(), crash)
    assert outcome["killed"]
    offset = capture.stored_offset()
    assert offset.snapshot_completed and offset.window_seq >= 2, offset


@pytest.mark.skipif(not os.environ.get("CDC_CRASH_SWEEP"), reason="set CDC_CRASH_SWEEP=<n> for the long sweep")
@pytest.mark.timeout(4 * 3600)  # the suite's 15-minute limit is for ordinary tests
def test_crash_sweep(seeded_source, tmp_path):
    """``CDC_CRASH_SWEEP`` crashes at random fault points, random occurrences, random moments: the
    stream windows of a snapshotted capture, and now and then a snapshot of a capture of its own."""
    source, shared = seeded_source
    total, seed = harness.sweep_settings()
    rng = random.Random(seed)
    capture = new_capture(source, "sweep", tmp_path / "lake", snapshot_mode="initial")
    capture.chunk = rng.choice([2, 3, 10])
    capture.run("setup")
    capture.run("snapshot")
    writes = shared.fork()
    report: dict = {"crashes": total, "by_point": Counter(), "outcomes": Counter()}
    seen = harness.StreamCycles(report["outcomes"])
    started = time.monotonic()
    for i in range(total):
        kind = rng.random()
        if kind < 0.08:  # a snapshot crash, on a capture (and stream) of its own
            if rng.random() < 0.5:
                point, nth = rng.choice(SNAPSHOT_FAULTS)
                crash, label = {"point": point, "nth": nth}, f"snapshot {point}:{nth}"
            else:
                crash, label = {"kill_after": rng.uniform(0.5, 20.0)}, "snapshot random"  # the child: ~19 s
            own = new_capture(source, f"snap{i}", tmp_path / f"snap{i}", snapshot_mode="initial")
            outcome = snapshot_crash(own, writes, crash)  # its writes are the main capture's too
            report["outcomes"]["killed" if outcome["killed"] else "completed"] += 1
        elif kind < 0.14:  # a transient RPC error: absorbed by the job's retries, or failing the task
            method = rng.choice(["GetChanges", "SetCDCCheckpoint"])
            times = rng.choice([1, 3, RetryPolicy().attempts])
            tablet = rng.choice(source.standin_tablets())
            result = rpc_failure(capture, writes, method, times, expected=(0, 1), tablet_id=tablet)
            report["outcomes"][result.outcome] += 1
            label = f"rpc {method} x{times}"
        elif kind < 0.58:
            point, nth = rng.choice(STREAM_FAULTS)
            if point == "window.chunk_written":
                nth = rng.randint(1, 6)
            action = "raise" if rng.random() < 0.15 else "kill"
            harness.stream_crash(
                capture,
                writes,
                fault_spec=harness.fault(point, nth, action),
                writer_rounds=rng.randint(0, 3),
                expected=(KILLED, 0, 1),
                seen=seen,
            )
            label = f"stream {point}:{nth} ({action})"
        else:
            harness.stream_crash(
                capture,
                writes,
                kill_after=rng.uniform(0.0, _child_span(seen)),
                writer_rounds=rng.randint(0, 3),
                seen=seen,
            )
            label = "stream random"
        report["by_point"][label] += 1
    report["random_kills_left"] = seen.left
    report.update(capture.verify(transactions=writes.transactions), minutes=round((time.monotonic() - started) / 60, 1))
    harness.write_report({"seed": seed, "source": "yugabyte_cdc", **report})


#: Kill points of a window that reads a split tablet: the parent refused (TABLET_SPLIT) and its
#: children read, nothing committed (``window.read_done``).
SPLIT_FAULT = ("window.read_done", 1)


def test_a_split_then_a_kill_before_the_commit_loses_and_doubles_nothing(empty_source, tmp_path, monkeypatch):
    """Tablet splits around a killed window (docs/research/issue29/cdc-service.md §1.3, step 4).

    First a tablet splits between windows, with writes before and after; the window that reads it is
    killed after reading the parent (which answers TABLET_SPLIT at once) and its children, before the
    commit. The server's parent checkpoint is not past the offset (checked after the child); the
    recovery reads the children from the window's start again. Then a window is killed before it
    reads anything, and its recovery (in this process) sees a tablet split between two of its pages:
    the parent refuses the next page at once and the children send the rest from their copies of
    its log. Nothing is lost or doubled either time."""
    source, writes = empty_source
    capture = start_never_capture(source, writes, "split", tmp_path / "lake")
    writes.mutate()
    parent = next(t["tablet_id"] for t in source.standin.tablets("public.customers") if not t["children"])
    source.standin.split(parent)
    writes.mutate()
    result = capture.child("batch", fault=harness.fault(*SPLIT_FAULT))
    assert result.killed, result.describe()
    capture.catch_up()
    capture.verify(transactions=writes.transactions)
    stored = capture.stored_offset()
    assert stored is not None and stored.tablets[parent].split, stored

    for _ in range(3):
        writes.mutate()
    result = capture.child("batch", fault=harness.fault("window.streaming", 1))
    assert result.killed, result.describe()
    split: list[str] = []
    polled = set(stored.tablets.polled())
    real = YbCdcClient.get_changes

    def get_changes(client: YbCdcClient, tablet_id: str, position, **kw):
        response = real(client, tablet_id, position, **kw)
        rows = [r for r in response.cdc_sdk_proto_records if r.row_message.op in ROW_OPS]
        if rows and not split and tablet_id in polled:  # a tablet not split yet
            split.append(tablet_id)
            source.standin.split(tablet_id)  # between this page and the next
        return response

    monkeypatch.setattr(YbCdcClient, "get_changes", get_changes)
    source.standin.set(changes_page_size=3)
    try:
        capture.catch_up()
    finally:
        source.standin.set(changes_page_size=500)
    assert split, "no tablet split during the recovery"
    capture.verify(transactions=writes.transactions)
