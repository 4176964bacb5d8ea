"""The CDC-service source's RPC session: masters, tablet leaders, ``GetChanges`` and checkpoints.

Built on :class:`~.protocol.client.RpcConnection` (one blocking connection per server, reused):

- **Masters.** Only the leader master answers (the others say ``NOT_THE_LEADER``): calls go to the
  last known leader, else to each address in turn.
- **Stream.** ``GetCDCDBStreamInfo`` gives the stream's tables and namespace, ``GetCDCStream`` its
  options (record type); ``GetTableLocations`` the tablets and their replicas.
- **Tablet leaders** are cached from the locations and looked up again (``GetTabletLocations``)
  when a call says the leader moved (the error's ``rediscover``).
- **Retries** are bounded with exponential backoff, for what the protocol layer marks
  ``retriable`` (leader changes, not ready, busy, connection lost), except ``TABLET_SPLIT``: asking
  a split tablet again cannot help, its caller must go on with the children
  (:meth:`YbCdcClient.split_children`); then, and for every other error,
  the product's error classes (:func:`~.service_errors.product_error`): the stream or a checkpoint being gone is a
  state error, a request the server refuses a configuration error, exhausted retries
  :class:`~cdc.errors.CdcTransientError`.

**Transport.** TLS with certificate verification unless the caller passes ``tls=None``
(plaintext, an explicit choice: the connection's ``rpc_sslmode=disable``). Every response is
capped by its method's frame size (:mod:`.protocol.methods`); ``GetChanges``' cap is
``get_changes_max_bytes``. A refused TLS session and a frame above the cap are configuration
errors, not retried.

TLS options and anything else from the connection's configuration never appear in reprs or in
error messages (only host:port, stream id and tablet ids do).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from google.protobuf.message import Message

from airflow_provider_cdc.cdc.basics.errors import (
    CdcConfigurationError,
    CdcError,
    CdcTransientError,
)
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.addresses import Address, parse_addresses
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.checkpoints import (
    Checkpoint,
    StoredCheckpoint,
    TabletCheckpoints,
    TabletPosition,
)
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.pages import Fetch, TabletSplitError
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import errors as rpc
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import methods
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol.client import DEFAULT_TLS, RpcConnection, TlsOptions
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol.methods import Method
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.service_errors import (
    InvalidRequestError,
    StreamExpiredError,
    StreamNotStartedError,
    product_error,
)

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)


@dataclass(frozen=True)
class RetryPolicy:
    """How often, and how long apart, a retriable failure is tried again."""

    attempts: int = 8
    backoff_seconds: float = 0.1
    max_backoff_seconds: float = 5.0

    def delay(self, attempt: int) -> float:
        return min(self.backoff_seconds * (2**attempt), self.max_backoff_seconds)


#: ``from_cdc_sdk_checkpoint.key`` of the ``GetChanges`` that marks a tablet's snapshot done or not
#: needed (``kCDCSDKSnapshotDoneKey``, cdc_service.h; the connector's ``SNAPSHOT_DONE_KEY``).
SNAPSHOT_DONE_KEY = b"snapshot_done_key"


def replica_address(replica: pb.TabletLocationsPB.ReplicaPB) -> Address | None:
    info = replica.ts_info
    for host_port in (*info.private_rpc_addresses, *info.broadcast_addresses):
        if host_port.host:
            return host_port.host, host_port.port
    return None


class ClientSettings(Protocol):
    """What :meth:`YbCdcClient.of` reads: a job spec's (or a snapshot source's) connection settings."""

    @property
    def master_addresses(self) -> str: ...
    @property
    def stream_id(self) -> str: ...
    @property
    def tls(self) -> TlsOptions | None: ...
    @property
    def get_changes_max_bytes(self) -> int: ...


class YbCdcClient:
    """One stream's session with a cluster. Not thread-safe; close it (or use ``with``)."""

    @classmethod
    def of(cls, where: ClientSettings) -> YbCdcClient:
        """A client for a job spec (or a snapshot task's source): its masters, stream, TLS and
        ``GetChanges`` frame cap."""
        return cls(
            parse_addresses(where.master_addresses),
            where.stream_id,
            tls=where.tls,
            get_changes_max_bytes=where.get_changes_max_bytes,
        )

    def __init__(
        self,
        masters: Sequence[Address],
        stream_id: str,
        *,
        tls: TlsOptions | None = DEFAULT_TLS,
        timeout_seconds: float = 30.0,
        retry: RetryPolicy = RetryPolicy(),
        sleep: Callable[[float], None] = time.sleep,
        get_changes_max_bytes: int = methods.GET_CHANGES_MAX_BYTES,
    ) -> None:
        if not masters:
            raise CdcConfigurationError("no master addresses")
        self.masters = tuple(masters)
        self.stream_id = stream_id
        self._tls = tls  # None: plaintext, asked for explicitly
        self._get_changes_max_bytes = get_changes_max_bytes
        self._timeout = timeout_seconds
        self._retry = retry
        self._sleep = sleep
        self._connections: dict[Address, RpcConnection] = {}
        self._master_leader: Address | None = None
        self._leaders: dict[str, Address] = {}

    def __repr__(self) -> str:
        masters = ",".join(f"{h}:{p}" for h, p in self.masters)
        return f"YbCdcClient(masters={masters}, stream_id={self.stream_id}, tls={self._tls is not None})"

    def __enter__(self) -> YbCdcClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for connection in self._connections.values():
            connection.close()
        self._connections.clear()

    # -- calls -------------------------------------------------------------------------------

    def _call(self, address: Address, method: Method, request: Message) -> Message:
        connection = self._connections.get(address)
        if connection is None:
            connection = self._connections[address] = RpcConnection(
                address[0], address[1], connect_timeout=self._timeout, tls=self._tls
            )
        cap = self._get_changes_max_bytes if method == methods.GET_CHANGES else None
        response = connection.invoke(method, request, timeout=self._timeout, max_response_bytes=cap)
        rpc.raise_for_service_error(response)
        return response

    def _retrying(self, what: str, attempt_once: Callable[[int], M]) -> M:
        """``attempt_once(attempt)`` until it succeeds, a non-retriable error, or the attempts run out."""
        for attempt in range(self._retry.attempts):
            try:
                return attempt_once(attempt)
            except rpc.YbRpcError as error:
                final = not error.retriable or isinstance(error, rpc.TabletSplit)
                if final or attempt + 1 >= self._retry.attempts:
                    raise product_error(error, what) from None
                log.info("%s: %s; retrying (attempt %d)", what, error, attempt + 1)
                self._sleep(self._retry.delay(attempt))
        raise AssertionError("unreachable")

    def master_call(self, method: Method, request: M) -> Message:
        """A master call, to the leader master (found by trying each address)."""

        def once(attempt: int) -> Message:
            order = list(self.masters)
            if self._master_leader in order:
                order.remove(self._master_leader)
                order.insert(0, self._master_leader)
            last: rpc.YbRpcError | None = None
            for address in order:
                try:
                    response = self._call(address, method, request)
                except rpc.YbRpcError as error:
                    if not error.rediscover:
                        raise
                    last = error  # not the leader, or unreachable: the next master
                    continue
                self._master_leader = address
                return response
            if last is None:
                raise RuntimeError("no master address to call")
            raise last

        return self._retrying(f"{method.name} on masters of stream {self.stream_id}", once)

    # -- the stream --------------------------------------------------------------------------

    def stream_tables(self) -> tuple[str, tuple[str, ...]]:
        """The stream's namespace id and table ids."""
        request = pb.MasterGetCDCDBStreamInfoRequestPB(db_stream_id=self.stream_id.encode())
        response = self.master_call(methods.MASTER_GET_DB_STREAM_INFO, request)
        tables = tuple(sorted({t.table_id.decode() for t in response.table_info}))
        return response.namespace_id.decode(), tables

    def stream_options(self) -> dict[str, str]:
        """The stream's options (``record_type``, ``checkpoint_type``, ...)."""
        response = self.master_call(
            methods.MASTER_GET_CDC_STREAM, pb.GetCDCStreamRequestPB(stream_id=self.stream_id.encode())
        )
        return {o.key: o.value.decode() for o in response.stream.options}

    def record_type(self) -> int:
        """The stream's ``CDCRecordType`` (CHANGE when the stream does not say)."""
        name = self.stream_options().get("record_type", "CHANGE")
        try:
            return pb.CDCRecordType.Value(name)
        except ValueError:
            raise CdcConfigurationError(f"stream {self.stream_id}: unknown record type {name!r}") from None

    def tablets(self, table_ids: Iterable[str]) -> dict[str, tuple[str, ...]]:
        """The active tablets of the tables (tablet id → its tables); leaders are cached."""
        tablets: dict[str, set[str]] = {}
        for table_id in table_ids:
            request = pb.GetTableLocationsRequestPB(
                table=pb.TableIdentifierPB(table_id=table_id.encode()), max_returned_locations=1 << 20
            )
            for location in self.master_call(methods.MASTER_GET_TABLE_LOCATIONS, request).tablet_locations:
                tablet_id = location.tablet_id.decode()
                tablets.setdefault(tablet_id, set()).add(table_id)
                self._remember_leader(location)
        return {tablet: tuple(sorted(tables)) for tablet, tables in sorted(tablets.items())}

    def _remember_leader(self, location: pb.TabletLocationsPB) -> None:
        for replica in location.replicas:
            address = replica_address(replica)
            if replica.role == pb.LEADER and address is not None:
                self._leaders[location.tablet_id.decode()] = address
                return

    def leader(self, tablet_id: str, *, refresh: bool = False) -> Address:
        """The tablet's leader tablet server (cached unless ``refresh``)."""
        if refresh or tablet_id not in self._leaders:
            self._leaders.pop(tablet_id, None)
            request = pb.GetTabletLocationsRequestPB(tablet_ids=[tablet_id.encode()])
            response = self.master_call(methods.MASTER_GET_TABLET_LOCATIONS, request)
            for location in response.tablet_locations:
                self._remember_leader(location)
            if tablet_id not in self._leaders:
                # No leader elected yet: retriable, like YB's own client.
                raise rpc.LeaderChanged(
                    "yb.master.MasterService", 0, "NO_LEADER", None, f"tablet {tablet_id} has no leader"
                )
        return self._leaders[tablet_id]

    def tablet_call(self, tablet_id: str, method: Method, request: Message, what: str) -> Message:
        """One call to ``tablet_id``'s leader, found again and retried when it moved."""

        def once(attempt: int) -> Message:
            address = self.leader(tablet_id, refresh=attempt > 0 and tablet_id not in self._leaders)
            try:
                return self._call(address, method, request)
            except rpc.YbRpcError as error:
                if error.rediscover:
                    self._leaders.pop(tablet_id, None)  # look the leader up again before retrying
                raise

        return self._retrying(what, once)

    # -- changes and checkpoints -------------------------------------------------------------

    def get_changes(
        self,
        tablet_id: str,
        position: TabletPosition,
        *,
        explicit: Checkpoint | None = None,
        need_schema_info: bool = False,
        starting: bool = False,
    ) -> pb.GetChangesResponsePB:
        """One ``GetChanges`` of ``tablet_id`` from ``position``; ``explicit`` is the checkpoint
        the sink has committed (an EXPLICIT stream keeps what follows it); ``starting`` marks a
        bootstrap, the only request where "... is expired" may mean a tablet not started yet
        (:meth:`_expiry`); ``need_schema_info``
        asks for the tables' DDL records first (YB sends them otherwise only when its schema
        cache for the stream and tablet is stale)."""
        request = pb.GetChangesRequestPB(
            db_stream_id=self.stream_id.encode(),
            tablet_id=tablet_id.encode(),
            from_cdc_sdk_checkpoint=position.checkpoint.to_pb(),
            safe_hybrid_time=position.safe_hybrid_time,
            wal_segment_index=position.wal_segment_index,
        )
        if need_schema_info:
            request.need_schema_info = True
        if explicit is not None:
            request.explicit_cdc_sdk_checkpoint.CopyFrom(explicit.to_pb())
        what = f"GetChanges of tablet {tablet_id} (stream {self.stream_id})"
        try:
            return self.tablet_call(tablet_id, methods.GET_CHANGES, request, what)
        except StreamExpiredError as expired:
            if not starting:  # every tablet a window reads was started by the snapshot or setup
                raise
            raise self._expiry(tablet_id, expired) from None
        except InvalidRequestError as refused:
            children = self.split_into(tablet_id)
            if not children:
                raise
            # The connector's reading of INVALID_REQUEST (CONN l.564), limited to a tablet whose
            # children the master lists: a split parent YB no longer finds for the stream.
            raise TabletSplitError(
                f"{refused}; tablet {tablet_id} was split into {', '.join(children)}: read as TABLET_SPLIT"
            ) from None

    def split_into(self, parent: str) -> list[str]:
        """The tablets of the stream's tables that name ``parent`` as their split parent, hidden
        ones included (``GetTableLocations`` with ``include_inactive``, the list YB's
        ``CheckTabletValidForStream`` looks in); empty for a tablet that was not split."""
        found: set[str] = set()
        for table_id in self.stream_tables()[1]:
            request = pb.GetTableLocationsRequestPB(
                table=pb.TableIdentifierPB(table_id=table_id.encode()),
                max_returned_locations=1 << 20,
                include_inactive=True,
            )
            for location in self.master_call(methods.MASTER_GET_TABLE_LOCATIONS, request).tablet_locations:
                if location.split_parent_tablet_id.decode() == parent:
                    found.add(location.tablet_id.decode())
        return sorted(found)

    def _expiry(self, tablet_id: str, expired: StreamExpiredError) -> CdcError:
        """YB gives one text for a tablet that expired and for one never started (-1.-1, no
        ``active_time``): at a bootstrap the stored checkpoint tells them apart (a missing row reads
        -1.-1 too, so this is asked only where the tablet is being started). Real expiry stays terminal."""
        try:
            stored = self.get_checkpoint(tablet_id)
        except CdcError:
            return expired  # the row cannot be read: keep the server's word
        if not stored.never_set:
            return expired
        return StreamNotStartedError(
            f"{expired}. Tablet {tablet_id} of stream {self.stream_id} was never started (its checkpoint is "
            "-1.-1: a stream created without a consistent snapshot, and no SetCDCCheckpoint yet); nothing is "
            "lost. The snapshot starts the tablet with SetCDCCheckpoint(initial_checkpoint) first: run it again"
        )

    def fetcher(self, tablet_id: str, *, explicit: Checkpoint | None = None) -> Fetch:
        """The ``fetch`` of :func:`~.pages.poll_pages` for one tablet. Its first request asks for
        the schema (``need_schema_info``, as the connector's per-tablet ``schemaNeeded``): a window
        knows no table version before it, and a tablet whose checkpoint is the one it last sent
        would send its rows without a DDL record."""
        first = [True]

        def fetch(position: TabletPosition) -> pb.GetChangesResponsePB:
            response = self.get_changes(tablet_id, position, explicit=explicit, need_schema_info=first[0])
            first[0] = False
            return response

        return fetch

    def split_children(self, parent: str, table_ids: Iterable[str]) -> dict[str, Checkpoint]:
        """The children of the split tablet ``parent``, each with the checkpoint it starts from.

        ``GetTabletListToPollForCDC`` with the parent's id, as the connector's ``handleTabletSplit``:
        YB lists the parent's children (``split_parent_tablet_id``), each with its own ``cdc_state``
        checkpoint when that is valid (term and index > 0), else the parent's stored one, else 0.0
        once the parent's row is gone (``cdc_service.cc``). Only the op id (term, index) is kept:
        that is what ``cdc_state`` holds; the rest of the message (a snapshot time filled from the
        parent row's safe time) is no streaming position. A stream window starts the children from
        its own position instead (:meth:`~.jobs._StreamTablets.children`): a child's log starts
        with a copy of the parent's, so that checkpoint would make it send again what the parent
        sent after it.
        The request names a table of the parent (``table_info``); the first of ``table_ids`` that
        lists children is used. Any tablet server answers: the call goes to the parent's leader,
        which the split was just heard from. The master lists both children once the split is done;
        until then (fewer than two) the call is repeated with the retry policy's backoff, as the
        connector retries until two arrive. The children's leaders are remembered from the answer.
        """
        tables = list(dict.fromkeys(table_ids))
        if not tables:
            raise CdcConfigurationError(f"tablet {parent}: no table of the stream to ask for its split children")
        what = f"GetTabletListToPollForCDC of split tablet {parent} (stream {self.stream_id})"
        found: dict[str, Checkpoint] = {}
        for attempt in range(self._retry.attempts):
            for table_id in tables:
                request = pb.GetTabletListToPollForCDCRequestPB(
                    table_info=pb.TableInfo(stream_id=self.stream_id.encode(), table_id=table_id.encode()),
                    tablet_id=parent.encode(),
                )
                response = self.tablet_call(parent, methods.GET_TABLET_LIST_TO_POLL, request, what)
                found = {}
                for pair in response.tablet_checkpoint_pairs:
                    location = pair.tablet_locations
                    if location.split_parent_tablet_id and location.split_parent_tablet_id.decode() != parent:
                        continue  # not a child of this parent (YB lists only children; checked all the same)
                    checkpoint = pair.cdc_sdk_checkpoint
                    found[location.tablet_id.decode()] = Checkpoint(checkpoint.term, checkpoint.index)
                    self._remember_leader(location)
                if len(found) >= 2:
                    log.info("tablet %s was split into %s", parent, ", ".join(sorted(found)))
                    return found
            if attempt + 1 < self._retry.attempts:
                log.info("%s: %d children listed so far; asking again", what, len(found))
                self._sleep(self._retry.delay(attempt))
        raise CdcTransientError(f"{what}: the split's children are not listed (found {sorted(found)})")

    def set_checkpoints(self, checkpoints: TabletCheckpoints) -> None:
        """Store each polled tablet's checkpoint on the server (``SetCDCCheckpoint``): only after
        the window's sink commit and offset save, so the server never drops what the sink lacks."""
        for tablet_id, position in checkpoints.polled().items():
            checkpoint = position.checkpoint
            request = pb.SetCDCCheckpointRequestPB(
                checkpoint=pb.CDCCheckpointPB(op_id=pb.OpIdPB(term=checkpoint.term, index=checkpoint.index)),
                cdc_sdk_checkpoint=checkpoint.to_pb(),
                stream_id=self.stream_id.encode(),
                tablet_id=tablet_id.encode(),
            )
            if position.safe_hybrid_time >= 0:
                request.cdc_sdk_safe_time = position.safe_hybrid_time
            what = f"SetCDCCheckpoint of tablet {tablet_id} (stream {self.stream_id})"
            self.tablet_call(tablet_id, methods.SET_CDC_CHECKPOINT, request, what)

    def get_checkpoint(self, tablet_id: str) -> StoredCheckpoint:
        """The tablet's ``cdc_state`` row for the stream (``GetCheckpoint`` reads the table, not a
        cache; it lags explicit checkpoints sent with ``GetChanges`` by up to
        ``cdc_state_checkpoint_update_interval_ms``, never one set by ``SetCDCCheckpoint``)."""
        request = pb.GetCheckpointRequestPB(stream_id=self.stream_id.encode(), tablet_id=tablet_id.encode())
        what = f"GetCheckpoint of tablet {tablet_id} (stream {self.stream_id})"
        response = self.tablet_call(tablet_id, methods.GET_CHECKPOINT, request, what)
        op = response.checkpoint.op_id
        key = response.snapshot_key if response.HasField("snapshot_key") else None
        return StoredCheckpoint(op.term, op.index, key, response.snapshot_time)

    def start_tablet(self, tablet_id: str) -> None:
        """``SetCDCCheckpoint(0.0, initial_checkpoint)``, the connector's ``makeStreamActive``: sets a
        never-started tablet's ``active_time`` so its first ``GetChanges`` is served (YB's
        ``SetCDCCheckpoint`` checks no expiry) and makes the server keep its log from there."""
        request = pb.SetCDCCheckpointRequestPB(
            checkpoint=pb.CDCCheckpointPB(op_id=pb.OpIdPB(term=0, index=0)),
            stream_id=self.stream_id.encode(),
            tablet_id=tablet_id.encode(),
            initial_checkpoint=True,
        )
        what = f"SetCDCCheckpoint(initial 0.0) of tablet {tablet_id} (stream {self.stream_id})"
        self.tablet_call(tablet_id, methods.SET_CDC_CHECKPOINT, request, what)

    def mark_snapshot_done(self, tablet_id: str, at: Checkpoint | None = None) -> None:
        """The ``GetChanges`` with key ``snapshot_done_key`` (the connector's ``markSnapshotDoneOnServer``,
        or ``markNoSnapshotNeeded`` when ``at`` is None): YugabyteDB's ``UpdateSnapshotDone`` sets the
        row's ``cdc_sdk_safe_time`` to ``at``'s snapshot time, its ``active_time`` and
        ``last_replication_time``; the checkpoint is not touched."""
        at = at or Checkpoint(-1, -1)
        done = Checkpoint(at.term, at.index, SNAPSHOT_DONE_KEY, 0, at.snapshot_time)
        self.get_changes(tablet_id, TabletPosition(done))


__all__ = ["SNAPSHOT_DONE_KEY", "ClientSettings", "RetryPolicy", "YbCdcClient", "replica_address"]
