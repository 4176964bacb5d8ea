"""A real Airflow deployment for end-to-end tests: scheduler, DAG processor, API server and
triggerer as separate processes (LocalExecutor), with their own AIRFLOW_HOME and a PostgreSQL
metadata database, the way a user runs Airflow. Tests drive it through its CLI and REST API.

Nothing here is mocked: runs are created by the scheduler (schedule and catchup), by the REST
API (manual runs, with or without a logical date), by ``airflow backfill create`` and cleared by
``airflow tasks clear``; tasks run in the executor's own processes.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from airflow_provider_cdc.testing.postgres_cluster import PostgresCluster, _free_port

ROOT = Path(__file__).resolve().parents[2]
COMPONENTS = ("scheduler", "dag-processor", "api-server", "triggerer")
FINISHED = {"success", "failed"}


class DeploymentError(AssertionError):
    pass


class AirflowDeployment:
    """One Airflow installation: ``start()``, drive it, ``stop()`` (also as a context manager)."""

    def __init__(
        self,
        home: Path,
        dags_folder: Path,
        metadata: PostgresCluster,
        *,
        env: dict[str, str] | None = None,
        database: str | None = None,
    ):
        self.home = Path(home)
        self.dags_folder = Path(dags_folder)
        self.metadata = metadata
        self.database = database or f"airflow_{secrets.token_hex(4)}"
        self.port = _free_port()
        self.log_ports = (_free_port(), _free_port())
        self.extra_env = dict(env or {})
        self.processes: dict[str, subprocess.Popen] = {}
        self._client: Any = None

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def metadata_uri(self) -> str:
        from urllib.parse import quote

        cluster = self.metadata
        password = quote(cluster.password, safe="")
        return f"postgresql+psycopg2://{cluster.superuser}:{password}@{cluster.host}:{cluster.port}/{self.database}"

    @property
    def env(self) -> dict[str, str]:
        airflow_bin = str(Path(sys.executable).parent)
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith("AIRFLOW") and key not in ("PYTEST_CURRENT_TEST",)
        }
        env.update(
            {
                "PATH": f"{airflow_bin}:{env.get('PATH', '')}",
                "AIRFLOW_HOME": str(self.home),
                "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
                "AIRFLOW__CORE__PARALLELISM": "4",
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{self.port}/execution/",
                "AIRFLOW__CORE__FERNET_KEY": _FERNET_KEY,
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.metadata_uri,
                "AIRFLOW__API__PORT": str(self.port),
                "AIRFLOW__API__HOST": "127.0.0.1",
                "AIRFLOW__API__WORKERS": "1",
                "AIRFLOW__API_AUTH__JWT_SECRET": _JWT_SECRET,
                "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
                "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "5",
                "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
                "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.5",
                "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": "300",
                "AIRFLOW__SCHEDULER__DAG_STALE_NOT_SEEN_DURATION": "3600",
                "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
                "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(self.log_ports[0]),
                "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(self.log_ports[1]),
                "SPARK_LOCAL_IP": "127.0.0.1",
                # This checkout first (also when the package is installed from another one).
                "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            }
        )
        env.update(self.extra_env)
        return env

    def start(self, timeout: float = 240) -> AirflowDeployment:
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "components").mkdir(exist_ok=True)
        self.metadata.create_database(self.database)
        self.cli("db", "migrate", timeout=300)
        for name in COMPONENTS:
            with open(self.home / "components" / f"{name}.log", "ab") as log:  # the child keeps its own copy
                self.processes[name] = subprocess.Popen(
                    ["airflow", name],
                    env=self.env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self.home,
                    start_new_session=True,  # stop() signals the component and its children
                )
        self._wait(lambda: self._api_up(), timeout, "the API server to answer")
        return self

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        for process in self.processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        for process in self.processes.values():
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self.processes.clear()

    def __enter__(self) -> AirflowDeployment:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def check_alive(self) -> None:
        dead = {n: p.returncode for n, p in self.processes.items() if p.poll() is not None}
        if dead:
            raise DeploymentError(f"Airflow components exited: {dead}\n{self.component_logs(tail=40)}")

    def component_logs(self, tail: int = 30) -> str:
        out = []
        for name in COMPONENTS:
            path = self.home / "components" / f"{name}.log"
            if path.exists():
                lines = path.read_text(errors="replace").splitlines()[-tail:]
                out.append(f"--- {name} ---\n" + "\n".join(lines))
        return "\n".join(out)

    # -- CLI and REST ------------------------------------------------------------------------------

    def cli(self, *args: str, timeout: float = 180, check: bool = True) -> subprocess.CompletedProcess:
        self.home.mkdir(parents=True, exist_ok=True)
        result = subprocess.run(
            ["airflow", *args], env=self.env, capture_output=True, text=True, timeout=timeout, cwd=self.home
        )
        if check and result.returncode != 0:
            raise DeploymentError(f"airflow {' '.join(args)} failed ({result.returncode}):\n{result.stderr[-4000:]}")
        return result

    @property
    def client(self):
        import httpx

        if self._client is None:
            self._client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=30)
        return self._client

    def api(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.client.request(method, f"/api/v2{path}", **kwargs)
        if response.status_code >= 400:
            raise DeploymentError(f"{method} {path}: {response.status_code} {response.text[:2000]}")
        return response.json() if response.content else None

    def _api_up(self) -> bool:
        self.check_alive()
        try:
            return self.client.get("/api/v2/monitor/health").status_code == 200
        except Exception:
            return False

    # -- DAGs and runs -----------------------------------------------------------------------------

    def wait_for_dag(self, dag_id: str, timeout: float = 180) -> None:
        def parsed() -> bool:
            self.check_alive()
            response = self.client.get(f"/api/v2/dags/{dag_id}")
            return response.status_code == 200

        self._wait(parsed, timeout, f"DAG {dag_id!r} to be parsed")
        errors = self.api("GET", "/importErrors")
        if errors.get("import_errors"):
            raise DeploymentError(f"DAG import errors: {errors['import_errors']}")

    def unpause(self, dag_id: str) -> None:
        self.api("PATCH", f"/dags/{dag_id}", json={"is_paused": False})

    def pause(self, dag_id: str) -> None:
        self.api("PATCH", f"/dags/{dag_id}", json={"is_paused": True})

    def trigger(self, dag_id: str, *, logical_date: str | None = None, conf: dict | None = None) -> str:
        """A manual run through the REST API (``logical_date`` None: a run without a data interval)."""
        body: dict[str, Any] = {"logical_date": logical_date, "conf": conf or {}}
        return self.api("POST", f"/dags/{dag_id}/dagRuns", json=body)["dag_run_id"]

    def runs(self, dag_id: str) -> list[dict[str, Any]]:
        return self.api("GET", f"/dags/{dag_id}/dagRuns", params={"order_by": "run_after", "limit": 100})["dag_runs"]

    def run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        return self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}")

    def wait_for_runs(self, dag_id: str, count: int, timeout: float = 600, *, finished: bool = True) -> list[dict]:
        """Wait until at least ``count`` runs exist and (``finished``) none is still active."""

        def done() -> list[dict] | None:
            self.check_alive()
            runs = self.runs(dag_id)
            if len(runs) < count:
                return None
            if finished and any(r["state"] not in FINISHED for r in runs):
                return None
            return runs

        return self._wait(done, timeout, f"{count} finished run(s) of {dag_id!r}")

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float = 600) -> dict[str, Any]:
        def done() -> dict | None:
            self.check_alive()
            run = self.run(dag_id, run_id)
            return run if run["state"] in FINISHED else None

        return self._wait(done, timeout, f"run {run_id!r} of {dag_id!r} to finish")

    def task_instances(self, dag_id: str, run_id: str) -> dict[str, dict[str, Any]]:
        found = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]
        return {ti["task_id"]: ti for ti in found}

    def states(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        return {task: ti["state"] for task, ti in self.task_instances(dag_id, run_id).items()}

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value") -> Any:
        response = self.client.get(
            f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/{key}",
            params={"deserialize": True},
        )
        if response.status_code == 404:
            return None
        if response.status_code >= 400:
            raise DeploymentError(f"xcom {task_id}: {response.status_code} {response.text[:500]}")
        value = response.json()["value"]
        return json.loads(value) if isinstance(value, str) and value[:1] in "{[" else value

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int) -> list[dict[str, Any]]:
        """The task's log through the REST API, as structured events (``event``, ``level``, ...)."""
        response = self.client.get(
            f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}",
            params={"full_content": True},
            headers={"Accept": "application/json"},
        )
        if response.status_code >= 400:
            raise DeploymentError(f"log of {task_id}: {response.status_code} {response.text[:500]}")
        content = response.json()["content"]
        return [c for c in content if isinstance(c, dict)] if isinstance(content, list) else []

    def log_text(self, dag_id: str, run_id: str, task_id: str, try_number: int) -> str:
        return "\n".join(
            f"{e.get('level', '')} {e.get('event', '')}" for e in self.task_log(dag_id, run_id, task_id, try_number)
        )

    def clear(self, dag_id: str, run_id: str, task_ids: Iterable[str] | None = None) -> None:
        """Clear a run's task instances (Airflow's "Clear"), as a user does in the UI."""
        body: dict[str, Any] = {"dry_run": False, "dag_run_id": run_id, "only_failed": False, "reset_dag_runs": True}
        if task_ids is not None:
            body["task_ids"] = list(task_ids)
        self.api("POST", f"/dags/{dag_id}/clearTaskInstances", json=body)

    def backfill(self, dag_id: str, from_date: str, to_date: str, *, reprocess: str = "completed") -> dict:
        """``airflow backfill create`` through the REST API (same code path as the CLI)."""
        return self.api(
            "POST",
            "/backfills",
            json={
                "dag_id": dag_id,
                "from_date": from_date,
                "to_date": to_date,
                "run_backwards": False,
                "dag_run_conf": {},
                "reprocess_behavior": reprocess,
                "max_active_runs": 1,
            },
        )

    # -- helpers -----------------------------------------------------------------------------------

    def _wait(self, predicate, timeout: float, what: str, interval: float = 1.0):
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise DeploymentError(f"timed out after {timeout:.0f}s waiting for {what}\n{self.component_logs()}")
            time.sleep(interval)


# Fixed keys of a throwaway test deployment (every component must share them).
_FERNET_KEY = "7Y4Jxpb1FHHVJpbsTNRANvNrXjzBdJnPFcfBUBe8BJw="
_JWT_SECRET = "cdc-test-deployment-jwt-secret-not-for-production"
