"""The CDC-service stand-in's process (``python -m tests.support.yugabyte_cdc.service <config>``).

It runs apart from the tests because the product's clients (and the tests' psycopg calls) block
in libpq and socket calls. In it: the YSQL stand-in's journal reader (one real pgoutput slot ->
``yb_standin.journal``), the distributor (journal -> tablet logs), one RPC listener per master
and per tablet server, and a control loop on stdin/stdout (one JSON request per line, one JSON
reply per line; EOF stops everything). See docs/yugabytedb-cdc-standin.md.
"""

from __future__ import annotations

import hashlib
import json
import logging
import ssl
import sys
import time
import traceback
import uuid
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import psycopg

from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol.methods import CDC_SERVICE, MASTER_SERVICE
from tests.support.yugabyte.journal import PUBLICATION, JournalReader, real_conninfo

from . import ids
from .cdc_service import CdcService
from .cluster import Cluster, Fault, Server, Settings
from .distributor import HEARTBEAT_TABLE, Distributor
from .master_service import MasterService
from .rpc_server import RpcFailure, RpcServer
from .schema import INTERNAL_SCHEMAS, capturable_tables, read_table, relfilenodes
from .snapshot import HeldSnapshot, SnapshotReader
from .streams import RECORD_TYPES, Stream

#: The YSQL stand-in's state tables (``yb_standin.journal`` among them), reused unchanged.
JOURNAL_SQL = Path(__file__).resolve().parents[1] / "yugabyte" / "catalog.sql"

log = logging.getLogger(__name__)


class CdcStandInService:
    def __init__(
        self,
        pg,
        database: str,
        settings: Settings,
        rpc_heartbeat_interval: float = 1.0,
        rpc_tls: dict | None = None,
    ) -> None:
        self.pg = pg
        self.database = database
        self.settings = settings
        self.rpc_heartbeat_interval = rpc_heartbeat_interval
        # {"cert_file", "key_file", "allow_insecure_connections"}: the servers' TLS (rpc_server.py)
        self.rpc_tls = rpc_tls
        self.journal_slot = "ybcj_" + hashlib.md5(database.encode()).hexdigest()[:20]
        self.conninfo = real_conninfo(pg, database)
        self.cluster: Cluster | None = None
        self._admin: psycopg.Connection | None = None
        self._servers: list[RpcServer] = []
        self._snapshots: list[HeldSnapshot] = []
        self._journal: JournalReader | None = None
        self._distributor: Distributor | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> CdcStandInService:
        self._admin = psycopg.connect(self.conninfo, autocommit=True)
        self._install()
        oid = self._admin.execute("SELECT oid::int FROM pg_database WHERE datname = current_database()").fetchone()[0]
        cluster = self.cluster = Cluster(self.database, oid, self.settings)
        cdc = CdcService(cluster, SnapshotReader(self.conninfo))
        master = MasterService(cluster)
        for number in range(self.settings.masters):
            server = self._listen(f"master-{number}", MASTER_SERVICE, master.handle, number, "Master")
            cluster.masters.append(Server("master", number, ids.stable_id(self.database, "master", number), *server))
        for number in range(self.settings.tablet_servers):
            server = self._listen(f"tserver-{number}", CDC_SERVICE, cdc.handle, number, "TabletServer")
            cluster.tservers.append(Server("tserver", number, ids.stable_id(self.database, "ts", number), *server))
        self._journal = JournalReader(self.pg, self.database, self.journal_slot).start()
        self._distributor = Distributor(cluster, self.conninfo).start()
        self.wait_caught_up(timeout=30)
        return self

    def stop(self) -> None:
        for server in self._servers:
            server.stop()
        if self._distributor is not None:
            self._distributor.stop()
        if self._journal is not None:
            self._journal.stop()
        for snapshot in self._snapshots:
            snapshot.close()
        if self._admin is not None:
            self._admin.close()

    def _listen(self, name: str, service: str, handle, number: int, role: str) -> tuple[str, int]:
        def dispatch(service_name: str, method: str, body: bytes):
            if service_name != service:
                raise RpcFailure(
                    pb.ErrorStatusPB.ERROR_NO_SUCH_SERVICE,
                    f"Service unavailable: service {service_name} not registered on {role}",
                )
            return handle(number, method, body)

        tls, allow_insecure = None, True
        if self.rpc_tls:
            tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            tls.load_cert_chain(self.rpc_tls["cert_file"], self.rpc_tls["key_file"])
            allow_insecure = bool(self.rpc_tls.get("allow_insecure_connections", True))
        server = RpcServer(
            name,
            dispatch,
            heartbeat_interval=self.rpc_heartbeat_interval,
            tls=tls,
            allow_insecure_connections=allow_insecure,
        ).start()
        self._servers.append(server)
        return server.host, server.port

    def _install(self) -> None:
        conn = self._admin
        with conn.transaction():
            conn.execute("SET LOCAL search_path = pg_catalog")
            conn.execute(JOURNAL_SQL.read_text())
            conn.execute("CREATE SCHEMA IF NOT EXISTS yb_cdc_standin")
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {HEARTBEAT_TABLE} "
                "(one boolean PRIMARY KEY DEFAULT true CHECK (one), n bigint NOT NULL)"
            )
            conn.execute(f"INSERT INTO {HEARTBEAT_TABLE} VALUES (true, 0) ON CONFLICT DO NOTHING")
            # Before images for every record type: the real tables are captured REPLICA IDENTITY FULL.
            conn.execute("DROP EVENT TRIGGER IF EXISTS yb_standin_create_table")
            conn.execute(
                "CREATE EVENT TRIGGER yb_standin_create_table ON ddl_command_end "
                "WHEN TAG IN ('CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO') "
                "EXECUTE FUNCTION yb_standin.on_create_table()"
            )
            for (relid,) in conn.execute(
                "SELECT c.oid::regclass::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE yb_standin.is_user_table(c.oid) AND c.relreplident <> 'f' AND n.nspname <> ALL(%s)",
                (list(INTERNAL_SCHEMAS),),
            ).fetchall():
                conn.execute(f"ALTER TABLE {relid} REPLICA IDENTITY FULL")
            if not conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (PUBLICATION,)).fetchone():
                conn.execute(f"CREATE PUBLICATION {PUBLICATION} FOR ALL TABLES")
        if not conn.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (self.journal_slot,)).fetchone():
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (self.journal_slot,))

    # -- controls -------------------------------------------------------------------------------

    def wait_caught_up(self, timeout: float = 15.0) -> int:
        """Every transaction committed before this call is in the tablet logs when it returns."""
        target = self._admin.execute(f"UPDATE {HEARTBEAT_TABLE} SET n = n + 1 RETURNING n").fetchone()[0]
        deadline = time.monotonic() + timeout
        while self.cluster.heartbeat_seen < target:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the stand-in's logs did not catch up (distributor: {self._distributor.error})")
            time.sleep(0.01)
        return self.cluster.safe_ht

    def create_stream(
        self,
        record_type: str = "CHANGE",
        checkpoint_type: str = "EXPLICIT",
        tables: list[str] | None = None,
        database: str | None = None,
        consistent_snapshot: bool = True,
    ) -> str:
        """``yb-admin create_change_data_stream ysql.<db> <checkpoint_type> <record_type>
        [USE_SNAPSHOT]``: the tables with a primary key now (or the named ones). Without a
        consistent snapshot the master's rows are -1.-1 with no active time (streams.py)."""
        stream_id = uuid.uuid4().hex
        if database is not None and database != self.database:
            return self._foreign_stream(stream_id, database, record_type, checkpoint_type)
        table_ids = [self._register(relid).table_id for relid in self._relids(self._admin, tables)]
        if not consistent_snapshot:
            created_ht = self.wait_caught_up()
            kind = RECORD_TYPES[record_type]
            stream = Stream(
                stream_id,
                self.cluster.namespace_id,
                self.database,
                table_ids,
                kind,
                checkpoint_type,
                created_ht,
                None,
                created_ht,
                consistent_snapshot=False,
            )
            self.cluster.add_stream(stream)
            return stream_id
        snapshot = HeldSnapshot(real_conninfo(self.pg, self.database, replication=True))
        self._snapshots.append(snapshot)
        self.wait_caught_up()  # the heartbeat commits after the consistent point
        snapshot_ht = self._admin.execute(
            "SELECT min(ht) - 1 FROM yb_standin.journal WHERE commit_lsn >= %s::pg_lsn", (snapshot.consistent_point,)
        ).fetchone()[0]
        stream = Stream(
            stream_id,
            self.cluster.namespace_id,
            self.database,
            table_ids,
            RECORD_TYPES[record_type],
            checkpoint_type,
            snapshot_ht,
            snapshot.name,
            created_ht=snapshot_ht,
        )
        self.cluster.add_stream(stream)
        return stream_id

    def _foreign_stream(self, stream_id: str, database: str, record_type: str, checkpoint_type: str) -> str:
        """A stream of another database: its namespace and table ids, no tablets served here."""
        with psycopg.connect(real_conninfo(self.pg, database), autocommit=True) as conn:
            oid = conn.execute("SELECT oid::int FROM pg_database WHERE datname = current_database()").fetchone()[0]
            relids = self._relids(conn, None)
            nodes = relfilenodes(conn, relids)
            table_ids = [ids.table_id(oid, nodes.get(relid, relid)) for relid in relids]
        kind = RECORD_TYPES[record_type]
        stream = Stream(stream_id, ids.namespace_id(oid), database, table_ids, kind, checkpoint_type, 0, None, 0)
        self.cluster.add_stream(stream)
        return stream_id

    def _relids(self, conn: psycopg.Connection, tables: list[str] | None) -> list[int]:
        if tables is not None:
            return [conn.execute("SELECT %s::regclass::oid::int", (name,)).fetchone()[0] for name in tables]
        return capturable_tables(conn)

    def _register(self, relid: int):
        node = relfilenodes(self._admin, [relid]).get(relid)
        with self.cluster.lock:
            current = self.cluster.tables.get(relid)
            if current is not None and node in (None, current.relfilenode):
                return current
        found = read_table(self._admin, relid)
        if found is None:
            raise ValueError(f"table {relid} has no primary key: YugabyteDB's CDC cannot stream it")
        return self.cluster.register_table(relid, *found, node)

    def tablets(self, table: str) -> list[dict]:
        relid = self._admin.execute("SELECT %s::regclass::oid::int", (table,)).fetchone()[0]
        self._register(relid)
        with self.cluster.lock:
            found = self.cluster.tables[relid]
            return [
                {
                    "tablet_id": t.tablet_id,
                    "table_id": found.table_id,
                    "start": t.start,
                    "end": t.end,
                    "leader": t.leader,
                    "replicas": t.replicas,
                    "parent": t.parent,
                    "children": list(t.children) if t.children else None,
                    "term": t.term,
                    "last_index": t.last_index,
                    "split_index": t.split_index,
                }
                for t in self.cluster.tablets_of(found, include_inactive=True)
            ]

    def hash_codes(self, values: list[str]) -> list[int]:
        rows = self._admin.execute(
            "SELECT hashtext(v) & 65535 FROM unnest(%s::text[]) WITH ORDINALITY AS u(v, i) ORDER BY i", (values,)
        ).fetchall()
        return [r[0] for r in rows]

    def move_leader(self, tablet_id: str, to: int | None = None) -> int:
        return self.cluster.move_leader(tablet_id, to)

    def split(self, tablet_id: str) -> list[str]:
        self.wait_caught_up()  # everything committed before the call stays on the parent
        return list(self.cluster.split(tablet_id))

    def move_master_leader(self, to: int | None = None) -> int:
        with self.cluster.lock:
            self.cluster.master_leader = (self.cluster.master_leader + 1 if to is None else to) % len(
                self.cluster.masters
            )
            return self.cluster.master_leader

    def age(self, stream_id: str, ms: int, tablet_id: str | None = None) -> None:
        """Moves the stream's last activity on one tablet (or all) ``ms`` into the past."""
        with self.cluster.lock:
            for key, state in self.cluster.streams[stream_id].states.items():
                if tablet_id in (None, key):
                    state.active_ms -= ms

    def set(self, **settings) -> dict:
        with self.cluster.lock:
            for name, value in settings.items():
                if not hasattr(self.settings, name):
                    raise ValueError(f"unknown setting {name}")
                setattr(self.settings, name, value)
            return asdict(self.settings)

    def fail_next(
        self,
        method: str,
        message: str,
        *,
        tablet_id: str | None = None,
        server: int | None = None,
        rpc_code: str | None = None,
        service_code: str | None = None,
        status_code: str | None = None,
        times: int = 1,
    ) -> None:
        """The next ``times`` calls of ``method`` (on that tablet / server) fail as given: an
        RPC-layer ErrorStatusPB code name, or a CDCErrorPB / MasterErrorPB code with an AppStatus."""
        codes = pb.MasterErrorPB.Code if method in ("GetCDCStream", "GetTableLocations", "GetTabletLocations") else None
        fault = Fault(
            method,
            tablet_id,
            server,
            pb.ErrorStatusPB.RpcErrorCodePB.Value(rpc_code) if rpc_code else None,
            (codes or pb.CDCErrorPB.Code).Value(service_code) if service_code else None,
            pb.AppStatusPB.ErrorCode.Value(status_code) if status_code else None,
            message,
            times,
        )
        with self.cluster.lock:
            self.cluster.faults.append(fault)

    def state(self, stream_id: str, tablet_id: str) -> dict:
        with self.cluster.lock:
            state = self.cluster.streams[stream_id].states[tablet_id]
            return {
                "start": list(state.start),
                "checkpoint": list(state.checkpoint),
                "snapshot_key": state.snapshot_key.hex() if state.snapshot_key is not None else None,
                "safe_time": state.safe_time,
                "active_ms": state.active_ms,
                "polled": state.polled,
                "expired": self.cluster.expired(state),
                "split_reported": state.split_reported,
                "collected_through": self.cluster.tablets[tablet_id].collected_through,
            }

    def info(self) -> dict:
        with self.cluster.lock:
            return {
                "masters": [s.port for s in self.cluster.masters],
                "tservers": [s.port for s in self.cluster.tservers],
                "tserver_uuids": [s.uuid for s in self.cluster.tservers],
                "namespace_id": self.cluster.namespace_id,
                "database_oid": self.cluster.database_oid,
                "safe_ht": self.cluster.safe_ht,
            }

    # -- the control loop -----------------------------------------------------------------------

    CONTROLS = (
        "wait_caught_up",
        "create_stream",
        "tablets",
        "hash_codes",
        "move_leader",
        "split",
        "move_master_leader",
        "age",
        "set",
        "fail_next",
        "state",
        "info",
    )

    def serve_controls(self, lines, out) -> None:
        for line in lines:
            request = json.loads(line)
            try:
                if request["op"] not in self.CONTROLS:
                    raise ValueError(f"unknown control {request['op']}")
                reply = {"ok": getattr(self, request["op"])(**request.get("args", {}))}
            except Exception as error:
                reply = {"error": f"{type(error).__name__}: {error}", "trace": traceback.format_exc()}
            out.write(json.dumps(reply) + "\n")
            out.flush()


def main() -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    config = json.loads(sys.argv[1])
    service = CdcStandInService(
        SimpleNamespace(**config["cluster"]),
        config["database"],
        Settings(**config["settings"]),
        config.get("rpc_heartbeat_interval", 1.0),
        config.get("rpc_tls"),
    )
    try:
        service.start()
        print(json.dumps(service.info()), flush=True)
        service.serve_controls(sys.stdin, sys.stdout)
    finally:
        service.stop()


if __name__ == "__main__":
    main()
