"""Incremental snapshots on PostgreSQL: watermark messages and transaction visibility.

The state and signals are the core's (:mod:`cdc.incremental`, re-exported here). PostgreSQL
adds its watermark messages and :class:`XidSnapshot`: the transactions a chunk's SELECT saw,
which decides whether a stream change committed before the low watermark was in the chunk.
:mod:`.chunks` does the reading and emitting.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.planning.incremental import (
    SIGNAL_TYPES,
    WATERMARK_CLOSE,
    WATERMARK_MODES,
    WATERMARK_OPEN,
    WATERMARK_SIGNAL_TYPES,
    IncrementalState,
    Signal,
    SignalError,
    StagedChunk,
    TableProgress,
    apply_signal,
    remember_applied,
)

__all__ = [
    "SIGNAL_TYPES",
    "WATERMARK_CLOSE",
    "WATERMARK_MODES",
    "WATERMARK_OPEN",
    "WATERMARK_SIGNAL_TYPES",
    "IncrementalState",
    "Signal",
    "SignalError",
    "StagedChunk",
    "TableProgress",
    "XidSnapshot",
    "apply_signal",
    "remember_applied",
]

_XID_MASK = 0xFFFFFFFF


@dataclass(frozen=True)
class XidSnapshot:
    """A transaction snapshot (``pg_current_snapshot()``): which transactions a SELECT saw."""

    xmin: int
    xmax: int
    xip: tuple[int, ...] = ()

    @classmethod
    def parse(cls, text: str) -> XidSnapshot:
        """``xmin:xmax:xip,xip`` as printed by PostgreSQL."""
        try:
            xmin, xmax, xip = str(text).split(":")
            return cls(int(xmin), int(xmax), tuple(int(x) for x in xip.split(",") if x))
        except ValueError:
            raise CdcConfigurationError(f"not a transaction snapshot: {text!r}") from None

    def sees(self, xids: np.ndarray) -> np.ndarray:
        """Which of the (32-bit, as in the WAL) transaction ids committed before this snapshot.

        PostgreSQL's rule (``XidInMVCCSnapshot``), with wraparound-aware comparison of 32-bit ids:
        a transaction is visible if it precedes ``xmin``, or precedes ``xmax`` and was not in
        progress. Ids in the WAL are never 2^31 apart from a live snapshot, so the comparison is
        exact."""
        xids = np.asarray(xids, dtype=np.int64) & _XID_MASK
        before_xmin = ((xids - (self.xmin & _XID_MASK)) & _XID_MASK) >= 1 << 31
        before_xmax = ((xids - (self.xmax & _XID_MASK)) & _XID_MASK) >= 1 << 31
        running = np.isin(xids, np.array([x & _XID_MASK for x in self.xip], dtype=np.int64))
        return before_xmin | (before_xmax & ~running)

    def to_text(self) -> str:
        return f"{self.xmin}:{self.xmax}:{','.join(map(str, self.xip))}"
