"""The engine runs without Airflow; DAG files parse without Spark; the provider registers."""

from __future__ import annotations

import ast
import functools
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


#: The engine's stages, bottom up, and the stages each may import (docs/architecture.md, "Shape";
#: each stage's ``__init__`` says the same). A module of the engine belongs to the folder it is in;
#: ``cdc/jobs.py`` is the top, the one module that loads a source (by its connector's name).
STAGES = {
    "basics": set(),
    "events": {"basics"},
    "sinks": {"basics", "events"},
    "planning": {"basics", "events", "sinks"},
    "reading": {"basics", "events", "sinks", "planning"},
    "state": {"basics", "events", "sinks"},
    "sources": {"basics", "events", "sinks", "planning", "reading"},
    "jobs": {"basics", "events", "sinks", "planning", "reading"},
}
#: The sources a source builds on (YugabyteDB speaks PostgreSQL's protocol): never the other way.
SOURCE_BASES = {
    "postgres": set(),
    "sqlserver": set(),
    "yugabyte": {"postgres"},
    "yugabyte_cdc": {"postgres", "yugabyte"},
}
#: Known upward imports, each to be removed (none today).
KNOWN_UPWARD: set[tuple[str, str]] = set()
PACKAGE = ROOT / "airflow_provider_cdc"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def package_imports() -> dict[str, set[str]]:
    """Every module of the package -> the modules of the package it imports (at the top, inside a
    function or under TYPE_CHECKING: each is an arrow of the design), read from the code."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # "from package import module" names the module; "from module import name" the module
                found |= {
                    f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                    for a in node.names
                }
        # the imported module itself, or the package a dotted name falls in
        graph[name] = {_known(m, modules) for m in found if m.startswith("airflow_provider_cdc")} - {name, None}
    return graph


def _imported(module: str, name: str, modules: dict) -> str:
    return f"{module}.{name}" if f"{module}.{name}" in modules else module


def _known(name: str, modules: dict) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def stage_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] != ["airflow_provider_cdc", "cdc"] or len(parts) < 3:
        return None  # the Airflow side, or the engine's package face
    return parts[2]


def test_every_engine_module_is_in_a_stage():
    graph = package_imports()
    strays = sorted(m for m in graph if stage_of(m) not in (None, *STAGES, "resources"))
    assert strays == [], "put each engine module in a stage folder (or add the stage to STAGES and the docs)"


def test_each_stage_imports_only_the_stages_below_it():
    upward = []
    for module, imported in sorted(package_imports().items()):
        stage = stage_of(module)
        if stage not in STAGES:
            continue
        for target in sorted(imported):
            other = stage_of(target)
            if target in ("airflow_provider_cdc", "airflow_provider_cdc.cdc"):
                continue  # the package faces: a version and a docstring, no imports
            if other == stage and stage != "sources":
                continue
            if (module, target) in KNOWN_UPWARD:
                continue
            if other == stage == "sources":
                source, target_source = module.split(".")[3], target.split(".")[3]
                if target_source == source or target_source in SOURCE_BASES[source]:
                    continue
            elif other in STAGES[stage]:
                continue
            upward.append(f"{module} -> {target}")
    assert upward == []


def test_the_engine_imports_no_airflow_side_module():
    # The Airflow side (captures, operators, hooks ...) sits on the engine, never under it.
    found = [
        f"{m} -> {t}"
        for m, imported in sorted(package_imports().items())
        if m.startswith("airflow_provider_cdc.cdc")
        for t in sorted(imported)
        if not t.startswith("airflow_provider_cdc.cdc") and t != "airflow_provider_cdc"
    ]
    assert found == []


def test_no_import_circles():
    # Modules that import each other, however far round: a lower module may not need a higher one.
    graph = package_imports()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    assert circles == []


def test_the_checks_read_the_arrows_from_the_code():
    # The graph is read from the files, lazy imports included: the arrows the rules stand on are seen.
    graph = package_imports()
    assert "airflow_provider_cdc.cdc.sinks.commit_log" in graph["airflow_provider_cdc.cdc.planning.plan"]
    assert "airflow_provider_cdc.cdc.sinks.object_store" in graph["airflow_provider_cdc.cdc.sinks.storage"]
    assert stage_of("airflow_provider_cdc.cdc.state.merge") == "state"
    assert "sinks" not in STAGES["basics"] and "state" not in STAGES["planning"]


#: Every module of the stages (and the shared Airflow layer) loads no module of any source when
#: imported: checked by importing them, so an import made by name (importlib) counts too.
CORE_MODULES = [
    *sorted(
        module_name(p)
        for stage in STAGES
        if stage not in ("sources", "jobs")
        for p in (PACKAGE / "cdc" / stage).rglob("*.py")
    ),
    "airflow_provider_cdc.cdc.jobs",
    "airflow_provider_cdc.captures.base",
    "airflow_provider_cdc.captures.source_run",
    "airflow_provider_cdc.operators.base",
    "airflow_provider_cdc.operators.landing",
    "airflow_provider_cdc.operators.setup",
    "airflow_provider_cdc.operators.snapshot",
    "airflow_provider_cdc.operators.window",
    "airflow_provider_cdc.operators.current_state",
    "airflow_provider_cdc.utils.assets",
    "airflow_provider_cdc.utils.lineage",
    "airflow_provider_cdc.utils.runs",
    "airflow_provider_cdc.utils.times",
]


def test_the_core_loads_no_source():
    assert "airflow_provider_cdc.cdc.planning.spec" in CORE_MODULES
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
        for package in ("captures", "operators", "sensors", "utils")
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
    assert "airflow_provider_cdc.operators.window" in DAG_FACING_MODULES
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
