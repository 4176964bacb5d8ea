"""The Spark session capture jobs run in: created lazily, configured for exact round trips.

Settings that are not tuning but correctness:
- ``spark.sql.session.timeZone=UTC`` and ``spark.sql.parquet.outputTimestampType=TIMESTAMP_MICROS``
  so timestamps keep microsecond precision and their zone semantics in Parquet (Spark's default
  INT96 loses both);
- ``spark.sql.execution.arrow.pyspark.validateSchema.enabled=true`` so a partition that yields a
  batch of the wrong shape fails loudly instead of corrupting data.

``pyspark`` is imported only here and only when a session is needed: DAG parsing and idle
windows never start a JVM.
"""

from __future__ import annotations

import logging
import os
import sys
from importlib import resources
from typing import Any

from airflow_provider_cdc.cdc.spec import SparkOptions

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


def get_or_create_session(options: SparkOptions | None = None, *, submitted: bool = False) -> Any:
    """The active session, or a new one: local with ``options``, or as ``spark-submit`` set it
    up when ``submitted`` (master and conf then come from the submit command)."""
    from pyspark.sql import SparkSession

    # py4j logs every connection it closes at INFO, even at interpreter exit.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    active = SparkSession.getActiveSession()
    if active is not None:
        for key, value in REQUIRED_CONF.items():
            active.conf.set(key, value)
        return active
    if submitted:
        builder = SparkSession.builder.appName("airflow-provider-cdc")
        for key, value in REQUIRED_CONF.items():
            builder = builder.config(key, value)
        return builder.getOrCreate()
    options = options or SparkOptions()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Python workers must run this interpreter (with this package and pyarrow installed), not
    # whatever python3 is first on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    log_config = resources.files("airflow_provider_cdc.cdc.resources").joinpath("log4j2.properties")
    builder = SparkSession.builder.master(options.master).appName("airflow-provider-cdc")
    conf = {
        **DEFAULT_CONF,
        "spark.driver.extraJavaOptions": f"-Dlog4j.configurationFile=file:{log_config}",
        **options.conf,
        **REQUIRED_CONF,
    }
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
