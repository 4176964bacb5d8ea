"""One call that wires a capture's tasks the way every capture DAG needs them.

``capture_task_group(capture, state_path=...)`` adds, inside a task group::

    setup >> snapshot >> [interval_complete] >> capture_window >> [current_state, <health>]

with the settings a hand-wired DAG has to get right: the window runs after a snapshot task that
is skipped once the snapshot exists (``none_failed``), the sources whose windows end at the
run's interval (SQL Server, YugabyteDB) wait for the server to pass that time before the window
and bound the window there, and the health check runs even when the window failed
(``all_done``), because a failing window is exactly when the log or stream is at risk. The DAG
must run one run at a time (``max_active_runs=1``): the group refuses another value at parse,
rather than leave runs to queue on the capture lock.

The operators stay public for other shapes (several captures in one DAG, a maintenance DAG,
a window without a snapshot task): this is only their common wiring.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow_provider_cdc.captures.base import Capture
from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.utils.runs import RUN_END


@dataclass(frozen=True)
class _SourceTasks:
    """What differs per source: its health check, and whether its windows end at the interval."""

    health_module: str
    health_class: str
    health_task_id: str
    interval_bounded: bool


# Keyed by the capture class's name (subclasses are looked up along their MRO), so this module
# imports no source at parse. A new source adds its row here (docs/architecture.md, "A fifth source").
_SOURCES: dict[str, _SourceTasks] = {
    "YugabyteCdcServiceCapture": _SourceTasks(
        "airflow_provider_cdc.operators.yugabyte_health", "YugabyteCdcStreamHealthOperator", "stream_health", True
    ),
    "YugabyteCapture": _SourceTasks(
        "airflow_provider_cdc.operators.yugabyte_health", "YugabyteCdcSlotHealthOperator", "slot_health", True
    ),
    "SqlServerCapture": _SourceTasks(
        "airflow_provider_cdc.operators.sqlserver_health",
        "SqlServerCdcRetentionHealthOperator",
        "retention_health",
        True,
    ),
    "PostgresCapture": _SourceTasks(
        "airflow_provider_cdc.operators.slot_maintenance", "PostgresCdcSlotHealthOperator", "slot_health", False
    ),
}


def _source_tasks(capture: Capture) -> _SourceTasks:
    for cls in type(capture).__mro__:
        if cls.__name__ in _SOURCES:
            return _SOURCES[cls.__name__]
    raise CdcConfigurationError(
        f"capture_task_group does not know the source of {type(capture).__name__}; wire its operators "
        "by hand (docs/operators.md)"
    )


def capture_task_group(
    capture: Capture,
    *,
    state_path: str | None = None,
    group_id: str | None = None,
    wait_for_interval: bool | None = None,
    health: bool = True,
    sensor_kwargs: Mapping[str, Any] | None = None,
    window_kwargs: Mapping[str, Any] | None = None,
    state_kwargs: Mapping[str, Any] | None = None,
    health_kwargs: Mapping[str, Any] | None = None,
) -> Any:
    """Add a capture's tasks to the DAG being defined, in a task group; return the group.

    :param capture: the capture (any source)
    :param state_path: where the current-state tables go; ``None``: no ``current_state`` task
    :param group_id: the task group's id (default ``cdc_<topic_prefix>``); the tasks' ids are
        ``<group_id>.setup``, ``.snapshot``, ``.interval_complete``, ``.capture_window``,
        ``.current_state`` and the source's health task (``.slot_health``, ``.retention_health``,
        ``.stream_health``)
    :param wait_for_interval: add a sensor that waits until the source has captured everything
        up to the run's end, and end the window there. Default: on for the sources whose windows
        end at a time (SQL Server, YugabyteDB), off for PostgreSQL (whose window ends at the
        slot's position when it runs; turning it on waits for pending WAL instead)
    :param health: add the source's health check
    :param sensor_kwargs: extra arguments of the sensor (default: reschedule mode, poke every
        30 s, time out after an hour; ``deferrable=True`` waits in the triggerer)
    :param window_kwargs: extra arguments of the window operator (e.g. ``signals``)
    :param state_kwargs: extra arguments of the current-state operator (e.g. ``tables``)
    :param health_kwargs: extra arguments of the health operator (e.g. thresholds)
    """
    from airflow.sdk import TaskGroup

    from airflow_provider_cdc.operators.current_state import CdcCurrentStateOperator
    from airflow_provider_cdc.operators.setup import CdcSetupOperator
    from airflow_provider_cdc.operators.snapshot import CdcSnapshotOperator
    from airflow_provider_cdc.operators.window import CdcWindowOperator
    from airflow_provider_cdc.sensors.cdc import CdcChangesSensor

    if not isinstance(capture, Capture):
        raise CdcConfigurationError(f"capture must be a capture object, got {type(capture).__name__}")
    source = _source_tasks(capture)
    waits = source.interval_bounded if wait_for_interval is None else wait_for_interval
    with TaskGroup(group_id=group_id or f"cdc_{capture.topic_prefix}") as group:
        _check_one_run_at_a_time(group.dag)
        setup = CdcSetupOperator(task_id="setup", capture=capture)
        snapshot = CdcSnapshotOperator(task_id="snapshot", capture=capture)
        upstream: Any = setup >> snapshot
        window_args = dict(window_kwargs or {})
        if waits:
            sensor_args: dict[str, Any] = {"mode": "reschedule", "poke_interval": 30, "timeout": 3600}
            if source.interval_bounded:  # the sensor's default wait_until is the run's end too
                window_args.setdefault("upto_time", RUN_END)
            sensor_args.update(sensor_kwargs or {})
            # After a snapshot task that is skipped once the snapshot exists.
            sensor_args.setdefault("trigger_rule", "none_failed")
            upstream = upstream >> CdcChangesSensor(task_id="interval_complete", capture=capture, **sensor_args)
        window = CdcWindowOperator(task_id="capture_window", capture=capture, **window_args)
        upstream >> window
        if state_path is not None:
            window >> CdcCurrentStateOperator(
                task_id="current_state", capture=capture, state_path=state_path, **dict(state_kwargs or {})
            )
        if health:
            window >> _health_operator(source)(
                task_id=source.health_task_id,
                capture=capture,
                **{"trigger_rule": "all_done", **dict(health_kwargs or {})},
            )
    return group


def _health_operator(source: _SourceTasks) -> Any:
    import importlib

    # A fixed module of this package from the table above, never a name from configuration.
    return getattr(importlib.import_module(source.health_module), source.health_class)


def _check_one_run_at_a_time(dag: Any) -> None:
    if dag is None:
        raise CdcConfigurationError("capture_task_group must be called inside a DAG (`with DAG(...):`)")
    if dag.max_active_runs != 1:
        raise CdcConfigurationError(
            f"DAG {dag.dag_id!r} has max_active_runs={dag.max_active_runs}; a capture's windows must run one "
            "at a time (each continues from the offset the previous one saved), so set max_active_runs=1 on "
            "the DAG."
        )


__all__ = ["RUN_END", "capture_task_group"]
