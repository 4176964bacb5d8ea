"""Runs a DAG the way a scheduler's worker runs its tasks, and leaves the task logs where it would.

``dag.test()`` runs each task inside the calling process, so what a task's subprocesses write to
standard error (Spark's JVM, for one) never passes through Airflow's log pipeline. Here
``dag.test(use_executor=True)`` hands every task to :class:`SupervisingExecutor`, which runs it
like the LocalExecutor's workers do: the task SDK's supervisor forks the task process, forwards
its standard output (INFO) and standard error (ERROR) into the task log, and writes that log as
JSON lines under ``$AIRFLOW_HOME/logs/dag_id=…/run_id=…/task_id=…/attempt=1.log``. The only
difference from a deployment is that the supervisor talks to the execution API in-process, as
``dag.test()`` does, instead of over HTTP to an API server.

``python -m tests.support.supervised <dag_id> <logical date>`` with ``AIRFLOW_HOME``,
``AIRFLOW__CORE__DAGS_FOLDER`` and ``AIRFLOW__CORE__EXECUTOR=tests.support.supervised.SupervisingExecutor``
set: initialises the metadata DB, runs the DAG once and prints ``{"state": ..., "tasks": {...}}``.
Run it in a fresh interpreter: a process that already runs a Spark JVM would hand it to the tasks
it forks.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from airflow.executors.base_executor import BaseExecutor
from airflow.utils.state import TaskInstanceState


class SupervisingExecutor(BaseExecutor):
    """Runs each queued task to completion with the task SDK's ``supervise_task`` (one at a time)."""

    is_local = True

    def _process_workloads(self, workload_list: Sequence[Any]) -> None:
        from airflow.sdk.execution_time.supervisor import InProcessTestSupervisor, supervise_task

        for workload in workload_list:
            self.queued_tasks.pop(workload.key, None)
            self.running.add(workload.key)
            exit_code = supervise_task(
                ti=workload.ti,
                bundle_info=workload.bundle_info,
                dag_rel_path=workload.dag_rel_path,
                token=workload.token,
                log_path=workload.log_path,
                client=InProcessTestSupervisor._api_client(dag=True),
            )
            state = TaskInstanceState.SUCCESS if exit_code == 0 else TaskInstanceState.FAILED
            self.change_state(workload.key, state)

    def sync(self) -> None:
        pass

    def end(self) -> None:
        pass

    def terminate(self) -> None:
        pass


def main(argv: list[str]) -> int:
    import os

    import pendulum
    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils import db
    from airflow.utils.session import create_session

    dag_id, logical_date = argv[1], pendulum.parse(argv[2])
    db.initdb()
    bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    assert dag_id in bag.dags, bag.import_errors
    run = bag.dags[dag_id].test(logical_date=logical_date, run_after=logical_date, use_executor=True)
    with create_session() as session:
        tasks = {ti.task_id: str(ti.state) for ti in run.get_task_instances(session=session)}
    print(json.dumps({"state": str(run.state), "tasks": tasks}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
