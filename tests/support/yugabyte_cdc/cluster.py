"""The emulated cluster's state: servers, tables, tablets and their logs, streams, faults.

Everything here is in memory in the service process and guarded by one lock; the RPC handlers,
the journal distributor and the test controls all go through it. No I/O happens under the lock.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb

from . import ids
from .schema import Table, TableSchema
from .streams import Stream, TabletState, now_ms
from .tablets import RowChange, Tablet

#: OpId::Min(): the checkpoint YB gives a split's children in cdc_state.
MIN_OP_ID = (0, 0)


@dataclass
class Settings:
    tablets_per_table: int = 3
    tablet_servers: int = 3
    masters: int = 1
    replication_factor: int = 3  # capped by the number of tablet servers
    retention_ms: int = 8 * 3600 * 1000  # cdc_intent_retention_ms
    snapshot_batch_size: int = 250  # cdc_snapshot_batch_size
    snapshot_page_bytes: int = 0  # cdc_snapshot_records_threshold_size_bytes (newer YB, 4 MB); 0: rows only
    changes_page_size: int = 500  # records per GetChanges response (YB limits by bytes and intents)
    proxy_to_leader: bool = False  # honour serve_as_proxy (YB's default); off: non-leaders refuse
    safepoint_records: bool = True  # cdc_populate_safepoint_record (true in current YB, false in older)
    # A split parent serves its records up to the split op before TABLET_SPLIT, as YB's read loop
    # does while the parent is not yet TABLET_DATA_SPLIT_COMPLETED (racing the apply). Off (YB once
    # the split is applied): TABLET_SPLIT at once. See docs/yugabytedb-cdc-standin.md, Splits.
    split_racing_apply: bool = False


@dataclass(frozen=True)
class Server:
    kind: str  # "master" | "tserver"
    number: int
    uuid: str
    host: str
    port: int


@dataclass
class Fault:
    """An error the next ``times`` matching calls get instead of their answer."""

    method: str
    tablet_id: str | None
    server: int | None
    rpc_code: int | None
    service_code: int | None
    status_code: int | None
    message: str
    times: int


@dataclass
class Cluster:
    database: str
    database_oid: int
    settings: Settings
    masters: list[Server] = field(default_factory=list)
    tservers: list[Server] = field(default_factory=list)
    master_leader: int = 0
    tables: dict[int, Table] = field(default_factory=dict)  # relid -> its DocDB table now
    retired: list[Table] = field(default_factory=list)  # DocDB tables replaced by a table rewrite
    tablets: dict[str, Tablet] = field(default_factory=dict)
    table_tablets: dict[str, list[str]] = field(default_factory=dict)  # table id -> all its tablets
    streams: dict[str, Stream] = field(default_factory=dict)
    faults: list[Fault] = field(default_factory=list)
    safe_ht: int = 0  # every op with a hybrid time <= this is in the logs
    heartbeat_seen: int = 0
    replicated_rows: set[tuple[str, str]] = field(default_factory=set)  # (stream, split child) polled explicitly
    lock: threading.RLock = field(default_factory=threading.RLock)

    @property
    def namespace_id(self) -> str:
        return ids.namespace_id(self.database_oid)

    # -- tables and tablets -------------------------------------------------------------------

    def register_table(
        self, relid: int, schema_name: str, name: str, schema: TableSchema, relfilenode: int | None = None
    ) -> Table:
        """A table gets its tablets the first time the stand-in sees it, and new ones when its
        relfilenode changed (a table rewrite: YB creates a new DocDB table with a new id; the old
        one keeps its tablets and history, and no stream gains the new one)."""
        with self.lock:
            current = self.tables.get(relid)
            node = relfilenode or (current.relfilenode if current is not None else relid)
            table_id = ids.table_id(self.database_oid, node)
            if current is not None and current.table_id == table_id:
                return current
            if current is not None:
                self.retired.append(current)
            table = Table(relid, table_id, schema_name, name, [schema], relfilenode=node)
            count = self.settings.tablets_per_table
            table.num_tablets = count
            for number, (start, end) in enumerate(ids.hash_ranges(count)):
                tablet_id = ids.stable_id(self.namespace_id, node, start, end)
                replicas = self._replicas(relid + number)
                tablet = Tablet(tablet_id, table, start, end, replicas, replicas[0], term=1, last_index=0)
                tablet.append("noop", self.safe_ht, schema)  # the first leader's NO_OP
                self.tablets[tablet_id] = tablet
                self.table_tablets.setdefault(table.table_id, []).append(tablet_id)
            self.tables[relid] = table
            return table

    def table_by_id(self, table_id: str) -> Table | None:
        return next((t for t in [*self.tables.values(), *self.retired] if t.table_id == table_id), None)

    def tablets_of(self, table: Table, *, include_inactive: bool = False) -> list[Tablet]:
        tablets = [self.tablets[t] for t in self.table_tablets.get(table.table_id, [])]
        return sorted((t for t in tablets if include_inactive or t.active), key=lambda t: (t.start, t.depth))

    def route(self, table: Table, hash_code: int) -> Tablet:
        return next(t for t in self.tablets_of(table) if t.covers(hash_code))

    def _replicas(self, seed: int) -> list[int]:
        count = len(self.tservers)
        factor = max(1, min(self.settings.replication_factor, count))
        return [(seed + i) % count for i in range(factor)]

    # -- the journal, distributed -------------------------------------------------------------

    def apply(
        self,
        ht: int,
        txn_id: bytes,
        new_schemas: dict[int, TableSchema],
        changes: list[tuple[Table, int, RowChange]],
    ) -> None:
        """One committed transaction: DDL ops for tables whose columns changed, then on each
        tablet it touched one txn op with that tablet's rows."""
        with self.lock:
            for relid, schema in new_schemas.items():
                table = self.tables[relid]
                table.versions.append(schema)
                for tablet in self.tablets_of(table):
                    tablet.append("ddl", ht, schema)
            per_tablet: dict[str, list[RowChange]] = {}
            for table, hash_code, change in changes:
                per_tablet.setdefault(self.route(table, hash_code).tablet_id, []).append(change)
            for tablet_id, rows in per_tablet.items():
                tablet = self.tablets[tablet_id]
                tablet.append("txn", ht, tablet.table.schema, txn_id, rows)
            self.safe_ht = max(self.safe_ht, ht)

    def note_heartbeat(self, ht: int, number: int) -> None:
        with self.lock:
            self.safe_ht = max(self.safe_ht, ht)
            self.heartbeat_seen = max(self.heartbeat_seen, number)

    # -- streams --------------------------------------------------------------------------------

    def add_stream(self, stream: Stream) -> None:
        with self.lock:
            for table_id in stream.table_ids:
                table = self.table_by_id(table_id)
                if table is None:
                    continue
                for tablet in self.tablets_of(table):
                    start = tablet.op_id_at_or_before(stream.snapshot_ht)
                    stream.states[tablet.tablet_id] = stream.initial_state(start)
            self.streams[stream.stream_id] = stream

    def expired(self, state: TabletState) -> bool:
        """CheckStreamActive: no GetChanges or SetCDCCheckpoint within cdc_intent_retention_ms, or
        active_time never set (0: a stream without a consistent snapshot, before SetCDCCheckpoint).
        Sticky until SetCDCCheckpoint sets active_time again: its retention was let go meanwhile."""
        if not state.expired and now_ms() - state.active_ms > self.settings.retention_ms:
            state.expired = True
        return state.expired

    def collect_garbage(self) -> None:
        """Drops every tablet's ops below the lowest op index a live stream still needs.

        A stream that never set a checkpoint holds from its start (YB would not hold for it);
        expired streams hold nothing. Tablets no stream covers keep their whole log.
        """
        with self.lock:
            barriers: dict[str, int] = {}
            for stream in self.streams.values():
                for tablet_id, state in stream.states.items():
                    if self.expired(state):
                        barriers.setdefault(tablet_id, 1 << 62)
                    else:
                        barriers[tablet_id] = min(barriers.get(tablet_id, 1 << 62), state.holds())
            for tablet_id, barrier in barriers.items():
                self.tablets[tablet_id].collect(barrier)

    # -- faults ---------------------------------------------------------------------------------

    def move_leader(self, tablet_id: str, to: int | None = None) -> int:
        """Leadership moves to another tablet server (a new term, its NO_OP first). If that
        server has no replica, the leader's replica moves there (a load-balancer move)."""
        with self.lock:
            tablet = self.tablets[tablet_id]
            if to is None:
                to = (tablet.leader + 1) % len(self.tservers)
            if to not in tablet.replicas:
                tablet.replicas = [to if r == tablet.leader else r for r in tablet.replicas]
            tablet.leader = to
            tablet.term += 1
            tablet.append("noop", self.safe_ht, tablet.table.schema)
            return to

    def split(self, tablet_id: str) -> tuple[str, str]:
        """Splits a tablet at the middle of its hash range, after its last op, as YB applies a
        split: a SPLIT_OP ends the parent's log; each child's log starts with a copy of the parent's
        retained log up to and including it (``Log::CopyTo``, :meth:`Tablet.copy_log`); each stream
        reading the parent gets a ``cdc_state`` row per child at ``OpId::Min()`` = 0.0 ("Both
        children should have the min OpId(0.0) as the checkpoint",
        ``cdcsdk_tablet_split-test.cc`` ``TestCDCStateTableAfterTabletSplit``), holding the
        parent's retention (``TestCheckpointPersistencyAfterTabletSplit``)."""
        with self.lock:
            parent = self.tablets[tablet_id]
            if not parent.active:
                raise ValueError(f"tablet {tablet_id} is already split")
            if parent.end - parent.start < 2:
                raise ValueError(f"tablet {tablet_id} cannot be split further")
            middle = (parent.start + parent.end) // 2
            parent.split_index = parent.last_index
            parent.append("split", self.safe_ht, parent.table.schema)
            children = []
            for number, (start, end) in enumerate(((parent.start, middle), (middle, parent.end))):
                child_id = ids.stable_id(parent.tablet_id, "split", start, end)
                replicas = list(parent.replicas) if number == 0 else self._replicas(parent.leader + 1)
                child = Tablet(
                    child_id,
                    parent.table,
                    start,
                    end,
                    replicas,
                    replicas[0],
                    term=parent.term,
                    last_index=0,
                    parent=parent.tablet_id,
                    depth=parent.depth + 1,
                )
                child.copy_log(parent)
                self.tablets[child_id] = child
                self.table_tablets[parent.table.table_id].append(child_id)
                children.append(child_id)
            parent.children = (children[0], children[1])
            parent.table.num_tablets += 1
            for stream in self.streams.values():
                state = stream.states.get(tablet_id)
                if state is not None:
                    held = state.checkpoint if state.checkpoint[1] > 0 else state.start
                    for child_id in children:
                        stream.states[child_id] = TabletState(start=held, checkpoint=MIN_OP_ID)
            return parent.children

    def split_parent_named(self, table_ids: list[str], tablet_id: str) -> str | None:
        """A tablet of the tables (hidden ones included) whose split parent is ``tablet_id``
        (``CDCServiceImpl::CheckTabletValidForStream``'s look-up), or None."""
        with self.lock:
            for table_id in table_ids:
                for child_id in self.table_tablets.get(table_id, []):
                    if self.tablets[child_id].parent == tablet_id:
                        return child_id
            return None

    def replicated(self, stream: Stream, child_id: str) -> None:
        """A child polled with an explicit checkpoint (YB sets the row's ``last_replication_time``;
        an EXPLICIT stream's poll without one updates nothing, ``UpdateCheckpointRequired``). Once
        both children are, the parent's ``cdc_state`` row is deleted (EXPLICIT streams:
        ``cdcsdk_tablet_split-test.cc`` ``TestCDCStateTableAfterTabletSplitReported``; the master's
        clean-up itself was not read)."""
        with self.lock:
            self.replicated_rows.add((stream.stream_id, child_id))
            parent_id = self.tablets[child_id].parent
            parent = self.tablets.get(parent_id) if parent_id else None
            if parent is None or not parent.children or parent_id not in stream.states:
                return
            if all((stream.stream_id, c) in self.replicated_rows for c in parent.children):
                del stream.states[parent_id]

    def fault_for(self, method: str, tablet_id: str | None, server: int) -> Fault | None:
        with self.lock:
            for fault in self.faults:
                if fault.method == method and fault.tablet_id in (None, tablet_id) and fault.server in (None, server):
                    fault.times -= 1
                    if fault.times <= 0:
                        self.faults.remove(fault)
                    return fault
            return None

    # -- locations ------------------------------------------------------------------------------

    def locations(self, tablet: Tablet) -> pb.TabletLocationsPB:
        """TabletLocationsPB as the master returns it: range, replicas with roles, split links."""
        message = pb.TabletLocationsPB(
            tablet_id=tablet.tablet_id.encode(),
            table_id=tablet.table.table_id.encode(),
            start_key=ids.partition_key(tablet.start),
            end_key=ids.partition_key(tablet.end),
            stale=False,
            split_depth=tablet.depth,
            expected_live_replicas=len(tablet.replicas),
        )
        message.table_ids.append(tablet.table.table_id.encode())
        message.partition.partition_key_start = ids.partition_key(tablet.start)
        message.partition.partition_key_end = ids.partition_key(tablet.end)
        if tablet.parent:
            message.split_parent_tablet_id = tablet.parent.encode()
        if tablet.children:
            message.split_tablet_ids.extend(c.encode() for c in tablet.children)
        for number in tablet.replicas:
            server = self.tservers[number]
            replica = message.replicas.add(role=pb.LEADER if number == tablet.leader else pb.FOLLOWER)
            replica.ts_info.permanent_uuid = server.uuid.encode()
            replica.ts_info.private_rpc_addresses.add(host=server.host, port=server.port)
            replica.ts_info.cloud_info.placement_cloud = "cloud1"
            replica.ts_info.cloud_info.placement_region = "datacenter1"
            replica.ts_info.cloud_info.placement_zone = "rack1"
        return message
