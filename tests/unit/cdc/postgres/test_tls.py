"""The connection string's TLS parameters: verified TLS unless the connection asks for less.

Connecting is tested against real servers in tests/integration/postgres/test_tls.py.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from psycopg.conninfo import conninfo_to_dict

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.sources.postgres import tls
from airflow_provider_cdc.cdc.sources.postgres.connection import PgConnectionInfo


@pytest.fixture(autouse=True)
def no_tls_environment(tmp_path, monkeypatch):
    for name in ("PGSSLMODE", "PGSSLROOTCERT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "system-roots.pem"))
    (tmp_path / "system-roots.pem").write_text("")


def params(info: PgConnectionInfo) -> dict[str, str]:
    return conninfo_to_dict(info.conninfo())


def info(*options: tuple[str, str], **fields) -> PgConnectionInfo:
    return PgConnectionInfo("db.example.com", 5432, "shop", "cdc", password="s3cret", options=options, **fields)


def test_no_sslmode_is_verify_full_against_the_system_roots(tmp_path):
    got = params(info())
    assert got["sslmode"] == "verify-full"
    assert got["sslrootcert"] == str(tmp_path / "system-roots.pem")  # OpenSSL's bundle, named as a file


def test_the_extras_sslrootcert_wins_and_libpqs_default_file_is_left_to_libpq(tmp_path, monkeypatch):
    assert params(info(("sslrootcert", "/etc/cdc/ca.pem")))["sslrootcert"] == "/etc/cdc/ca.pem"
    (tmp_path / ".postgresql").mkdir()
    (tmp_path / ".postgresql" / "root.crt").write_text("")
    assert "sslrootcert" not in params(info())
    (tmp_path / ".postgresql" / "root.crt").unlink()
    monkeypatch.setenv("PGSSLROOTCERT", "/etc/cdc/env-ca.pem")
    assert "sslrootcert" not in params(info())


def test_without_a_bundle_file_the_system_roots_are_libpqs_system(monkeypatch):
    from psycopg import pq

    monkeypatch.delenv("SSL_CERT_FILE")
    monkeypatch.setattr(tls.ssl, "get_default_verify_paths", lambda: type("Paths", (), {"cafile": None})())
    expected = "system" if pq.version() >= 160000 else None
    assert params(info()).get("sslrootcert") == expected


@pytest.mark.parametrize("mode", tls.SSLMODES)
def test_an_explicit_sslmode_is_used_as_given(mode):
    got = params(info(("sslmode", mode)))
    assert got["sslmode"] == mode
    assert ("sslrootcert" in got) == (mode == "verify-full")  # the default roots serve verify-full only


def test_pgsslmode_counts_as_explicit_and_the_extra_wins_over_it(monkeypatch):
    monkeypatch.setenv("PGSSLMODE", "require")
    assert params(info())["sslmode"] == "require"
    assert tls.explicit_sslmode(info()) == ("require", "by PGSSLMODE")
    assert params(info(("sslmode", "verify-ca")))["sslmode"] == "verify-ca"


def test_the_settled_sslmode_is_used_but_never_overrides_the_extra():
    assert params(info(resolved_sslmode="disable"))["sslmode"] == "disable"
    assert "sslrootcert" not in params(info(resolved_sslmode="disable"))
    assert params(info(("sslmode", "require"), resolved_sslmode="require"))["sslmode"] == "require"


def test_the_settled_sslmode_travels_in_the_spec_without_the_password():
    settled = info(("sslrootcert", "/etc/cdc/ca.pem"), resolved_sslmode="verify-full")
    document = json.loads(json.dumps(settled.to_dict()))
    assert document["resolved_sslmode"] == "verify-full" and "s3cret" not in json.dumps(document)
    back = PgConnectionInfo.from_dict(document)
    assert back == settled and back.password is None
    assert PgConnectionInfo.from_dict({k: v for k, v in document.items() if k != "resolved_sslmode"}) == (
        dataclasses.replace(settled, resolved_sslmode=None)
    )  # a spec written before the field existed


@pytest.mark.parametrize("bad", [{"options": (("sslmode", "verify_full"),)}, {"resolved_sslmode": "on"}])
def test_an_unknown_sslmode_is_refused_when_the_connection_is_built(bad):
    with pytest.raises(CdcConfigurationError, match="unknown sslmode"):
        PgConnectionInfo("db", 5432, "shop", "cdc", **bad)


@pytest.mark.parametrize(
    ("host", "local"),
    [
        ("localhost", True),
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("/var/run/postgresql", True),
        ("", True),
        ("127.0.0.1,localhost", True),
        ("db.example.com", False),
        ("10.0.0.5", False),
        ("localhost,db.example.com", False),
        ("localhost.example.com", False),
    ],
)
def test_which_hosts_are_this_machine(host, local):
    assert tls.is_local(host) is local


@pytest.mark.parametrize(
    "message",
    [
        'connection failed: connection to server at "10.0.0.5", port 5432 failed: SSL error: certificate verify failed',
        'connection to server at "h", port 5432 failed: server certificate for "a" does not match host name "h"',
        'connection to server at "h", port 5432 failed: root certificate file "/x/root.crt" does not exist\n'
        "Either provide the file, use the system's trusted roots with sslrootcert=system, or change sslmode",
    ],
)
def test_certificate_failures_become_configuration_errors_that_name_the_fix(message):
    error = tls.verification_error(info(), message)
    assert isinstance(error, CdcConfigurationError) and error.terminal
    text = str(error)
    assert "sslrootcert" in text and "'require'" in text and "not retried without TLS" in text
    assert "cdc@db.example.com:5432/shop" in text and "s3cret" not in text


def test_other_failures_are_not_certificate_failures():
    message = 'connection to server at "h", port 5432 failed: FATAL:  password authentication failed for user "cdc"'
    assert tls.verification_error(info(), message) is None
    assert tls.verification_error(info(), "server does not support SSL, but SSL was required") is None


class NoTlsServer:
    """What libpq reports for a server (or a man in the middle) that answers 'no TLS': verified
    TLS fails with "server does not support SSL"; a clear-text attempt connects."""

    def __init__(self):
        self.modes: list[str] = []

    def attempt(self, attempt_info: PgConnectionInfo) -> str:
        mode = params(attempt_info)["sslmode"]
        self.modes.append(mode)
        if mode != "disable":
            raise RuntimeError("connection failed: server does not support SSL, but SSL was required")
        return "connection"


@pytest.mark.parametrize("host", ["db.example.com", "10.1.2.3", "127.0.0.1,db.example.com"])
def test_no_tls_from_a_server_across_the_network_is_refused_without_a_clear_text_attempt(host):
    tls.forget()
    server = NoTlsServer()
    with pytest.raises(CdcConfigurationError) as raised:
        tls.open_connection(dataclasses.replace(info(), host=host), server.attempt, lambda conn: False)
    assert server.modes == ["verify-full"]  # never retried in clear text
    message = str(raised.value)
    assert f"the server at {host}:5432 offers no TLS" in message
    assert "set sslmode=disable (or prefer) in the connection's extra explicitly" in message
    assert "s3cret" not in message


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "::1", "/var/run/postgresql", ""])
def test_no_tls_from_a_server_on_this_host_falls_back_to_plain_tcp(host, caplog):
    tls.forget()
    server = NoTlsServer()
    local = dataclasses.replace(info(), host=host)
    assert tls.open_connection(local, server.attempt, lambda conn: False) == "connection"
    assert server.modes == ["verify-full", "disable"]
    assert any("on this host" in r.getMessage() for r in caplog.records)
    tls.forget()


def test_an_explicit_disable_reaches_a_remote_server_without_tls():
    tls.forget()
    server = NoTlsServer()
    assert tls.open_connection(info(("sslmode", "disable")), server.attempt, lambda conn: False) == "connection"
    assert server.modes == ["disable"]
    tls.forget()
