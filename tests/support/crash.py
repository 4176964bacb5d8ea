"""Crash-safety harness: run capture tasks in a child process, kill it, recover, check everything.

A :class:`CrashCapture` is one capture (prefix, sink, and its source's settings) on a test
database of any source; what differs per source is behind its :class:`CrashSource` adapter
(``tests/support/crash_sources.py``). ``child()`` runs a task in a separate Python process
(``tests/support/crash_driver.py``) that is killed with ``SIGKILL`` at a named fault point or
after a delay; ``run()`` runs a task in the test process (the "next run" that must repair
whatever the crash left). ``verify()`` checks every promise:

- the committed windows are numbered 1..n without gaps and stream windows are contiguous;
- no change event appears twice (stream: commit LSN + position in the transaction; snapshot:
  key within its window), and every transaction lies in exactly one window;
- the transaction side table has one BEGIN and one END per transaction, and END's counts
  equal the events written for it, per table;
- replaying the committed events gives exactly the source tables;
- the stored offset names the last committed window, nothing pending, and the source holds
  nothing behind it (PostgreSQL: the slot is acknowledged there).

The sink may be on an object store: a ``sink`` under an ``s3://`` prefix, with the overrides of
:func:`object_store_connection` (an Airflow ``aws`` connection both processes read, as workers do)
and, for Iceberg, a ``table_catalog`` override that ``verify`` reads the tables with too.

The crash procedures shared by every source's crash tests follow: :func:`snapshot_crash` (a
capture whose first snapshot is killed), :func:`stream_crashes` (stream windows killed at fault
points and at random moments, with writers), :func:`crash_sweep` (the long random sweep).
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_provider_cdc.captures.base import Capture
from airflow_provider_cdc.cdc.basics.errors import ConcurrentCaptureError
from airflow_provider_cdc.cdc.planning.offset import CaptureOffset
from airflow_provider_cdc.cdc.sinks.reader import committed_windows, read_topic_arrow
from airflow_provider_cdc.version_compat import AirflowSkipException
from tests.support.crash_sources import CrashSource, PostgresCrashSource
from tests.support.databases import CaptureDatabase
from tests.support.oracle import assert_same_state, replay

ROOT = Path(__file__).resolve().parents[2]
KILLED = -signal.SIGKILL
# Every child (and its Spark workers) imports Airflow, Spark and the provider anew: with bytecode
# caches (outside the work tree, also where PYTHONDONTWRITEBYTECODE keeps them out of it) that
# takes seconds less per child.
CHILD_BYTECODE = {"PYTHONPYCACHEPREFIX": str(Path(tempfile.gettempdir()) / f"cdc-crash-pycache-{os.getuid()}")}


def assert_tables_hold_the_log(
    sink: str, prefix: str, entries: list, sink_format: str, table_catalog: dict[str, str] | None = None
) -> None:
    """Each landed dataset's lake table, read whole by its own library (not through the commit
    log), holds exactly the windows the log committed, each with the events the log counted."""
    from airflow_provider_cdc.cdc.basics.naming import Topic
    from airflow_provider_cdc.cdc.sinks.formats import local_base
    from airflow_provider_cdc.cdc.sinks.lake_tables import table_format

    tables = table_format(sink_format, local_base(sink), prefix, table_catalog)
    expected: dict[str, Counter] = defaultdict(Counter)
    directories = {}
    for entry in entries:
        for dataset in entry.datasets:
            if dataset.topic.startswith(prefix + ":"):
                continue  # the product's own staged files, not a landed dataset
            directories[dataset.topic] = dataset.path.split("/window=", 1)[0]
            expected[dataset.topic][entry.window_id] += dataset.events
    for name, directory in directories.items():
        rows = tables.scan_arrow(Topic(name, directory))
        held = Counter(rows.column("window_id").to_pylist()) if rows is not None else Counter()
        assert held == expected[name], f"{name}: the table holds {dict(held)}, the log says {dict(expected[name])}"


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


def object_store_connection(monkeypatch: Any, s3_server: Any, conn_id: str = "crash_s3") -> dict[str, Any]:
    """An Airflow ``aws`` connection to the suite's S3 server (admin keys) in this process's
    environment, which the child processes inherit; returns the capture overrides that name it
    (``object_store_conn_id``), so a capture whose sink is under an ``s3://`` prefix reaches the
    store in both processes the way a deployment does."""
    from tests.support.s3_server import ADMIN

    aws = {"conn_type": "aws", "login": ADMIN[0], "password": ADMIN[1], "extra": s3_server.connection_extra()}
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(aws))
    return {"object_store_conn_id": conn_id}


@dataclass
class ChildResult:
    returncode: int
    stdout: str
    stderr: str
    elapsed: float = 0.0  # seconds from the child's "ready" (imports done) to its end

    @property
    def killed(self) -> bool:
        return self.returncode == KILLED

    @property
    def outcome(self) -> str:
        return "killed" if self.killed else "failed" if self.returncode == 1 else "completed"

    def describe(self) -> str:
        return f"exit {self.returncode}\n--- stderr (tail) ---\n{self.stderr[-3000:]}"


class CrashCapture:
    """One capture under crash tests. ``CrashCapture(db, conn_id, prefix, sink, keys, ...)`` is a
    PostgreSQL capture (state-table offsets in ``offset_table``); :meth:`of` takes any source's
    adapter."""

    def __init__(
        self,
        db: CaptureDatabase,
        conn_id: str,
        prefix: str,
        sink: Path | str,
        keys: dict[str, list[str]],
        chunk: int = 100_000,
        offset_table: str = "cdc_state.offsets",
        overrides: dict[str, Any] | None = None,
    ):
        self._init(PostgresCrashSource(db, conn_id, offset_table), prefix, sink, keys, chunk, overrides)

    @classmethod
    def of(
        cls,
        source: CrashSource,
        prefix: str,
        sink: Path | str,
        keys: dict[str, list[str]],
        *,
        chunk: int = 100_000,
        overrides: dict[str, Any] | None = None,
    ) -> CrashCapture:
        crash = cls.__new__(cls)
        crash._init(source, prefix, sink, keys, chunk, overrides)
        return crash

    def _init(self, source, prefix, sink, keys, chunk, overrides) -> None:
        self.source = source
        self.prefix = prefix
        self.sink = sink
        self.keys = keys
        self.chunk = chunk
        self.overrides = dict(overrides or {})

    # PostgreSQL's names, kept for the tests written before there were adapters.
    @property
    def db(self) -> CaptureDatabase:
        return self.source.db  # type: ignore[attr-defined]

    @property
    def conn_id(self) -> str:
        return self.source.conn_id  # type: ignore[attr-defined]

    @property
    def offset_table(self) -> str:
        return self.source.offset_table  # type: ignore[attr-defined]

    @property
    def slot(self) -> str:
        return self.source.slot(self.prefix)  # type: ignore[attr-defined]

    def fields(self) -> dict[str, Any]:
        return {
            "tables": list(self.keys),
            "topic_prefix": self.prefix,
            "sink_path": str(self.sink),
            "spark_master": "local[2]",
            "max_changes_per_chunk": self.chunk,
            **self.source.capture_fields(self),
            **self.overrides,
        }

    def capture(self) -> Capture:
        return self.source.build(self.fields())

    @property
    def table_catalog(self) -> dict[str, str] | None:
        return self.overrides.get("table_catalog")

    @contextmanager
    def store_access(self) -> Iterator[None]:
        """The capture's object-store access active in this process while the harness reads the
        sink (through ``object_store_conn_id``, as the tasks get it; nothing for a local sink)."""
        from airflow_provider_cdc.cdc.sinks import object_store

        with object_store.using(None if object_store.current() else self.capture().object_store_access()):
            yield

    # -- running -------------------------------------------------------------------------------

    def child(
        self, step: str, *, fault: str | None = None, kill_after: float | None = None, timeout: float = 600
    ) -> ChildResult:
        """Run ``step`` in a child process, with a fault (``point:action[:n]``) or killed with
        ``SIGKILL`` ``kill_after`` seconds after its imports finished (wherever it then is)."""
        env = dict(os.environ)
        env.pop("AIRFLOW_CDC_FAULT", None)
        env.update(CHILD_BYTECODE)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env.update(self.source.child_env(self))
        if fault is not None:
            env["AIRFLOW_CDC_FAULT"] = fault
        config = {"source": self.source.NAME, "step": step, "capture": self.fields()}
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.crash_driver", json.dumps(config)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        ready = proc.stdout.readline().strip() == "ready"
        started = time.monotonic()
        if kill_after is not None and ready:
            time.sleep(kill_after)
            proc.send_signal(signal.SIGKILL)
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        self.source.after_child(self)
        return ChildResult(proc.returncode, stdout, stderr, time.monotonic() - started if ready else 0.0)

    def run(self, step: str) -> dict | None:
        """Run ``step`` in this process (None if skipped); waits out a dying predecessor's lock.
        First waits until the source's change capture has everything committed so far."""
        self.source.settle()
        operator = self.source.operator(step)(task_id=step, capture=self.capture())
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
        target = self.source.position()
        parse = self.capture().position
        summaries = []
        for _ in range(5):
            summary = self.run("batch")
            assert summary is not None
            summaries.append(summary)
            if parse(summary["to_lsn"]) >= target:
                return summaries
        raise AssertionError(f"five batch runs did not reach {target}: {summaries}")

    # -- checking ------------------------------------------------------------------------------

    def stored_offset(self) -> CaptureOffset | None:
        return self.source.stored_offset(self)

    def verify(self, *, transactions: int | None = None) -> dict[str, int]:
        """Check every invariant (see the module docstring); returns counts for reporting."""
        with self.store_access():
            return self._verify(transactions)

    def _verify(self, transactions: int | None) -> dict[str, int]:
        self.source.settle()
        sink = str(self.sink)
        entries = committed_windows(sink, self.prefix)
        assert entries, "nothing was committed"
        assert [e.window.seq for e in entries] == list(range(1, len(entries) + 1)), "window numbers have gaps"
        for previous, entry in itertools.pairwise(entries):
            if entry.window.kind == "stream":
                assert entry.window.from_lsn == previous.window.to_lsn, (
                    f"{entry.window.describe()} does not start where {previous.window.describe()} ended"
                )

        if self.overrides.get("sink_format", "parquet") != "parquet":
            assert_tables_hold_the_log(sink, self.prefix, entries, self.overrides["sink_format"], self.table_catalog)

        stream_events: dict[str, list[dict]] = {}
        positions: Counter = Counter()
        windows_of_tx: dict[str, set[str]] = defaultdict(set)
        per_tx_table: Counter = Counter()
        for table, keys in self.keys.items():
            events = _rows(sink, self.prefix, f"{self.prefix}.{table}", self.table_catalog)
            snapshot_keys = Counter(
                (e["window_id"], tuple(e["after"][k] for k in keys)) for e in events if e["op"] == "r"
            )
            repeated = [k for k, n in snapshot_keys.items() if n > 1]
            assert not repeated, f"{table}: snapshot rows written twice: {repeated[:5]}"
            self.source.check_events(table, events)
            stream_events[table] = [e for e in events if e["op"] != "r"]
            for e in stream_events[table]:
                positions[(e["source"]["commit_lsn"], e["transaction"]["total_order"])] += 1
                windows_of_tx[e["transaction"]["id"]].add(e["window_id"])
                per_tx_table[(e["transaction"]["id"], table)] += 1
            assert_same_state(replay(events, keys), self.source.source_rows(table, keys))
        duplicated = [p for p, n in positions.items() if n > 1]
        assert not duplicated, f"change events written twice: {duplicated[:5]}"
        split = {tx: w for tx, w in windows_of_tx.items() if len(w) > 1}
        assert not split, f"transactions spread over windows: {split}"

        tx_rows = _rows(sink, self.prefix, f"{self.prefix}.transaction", self.table_catalog)
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
        self.source.check_acknowledged(self, offset)
        return {
            "windows": len(entries),
            "transactions": len(ends),
            "change_events": sum(positions.values()),
        }


def _rows(sink: str, prefix: str, topic: str, table_catalog: dict[str, str] | None = None) -> list[dict]:
    table = read_topic_arrow(sink, prefix, topic, table_catalog=table_catalog)
    return [] if table is None else table.to_pylist()


# -- the crash procedures, for every source ----------------------------------------------------------


class _Rounds:
    """Round numbers, handed out once each (across threads and forked workloads)."""

    def __init__(self) -> None:
        self.last = 0
        self._lock = threading.Lock()

    def next(self) -> int:
        with self._lock:
            self.last += 1
            return self.last


class Workload:
    """The source's activity between (and during) runs; counts the transactions it commits. Round
    numbers pick new keys, so they are unique per source database: a second workload on the same
    database is a :meth:`fork` of the first."""

    def __init__(self, source: CrashSource, rounds: _Rounds | None = None):
        self.source = source
        self.transactions = 0
        self._rounds = rounds if rounds is not None else _Rounds()
        self._lock = threading.Lock()

    @property
    def round(self) -> int:
        """The last round number handed out (by this workload or the ones sharing its rounds)."""
        return self._rounds.last

    def fork(self) -> Workload:
        """A workload on the same database, sharing the round numbers, that counts its own
        transactions (those a capture snapshotted from now on will stream)."""
        return Workload(self.source, self._rounds)

    def mutate(self) -> None:
        made = self.source.mutate(self._rounds.next())
        with self._lock:
            self.transactions += made

    def in_background(self, rounds: int) -> threading.Thread:
        def work():
            for _ in range(rounds):
                self.mutate()

        thread = threading.Thread(target=work)
        thread.start()
        return thread


def fault(point: str, nth: int, action: str = "kill") -> str:
    """``AIRFLOW_CDC_FAULT``'s value: ``action`` the ``nth`` time ``point`` is reached."""
    return f"{point}:{action}:{nth}"


#: Every boundary of a window that emits and stages incremental snapshot chunks.
INCREMENTAL_FAULTS = [
    ("incremental.chunk_staged", 1),
    ("incremental.chunk_staged", 2),
    ("window.read_done", 1),
    ("sink.committed", 1),
    ("operator.offset_saved", 1),
    ("operator.pending_saved", 1),
]


def incremental_crashes(
    capture: CrashCapture,
    workload: Workload,
    rng: random.Random,
    *,
    kills: int,
    kill_span: tuple[float, float],
    writer_rounds: int,
) -> None:
    """A running incremental snapshot's windows killed at every boundary and ``kills`` random
    moments, a writer committing meanwhile; each recovered and checked, then the snapshot finished
    and every table's history ``done``."""
    cycles: list[dict] = [{"fault": fault(p, n)} for p, n in INCREMENTAL_FAULTS]
    cycles += [{"kill_after": rng.uniform(*kill_span)} for _ in range(kills)]
    rng.shuffle(cycles)
    for cycle in cycles:
        writer = workload.in_background(writer_rounds)
        if "fault" in cycle:
            result = capture.child("batch", fault=cycle["fault"])
        else:
            result = capture.child("batch", kill_after=cycle["kill_after"])
        assert result.returncode in (-9, 0), result.describe()
        writer.join()
        capture.catch_up()
        capture.verify(transactions=workload.transactions)
    for _ in range(40):  # finish the snapshot
        offset = capture.stored_offset()
        if offset is not None and offset.incremental is not None and offset.incremental.idle:
            break
        capture.run("batch")
    offset = capture.stored_offset()
    assert offset is not None and offset.incremental is not None and offset.incremental.idle
    assert {t.status for t in offset.incremental.history} == {"done"}, offset.incremental.summary()
    capture.verify(transactions=workload.transactions)


def snapshot_crash(capture: CrashCapture, workload: Workload, crash: dict) -> dict:
    """A new capture whose first snapshot is killed as ``crash`` says (``{"point", "nth"}`` or
    ``{"kill_after"}``); then recovered and checked. Returns the outcome and ``verify``'s counts."""
    capture.run("setup")
    baseline = workload.transactions
    if crash.get("kill_after") is not None:
        result = capture.child("snapshot", kill_after=crash["kill_after"])
        assert result.returncode in (-9, 0), result.describe()
    else:
        result = capture.child("snapshot", fault=fault(crash["point"], crash["nth"]))
        assert result.killed, result.describe()
    # Changes made before the next run are in its snapshot, or streamed if the snapshot landed.
    with capture.store_access():
        landed = bool(committed_windows(str(capture.sink), capture.prefix))
    workload.mutate()
    if not landed:
        baseline = workload.transactions
    capture.run("snapshot")
    workload.mutate()
    capture.catch_up()
    counts = capture.verify(transactions=workload.transactions - baseline)
    return {"killed": result.killed, "elapsed": result.elapsed, **counts}


@dataclass
class StreamCycles:
    """What :func:`stream_crashes` saw: outcomes, and the durations that calibrate random kills."""

    outcomes: Counter
    catch_up: float = 1.0  # seconds the last recovery (catch_up in this process) took
    child: float = 0.0  # the longest a child ran (from ready) before a fault point killed it
    counts: dict | None = None  # the last verify's counts
    left: Counter = field(default_factory=Counter)  # what the random kills left (see left_behind)


def stream_crash(
    capture: CrashCapture,
    workload: Workload,
    *,
    fault_spec: str | None = None,
    kill_after: float | None = None,
    writer_rounds: int = 0,
    expected: Sequence[int] | None = None,
    seen: StreamCycles | None = None,
) -> ChildResult:
    """One stream cycle: a round of writes, a window task killed by ``fault_spec`` or after
    ``kill_after`` seconds while ``writer_rounds`` rounds are written concurrently, then recovery
    (batch runs until everything committed is covered) and ``verify``. ``expected``: the child's
    allowed exit codes (default: what the fault's action makes it, or killed/done for a kill)."""
    seen = seen if seen is not None else StreamCycles(Counter())
    stored = capture.stored_offset()
    before = stored.window_seq if stored is not None else 0
    workload.mutate()
    writer = workload.in_background(writer_rounds) if writer_rounds else None
    try:
        if fault_spec is not None:
            result = capture.child("batch", fault=fault_spec)
            if expected is None:
                expected = (1,) if fault_spec.split(":")[1] == "raise" else (KILLED,)
        else:
            result = capture.child("batch", kill_after=kill_after)
            expected = expected or (KILLED, 0)
    finally:
        if writer is not None:
            writer.join()
    assert result.returncode in expected, result.describe()
    if result.returncode == 1:
        assert "fault injected at" in result.stderr, result.describe()
    seen.outcomes[result.outcome] += 1
    if result.killed and fault_spec is not None:
        seen.child = max(seen.child, result.elapsed)
    if kill_after is not None:
        seen.left[left_behind(capture, before) if result.killed else "completed"] += 1
    started = time.monotonic()
    capture.catch_up()
    seen.catch_up = max(0.3, time.monotonic() - started)
    seen.counts = capture.verify(transactions=workload.transactions)
    return result


def left_behind(capture: CrashCapture, before: int) -> str:
    """Where a killed window task died, by what it left (``before``: the offset's window then)."""
    offset = capture.stored_offset()
    with capture.store_access():
        entries = committed_windows(str(capture.sink), capture.prefix)
    last = entries[-1].window.seq if entries else 0
    if offset is not None and offset.pending is not None:
        return "committed, offset pending" if last >= offset.pending.seq else "pending, nothing committed"
    return "offset saved" if offset is not None and offset.window_seq > before else "nothing stored"


def stream_crashes(
    capture: CrashCapture,
    workload: Workload,
    cycles: Sequence[dict],
    rng: random.Random,
    *,
    random_span: Callable[[StreamCycles], float] = lambda seen: seen.catch_up,
    writer_rounds: int = 2,
) -> StreamCycles:
    """Stream cycles on ``capture`` (after its snapshot): ``{"fault": "<point:action:n>"}`` or
    ``{"random": True}``, a kill ``rng.uniform(0, random_span(seen))`` seconds into the window task
    (``{"random": True, "between": (a, b)}``: between those fractions of the span), with
    ``writer_rounds`` rounds of writes committed meanwhile."""
    seen = StreamCycles(Counter())
    for cycle in cycles:
        if cycle.get("random"):
            low, high = cycle.get("between", (0.0, 1.0))
            span = random_span(seen)
            stream_crash(
                capture,
                workload,
                kill_after=rng.uniform(low * span, high * span),
                writer_rounds=writer_rounds,
                seen=seen,
            )
        else:
            stream_crash(capture, workload, fault_spec=cycle["fault"], seen=seen)
    return seen


def crash_sweep(
    capture: CrashCapture,
    workload: Workload,
    new_capture: Callable[[str], CrashCapture],
    *,
    total: int,
    rng: random.Random,
    snapshot_faults: Sequence[tuple[str, int]],
    stream_faults: Sequence[tuple[str, int]],
    snapshot_kill_span: tuple[float, float] = (0.5, 6.0),
    random_span: Callable[[StreamCycles], float] = lambda seen: seen.catch_up,
) -> dict:
    """``total`` crashes at random fault points, random occurrences, random moments: stream
    windows of ``capture`` (snapshotted), and now and then a snapshot of a capture of its own
    (``new_capture(prefix)``, forgotten on the source once verified). Returns the report."""
    report: dict = {"crashes": total, "by_point": Counter(), "outcomes": Counter()}
    seen = StreamCycles(report["outcomes"])
    started_sweep = time.monotonic()
    for i in range(total):
        kind = rng.random()
        if kind < 0.08:  # a snapshot crash, on a capture of its own
            if rng.random() < 0.5:
                point, nth = rng.choice(snapshot_faults)
                crash, label = {"point": point, "nth": nth}, f"snapshot {point}:{nth}"
            else:
                crash, label = {"kill_after": rng.uniform(*snapshot_kill_span)}, "snapshot random"
            own = new_capture(f"snap{i}")
            outcome = snapshot_crash(own, workload, crash)
            own.source.forget(own)
            report["by_point"][label] += 1
            report["outcomes"]["killed" if outcome["killed"] else "completed"] += 1
            continue
        writer_rounds = rng.randint(0, 3)
        if kind < 0.55:
            point, nth = rng.choice(stream_faults)
            if point == "window.chunk_written":
                nth = rng.randint(1, 6)
            action = "raise" if rng.random() < 0.15 else "kill"
            stream_crash(
                capture,
                workload,
                fault_spec=fault(point, nth, action),
                writer_rounds=writer_rounds,
                expected=(KILLED, 0, 1),
                seen=seen,
            )
            label = f"stream {point}:{nth} ({action})"
        else:
            stream_crash(
                capture,
                workload,
                kill_after=rng.uniform(0.0, random_span(seen)),
                writer_rounds=writer_rounds,
                seen=seen,
            )
            label = "stream random"
        report["by_point"][label] += 1
    capture.catch_up()  # the snapshot crashes' writes
    report["random_kills_left"] = seen.left
    report.update(
        capture.verify(transactions=workload.transactions), minutes=round((time.monotonic() - started_sweep) / 60, 1)
    )
    return report


def sweep_settings() -> tuple[int, int]:
    """``CDC_CRASH_SWEEP`` (how many crashes) and ``CDC_CRASH_SEED`` (default 1)."""
    return int(os.environ["CDC_CRASH_SWEEP"]), int(os.environ.get("CDC_CRASH_SEED", "1"))


def write_report(report: dict) -> None:
    """To ``CDC_CRASH_REPORT`` when it is set."""
    if os.environ.get("CDC_CRASH_REPORT"):
        Path(os.environ["CDC_CRASH_REPORT"]).write_text(json.dumps(report, indent=2, sort_keys=True))
