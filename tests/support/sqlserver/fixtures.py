"""Starting a stand-in per test, and its Airflow connection (shared by the test folders' conftests)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator

from .standin import DRIVER_OPTIONS, ODBC_DRIVER, SqlServerStandIn
from .statements import StatementRecorder


def standin_for(request, cluster, recorder: StatementRecorder) -> Iterator[SqlServerStandIn]:
    """A fresh stand-in database named after the test, stopped (and dropped) after it."""
    readable = re.sub(r"[^a-z0-9_]", "_", request.node.originalname.lower())[:30]
    digest = hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:6]
    standin = SqlServerStandIn(cluster, f"ss_{readable}_{digest}", recorder=recorder, poll_interval=0.05).start()
    try:
        yield standin
    finally:
        standin.stop()


def airflow_connection(standin: SqlServerStandIn) -> str:
    """The stand-in as an Airflow ``mssql`` connection (JSON for ``AIRFLOW_CONN_<ID>``): the driver
    and psqlODBC's settings go in the extras, which the hook passes to ODBC verbatim."""
    assert standin.proxy is not None, "start() first"
    extra = {"driver": ODBC_DRIVER, **dict(option.split("=", 1) for option in DRIVER_OPTIONS.split(";"))}
    return json.dumps(
        {
            "conn_type": "mssql",
            "host": "127.0.0.1",
            "port": standin.proxy.port,
            "schema": standin.database,
            "login": standin.cluster.superuser,
            "password": standin.cluster.password,
            "extra": extra,
        }
    )
