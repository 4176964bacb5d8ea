"""A YugabyteDB slot's stream errors, classified: a missing publication, a plugin that cannot stream
the tables, an expired slot (its changes dropped: WAL lost), each naming the fix; anything else a
transient error (retried).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

from airflow_provider_cdc.cdc.basics.errors import (
    CdcTransientError,
    PublicationError,
    SlotConfigurationError,
    WalLostError,
)
from airflow_provider_cdc.cdc.sources.postgres.replication import (
    StreamErrorResponse,
)
from airflow_provider_cdc.cdc.sources.yugabyte import PLUGIN

_EXPIRED_FOR_TABLET = re.compile(r"stream id \S+ is expired for tablet")


def stream_error(slot: str, message: str) -> Exception:
    """A START_REPLICATION failure in YugabyteDB's words, classified."""
    lowered = message.lower()
    if "publication" in lowered and "does not exist" in lowered:
        return PublicationError(
            f"replication slot {slot!r} cannot stream: {message}. Run the setup task (it creates the publication), "
            "or create it as docs/yugabytedb.md shows"
        )
    if "is not supported for output plugin" in lowered:
        return SlotConfigurationError(
            f"replication slot {slot!r} cannot stream the publication's tables: {message}. Drop the slot and "
            f"let the snapshot create it with plugin {PLUGIN!r}"
        )
    # YugabyteDB's CDC service: "Stream ID <id> is expired for Tablet ID <id>" (cdc_service.cc
    # CheckStreamActive). Not any "expired": "Operation expired: Transaction … expired or aborted by a
    # conflict" (40001) is an ordinary retryable conflict.
    if _EXPIRED_FOR_TABLET.search(lowered):
        return WalLostError(
            f"replication slot {slot!r} expired: {message}. YugabyteDB drops a slot's changes when it is not "
            "read for cdc_intent_retention_ms (8 h by default); run windows more often than that"
        )
    return CdcTransientError(f"START_REPLICATION on slot {slot!r} failed: {message}")


def in_stream_error(slot: str, error: StreamErrorResponse) -> Exception:
    """An ErrorResponse inside the stream, classified as :func:`stream_error` classifies a refused
    START. YugabyteDB sends CopyBothResponse before it sets up the slot's virtual WAL
    (``YBCInitVirtualWal``), so expiry, a missing publication or pgoutput with REPLICA IDENTITY
    CHANGE arrive this way. Anything else stays transient (a lost connection)."""
    if error.sqlstate == "40001":  # a serialization failure / conflict: retried, never terminal
        return error
    classified = stream_error(slot, error.server_message)
    return error if isinstance(classified, CdcTransientError) else classified


@contextmanager
def classified_stream_errors(slot: str) -> Iterator[None]:
    """Re-raise a stream's ErrorResponse as :func:`in_stream_error` classifies it."""
    try:
        yield
    except StreamErrorResponse as exc:
        raise in_stream_error(slot, exc) from None
