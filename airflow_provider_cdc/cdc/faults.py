"""Named fault-injection points for the crash-safety tests.

Inert unless ``AIRFLOW_CDC_FAULT`` is set in the environment, as ``<point>:<action>[:<n>]``:
``kill`` sends the process ``SIGKILL`` (a real crash: no cleanup, no ``finally``), ``raise``
raises a transient error, on the ``n``-th time the point is reached (default 1). With
``AIRFLOW_CDC_FAULT_ONCE=<file>`` the fault is armed only while that file exists, and firing
removes it: once across processes (a task's retry runs in a new process). The points sit
on every step boundary of a run; ``tests/integration/test_crash_safety.py`` kills runs at each
of them (and at random moments) and checks that the next run loses and duplicates nothing.

=================================  =============================================================
point                              reached
=================================  =============================================================
``operator.pending_saved``         the window is planned and stored as pending; nothing read yet
``snapshot.exported``              the snapshot's temporary slot exported its snapshot
``snapshot.table_written``         after each snapshot table is written (uncommitted)
``window.streaming``               replication started, nothing decoded yet
``window.chunk_written``           after each chunk of a stream window is written (uncommitted)
``window.read_done``               the window is read and written, not yet committed
``incremental.chunk_staged``       after each incremental snapshot chunk is read and staged
``sink.table_committed``           (Iceberg/Delta sinks) after each dataset's table commit, before
                                   the commit-log entry: the table holds a window the log does not
``sink.committed``                 the commit-log entry is published; the offset is not updated
``operator.offset_saved``          the offset records the window; the slot is not acknowledged
``operator.acknowledged``          the slot is acknowledged; the task has not returned
=================================  =============================================================
"""

from __future__ import annotations

import os
import signal
from collections import Counter

from airflow_provider_cdc.cdc.errors import CdcTransientError

ENV = "AIRFLOW_CDC_FAULT"
ONCE_ENV = "AIRFLOW_CDC_FAULT_ONCE"
_hits: Counter = Counter()


def point(name: str) -> None:
    spec = os.environ.get(ENV)
    if not spec:
        return
    target, _, rest = spec.partition(":")
    if target != name:
        return
    action, _, nth = rest.partition(":")
    _hits[name] += 1
    if _hits[name] != int(nth or 1):
        return
    once = os.environ.get(ONCE_ENV)
    if once:
        try:
            os.unlink(once)  # disarm: exactly one process fires
        except FileNotFoundError:
            return
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise CdcTransientError(f"fault injected at {name}")
