"""What an hourly run costs when there is nothing to capture.

    .venv/bin/python bench/idle_run.py --runs 5

Starts a throwaway PostgreSQL 15 with the shop tables, runs the capture DAG (setup → snapshot →
window → slot health) once for the initial snapshot, then ``--runs`` times with the captured
tables idle while an unrelated table keeps writing WAL. Each run is a fresh Python process
(like an Airflow worker), so a JVM started by the snapshot cannot hide one started by an idle
run. Per idle run it reports the window task's time and the whole DAG run's, whether the
process imported pyspark or started a JVM, and whether the slot was acknowledged past the WAL
the neighbour wrote. Figures are medians over the idle runs; the limit is the time of one
trivial query on a fresh connection (connect + ``SELECT 1``), measured in the same run.

    .venv/bin/python bench/idle_run.py --scheduler --runs 3

``--scheduler``: the example DAG as shipped (``dags/examples/postgres_cdc_hourly.py``) under a
real scheduler (``tests/support/scheduler.py``: scheduler, DAG processor, API server, LocalExecutor),
with a few dozen changes (``shop.mutate``) before each manual run, side by side in the same
deployment with a copy of it whose current-state task has ``state_engine="spark"`` (its own
prefix and slot, the same changes) and a DAG of one task that does nothing (Airflow's own cost of
a task). Per run: each task's duration (the task instance's, from the REST API) and CPU time (a
listener plugin in the deployment measures each task process from before it parses the DAG file
to its last report: on a shared machine the CPU says more than the wall time), their sums, which
tasks imported pandas (pyarrow imports it on its first Arrow/NumPy conversion, ~1 s of CPU), and
whether the task started a JVM (a watcher polls ``/proc`` for ``java`` processes of this
deployment; a task's children inherit Airflow's ``AIRFLOW_CTX_*`` variables, which name it).
``--without-spark`` leaves the Spark copy out (faster); ``--airflow-setting SECTION.KEY=VALUE``
sets one of the deployment's Airflow settings (repeatable); ``--without-pandas`` makes pandas
unimportable in the hourly runs' task processes, as in a deployment without the ``spark`` extra
(the only one that installs it; the initial snapshot runs Spark, which needs it); ``--profile DIR`` writes each task's
pyinstrument profile, the packages it imported and where it first imported pandas into ``DIR``
(pyinstrument must be importable, e.g. ``PYTHONPATH`` to a ``pip install --target`` of it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _dag(conn_id: str, sink: str):
    import pendulum
    from airflow.sdk import DAG

    from airflow_provider_cdc.capture import PostgresCapture
    from airflow_provider_cdc.operators.setup import CdcSetupOperator
    from airflow_provider_cdc.operators.slot_maintenance import PostgresCdcSlotHealthOperator
    from airflow_provider_cdc.operators.snapshot import CdcSnapshotOperator
    from airflow_provider_cdc.operators.window import CdcWindowOperator
    from airflow_provider_cdc.testing import shop

    capture = PostgresCapture(postgres_conn_id=conn_id, tables=list(shop.TABLES), topic_prefix="shop", sink_path=sink)
    with DAG("idle_bench", schedule="@hourly", start_date=pendulum.datetime(2026, 1, 1, tz="UTC")) as dag:
        window = CdcWindowOperator(task_id="window", capture=capture)
        (
            CdcSetupOperator(task_id="setup", capture=capture)
            >> CdcSnapshotOperator(task_id="snapshot", capture=capture)
            >> window
            >> PostgresCdcSlotHealthOperator(task_id="slot_health", capture=capture)
        )
    return dag


def run_once(hour: int, sink: str) -> dict:
    """One DAG run in this (fresh) process; prints what it cost as JSON."""
    import pendulum
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    dag = _dag("shop_db", sink)
    DagBundlesManager().sync_bundles_to_db()
    bag = DagBag(collect_dags=False)
    bag.bag_dag(dag)
    sync_bag_to_db(bag, "dags-folder", None)
    logical_date = pendulum.datetime(2026, 1, 1, tz="UTC").add(hours=hour)
    started = time.monotonic()
    run = dag.test(logical_date=logical_date, run_after=logical_date)
    total = time.monotonic() - started
    tasks, window = {}, None
    with create_session() as session:
        for ti in run.get_task_instances(session=session):
            tasks[ti.task_id] = {"state": str(ti.state), "seconds": ti.duration}
            if ti.task_id == "window":
                row = session.scalars(
                    XComModel.get_many(run_id=run.run_id, dag_ids=dag.dag_id, task_ids="window", key="return_value")
                ).first()
                window = XComModel.deserialize_value(row) if row is not None else None
    pyspark = sys.modules.get("pyspark")
    jvm = bool(pyspark is not None and pyspark.SparkContext._active_spark_context is not None)
    return {
        "state": str(run.state),
        "dag_seconds": total,
        "tasks": tasks,
        "window": window,
        "pyspark_imported": pyspark is not None,
        "jvm_started": jvm,
    }


NOOP_DAG = """
import pendulum
from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG

with DAG("noop", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")):
    PythonOperator(task_id="noop", python_callable=lambda: None)
"""


# A listener plugin in the deployment: each task process's CPU time from before the DAG file is
# parsed to after the task's last report (the machine is shared: wall time says little), the
# packages it imported itself (the supervisor it is forked from has Airflow's own loaded already)
# and where it first imported pandas; with --profile also a pyinstrument profile of it.
TASK_PLUGIN = """
import json, os, sys, time

from airflow.plugins_manager import AirflowPlugin
from airflow.sdk._shared.listeners import hookimpl

OUT = os.environ["CDC_BENCH_TASKS_DIR"]
PROFILE = os.environ.get("CDC_BENCH_PROFILE") == "1"
NO_PANDAS = os.environ.get("CDC_BENCH_NO_PANDAS") == "1"


class _FirstPandas:  # where the task first imported pandas (pyarrow imports it for its own checks)

    stack = None

    def find_spec(self, name, path, target=None):
        if name == "pandas" and _FirstPandas.stack is None:
            import traceback

            _FirstPandas.stack = "".join(traceback.format_stack(limit=14)[:-3])
        return None


class _NoPandas:  # as in a deployment without the spark extra, which alone installs pandas

    def find_spec(self, name, path, target=None):
        # Only in the hourly (manual) runs: the initial snapshot runs Spark, which needs pandas.
        hourly = os.environ.get("AIRFLOW_CTX_DAG_RUN_ID", "").startswith("manual__")
        if hourly and (name == "pandas" or name.startswith("pandas.")):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


class _Profile:
    task = False
    profiler = None
    modules = ()
    started = cpu = 0.0

    @hookimpl
    def on_starting(self, component):
        if type(component).__name__ != "TaskRunnerMarker":
            return
        _Profile.task = True
        _Profile.modules, _Profile.started, _Profile.cpu = set(sys.modules), time.monotonic(), time.process_time()
        sys.meta_path.insert(0, _FirstPandas())
        if NO_PANDAS:
            sys.meta_path.insert(0, _NoPandas())
        if PROFILE:
            from pyinstrument import Profiler

            _Profile.profiler = Profiler(interval=0.001)
            _Profile.profiler.start()

    @hookimpl
    def before_stopping(self, component):
        if not _Profile.task:
            return
        if _Profile.profiler is not None:
            _Profile.profiler.stop()
        elapsed, cpu = time.monotonic() - _Profile.started, time.process_time() - _Profile.cpu
        ctx = {k: os.environ.get("AIRFLOW_CTX_" + k, "?") for k in ("DAG_ID", "TASK_ID", "DAG_RUN_ID")}
        name = "{DAG_ID}__{TASK_ID}__{DAG_RUN_ID}".format(**ctx).replace(":", "_").replace("+", "_")
        name += f"__{os.getpid()}"
        new = sorted(set(sys.modules) - _Profile.modules)
        tops = sorted({m.split(".")[0] for m in new})
        with open(os.path.join(OUT, name + ".txt"), "w") as out:
            out.write(f"seconds (listener to listener): {elapsed:.3f}, CPU {cpu:.3f}\\n")
            out.write(f"packages imported by the task: {' '.join(tops)}\\n")
            out.write(f"pandas first imported at:\\n{_FirstPandas.stack}\\n")
            if _Profile.profiler is not None:
                out.write(_Profile.profiler.output_text(unicode=False, color=False, show_all=False))
        with open(os.path.join(OUT, name + ".json"), "w") as out:
            json.dump({**ctx, "seconds": elapsed, "cpu": cpu, "packages": tops, "modules": len(new)}, out)


class CdcBenchTasks(AirflowPlugin):
    name = "cdc_bench_tasks"
    listeners = [_Profile()]
"""


class JvmWatch(threading.Thread):
    """Every JVM started under the deployment at ``home``: (dag id, run id, task id) of the task
    whose process (or a child of it) runs it, polled from ``/proc`` every 0.2 s."""

    def __init__(self, home: Path):
        super().__init__(daemon=True)
        self.home = f"AIRFLOW_HOME={home}".encode()
        self.seen: set[str] = set()
        self.started: set[tuple[str, str, str]] = set()
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            for entry in os.scandir("/proc"):
                if entry.name.isdigit() and entry.name not in self.seen:
                    self._check(entry.name)
            self.stopped.wait(0.2)

    def _check(self, pid: str) -> None:
        try:
            with open(f"/proc/{pid}/comm") as comm:
                if comm.read().strip() != "java":
                    return  # checked again next time: spark-submit's script execs java in its own process
            with open(f"/proc/{pid}/environ", "rb") as environ:
                env = environ.read().split(b"\0")
        except OSError:
            return
        self.seen.add(pid)
        if self.home not in env:
            return
        found = dict(item.decode(errors="replace").split("=", 1) for item in env if b"=" in item)
        self.started.add(
            (
                found.get("AIRFLOW_CTX_DAG_ID", "?"),
                found.get("AIRFLOW_CTX_DAG_RUN_ID", "?"),
                found.get("AIRFLOW_CTX_TASK_ID", "?"),
            )
        )


def _spark_variant(source: str) -> str:
    """The example DAG with Spark for the current state, under its own DAG id, prefix and slot."""
    replaced = (
        source.replace('dag_id="postgres_cdc_hourly"', 'dag_id="postgres_cdc_hourly_spark"')
        .replace('TOPIC_PREFIX = "shop"', 'TOPIC_PREFIX = "shop_spark"')
        .replace("state_path=STATE_PATH,", 'state_path=STATE_PATH,\n        state_engine="spark",')
    )
    if replaced.count("shop_spark") != 1 or 'state_engine="spark"' not in replaced:
        raise SystemExit("the example DAG changed: update bench/idle_run.py's _spark_variant")
    return replaced


def _run_report(airflow, dag_id: str, run_id: str, jvms: JvmWatch, tasks_dir: Path) -> dict:
    """Each task's state, duration, CPU time (the plugin's, summed over attempts), the packages it
    imported that a small run should not need, and whether its process started a JVM."""
    time.sleep(0.5)  # one more poll of the watcher
    measured: dict[str, list[dict]] = {}
    for path in tasks_dir.glob("*.json"):
        found = json.loads(path.read_text())
        if (found["DAG_ID"], found["DAG_RUN_ID"]) == (dag_id, run_id):
            measured.setdefault(found["TASK_ID"], []).append(found)
    tasks = {}
    for task_id, ti in airflow.task_instances(dag_id, run_id).items():
        jvm = (dag_id, run_id, task_id) in jvms.started
        attempts = measured.get(task_id, [])
        heavy = sorted({p for a in attempts for p in a["packages"] if p in ("pandas", "pyspark", "py4j")})
        cpu = sum(a["cpu"] for a in attempts) if attempts else None
        inside = sum(a["seconds"] for a in attempts) if attempts else None
        seconds = ti["duration"] or 0.0
        tasks[task_id] = {
            "state": ti["state"],
            "seconds": seconds,
            "cpu": cpu,
            "inside": inside,
            "heavy": heavy,
            "jvm": jvm,
        }
    return tasks


def scheduler_main(args: argparse.Namespace) -> int:
    from airflow_provider_cdc.testing import shop
    from airflow_provider_cdc.testing.postgres_cluster import PostgresCluster, available_flavours, scratch_dir
    from tests.support.scheduler import AirflowDeployment

    work = Path(tempfile.mkdtemp(prefix="cdc-bench-sched-"))
    cluster = PostgresCluster(available_flavours()["pg15"], scratch_dir("cdc-bench-sched-pg-")).start()
    try:
        cluster.create_database("shop")
        with cluster.connect("shop") as conn:
            shop.create_schema(conn)
            shop.seed(conn)
        dags = work / "dags"
        dags.mkdir()
        example = (ROOT / "dags" / "examples" / "postgres_cdc_hourly.py").read_text()
        (dags / "postgres_cdc_hourly.py").write_text(example)
        (dags / "postgres_cdc_hourly_spark.py").write_text(_spark_variant(example))
        (dags / "noop.py").write_text(NOOP_DAG)
        env = {
            "AIRFLOW_CONN_SHOP_DB": cluster.airflow_uri("shop"),
            "CDC_EXAMPLE_SINK_PATH": str(work / "lake"),
            "CDC_EXAMPLE_STATE_PATH": str(work / "state"),
        }
        tasks_dir = (args.profile or work / "tasks").resolve()
        tasks_dir.mkdir(parents=True, exist_ok=True)
        (work / "airflow" / "plugins").mkdir(parents=True)
        (work / "airflow" / "plugins" / "cdc_bench_tasks.py").write_text(TASK_PLUGIN)
        env["CDC_BENCH_TASKS_DIR"] = str(tasks_dir)
        if args.profile:
            env["CDC_BENCH_PROFILE"] = "1"
        if args.without_pandas:
            env["CDC_BENCH_NO_PANDAS"] = "1"
        for setting in args.airflow_setting:
            name, _, value = setting.partition("=")
            section, _, key = name.partition(".")
            env[f"AIRFLOW__{section.upper()}__{key.upper()}"] = value
        compared = ("postgres_cdc_hourly", "postgres_cdc_hourly_spark", "noop")
        if args.without_spark:
            compared = ("postgres_cdc_hourly", "noop")
        jvms = JvmWatch(work / "airflow")
        jvms.start()
        with AirflowDeployment(work / "airflow", dags, cluster, env=env) as airflow:
            for dag_id in compared:
                airflow.wait_for_dag(dag_id)
            rows = []
            for dag_id in compared[:-1]:  # the latest hour's scheduled run: setup and initial snapshot (run 0)
                airflow.unpause(dag_id)
                first = airflow.wait_for_runs(dag_id, 1)[0]
                report = _run_report(airflow, dag_id, first["dag_run_id"], jvms, tasks_dir)
                rows.append((0, dag_id, first["state"], report, None, None))
            airflow.unpause("noop")
            for round_no in range(1, args.runs + 1):
                with cluster.connect("shop") as conn:
                    made = shop.mutate(conn, round_no=round_no)
                for dag_id in compared:
                    run_id = airflow.trigger(dag_id)
                    state = airflow.wait_for_run(dag_id, run_id)["state"]
                    window = airflow.xcom(dag_id, run_id, "capture_window") if dag_id != "noop" else None
                    report = _run_report(airflow, dag_id, run_id, jvms, tasks_dir)
                    rows.append((round_no, dag_id, state, report, window, made))
        jvms.stopped.set()
        _print_scheduler_table(rows)
        ok = all(r[2] == "success" for r in rows) and not any(
            t["jvm"] for r in rows if r[0] and r[1] == "postgres_cdc_hourly" for t in r[3].values()
        )
        print("example DAG: " + ("no JVM in any task" if ok else "NOT as expected (see the table)"))
        return 0 if ok else 1
    finally:
        cluster.stop()
        shutil.rmtree(cluster.base_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


def _print_scheduler_table(rows: list) -> None:
    """Each task's duration (its CPU time in parentheses), their sums, and per DAG the medians over
    the hourly runs (run 0 is the initial snapshot)."""
    order = ("setup", "snapshot", "capture_window", "current_state", "slot_health", "noop")
    print("| run | DAG | changes | " + " | ".join(order) + " | sum of task s (CPU s) | pandas in | JVM in |")
    print("|---|---|---|" + "---|" * len(order) + "---|---|---|")
    sums: dict[str, list[tuple[float, float | None]]] = {}
    inside: dict[str, list[float]] = {}
    for round_no, dag_id, state, tasks, window, _made in rows:
        cells = [_cell(tasks[t]) if t in tasks else "" for t in order]
        total = sum(t["seconds"] for t in tasks.values())
        cpus = [t["cpu"] for t in tasks.values()]
        cpu = None if None in cpus else sum(cpus)
        insides = [t.get("inside") for t in tasks.values()]
        if round_no:
            sums.setdefault(dag_id, []).append((total, cpu))
            if None not in insides:
                inside.setdefault(dag_id, []).append(sum(insides))
        pandas = ", ".join(t for t, v in tasks.items() if "pandas" in v["heavy"]) or "none"
        jvm = ", ".join(t for t, v in tasks.items() if v["jvm"]) or "none"
        changes = window.get("changes", "") if isinstance(window, dict) else ""
        print(
            f"| {round_no} | {dag_id} ({state}) | {changes} | "
            + " | ".join(cells)
            + f" | {_cell({'seconds': total, 'cpu': cpu})} | {pandas} | {jvm} |"
        )
    for dag_id, totals in sums.items():
        cpus = [c for _, c in totals if c is not None]
        cpu = f", of CPU {statistics.median(cpus):.2f} s" if len(cpus) == len(totals) else ""
        print(f"median sum of task durations, {dag_id}: {statistics.median(t for t, _ in totals):.2f} s{cpu}")
    for dag_id, values in inside.items():
        # The task process from before it parses the DAG file to its last report: what the task
        # itself takes, without the supervisor's start and its wait for the process to end.
        print(f"sums of in-process task seconds, {dag_id}: {', '.join(f'{v:.2f}' for v in values)}")


def _cell(task: dict) -> str:
    return f"{task['seconds']:.2f}" + ("" if task.get("cpu") is None else f" ({task['cpu']:.2f})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="idle runs after the initial snapshot run")
    parser.add_argument("--neighbour-rows", type=int, default=20000, help="rows an unrelated table writes per hour")
    parser.add_argument("--scheduler", action="store_true", help="the example DAG under a real scheduler")
    parser.add_argument(
        "--profile",
        type=Path,
        help="with --scheduler: write each task's profile (pyinstrument, which must be importable) here",
    )
    parser.add_argument(
        "--without-spark", action="store_true", help="with --scheduler: not the Spark copy of the DAG (faster)"
    )
    parser.add_argument(
        "--without-pandas",
        action="store_true",
        help="with --scheduler: task processes cannot import pandas, as in a deployment without the spark extra",
    )
    parser.add_argument(
        "--airflow-setting",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="with --scheduler: an Airflow setting of the deployment, e.g. workers.min_heartbeat_interval=1",
    )
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)  # internal: one run, in a fresh process
    args = parser.parse_args()
    if args.scheduler:
        return scheduler_main(args)
    if args.child is not None:
        print("RESULT " + json.dumps(run_once(args.child, os.environ["CDC_BENCH_SINK"])))
        return 0

    import psycopg

    from airflow_provider_cdc.testing import shop
    from airflow_provider_cdc.testing.postgres_cluster import PostgresCluster, available_flavours, scratch_dir

    work = Path(tempfile.mkdtemp(prefix="cdc-bench-idle-"))
    cluster = PostgresCluster(available_flavours()["pg15"], scratch_dir("cdc-bench-idle-pg-")).start()
    try:
        cluster.create_database("shop")
        with cluster.connect("shop") as conn:
            shop.create_schema(conn)
            shop.seed(conn)
            conn.execute("CREATE TABLE neighbour (id bigserial PRIMARY KEY, v text)")  # not captured
        env = {
            **os.environ,
            "AIRFLOW_HOME": str(work / "airflow"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(work / "dags"),
            "AIRFLOW_CONN_SHOP_DB": cluster.airflow_uri("shop"),
            "CDC_BENCH_SINK": str(work / "lake"),
            "SPARK_LOCAL_IP": "127.0.0.1",
        }
        (work / "dags").mkdir()
        initdb = "from airflow.utils import db; db.initdb()"
        subprocess.run([sys.executable, "-c", initdb], env=env, check=True, capture_output=True)

        def child(hour: int) -> dict:
            proc = subprocess.run(
                [sys.executable, __file__, "--child", str(hour)], env=env, capture_output=True, text=True, cwd=ROOT
            )
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if proc.returncode != 0 or line is None:
                sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
                raise SystemExit(f"run {hour} failed")
            return json.loads(line[len("RESULT ") :])

        first = child(0)
        print(f"initial run (snapshot): {first['dag_seconds']:.1f} s, JVM started: {first['jvm_started']}")
        rows = []
        for hour in range(1, args.runs + 1):
            with cluster.connect("shop") as conn:
                before = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
                conn.execute(
                    "INSERT INTO neighbour (v) SELECT repeat('n', 100) FROM generate_series(1, %s)",
                    (args.neighbour_rows,),
                )
                after = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
                neighbour_bytes = conn.execute("SELECT %s::pg_lsn - %s::pg_lsn", (after, before)).fetchone()[0]
            result = child(hour)
            with cluster.connect("shop") as conn:
                confirmed = conn.execute(
                    "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots WHERE slot_name = 'cdc_shop'",
                    (after,),
                ).fetchone()[0]
            rows.append((hour, result, int(neighbour_bytes), confirmed))

        limits = []
        for _ in range(5):
            started = time.monotonic()
            with psycopg.connect(cluster.dsn("shop")) as conn:
                conn.execute("SELECT 1")
            limits.append(time.monotonic() - started)
        limit = statistics.median(limits)

        print(
            "| idle run | window task s | DAG run s | pyspark imported | JVM started | neighbour WAL "
            "| slot acknowledged past it |"
        )
        print("|---|---|---|---|---|---|---|")
        for hour, result, neighbour_bytes, confirmed in rows:
            window = result["tasks"]["window"]
            print(
                f"| {hour} | {window['seconds']:.2f} | {result['dag_seconds']:.2f} | {result['pyspark_imported']} | "
                f"{result['jvm_started']} | {neighbour_bytes:,} B | {confirmed} |"
            )
        window_median = statistics.median(r[1]["tasks"]["window"]["seconds"] for r in rows)
        dag_median = statistics.median(r[1]["dag_seconds"] for r in rows)
        print(f"median window task: {window_median:.2f} s; median DAG run: {dag_median:.2f} s")
        print(f"limit (connect + SELECT 1): {limit * 1000:.1f} ms; window task / limit: {window_median / limit:.0f}x")
        ok = all(r[1]["state"] == "success" and not r[1]["jvm_started"] and r[3] for r in rows)
        print("idle runs: " + ("no JVM, slot acknowledged every time" if ok else "NOT as expected (see the table)"))
        return 0 if ok else 1
    finally:
        cluster.stop()
        shutil.rmtree(cluster.base_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
