"""TLS of PostgreSQL connections against real servers: verified by default, weaker only when asked.

A PostgreSQL 15 cluster serves TLS with a certificate signed by a CA this module makes; its
pg_hba.conf rejects TCP clients without TLS (``hostnossl ... reject``) and it logs every
connection, so the server side shows what the capture did. The suite's plain cluster (no TLS)
shows the fallback. Connections go through the product's hook, built from Airflow connections.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import replace
from types import SimpleNamespace

import pytest

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.sources.postgres import tls
from airflow_provider_cdc.cdc.sources.postgres.connection import PgConnectionInfo, connect
from airflow_provider_cdc.cdc.sources.postgres.replication import ReplicationConnection
from airflow_provider_cdc.hooks.postgres_cdc import PostgresCdcHook
from airflow_provider_cdc.testing.postgres_cluster import (
    PostgresCluster,
    available_flavours,
    scratch_dir,
    wait_for,
)
from tests.support.databases import CaptureDatabase, snapshot_window
from tests.support.tls import Certificates, make_certificates

LOGGER = "airflow_provider_cdc"
APPLICATION = "application_name=airflow-provider-cdc"


@pytest.fixture(scope="module")
def certificates() -> Certificates:
    directory = scratch_dir("cdc-test-tls-certs-")
    yield make_certificates(directory)
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def tls_cluster(certificates) -> PostgresCluster:
    """PostgreSQL 15 with ``ssl = on``; TCP clients must use TLS; every connection logged."""
    cluster = PostgresCluster(
        available_flavours()["pg15"],
        scratch_dir("cdc-test-tls-"),
        ssl_cert=certificates.cert_file,
        ssl_key=certificates.key_file,
        ssl_only=True,
    )
    cluster.start({"log_connections": "on"})
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(cluster.base_dir, ignore_errors=True)


@pytest.fixture(autouse=True)
def clean_tls_state(tmp_path, monkeypatch):
    """No sslmode or root certificate from the environment, a home without ~/.postgresql, and
    nothing settled by earlier tests in this process."""
    for name in ("PGSSLMODE", "PGSSLROOTCERT"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    tls.forget()
    yield
    tls.forget()


class ServerLog:
    """What the server logged from now on."""

    def __init__(self, cluster: PostgresCluster):
        self.cluster = cluster
        self.start = cluster.log_file.stat().st_size

    def lines(self) -> list[str]:
        with open(self.cluster.log_file, encoding="utf-8", errors="replace") as fh:
            fh.seek(self.start)
            return fh.read().splitlines()

    def capture_sessions(self) -> list[str]:
        """The product's authorized sessions (it names itself in application_name)."""
        return [line for line in self.lines() if "connection authorized" in line and APPLICATION in line]


def airflow_connection(monkeypatch, conn_id: str, cluster: PostgresCluster, dbname: str, **extra) -> PostgresCdcHook:
    """An Airflow ``postgres`` connection to ``cluster`` with ``extra``, and the hook on it."""
    body = {
        "conn_type": "postgres",
        "host": cluster.host,
        "port": cluster.port,
        "schema": dbname,
        "login": cluster.superuser,
        "password": cluster.password,
        "extra": extra,
    }
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(body))
    return PostgresCdcHook(conn_id)


def server_side_ssl(conn) -> bool:
    """What the server says about this session: ``pg_stat_ssl.ssl``."""
    return conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone()[0]


def used_sslmode(conn) -> str:
    return next(o.val.decode() for o in conn.pgconn.info if o.keyword == b"sslmode")


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith(LOGGER) and r.levelno >= logging.WARNING]


# -- 1. no sslmode, a trusted CA: verified TLS, nothing to warn about ---------------------------


def test_no_sslmode_with_the_ca_in_sslrootcert_connects_verified(tls_cluster, certificates, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    log = ServerLog(tls_cluster)
    hook = airflow_connection(monkeypatch, "tls_ca", tls_cluster, "postgres", sslrootcert=str(certificates.ca_file))

    with hook.get_conn() as conn:
        assert server_side_ssl(conn) is True
        assert conn.pgconn.ssl_in_use
        assert used_sslmode(conn) == "verify-full"

    assert warnings_of(caplog) == []
    assert hook.resolved_connection_info().resolved_sslmode == "verify-full"
    sessions = log.capture_sessions()
    assert sessions and all("SSL enabled" in line for line in sessions), sessions


@pytest.mark.parametrize("trust", ["SSL_CERT_FILE", "~/.postgresql/root.crt", "PGSSLROOTCERT"])
def test_no_sslmode_trusts_the_system_roots_and_libpqs_default_file(
    trust, tls_cluster, certificates, tmp_path, monkeypatch, caplog
):
    """Without sslrootcert the roots are libpq's default file, else the system's trusted roots
    (here: OpenSSL's ``SSL_CERT_FILE`` naming the test's CA)."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    if trust == "SSL_CERT_FILE":
        monkeypatch.setenv("SSL_CERT_FILE", str(certificates.ca_file))
    elif trust == "PGSSLROOTCERT":
        monkeypatch.setenv("PGSSLROOTCERT", str(certificates.ca_file))
    else:
        (tmp_path / "home" / ".postgresql").mkdir()
        shutil.copyfile(certificates.ca_file, tmp_path / "home" / ".postgresql" / "root.crt")
    hook = airflow_connection(monkeypatch, "tls_system", tls_cluster, "postgres")

    with hook.get_conn() as conn:
        assert server_side_ssl(conn) is True
        assert used_sslmode(conn) == "verify-full"
    assert warnings_of(caplog) == []


# -- 2. no sslmode, a certificate the client cannot verify: an error, never clear text -----------


def test_no_sslmode_and_an_untrusted_certificate_is_an_error_without_plaintext_fallback(
    tls_cluster, monkeypatch, caplog
):
    log = ServerLog(tls_cluster)
    hook = airflow_connection(monkeypatch, "tls_untrusted", tls_cluster, "postgres")

    with pytest.raises(CdcConfigurationError) as raised:
        hook.get_conn()

    message = str(raised.value)
    assert "'tls_untrusted'" in message and "certificate could not be verified" in message
    assert "certificate verify failed" in message and "sslrootcert" in message and "'require'" in message
    assert tls_cluster.password not in message
    # The server saw a TLS handshake fail, and neither a session nor a plain-TCP attempt.
    assert wait_for(lambda: any("could not accept SSL connection" in line for line in log.lines()), 10), log.lines()
    assert not any("no encryption" in line for line in log.lines()), log.lines()
    assert log.capture_sessions() == []


def test_a_certificate_for_another_host_name_is_an_error(tls_cluster, certificates, monkeypatch):
    """The CA is trusted, but the certificate names 127.0.0.1, not localhost: verify-full checks names."""
    log = ServerLog(tls_cluster)
    info = PgConnectionInfo(
        "localhost",
        tls_cluster.port,
        "postgres",
        tls_cluster.superuser,
        password=tls_cluster.password,
        options=(("sslrootcert", str(certificates.ca_file)),),
    )
    with pytest.raises(CdcConfigurationError, match="does not match host name"):
        connect(info)
    assert log.capture_sessions() == []
    assert not any("no encryption" in line for line in log.lines())


def test_the_replication_connection_verifies_too(tls_cluster, certificates, monkeypatch):
    """Snapshots and windows stream through a replication connection: the same rules."""
    info = PgConnectionInfo("127.0.0.1", tls_cluster.port, "postgres", "postgres", password=tls_cluster.password)
    with pytest.raises(CdcConfigurationError, match="certificate verify failed"):
        ReplicationConnection(info)
    trusted = replace(info, options=(("sslrootcert", str(certificates.ca_file)),))
    with ReplicationConnection(trusted) as replication:
        assert replication.identify_system()[0]
    with tls_cluster.connect() as admin:
        assert admin.execute(
            "SELECT count(*) FROM pg_stat_ssl JOIN pg_stat_activity USING (pid) "
            "WHERE backend_type = 'walsender' AND NOT ssl"
        ).fetchone() == (0,)


# -- 3. no sslmode, a server without TLS: works, unencrypted, and the task log says so -----------


def test_no_sslmode_against_a_server_without_tls_falls_back_with_a_warning(db15, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    hook = airflow_connection(monkeypatch, "plain_default", db15.cluster, db15.name)

    with hook.get_conn() as conn:
        assert server_side_ssl(conn) is False
    with hook.session() as conn:  # the task's later connections: no second probe, no second warning
        assert used_sslmode(conn) == "disable"

    (warning,) = warnings_of(caplog)
    assert "is unencrypted" in warning and "does not offer TLS" in warning
    assert "'verify-full'" in warning and "'disable'" in warning  # how to choose, and so silence it
    assert db15.cluster.password not in warning
    assert hook.resolved_connection_info().resolved_sslmode == "disable"


def test_tls_files_without_sslmode_never_fall_back(db15, certificates, monkeypatch):
    """An extra naming sslrootcert meant TLS: a server without it is an error, not clear text."""
    hook = airflow_connection(monkeypatch, "plain_ca", db15.cluster, db15.name, sslrootcert=str(certificates.ca_file))
    with pytest.raises(CdcConfigurationError, match=r"does not offer TLS.*sslrootcert"):
        hook.get_conn()


def test_explicit_disable_on_this_host_is_stated_at_info(db15, monkeypatch, caplog):
    """The suite's and the demo's connections: sslmode=disable to a loopback server (a local
    proxy or tunnel, in production) is a choice, logged once at INFO."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    hook = airflow_connection(monkeypatch, "plain_disable", db15.cluster, db15.name, sslmode="disable")
    for _ in range(2):
        with hook.get_conn() as conn:
            assert server_side_ssl(conn) is False
    assert warnings_of(caplog) == []
    (info,) = [r.getMessage() for r in caplog.records if r.name.startswith(LOGGER) and "unencrypted" in r.getMessage()]
    assert "sslmode=disable" in info and "in the connection's extra" in info


# -- 4. an explicit weaker sslmode is honoured, with a warning naming what is not checked ---------


def test_explicit_require_with_an_unverifiable_certificate_works_and_says_what_is_unchecked(
    tls_cluster, monkeypatch, caplog
):
    caplog.set_level(logging.INFO, logger=LOGGER)
    hook = airflow_connection(monkeypatch, "tls_require", tls_cluster, "postgres", sslmode="require")

    with hook.get_conn() as conn:
        assert server_side_ssl(conn) is True
        assert used_sslmode(conn) == "require"
    # The server is on this host: stated once, at INFO.
    (stated,) = [r for r in caplog.records if r.name.startswith(LOGGER) and "sslmode=require" in r.getMessage()]
    assert stated.levelno == logging.INFO and "certificate is not verified" in stated.getMessage()
    assert hook.resolved_connection_info().resolved_sslmode == "require"

    # A server across the network (the test has only loopback: its address is taken as remote).
    caplog.clear()
    tls.forget()
    monkeypatch.setattr(tls, "is_local", lambda host: False)
    for _ in range(2):
        with hook.get_conn() as conn:
            assert server_side_ssl(conn) is True
    (warning,) = warnings_of(caplog)
    assert "sslmode=require" in warning and "certificate is not verified" in warning
    assert "man in the middle" in warning


def test_sslmode_from_pgsslmode_is_explicit(tls_cluster, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    monkeypatch.setenv("PGSSLMODE", "require")
    hook = airflow_connection(monkeypatch, "tls_env", tls_cluster, "postgres")
    with hook.get_conn() as conn:
        assert used_sslmode(conn) == "require" and server_side_ssl(conn) is True
    assert any("set by PGSSLMODE" in r.getMessage() for r in caplog.records)


def test_an_unknown_sslmode_is_a_configuration_error(tls_cluster, monkeypatch):
    with pytest.raises(CdcConfigurationError, match="unknown sslmode 'verify_full'"):
        airflow_connection(monkeypatch, "tls_typo", tls_cluster, "postgres", sslmode="verify_full").get_conn()


# -- 5. Spark jobs get the settled sslmode in their spec, never the password ---------------------


def test_the_job_spec_carries_the_settled_sslmode_and_a_snapshot_runs_over_verified_tls(
    tls_cluster, certificates, spark, tmp_path, monkeypatch, caplog
):
    from airflow_provider_cdc.capture import PostgresCapture
    from airflow_provider_cdc.captures.postgres import spec_fields
    from airflow_provider_cdc.cdc.basics.tables import TableRef
    from airflow_provider_cdc.cdc.sinks.reader import read_topic_arrow
    from airflow_provider_cdc.cdc.sources.postgres.jobs import run_job
    from airflow_provider_cdc.cdc.sources.postgres.spec import PostgresJobSpec
    from airflow_provider_cdc.offsets.variable import VariableOffsetStore

    caplog.set_level(logging.INFO, logger=LOGGER)
    db = CaptureDatabase.create(tls_cluster, "tls_shop")
    db.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
    db.execute("INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, 500) g")
    hook = airflow_connection(monkeypatch, "tls_shop", tls_cluster, db.name, sslrootcert=str(certificates.ca_file))
    capture = PostgresCapture(
        postgres_conn_id="tls_shop",
        tables=["public.items"],
        topic_prefix="tls",
        sink_path=str(tmp_path / "lake"),
        offset_store=VariableOffsetStore(key_prefix="unused__"),
    )
    log = ServerLog(tls_cluster)
    with hook.capture_lock("tls"):  # a run connects first: the spec reuses what it settled
        run = SimpleNamespace(capture=capture, hook=hook, tables=(TableRef.parse("public.items"),))
        spec = PostgresJobSpec(**spec_fields(run, snapshot_window(1), None, run=None, checkpoint=None, gap=None))

    document = json.loads(spec.to_json())
    assert document["connection"]["resolved_sslmode"] == "verify-full"
    assert document["connection"]["options"] == [["sslrootcert", str(certificates.ca_file)]]
    assert tls_cluster.password not in spec.to_json()
    assert PostgresJobSpec.from_json(spec.to_json()).connection.resolved_sslmode == "verify-full"
    assert len(log.capture_sessions()) == 1  # the run's session; building the spec connected no more

    entry = run_job(replace(spec, spark=replace(spec.spark, master="local[2]")))
    assert entry.window.kind == "snapshot"
    assert read_topic_arrow(str(tmp_path / "lake"), "tls", "tls.public.items").num_rows == 500
    sessions = log.capture_sessions()
    assert len(sessions) > 2, sessions  # the run's, the job's catalog and replication sessions, the partitions
    assert all("SSL enabled" in line for line in sessions), sessions
    assert not any("no encryption" in line for line in log.lines())
    assert warnings_of(caplog) == []
    db.drop()


def test_the_deferred_sensors_trigger_connects_with_the_same_rules(tls_cluster, certificates, monkeypatch):
    """The triggerer builds its own (async) connection: verified too, and an untrusted
    certificate is an error event naming the fix, not a clear-text poll."""
    import asyncio

    from airflow_provider_cdc.triggers.postgres_cdc import PostgresCdcChangesTrigger

    async def first_event(trigger):
        async for event in trigger.run():
            return event.payload

    airflow_connection(monkeypatch, "tls_trigger", tls_cluster, "postgres", sslrootcert=str(certificates.ca_file))
    log = ServerLog(tls_cluster)
    event = asyncio.run(asyncio.wait_for(first_event(PostgresCdcChangesTrigger("tls_trigger", "no_such_slot")), 30))
    assert event["status"] == "error" and "does not exist" in event["message"]  # it connected and read
    sessions = log.capture_sessions()
    assert len(sessions) == 2 and all("SSL enabled" in line for line in sessions), sessions  # settle, then poll

    tls.forget()
    airflow_connection(monkeypatch, "tls_trigger_untrusted", tls_cluster, "postgres")
    trigger = PostgresCdcChangesTrigger("tls_trigger_untrusted", "no_such_slot")
    event = asyncio.run(asyncio.wait_for(first_event(trigger), 30))
    assert event["status"] == "error" and "certificate could not be verified" in event["message"], event


# -- 6. a man in the middle cannot downgrade the default to clear text ---------------------------


class DowngradingRelay:
    """An active attacker between the worker and PostgreSQL: answers the client's SSLRequest with
    'N' (no TLS), then relays the rest to the real server in clear text, keeping what it sees."""

    def __init__(self, upstream_host: str, upstream_port: int):
        import socket
        import threading

        self.upstream = (upstream_host, upstream_port)
        self.seen = bytearray()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        import socket
        import struct
        import threading

        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                first = client.recv(8)
                if len(first) == 8 and struct.unpack("!ii", first)[1] == 80877103:  # SSLRequest
                    client.sendall(b"N")
                    first = b""
                server = socket.create_connection(self.upstream)
                server.sendall(first)
                self.seen.extend(first)
            except OSError:
                client.close()
                continue
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, source, target, record: bool) -> None:
        try:
            while data := source.recv(65536):
                if record:
                    self.seen.extend(data)
                target.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, target):
                try:
                    sock.close()
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.close()


def test_a_relay_answering_no_tls_for_a_remote_server_is_refused_not_followed_into_clear_text(
    db15, monkeypatch, caplog
):
    """The review's relay: a connection without sslmode (the documented default) to a server across
    the network (the relay listens on loopback: the test treats its address as remote). The relay
    says the server has no TLS; the capture refuses instead of sending its login and queries in
    clear text, and the error says how to allow clear text knowingly."""
    relay = DowngradingRelay(db15.cluster.host, db15.cluster.port)
    monkeypatch.setattr(tls, "is_local", lambda host: False)
    cluster = SimpleNamespace(host="127.0.0.1", port=relay.port, superuser=db15.cluster.superuser,
                              password=db15.cluster.password)  # fmt: skip
    hook = airflow_connection(monkeypatch, "mitm", cluster, db15.name)
    try:
        with pytest.raises(CdcConfigurationError) as raised:
            with hook.get_conn() as conn:
                conn.execute("SELECT 'secret row value 42'").fetchone()
    finally:
        relay.close()
    message = str(raised.value)
    assert f"the server at 127.0.0.1:{relay.port} offers no TLS" in message, message
    assert "set sslmode=disable (or prefer) in the connection's extra explicitly" in message, message
    assert "'mitm'" in message and db15.cluster.password not in message
    # Nothing but the SSLRequest reached the relay: no startup message, no login, no query.
    assert b"secret row value 42" not in relay.seen
    assert db15.cluster.superuser.encode() not in relay.seen and db15.cluster.password.encode() not in relay.seen
    assert warnings_of(caplog) == []


def test_a_remote_server_without_tls_is_reached_when_the_extra_says_so(db15, monkeypatch, caplog):
    """The deployment that trusts its network says so: sslmode=disable is honoured (and logged)."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    monkeypatch.setattr(tls, "is_local", lambda host: False)
    hook = airflow_connection(monkeypatch, "remote_plain", db15.cluster, db15.name, sslmode="disable")
    with hook.get_conn() as conn:
        assert server_side_ssl(conn) is False
    (warning,) = warnings_of(caplog)
    assert "sslmode=disable" in warning and "in the connection's extra" in warning


# -- 7. the connection's editor chooses where to connect, not what the worker loads ---------------

ENGINE_SOURCE = r"""
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void loaded(void) {
    FILE *f = fopen(getenv("CDC_TEST_ENGINE_MARKER"), "w");
    if (f) { fprintf(f, "loaded in pid %d\n", getpid()); fclose(f); }
}
"""


@pytest.fixture(scope="module")
def engine_library(tmp_path_factory):
    """A shared library whose constructor leaves a file behind: what a connection's editor would
    hand OpenSSL as an 'engine' through libpq's ``sslkey=engine:key`` syntax."""
    import subprocess

    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the engine library")
    directory = tmp_path_factory.mktemp("engine")
    source = directory / "evil.c"
    source.write_text("#include <stdlib.h>\n" + ENGINE_SOURCE)
    library = directory / "evil.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return library


ATTEMPT = """
import json, os, sys
from types import SimpleNamespace
from airflow_provider_cdc.hooks.postgres_cdc import connection_info_from
from airflow_provider_cdc.cdc.sources.postgres.connection import connect
fields = json.loads(sys.argv[1])
try:
    connect(connection_info_from(SimpleNamespace(**fields))).close()
    print("connected")
except Exception as exc:
    print(type(exc).__name__, str(exc).splitlines()[0])
"""


@pytest.mark.parametrize(
    "field, value",
    [
        ("sslkey", "{library}:anything"),  # the review's extra
        ("sslkey", "{library}:"),
        # The same parameter smuggled into other fields: libpq takes each as one value, never as
        # more connection parameters (psycopg quotes it; a connection string's dbname is not expanded).
        ("schema", "postgres sslkey={library}:x"),
        ("login", "postgres sslkey={library}:x"),
        ("host", "127.0.0.1 sslkey={library}:x"),
    ],
)
def test_an_sslkey_naming_an_openssl_engine_loads_nothing_into_the_worker(
    field, value, tls_cluster, certificates, engine_library, tmp_path
):
    """The review's finding: extras ``{"sslmode": "require", "sslcert": <any PEM>, "sslkey":
    "/path/evil.so:x"}``, all allowlisted, made libpq ask OpenSSL for the engine
    ``/path/evil.so``, which OpenSSL's dynamic engine loads: the library's constructor ran in the
    worker. The connection is refused before libpq sees it, and nothing is loaded."""
    import subprocess
    import sys

    marker = tmp_path / "LOADED"
    extra = {"sslmode": "require", "sslcert": str(certificates.cert_file), "sslkey": str(certificates.key_file)}
    fields = {"conn_type": "postgres", "host": tls_cluster.host, "port": tls_cluster.port, "schema": "postgres",
              "login": tls_cluster.superuser, "password": tls_cluster.password, "extra_dejson": extra}  # fmt: skip
    target = extra if field == "sslkey" else fields
    target[field] = value.format(library=engine_library)
    result = subprocess.run(
        [sys.executable, "-c", ATTEMPT, json.dumps(fields)],
        env={**os.environ, "CDC_TEST_ENGINE_MARKER": str(marker)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert not marker.exists(), f"the library was loaded: {marker.read_text()} ({result.stdout}{result.stderr})"
    if field == "sslkey":
        assert result.stdout.startswith("CdcConfigurationError"), result.stdout + result.stderr
        assert "OpenSSL engine" in result.stdout and "without ':'" in result.stdout, result.stdout
    else:
        assert not result.stdout.startswith("connected"), result.stdout + result.stderr
