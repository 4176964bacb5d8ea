"""What the CDC service's errors mean to the product: a protocol error that retrying did not (or
cannot) cure (:mod:`.protocol.errors`) as the engine's error class (state, configuration, transient,
decoding), with the stream's own: expired, not yet started, a request the service refuses.
"""

from __future__ import annotations

from airflow_provider_cdc.cdc.basics.errors import (
    CdcConfigurationError,
    CdcError,
    CdcTransientError,
    DecodingError,
    SlotMissingError,
    WalLostError,
)
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.pages import TabletSplitError
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import errors as rpc


class StreamExpiredError(WalLostError):
    """The server answered "Stream ID ... is expired for Tablet ID ..." on a tablet that had been
    started: no ``GetChanges`` or ``SetCDCCheckpoint`` within ``cdc_intent_retention_ms``, and the
    server released what it kept for the stream. Terminal for the stream."""


class StreamNotStartedError(CdcTransientError):
    """The server answered "... is expired ..." on a tablet whose checkpoint was never set (-1.-1):
    a stream created without a consistent snapshot counts as expired on a tablet until a
    ``SetCDCCheckpoint`` sets it (``CheckStreamActive``, ``active_time`` 0). Nothing was lost."""


class InvalidRequestError(CdcConfigurationError):
    """The CDC service answered ``INVALID_REQUEST`` (for a tablet: "Tablet ID … is not part of stream
    ID …"). From ``GetChanges`` on a split parent whose tablets are listed it is a split instead
    (:meth:`YbCdcClient.get_changes`)."""


def product_error(error: rpc.YbRpcError, what: str) -> CdcError:
    """The product's error for a protocol error that retrying did not (or cannot) cure."""
    text = f"{what}: {error}"
    if isinstance(error, rpc.FrameTooLarge):
        return CdcConfigurationError(
            f"{text}. If the cluster really sends responses this large (larger GetChanges thresholds, very "
            "wide rows), raise the cap: the connection extra rpc_get_changes_max_bytes (YugabyteDB's own "
            "limit is rpc_max_message_size, 255 MB by default)"
        )
    if isinstance(error, rpc.RpcTlsError):
        return CdcConfigurationError(text)
    if isinstance(error, rpc.StreamExpired):
        return StreamExpiredError(text)
    if isinstance(error, rpc.CheckpointTooOld):
        return WalLostError(text)
    if isinstance(error, rpc.StreamNotFound):
        return SlotMissingError(text)
    if isinstance(error, rpc.TabletSplit):
        return TabletSplitError(text)
    if rpc.is_invalid_request(error):
        return InvalidRequestError(
            f"{text}. Check that the offset's tablets belong to this stream (stream_id of the capture, "
            "the offset of another stream)"
        )
    if isinstance(error, rpc.ProtocolError):
        return DecodingError(text)
    if error.retriable:
        return CdcTransientError(text)
    return CdcConfigurationError(text)


__all__ = ["InvalidRequestError", "StreamExpiredError", "StreamNotStartedError", "product_error"]
