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

In production the variable is unset and a point costs one environment lookup
(``tests/unit/test_faults.py``). It is a test hook that crashes tasks on purpose, never a setting:
a process where it is set logs a WARNING saying so the first time a point is reached, and a value
that is not a spec of a point above is refused (:class:`CdcConfigurationError`: the task fails
without retries) instead of leaving the process armed with nothing.
"""

from __future__ import annotations

import logging
import os
import signal
from collections import Counter

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError, CdcTransientError

log = logging.getLogger(__name__)

ENV = "AIRFLOW_CDC_FAULT"
ONCE_ENV = "AIRFLOW_CDC_FAULT_ONCE"
#: The points of the table above, in the order a run reaches them.
POINTS = (
    "operator.pending_saved",
    "snapshot.exported",
    "snapshot.table_written",
    "window.streaming",
    "window.chunk_written",
    "window.read_done",
    "incremental.chunk_staged",
    "sink.table_committed",
    "sink.committed",
    "operator.offset_saved",
    "operator.acknowledged",
)
ACTIONS = ("kill", "raise")
_hits: Counter = Counter()
_announced: set[str] = set()


def point(name: str) -> None:
    spec = os.environ.get(ENV)
    if not spec:
        return  # production: nothing but this lookup
    target, action, nth = _parse(spec)
    if spec not in _announced:
        _announced.add(spec)
        log.warning(
            "%s=%r: fault injection is armed in this process (a test hook: it will %s the task at %r); "
            "unset it outside the crash-safety tests",
            ENV,
            spec,
            action,
            target,
        )
    if target != name:
        return
    _hits[name] += 1
    if _hits[name] != nth:
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


def _parse(spec: str) -> tuple[str, str, int]:
    """``(point, action, n)`` of an ``AIRFLOW_CDC_FAULT`` value, or the error refusing it."""
    target, _, rest = spec.partition(":")
    action, _, nth = rest.partition(":")
    if target in POINTS and action in ACTIONS and (not nth or (nth.isascii() and nth.isdigit() and int(nth) > 0)):
        return target, action, int(nth or 1)
    raise CdcConfigurationError(
        f"{ENV}={spec!r} is not a fault-injection spec (<point>:<kill|raise>[:<n>], n from 1, point one of "
        f"{', '.join(POINTS)}). It is a test hook that kills or fails tasks on purpose: unset it"
    )
