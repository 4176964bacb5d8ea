"""A real Spark standalone cluster on loopback: one master and two one-core workers, started
from the installed pyspark's own ``spark-class`` (nothing downloaded), with a
``spark-defaults.conf`` the way an installation configures a cluster (the Python executors run,
the package shipped as ``--py-files``, the event log on)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import pyspark

from airflow_provider_cdc.testing.postgres_cluster import _free_port

ROOT = Path(__file__).resolve().parents[2]
SPARK_HOME = Path(pyspark.__file__).parent


class SparkCluster:
    def __init__(self, workdir: Path, *, workers: int = 2):
        self.workdir = Path(workdir)
        self.workers = workers
        self.port = _free_port()
        self.ui_port = _free_port()
        self.event_log = self.workdir / "events"
        self.conf_dir = self.workdir / "conf"
        self.processes: list[subprocess.Popen] = []

    @property
    def master(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """The environment of spark-submit: where spark-defaults.conf lives, loopback only."""
        return {"SPARK_CONF_DIR": str(self.conf_dir), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_HOME": str(SPARK_HOME)}

    def start(self, timeout: float = 90) -> SparkCluster:
        for d in (self.workdir, self.event_log, self.conf_dir):
            d.mkdir(parents=True, exist_ok=True)
        self._write_defaults(self._package_zip())
        self._spawn(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--webui-port",
            str(self.ui_port),
        )
        for n in range(self.workers):
            self._spawn(
                f"worker{n}",
                "org.apache.spark.deploy.worker.Worker",
                self.master,
                "--host",
                "127.0.0.1",
                "--cores",
                "1",
                "--memory",
                "1g",
                "--work-dir",
                str(self.workdir / f"work{n}"),
                "--webui-port",
                str(_free_port()),
            )
        deadline = time.monotonic() + timeout
        while True:
            status = self.status()
            if status and sum(w["state"] == "ALIVE" for w in status.get("workers", [])) == self.workers:
                return self
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.processes):
                self.stop()
                raise AssertionError(f"the Spark cluster did not start:\n{self.logs()}")
            time.sleep(0.5)

    def status(self) -> dict | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as response:
                return json.load(response)
        except (OSError, ValueError):  # not up yet, or a page still being served empty
            return None

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self.processes.clear()

    def logs(self, tail: int = 30) -> str:
        out = []
        for path in sorted(self.workdir.glob("*.log")):
            out.append(f"--- {path.name} ---\n" + "\n".join(path.read_text(errors="replace").splitlines()[-tail:]))
        return "\n".join(out)

    def task_executors(self) -> dict[str, set[str]]:
        """From the applications' event logs: for each application, the executors its tasks ran on."""
        found: dict[str, set[str]] = {}
        for log in self.event_log.iterdir():  # a file per application, or a directory of rolled files
            app = None
            paths = sorted(log.iterdir()) if log.is_dir() else [log]
            lines = [line for path in paths if path.is_file() for line in path.read_text(errors="replace").splitlines()]
            for line in lines:
                event = json.loads(line)
                if event["Event"] == "SparkListenerApplicationStart":
                    app = event.get("App Name")
                elif event["Event"] == "SparkListenerTaskEnd":
                    found.setdefault(app or log.name, set()).add(event["Task Info"]["Executor ID"])
        return found

    def _spawn(self, name: str, main_class: str, *args: str) -> None:
        with open(self.workdir / f"{name}.log", "ab") as log:
            self.processes.append(
                subprocess.Popen(
                    [str(SPARK_HOME / "bin" / "spark-class"), main_class, *args],
                    env={**os.environ, **self.env},
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    def _package_zip(self) -> Path:
        """The package as a user ships it to executors: a zip for --py-files."""
        target = self.workdir / "airflow_provider_cdc.zip"
        with zipfile.ZipFile(target, "w") as archive:
            for path in (ROOT / "airflow_provider_cdc").rglob("*"):
                if path.is_file() and "__pycache__" not in path.parts:
                    archive.write(path, path.relative_to(ROOT))
        return target

    def _write_defaults(self, package: Path) -> None:
        settings = {
            "spark.pyspark.python": sys.executable,  # executors' Python: the package's dependencies
            "spark.submit.pyFiles": str(package),
            "spark.executor.memory": "512m",
            "spark.driver.memory": "512m",
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": str(self.event_log),
            "spark.eventLog.compress": "false",  # plain JSON lines, read by task_executors()
            "spark.eventLog.rolling.enabled": "false",
            # Start jobs only once both executors registered, so a snapshot can spread.
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s",
        }
        (self.conf_dir / "spark-defaults.conf").write_text("".join(f"{k} {v}\n" for k, v in settings.items()))
