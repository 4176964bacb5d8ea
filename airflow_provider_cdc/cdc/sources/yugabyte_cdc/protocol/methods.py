"""The service and method names that travel in ``RemoteMethodPB``, with their message types.

Service names are YB's, not our .proto package: ``yb.cdc.CDCService`` (package ``yb.cdc``,
service ``CDCService`` in cdc_service.proto; the Java client's ``CDC_SERVICE_NAME``), and
``yb.master.MasterService`` for every master call: the master's split services (MasterClient,
MasterReplication, ...) all declare ``option (yb.rpc.custom_service_name) = "yb.master.MasterService"``
(master_client.proto, master_replication.proto) and the Java client's ``MASTER_SERVICE_NAME`` is
that string.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.message import Message

from . import yb_cdc_pb2 as pb

CDC_SERVICE = "yb.cdc.CDCService"
MASTER_SERVICE = "yb.master.MasterService"


@dataclass(frozen=True)
class Method:
    """One RPC: where it goes and what it carries."""

    service: str
    name: str
    request: type[Message]
    response: type[Message]


# Tablet servers (port 9100 by default): the CDC service.
GET_CHANGES = Method(CDC_SERVICE, "GetChanges", pb.GetChangesRequestPB, pb.GetChangesResponsePB)
GET_CHECKPOINT = Method(CDC_SERVICE, "GetCheckpoint", pb.GetCheckpointRequestPB, pb.GetCheckpointResponsePB)
SET_CDC_CHECKPOINT = Method(
    CDC_SERVICE, "SetCDCCheckpoint", pb.SetCDCCheckpointRequestPB, pb.SetCDCCheckpointResponsePB
)
GET_TABLET_LIST_TO_POLL = Method(
    CDC_SERVICE,
    "GetTabletListToPollForCDC",
    pb.GetTabletListToPollForCDCRequestPB,
    pb.GetTabletListToPollForCDCResponsePB,
)
GET_LATEST_ENTRY_OP_ID = Method(
    CDC_SERVICE, "GetLatestEntryOpId", pb.GetLatestEntryOpIdRequestPB, pb.GetLatestEntryOpIdResponsePB
)
TSERVER_GET_DB_STREAM_INFO = Method(
    CDC_SERVICE, "GetCDCDBStreamInfo", pb.GetCDCDBStreamInfoRequestPB, pb.GetCDCDBStreamInfoResponsePB
)

# Masters (port 7100 by default); only the leader answers, the others say NOT_THE_LEADER.
MASTER_GET_DB_STREAM_INFO = Method(
    MASTER_SERVICE,
    "GetCDCDBStreamInfo",
    pb.MasterGetCDCDBStreamInfoRequestPB,
    pb.MasterGetCDCDBStreamInfoResponsePB,
)
MASTER_GET_CDC_STREAM = Method(MASTER_SERVICE, "GetCDCStream", pb.GetCDCStreamRequestPB, pb.GetCDCStreamResponsePB)
MASTER_GET_TABLE_LOCATIONS = Method(
    MASTER_SERVICE, "GetTableLocations", pb.GetTableLocationsRequestPB, pb.GetTableLocationsResponsePB
)
MASTER_GET_TABLET_LOCATIONS = Method(
    MASTER_SERVICE, "GetTabletLocations", pb.GetTabletLocationsRequestPB, pb.GetTabletLocationsResponsePB
)

ALL_METHODS = (
    GET_CHANGES,
    GET_CHECKPOINT,
    SET_CDC_CHECKPOINT,
    GET_TABLET_LIST_TO_POLL,
    GET_LATEST_ENTRY_OP_ID,
    TSERVER_GET_DB_STREAM_INFO,
    MASTER_GET_DB_STREAM_INFO,
    MASTER_GET_CDC_STREAM,
    MASTER_GET_TABLE_LOCATIONS,
    MASTER_GET_TABLET_LOCATIONS,
)
