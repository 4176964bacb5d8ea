"""Running DAGs for real with ``dag.test()`` (SQLite metadata DB, tasks in this process)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pendulum

START = pendulum.datetime(2026, 1, 1, tz="UTC")


@dataclass
class DagResult:
    state: str
    tasks: dict[str, str]
    xcom: dict[str, Any]
    errors: dict[str, BaseException] = field(default_factory=dict)

    def error(self, task_id: str) -> str:
        return f"{type(self.errors[task_id]).__name__}: {self.errors[task_id]}"


def register(dag) -> None:
    """Store an inline DAG in the metadata DB (dag.test() only runs serialised DAGs)."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db

    DagBundlesManager().sync_bundles_to_db()
    bag = DagBag(collect_dags=False)
    bag.bag_dag(dag)
    sync_bag_to_db(bag, "dags-folder", None)


def run(
    dag,
    hour: float = 0,
    *,
    errors: dict | None = None,
    conf: dict | None = None,
    run_type: str = "manual",
    with_interval: bool = True,
) -> DagResult:
    """``dag.test()`` of the run at ``START + hour`` (its ``run_after``), as a run of ``run_type``
    (Airflow's own types; ``dag.test()`` itself only makes manual runs), with a logical date and
    data interval unless ``with_interval`` is False (a manual run "now")."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    run_after = START.add(seconds=int(hour * 3600))
    with _runs_of_type(run_type):
        run = dag.test(logical_date=run_after if with_interval else None, run_after=run_after, run_conf=conf)
    tasks, xcom = {}, {}
    with create_session() as session:
        for ti in run.get_task_instances(session=session):
            tasks[ti.task_id] = str(ti.state)
            row = session.scalars(
                XComModel.get_many(run_id=run.run_id, dag_ids=dag.dag_id, task_ids=ti.task_id, key="return_value")
            ).first()
            if row is not None:
                xcom[ti.task_id] = XComModel.deserialize_value(row)
    return DagResult(str(run.state), tasks, xcom, errors if errors is not None else {})


@contextmanager
def _runs_of_type(run_type: str) -> Iterator[None]:
    """Make ``dag.test()`` create its run as ``run_type`` (scheduled, backfill, asset_triggered, ...)
    with the run id Airflow gives that type, by replacing the helper it creates the run with."""
    if run_type == "manual":
        yield
        return
    import airflow.models.dagrun as dagrun_module
    from airflow.models.dagrun import DagRun
    from airflow.utils.state import DagRunState
    from airflow.utils.types import DagRunType
    from sqlalchemy import select

    kind = DagRunType(run_type)
    original = dagrun_module.get_or_create_dagrun

    def create(
        *,
        dag,
        run_id,
        logical_date,
        data_interval,
        run_after,
        conf,
        triggered_by,
        triggering_user_name,
        start_date,
        session,
    ):
        existing = session.scalar(
            select(DagRun).where(DagRun.dag_id == dag.dag_id, DagRun.logical_date == logical_date)
        )
        if existing is not None:  # dag.test() replaces the run of the same date, like the original
            session.delete(existing)
            session.commit()
        return dag.create_dagrun(
            run_id=DagRun.generate_run_id(run_type=kind, logical_date=logical_date, run_after=run_after),
            logical_date=logical_date,
            data_interval=data_interval,
            run_after=run_after,
            conf=conf,
            run_type=kind,
            state=DagRunState.RUNNING,
            triggered_by=triggered_by,
            triggering_user_name=triggering_user_name,
            start_date=start_date or logical_date,
            session=session,
        )

    dagrun_module.get_or_create_dagrun = create
    try:
        yield
    finally:
        dagrun_module.get_or_create_dagrun = original


def failure_recorder(errors: dict):
    def record(context) -> None:
        errors[context["task_instance"].task_id] = context.get("exception")

    return record


def variable(key: str) -> str | None:
    """A Variable as the metadata database holds it. (Outside a task the Task SDK's ``Variable``
    has no API server to ask and answers its default: tests read the database itself.)"""
    from airflow.models import Variable

    return Variable.get(key, default_var=None)


def set_variable(key: str, value: str) -> None:
    """Edit a Variable as a user with Variable rights does in the UI or CLI."""
    from airflow.models import Variable

    Variable.set(key, value)
