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

MIB = 1024 * 1024

# -- response frame caps ------------------------------------------------------------------------
# A server may announce a frame of up to rpc_max_message_size (255 MB by default, yb_rpc.cc); the
# client reads no frame larger than its method's cap, so a broken or hostile server cannot make a
# worker allocate that much for a call that never needs it (framing.py's DEFAULT_MAX_MESSAGE_SIZE
# stays the absolute limit).
#
#: ``GetChanges``: YB fills a response up to ``cdc_stream_records_threshold_size_bytes`` (streaming)
#: or ``cdc_snapshot_records_threshold_size_bytes`` (snapshot pages), both 4 MB by default, and
#: stops adding once past it, so a response overshoots by its last batch ("the actual size may be a
#: little higher", ``src/yb/cdc/cdcsdk_producer.cc``); a batch of a transaction's intents is up to
#: ``cdc_max_stream_intent_records`` (1680) records, and older releases cut snapshot pages by
#: ``cdc_snapshot_batch_size`` (250 rows) instead of bytes. 64 MiB is 16 times the default response
#: size and holds 1680 records of ~38 KB (or 250 rows of ~256 KB); a cluster with larger thresholds
#: or wider rows raises it per connection (``rpc_get_changes_max_bytes``), up to YB's own limit.
GET_CHANGES_MAX_BYTES = 64 * MIB
#: Listings (stream info, table and tablet locations, a split's children): a few hundred bytes per
#: table or tablet replica; 32 MiB is tens of thousands of tablets.
LISTING_MAX_BYTES = 32 * MIB
#: Checkpoint calls answer one checkpoint (or an op id per tablet asked for).
CHECKPOINT_MAX_BYTES = 1 * MIB


@dataclass(frozen=True)
class Method:
    """One RPC: where it goes, what it carries, and the largest response frame it may receive."""

    service: str
    name: str
    request: type[Message]
    response: type[Message]
    max_response_bytes: int = LISTING_MAX_BYTES


# Tablet servers (port 9100 by default): the CDC service.
GET_CHANGES = Method(CDC_SERVICE, "GetChanges", pb.GetChangesRequestPB, pb.GetChangesResponsePB, GET_CHANGES_MAX_BYTES)
GET_CHECKPOINT = Method(
    CDC_SERVICE, "GetCheckpoint", pb.GetCheckpointRequestPB, pb.GetCheckpointResponsePB, CHECKPOINT_MAX_BYTES
)
SET_CDC_CHECKPOINT = Method(
    CDC_SERVICE,
    "SetCDCCheckpoint",
    pb.SetCDCCheckpointRequestPB,
    pb.SetCDCCheckpointResponsePB,
    CHECKPOINT_MAX_BYTES,
)
GET_TABLET_LIST_TO_POLL = Method(
    CDC_SERVICE,
    "GetTabletListToPollForCDC",
    pb.GetTabletListToPollForCDCRequestPB,
    pb.GetTabletListToPollForCDCResponsePB,
)
GET_LATEST_ENTRY_OP_ID = Method(
    CDC_SERVICE,
    "GetLatestEntryOpId",
    pb.GetLatestEntryOpIdRequestPB,
    pb.GetLatestEntryOpIdResponsePB,
    CHECKPOINT_MAX_BYTES,
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
