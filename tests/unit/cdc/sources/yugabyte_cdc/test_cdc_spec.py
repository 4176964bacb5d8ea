"""The CDC-service stream window's job spec: a JSON round trip with no secrets."""

from __future__ import annotations

import json

import pytest

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.basics.tables import TableRef
from airflow_provider_cdc.cdc.basics.window import Window
from airflow_provider_cdc.cdc.sources.yugabyte.lsn import YbLsn
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.checkpoints import (
    Checkpoint,
    TabletCheckpoints,
    TabletPosition,
    TabletState,
)
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol.client import TlsOptions
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.spec import YbCdcJobSpec


def spec(**kw) -> YbCdcJobSpec:
    tablets = TabletCheckpoints({"t1": TabletState(TabletPosition(Checkpoint(1, 4, b"k", 2), 77), table_ids=("tb",))})
    base = {
        "topic_prefix": "yb",
        "master_addresses": "127.0.0.1:7100,127.0.0.2:7100",
        "stream_id": "d540f5e4890c4d3b812933cbfd703ed3",
        "database": "shop",
        "tables": (TableRef("public", "orders"),),
        "window": Window(3, "stream", YbLsn(100), YbLsn(200), 1_700_000_000_000),
        "sink_path": "/tmp/sink",
        "tablets": tablets,
        "previous_commit_ht": 99,
        "record_type": "CHANGE",
        "table_ids": ((TableRef("public", "orders"), "000033e5000030008000000000004000"),),
        "tls": TlsOptions(ca_file="/etc/ca.pem", check_hostname=False),
    }
    return YbCdcJobSpec(**{**base, **kw})


def test_round_trip() -> None:
    original = spec()
    text = original.to_json()
    assert YbCdcJobSpec.from_json(text) == original
    data = json.loads(text)
    assert data["connector"] == "yugabytedb_grpc"
    assert data["tablets"]["t1"]["lsn"] == "1:4:aw==:2:0"
    assert YbCdcJobSpec.from_json(spec(tls=None, record_type=None).to_json()).tls is None


def test_bad_specs_fail_early() -> None:
    with pytest.raises(CdcConfigurationError):
        spec(master_addresses="nohost")
    with pytest.raises(CdcConfigurationError):
        spec(record_type="NOPE")
    with pytest.raises(CdcConfigurationError):
        YbCdcJobSpec.from_json(json.dumps({**json.loads(spec().to_json()), "connector": "yugabytedb"}))


def test_transport_defaults_to_tls_and_carries_the_get_changes_cap() -> None:
    from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import methods

    base = {k: v for k, v in spec().__dict__.items() if k not in ("tls", "get_changes_max_bytes")}
    unset = YbCdcJobSpec(**base)
    assert unset.tls == TlsOptions() and unset.get_changes_max_bytes == methods.GET_CHANGES_MAX_BYTES
    capped = spec(get_changes_max_bytes=128 * methods.MIB)
    assert YbCdcJobSpec.from_json(capped.to_json()).get_changes_max_bytes == 128 * methods.MIB
    # A spec written without the keys (older writers): TLS and the default cap, never plaintext.
    data = {k: v for k, v in json.loads(spec().to_json()).items() if k not in ("tls", "get_changes_max_bytes")}
    read = YbCdcJobSpec.from_json(json.dumps(data))
    assert read.tls == TlsOptions() and read.get_changes_max_bytes == methods.GET_CHANGES_MAX_BYTES
