"""Running a capture job: in this process (embedded local Spark) or through ``spark-submit``.

Both run the same engine function with the same job spec (any source's). The submitted job
gets the spec as a file without the password (mode 0600, deleted afterwards) and the password
in an environment variable of the ``spark-submit`` process.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError, CdcError
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
    on_start: Callable[[Any], None] | None = None,
) -> CommitEntry:
    connection = getattr(spec, "connection", None)  # the CDC-service source has none: no password to pass
    secrets = (
        {connection.password_env: connection.password} if getattr(connection, "password", None) is not None else {}
    )
    if spec.options.table_catalog_secret is not None:
        from airflow_provider_cdc.cdc.planning.spec import CATALOG_SECRET_ENV

        secrets[CATALOG_SECRET_ENV] = spec.options.table_catalog_secret
    secrets.update(object_store_secrets(spec.options.object_store))
    result = submit(
        spec.to_json(),
        name=f"cdc-{spec.topic_prefix}-{spec.window.window_id}",
        secrets=secrets,
        spark_conn_id=spark_conn_id,
        conf=conf,
        application=application,
        on_start=on_start,
    )
    return CommitEntry.from_dict(result)


def state_secrets(spec: Any) -> dict[str, str]:
    """What a submitted current-state job needs beside its spec: the catalog's secret, if any."""
    from airflow_provider_cdc.cdc.planning.spec import CATALOG_SECRET_ENV

    secrets = {CATALOG_SECRET_ENV: spec.table_catalog_secret} if spec.table_catalog_secret is not None else {}
    return {**secrets, **object_store_secrets(spec.object_store)}


def object_store_secrets(access: Any) -> dict[str, str]:
    """The object store's keys for a submitted job's environment (never its spec)."""
    if access is None or access.access_key_id is None:
        return {}
    from airflow_provider_cdc.cdc.sinks.object_store import OBJECT_STORE_SECRET_ENV

    return {OBJECT_STORE_SECRET_ENV: access.secret_json()}


def submit(
    spec_json: str,
    *,
    name: str,
    secrets: dict[str, str],
    spark_conn_id: str,
    conf: dict[str, str],
    application: str | None = None,
    on_start: Callable[[Any], None] | None = None,
) -> Any:
    """Run ``spark_jobs/cdc_job.py`` on a spec through ``SparkSubmitHook``; return its result.

    ``on_start`` gets the hook before the job starts (the operator's ``on_kill`` stops the job
    through it: :func:`kill_submitted`)."""
    from airflow_provider_cdc.version_compat import spark_submit_hook_class

    # Airflow's Spark provider comes with the [spark] extra: without it, an optional-feature error
    # naming the install line, not a raw ImportError.
    spark_submit_hook = spark_submit_hook_class()

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
        hook = spark_submit_hook(
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
            spark_binary=spark_submit_binary(connection.extra_dejson or {}),
        )
        # The environment goes to the spark-submit process itself, not through the hook's env_vars:
        # on YARN and Kubernetes masters the hook turns those into --conf arguments, and a password
        # on a command line is visible to every user of the machine (ps). In client mode (the
        # only one that returns a result) the driver is the spark-submit process: it inherits this.
        if on_start is not None:
            on_start(hook)
        # spark-submit stays in the task's process group (no new session): when the supervisor
        # kills the task's group (SIGTERM, then SIGKILL 5 s later), spark-submit and the driver
        # it starts go with it, even if on_kill cannot finish.
        try:
            hook.submit(application=application or DEFAULT_APPLICATION, env={**os.environ, **env})
        except BaseException:
            # A timeout or a kill unwinding the wait (or a failed job): nothing may keep running.
            kill_submitted(hook)
            raise
        if not result_path.exists():
            raise CdcError(
                "the submitted capture job finished without reporting its result (cluster deploy mode "
                "cannot write the result file back; use client mode)"
            )
        return json.loads(result_path.read_text(encoding="utf-8"))


def kill_submitted(hook: Any) -> None:
    """Stop a job started by :func:`submit` (idempotent; nothing to do once it has exited).

    First every process ``spark-submit`` started (in client mode the Python driver, which holds
    the source's replication session and would outlive ``spark-submit``), at once: the hook's
    ``on_kill`` may take longer than the supervisor waits before its SIGKILL (a YARN kill). Then
    the hook's ``on_kill``, as ``SparkSubmitOperator.on_kill`` does: it kills ``spark-submit``
    and, where it tracks one, the driver or application on the cluster."""
    process = getattr(hook, "_submit_sp", None)  # the hook's spark-submit process, once started
    # poll() reaps spark-submit only once it has exited: while it returns None, the pid is still
    # spark-submit's (never a reused one of another process).
    if process is not None and process.poll() is None:
        _kill_descendants(process.pid)
    try:
        hook.on_kill()
    except Exception as exc:  # e.g. a failed YARN kill command: the local processes are gone
        log.warning("the Spark hook could not stop the submitted job: %s", exc)
    if process is not None:
        with contextlib.suppress(Exception):
            process.wait(timeout=10)


def _kill_descendants(pid: int) -> None:
    import psutil  # Airflow's own dependency

    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:  # exited meanwhile
        return
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(children, timeout=5)


def cancel_embedded(timeout: float = 10.0) -> None:
    """Cancel the Spark jobs of this process's session (the in-process capture jobs); the
    session itself stays, for the next task the process runs. Never raises.

    Called from a signal handler (Airflow's SIGTERM handler runs ``on_kill`` in the main thread,
    usually while it waits in a py4j call for the running job): a second py4j call on that
    thread's connection would be re-entrant and fail. The cancel runs in a short-lived thread
    (its own py4j connection), joined with a timeout."""
    try:
        from pyspark import SparkContext
    except ImportError:  # no Spark here: nothing runs
        return
    context = SparkContext._active_spark_context  # process-wide (getActiveSession is per thread)
    if context is None:
        return
    failed: list[BaseException] = []

    def cancel() -> None:
        try:
            context.cancelAllJobs()
        except Exception as exc:
            failed.append(exc)

    worker = threading.Thread(target=cancel, name="cdc-cancel-spark-jobs", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive() or failed:
        log.warning(
            "could not cancel the in-process Spark jobs: %s",
            failed[0] if failed else f"no answer within {timeout:.0f} s",
        )


def drop_interrupted_call() -> None:
    """Close this thread's py4j connection (never raises). Called by ``on_kill`` before it raises
    in the main thread, usually inside a py4j call waiting for the running job's answer: that
    answer would otherwise be read as the answer of the thread's next call (PySpark's own
    cleanup while the kill unwinds), which then fails and hides the kill. The thread's next call
    opens a new connection."""
    try:
        from pyspark import SparkContext
    except ImportError:
        return
    client = getattr(SparkContext._gateway, "_gateway_client", None)
    connection = client.get_thread_connection() if hasattr(client, "get_thread_connection") else None
    if connection is not None:  # py4j's pinned-thread mode (PySpark's default)
        with contextlib.suppress(Exception):
            connection.close()


@contextlib.contextmanager
def cancel_before_timeout(active: Callable[[], bool]) -> Iterator[None]:
    """Within it, Airflow's ``execution_timeout`` first cancels the in-process Spark jobs (while
    ``active()``), then raises as Airflow's handler does.

    The timeout (SIGALRM) raises in the main thread, usually inside the py4j call that waits for
    the running job; PySpark's cleanup then makes another call on that connection, which waits for
    the job's own answer: the task would hang, the job going on, until the job ends. Cancelling
    and dropping the interrupted call first (as ``on_kill`` does) lets the timeout end the run."""
    handler = signal.getsignal(signal.SIGALRM)
    if not callable(handler) or threading.current_thread() is not threading.main_thread():
        yield  # no execution_timeout (or not where signals arrive)
        return

    def on_alarm(signum: int, frame: Any) -> None:
        if active():
            cancel_embedded()
            drop_interrupted_call()
        handler(signum, frame)  # Airflow's: raises AirflowTaskTimeout

    signal.signal(signal.SIGALRM, on_alarm)
    try:
        yield
    finally:
        signal.signal(signal.SIGALRM, handler)


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


def spark_submit_binary(extra: dict[str, Any] | None = None) -> str | None:
    """The ``spark-submit`` to run: None where the Spark connection's extra names one
    (``spark-binary``), so ``SparkSubmitHook`` uses it (from PATH) and checks it against the
    binaries it allows; else the one the installed pyspark ships (next to this Python), else the
    one on PATH."""
    if (extra or {}).get("spark-binary"):
        return None
    beside = Path(sys.executable).parent / "spark-submit"
    if beside.exists():
        return str(beside)
    found = shutil.which("spark-submit")
    if found is None:
        raise CdcConfigurationError(
            "spark-submit was not found next to this Python or on PATH: install Spark's client on the workers "
            "(pip install 'airflow-provider-cdc[spark]' ships one with pyspark), or name the cluster's binary in the "
            "Spark connection's extra (spark-binary: spark-submit, spark2-submit or spark3-submit, found on PATH)"
        )
    return found
