"""A ``spark-submit`` application for the kill tests: the real capture job, which stalls once it
holds the replication session (at the ``window.streaming`` point) after writing its pid to the
file named by ``CDC_TEST_STALL_PIDFILE``, until it is killed (or ``CDC_TEST_STALL_SECONDS`` pass)."""

from __future__ import annotations

import os
import runpy
import time
from pathlib import Path

from airflow_provider_cdc import spark_runner
from airflow_provider_cdc.cdc.basics import faults

_point = faults.point


def _stall(name: str) -> None:
    if name == "window.streaming":
        target = Path(os.environ["CDC_TEST_STALL_PIDFILE"])
        target.with_suffix(".tmp").write_text(str(os.getpid()))
        target.with_suffix(".tmp").rename(target)
        time.sleep(float(os.environ.get("CDC_TEST_STALL_SECONDS", "600")))
    _point(name)


faults.point = _stall
runpy.run_path(spark_runner.DEFAULT_APPLICATION, run_name="__main__")
