"""Running DAGs for real with ``dag.test()`` (SQLite metadata DB, tasks in this process)."""

from __future__ import annotations

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


def run(dag, hour: int = 0, *, errors: dict | None = None, conf: dict | None = None) -> DagResult:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    logical_date = START.add(hours=hour)
    run = dag.test(logical_date=logical_date, run_after=logical_date, run_conf=conf)
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


def failure_recorder(errors: dict):
    def record(context) -> None:
        errors[context["task_instance"].task_id] = context.get("exception")

    return record
