"""Reading one YugabyteDB stream window: PostgreSQL's collector with yboutput's differences.

yboutput is pgoutput's code with YB's replica identities (issue 14's research,
§3, §4), so frames decode and buffer exactly as on PostgreSQL (:mod:`..postgres.stream`). What
differs, and is handled here:

- **Window bounds.** The window holds the transactions whose commit LSN ``c`` satisfies
  ``from_lsn <= c < to_lsn`` (the core rule, :mod:`cdc.window`), with ``from_lsn`` = the last
  committed commit LSN + 1 and ``to_lsn`` = the end hybrid time + 1 (:func:`window_bound_after`).
  A BEGIN carries its commit LSN (``final_lsn``), so a BEGIN at or past ``to_lsn`` ends the window.
- **Retransmission.** After a reconnect YB re-sends every transaction not fully acknowledged,
  whole and with the same LSNs. A BEGIN before ``from_lsn`` is such a transaction: it and its
  rows are skipped up to its COMMIT (PostgreSQL would raise: its slot never goes back).
- **No end from keepalives.** A YB keepalive's ``wal_end`` is no commit bound and the walsender
  has no end of stream; the capture writes a heartbeat row after fixing the end, so a later
  commit (a BEGIN at or past ``to_lsn``) always comes.
- **Columns not sent.** YB has no TOAST: a ``'u'`` column is one the server omitted (replica
  identity CHANGE sends the key and the changed columns). PostgreSQL's pipeline already gives
  it the unavailable-value placeholder (text/binary) or null and lists it in
  ``unchanged_toast_columns``, which the current-state fold applies as a patch; an explicit NULL
  is ``'n'`` and stays a real null.
- **Old tuples with no values.** Older builds send a CHANGE update with an old ``'K'`` of only
  ``'u'``; FULL sends an old ``'O'`` of only ``'n'`` for a row inserted in the same transaction
  ("before image unavailable"). Both mean "no old tuple" (:func:`strip_unavailable_old_tuple`).
- DELETE ``'K'`` carries the key and NULL non-key columns (as PostgreSQL's DEFAULT); key
  updates already arrive as DELETE + INSERT. TRUNCATE and logical messages are never sent and
  Origin is suppressed; should one arrive it is handled as on PostgreSQL.

Acknowledging (not done here): flush exactly the last processed commit LSN, never commit + 1
(research §2), on the same replication connection.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from airflow_provider_cdc.cdc.basics.errors import CdcStateError, DecodingError
from airflow_provider_cdc.cdc.sources.postgres.decoder import Begin, Commit, LogicalMessage, Truncate, decode_message
from airflow_provider_cdc.cdc.sources.postgres.replication import Keepalive, XLogData
from airflow_provider_cdc.cdc.sources.postgres.stream import _ROW_KINDS, StreamStats, WindowCollector
from airflow_provider_cdc.cdc.sources.postgres.stream_events import StreamEventBuffer
from airflow_provider_cdc.cdc.sources.yugabyte.lsn import YbLsn, window_bound_after  # noqa: F401 (re-exported)

_UPDATE, _KEY, _OLD, _NEW = 0x55, 0x4B, 0x4F, 0x4E


def strip_unavailable_old_tuple(payload: bytes) -> bytes:
    """An Update message without its old tuple when that tuple carries no value (only ``'u'``
    and ``'n'`` columns: YB's "before image unavailable"); any other message unchanged.

    Pure and cheap: it reads the old tuple's kind bytes until the first text value. A malformed
    message is returned unchanged, for the decoder to report."""
    if len(payload) < 8 or payload[0] != _UPDATE or payload[5] not in (_KEY, _OLD):
        return payload
    ncols = (payload[6] << 8) | payload[7]
    if ncols & 0x8000 or ncols == 0:  # negative (malformed) or empty: nothing to tell apart
        return payload
    end = 8 + ncols
    if end >= len(payload) or payload[end] != _NEW:
        return payload  # a text value (or a malformed tuple) shifts the new tuple's marker
    if payload[8:end].translate(None, b"nu"):  # a kind other than NULL / not sent
        return payload
    return payload[:5] + payload[end:]


@dataclass
class YbStreamStats(StreamStats):
    retransmitted_skipped: int = 0  # whole transactions re-sent after a reconnect, skipped
    retransmitted_changes_skipped: int = 0


class YbWindowCollector(WindowCollector):
    """:class:`WindowCollector` with YugabyteDB's window rules (see the module docstring)."""

    docdb_text = True  # char(n) comes right-trimmed, numeric(p,s) without trailing zeros

    def __init__(self, **kwargs: Any) -> None:
        """The keyword arguments of :class:`WindowCollector`."""
        super().__init__(**kwargs)
        self.stats: YbStreamStats = YbStreamStats()
        self._skipping: Begin | None = None  # the retransmitted transaction being skipped
        self._read_ms = int(time.time() * 1000)  # reading the slot restarts YugabyteDB's expiry timer

    def extra_stats(self) -> dict:
        """Retransmissions skipped, and when the slot was read (the offset keeps it as
        ``source_state.last_read_ms``: YugabyteDB shows a slot's expiry nowhere in SQL)."""
        return {
            "retransmitted_skipped": self.stats.retransmitted_skipped,
            "retransmitted_changes_skipped": self.stats.retransmitted_changes_skipped,
            "source_state": {"last_read_ms": self._read_ms},
        }

    def consume(self, frames: Iterable[XLogData | Keepalive]) -> None:
        """As on PostgreSQL (row path inlined), plus dropping the rows of a skipped transaction."""
        row, feed = self._row, self.feed
        for frame in frames:
            if type(frame) is XLogData:
                payload = frame.payload
                if payload and payload[0] in _ROW_KINDS and not self.done:
                    if self._skipping is None:
                        row(payload, frame.wal_start)
                    else:
                        self.stats.retransmitted_changes_skipped += 1
                    continue
            if feed(frame):
                return

    def feed(self, frame: XLogData | Keepalive) -> bool:
        if self.done:
            return True
        if isinstance(frame, Keepalive):
            return False  # walEnd bounds no commit on YB: only a BEGIN at or past to_lsn ends a window
        payload = frame.payload
        if payload and payload[0] in _ROW_KINDS:
            if self._skipping is None:
                self._row(payload, frame.wal_start)
            else:
                self.stats.retransmitted_changes_skipped += 1
            return False
        message = decode_message(payload)
        skipping = self._skipping
        if skipping is not None:
            if isinstance(message, Commit):
                if message.commit_lsn != skipping.final_lsn:
                    raise DecodingError(
                        f"Commit LSN {message.commit_lsn:X} does not match the skipped Begin's {skipping.final_lsn:X}"
                    )
                self._skipping = None
                return False
            if isinstance(message, Begin):
                raise DecodingError(f"Begin at {message.final_lsn:X} inside transaction {skipping.xid}")
            if isinstance(message, (Truncate, LogicalMessage)):
                return False  # part of the skipped transaction (and never sent by YB anyway)
            # Relation, Type, Origin: connection state that later transactions rely on.
            return self._on_message(message, frame.wal_start)
        if isinstance(message, Begin):
            from_lsn, to_lsn = self.window.from_lsn, self.window.to_lsn
            if to_lsn is None:
                raise CdcStateError(f"stream window {self.window.describe()} has no end position")
            if message.final_lsn < to_lsn and from_lsn is not None and message.final_lsn < from_lsn:
                if self._tx is not None:
                    raise DecodingError(f"Begin at {message.final_lsn:X} inside transaction {self._tx.xid}")
                # Re-sent after a reconnect: the previous window already holds it.
                self._skipping = message
                self.stats.retransmitted_skipped += 1
                return False
        return self._on_message(message, frame.wal_start)

    def finish(self) -> YbStreamStats:
        if self._skipping is not None:
            raise DecodingError(f"the stream ended inside retransmitted transaction {self._skipping.xid}")
        super().finish()
        return self.stats

    def _update_with_old(self, buffer: StreamEventBuffer, oid: int, payload: bytes, lsn: int) -> None:
        # Reached only by Updates carrying an old tuple, so inserts pay nothing for this check.
        stripped = strip_unavailable_old_tuple(payload)
        if stripped is payload:
            super()._update_with_old(buffer, oid, payload, lsn)
        else:
            self._add(buffer, stripped, lsn)


__all__ = ["YbStreamStats", "YbWindowCollector", "strip_unavailable_old_tuple", "window_bound_after"]
