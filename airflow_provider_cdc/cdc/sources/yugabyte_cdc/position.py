"""Window positions of the CDC-service source: commit hybrid times, as :class:`YbLsn`.

A stream window holds the transactions whose commit hybrid time ``c`` (``RowMessage.commit_time``,
the raw ``physical µs << 12 | logical`` value) is in ``[from, to)``: the core's rule
(:mod:`cdc.window`). The run fixes its end hybrid time ``E`` at start and the window is
``[from, E + 1)``; the next one starts at ``E + 1``.

**Why no new Position type.** :class:`~..yugabyte.lsn.YbLsn` already is "a YugabyteDB commit
hybrid time": with ``HYBRID_TIME`` slots the logical-replication source's positions are exactly
these numbers (YB's virtual WAL assigns a transaction its commit hybrid time as LSN). The values,
their order, the ``[from, E + 1)`` bound (:func:`~..yugabyte.lsn.window_bound_after`) and the
conversions to time (:func:`~..yugabyte.lsn.ht_to_unix_us`) are the same, so windows and offsets
of this source store ``"source": "yugabytedb"`` and load back through the registry in
:mod:`cdc.positions` with no change to the core. What tells the two captures apart is the
offset's ``connector`` (:mod:`.offset`), which the core already checks. A tablet's own position
(term, index, key, write id) is no window bound (op ids are per tablet and are not in commit order
across tablets); it lives in the offset's tablet checkpoints (:mod:`.checkpoints`).
"""

from __future__ import annotations

from airflow_provider_cdc.cdc.basics.window import Window
from airflow_provider_cdc.cdc.sources.yugabyte.lsn import YbLsn, ht_to_unix_us, window_bound_after

#: The position type of this source's windows and offsets (a commit hybrid time).
CommitHt = YbLsn


def commit_range(window: Window) -> tuple[int, int]:
    """``(first, last)`` commit hybrid times a stream window holds: ``[from, to)`` is
    ``from .. to - 1``. An empty window (``from == to``) gives ``last < first``."""
    if window.from_lsn is None or window.to_lsn is None:
        raise ValueError(f"{window.describe()} has no commit range")
    return int(window.from_lsn), int(window.to_lsn) - 1


def commit_ts_ms(commit_ht: int) -> int:
    """A commit hybrid time as epoch milliseconds (``source.ts_ms``, transaction ``ts_ms``)."""
    return ht_to_unix_us(commit_ht) // 1000


__all__ = ["CommitHt", "YbLsn", "commit_range", "commit_ts_ms", "window_bound_after"]
