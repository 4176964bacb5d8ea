"""The level each line of the JVM's standard error is logged at (no JVM needed)."""

from __future__ import annotations

import logging

import pytest

from airflow_provider_cdc.cdc.basics.spark_session import jvm_line_level, log_lines

INFO, WARNING, ERROR, DEBUG = logging.INFO, logging.WARNING, logging.ERROR, logging.DEBUG


@pytest.mark.parametrize(
    ("line", "previous", "expected"),
    [
        ("WARNING: Using incubator modules: jdk.incubator.vector", INFO, DEBUG),  # the JVM's own start-up notice
        ("Picked up JAVA_TOOL_OPTIONS: -Xss4m", INFO, DEBUG),
        ("26/11/23 10:20:13 ERROR Executor: Exception in task 0.0 in stage 3.0 (TID 3)", DEBUG, ERROR),
        ("26/11/23 10:20:13 WARN NativeCodeLoader: Unable to load native-hadoop library", DEBUG, WARNING),
        ("26/11/23 10:20:13 INFO SparkContext: Running Spark version 4.2.0", ERROR, INFO),
        ('{"ts":"2026-11-23T10:20:13.000Z","level":"WARN","msg":"slow","logger":"Executor"}', INFO, WARNING),
        ("\tat org.apache.spark.executor.Executor$TaskRunner.run(Executor.scala:897)", ERROR, ERROR),
        ("Caused by: java.io.IOException: boom", ERROR, ERROR),
        ("org.apache.spark.api.python.PythonException: [PYTHON_EXCEPTION] ...", ERROR, ERROR),
        ('Exception in thread "main" java.lang.OutOfMemoryError: Java heap space', DEBUG, WARNING),
        ("ZeroDivisionError: division by zero", INFO, WARNING),
    ],
)
def test_each_line_keeps_the_level_it_carries(line, previous, expected):
    assert jvm_line_level(line, previous) == expected


def test_a_stack_trace_shares_the_level_of_its_record(caplog):
    caplog.set_level(logging.DEBUG, logger="jvm-test")
    lines = [
        "WARNING: Using incubator modules: jdk.incubator.vector\n",
        "\n",
        "26/11/23 10:20:13 ERROR Executor: Exception in task 0.0\n",
        "org.apache.spark.SparkException: boom\n",
        "\tat org.apache.spark.Foo.bar(Foo.scala:1)\n",
        "26/11/23 10:20:14 INFO Executor: Finished task 1.0\n",
    ]
    log_lines(logging.getLogger("jvm-test"), lines)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (DEBUG, "WARNING: Using incubator modules: jdk.incubator.vector"),
        (ERROR, "26/11/23 10:20:13 ERROR Executor: Exception in task 0.0"),
        (ERROR, "org.apache.spark.SparkException: boom"),
        (ERROR, "\tat org.apache.spark.Foo.bar(Foo.scala:1)"),
        (INFO, "26/11/23 10:20:14 INFO Executor: Finished task 1.0"),
    ]
