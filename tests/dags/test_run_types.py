"""Every Airflow run type against one capture: which runs capture and which report what landed.

The rule (``cdc/planning/runs.py``): a backfill never captures, it reports the windows landed for its
interval; a run that already landed a window (a retry, a clear, a ``dag.test()`` re-run of the
same date) reports it; every other run captures, whatever its interval: scheduled, catchup,
manual with or without a data interval, asset-triggered. The same matrix runs twice: under a
real scheduler (LocalExecutor, runs made by the schedule, the REST API and Airflow's backfill)
and under ``dag.test()``. Both end with the event log checked gapless and duplicate-free against
the workload's own counts, and the replayed state equal to the source.
"""

from __future__ import annotations

import shutil
import textwrap
from datetime import timedelta
from pathlib import Path

import pendulum
import pytest

from airflow_provider_cdc.cdc.basics import faults
from airflow_provider_cdc.testing import shop
from tests.conftest import ROOT
from tests.support import airflow as af
from tests.support.oracle import (
    assert_history,
    assert_same_state,
    assert_source_blocks,
    events_of,
    replay,
    source_rows,
    spark_rows,
    workload_ops,
)

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.slow]

KEYS = {"public.customers": ["id"], "public.orders": ["id"], "public.order_items": ["order_id", "line_no"]}


def check_capture(db, sink: Path, prefix: str, rounds: list) -> None:
    """Nothing lost, nothing doubled: one snapshot, then exactly the workload's changes, and the
    events replay to the source."""
    with db.connect() as conn:
        for table, keys in KEYS.items():
            events = events_of(sink, prefix, table)
            assert_history(events, keys, ops=workload_ops(*rounds, table=table))
            assert_source_blocks(events)
            assert_same_state(replay(events, keys), source_rows(conn, table, keys))


def changes(rounds) -> int:
    return sum(sum(workload_ops(r, table=t).values()) for r in rounds for t in KEYS)


# -- under dag.test() -------------------------------------------------------------------------------


def test_run_type_matrix_under_dag_test(db15, airflow_db, spark, tmp_path, monkeypatch, capfd):
    from airflow.models import Variable

    from airflow_provider_cdc.cdc.basics.naming import Topic
    from airflow_provider_cdc.cdc.sinks.reader import committed_windows
    from airflow_provider_cdc.cdc.sinks.storage import storage_for
    from airflow_provider_cdc.cdc.state.jobs import read_state
    from airflow_provider_cdc.cdc.state.versions import StateLog
    from tests.dags.test_example_dag import example_setup

    db = db15
    dag, capture, errors = example_setup(db, tmp_path, monkeypatch)
    for task in dag.tasks:
        task.retry_delay = timedelta(0)
    rounds: list = []

    def mutate() -> int:
        with db.connect() as conn:
            rounds.append(shop.mutate(conn, round_no=len(rounds) + 1))
        return changes(rounds[-1:])

    output: list[str] = []

    def run(hour: float, **kw) -> af.DagResult:
        capfd.readouterr()
        result = af.run(dag, hour, errors=errors, **kw)
        captured = capfd.readouterr()
        output[:] = (captured.out + captured.err).splitlines()  # the task logs of this run
        assert result.state == "success", (result.tasks, errors)
        return result

    def decision_logged(run_type: str, verdict: str) -> None:
        lines = [line for line in output if "of DAG 'postgres_cdc_hourly' (" in line]
        assert any(f"({run_type}," in line and verdict in line for line in lines), lines

    # `airflow dags test` now (05:30), then the scheduler's run of an older tick: it captures.
    first = run(5.5)
    assert first.tasks["snapshot"] == "success" and not first.xcom["capture_window"].get("replayed")
    expected = mutate()
    older = run(5, run_type="scheduled")
    assert older.xcom["capture_window"]["changes"] == expected and "replayed" not in older.xcom["capture_window"]
    decision_logged("scheduled", "captures")
    expected = mutate()
    at_six = run(6, run_type="scheduled")
    assert at_six.xcom["capture_window"]["changes"] == expected
    expected = mutate()
    now = run(6.5, with_interval=False)  # manual, no data interval
    assert now.xcom["capture_window"]["changes"] == expected
    decision_logged("manual", "captures")
    expected = mutate()
    asset = run(6.75, run_type="asset_triggered", with_interval=False)
    assert asset.xcom["capture_window"]["changes"] == expected
    decision_logged("asset_triggered", "captures")

    landed = {h: r.xcom["capture_window"]["window_id"] for h, r in ((5, older), (6, at_six))}
    pending = mutate()  # waits for the next capturing run: no replay may take it
    log_before = [(e.window.seq, e.attempt) for e in committed_windows(str(tmp_path), "shop")]
    confirmed = db.slot_status(capture.resolved_slot_name).confirmed_flush_lsn
    orders = Topic.for_table("shop", "public", "orders")
    state_log = StateLog(storage_for(str(tmp_path / "state")), "shop", orders)
    current = state_log.current()

    backfill = run(5, run_type="backfill")
    assert backfill.xcom["capture_window"]["replayed"] and backfill.xcom["capture_window"]["windows"] == [landed[5]]
    assert backfill.tasks["snapshot"] == "skipped"  # the 05:00 run landed no snapshot
    decision_logged("backfill", "reports window(s)")
    never = run(3, run_type="backfill")  # an interval no run captured
    assert never.tasks["capture_window"] == "skipped" and never.tasks["current_state"] == "skipped"
    decision_logged("backfill", "no window landed for its interval")
    again = run(6, run_type="scheduled")  # the same run id again (dag.test's clear of a past run)
    assert again.xcom["capture_window"]["windows"] == [landed[6]]
    decision_logged("scheduled", "already landed stream window(s)")
    for replayed, window_id in ((backfill, landed[5]), (again, landed[6])):
        # The current-state task rebuilt the state "as of" the reported window, beside the current one.
        assert {r["window_id"] for r in replayed.xcom["current_state"]} == {window_id}
        events = [e for e in events_of(tmp_path, "shop", "public.orders") if e["window_id"] <= window_id]
        as_of = read_state(
            spark, state_path=str(tmp_path / "state"), topic_prefix="shop", topic=orders, window_seq=int(window_id)
        )
        assert_same_state(spark_rows(as_of, ["id"]), replay(events, ["id"]))
    # Replays read nothing: the log, the slot and the current state did not move.
    assert [(e.window.seq, e.attempt) for e in committed_windows(str(tmp_path), "shop")] == log_before
    assert db.slot_status(capture.resolved_slot_name).confirmed_flush_lsn == confirmed
    assert state_log.current() == current

    # A retry after the window landed (the offset saved, the slot not acknowledged): it reports.
    once = tmp_path / "fault-armed"
    once.touch()
    monkeypatch.setenv(faults.ENV, "operator.offset_saved:raise")
    monkeypatch.setenv(faults.ONCE_ENV, str(once))
    faults._hits.clear()
    retried = run(7, run_type="scheduled")
    monkeypatch.delenv(faults.ENV)
    assert not once.exists(), "the fault never fired"
    assert retried.xcom["capture_window"]["replayed"] and retried.xcom["capture_window"]["changes"] == pending
    decision_logged("scheduled", "already landed stream window(s)")
    assert (
        str(db.slot_status(capture.resolved_slot_name).confirmed_flush_lsn) == retried.xcom["capture_window"]["to_lsn"]
    )

    expected = mutate()
    assert run(8, run_type="scheduled").xcom["capture_window"]["changes"] == expected
    check_capture(db, tmp_path, "shop", rounds)
    Variable.delete("cdc_offset__shop")


# -- under a real scheduler -------------------------------------------------------------------------

DAG_FILE = """
import os
from datetime import timedelta

import pendulum
from airflow.sdk import DAG, Asset, AssetOrTimeSchedule, CronTriggerTimetable, task

from airflow_provider_cdc.capture import PostgresCapture
from airflow_provider_cdc.operators.setup import CdcSetupOperator
from airflow_provider_cdc.operators.snapshot import CdcSnapshotOperator
from airflow_provider_cdc.operators.window import CdcWindowOperator
from airflow_provider_cdc.sensors.cdc import CdcChangesSensor

capture = PostgresCapture(
    postgres_conn_id="rt_db",
    tables=["public.customers", "public.orders", "public.order_items"],
    topic_prefix="rt",
    sink_path=os.environ["CDC_RT_SINK"],
)
with DAG(
    "cdc_run_types",
    schedule=AssetOrTimeSchedule(
        timetable=CronTriggerTimetable(os.environ["CDC_RT_CRON"], timezone="UTC"),
        assets=[Asset("cdc-test://run-types/trigger")],
    ),
    start_date=pendulum.parse(os.environ["CDC_RT_START"]),
    catchup=True,
    max_active_runs=1,
    default_args={"retries": 1, "retry_delay": timedelta(seconds=1)},
):
    (
        CdcSetupOperator(task_id="setup", capture=capture)
        >> CdcSnapshotOperator(task_id="snapshot", capture=capture)
        >> CdcWindowOperator(task_id="capture_window", capture=capture)
    )

# The field report's sensor: deferrable, default wait_until, triggered by hand (no data interval).
with DAG("cdc_rt_sensor", schedule=None, start_date=pendulum.parse(os.environ["CDC_RT_START"])):
    CdcChangesSensor(
        task_id="wait", capture=capture, deferrable=True, require_captured_change=True, poke_interval=1, timeout=300
    )

# A downstream DAG scheduled on the capture's transaction table (an outlet Asset of its tasks).
with DAG(
    "cdc_rt_consumer",
    schedule=[Asset("file://" + os.environ["CDC_RT_SINK"] + "/rt.transaction")],
    start_date=pendulum.parse(os.environ["CDC_RT_START"]),
):

    @task
    def consume(triggering_asset_events=None):
        return [dict(e.extra) for events in triggering_asset_events.values() for e in events]

    consume()
"""


@pytest.fixture
def deployment(db15, tmp_path):
    from tests.support.scheduler import AirflowDeployment

    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "cdc_run_types.py").write_text(textwrap.dedent(DAG_FILE))
    # The example DAG as shipped, on the same database (its own prefix, slot and publication).
    shutil.copy(ROOT / "dags" / "examples" / "postgres_cdc_hourly.py", dags)
    # A daily schedule whose last tick was an hour ago: catchup makes three scheduled runs, and no
    # tick falls inside the test to take changes meant for another run.
    tick = pendulum.now("UTC").subtract(hours=1).start_of("minute")
    start = tick.subtract(days=2, minutes=1)
    env = {
        "CDC_RT_CRON": f"{tick.minute} {tick.hour} * * *",
        "AIRFLOW_CONN_RT_DB": db15.cluster.airflow_uri(db15.name),
        "CDC_RT_SINK": str(tmp_path / "lake"),
        "CDC_RT_START": start.isoformat(),
        "AIRFLOW_CONN_SHOP_DB": db15.cluster.airflow_uri(db15.name),
        "CDC_EXAMPLE_SINK_PATH": str(tmp_path / "example-lake"),
        "CDC_EXAMPLE_STATE_PATH": str(tmp_path / "example-state"),
        faults.ENV: "operator.offset_saved:raise",  # armed only while the file below exists
        faults.ONCE_ENV: str(tmp_path / "fault-armed"),
    }
    with db15.connect() as conn:
        shop.create_schema(conn)
        shop.seed(conn, customers=12, orders_per_customer=2)
    with AirflowDeployment(tmp_path / "airflow", dags, db15.cluster, env=env) as airflow:
        airflow.wait_for_dag("cdc_run_types")
        yield airflow, start


def test_run_type_matrix_under_the_scheduler(deployment, db15, tmp_path):
    """Every run type under a real scheduler; then the DAG moves to a new metadata database (the
    offset Variable stays behind) and goes on from the sink's commit log."""
    from airflow_provider_cdc.cdc.sinks.reader import committed_windows
    from tests.support.scheduler import AirflowDeployment

    (airflow, start), db, dag_id = deployment, db15, "cdc_run_types"
    rounds: list = []

    def mutate() -> int:
        with db.connect() as conn:
            rounds.append(shop.mutate(conn, round_no=len(rounds) + 1))
        return changes(rounds[-1:])

    def window(run_id: str, tries: int = 1) -> dict:
        """The window task's summary once the run finished with the task at ``tries`` tries."""

        def done() -> dict | None:
            ti = airflow.task_instances(dag_id, run_id).get("capture_window")
            run = airflow.run(dag_id, run_id)
            finished = ti is not None and ti["try_number"] >= tries and run["state"] in ("success", "failed")
            return run if finished else None

        run = airflow._wait(done, 600, f"run {run_id} (try {tries})")
        assert run["state"] == "success", (run_id, airflow.states(dag_id, run_id), airflow.component_logs())
        return airflow.xcom(dag_id, run_id, "capture_window")

    def decision(run_id: str, try_number: int = 1) -> str:
        lines = [
            line for line in airflow.log_text(dag_id, run_id, "capture_window", try_number).splitlines() if "(" in line
        ]
        found = [line for line in lines if f"run {run_id!r} of DAG" in line]
        assert found, lines
        return found[0]

    # The field report: `airflow dags test` first (a manual run "now"), then the schedule.
    airflow.cli("dags", "test", dag_id, timeout=300)
    (manual_first,) = airflow.runs(dag_id)
    assert manual_first["run_type"] == "manual" and manual_first["state"] == "success"
    expected = mutate()
    airflow.wait_for_dag("cdc_rt_consumer")
    airflow.unpause("cdc_rt_consumer")
    airflow.unpause(dag_id)
    runs = airflow.wait_for_runs(dag_id, 4)  # catchup: the daily ticks of the last three days
    scheduled = [r["dag_run_id"] for r in runs if r["run_type"] == "scheduled"]
    assert len(scheduled) >= 3, runs
    assert all(pendulum.parse(r["run_after"]) < pendulum.parse(manual_first["run_after"]) for r in runs[:3])  # older
    summaries = {run_id: window(run_id) for run_id in scheduled}
    assert summaries[scheduled[0]]["changes"] == expected and "replayed" not in summaries[scheduled[0]]
    assert "(scheduled," in decision(scheduled[0]) and "captures" in decision(scheduled[0])
    # The task log says where the window starts and ends, how it went, and how far behind it is.
    log = airflow.log_text(dag_id, scheduled[0], "capture_window", 1)
    window_id = summaries[scheduled[0]]["window_id"]
    assert f"window {window_id}: [" in log and f"window {window_id} committed:" in log and "bytes behind" in log, log
    progress = [line for line in log.splitlines() if " chunk 1: " in line]
    assert len(progress) == 1 and "changes/s" in progress[0] and "of events" in progress[0], log
    assert " lag " in progress[0] and "py4j" not in log.lower(), log
    # The consumer ran on the window's asset events and read what each run landed.
    consumed = airflow._wait(
        lambda: [
            extra
            for r in airflow.runs("cdc_rt_consumer")
            if r["state"] == "success"
            for extra in airflow.xcom("cdc_rt_consumer", r["dag_run_id"], "consume") or []
        ],
        180,
        "the downstream DAG",
    )
    by_window = {e["window_id"]: e for e in consumed}
    first = by_window[window_id]
    assert first["topic"] == "rt.transaction" and first["replayed"] is False
    assert first["transactions"] == summaries[scheduled[0]]["transactions"]
    assert (first["from_lsn"], first["to_lsn"]) == (
        summaries[scheduled[0]]["from_lsn"],
        summaries[scheduled[0]]["to_lsn"],
    )

    # The deferrable sensor in a manual run: nothing captured is pending, so it defers; the
    # triggerer sees the next change and the sensor succeeds with the trigger's event.
    airflow.wait_for_dag("cdc_rt_sensor")
    airflow.unpause("cdc_rt_sensor")
    sensed = airflow.trigger("cdc_rt_sensor")
    airflow._wait(lambda: airflow.states("cdc_rt_sensor", sensed).get("wait") == "deferred", 120, "the deferral")
    expected = mutate()
    assert airflow.wait_for_run("cdc_rt_sensor", sensed, 120)["state"] == "success", airflow.component_logs()
    assert airflow.xcom("cdc_rt_sensor", sensed, "wait")["status"] == "success"
    now = airflow.trigger(dag_id)  # manual, no logical date, no data interval
    assert window(now)["changes"] == expected and "(manual, no data interval" in decision(now)
    expected = mutate()
    past = airflow.trigger(dag_id, logical_date=start.add(hours=5).isoformat())  # manual, an old interval
    assert window(past)["changes"] == expected and "captures" in decision(past)

    expected = mutate()
    (asset,) = airflow.api("GET", "/assets", params={"uri_pattern": "run-types"})["assets"]
    known = {r["dag_run_id"] for r in airflow.runs(dag_id)}
    airflow.api("POST", "/assets/events", json={"asset_id": asset["id"], "extra": {}})
    triggered = airflow._wait(
        lambda: [r["dag_run_id"] for r in airflow.runs(dag_id) if r["run_type"] == "asset_triggered"],
        120,
        "an asset run",
    )[0]
    assert triggered not in known
    assert window(triggered)["changes"] == expected and "(asset_triggered," in decision(triggered)

    pending = mutate()  # no replay below may take these
    airflow.backfill(dag_id, start.isoformat(), start.add(days=1, minutes=2).isoformat())  # reprocesses two landed runs
    for run_id in scheduled[:2]:
        airflow._wait(lambda rid=run_id: airflow.run(dag_id, rid)["run_type"] == "backfill", 60, "the backfill")
        report = window(run_id, tries=2)
        assert report["replayed"] and report["windows"] == [summaries[run_id]["window_id"]]
        assert "(backfill," in decision(run_id, 2) and "is a backfill" in decision(run_id, 2)

    airflow.clear(dag_id, scheduled[2])
    report = window(scheduled[2], tries=2)
    assert report["replayed"] and report["windows"] == [summaries[scheduled[2]]["window_id"]]
    assert "already landed" in decision(scheduled[2], 2) and "cleared 1x" in decision(scheduled[2], 2)

    (tmp_path / "fault-armed").touch()  # the next window fails once after its offset is saved
    retried = airflow.trigger(dag_id)
    report = window(retried, tries=2)
    assert not (tmp_path / "fault-armed").exists()
    assert report["replayed"] and report["changes"] == pending  # the landed window, reported by the retry
    assert "captures" in decision(retried, 1) and "already landed" in decision(retried, 2)
    slot = db.slot_status("cdc_rt")
    assert str(slot.confirmed_flush_lsn) == report["to_lsn"]  # the retry acknowledged it

    # The example DAG as shipped (@hourly, no catchup): unpaused, the scheduler runs the latest
    # hour (setup, snapshot, window, current state, slot health); changes are made; a manual run
    # through the REST API captures them (with any hourly run the clock adds on the way).
    example = "postgres_cdc_hourly"
    airflow.wait_for_dag(example)
    airflow.unpause(example)
    # The first run is the latest hour's; a test that crosses an hour boundary also gets the next
    # hour's scheduled run (counted with the later runs below).
    first = min(airflow.wait_for_runs(example, 1), key=lambda r: r["run_after"])
    assert set(airflow.states(example, first["dag_run_id"]).values()) == {"success"}, airflow.component_logs()
    made = mutate()
    manual = airflow.trigger(example)
    assert airflow.wait_for_run(example, manual)["state"] == "success", airflow.states(example, manual)
    later = [r["dag_run_id"] for r in airflow.runs(example) if r["dag_run_id"] != first["dag_run_id"]]
    windows = [airflow.xcom(example, run_id, "capture_window") for run_id in later]
    assert sum(w["changes"] for w in windows if not w.get("replayed")) == made, windows
    assert airflow.states(example, manual)["snapshot"] == "skipped"
    assert [r["action"] for r in airflow.xcom(example, manual, "current_state")] in (["applied"] * 3, ["unchanged"] * 3)
    # A few dozen changes: state_engine="auto" folds them on Arrow, no JVM in the task's process.
    assert {r["engine"] for r in airflow.xcom(example, manual, "current_state")} == {"arrow"}
    assert "(pyspark imported: False)" in airflow.log_text(example, manual, "current_state", 1)
    assert airflow.xcom(example, manual, "slot_health")["healthy"]
    airflow.pause(example)

    # The DAG moves to a new Airflow deployment: a new metadata database, so no offset Variable.
    airflow.stop()
    moved = AirflowDeployment(tmp_path / "moved", airflow.dags_folder, db.cluster, env=airflow.extra_env)
    moved.metadata.create_database(moved.database)
    moved.cli("db", "migrate", timeout=300)
    expected = mutate()
    landed = len(committed_windows(str(tmp_path / "lake"), "rt"))
    output = moved.cli("dags", "test", dag_id, timeout=300).stdout
    assert "restored it from the commit log" in output and "the initial snapshot already completed" in output, output
    assert len(committed_windows(str(tmp_path / "lake"), "rt")) == landed + 1  # a window, no second snapshot
    check_capture(db, tmp_path / "lake", "rt", rounds)
