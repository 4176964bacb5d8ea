"""Running a capture job: in this process (embedded local Spark) or through ``spark-submit``.

Both run the same engine function with the same job spec (any source's). The submitted job
gets the spec as a file without the password (mode 0600, deleted afterwards) and the password
in an environment variable of the ``spark-submit`` process.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from airflow_provider_cdc.cdc.errors import CdcConfigurationError, CdcError
from airflow_provider_cdc.cdc.sinks.commit_log import CommitEntry

log = logging.getLogger(__name__)

#: The spark-submit entry point shipped with the package.
DEFAULT_APPLICATION = str(Path(__file__).parent / "spark_jobs" / "cdc_job.py")
#: Spark's logging for capture jobs: errors only (the same file the embedded session uses).
QUIET_LOG4J = str(Path(__file__).parent / "cdc" / "resources" / "log4j2.properties")


def run_embedded(spec: Any) -> CommitEntry:
    """Run a window's job (any source's spec) in this process."""
    from airflow_provider_cdc.cdc.jobs import run_window_job

    return run_window_job(spec)


def run_submitted(
    spec: Any,
    *,
    spark_conn_id: str,
    conf: dict[str, str],
    application: str | None = None,
) -> CommitEntry:
    connection = getattr(spec, "connection", None)  # the CDC-service source has none: no password to pass
    secrets = (
        {connection.password_env: connection.password} if getattr(connection, "password", None) is not None else {}
    )
    if spec.options.table_catalog_secret is not None:
        from airflow_provider_cdc.cdc.spec import CATALOG_SECRET_ENV

        secrets[CATALOG_SECRET_ENV] = spec.options.table_catalog_secret
    result = submit(
        spec.to_json(),
        name=f"cdc-{spec.topic_prefix}-{spec.window.window_id}",
        secrets=secrets,
        spark_conn_id=spark_conn_id,
        conf=conf,
        application=application,
    )
    return CommitEntry.from_dict(result)


def state_secrets(spec: Any) -> dict[str, str]:
    """What a submitted current-state job needs beside its spec: the catalog's secret, if any."""
    from airflow_provider_cdc.cdc.spec import CATALOG_SECRET_ENV

    return {CATALOG_SECRET_ENV: spec.table_catalog_secret} if spec.table_catalog_secret is not None else {}


def submit(
    spec_json: str,
    *,
    name: str,
    secrets: dict[str, str],
    spark_conn_id: str,
    conf: dict[str, str],
    application: str | None = None,
) -> Any:
    """Run ``spark_jobs/cdc_job.py`` on a spec through ``SparkSubmitHook``; return its result."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    from airflow_provider_cdc.version_compat import BaseHook

    # SparkSubmitHook silently falls back to master 'yarn' when the connection is missing.
    connection = BaseHook.get_connection(spark_conn_id)
    master = (connection.host or "").strip()
    check_client_mode(spark_conn_id, connection.extra_dejson or {}, conf)
    env = dict(secrets)
    if master.startswith("local"):
        # A local master runs Python workers on this machine: use this interpreter (the one with
        # the package installed). Cluster masters use spark.pyspark.python / the cluster's setup.
        env["PYSPARK_PYTHON"] = os.environ.get("PYSPARK_PYTHON", sys.executable)
    with tempfile.TemporaryDirectory(prefix="cdc-job-") as workdir:
        spec_path = Path(workdir) / "spec.json"
        result_path = Path(workdir) / "result.json"
        fd = os.open(spec_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(spec_json)
        hook = SparkSubmitHook(
            conn_id=spark_conn_id,
            name=name,
            application_args=["--spec", str(spec_path), "--result", str(result_path)],
            conf={
                "spark.sql.session.timeZone": "UTC",
                "spark.ui.showConsoleProgress": "false",
                # The hook logs every line spark-submit prints at INFO in the task log: the
                # driver logs Spark's own records at ERROR only (the job's progress lines are
                # Python logging and still come through).
                "spark.driver.extraJavaOptions": f"-Dlog4j.configurationFile=file:{QUIET_LOG4J}",
                **conf,
            },
            spark_binary=spark_submit_binary(),
        )
        # The environment goes to the spark-submit process itself, not through the hook's env_vars:
        # on YARN and Kubernetes masters the hook turns those into --conf arguments, and a password
        # on a command line is visible to every user of the machine (ps). In client mode (the
        # only one that returns a result) the driver is the spark-submit process: it inherits this.
        hook.submit(application=application or DEFAULT_APPLICATION, env={**os.environ, **env})
        if not result_path.exists():
            raise CdcError(
                "the submitted capture job finished without reporting its result (cluster deploy mode "
                "cannot write the result file back; use client mode)"
            )
        return json.loads(result_path.read_text(encoding="utf-8"))


def check_client_mode(spark_conn_id: str, extra: dict[str, Any], conf: dict[str, str]) -> None:
    """Refuse cluster deploy mode before anything runs.

    The job reports its commit entry back through a local result file, and the operator saves
    the offset and acknowledges the source from it, so the driver must run where the task runs
    (client mode). In cluster mode the result could not come back, and the window would land
    with no offset saved; Spark standalone also refuses cluster mode for Python applications.
    """
    modes = {str(extra.get("deploy-mode") or "").strip().lower(), str(conf.get("spark.submit.deployMode", "")).lower()}
    if "cluster" in modes:
        raise CdcConfigurationError(
            f"Spark connection {spark_conn_id!r} asks for deploy mode 'cluster': capture jobs run in client "
            "mode (the driver reports the committed window back to the task, which then saves the offset). "
            "Remove deploy-mode from the connection's extra (or spark.submit.deployMode from spark_conf); "
            "the executors still run on the cluster. Nothing was submitted."
        )


def spark_submit_binary() -> str:
    """``spark-submit`` of the installed pyspark (next to this Python), else the one on PATH."""
    beside = Path(sys.executable).parent / "spark-submit"
    if beside.exists():
        return str(beside)
    found = shutil.which("spark-submit")
    if found is None:
        raise CdcConfigurationError("spark-submit was not found next to this Python or on PATH")
    return found
