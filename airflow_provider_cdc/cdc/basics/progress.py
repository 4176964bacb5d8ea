"""One progress line per written chunk, the same for every source.

A task log should answer "how far along, how fast, how far behind" without Spark's noise:
changes and transactions so far, the bytes of events written, the rate since the window
started, and the lag (how long ago the last captured change was committed).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa


@dataclass
class StreamStats:
    """What a window's stream read so far: every source's counters (a source adds its own)."""

    changes: int = 0
    transactions: int = 0
    chunks: int = 0
    key_changes: int = 0
    last_commit_lsn: int | None = None
    last_tx_id: int | str | None = None
    last_commit_ts_us: int | None = None
    event_bytes: int = 0
    started: float = field(default_factory=time.monotonic)

    def commit(self, writer: Any, window: Any, **stats: Any) -> Any:
        """Publish ``window`` through ``writer`` with what every source's stream counted, plus
        the source's own ``stats``; returns the commit-log entry."""
        counted = {"changes": self.changes, "chunks": self.chunks, "key_changes": self.key_changes}
        return writer.commit(
            window,
            transactions=self.transactions,
            last_commit_lsn=self.last_commit_lsn,
            last_tx_id=self.last_tx_id,
            last_commit_ts_us=self.last_commit_ts_us,
            stats={**counted, "seconds": round(time.monotonic() - self.started, 3), "job_pid": os.getpid(), **stats},
        )

    def chunk_written(self, log: logging.Logger, batches: Mapping[str, Sequence[pa.RecordBatch]]) -> None:
        """Count a written chunk and log its progress line."""
        self.chunks += 1
        self.event_bytes += sum(batch_bytes(b) for b in batches.values())
        log_chunk(
            log,
            chunk=self.chunks,
            changes=self.changes,
            transactions=self.transactions,
            event_bytes=self.event_bytes,
            started=self.started,
            last_commit_ts_us=self.last_commit_ts_us,
            topics=batches,
        )


def batch_bytes(batches: Iterable[pa.RecordBatch]) -> int:
    return sum(b.nbytes for b in batches)


def human_bytes(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


def lag_text(last_commit_ts_us: int | None, now: float | None = None) -> str:
    if last_commit_ts_us is None:
        return "unknown"
    seconds = max(0.0, (time.time() if now is None else now) - last_commit_ts_us / 1e6)
    return f"{seconds:.1f}s"


def log_chunk(
    log: logging.Logger,
    *,
    chunk: int,
    changes: int,
    transactions: int,
    event_bytes: int,
    started: float,
    last_commit_ts_us: int | None,
    topics: Iterable[str],
) -> None:
    elapsed = max(time.monotonic() - started, 1e-3)
    log.info(
        "chunk %d: %d changes in %d transactions so far, %s of events, %.0f changes/s (%s/s), "
        "lag %s behind the last commit read; topics: %s",
        chunk,
        changes,
        transactions,
        human_bytes(event_bytes),
        changes / elapsed,
        human_bytes(event_bytes / elapsed),
        lag_text(last_commit_ts_us),
        ", ".join(sorted(topics)) or "none",
    )
