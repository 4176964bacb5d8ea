"""Spark as an optional feature: a clear error without pyspark, a bounded in-process default, and
the Spark connection's own ``spark-binary`` respected by ``spark-submit`` runs."""

from __future__ import annotations

import inspect
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INSTALL_LINE = "pip install 'airflow-provider-cdc[spark]'"

#: A finder that makes the named top-level packages unimportable (as if not installed).
BLOCKER = """
import sys
class Blocked:
    def __init__(self, names):
        self.names = names
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked in this test)", name=name)
sys.meta_path.insert(0, Blocked(BLOCKED))
"""


def start_session_without(blocked: tuple[str, ...]) -> dict[str, object]:
    """Start the default in-process session in a fresh interpreter where ``blocked`` are missing."""
    code = f"""
import json
BLOCKED = {blocked!r}
{BLOCKER}
from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.basics.spark_session import get_or_create_session
try:
    get_or_create_session()
except Exception as exc:
    print(json.dumps({{"mro": [c.__name__ for c in type(exc).__mro__], "message": str(exc),
                      "engine_error": isinstance(exc, CdcConfigurationError)}}))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_without_pyspark_the_error_names_the_extra_to_install():
    raised = start_session_without(("pyspark",))
    assert "AirflowOptionalProviderFeatureException" in raised["mro"], raised
    assert INSTALL_LINE in raised["message"]
    assert raised["engine_error"] is True  # the operators' handling of configuration errors still applies


def test_without_pyspark_or_airflow_the_engine_raises_its_own_error():
    raised = start_session_without(("pyspark", "airflow"))
    assert "CdcConfigurationError" in raised["mro"], raised
    assert INSTALL_LINE in raised["message"]


def test_the_missing_pyspark_error_pickles(monkeypatch):
    """Airflow and multiprocessing pickle errors between processes: the error raised without
    pyspark unpickles as itself, also where it was not raised yet (its class made on demand)."""
    import pickle

    from airflow.sdk.exceptions import AirflowOptionalProviderFeatureException

    from airflow_provider_cdc.cdc.basics import spark_session

    class Blocked:  # pyspark as if not installed
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("pyspark", "py4j"):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked in this test)", name=name)

    monkeypatch.setattr(sys, "meta_path", [Blocked(), *sys.meta_path])
    for name in [m for m in sys.modules if m.split(".")[0] in ("pyspark", "py4j")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(AirflowOptionalProviderFeatureException) as raised:
        spark_session.require_pyspark()
    pickled = pickle.dumps(raised.value)
    assert type(pickle.loads(pickled)) is type(raised.value)
    monkeypatch.delattr(spark_session, "AirflowSparkNotInstalledError")  # as in a process that never raised it
    unpickled = pickle.loads(pickled)
    assert isinstance(unpickled, spark_session.SparkNotInstalledError)
    assert isinstance(unpickled, AirflowOptionalProviderFeatureException)
    assert INSTALL_LINE in str(unpickled) and str(unpickled) == str(raised.value)


def test_the_in_process_default_is_bounded():
    """Not every core of the worker: other tasks share it (docs/operators.md, spark_master)."""
    from airflow_provider_cdc.captures.postgres import PostgresCapture
    from airflow_provider_cdc.cdc.basics.spark_session import DEFAULT_CONF
    from airflow_provider_cdc.cdc.planning.spec import DEFAULT_SPARK_MASTER, SparkOptions
    from airflow_provider_cdc.operators.query_extract import PostgresQueryExtractOperator

    assert DEFAULT_SPARK_MASTER == "local[2]"
    assert SparkOptions().master == SparkOptions.from_dict({}).master == DEFAULT_SPARK_MASTER
    capture = PostgresCapture(postgres_conn_id="pg", tables=["public.t"], topic_prefix="p", sink_path="/tmp/x")
    assert capture.spark_options().master == DEFAULT_SPARK_MASTER
    default = inspect.signature(PostgresQueryExtractOperator.__init__).parameters["spark_master"].default
    assert default == DEFAULT_SPARK_MASTER
    assert DEFAULT_CONF["spark.driver.memory"] == "1g"


@pytest.mark.airflow
def test_the_spark_connections_own_binary_is_used(tmp_path, monkeypatch):
    """A connection whose extra names ``spark3-submit`` runs that binary (found on PATH, as the Spark
    provider does), not the one pyspark ships; one naming a path is refused by the Spark provider."""
    from airflow_provider_cdc.spark_runner import submit

    binaries = tmp_path / "bin"
    binaries.mkdir()
    # The cluster's spark3-submit, as far as this test needs: it records how it was called and
    # writes the job's result file (the argument after --result).
    fake = binaries / "spark3-submit"
    fake.write_text(
        "#!/bin/sh\n"
        'while [ "$#" -gt 0 ]; do if [ "$1" = "--result" ]; then out="$2"; fi; shift; done\n'
        'printf \'{"binary": "spark3-submit"}\' > "$out"\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{binaries}{os.pathsep}{os.environ['PATH']}")
    named = {"conn_type": "spark", "host": "local[1]", "extra": {"spark-binary": "spark3-submit"}}
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_NAMED", json.dumps(named))
    result = submit("{}", name="binary-test", secrets={}, spark_conn_id="spark_named", conf={})
    assert result == {"binary": "spark3-submit"}

    planted = {**named, "extra": {"spark-binary": str(fake)}}
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_PLANTED", json.dumps(planted))
    with pytest.raises(Exception, match="spark-binary extra can be one of"):
        submit("{}", name="binary-test", secrets={}, spark_conn_id="spark_planted", conf={})


def test_pyspark_python_files_and_jars_of_different_releases_are_refused(tmp_path):
    """pip can leave pyspark-client's Python files over a newer pyspark's jars (both install the
    ``pyspark`` package): the first Spark job would fail deep in py4j; the session refuses first."""
    fake = tmp_path / "pyspark"
    (fake / "jars").mkdir(parents=True)
    (fake / "__init__.py").write_text("__version__ = '4.2.0'\n")
    (fake / "jars" / "spark-core_2.13-4.3.0.jar").write_bytes(b"")
    code = """
from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.basics.spark_session import check_pyspark_release
try:
    check_pyspark_release()
except CdcConfigurationError as exc:
    print(exc)
"""
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert "Python files are Spark 4.2.0 but its jars are Spark 4.3.0" in out.stdout, out.stderr
    from airflow_provider_cdc.cdc.basics.spark_session import check_pyspark_release

    check_pyspark_release()  # the installed pyspark is one release
