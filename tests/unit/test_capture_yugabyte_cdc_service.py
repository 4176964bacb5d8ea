"""YugabyteCdcServiceCapture at DAG parse, its pure decisions, its hook's connection reading, and the
setup's schedule-against-retention check (no server: the stand-in tests are in
tests/integration/yugabyte_cdc/)."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import pendulum
import pytest

from airflow_provider_cdc.captures.yugabyte_cdc_service import YugabyteCdcServiceCapture, stream_unavailable
from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.basics.tables import TableRef
from airflow_provider_cdc.cdc.planning.offset import OffsetIdentity
from airflow_provider_cdc.cdc.sources.yugabyte.lsn import YbLsn
from airflow_provider_cdc.cdc.sources.yugabyte_cdc import admin, ids
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.checkpoints import (
    Checkpoint,
    TabletCheckpoints,
    TabletPosition,
    TabletState,
)
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.offset import YbCdcOffset
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol.client import TlsOptions

ROOT = Path(__file__).resolve().parents[2]
STREAM = "0123456789abcdef0123456789abcdef"
HOUR = 3_600_000


def capture(**overrides) -> YugabyteCdcServiceCapture:
    fields = {
        "yugabytedb_conn_id": "yb",
        "stream_id": STREAM,
        "tables": ["public.orders"],
        "topic_prefix": "shop",
        "sink_path": "/tmp/sink",
        **overrides,
    }
    return YugabyteCdcServiceCapture(**fields)


def test_defaults_and_description():
    c = capture()
    assert c.conn_id == "yb" and c.new_table_snapshot == "fail" and c.retention_ms() == 8 * HOUR
    described = c.describe()
    assert described["stream_id"] == STREAM and "slot" not in described and "publication" not in described
    assert c.OFFSET_TYPE is YbCdcOffset
    assert c.identity("ns", "db") == OffsetIdentity("shop", "ns", "db", None)
    assert c.incremental_unavailable()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"yugabytedb_conn_id": ""}, "yugabytedb_conn_id is required"),
        ({"postgres_conn_id": "other"}, "not both"),
        ({"stream_id": ""}, "stream_id must be a DB stream id"),
        ({"stream_id": STREAM.upper()}, "stream_id must be a DB stream id"),
        ({"stream_id": STREAM[:-1]}, "stream_id must be a DB stream id"),
        ({"master_addresses": "h1:7100,h2"}, "not a host:port master address: 'h2'"),
        ({"slot_name": "s"}, "slot_name is for logical replication"),
        ({"publication_name": "p"}, "publication_name is for logical replication"),
        ({"message_prefix_include_list": ["x"]}, "never streams logical messages"),
        ({"signal_table": "public.signals"}, "incremental snapshots are not available"),
        ({"new_table_snapshot": "incremental"}, "incremental snapshots are not available"),
        ({"intent_retention_ms": 1000}, "at least 60000"),
        ({"intent_retention_ms": True}, "milliseconds"),
        ({"lock_table": "a.b.c"}, "lock_table"),
    ],
)
def test_bad_configuration_is_refused_at_parse(overrides, message):
    with pytest.raises(CdcConfigurationError, match=message):
        capture(**overrides)


def test_the_capture_parses_without_protobuf_or_spark():
    code = """
import json, sys
from airflow_provider_cdc.capture import YugabyteCdcServiceCapture
YugabyteCdcServiceCapture(yugabytedb_conn_id="yb", stream_id="0" * 32, tables=["public.t"], topic_prefix="p",
                          sink_path="/tmp/x")
print(json.dumps(sorted(m for m in sys.modules if m.startswith(("google.protobuf", "pyspark")))))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


def offset(stream: str | None, last_read_ms: int | None) -> YbCdcOffset:
    base = YbCdcOffset(identity=OffsetIdentity("shop", "ns", "db", None), lsn=YbLsn(100))
    if stream is None:
        return base
    tablets = TabletCheckpoints({"t1": TabletState(TabletPosition(Checkpoint(1, 5), 99))})
    with_tablets = base.with_tablets(tablets, stream)
    if last_read_ms is None:
        return with_tablets
    state = {**with_tablets.extra["source_state"], "last_read_ms": last_read_ms}
    return YbCdcOffset(**{**with_tablets.__dict__, "extra": {"source_state": state}})


def test_stream_unavailable_names_a_replaced_or_expired_stream():
    now = 10 * HOUR
    assert stream_unavailable(None, STREAM, 8 * HOUR, now) is None
    assert stream_unavailable(offset(None, None), STREAM, 8 * HOUR, now) is None
    assert stream_unavailable(offset(STREAM, now - 7 * HOUR), STREAM, 8 * HOUR, now) is None
    reason, why = stream_unavailable(offset(STREAM, now - 9 * HOUR), STREAM, 8 * HOUR, now)
    assert reason == "stream_expired" and "9.0 h ago" in why
    reason, why = stream_unavailable(offset("f" * 32, now), STREAM, 8 * HOUR, now)
    assert reason == "stream_replaced" and "f" * 32 in why


def test_stream_problems_name_each_unusable_stream():
    orders, items = TableRef("public", "orders"), TableRef("public", "items")
    database = admin.DatabaseIds("shop", ids.namespace_id(16384), {orders: ids.table_id(16384, 20000)})
    assert "know no CDC stream" in admin.stream_problems(None, database, STREAM)[0]
    foreign = admin.StreamStatus(STREAM, ids.namespace_id(5), (), {"checkpoint_type": "EXPLICIT"})
    assert "belongs to another database" in admin.stream_problems(foreign, database, STREAM)[0]
    implicit = admin.StreamStatus(STREAM, database.namespace_id, (database.tables[orders],), {})
    assert "IMPLICIT" in admin.stream_problems(implicit, database, STREAM)[0]
    good = admin.StreamStatus(
        STREAM, database.namespace_id, (database.tables[orders],), {"checkpoint_type": "EXPLICIT"}
    )
    assert admin.stream_problems(good, database, STREAM) == []
    more = admin.DatabaseIds("shop", database.namespace_id, {**database.tables, items: ids.table_id(16384, 20001)})
    (problem,) = admin.stream_problems(good, more, STREAM)
    assert '"public"."items"' in problem and "not in CDC stream" in problem


def test_ids_embed_the_oids_as_yugabytedb_lays_them_out():
    # entity_ids.cc: database oid in bytes 0-3, version 3 in byte 6, variant in byte 8, table oid in 12-15
    assert ids.namespace_id(16384) == "00004000000030008000000000000000"
    assert ids.table_id(16384, 16385) == "00004000000030008000000000004001"


@pytest.mark.parametrize(
    ("schedule", "refused"),
    [("@hourly", False), (dt.timedelta(hours=7), False), ("@daily", True), ("0 9 * * 1-5", True), (None, False)],
)
def test_setup_refuses_a_schedule_longer_than_the_retention(schedule, refused):
    from airflow.sdk import DAG

    from airflow_provider_cdc.operators.setup import check_schedule_within_retention

    dag = DAG("d", schedule=schedule, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"))
    if refused:
        with pytest.raises(CdcConfigurationError, match=r"expires changes not read for 8\.00 h"):
            check_schedule_within_retention(capture(), dag)
    else:
        check_schedule_within_retention(capture(), dag)
    check_schedule_within_retention(capture(intent_retention_ms=100 * HOUR), dag)  # a long retention: fine


def test_hook_reads_masters_and_tls_from_the_connection(monkeypatch):
    from airflow_provider_cdc.hooks.yugabyte_cdc import YugabyteCdcServiceHook

    base = {"conn_type": "yugabytedb_cdc", "host": "yb1", "port": 5433, "schema": "shop", "login": "u"}
    monkeypatch.setenv("AIRFLOW_CONN_YB_PLAIN", json.dumps(base))
    extra = {"master_addresses": "m1:7100,m2:7100", "rpc_ssl_root_cert": "/ca.crt", "rpc_ssl_check_hostname": "false"}
    monkeypatch.setenv("AIRFLOW_CONN_YB_TLS", json.dumps({**base, "extra": extra}))
    plain = YugabyteCdcServiceHook("yb_plain")  # no RPC extras: TLS, verified against the system store
    assert plain.master_addresses == "yb1:7100" and plain.rpc_tls == TlsOptions()
    assert YugabyteCdcServiceHook("yb_plain", master_addresses="x:1").master_addresses == "x:1"
    tls = YugabyteCdcServiceHook("yb_tls")
    assert tls.master_addresses == "m1:7100,m2:7100"
    assert tls.rpc_tls.ca_file == "/ca.crt" and tls.rpc_tls.check_hostname is False and tls.rpc_tls.cert_file is None
    client = tls.cdc_client(STREAM)
    assert client.masters == (("m1", 7100), ("m2", 7100)) and "ca.crt" not in repr(client)
    client.close()


def test_the_hook_chooses_tls_unless_the_connection_says_plaintext(monkeypatch, caplog, capsys):
    from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import methods
    from airflow_provider_cdc.hooks.yugabyte_cdc import YugabyteCdcServiceHook

    base = {"conn_type": "yugabytedb_cdc", "host": "yb1", "port": 5433, "schema": "shop", "login": "u"}

    def hook(name: str, **extra) -> YugabyteCdcServiceHook:
        monkeypatch.setenv(f"AIRFLOW_CONN_{name.upper()}", json.dumps({**base, "extra": extra}))
        return YugabyteCdcServiceHook(name)

    default = hook("yb_default")
    assert default.rpc_tls == TlsOptions(check_hostname=True, verify=True)
    assert default.rpc_get_changes_max_bytes == methods.GET_CHANGES_MAX_BYTES
    assert hook("yb_ca", rpc_sslmode="verify-ca", rpc_ssl_root_cert="/ca.crt").rpc_tls == TlsOptions(
        ca_file="/ca.crt", check_hostname=False
    )
    full = hook("yb_full", rpc_sslmode="VERIFY-FULL", rpc_ssl_cert="/c.crt", rpc_ssl_key="/c.key").rpc_tls
    assert full == TlsOptions(cert_file="/c.crt", key_file="/c.key", check_hostname=True)

    caplog.set_level("WARNING")
    plain = hook("yb_plaintext", rpc_sslmode="disable")
    assert plain.rpc_tls is None
    # The task log (Airflow's structlog writes it to stdout here; the stdlib route to caplog otherwise).
    logged = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] + capsys.readouterr().out.splitlines()
    assert any("rpc_sslmode=disable" in w and "NOT encrypted" in w and "yb1:7100" in w for w in logged), logged
    client = plain.cdc_client(STREAM)
    assert "tls=False" in repr(client)
    client.close()

    for extra, message in (
        ({"rpc_sslmode": "prefer"}, "not one of verify-full, verify-ca, disable"),
        ({"rpc_sslmode": "require"}, "not one of"),
        ({"rpc_sslmode": "disable", "rpc_ssl_root_cert": "/ca.crt"}, "rpc_ssl_root_cert is set"),
    ):
        with pytest.raises(CdcConfigurationError, match=message):
            _ = hook("yb_bad", **extra).rpc_tls

    assert hook("yb_cap", rpc_get_changes_max_bytes="134217728").rpc_get_changes_max_bytes == 128 * methods.MIB
    for bad in ("1000", str(300 * methods.MIB), "lots"):
        with pytest.raises(CdcConfigurationError, match="rpc_get_changes_max_bytes"):
            _ = hook("yb_badcap", rpc_get_changes_max_bytes=bad).rpc_get_changes_max_bytes
