"""The engine runs without Airflow; DAG files parse without Spark; the provider registers."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import airflow_provider_cdc.cdc as engine

ROOT = Path(__file__).resolve().parents[2]

ENGINE_MODULES = [
    *sorted(m.name for m in pkgutil.walk_packages(engine.__path__, prefix="airflow_provider_cdc.cdc.")),
    "airflow_provider_cdc.spark_jobs.cdc_job",
]


def run_python(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_engine_imports_without_airflow():
    # A finder that makes Airflow unimportable: the engine must not even try.
    code = f"""
import importlib, json, sys
class NoAirflow:
    def find_spec(self, name, path=None, target=None):
        if name == "airflow" or name.startswith("airflow."):
            raise ImportError("airflow is blocked in this test: " + name)
sys.meta_path.insert(0, NoAirflow())
for name in {ENGINE_MODULES!r}:
    importlib.import_module(name)
print(json.dumps(sorted(m for m in sys.modules if m == "airflow" or m.startswith("airflow."))))
"""
    assert json.loads(run_python(code)) == []


def test_engine_module_list_is_complete():
    assert "airflow_provider_cdc.cdc.sources.postgres.jobs" in ENGINE_MODULES
    assert "airflow_provider_cdc.cdc.sinks.parquet" in ENGINE_MODULES


def test_example_dag_parses_without_spark():
    code = f"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("example", {str(ROOT / "dags/examples/postgres_cdc_hourly.py")!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print(json.dumps({{"spark": sorted(m for m in sys.modules if m.startswith(("pyspark", "py4j"))),
                   "tasks": sorted(module.dag.task_ids)}}))
"""
    result = json.loads(run_python(code))
    assert result["spark"] == []
    assert result["tasks"] == ["capture_window", "current_state", "setup", "slot_health", "snapshot"]


def test_provider_is_registered_as_an_entry_point():
    from importlib.metadata import entry_points

    (entry,) = [e for e in entry_points(group="apache_airflow_provider") if e.value.startswith("airflow_provider_cdc")]
    info = entry.load()()
    assert info["package-name"] == "airflow-provider-cdc"
    modules = {
        m
        for section in ("hooks", "operators", "sensors", "triggers")
        for i in info[section]
        for m in i["python-modules"]
    }
    for module in modules:
        __import__(module)


#: The source-neutral core and the shared Airflow layer: a second source builds on these, so they
#: must not load any source's modules (each source is a folder under cdc/sources/).
CORE_MODULES = [
    "airflow_provider_cdc.cdc.positions",
    "airflow_provider_cdc.cdc.window",
    "airflow_provider_cdc.cdc.tables",
    "airflow_provider_cdc.cdc.offset",
    "airflow_provider_cdc.cdc.planning",
    "airflow_provider_cdc.cdc.incremental",
    "airflow_provider_cdc.cdc.runs",
    "airflow_provider_cdc.cdc.spec",
    "airflow_provider_cdc.cdc.naming",
    "airflow_provider_cdc.cdc.sinks.commit_log",
    "airflow_provider_cdc.captures.base",
    "airflow_provider_cdc.operators.cdc",
]


def test_the_core_loads_no_source():
    code = f"""
import importlib, json, sys
for name in {CORE_MODULES!r}:
    importlib.import_module(name)
print(json.dumps(sorted(m for m in sys.modules if m.startswith("airflow_provider_cdc.cdc.sources."))))
"""
    assert json.loads(run_python(code)) == []


def test_yugabytedb_cdc_service_example_dag_parses_without_spark_or_protobuf():
    code = f"""
import importlib.util, json, sys
path = {str(ROOT / "dags/examples/yugabytedb_cdc_service_hourly.py")!r}
spec = importlib.util.spec_from_file_location("example", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print(json.dumps({{"heavy": sorted(m for m in sys.modules if m.startswith(("pyspark", "py4j", "google.protobuf"))),
                   "tasks": sorted(module.dag.task_ids)}}))
"""
    result = json.loads(run_python(code))
    assert result["heavy"] == []
    assert result["tasks"] == [
        "capture_window",
        "current_state",
        "interval_committed",
        "setup",
        "snapshot",
        "stream_health",
    ]
