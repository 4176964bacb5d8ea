"""Per-tablet checkpoints of a CDC-service stream: where each tablet's next ``GetChanges`` starts.

A :class:`Checkpoint` is YB's ``CDCSDKCheckpointPB`` (term, index, key, write id, snapshot time;
``cdc_service.proto``). Its text form is the Debezium YugabyteDB gRPC connector's ``OpId``
(``term:index:<key as base64>:write_id:snapshot_time``, e.g. ``1:4::0:0``; ``OpId.toSerString``),
which is also what that connector stores per tablet in its offsets and prints as ``source.lsn``.

A checkpoint alone does not say where a tablet's changes resume. YB sorts each response's records
by commit time and only moves the response checkpoint past WAL operations whose records have all
been sent (``cdcsdk_producer.cc``, ``CanUpdateCheckpointOpId``), so a checkpoint can lie behind
records already received; what was received is told by the safe hybrid time the client sends back,
records committed at or before it are not sent again (``GetCommitTimeThreshold``). A
:class:`TabletPosition` is therefore the request triple ``(checkpoint, safe_hybrid_time,
wal_segment_index)``. :class:`TabletCheckpoints` holds one per tablet of the stream, with the
tablet's tables and its split parent/children.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from airflow_provider_cdc.cdc.basics.errors import InvalidOffsetError
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb

_INT64 = (-(1 << 63), (1 << 63) - 1)
_INT32 = (-(1 << 31), (1 << 31) - 1)
_UINT64 = (0, (1 << 64) - 1)


def _check(name: str, value: Any, bounds: tuple[int, int]) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not bounds[0] <= value <= bounds[1]:
        raise InvalidOffsetError(f"checkpoint {name} must be an integer in [{bounds[0]}, {bounds[1]}], got {value!r}")
    return value


def op_id_text(term: int, index: int, key: bytes, write_id: int, snapshot_time: int) -> str:
    """:meth:`Checkpoint.text` without building one: called per record for ``source.lsn``."""
    encoded = base64.b64encode(key).decode("ascii") if key else ""
    return f"{term}:{index}:{encoded}:{write_id}:{snapshot_time}"


@dataclass(frozen=True)
class Checkpoint:
    """YB's ``CDCSDKCheckpointPB``: a position in one tablet's WAL (``key``/``write_id`` resume a
    transaction sent over several responses; ``write_id = -1`` marks a snapshot in progress)."""

    term: int
    index: int
    key: bytes = b""
    write_id: int = 0
    snapshot_time: int = 0

    def __post_init__(self) -> None:
        _check("term", self.term, _INT64)
        _check("index", self.index, _INT64)
        _check("write_id", self.write_id, _INT32)
        _check("snapshot_time", self.snapshot_time, _UINT64)
        if not isinstance(self.key, bytes):
            raise InvalidOffsetError(f"checkpoint key must be bytes, got {type(self.key).__name__}")

    @property
    def in_snapshot(self) -> bool:
        """A snapshot's checkpoint (bootstrap or paging): YB reads ``write_id == -1`` as a snapshot call."""
        return self.write_id == -1

    def text(self) -> str:
        """Debezium's ``OpId.toSerString``: ``term:index:base64(key):write_id:snapshot_time``."""
        return op_id_text(self.term, self.index, self.key, self.write_id, self.snapshot_time)

    @classmethod
    def parse(cls, text: str) -> Checkpoint:
        """The inverse of :meth:`text` (``OpId.valueOf``)."""
        parts = text.split(":") if isinstance(text, str) else []
        if len(parts) != 5:
            raise InvalidOffsetError(f"not a tablet checkpoint 'term:index:key:write_id:time': {text!r}")
        try:
            term, index, write_id, time = (int(parts[i]) for i in (0, 1, 3, 4))
            key = base64.b64decode(parts[2], validate=True)
        except (ValueError, binascii.Error):
            raise InvalidOffsetError(f"not a tablet checkpoint 'term:index:key:write_id:time': {text!r}") from None
        return cls(term, index, key, write_id, time)

    def to_json(self) -> dict[str, Any]:
        return {
            "term": self.term,
            "index": self.index,
            "key": base64.b64encode(self.key).decode("ascii"),
            "write_id": self.write_id,
            "snapshot_time": self.snapshot_time,
        }

    @classmethod
    def from_json(cls, value: str | Mapping[str, Any]) -> Checkpoint:
        """From :meth:`to_json`'s object or :meth:`text`'s string."""
        if isinstance(value, str):
            return cls.parse(value)
        if not isinstance(value, Mapping):
            raise InvalidOffsetError(f"not a tablet checkpoint: {value!r}")
        try:
            key = base64.b64decode(value.get("key") or "", validate=True)
        except (TypeError, ValueError, binascii.Error):
            raise InvalidOffsetError(f"tablet checkpoint key is not base64: {value.get('key')!r}") from None
        try:
            return cls(
                term=value["term"],
                index=value["index"],
                key=key,
                write_id=value.get("write_id", 0),
                snapshot_time=value.get("snapshot_time", 0),
            )
        except KeyError as exc:
            raise InvalidOffsetError(f"tablet checkpoint without {exc}: {dict(value)!r}") from None

    def to_pb(self) -> pb.CDCSDKCheckpointPB:
        return pb.CDCSDKCheckpointPB(
            term=self.term, index=self.index, key=self.key, write_id=self.write_id, snapshot_time=self.snapshot_time
        )

    @classmethod
    def from_pb(cls, message: pb.CDCSDKCheckpointPB) -> Checkpoint:
        return cls(message.term, message.index, message.key, message.write_id, message.snapshot_time)

    def __str__(self) -> str:
        return self.text()


@dataclass(frozen=True)
class TabletPosition:
    """Where a tablet's next ``GetChanges`` starts: the request's checkpoint, the safe hybrid time
    it sends back (``-1``: none, the request field's default) and the WAL segment index."""

    checkpoint: Checkpoint
    safe_hybrid_time: int = -1
    wal_segment_index: int = 0

    def __post_init__(self) -> None:
        _check("safe_hybrid_time", self.safe_hybrid_time, _INT64)
        _check("wal_segment_index", self.wal_segment_index, _INT32)


@dataclass(frozen=True)
class TabletState:
    """One tablet of the stream: its position, the stream's tables it holds, and its split lineage.
    A tablet with children has been split: it is no longer polled."""

    position: TabletPosition
    table_ids: tuple[str, ...] = ()
    parent: str | None = None
    children: tuple[str, ...] = ()

    @property
    def split(self) -> bool:
        return bool(self.children)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "lsn": self.position.checkpoint.text(),  # Debezium's per-tablet offset value
            "safe_hybrid_time": self.position.safe_hybrid_time,
            "wal_segment_index": self.position.wal_segment_index,
        }
        if self.table_ids:
            data["table_ids"] = list(self.table_ids)
        if self.parent is not None:
            data["parent"] = self.parent
        if self.children:
            data["children"] = list(self.children)
        return data

    @classmethod
    def from_json(cls, value: str | Mapping[str, Any]) -> TabletState:
        """From :meth:`to_json`, or a bare checkpoint string (Debezium's ``tablet → OpId`` offsets,
        and the first form of this document): the rest then takes its defaults."""
        if isinstance(value, str):
            return cls(TabletPosition(Checkpoint.parse(value)))
        if not isinstance(value, Mapping):
            raise InvalidOffsetError(f"not a tablet checkpoint entry: {value!r}")
        raw = value.get("lsn", value.get("checkpoint"))
        if raw is None:
            raise InvalidOffsetError(f"tablet checkpoint entry without 'lsn': {dict(value)!r}")
        safe = value.get("safe_hybrid_time")
        position = TabletPosition(
            Checkpoint.from_json(raw),
            safe_hybrid_time=-1 if safe is None else safe,
            wal_segment_index=value.get("wal_segment_index") or 0,
        )
        parent = value.get("parent")
        if parent is not None and not isinstance(parent, str):
            raise InvalidOffsetError(f"tablet parent must be a tablet id, got {parent!r}")
        return cls(
            position,
            table_ids=_strings(value.get("table_ids"), "table_ids"),
            parent=parent,
            children=_strings(value.get("children"), "children"),
        )


def _strings(value: Any, name: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise InvalidOffsetError(f"tablet {name} must be a list of ids, got {value!r}")
    return tuple(value)


class TabletCheckpoints(Mapping[str, TabletState]):
    """The tablets of one stream (tablet id → :class:`TabletState`), immutable."""

    def __init__(self, tablets: Mapping[str, TabletState] | None = None):
        self._tablets: dict[str, TabletState] = dict(sorted((tablets or {}).items()))

    def __getitem__(self, tablet_id: str) -> TabletState:
        return self._tablets[tablet_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tablets)

    def __len__(self) -> int:
        return len(self._tablets)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TabletCheckpoints) and self._tablets == other._tablets

    def __hash__(self) -> int:
        return hash(tuple(self._tablets.items()))

    def __repr__(self) -> str:
        return f"TabletCheckpoints({self._tablets!r})"

    def polled(self) -> dict[str, TabletPosition]:
        """The tablets a window reads (every tablet not yet split), by id."""
        return {tablet: state.position for tablet, state in self._tablets.items() if not state.split}

    def with_tablet(self, tablet_id: str, state: TabletState) -> TabletCheckpoints:
        """A tablet added (a new table of the stream); an existing one is refused."""
        if tablet_id in self._tablets:
            raise ValueError(f"tablet {tablet_id} is already in the stream's checkpoints")
        return TabletCheckpoints({**self._tablets, tablet_id: state})

    def advanced(self, positions: Mapping[str, TabletPosition]) -> TabletCheckpoints:
        """The positions a window ended at, for tablets it read (each must be known and not split)."""
        tablets = dict(self._tablets)
        for tablet_id, position in positions.items():
            state = tablets.get(tablet_id)
            if state is None:
                raise ValueError(f"tablet {tablet_id} is not in the stream's checkpoints")
            if state.split:
                raise ValueError(f"tablet {tablet_id} was split into {', '.join(state.children)}; it is not read")
            tablets[tablet_id] = replace(state, position=position)
        return TabletCheckpoints(tablets)

    def split(self, parent: str, children: Mapping[str, TabletPosition]) -> TabletCheckpoints:
        """``parent`` replaced by ``children`` (each starting at its given position, holding the
        parent's tables). The parent stays, marked, so a retried window sees the same lineage."""
        state = self._tablets.get(parent)
        if state is None:
            raise ValueError(f"split of unknown tablet {parent}")
        if state.split:
            raise ValueError(f"tablet {parent} was already split into {', '.join(state.children)}")
        if len(children) < 2:
            raise ValueError(f"a split of tablet {parent} needs at least two children, got {sorted(children)}")
        clash = sorted(set(children) & set(self._tablets))
        if clash:
            raise ValueError(f"children {', '.join(clash)} of tablet {parent} are already in the stream")
        tablets = {**self._tablets, parent: replace(state, children=tuple(sorted(children)))}
        for child, position in children.items():
            tablets[child] = TabletState(position, table_ids=state.table_ids, parent=parent)
        return TabletCheckpoints(tablets)

    def to_json(self) -> dict[str, Any]:
        return {tablet: state.to_json() for tablet, state in self._tablets.items()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> TabletCheckpoints:
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise InvalidOffsetError(f"tablet checkpoints must be an object of tablet id → entry, got {data!r}")
        tablets = {}
        for tablet_id, value in data.items():
            try:
                tablets[str(tablet_id)] = TabletState.from_json(value)
            except InvalidOffsetError as exc:
                raise InvalidOffsetError(f"tablet {tablet_id}: {exc}") from None
        return cls(tablets)


@dataclass(frozen=True)
class StoredCheckpoint:
    """A tablet's ``cdc_state`` row as ``GetCheckpoint`` reports it (``cdc_service.cc``): the op id,
    the snapshot key while the row is marked "snapshot in progress" (None otherwise) and
    ``cdc_sdk_safe_time`` (0 when unset)."""

    term: int
    index: int
    snapshot_key: bytes | None = None
    snapshot_time: int = 0

    @property
    def never_set(self) -> bool:
        """-1.-1 (``OpId::Invalid``): the master's row of a stream created without a consistent
        snapshot, before any ``SetCDCCheckpoint``. YB counts such a tablet as expired
        (``active_time`` 0) until a ``SetCDCCheckpoint`` sets it."""
        return (self.term, self.index) == (-1, -1)

    @property
    def checkpoint(self) -> Checkpoint:
        return Checkpoint(self.term, self.index)


__all__ = ["Checkpoint", "StoredCheckpoint", "TabletCheckpoints", "TabletPosition", "TabletState"]
