"""The incremental snapshot's part of a PostgreSQL stream window's job.

The run itself is the core's (:class:`cdc.incremental_run.IncrementalRun`); PostgreSQL adds its
chunk reader and positions (:mod:`.chunks`) and :class:`InFlightTransactions`: a transaction
that was in flight when the job started (or committed but held back by a synchronous standby) can
commit inside the window yet stay invisible to a chunk read at its end. Its changes precede the
chunk's low watermark, so no later stream event could supersede the chunk's stale rows: such a
chunk is not kept (``read_chunks``' ``unseen``), and the transactions no read has seen yet are
carried to the next window.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_cdc.cdc.reading.incremental_run import IncrementalRun
from airflow_provider_cdc.cdc.sources.postgres.chunks import PgChunkPositions
from airflow_provider_cdc.cdc.sources.postgres.incremental import IncrementalState, XidSnapshot
from airflow_provider_cdc.cdc.sources.postgres.spec import PostgresJobSpec
from airflow_provider_cdc.cdc.sources.postgres.tables import TableInfo, TableRef


class InFlightTransactions:
    """The core's :class:`~cdc.incremental_run.Visibility` on PostgreSQL (see module doc)."""

    def __init__(self, baseline: XidSnapshot, carried: tuple[int, ...]):
        self.baseline = baseline
        # Transactions of this window's events that the job's starting snapshot did not see, per table.
        self._in_flight: dict[TableRef, set[int]] = {}
        known = np.array(carried, dtype=np.int64)
        # Once the job's starting snapshot sees a carried transaction, every later read does.
        self._unresolved = {int(x) for x in known[~baseline.sees(known)]} if len(known) else set()
        self._resolved: set[int] = set()

    def note(self, ref: TableRef, batch: pa.RecordBatch) -> None:
        xids = pc.struct_field(batch.column("source"), "txId").fill_null(0).to_numpy(zero_copy_only=False)
        xids = np.unique(xids[xids != 0] & 0xFFFFFFFF)
        hit = xids[~self.baseline.sees(xids)] if len(xids) else xids
        if len(hit):
            self._in_flight.setdefault(ref, set()).update(int(x) for x in hit)

    def unseen(self, ref: TableRef, snapshot: str | None) -> bool:
        xids = sorted(self._in_flight.get(ref, set()) | self._unresolved)
        if not xids or snapshot is None:
            return False
        seen = XidSnapshot.parse(snapshot).sees(np.array(xids, dtype=np.int64))
        self._resolved.update(x for x, s in zip(xids, seen) if s)
        return not seen.all()

    def carried(self) -> tuple[int, ...]:
        """This window's and earlier held-back transactions that no chunk read has seen yet."""
        candidates = self._unresolved.union(*self._in_flight.values())
        return tuple(sorted(candidates - self._resolved))


def incremental_run(spec: PostgresJobSpec, tables: dict[TableRef, TableInfo], baseline: XidSnapshot) -> IncrementalRun:
    state: IncrementalState = spec.incremental or IncrementalState()
    captured: dict[TableRef, Any] = {ref: t for ref, t in tables.items() if ref in spec.tables}
    return IncrementalRun(
        state=state,
        tables=captured,
        topic_prefix=spec.topic_prefix,
        signal_table=spec.signal_table,
        options=spec.options,
        positions=PgChunkPositions(),
        visibility=InFlightTransactions(baseline, state.unresolved_xids),
    )
