"""Service errors (CDCErrorPB, MasterErrorPB) and RPC errors (ErrorStatusPB) map to typed errors.

The expected classes follow YB's Java client (java/yb-client/.../TabletClient.java:
dispatchCDCErrorOrReturnException, dispatchMasterErrorOrReturnException, decode) and the codes
src/yb/cdc/cdc_service.cc GetChanges sends for each condition.
"""

from __future__ import annotations

import pytest

from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import errors
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb

CDC = pb.CDCErrorPB
STATUS = pb.AppStatusPB
MASTER = pb.MasterErrorPB


def cdc(code: int, status: int | None = None, message: str = "") -> pb.CDCErrorPB:
    error = pb.CDCErrorPB(code=code)
    if status is not None:
        error.status.code = status
        error.status.message = message
    return error


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        # cdc_service.cc: a split tablet answers TABLET_SPLIT ("Tablet Split detected on ...").
        (cdc(CDC.TABLET_SPLIT, STATUS.TABLET_SPLIT, "Tablet Split detected on t1"), errors.TabletSplit),
        # cdc_service.cc: a NotFound while reading the WAL is sent as CHECKPOINT_TOO_OLD.
        (cdc(CDC.CHECKPOINT_TOO_OLD, STATUS.NOT_FOUND, "op index 10 has been already GCed"), errors.CheckpointTooOld),
        # cdc_service.cc: "Not leader for ..." and "Tablet ... not found" are TABLET_NOT_FOUND.
        (cdc(CDC.TABLET_NOT_FOUND, STATUS.NOT_FOUND, "Not leader for t1"), errors.LeaderChanged),
        # ... "Not ready to serve" is LEADER_NOT_READY (Java: handleNotLeader).
        (cdc(CDC.LEADER_NOT_READY, STATUS.LEADER_NOT_READY_TO_SERVE, "Not ready to serve"), errors.LeaderChanged),
        (cdc(CDC.NOT_LEADER), errors.LeaderChanged),
        (cdc(CDC.TABLET_NOT_RUNNING), errors.LeaderChanged),
        (cdc(CDC.NOT_RUNNING), errors.LeaderChanged),
        # cdc_service.cc CheckStreamActive: InternalError "stream ID ... is expired for Tablet ID ...".
        (
            cdc(CDC.INTERNAL_ERROR, STATUS.INTERNAL_ERROR, "stream ID abc is expired for Tablet ID t1"),
            errors.StreamExpired,
        ),
        (cdc(CDC.INTERNAL_ERROR, STATUS.NOT_FOUND, 'Could not find CDC stream: "abc"'), errors.StreamNotFound),
        # Java: SERVICE_UNAVAILABLE, IO_ERROR, LEADER_NOT_READY_TO_SERVE, TIMED_OUT -> handleRetryableError.
        (cdc(CDC.UNKNOWN_ERROR, STATUS.SERVICE_UNAVAILABLE, "busy"), errors.TransientServiceError),
        (cdc(CDC.INTERNAL_ERROR, STATUS.TIMED_OUT, "Too close to rpc timeout"), errors.TransientServiceError),
        # Java: LEADER_HAS_NO_LEASE, ILLEGAL_STATE, ABORTED -> handleNotLeader.
        (cdc(CDC.UNKNOWN_ERROR, STATUS.LEADER_HAS_NO_LEASE), errors.LeaderChanged),
        # cdc_service.cc: a request without a tablet id, or a tablet outside the stream.
        (
            cdc(CDC.INVALID_REQUEST, STATUS.INVALID_ARGUMENT, "Tablet ID t9 is not part of stream"),
            errors.InvalidServiceRequest,
        ),
        (cdc(CDC.INVALID_REQUEST, STATUS.NOT_FOUND, "no such tablet in stream"), errors.InvalidServiceRequest),
        (cdc(CDC.INTERNAL_ERROR, STATUS.INVALID_ARGUMENT, "Invalid checkpoint -1.-1"), errors.InvalidServiceRequest),
    ],
)
def test_cdc_errors(error, expected):
    raised = errors.cdc_error(error)
    assert type(raised) is expected
    assert raised.code_name == CDC.Code.Name(error.code)


def test_retriable_and_rediscover_flags():
    assert errors.LeaderChanged.retriable and errors.LeaderChanged.rediscover
    assert errors.TabletSplit.retriable and errors.TabletSplit.rediscover
    assert errors.TransientServiceError.retriable and not errors.TransientServiceError.rediscover
    for terminal in (
        errors.CheckpointTooOld,
        errors.StreamExpired,
        errors.StreamNotFound,
        errors.InvalidServiceRequest,
    ):
        assert not terminal.retriable
    assert errors.RpcTimeout.retriable and errors.RpcConnectionError.rediscover
    assert not errors.ProtocolError.retriable


@pytest.mark.parametrize(
    ("code", "status", "expected"),
    [
        (MASTER.NOT_THE_LEADER, STATUS.ILLEGAL_STATE, errors.LeaderChanged),
        (MASTER.CATALOG_MANAGER_NOT_INITIALIZED, STATUS.SERVICE_UNAVAILABLE, errors.TransientServiceError),
        (MASTER.UNKNOWN_ERROR, STATUS.SERVICE_UNAVAILABLE, errors.TransientServiceError),
        # catalog_manager GetCDCDBStreamInfo: NotFound "Could not find CDC stream".
        (MASTER.OBJECT_NOT_FOUND, STATUS.NOT_FOUND, errors.StreamNotFound),
        (MASTER.INVALID_REQUEST, STATUS.INVALID_ARGUMENT, errors.InvalidServiceRequest),
    ],
)
def test_master_errors(code, status, expected):
    error = pb.MasterErrorPB(code=code, status=pb.AppStatusPB(code=status, message="m"))
    assert type(errors.master_error(error)) is expected


@pytest.mark.parametrize(
    ("code", "expected", "retriable"),
    [
        (pb.ErrorStatusPB.ERROR_SERVER_TOO_BUSY, errors.ServerTooBusy, True),
        (pb.ErrorStatusPB.FATAL_SERVER_SHUTTING_DOWN, errors.ServerShuttingDown, True),
        (pb.ErrorStatusPB.ERROR_NO_SUCH_SERVICE, errors.NoSuchMethod, False),
        (pb.ErrorStatusPB.FATAL_DESERIALIZING_REQUEST, errors.InvalidRpcRequest, False),
        (pb.ErrorStatusPB.FATAL_UNAUTHORIZED, errors.RpcUnauthorized, False),
        (pb.ErrorStatusPB.ERROR_APPLICATION, errors.RemoteRpcError, False),
    ],
)
def test_rpc_errors(code, expected, retriable):
    raised = errors.rpc_error(pb.ErrorStatusPB(code=code, message="x"))
    assert type(raised) is expected
    assert raised.retriable is retriable


def test_raise_for_service_error_reads_the_error_field():
    errors.raise_for_service_error(pb.GetChangesResponsePB())  # no error: nothing raised
    errors.raise_for_service_error(pb.OpIdPB(term=1))  # no error field at all
    with pytest.raises(errors.TabletSplit, match="TABLET_SPLIT"):
        errors.raise_for_service_error(pb.GetChangesResponsePB(error=cdc(CDC.TABLET_SPLIT)))
    with pytest.raises(errors.LeaderChanged, match="NOT_THE_LEADER"):
        errors.raise_for_service_error(
            pb.GetTableLocationsResponsePB(error=pb.MasterErrorPB(code=MASTER.NOT_THE_LEADER))
        )


def test_unknown_codes_keep_their_number_in_the_message():
    raised = errors.rpc_error(pb.ErrorStatusPB(message="?"))
    assert raised.code_name == "FATAL_UNKNOWN"
    assert "code 77" in errors._enum_name(CDC.Code, 77)
