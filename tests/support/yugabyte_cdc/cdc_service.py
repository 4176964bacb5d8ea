"""``yb.cdc.CDCService`` on the stand-in's tablet servers.

The checks come in the order ``cdc_service.cc`` makes them (stream and tablet valid for the
stream, then leadership, then ``CheckStreamActive``), with its error codes and texts. Requests
are classified by their ``from_cdc_sdk_checkpoint`` as YB and the Debezium connector do:

* ``key == "snapshot_done_key"``: the snapshot is marked done, the streaming checkpoint returned;
* ``write_id == -1``, ``snapshot_time == 0``, empty key: the snapshot bootstrap call;
* ``write_id == -1``, ``snapshot_time > 0``: a snapshot page after ``key``;
* anything else: streaming after (term, index), or inside op ``index`` after record
  ``write_id`` when ``key`` is set.
"""

from __future__ import annotations

from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb

from . import records
from .cluster import MIN_OP_ID, Cluster, Fault
from .rpc_server import RpcFailure, parse_body
from .service_errors import CDC, STATUS, ServiceError, expired, invalid, not_in_stream, stream_not_found, tablet_split
from .snapshot import SnapshotReader
from .streams import INVALID, Stream, TabletState, now_ms
from .tablets import Tablet

SNAPSHOT_DONE_KEY = b"snapshot_done_key"  # kCDCSDKSnapshotDoneKey (cdc_service.h)

_REQUESTS = {
    "GetChanges": (pb.GetChangesRequestPB, pb.GetChangesResponsePB),
    "GetCheckpoint": (pb.GetCheckpointRequestPB, pb.GetCheckpointResponsePB),
    "SetCDCCheckpoint": (pb.SetCDCCheckpointRequestPB, pb.SetCDCCheckpointResponsePB),
    "GetTabletListToPollForCDC": (pb.GetTabletListToPollForCDCRequestPB, pb.GetTabletListToPollForCDCResponsePB),
    "GetLatestEntryOpId": (pb.GetLatestEntryOpIdRequestPB, pb.GetLatestEntryOpIdResponsePB),
    "GetCDCDBStreamInfo": (pb.GetCDCDBStreamInfoRequestPB, pb.GetCDCDBStreamInfoResponsePB),
}


class CdcService:
    def __init__(self, cluster: Cluster, reader: SnapshotReader) -> None:
        self.cluster = cluster
        self.reader = reader

    def handle(self, server: int, method: str, body: bytes):
        if method not in _REQUESTS:
            raise RpcFailure(pb.ErrorStatusPB.ERROR_NO_SUCH_METHOD, f"Bad request: invalid method name: {method}")
        request_cls, response_cls = _REQUESTS[method]
        request = parse_body(request_cls, body)
        response = response_cls()
        tablet_id = request.tablet_id.decode() if "tablet_id" in request.DESCRIPTOR.fields_by_name else None
        try:
            fault = self.cluster.fault_for(method, tablet_id, server)
            if fault is not None:
                _raise(fault)
            getattr(self, "_" + method)(server, request, response)
        except ServiceError as error:
            response.Clear()
            error.fill(response.error)
        return response

    # -- GetChanges -----------------------------------------------------------------------------

    def _GetChanges(self, server: int, req: pb.GetChangesRequestPB, resp: pb.GetChangesResponsePB) -> None:
        if not req.HasField("tablet_id"):
            raise invalid("Tablet ID is required to get CDC changes")
        if not (req.HasField("stream_id") or req.HasField("db_stream_id")):
            raise invalid("Stream ID/DB Stream ID is required to get CDC changes")
        stream_id = (req.db_stream_id if req.HasField("db_stream_id") else req.stream_id).decode()
        tablet_id = req.tablet_id.decode()
        with self.cluster.lock:
            stream, state = self._changes_row(stream_id, tablet_id)
            tablet = self._serving(server, tablet_id, req.serve_as_proxy, _not_leader)
            if self.cluster.expired(state):
                raise expired(stream_id, tablet_id)
            state.active_ms = now_ms()
            cp = self._from_checkpoint(req, state, tablet_id)
            if cp.key == SNAPSHOT_DONE_KEY:
                # UpdateSnapshotDone: the key goes, cdc_sdk_safe_time = the request's snapshot_time
                state.snapshot_key = None
                state.safe_time = cp.snapshot_time
                state.polled = True
                _set_checkpoint(resp, state.checkpoint[0], state.checkpoint[1], b"", 0, 0)
                return
            if cp.write_id == -1 and cp.snapshot_time == 0 and not cp.key:
                self._bootstrap(stream, state, resp)
                return
            if cp.write_id != -1:
                self._stream(req, stream, tablet, state, cp, resp)
                return
            snapshot = (stream.snapshot_name, tablet.table, tablet.table.schema_at(stream.snapshot_ht))
            if cp.snapshot_time != stream.snapshot_ht or snapshot[0] is None:
                raise ServiceError(
                    CDC.INTERNAL_ERROR,
                    STATUS.INVALID_ARGUMENT,
                    f"snapshot time {cp.snapshot_time} is not stream {stream_id}'s consistent snapshot time",
                )
        limit = req.max_records or self.cluster.settings.snapshot_batch_size
        rows, more = self.reader.page(snapshot[0], snapshot[1], snapshot[2], (tablet.start, tablet.end), cp.key, limit)
        rows, more = _cut_by_bytes(rows, more, self.cluster.settings.snapshot_page_bytes)
        with self.cluster.lock:
            self._snapshot_page(req, stream, tablet, state, cp, snapshot[2], rows, more, resp)

    def _from_checkpoint(self, req, state: TabletState, tablet_id: str) -> pb.CDCSDKCheckpointPB:
        if req.HasField("from_cdc_sdk_checkpoint"):
            return req.from_cdc_sdk_checkpoint
        if state.checkpoint == INVALID:
            raise ServiceError(
                CDC.INTERNAL_ERROR,
                STATUS.INVALID_ARGUMENT,
                f"Invalid checkpoint -1.-1 for tablet {tablet_id}. Hint: set checkpoint explicitly or take snapshot",
            )
        return pb.CDCSDKCheckpointPB(term=state.checkpoint[0], index=state.checkpoint[1], key=b"", write_id=0)

    def _bootstrap(self, stream: Stream, state: TabletState, resp: pb.GetChangesResponsePB) -> None:
        """The snapshot starts at the stream's consistent snapshot; its op id becomes the
        checkpoint "irrespective of IMPLICIT or EXPLICIT"."""
        if stream.snapshot_name is None:
            # guess: the stand-in cannot take a per-tablet snapshot at the bootstrap's time
            raise ServiceError(
                CDC.INTERNAL_ERROR, STATUS.INVALID_ARGUMENT, f"stream {stream.stream_id} has no consistent snapshot"
            )
        state.checkpoint = state.start
        state.snapshot_key = b""
        state.safe_time = stream.snapshot_ht
        state.polled = True
        _set_checkpoint(resp, state.start[0], state.start[1], b"", -1, stream.snapshot_ht)
        resp.safe_hybrid_time = stream.snapshot_ht

    def _snapshot_page(self, req, stream, tablet, state, cp, schema, rows, more, resp) -> None:
        if req.need_schema_info or state.last_sent != _position(cp):
            resp.cdc_sdk_proto_records.append(records.ddl_record(tablet, schema, cp.term, cp.index, 0, 0))
        for row, key in rows:
            resp.cdc_sdk_proto_records.append(
                records.read_record(tablet, schema, row, key, cp.term, cp.index, stream.snapshot_ht)
            )
        if more:
            key = rows[-1][1] if rows else cp.key
            _set_checkpoint(resp, cp.term, cp.index, key, -1, stream.snapshot_ht)
        else:
            _set_checkpoint(resp, cp.term, cp.index, b"", 0, 0)  # isSnapshotCompleteMarker
        resp.safe_hybrid_time = stream.snapshot_ht
        state.polled = True
        state.last_sent = _position(resp.cdc_sdk_checkpoint)
        explicit = _explicit(req, stream)
        if explicit is not None:
            state.checkpoint = (explicit.term, explicit.index)
            if explicit.write_id == -1:
                state.snapshot_key = explicit.key
        elif stream.checkpoint_type == "IMPLICIT":
            state.snapshot_key = cp.key

    def _changes_row(self, stream_id: str, tablet_id: str) -> tuple[Stream, TabletState]:
        """``CheckTabletValidForStream`` for ``GetChanges``. A tablet without a ``cdc_state`` row of
        the stream (a split parent whose row was deleted) is a split when a tablet of the stream's
        tables, hidden ones included, names it as its split parent: ``TabletSplit`` "Tablet Split
        detected on $0 : $1" (``$1``: the InvalidArgument status), answered as ``TABLET_SPLIT``;
        otherwise INVALID_REQUEST "Tablet ID … is not part of stream ID …" (``cdc_service.cc``,
        ``CheckTabletValidForStream``; ``GetChanges`` maps ``IsTabletSplit() ? TABLET_SPLIT :
        INVALID_REQUEST``)."""
        stream = self.cluster.streams.get(stream_id)
        if stream is None:
            raise stream_not_found(stream_id, CDC.INVALID_REQUEST)
        state = stream.states.get(tablet_id)
        if state is not None:
            return stream, state
        refusal = not_in_stream(tablet_id, stream_id)
        if self.cluster.split_parent_named(stream.table_ids, tablet_id) is not None:
            # guess: the status's text form ("Invalid argument: …") without its file:line
            text = f"Tablet Split detected on {tablet_id} : Invalid argument: {refusal.message}"
            raise ServiceError(CDC.TABLET_SPLIT, STATUS.TABLET_SPLIT, text)
        raise refusal

    def _split_path(self, req, stream: Stream, tablet: Tablet, state: TabletState, cp, resume) -> int | None:
        """A split parent's answer, as ``GetChangesForCDCSDK`` gives it. Returns None to serve as
        usual, or the last op index to serve (a resumed transaction), or raises TABLET_SPLIT.

        - A resumed mid-transaction request (key set, write id not 0) takes the partial-transaction
          branch, which has no split check: the rest of that op is served.
        - Once the split is applied (``TABLET_DATA_SPLIT_COMPLETED``) the streaming branch answers
          ``TabletSplit`` "Tablet split detected on $0" at once, "moving to children tablets
          immediately" (``cdcsdk_producer.cc`` @00010c2f, @f2caf408): records after the request's
          checkpoint are served by the children, from their copied logs. With the setting
          ``split_racing_apply`` the parent still serves up to its split op first (YB's read loop
          reaching the SPLIT_OP before the parent's state is SPLIT_COMPLETED).
        - Before answering, the request's checkpoint is stored as for any ``GetChanges``
          (``UpdateChildrenTabletsOnSplitOpForCDCSDK`` resets the status to OK, then the usual
          update: EXPLICIT ``explicit_cdc_sdk_checkpoint``, IMPLICIT ``from_op_id``;
          ``cdc_service.cc`` ``GetChanges``)."""
        if tablet.split_index is None:
            return None
        if resume is not None:
            return cp.index
        if self.cluster.settings.split_racing_apply and cp.index < tablet.split_index:
            return None
        self._store_polled(req, stream, state, cp)
        state.split_reported = True  # the children's cdc_state rows take over
        state.polled = True
        # guess: YB's text here is "Tablet split detected on $0" (lower-case "split"); the stand-in
        # keeps the text GetChanges' caller-visible TABLET_SPLIT had (cdc_service.cc @c.73,612).
        raise tablet_split(tablet.tablet_id)

    @staticmethod
    def _store_polled(req, stream: Stream, state: TabletState, cp) -> None:
        """The checkpoint a ``GetChanges`` stores: EXPLICIT the explicit one sent, IMPLICIT its from."""
        explicit = _explicit(req, stream)
        if explicit is not None:
            state.checkpoint = (explicit.term, explicit.index)
        elif stream.checkpoint_type == "IMPLICIT" and cp.index > 0:
            state.checkpoint = (cp.term, cp.index)  # "In IMPLICIT mode the from_op_id itself will be the checkpoint"

    def _stream(self, req, stream: Stream, tablet: Tablet, state: TabletState, cp, resp) -> None:
        resume = cp.write_id if cp.key else None
        last_op = self._split_path(req, stream, tablet, state, cp, resume)
        needed = cp.index if resume is not None else cp.index + 1
        if needed <= tablet.collected_through:
            raise ServiceError(
                CDC.CHECKPOINT_TOO_OLD,
                STATUS.NOT_FOUND,
                f"The logs from index {needed} have been garbage collected and cannot be read: "
                f"op index {needed} has been already GCed",
            )
        if req.need_schema_info or state.last_sent != _position(cp):
            schema = tablet.schema_at(cp.index)
            resp.cdc_sdk_proto_records.append(records.ddl_record(tablet, schema, cp.term, cp.index, 0, 0))
        limit = req.max_records or self.cluster.settings.changes_page_size
        position = (cp.term, cp.index, cp.key, cp.write_id if resume is not None else 0)
        count, next_ht = 0, None
        for op in tablet.ops[tablet.position(needed) :]:
            if last_op is not None and op.index > last_op:
                next_ht = op.ht
                break
            if op.kind == "split":
                # YB: the safe time of a response that reaches the split op is that op's hybrid
                # time (the last WAL message read, have_more_messages), not the cluster's: the
                # parent vouches for nothing after its split.
                next_ht = op.ht + 1
                break
            if count >= limit:
                next_ht = op.ht
                break
            batch = records.op_records(op, tablet, stream.record_type)
            if resume is not None and op.index == cp.index:
                batch = [r for r in batch if r.cdc_sdk_op_id.write_id > resume]
            room = limit - count
            if len(batch) <= room:
                resp.cdc_sdk_proto_records.extend(batch)
                count += len(batch)
                position = (op.term, op.index, b"", 0)
                continue
            taken = batch[:room]
            resp.cdc_sdk_proto_records.extend(taken)
            last = taken[-1].cdc_sdk_op_id
            position = (op.term, op.index, last.write_id_key, last.write_id)
            next_ht = op.ht
            break
        _set_checkpoint(resp, *position, 0)
        safe = self.cluster.safe_ht if next_ht is None else next_ht - 1
        resp.safe_hybrid_time = max(safe, req.safe_hybrid_time)
        # A SAFEPOINT record ends the response unless it stops inside a transaction (YB's
        # pending_intents); then every record gets the request's checkpoint as from_op_id.
        if self.cluster.settings.safepoint_records and not position[2]:
            resp.cdc_sdk_proto_records.append(records.safepoint_record(tablet, resp.safe_hybrid_time))
        records.stamp_from_op_id(resp.cdc_sdk_proto_records, cp.term, cp.index, max(cp.write_id, 0), cp.key)
        state.polled = True
        state.safe_time = resp.safe_hybrid_time
        state.last_sent = position
        explicit = _explicit(req, stream)
        if tablet.parent is not None and explicit is not None:
            self.cluster.replicated(stream, tablet.tablet_id)
        if explicit is not None:
            state.checkpoint = (explicit.term, explicit.index)
        elif stream.checkpoint_type == "IMPLICIT" and cp.index > 0:
            state.checkpoint = (cp.term, cp.index)  # "In IMPLICIT mode the from_op_id itself will be the checkpoint"

    # -- checkpoints ----------------------------------------------------------------------------

    def _GetCheckpoint(self, server: int, req: pb.GetCheckpointRequestPB, resp: pb.GetCheckpointResponsePB) -> None:
        if not req.HasField("tablet_id"):
            raise invalid("Tablet ID is required to get CDC checkpoint")
        if not req.HasField("stream_id"):
            raise invalid("Stream ID is required to get CDC checkpoint")
        tablet_id = req.tablet_id.decode()
        with self.cluster.lock:
            _stream, state = self._stream_tablet(req.stream_id.decode(), tablet_id, CDC.INTERNAL_ERROR)
            self._serving(server, tablet_id, req.serve_as_proxy, _not_ready)
            resp.checkpoint.op_id.term, resp.checkpoint.op_id.index = state.checkpoint
            if state.snapshot_key is not None:
                resp.snapshot_key = state.snapshot_key
            resp.snapshot_time = state.safe_time

    def _SetCDCCheckpoint(self, server: int, req, resp) -> None:
        if not req.HasField("checkpoint") and not req.HasField("bootstrap"):
            raise invalid("OpId is required to set checkpoint")
        if not req.HasField("tablet_id"):
            raise invalid("Tablet ID is required to set checkpoint")
        if not req.HasField("stream_id"):
            raise invalid("Stream ID is required to set checkpoint")
        op_id = (req.checkpoint.op_id.term, req.checkpoint.op_id.index)
        if req.HasField("checkpoint") and (op_id[0] < -1 or op_id[1] < -1):
            raise invalid(f"Valid OpId is required to set checkpoint : {op_id[0]}.{op_id[1]}")
        stream_id, tablet_id = req.stream_id.decode(), req.tablet_id.decode()
        with self.cluster.lock:
            stream = self.cluster.streams.get(stream_id)
            if stream is None:
                raise stream_not_found(stream_id)
            tablet = self._serving(server, tablet_id, req.serve_as_proxy, _not_ready)
            state = stream.states.get(tablet_id)
            if state is None:
                raise not_in_stream(tablet_id, stream_id)
            # No CheckStreamActive here (YB's SetCDCCheckpoint has none): it sets active_time, so
            # it starts a stream created without a consistent snapshot and revives an expired
            # one, whose log may already be gone (CHECKPOINT_TOO_OLD from the old checkpoint).
            state.checkpoint = tablet.last_op_id() if req.bootstrap else op_id
            if req.HasField("cdc_sdk_safe_time") and not req.bootstrap:
                state.safe_time = req.cdc_sdk_safe_time
            if not req.bootstrap:
                # UpdateCheckpointAndActiveTime(..., is_snapshot = !bootstrap) writes the row's
                # snapshot_key "": the row reads as "snapshot in progress" afterwards.
                state.snapshot_key = b""
            state.active_ms = now_ms()
            state.expired = False
            state.polled = True
        self.cluster.collect_garbage()

    # -- discovery ------------------------------------------------------------------------------

    def _GetTabletListToPollForCDC(self, server: int, req, resp) -> None:
        info = req.table_info
        if req.HasField("table_info") and not info.table_id and not info.stream_id:
            raise invalid("StreamId and tableId required")
        stream_id, table_id = info.stream_id.decode(), info.table_id.decode()
        with self.cluster.lock:
            stream = self.cluster.streams.get(stream_id)
            if stream is None:
                raise stream_not_found(stream_id)
            if table_id not in stream.table_ids:
                raise ServiceError(CDC.TABLE_NOT_FOUND, STATUS.NOT_FOUND, f"Table {table_id} not found under stream")
            table = self.cluster.table_by_id(table_id)
            tablets = self.cluster.tablets_of(table, include_inactive=True) if table else []
            if req.tablet_id:
                parent = stream.states.get(req.tablet_id.decode())
                for tablet in tablets:
                    own = stream.states.get(tablet.tablet_id)
                    if tablet.parent == req.tablet_id.decode() and own is not None:
                        # the child's own checkpoint if valid, else the parent's row, else 0.0
                        # ("Did not find any row …": GetLastCheckpointFromCdcState)
                        valid = own.checkpoint[0] > 0 and own.checkpoint[1] > 0
                        chosen = own if valid else parent or TabletState(start=MIN_OP_ID, checkpoint=MIN_OP_ID)
                        self._pair(resp, tablet, chosen)
                return
            for tablet in tablets:
                if tablet.tablet_id in stream.states and self._to_poll(stream, tablet):
                    self._pair(resp, tablet, stream.states[tablet.tablet_id])

    def _to_poll(self, stream: Stream, tablet: Tablet) -> bool:
        """GetTabletIdsToPoll: a parent while it is being read, else its children."""
        states = stream.states

        def children_polled(parent: Tablet) -> bool:
            return all(states.get(c, TabletState(start=INVALID)).polled for c in parent.children or ())

        if tablet.children:
            return states[tablet.tablet_id].polled and not children_polled(tablet)
        ancestor_id = tablet.parent
        while ancestor_id is not None:
            ancestor = self.cluster.tablets[ancestor_id]
            if states.get(ancestor_id, TabletState(start=INVALID)).polled and not children_polled(ancestor):
                return False
            ancestor_id = ancestor.parent
        return True

    def _pair(self, resp, tablet: Tablet, state: TabletState) -> None:
        pair = resp.tablet_checkpoint_pairs.add()
        pair.tablet_locations.CopyFrom(self.cluster.locations(tablet))
        pair.cdc_sdk_checkpoint.term, pair.cdc_sdk_checkpoint.index = state.checkpoint
        if state.safe_time:
            pair.cdc_sdk_checkpoint.snapshot_time = state.safe_time

    def _GetLatestEntryOpId(self, server: int, req, resp) -> None:
        wanted = [req.tablet_id] if req.HasField("tablet_id") else list(req.tablet_ids)
        with self.cluster.lock:
            for raw in wanted:
                tablet = self.cluster.tablets.get(raw.decode())
                if tablet is None:
                    raise ServiceError(CDC.TABLET_NOT_FOUND, STATUS.NOT_FOUND, f"Tablet {raw.decode()} not found")
                term, index = tablet.last_op_id()
                if req.HasField("tablet_id"):
                    resp.op_id.term, resp.op_id.index = term, index
                resp.op_ids.add(term=term, index=index)
            resp.bootstrap_time = self.cluster.safe_ht

    def _GetCDCDBStreamInfo(self, server: int, req, resp) -> None:
        stream_id = req.db_stream_id.decode()
        with self.cluster.lock:
            stream = self.cluster.streams.get(stream_id)
            if stream is None:
                raise stream_not_found(stream_id)
            resp.namespace_id = stream.namespace_id.encode()
            for table_id in stream.table_ids:
                resp.table_info.add(stream_id=stream_id.encode(), table_id=table_id.encode())

    # -- checks ---------------------------------------------------------------------------------

    def _stream_tablet(self, stream_id: str, tablet_id: str, missing_code: int) -> tuple[Stream, TabletState]:
        """CheckTabletValidForStream."""
        stream = self.cluster.streams.get(stream_id)
        if stream is None:
            raise stream_not_found(stream_id, missing_code)
        state = stream.states.get(tablet_id)
        if state is None:
            raise not_in_stream(tablet_id, stream_id)
        return stream, state

    def _serving(self, server: int, tablet_id: str, serve_as_proxy: bool, refusal) -> Tablet:
        """The tablet if this server may answer for it: its leader, or (with proxy_to_leader)
        any server forwarding with serve_as_proxy."""
        tablet = self.cluster.tablets.get(tablet_id)
        if tablet is None:
            raise ServiceError(CDC.TABLET_NOT_FOUND, STATUS.NOT_FOUND, f"Tablet {tablet_id} not found")
        if tablet.leader == server or (serve_as_proxy and self.cluster.settings.proxy_to_leader):
            return tablet
        if server not in tablet.replicas:
            raise ServiceError(CDC.TABLET_NOT_FOUND, STATUS.NOT_FOUND, f"Tablet {tablet_id} not found")
        raise refusal(tablet, self.cluster, server)


def _not_leader(tablet: Tablet, cluster: Cluster, server: int) -> ServiceError:
    return ServiceError(CDC.TABLET_NOT_FOUND, STATUS.NOT_FOUND, f"Not leader for {tablet.tablet_id} NOT_LEADER")


def _not_ready(tablet: Tablet, cluster: Cluster, server: int) -> ServiceError:
    return ServiceError(CDC.LEADER_NOT_READY, STATUS.LEADER_NOT_READY_TO_SERVE, "Not ready to serve")


def _cut_by_bytes(rows: list, more: bool, budget: int) -> tuple[list, bool]:
    """A snapshot page cut once its rows pass ``budget`` bytes (newer YB's
    ``cdc_snapshot_records_threshold_size_bytes``; at least one row a page). The size is the
    rows' text, an approximation of the records' encoded size. 0: pages are cut by rows only."""
    if budget <= 0:
        return rows, more
    size = 0
    for count, (row, key) in enumerate(rows, start=1):
        size += len(key) + sum(len(v) for v in row.values() if v is not None)
        if size >= budget and count < len(rows):
            return rows[:count], True
    return rows, more


def _raise(fault: Fault) -> None:
    if fault.rpc_code is not None:
        raise RpcFailure(fault.rpc_code, fault.message)
    code, status = fault.service_code or CDC.INTERNAL_ERROR, fault.status_code or STATUS.RUNTIME_ERROR
    raise ServiceError(code, status, fault.message)


def _explicit(req: pb.GetChangesRequestPB, stream: Stream) -> pb.CDCSDKCheckpointPB | None:
    """The acknowledged checkpoint an EXPLICIT stream's client sends along."""
    if stream.checkpoint_type != "EXPLICIT" or not req.HasField("explicit_cdc_sdk_checkpoint"):
        return None
    explicit = req.explicit_cdc_sdk_checkpoint
    return None if (explicit.term, explicit.index) == INVALID else explicit


def _position(cp) -> tuple:
    return (cp.term, cp.index, bytes(cp.key), cp.write_id if cp.key else 0)


def _set_checkpoint(resp, term: int, index: int, key: bytes, write_id: int, snapshot_time: int) -> None:
    resp.cdc_sdk_checkpoint.term = term
    resp.cdc_sdk_checkpoint.index = index
    resp.cdc_sdk_checkpoint.key = key
    resp.cdc_sdk_checkpoint.write_id = write_id
    resp.cdc_sdk_checkpoint.snapshot_time = snapshot_time
    resp.checkpoint.op_id.term = term
    resp.checkpoint.op_id.index = index
