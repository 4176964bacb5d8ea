"""The Spark session capture jobs run in: created lazily, configured for exact round trips.

Settings that are not tuning but correctness:
- ``spark.sql.session.timeZone=UTC`` and ``spark.sql.parquet.outputTimestampType=TIMESTAMP_MICROS``
  so timestamps keep microsecond precision and their zone semantics in Parquet (Spark's default
  INT96 loses both);
- ``spark.sql.execution.arrow.pyspark.validateSchema.enabled=true`` so a partition that yields a
  batch of the wrong shape fails loudly instead of corrupting data.

``pyspark`` is imported only here and only when a session is needed: DAG parsing and idle
windows never start a JVM. It is an optional dependency (the ``[spark]`` extra): without it, the
first session raises :class:`SparkNotInstalledError` with the line to install it (under Airflow
also an ``AirflowOptionalProviderFeatureException``, as Airflow's providers raise for theirs).

The in-process default master is ``local[2]`` (``DEFAULT_SPARK_MASTER`` below) with 1 GiB of
driver memory (:data:`DEFAULT_CONF`): a task shares its worker with others, so it takes two cores,
not all of them (``local[*]``); a capture's ``spark_master``/``spark_conf`` raise either.

The JVM's standard error does not go to the process's own: Airflow logs a task process's
standard error at ERROR level, line by line, and the JVM starts with notices such as
``WARNING: Using incubator modules: jdk.incubator.vector``. A thread reads it instead and logs
each line to ``airflow_provider_cdc.spark.jvm`` at the level it carries (log4j's WARN is a
warning, ERROR an error, and the stack trace under a record shares its level), the JVM's own
start-up notices at DEBUG, and anything else (a Python worker's traceback, an
``OutOfMemoryError``) at least as a warning.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import IO, Any

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError

#: The in-process session's master: two cores, not all of the worker's (``local[*]``), which
#: other tasks share; a capture's ``spark_master`` raises it.
DEFAULT_SPARK_MASTER = "local[2]"


@dataclass(frozen=True)
class SparkOptions:
    """How the embedded (in-process) Spark session is built; ignored under ``spark-submit``."""

    master: str = DEFAULT_SPARK_MASTER
    conf: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"master": self.master, "conf": dict(self.conf)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SparkOptions:
        return cls(master=data.get("master", DEFAULT_SPARK_MASTER), conf=dict(data.get("conf") or {}))


REQUIRED_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.execution.arrow.pyspark.validateSchema.enabled": "true",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
}

DEFAULT_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.driver.memory": "1g",
    "spark.sql.sources.partitionOverwriteMode": "static",
}


#: How to get pyspark where it is missing.
SPARK_INSTALL_LINE = "pip install 'airflow-provider-cdc[spark]'"


class SparkNotInstalledError(CdcConfigurationError):
    """pyspark is not installed where a Spark session was needed (an engine error: no Airflow here)."""


_AIRFLOW_FLAVOUR = "AirflowSparkNotInstalledError"
_flavour_lock = threading.Lock()


def _airflow_flavour() -> type[SparkNotInstalledError] | None:
    """:class:`SparkNotInstalledError` that is also Airflow's optional-feature error (None without
    Airflow), as this module's ``AirflowSparkNotInstalledError``.

    Made on first use, not at import: importing Airflow takes seconds and initialises its settings,
    and spark-submit drivers import this module without needing it. Bound once as a module
    attribute (and made on demand by the module's ``__getattr__`` in a process that has not raised
    it yet), so the error pickles and unpickles by name like any exception: Airflow and
    multiprocessing send errors between processes."""
    with _flavour_lock:
        made = globals().get(_AIRFLOW_FLAVOUR)
        if made is not None:
            return made
        try:
            from airflow.sdk.exceptions import AirflowOptionalProviderFeatureException
        except ImportError:
            try:  # an Airflow whose Task SDK does not define it yet
                from airflow.exceptions import AirflowOptionalProviderFeatureException
            except ImportError:  # the engine without Airflow (spark-submit drivers, scripts)
                return None

        class AirflowSparkNotInstalledError(SparkNotInstalledError, AirflowOptionalProviderFeatureException):
            """Both: Airflow's type for whoever catches it, and a terminal configuration error for the
            operators (a retry cannot install a package: the task fails without retries)."""

        AirflowSparkNotInstalledError.__qualname__ = _AIRFLOW_FLAVOUR  # where pickle looks it up
        globals()[_AIRFLOW_FLAVOUR] = AirflowSparkNotInstalledError
        return AirflowSparkNotInstalledError


def __getattr__(name: str) -> Any:
    if name == _AIRFLOW_FLAVOUR and (made := _airflow_flavour()) is not None:
        return made
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def spark_not_installed(cause: ImportError) -> CdcConfigurationError:
    """The error for a missing pyspark: under Airflow, also Airflow's optional-feature error."""
    message = (
        f"Spark is not installed in this Python ({cause}): capture jobs without a spark_conn_id run in an "
        f"in-process Spark session, which needs pyspark. Install the provider's Spark extra on the workers: "
        f"{SPARK_INSTALL_LINE}; or give the capture a spark_conn_id to submit its jobs to a Spark installation"
    )
    return (_airflow_flavour() or SparkNotInstalledError)(message)


def require_pyspark() -> None:
    """Import pyspark, or raise :func:`spark_not_installed`'s error naming the extra to install."""
    try:
        import pyspark.sql  # noqa: F401
    except ImportError as exc:
        if (exc.name or "").split(".")[0] not in ("pyspark", "py4j"):
            raise  # pyspark is there but broken: its own error says more
        raise spark_not_installed(exc) from None


def check_pyspark_release() -> None:
    """Refuse a pyspark whose Python files and JVM jars are different Spark releases.

    ``pyspark`` and ``pyspark-client`` (which Airflow's Spark provider requires) both install the
    ``pyspark`` package; when pip picks different releases of the two, the last one installed
    wins the Python files while the jars stay the other's, and the first Spark job fails deep in
    py4j ("Constructor ... does not exist"). Say so before a session starts."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    cores = sorted(jars.glob("spark-core_*.jar")) if jars.is_dir() else []
    if not cores:
        return  # a pyspark without jars (a Spark distribution's SPARK_HOME supplies them)
    jar_release = cores[0].stem.rsplit("-", 1)[-1]
    if jar_release != pyspark.__version__:
        raise CdcConfigurationError(
            f"pyspark's Python files are Spark {pyspark.__version__} but its jars are Spark {jar_release}: "
            "pyspark and pyspark-client were installed at different releases and share one package. "
            f"Install the same release of both, e.g. pip install 'pyspark=={pyspark.__version__}' "
            f"'pyspark-client=={pyspark.__version__}' (or both =={jar_release})"
        )


def get_or_create_session(options: SparkOptions | None = None, *, submitted: bool = False) -> Any:
    """The active session, or a new one: local with ``options``, or as ``spark-submit`` set it
    up when ``submitted`` (master and conf then come from the submit command)."""
    require_pyspark()
    check_pyspark_release()
    from pyspark.sql import SparkSession

    # py4j logs every connection it closes at INFO, even at interpreter exit.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    active = SparkSession.getActiveSession()
    if active is not None:
        for key, value in REQUIRED_CONF.items():
            active.conf.set(key, value)
        return active
    if submitted:
        # No appName: spark-submit's --name (cdc-<prefix>-<window>) names it in the cluster's UI.
        builder = SparkSession.builder
        for key, value in REQUIRED_CONF.items():
            builder = builder.config(key, value)
        return builder.getOrCreate()
    options = options or SparkOptions()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Python workers must run this interpreter (with this package and pyarrow installed), not
    # whatever python3 is first on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    log_config = resources.files("airflow_provider_cdc.cdc.resources").joinpath("log4j2.properties")
    conf = {
        **DEFAULT_CONF,
        "spark.driver.extraJavaOptions": f"-Dlog4j.configurationFile=file:{log_config}",
        **options.conf,
        **REQUIRED_CONF,
        "spark.master": options.master,
        "spark.app.name": "airflow-provider-cdc",
    }
    _launch_jvm(conf)
    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    for key, value in REQUIRED_CONF.items():
        session.conf.set(key, value)
    return session


def spark_schema(arrow_schema: Any) -> Any:
    """Spark schema of an Arrow schema (naive timestamps → TimestampNTZType)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(arrow_schema, prefer_timestamp_ntz=True)


# -- the JVM's standard error, logged line by line at the level each line carries ------------------

JVM_LOG = logging.getLogger("airflow_provider_cdc.spark.jvm")

_LEVELS = {
    "TRACE": logging.DEBUG,
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARN": logging.WARNING,
    "WARNING": logging.WARNING,
    "ERROR": logging.ERROR,
    "FATAL": logging.CRITICAL,
}
# A log4j record in the pattern of resources/log4j2.properties (or Spark's default one).
_LOG4J_RECORD = re.compile(r"^(?:\d\d/\d\d/\d\d \d\d:\d\d:\d\d )?(TRACE|DEBUG|INFO|WARN|ERROR|FATAL) \S+: ")
# The JVM's own start-up notices: incubator modules, illegal reflective access, options picked up
# from the environment. They are about the JVM this provider starts, never about the capture.
_JVM_NOTICE = re.compile(r"^(?:WARNING: |NOTE: |Picked up (?:JAVA_TOOL_OPTIONS|_JAVA_OPTIONS|JDK_JAVA_OPTIONS))")
# Lines that continue the record before them: stack frames, causes, wrapped text.
_CONTINUATION = re.compile(r"^(?:\s|at |Caused by: |Suppressed: |\.\.\. \d+ more)")


def jvm_line_level(line: str, previous: int) -> int:
    """The logging level of one line of the JVM's standard error (``previous``: the level of the
    line before, which a stack frame or a wrapped line continues)."""
    record = _LOG4J_RECORD.match(line)
    if record:
        return _LEVELS[record.group(1)]
    if line.startswith("{"):  # Spark's structured (JSON) logging
        try:
            level = json.loads(line).get("level")
        except (ValueError, AttributeError):
            level = None
        if isinstance(level, str) and level.upper() in _LEVELS:
            return _LEVELS[level.upper()]
    if _JVM_NOTICE.match(line):
        return logging.DEBUG
    if _CONTINUATION.match(line):
        return previous
    return max(previous, logging.WARNING)  # e.g. the exception an ERROR record prints, or a worker's traceback


class _JvmOutput(threading.Thread):
    """Reads the JVM's standard error until it closes, logging each line with :data:`JVM_LOG`."""

    def __init__(self, stream: IO[bytes]) -> None:
        super().__init__(name="spark-jvm-stderr", daemon=True)
        self.stream = stream
        self.recent: deque[str] = deque(maxlen=40)

    def run(self) -> None:
        log_lines(JVM_LOG, (raw.decode("utf-8", "replace") for raw in self.stream), self.recent)
        self.stream.close()


def log_lines(logger: logging.Logger, lines: Iterable[str], recent: deque[str] | None = None) -> None:
    level = logging.INFO
    for text in lines:
        line = text.rstrip()
        if not line:
            continue
        level = jvm_line_level(line, level)
        if recent is not None:
            recent.append(line)
        logger.log(level, "%s", line)


def _launch_jvm(conf: dict[str, str]) -> None:
    """Start Spark's JVM (as ``getOrCreate`` would, with the same settings on its command line)
    with its standard error read by a :class:`_JvmOutput` thread. Nothing to do when a JVM is up."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None or "PYSPARK_GATEWAY_PORT" in os.environ:
        return
    spark_conf = SparkConf(loadDefaults=False).setAll(list(conf.items()))
    read_end, write_end = os.pipe()
    output = _JvmOutput(os.fdopen(read_end, "rb"))
    output.start()
    try:
        gateway = launch_gateway(spark_conf, popen_kwargs={"stderr": write_end})
    except Exception:
        os.close(write_end)
        output.join(timeout=10)
        JVM_LOG.error("Spark's JVM exited before it started; its last output:\n%s", "\n".join(output.recent))
        raise
    os.close(write_end)  # the JVM holds the only write end now: the thread ends when it exits
    SparkContext._ensure_initialized(gateway=gateway)
