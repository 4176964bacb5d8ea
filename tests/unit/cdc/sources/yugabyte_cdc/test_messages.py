"""The generated messages carry YugabyteDB's field numbers, and match the .proto they came from.

The numbers below are copied from yugabyte/yugabyte-db (rpc_header.proto, cdc_service.proto,
master_replication.proto, master_client.proto, common.proto); a wrong number would still parse,
silently, into the wrong field, so they are pinned here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import methods
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb

PROTO = Path(pb.__file__).with_name("yb_cdc.proto")

YB_FIELD_NUMBERS = {
    "RequestHeader": {"call_id": 1, "remote_method": 2, "timeout_millis": 3, "sidecar_offsets": 4},
    "ResponseHeader": {"call_id": 1, "is_error": 2, "sidecar_offsets": 3},
    "ErrorStatusPB": {"message": 1, "code": 2},
    "CDCErrorPB": {"code": 1, "status": 2},
    "CDCSDKCheckpointPB": {"term": 1, "index": 2, "key": 3, "write_id": 4, "snapshot_time": 5},
    "GetChangesRequestPB": {
        "stream_id": 1,
        "tablet_id": 2,
        "from_checkpoint": 3,
        "max_records": 4,
        "serve_as_proxy": 5,
        "db_stream_id": 6,
        "table_id": 7,
        "from_cdc_sdk_checkpoint": 8,
        "need_schema_info": 9,
        "explicit_cdc_sdk_checkpoint": 10,
        "safe_hybrid_time": 11,
        "wal_segment_index": 12,
        "cdcsdk_request_source": 14,
    },
    "GetChangesResponsePB": {
        "error": 1,
        "record_type": 2,
        "checkpoint": 5,
        "cdc_sdk_proto_records": 8,
        "cdc_sdk_checkpoint": 9,
        "safe_hybrid_time": 10,
        "wal_segment_index": 11,
    },
    "CDCSDKProtoRecordPB": {"row_message": 1, "cdc_sdk_op_id": 2, "from_op_id": 3},
    "CDCSDKOpIdPB": {"term": 1, "index": 2, "write_id": 3, "write_id_key": 4},
    "RowMessage": {
        "transaction_id": 1,
        "commit_time": 2,
        "table": 3,
        "op": 4,
        "new_tuple": 5,
        "old_tuple": 6,
        "schema": 8,
        "schema_version": 9,
        "pgschema_name": 11,
        "record_time": 14,
        "table_id": 17,
        "primary_key": 18,
    },
    "DatumMessagePB": {"column_name": 1, "column_type": 2, "datum_int64": 4, "datum_string": 8, "datum_missing": 10},
    "GetCheckpointResponsePB": {"error": 1, "checkpoint": 2, "snapshot_key": 3, "snapshot_time": 4},
    "SetCDCCheckpointRequestPB": {
        "checkpoint": 1,
        "cdc_sdk_checkpoint": 2,
        "stream_id": 3,
        "tablet_id": 4,
        "initial_checkpoint": 5,
        "bootstrap": 6,
        "cdc_sdk_safe_time": 7,
        "serve_as_proxy": 8,
    },
    "GetTabletListToPollForCDCRequestPB": {"table_info": 1, "tablet_id": 2},
    "TabletCheckpointPair": {"tablet_locations": 1, "cdc_sdk_checkpoint": 2},
    # The CDC service's and the master's GetCDCDBStreamInfo responses number differently.
    "GetCDCDBStreamInfoResponsePB": {"error": 1, "namespace_id": 2, "table_info": 3},
    "MasterGetCDCDBStreamInfoResponsePB": {"error": 1, "table_info": 2, "namespace_id": 3},
    "TabletLocationsPB": {
        "tablet_id": 1,
        "replicas": 4,
        "stale": 5,
        "partition": 6,
        "table_id": 7,
        "split_parent_tablet_id": 12,
        "split_tablet_ids": 13,
    },
    "TSInfoPB": {"permanent_uuid": 1, "private_rpc_addresses": 2, "broadcast_addresses": 5},
}


@pytest.mark.parametrize("message", sorted(YB_FIELD_NUMBERS))
def test_field_numbers_are_ybs(message):
    fields = getattr(pb, message).DESCRIPTOR.fields_by_name
    assert {name: fields[name].number for name in YB_FIELD_NUMBERS[message]} == YB_FIELD_NUMBERS[message]


def test_enum_values_are_ybs():
    assert pb.RowMessage.Op.Value("UNKNOWN") == -1
    assert [pb.RowMessage.Op.Value(n) for n in ("INSERT", "BEGIN", "COMMIT", "DDL", "SAFEPOINT")] == [0, 3, 4, 5, 8]
    assert (pb.CDCErrorPB.TABLET_SPLIT, pb.CDCErrorPB.CHECKPOINT_TOO_OLD, pb.CDCErrorPB.LEADER_NOT_READY) == (12, 5, 11)
    assert (pb.CHANGE, pb.ALL, pb.FULL_ROW_NEW_IMAGE, pb.MODIFIED_COLUMNS_OLD_AND_NEW_IMAGES) == (1, 3, 4, 5)
    assert pb.ErrorStatusPB.ERROR_SERVER_TOO_BUSY == 4 and pb.LEADER == 1


def test_defaults_that_change_meaning_are_ybs():
    request = pb.GetChangesRequestPB()
    assert request.safe_hybrid_time == -1  # "not sent" is -1, not 0
    assert request.serve_as_proxy is True
    assert pb.SetCDCCheckpointRequestPB().serve_as_proxy is True


def test_generated_module_is_in_step_with_the_proto():
    # A .proto edited without running scripts/generate_yb_protocol.sh shows up here.
    text = PROTO.read_text(encoding="utf-8")
    declared = set(re.findall(r"^(?:message|enum) (\w+)", text, flags=re.MULTILINE))
    generated = set(pb.DESCRIPTOR.message_types_by_name) | set(pb.DESCRIPTOR.enum_types_by_name)
    assert declared == generated
    for message in re.findall(r"^message (\w+) \{(.*?)^\}", text, flags=re.MULTILINE | re.DOTALL):
        name, body = message
        numbers = {
            int(n) for n in re.findall(r"^  (?:optional|repeated|map<[^>]+>) [\w.<>, ]+ \w+ = (\d+)", body, re.M)
        }
        top_level = {f.number for f in getattr(pb, name).DESCRIPTOR.fields}
        assert numbers <= top_level, name


def test_method_table_uses_ybs_service_names():
    assert {m.service for m in methods.ALL_METHODS} == {"yb.cdc.CDCService", "yb.master.MasterService"}
    for method in methods.ALL_METHODS:
        assert method.request.__name__.endswith("RequestPB")
        assert method.response.__name__.endswith("ResponsePB")
