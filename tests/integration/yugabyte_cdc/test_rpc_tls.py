"""The CDC-service client's transport as the product builds it (the hook from an Airflow
connection), against the stand-in's masters and tablet servers serving TLS as YB does
(``SecureRefiner::ProcessHeader``: a TLS handshake first starts TLS; plaintext clients are let in
while ``allow_insecure_connections``, YB's default) or serving plaintext only.

Without an ``rpc_sslmode`` the client speaks TLS and verifies the servers; a cluster without TLS
is a clear configuration error, never a quiet fall back to plaintext.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator

import pytest

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import methods
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb
from airflow_provider_cdc.hooks.yugabyte_cdc import YugabyteCdcServiceHook
from tests.support.yugabyte_cdc import YugabyteCdcStandIn, airflow_connection, standin_for
from tests.support.yugabyte_cdc.certificates import CaFiles, make_ca

pytestmark = pytest.mark.pg

SMALL = {"tablets_per_table": 1, "tablet_servers": 1, "masters": 1, "rpc_heartbeat_interval": 0.3}


@pytest.fixture(scope="module")
def ca(tmp_path_factory) -> CaFiles:
    pytest.importorskip("cryptography")
    return make_ca(tmp_path_factory.mktemp("yb-rpc-ca"))


@pytest.fixture(scope="module")
def tls_yb(request, clusters, ca) -> Iterator[YugabyteCdcStandIn]:
    tls = {"cert_file": str(ca.server_cert), "key_file": str(ca.server_key), "allow_insecure_connections": True}
    yield from standin_for(request, clusters["pg15"], rpc_tls=tls, **SMALL)


@pytest.fixture
def plain_yb(request, clusters) -> Iterator[YugabyteCdcStandIn]:
    """Plaintext only, as a YB cluster without TLS."""
    yield from standin_for(request, clusters["pg15"], **SMALL)


def hook_for(monkeypatch, yb: YugabyteCdcStandIn, name: str, **extra) -> YugabyteCdcServiceHook:
    """The product's hook on a connection to the stand-in; ``rpc_sslmode`` dropped unless given
    (the test support's connection says ``disable`` for the plaintext stand-in)."""
    extra.setdefault("rpc_sslmode", None)
    monkeypatch.setenv(f"AIRFLOW_CONN_{name.upper()}", airflow_connection(yb, **extra))
    return YugabyteCdcServiceHook(name)


def stream_of_a_table(yb: YugabyteCdcStandIn, table: str) -> str:
    with yb.connect() as conn:
        conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v text)")
        conn.execute(f"INSERT INTO {table} VALUES (1, 'a'), (2, 'b')")
    return yb.create_stream("CHANGE", "EXPLICIT", tables=[table])


def read_stream(hook: YugabyteCdcServiceHook, stream: str) -> tuple[str, bool]:
    """The stream's namespace from the masters and a checkpoint from a tablet leader, through the
    hook's client; and whether every connection it opened was TLS."""
    with hook.cdc_client(stream) as client:
        namespace, table_ids = client.stream_tables()
        tablet = next(iter(client.tablets(table_ids)))
        request = pb.GetCheckpointRequestPB(stream_id=stream.encode(), tablet_id=tablet.encode())
        response = client.tablet_call(tablet, methods.GET_CHECKPOINT, request, "GetCheckpoint")
        assert not response.HasField("error")
        sockets = [connection._sock for connection in client._connections.values()]
        assert len(sockets) == 2  # the master and the tablet server
        return namespace, all(isinstance(sock, ssl.SSLSocket) for sock in sockets)


def test_the_default_is_tls_verified_and_plaintext_only_when_the_connection_says_so(tls_yb, ca, monkeypatch, capsys):
    stream = stream_of_a_table(tls_yb, "tls_default")

    # No rpc_sslmode, the cluster's root certificate given: TLS, host name checked (127.0.0.1).
    verified = hook_for(monkeypatch, tls_yb, "yb_tls_root", rpc_ssl_root_cert=str(ca.root_cert))
    assert verified.rpc_tls.check_hostname and verified.rpc_tls.verify
    assert read_stream(verified, stream) == (tls_yb.namespace_id, True)

    # No TLS settings at all: TLS verified against the system's CA store, which does not know the
    # test CA. Refused, although this server would take a plaintext client.
    unknown_ca = hook_for(monkeypatch, tls_yb, "yb_tls_system")
    with pytest.raises(CdcConfigurationError, match=r"certificate is not trusted.*system's CA store"):
        read_stream(unknown_ca, stream)

    # Plaintext, said explicitly: served (allow_insecure_connections), and the task log warns.
    plaintext = hook_for(monkeypatch, tls_yb, "yb_tls_disable", rpc_sslmode="disable")
    assert read_stream(plaintext, stream) == (tls_yb.namespace_id, False)
    assert "rpc_sslmode=disable" in capsys.readouterr().out


def test_a_cluster_without_tls_is_a_clear_error_not_a_downgrade(plain_yb, ca, monkeypatch):
    stream = stream_of_a_table(plain_yb, "plain_only")
    hook = hook_for(monkeypatch, plain_yb, "yb_plain_only", rpc_ssl_root_cert=str(ca.root_cert))
    with pytest.raises(CdcConfigurationError) as caught:
        read_stream(hook, stream)
    message = str(caught.value)
    assert "GetCDCDBStreamInfo on masters" in message and "without TLS" in message
    assert "rpc_sslmode=disable" in message
    # The test support's own connection says plaintext explicitly, and reads the stream.
    assert json.loads(airflow_connection(plain_yb))["extra"]["rpc_sslmode"] == "disable"
    monkeypatch.setenv("AIRFLOW_CONN_YB_PLAIN_EXPLICIT", airflow_connection(plain_yb))
    assert read_stream(YugabyteCdcServiceHook("yb_plain_explicit"), stream) == (plain_yb.namespace_id, False)
