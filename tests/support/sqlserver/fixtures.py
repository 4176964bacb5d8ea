"""Starting a stand-in per test, and its Airflow connection (shared by the test folders' conftests)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator

from .standin import ODBC_DRIVER, SqlServerStandIn
from .statements import StatementRecorder

#: The deployment setting a stand-in's Airflow connection needs (``monkeypatch.setenv(*...)`` next
#: to its ``AIRFLOW_CONN_<ID>``; child processes inherit it): the connection names its driver,
#: the tests' psqlODBC entry, in its extra, which the product refuses unless the deployment allows it
#: (docs/sqlserver.md). The example DAG and the tests' captures name no driver, like production DAGs.
DRIVER_IN_EXTRA_ALLOWED = ("AIRFLOW__CDC__SQLSERVER_ALLOW_DRIVER_IN_EXTRA", "True")


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
    goes in the extra (it counts with :data:`DRIVER_IN_EXTRA_ALLOWED` set), nothing else: psqlODBC's
    settings are its driver entry's defaults (tests/support/odbc.py), the product takes none from a
    connection."""
    assert standin.proxy is not None, "start() first"
    extra = {"driver": ODBC_DRIVER}
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
