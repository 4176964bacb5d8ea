"""The engine runs without Airflow; DAG files parse without Spark; the provider registers."""

from __future__ import annotations

import ast
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
    "airflow_provider_cdc.cdc.basics.positions",
    "airflow_provider_cdc.cdc.basics.window",
    "airflow_provider_cdc.cdc.basics.tables",
    "airflow_provider_cdc.cdc.planning.offset",
    "airflow_provider_cdc.cdc.planning.plan",
    "airflow_provider_cdc.cdc.planning.incremental",
    "airflow_provider_cdc.cdc.planning.runs",
    "airflow_provider_cdc.cdc.planning.spec",
    "airflow_provider_cdc.cdc.basics.naming",
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


#: Libraries a DAG file must not load when it is parsed (issue 30, item 7): Airflow re-imports the
#: provider on every parse of every DAG file, so each of these is paid by the DAG processor over
#: and over (pyarrow, numpy and pandas alone are ~1 s and ~100 MB). Drivers and engines load in the
#: task that uses them; hooks (built on PostgresHook / DbApiHook, so psycopg2 and SQLAlchemy) load
#: only inside the methods that need them.
HEAVY_AT_PARSE = (
    "pyarrow",
    "numpy",
    "pandas",
    "psycopg",
    "psycopg2",
    "psycopg_binary",
    "pyspark",
    "py4j",
    "deltalake",
    "pyiceberg",
    "pyodbc",
    "grpc",
    "google.protobuf",
    "boto3",  # object stores (issue 31): the Amazon provider's hook and obstore load in the task
    "botocore",
    "obstore",
    "airflow.providers.amazon.aws.hooks",
    "airflow.providers.postgres.hooks",
    "airflow.providers.common.sql.hooks",
    "airflow.providers.apache.spark.hooks",
    "airflow.providers.odbc.hooks",
    "airflow.providers.microsoft.mssql.hooks",
    "airflow_provider_cdc.hooks.",
)

#: The modules a DAG file imports: the captures, operators and sensors (hooks are not imported by DAGs).
DAG_FACING_MODULES = [
    "airflow_provider_cdc.capture",
    *sorted(
        m.name
        for package in ("captures", "operators", "sensors")
        for m in pkgutil.iter_modules(
            [str(ROOT / "airflow_provider_cdc" / package)], prefix=f"airflow_provider_cdc.{package}."
        )
    ),
]


def test_parsing_the_example_dags_loads_no_heavy_library():
    # One interpreter (the DAG processor's situation: airflow.sdk loaded), two checkpoints: after
    # parsing every example DAG, then after importing every DAG-facing module too.
    paths = sorted(str(p) for p in (ROOT / "dags" / "examples").glob("*.py"))
    assert len(paths) == 4
    assert "airflow_provider_cdc.operators.postgres_cdc" in DAG_FACING_MODULES
    code = f"""
import importlib, importlib.util, json, sys
import airflow.sdk

def heavy():
    return sorted({{h for m in sys.modules for h in {HEAVY_AT_PARSE!r} if m.startswith(h) or m + "." == h}})

for i, path in enumerate({paths!r}):
    spec = importlib.util.spec_from_file_location(f"example_{{i}}", path)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
after_dags = heavy()
for name in {DAG_FACING_MODULES!r}:
    importlib.import_module(name)
print(json.dumps({{"example DAGs": after_dags, "DAG-facing modules": heavy()}}))
"""
    assert json.loads(run_python(code)) == {"example DAGs": [], "DAG-facing modules": []}


def test_no_runtime_module_imports_the_testing_toolkit():
    # airflow_provider_cdc.testing (throwaway clusters, the shop workload) ships as a testing
    # toolkit with its own extra: nothing a DAG or a task runs may depend on it.
    package = ROOT / "airflow_provider_cdc"
    found = []
    for path in sorted(package.rglob("*.py")):
        if path.relative_to(package).parts[0] == "testing":
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            if any(n == "airflow_provider_cdc.testing" or n.startswith("airflow_provider_cdc.testing.") for n in names):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []
