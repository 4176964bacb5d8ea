"""Typed errors of YugabyteDB's RPC protocol and of the CDC and master services.

Three layers can fail a call, and each has its own error message on the wire:

* the byte stream itself (a frame that cannot be parsed): :class:`ProtocolError`, terminal for the
  connection;
* the RPC layer (``ResponseHeader.is_error`` set, body an ``ErrorStatusPB``; ``rpc_header.proto``):
  :func:`rpc_error`;
* the service, inside a successful RPC response: ``CDCErrorPB`` (``cdc_service.proto``) or
  ``MasterErrorPB`` (``master_types.proto``) in the response's ``error`` field:
  :func:`cdc_error`, :func:`master_error`, :func:`raise_for_service_error`.

Every error says whether retrying can help (``retriable``) and whether the tablet's or master's
leader must be looked up again first (``rediscover``). The classification follows what YB's own
Java client does with each code (``java/yb-client/.../TabletClient.java``: ``decode`` for the RPC
layer, ``dispatchCDCErrorOrReturnException``, ``dispatchMasterErrorOrReturnException``) and which
codes ``src/yb/cdc/cdc_service.cc`` (``GetChanges``) sends for which condition.
"""

from __future__ import annotations

from typing import Any

from . import yb_cdc_pb2 as pb


class YbRpcError(Exception):
    """Base of everything this protocol layer raises."""

    #: Retrying the same call (after a pause) can succeed.
    retriable: bool = False
    #: Look the tablet's (or the master's) leader up again before retrying.
    rediscover: bool = False


# --- transport and framing ---------------------------------------------------------------------


class ProtocolError(YbRpcError):
    """The byte stream is not a valid YB RPC stream; the connection cannot be used any more."""


class FrameTooLarge(ProtocolError):
    """A frame announced a length above the limit: the method's cap on the client
    (:data:`.methods.Method.max_response_bytes`), or ``rpc_max_message_size`` on a server. Nothing
    of the frame is read; retrying gets the same frame, so it is not retriable."""


class TruncatedFrame(ProtocolError):
    """The stream ended inside a frame."""


class RpcConnectionError(YbRpcError):
    """The connection failed or closed; another server (or a reconnect) may answer."""

    retriable = True
    rediscover = True


class RpcTlsError(YbRpcError):
    """The TLS session could not be set up: the server's certificate is not trusted, or the server
    does not speak TLS on its RPC port (it drops the handshake as a bad connection header). A
    configuration problem, never downgraded to plaintext and not retried."""


class RpcTimeout(YbRpcError):
    """No response before the call's deadline. The connection is closed: its stream is unknown."""

    retriable = True


# --- RPC layer: ErrorStatusPB ------------------------------------------------------------------


class RemoteRpcError(YbRpcError):
    """The server's RPC layer refused the call (``ErrorStatusPB``)."""

    def __init__(self, code: int, message: str) -> None:
        self.code = code
        self.code_name = _enum_name(pb.ErrorStatusPB.RpcErrorCodePB, code)
        self.message = message
        super().__init__(f"{self.code_name}: {message}")


class ServerTooBusy(RemoteRpcError):
    """``ERROR_SERVER_TOO_BUSY``: the only RPC-level code YB's Java client retries."""

    retriable = True


class ServerShuttingDown(RemoteRpcError):
    """``FATAL_SERVER_SHUTTING_DOWN``: go to another replica."""

    retriable = True
    rediscover = True


class NoSuchMethod(RemoteRpcError):
    """``ERROR_NO_SUCH_METHOD`` / ``ERROR_NO_SUCH_SERVICE``: the server does not speak this call."""


class InvalidRpcRequest(RemoteRpcError):
    """``ERROR_INVALID_REQUEST`` / ``FATAL_DESERIALIZING_REQUEST``: the request did not parse."""


class RpcUnauthorized(RemoteRpcError):
    """``FATAL_UNAUTHORIZED``."""


# --- service layer: CDCErrorPB and MasterErrorPB -----------------------------------------------


class ServiceError(YbRpcError):
    """An error the CDC service or the master put in its response's ``error`` field."""

    def __init__(
        self,
        service: str,
        code: int,
        code_name: str,
        status_code: int | None,
        message: str,
    ) -> None:
        self.service = service
        self.code = code
        self.code_name = code_name
        self.status_code = status_code
        self.status_name = _enum_name(pb.AppStatusPB.ErrorCode, status_code) if status_code is not None else None
        self.message = message
        status = f" [{self.status_name}]" if self.status_name else ""
        super().__init__(f"{service} {code_name}{status}: {message}")


class TransientServiceError(ServiceError):
    """Retry the same server after a pause (service unavailable, timed out, I/O error)."""

    retriable = True


class LeaderChanged(ServiceError):
    """The server is not (or no longer) the tablet's or the master's leader, or is not ready yet."""

    retriable = True
    rediscover = True


class TabletSplit(ServiceError):
    """``TABLET_SPLIT``: the tablet was split; poll its children (``GetTabletListToPollForCDC``)."""

    retriable = True
    rediscover = True


class CheckpointTooOld(ServiceError):
    """``CHECKPOINT_TOO_OLD``: the WAL or intents at the checkpoint are gone. Terminal for the stream."""


class StreamExpired(ServiceError):
    """``Stream ID ... is expired for Tablet ID ...`` (``CheckStreamActive``): the stream was not polled
    within ``cdc_intent_retention_ms`` on this tablet, or the tablet was never started (a stream
    created without a consistent snapshot, before ``SetCDCCheckpoint``: same text). The client
    tells the two apart by the tablet's stored checkpoint (``YbCdcClient.get_changes``)."""


class StreamNotFound(ServiceError):
    """The stream (or the table, or the namespace) does not exist or is being deleted. Terminal."""


class InvalidServiceRequest(ServiceError):
    """``INVALID_REQUEST`` and other codes retrying cannot cure (a tablet not in the stream, ...)."""


def is_invalid_request(error: YbRpcError) -> bool:
    """The CDC service's ``INVALID_REQUEST``. From ``GetChanges`` it is also a split parent whose
    ``cdc_state`` row is gone and that no tablet names as its split parent any more
    (``CheckTabletValidForStream``: "Tablet ID … is not part of stream ID …"); the Debezium
    connector treats it as a split (``YugabyteDBStreamingChangeEventSource.java`` l.564). The
    client decides which (:meth:`~..client.YbCdcClient.get_changes`)."""
    return (
        isinstance(error, InvalidServiceRequest)
        and error.service == "yb.cdc.CDCService"
        and error.code == _CDC.INVALID_REQUEST
    )


_CDC = pb.CDCErrorPB
_STATUS = pb.AppStatusPB
_MASTER = pb.MasterErrorPB

# TabletClient.dispatchCDCErrorOrReturnException: these codes go through handleNotLeader.
_CDC_LEADER_CODES = {_CDC.TABLET_NOT_RUNNING, _CDC.LEADER_NOT_READY, _CDC.NOT_LEADER, _CDC.NOT_RUNNING}
# ... these AppStatus codes through handleRetryableError (same server) ...
_TRANSIENT_STATUS = {
    _STATUS.SERVICE_UNAVAILABLE,
    _STATUS.IO_ERROR,
    _STATUS.LEADER_NOT_READY_TO_SERVE,
    _STATUS.TIMED_OUT,
}
# ... and these through handleNotLeader again.
_LEADER_STATUS = {_STATUS.LEADER_HAS_NO_LEASE, _STATUS.ILLEGAL_STATE, _STATUS.ABORTED}

# Message texts YB uses for conditions that have no code of their own (cdc_service.cc). Kept to
# this one place; matched case-insensitively because the wording's capitalisation changed.
_EXPIRED_MARKERS = ("is expired for tablet", "expired for tablet id", "unpolled for too long")
_STREAM_MISSING_MARKERS = ("could not find cdc stream",)


def rpc_error(status: pb.ErrorStatusPB) -> RemoteRpcError:
    """The typed error for an RPC-layer ``ErrorStatusPB`` (``ResponseHeader.is_error``)."""
    code = status.code if status.HasField("code") else pb.ErrorStatusPB.FATAL_UNKNOWN
    codes = pb.ErrorStatusPB
    cls: type[RemoteRpcError]
    if code == codes.ERROR_SERVER_TOO_BUSY:
        cls = ServerTooBusy
    elif code == codes.FATAL_SERVER_SHUTTING_DOWN:
        cls = ServerShuttingDown
    elif code in (codes.ERROR_NO_SUCH_METHOD, codes.ERROR_NO_SUCH_SERVICE, codes.FATAL_VERSION_MISMATCH):
        cls = NoSuchMethod
    elif code in (codes.ERROR_INVALID_REQUEST, codes.FATAL_DESERIALIZING_REQUEST):
        cls = InvalidRpcRequest
    elif code == codes.FATAL_UNAUTHORIZED:
        cls = RpcUnauthorized
    else:
        cls = RemoteRpcError
    return cls(code, status.message)


def cdc_error(error: pb.CDCErrorPB, service: str = "yb.cdc.CDCService") -> ServiceError:
    """The typed error for a ``CDCErrorPB`` found in a CDC-service response."""
    code = error.code
    status_code = error.status.code if error.HasField("status") and error.status.HasField("code") else None
    message = error.status.message if error.HasField("status") else ""
    lowered = message.lower()
    cls: type[ServiceError]
    if code == _CDC.TABLET_SPLIT:
        cls = TabletSplit
    elif code == _CDC.CHECKPOINT_TOO_OLD:
        # GetChanges maps a NotFound from reading the WAL to CHECKPOINT_TOO_OLD (cdc_service.cc).
        cls = CheckpointTooOld
    elif any(marker in lowered for marker in _EXPIRED_MARKERS):
        # CheckStreamActive: InternalError "Stream ID ... is expired for Tablet ID ..." (INTERNAL_ERROR;
        # "stream ID" in older releases): real expiry, or a tablet never started.
        cls = StreamExpired
    elif any(marker in lowered for marker in _STREAM_MISSING_MARKERS):
        cls = StreamNotFound
    elif code in _CDC_LEADER_CODES or code == _CDC.TABLET_NOT_FOUND:
        # TABLET_NOT_FOUND is also what GetChanges answers on a follower ("Not leader for ...").
        cls = LeaderChanged
    elif code == _CDC.TABLE_NOT_FOUND:
        cls = StreamNotFound
    elif status_code in _TRANSIENT_STATUS:
        cls = TransientServiceError
    elif status_code in _LEADER_STATUS or (status_code == _STATUS.NOT_FOUND and code != _CDC.INVALID_REQUEST):
        # Java's handleTabletNotFound for AppStatus NOT_FOUND (a moved tablet).
        cls = LeaderChanged
    else:
        cls = InvalidServiceRequest
    return cls(service, code, _enum_name(_CDC.Code, code), status_code, message)


def master_error(error: pb.MasterErrorPB, service: str = "yb.master.MasterService") -> ServiceError:
    """The typed error for a ``MasterErrorPB`` found in a master response."""
    code = error.code
    status_code = error.status.code if error.HasField("status") and error.status.HasField("code") else None
    message = error.status.message if error.HasField("status") else ""
    cls: type[ServiceError]
    if code == _MASTER.NOT_THE_LEADER:
        cls = LeaderChanged
    elif code in (
        _MASTER.CATALOG_MANAGER_NOT_INITIALIZED,
        _MASTER.CAN_RETRY_LOAD_BALANCE_CHECK,
        _MASTER.IN_TRANSITION_CAN_RETRY,
    ):
        cls = TransientServiceError
    elif code in (_MASTER.OBJECT_NOT_FOUND, _MASTER.NAMESPACE_NOT_FOUND):
        cls = StreamNotFound
    elif status_code == _STATUS.SERVICE_UNAVAILABLE:
        cls = TransientServiceError
    else:
        cls = InvalidServiceRequest
    return cls(service, code, _enum_name(_MASTER.Code, code), status_code, message)


def raise_for_service_error(response: Any) -> None:
    """Raise the typed error if ``response`` carries a ``CDCErrorPB`` or ``MasterErrorPB``."""
    descriptor = response.DESCRIPTOR
    if "error" not in descriptor.fields_by_name or not response.HasField("error"):
        return
    error = response.error
    if isinstance(error, pb.CDCErrorPB):
        raise cdc_error(error)
    if isinstance(error, pb.MasterErrorPB):
        raise master_error(error)


def _enum_name(enum: Any, value: int | None) -> str:
    try:
        return str(enum.Name(value))
    except (ValueError, TypeError):
        return f"code {value}"
