"""What parsing a capture DAG file costs, beside a DAG of the same shape built from Airflow's own providers.

    .venv/bin/python bench/parse_cost.py --repeat 7

Airflow's DAG processor re-imports a DAG file and the provider modules it imports on every parse
(it keeps only ``airflow.*`` loaded between parses), so what those imports load is paid on every
parse of every DAG file that uses the provider. Each measurement is one fresh Python process
that first imports ``airflow.sdk`` (loaded in the DAG processor already), then executes one DAG
file as the DAG processor does and reports the parse's wall time, the modules it added to
``sys.modules`` and its resident memory growth (``/proc/self/statm``). Three DAG files:

- **cdc**: ``dags/examples/postgres_cdc_hourly.py`` as shipped (setup → snapshot → window →
  current state and slot health, from ``airflow_provider_cdc``);
- **providers**: the same five tasks and edges built from the Postgres provider's
  ``SQLExecuteQueryOperator`` (setup, slot health) and the Spark provider's
  ``SparkSubmitOperator`` (snapshot, window, current state), the operators a team would use
  without this package;
- **floor**: the same shape from ``EmptyOperator`` (the DAG machinery alone).

``--tree DIR`` measures the cdc file and package of another checkout instead (e.g. an earlier
commit exported with ``git archive <commit> airflow_provider_cdc dags | tar -x -C DIR``).

The cdc and providers files alternate in each repeat (so a drift of the machine's speed hits
both), the floor runs once per repeat; figures are medians, and the ratio cdc/providers is the
median of the per-repeat ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "dags" / "examples" / "postgres_cdc_hourly.py"

_HEADER = """
from datetime import timedelta

import pendulum
from airflow.sdk import DAG
"""

_SHAPE = """
with DAG(
    dag_id="{dag_id}",
    schedule="@hourly",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args={{"retries": 1, "retry_delay": timedelta(seconds=30)}},
    tags=["cdc", "bench"],
) as dag:
{tasks}
    setup >> snapshot >> window >> [state, health]
"""

PROVIDERS_DAG = (
    _HEADER
    + """from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.providers.common.sql.operators.sql import SQLExecuteQueryOperator
"""
    + _SHAPE.format(
        dag_id="providers_hourly",
        tasks="""    setup = SQLExecuteQueryOperator(
        task_id="setup",
        conn_id="shop_db",
        sql="SELECT pg_create_logical_replication_slot('cdc_shop', 'pgoutput')",
    )
    snapshot = SparkSubmitOperator(
        task_id="snapshot", conn_id="spark_default", application="/opt/jobs/snapshot.py", application_args=["shop"]
    )
    window = SparkSubmitOperator(
        task_id="capture_window", conn_id="spark_default", application="/opt/jobs/window.py", application_args=["shop"]
    )
    state = SparkSubmitOperator(
        task_id="current_state", conn_id="spark_default", application="/opt/jobs/state.py", application_args=["shop"]
    )
    health = SQLExecuteQueryOperator(
        task_id="slot_health",
        conn_id="shop_db",
        sql="SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn) FROM pg_replication_slots",
        trigger_rule="all_done",
    )""",
    )
)

FLOOR_DAG = (
    _HEADER
    + """from airflow.providers.standard.operators.empty import EmptyOperator
"""
    + _SHAPE.format(
        dag_id="floor_hourly",
        tasks="""    setup = EmptyOperator(task_id="setup")
    snapshot = EmptyOperator(task_id="snapshot")
    window = EmptyOperator(task_id="capture_window")
    state = EmptyOperator(task_id="current_state")
    health = EmptyOperator(task_id="slot_health", trigger_rule="all_done")""",
    )
)

#: Runs in the measured process: Airflow first (the DAG processor has it), then one parse.
_MEASURE = """
import importlib.util, json, os, sys, time
import airflow.sdk

def rss():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

path = sys.argv[1]
heavy = ("pyarrow", "numpy", "pandas", "psycopg", "psycopg2", "sqlalchemy", "pyspark")
before, rss0, t0 = set(sys.modules), rss(), time.perf_counter()
spec = importlib.util.spec_from_file_location("parsed_dag", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
seconds, rss1 = time.perf_counter() - t0, rss()
added = set(sys.modules) - before
print(json.dumps({
    "seconds": seconds,
    "modules": len(added),
    "rss_mib": (rss1 - rss0) / 2**20,
    "tasks": len(module.dag.task_ids),
    "heavy": sorted({m.split(".")[0] for m in added if m.split(".")[0] in heavy}),
}))
"""


def measure(path: Path, tree: Path | None = None) -> dict:
    env = dict(os.environ)
    if tree is not None:  # its package before the installed one
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(path)],
        capture_output=True,
        text=True,
        cwd=tree or ROOT,
        env=env,
        timeout=300,
        check=False,
    )
    if result.returncode != 0:
        raise SystemExit(f"parsing {path} failed:\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7, help="measurements of each DAG file (default 7)")
    parser.add_argument("--tree", type=Path, help="measure this checkout's example DAG and package instead")
    args = parser.parse_args()
    tree = args.tree.resolve() if args.tree else None
    example = (tree or ROOT) / EXAMPLE.relative_to(ROOT)
    with tempfile.TemporaryDirectory(prefix="cdc-parse-cost-") as tmp:
        providers, floor = Path(tmp) / "providers_hourly.py", Path(tmp) / "floor_hourly.py"
        providers.write_text(PROVIDERS_DAG)
        floor.write_text(FLOOR_DAG)
        measure(example, tree), measure(providers)  # warm the file system cache: not counted
        runs: dict[str, list[dict]] = {"cdc": [], "providers": [], "floor": []}
        for i in range(args.repeat):
            order = [("cdc", example, tree), ("providers", providers, None)]
            for name, path, where in order if i % 2 == 0 else order[::-1]:
                runs[name].append(measure(path, where))
            runs["floor"].append(measure(floor))
    tasks = {name: {r["tasks"] for r in rs} for name, rs in runs.items()}
    if any(t != {5} for t in tasks.values()):
        raise SystemExit(f"the DAG files do not have the same shape: {tasks}")
    print(f"parse of one DAG file (5 tasks) after `import airflow.sdk`, medians of {args.repeat}")
    print(f"{'DAG file':<12} {'seconds':>9} {'modules':>8} {'RSS MiB':>8}  heavy libraries loaded")
    for name, rs in runs.items():
        heavy = sorted({h for r in rs for h in r["heavy"]}) or ["none"]
        print(
            f"{name:<12} {median(rs, 'seconds'):>9.3f} {median(rs, 'modules'):>8.0f} "
            f"{median(rs, 'rss_mib'):>8.1f}  {', '.join(heavy)}"
        )
    pairs = list(zip(runs["cdc"], runs["providers"]))
    for key, label in (("seconds", "time"), ("modules", "modules"), ("rss_mib", "RSS growth")):
        ratio = statistics.median(c[key] / p[key] for c, p in pairs if p[key] > 0)
        print(f"ratio cdc/providers, {label}: {ratio:.2f}")


if __name__ == "__main__":
    main()
