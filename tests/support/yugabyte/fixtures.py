"""Starting a YugabyteDB stand-in per test, and its Airflow connection (shared by the conftests)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator

from .standin import YugabyteStandIn


def standin_for(request, cluster, **options) -> Iterator[YugabyteStandIn]:
    """A fresh stand-in database named after the test, stopped (and dropped) after it."""
    readable = re.sub(r"[^a-z0-9_]", "_", request.node.originalname.lower())[:30]
    digest = hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:6]
    standin = YugabyteStandIn(cluster, f"yb_{readable}_{digest}", **options).start()
    try:
        yield standin
    finally:
        standin.stop()


def airflow_connection(standin: YugabyteStandIn) -> str:
    """The stand-in as an Airflow ``postgres`` connection (JSON for ``AIRFLOW_CONN_<ID>``)."""
    return json.dumps(
        {
            "conn_type": "postgres",
            "host": standin.host,
            "port": standin.port,
            "schema": standin.database,
            "login": standin.cluster.superuser,
            "password": standin.cluster.password,
            "extra": {"sslmode": "disable"},
        }
    )
