"""YugabyteCdcStandIn: YugabyteDB's CDC service (masters and tablet servers) over a real PostgreSQL 15.

The test-side handle: starts the service process (service.py), says where its masters and
tablet servers listen, and drives its faults through the control pipe. Tests write to the
database directly (:meth:`connect`); the product reads through its own RPC client.
See docs/yugabytedb-cdc-standin.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from tests.support.yugabyte.journal import real_conninfo
from tests.support.yugabyte.standin import drop_database, stop_service

from .cluster import Settings

if TYPE_CHECKING:
    from airflow_provider_cdc.testing.postgres_cluster import PostgresCluster

_ROOT = Path(__file__).resolve().parents[3]


class StandInError(RuntimeError):
    """A control call the service refused (its message and the service-side traceback)."""


class YugabyteCdcStandIn:
    """Masters at :attr:`master_addresses`, tablet servers at :attr:`tserver_addresses`."""

    def __init__(self, cluster: PostgresCluster, database: str = "yugabyte", **settings: Any) -> None:
        self.cluster = cluster
        self.database = database
        heartbeat = settings.pop("rpc_heartbeat_interval", 1.0)
        # TLS on the RPC ports: {"cert_file", "key_file", "allow_insecure_connections"} (YB's
        # default lets plaintext clients in too); None: plaintext only, as a YB cluster without TLS.
        self.rpc_tls: dict | None = settings.pop("rpc_tls", None)
        self.settings = Settings(**settings)
        self.rpc_heartbeat_interval = heartbeat
        self._process: subprocess.Popen | None = None
        self._info: dict = {}
        self._lock = threading.Lock()

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> YugabyteCdcStandIn:
        with self.cluster.connect() as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (self.database,)).fetchone()
        if not exists:
            self.cluster.create_database(self.database)
        config = {
            "cluster": {
                "host": self.cluster.host,
                "port": self.cluster.port,
                "superuser": self.cluster.superuser,
                "password": self.cluster.password,
            },
            "database": self.database,
            "settings": asdict(self.settings),
            "rpc_heartbeat_interval": self.rpc_heartbeat_interval,
            "rpc_tls": self.rpc_tls,
        }
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")]))}
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.yugabyte_cdc.service", json.dumps(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=_ROOT,
            env=env,
            text=True,
        )
        line = self._process.stdout.readline()
        if not line.startswith("{"):
            self._process.kill()
            raise RuntimeError(f"the YugabyteDB CDC stand-in did not start (exit {self._process.wait()})")
        self._info = json.loads(line)
        return self

    def stop(self, drop: bool = True) -> None:
        stop_service(self._process)
        self._process = None
        if drop:
            drop_database(self.cluster, self.database)

    def __enter__(self) -> YugabyteCdcStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- where clients connect ----------------------------------------------------------------

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def master_addresses(self) -> list[tuple[str, int]]:
        return [(self.host, port) for port in self._info["masters"]]

    @property
    def tserver_addresses(self) -> list[tuple[str, int]]:
        return [(self.host, port) for port in self._info["tservers"]]

    @property
    def tserver_uuids(self) -> list[str]:
        return self._info["tserver_uuids"]

    @property
    def master_addresses_flag(self) -> str:
        """``database.master.addresses`` as the connector takes it."""
        return ",".join(f"{h}:{p}" for h, p in self.master_addresses)

    @property
    def namespace_id(self) -> str:
        return self._info["namespace_id"]

    def real_conninfo(self) -> str:
        return real_conninfo(self.cluster, self.database)

    def connect(self, *, autocommit: bool = True) -> psycopg.Connection:
        """Straight to the PostgreSQL database the stand-in serves (the tests' writes)."""
        return psycopg.connect(self.real_conninfo(), autocommit=autocommit)

    # -- controls -------------------------------------------------------------------------------

    def wait_caught_up(self, timeout: float = 15.0) -> int:
        """Waits until everything committed so far is in the tablet logs; returns the safe time."""
        return self._control("wait_caught_up", timeout=timeout)

    def create_stream(
        self,
        record_type: str = "CHANGE",
        checkpoint_type: str = "EXPLICIT",
        tables: list[str] | None = None,
        database: str | None = None,
        consistent_snapshot: bool = True,
    ) -> str:
        """A DB stream id (with its consistent snapshot taken now, unless ``consistent_snapshot``
        is False: then every tablet is -1.-1 and "expired" until SetCDCCheckpoint); ``database``
        names another database of the cluster for a stream this stand-in knows but does not serve."""
        return self._control(
            "create_stream",
            record_type=record_type,
            checkpoint_type=checkpoint_type,
            tables=tables,
            database=database,
            consistent_snapshot=consistent_snapshot,
        )

    def tablets(self, table: str) -> list[dict]:
        """The table's tablets (split parents included): ids, hash ranges, leader, children."""
        return self._control("tablets", table=table)

    def hash_code(self, value: object) -> int:
        """yb_hash_code of a hash-column value (as text)."""
        return self.hash_codes([value])[0]

    def hash_codes(self, values: list[object]) -> list[int]:
        return self._control("hash_codes", values=[str(v) for v in values])

    def tablet_for(self, table: str, value: object) -> str:
        """The active tablet a hash-column value lives in."""
        code = self.hash_code(value)
        return next(t["tablet_id"] for t in self.tablets(table) if not t["children"] and t["start"] <= code < t["end"])

    def move_leader(self, tablet_id: str, to: int | None = None) -> int:
        """Moves the tablet's leadership (and, with one replica, the tablet) to another tablet server."""
        return self._control("move_leader", tablet_id=tablet_id, to=to)

    def split(self, tablet_id: str) -> list[str]:
        """Splits a tablet after everything committed so far; returns the two children."""
        return self._control("split", tablet_id=tablet_id)

    def move_master_leader(self, to: int | None = None) -> int:
        return self._control("move_master_leader", to=to)

    def age(self, stream_id: str, ms: int, tablet_id: str | None = None) -> None:
        """Moves the stream's last poll on a tablet (or all) ``ms`` into the past (expiry)."""
        self._control("age", stream_id=stream_id, ms=ms, tablet_id=tablet_id)

    def set(self, **settings: Any) -> dict:
        """Changes settings of the running service (retention_ms, page sizes, proxy_to_leader)."""
        return self._control("set", **settings)

    def fail_next(self, method: str, message: str, **where: Any) -> None:
        """Makes the next call(s) of ``method`` fail: ``rpc_code=`` (ErrorStatusPB name) or
        ``service_code=`` / ``status_code=`` (CDCErrorPB or MasterErrorPB / AppStatusPB names),
        optionally only for ``tablet_id=`` / ``server=``, ``times=`` calls."""
        self._control("fail_next", method=method, message=message, **where)

    def state(self, stream_id: str, tablet_id: str) -> dict:
        """The stream's cdc_state row for a tablet (checkpoint, snapshot key, expiry, ...)."""
        return self._control("state", stream_id=stream_id, tablet_id=tablet_id)

    def _control(self, op: str, **args: Any) -> Any:
        assert self._process is not None, "start() first"
        with self._lock:
            self._process.stdin.write(json.dumps({"op": op, "args": args}) + "\n")
            self._process.stdin.flush()
            line = self._process.stdout.readline()
        if not line:
            raise StandInError(f"the stand-in exited (code {self._process.poll()})")
        reply = json.loads(line)
        if "error" in reply:
            raise StandInError(f"{reply['error']}\n{reply.get('trace', '')}")
        return reply["ok"]


def standin_for(request, cluster: PostgresCluster, **settings: Any):
    """A fresh stand-in database named after the test (or module), dropped afterwards."""
    node = request.node
    name = getattr(node, "originalname", None) or node.name
    readable = "".join(ch if ch.isalnum() else "_" for ch in name.lower())[:28]
    digest = hashlib.sha1(node.nodeid.encode()).hexdigest()[:6]
    standin = YugabyteCdcStandIn(cluster, f"ybc_{readable}_{digest}", **settings).start()
    try:
        yield standin
    finally:
        standin.stop()


def airflow_connection(standin: YugabyteCdcStandIn, **extra: Any) -> str:
    """The stand-in as an Airflow ``yugabytedb_cdc`` connection (JSON for ``AIRFLOW_CONN_<ID>``):
    its YSQL side is the PostgreSQL database, its extra names the stand-in's masters. The RPC
    ports are plaintext, so the connection says so explicitly (``rpc_sslmode: disable``: the
    product's default is TLS); ``extra`` overrides or adds extras (None removes one)."""
    extras = {"sslmode": "disable", "master_addresses": standin.master_addresses_flag, "rpc_sslmode": "disable"}
    extras.update(extra)
    return json.dumps(
        {
            "conn_type": "yugabytedb_cdc",
            "host": standin.host,
            "port": standin.cluster.port,
            "schema": standin.database,
            "login": standin.cluster.superuser,
            "password": standin.cluster.password,
            "extra": {k: v for k, v in extras.items() if v is not None},
        }
    )
