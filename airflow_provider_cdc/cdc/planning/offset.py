"""The stored offset of a capture: a small, versioned JSON document, the same for every source.

Every source records the same progress (the next window's start position, the last captured
transaction, whether the snapshot completed, the last committed window, the pending window, an
incremental snapshot, run records), under the key names its Debezium connector uses where the
concept exists there, so state can be migrated; positions are stored as integers, like
Debezium. A source describes its document with an :class:`OffsetFormat` and subclasses
:class:`CaptureOffset` with it. ``format`` versions the document: loaders accept every older
format and refuse newer ones with a clear message. Meanings never change.

The offset also pins its identity (the server and database, and the server-side reader where
the source has one, e.g. PostgreSQL's slot): an offset copied from another database is refused
instead of silently skipping data.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, TypeVar

from airflow_provider_cdc import __version__
from airflow_provider_cdc.cdc.basics.errors import InvalidOffsetError
from airflow_provider_cdc.cdc.basics.positions import Position, position_or_none
from airflow_provider_cdc.cdc.basics.window import Window, window_id_for
from airflow_provider_cdc.cdc.planning.incremental import IncrementalState

OFFSET_FORMAT = 1
_REMEDY = (
    " Delete it: the next run restores it from the sink's commit log (with an empty sink, the capture"
    " starts over with a new snapshot)."
)
_IDENTITY = ("topic_prefix", "system_identifier", "database", "slot_name")

OffsetT = TypeVar("OffsetT", bound="CaptureOffset")


@dataclass(frozen=True)
class OffsetIdentity:
    topic_prefix: str
    system_identifier: str  # the server (PostgreSQL's system identifier, SQL Server's database GUID)
    database: str
    slot_name: str | None = None  # the source's server-side reader, where it has one


@dataclass(frozen=True)
class OffsetFormat:
    """How one source names the offset's fields in the stored document."""

    connector: str  # Debezium's connector name, stored as "connector"
    position: type[Position]
    # attribute -> document key, for the position and identity fields (others are shared)
    keys: Mapping[str, str]
    slot: bool = True  # does the identity name a server-side reader (slot)?

    def key(self, attribute: str) -> str:
        return self.keys.get(attribute, attribute)


@dataclass(frozen=True)
class CaptureOffset:
    """A capture's progress. Subclasses set ``FORMAT``."""

    FORMAT: ClassVar[OffsetFormat]

    identity: OffsetIdentity
    lsn: Position | None = None  # the next stream window starts here (commit positions >= lsn)
    lsn_commit: Position | None = None  # commit position of the last captured transaction
    tx_id: int | str | None = None
    ts_usec: int | None = None  # commit time of the last captured transaction
    snapshot_completed: bool = False
    snapshot_lsn: Position | None = None
    window_seq: int = 0  # last committed window
    pending: Window | None = None  # planned, not yet committed (retries reuse it)
    revision: int = 0  # increases on every save; stores compare it before writing
    # A running incremental snapshot: tables, their progress and chunks waiting to be emitted
    # (Debezium keeps the same in incremental_snapshot_* offset keys).
    incremental: IncrementalState | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def window_id(self) -> str | None:
        return window_id_for(self.window_seq) if self.window_seq else None

    def with_pending(self: OffsetT, window: Window | None) -> OffsetT:
        return replace(self, pending=window)

    def to_dict(self) -> dict[str, Any]:
        fmt = self.FORMAT
        identity = {
            fmt.key(name): getattr(self.identity, name) for name in _IDENTITY if name != "slot_name" or fmt.slot
        }
        return {
            "format": OFFSET_FORMAT,
            "connector": fmt.connector,
            **identity,
            fmt.key("lsn"): _int(self.lsn),
            fmt.key("lsn_commit"): _int(self.lsn_commit),
            fmt.key("tx_id"): self.tx_id,
            fmt.key("ts_usec"): self.ts_usec,
            "snapshot_completed": self.snapshot_completed,
            fmt.key("snapshot_lsn"): _int(self.snapshot_lsn),
            "window_seq": self.window_seq,
            "window_id": self.window_id,
            "pending": self.pending.to_dict() if self.pending else None,
            "revision": self.revision,
            "provider_version": __version__,
            **({"incremental_snapshot": self.incremental.to_dict()} if self.incremental is not None else {}),
            **({"extra": self.extra} if self.extra else {}),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls: type[OffsetT], text: str | bytes | dict, *, source: str = "offset store") -> OffsetT:
        fmt = cls.FORMAT
        if isinstance(text, dict):
            data = text
        else:
            try:
                data = json.loads(text)
            except (TypeError, ValueError) as exc:
                raise InvalidOffsetError(f"{source}: the stored offset is not valid JSON ({exc}).{_REMEDY}") from None
        if not isinstance(data, dict):
            raise InvalidOffsetError(f"{source}: the stored offset is not a JSON object.{_REMEDY}")
        version = data.get("format")
        if not isinstance(version, int) or version < 1:
            raise InvalidOffsetError(
                f"{source}: the stored offset has no valid 'format' version; it was not written by "
                f"airflow-provider-cdc (or was edited by hand).{_REMEDY}"
            )
        if version > OFFSET_FORMAT:
            raise InvalidOffsetError(
                f"{source}: the stored offset has format {version}, newer than this provider understands "
                f"({OFFSET_FORMAT}); upgrade airflow-provider-cdc"
            )
        if data.get("connector") != fmt.connector:
            raise InvalidOffsetError(
                f"{source}: the stored offset belongs to connector {data.get('connector')!r}, not "
                f"{fmt.connector!r}.{_REMEDY}"
            )
        position = fmt.position
        try:
            return cls(
                identity=OffsetIdentity(
                    topic_prefix=_str(data, "topic_prefix"),
                    system_identifier=_str(data, fmt.key("system_identifier")),
                    database=_str(data, fmt.key("database")),
                    slot_name=_str(data, fmt.key("slot_name")) if fmt.slot else None,
                ),
                lsn=position_or_none(data.get(fmt.key("lsn")), position),
                lsn_commit=position_or_none(data.get(fmt.key("lsn_commit")), position),
                tx_id=_tx_id(data.get(fmt.key("tx_id"))),
                ts_usec=_opt_int(data.get(fmt.key("ts_usec"))),
                snapshot_completed=bool(data.get("snapshot_completed", False)),
                snapshot_lsn=position_or_none(data.get(fmt.key("snapshot_lsn")), position),
                window_seq=int(data.get("window_seq", 0)),
                pending=Window.from_dict(data["pending"]) if data.get("pending") else None,
                revision=int(data.get("revision", 0)),
                incremental=IncrementalState.from_dict(data["incremental_snapshot"])
                if data.get("incremental_snapshot")
                else None,
                extra=dict(data.get("extra") or {}),
            )
        except InvalidOffsetError as exc:
            raise InvalidOffsetError(f"{source}: {exc}.{_REMEDY}") from None
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidOffsetError(f"{source}: malformed offset document ({exc}).{_REMEDY}") from None

    def check_identity(self, expected: OffsetIdentity, *, source: str = "offset store") -> None:
        """Refuse an offset that belongs to another server, database, slot or capture."""
        fmt = self.FORMAT
        mismatches = [
            f"{fmt.key(name)} is {getattr(self.identity, name)!r}, expected {getattr(expected, name)!r}"
            for name in _IDENTITY
            if getattr(self.identity, name) != getattr(expected, name)
        ]
        if mismatches:
            where = "server, database and slot" if fmt.slot else "server and database"
            raise InvalidOffsetError(
                f"{source}: the stored offset belongs to another capture ({'; '.join(mismatches)}). "
                f"Offsets are only valid for the {where} that produced them; using "
                "them elsewhere would skip or repeat changes. Delete the stored offset: the next run restores "
                "this capture's own from its sink's commit log (with an empty sink, it starts over with a new "
                "snapshot)."
            )


def _int(position: Position | None) -> int | None:
    return None if position is None else int(position)


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _tx_id(value: Any) -> int | str | None:
    """PostgreSQL's transaction ids are numbers; SQL Server's ``tran_id`` is hexadecimal text."""
    return value if value is None or isinstance(value, str) else int(value)


def _str(data: dict, key: str) -> str:
    value = data[key]
    if not isinstance(value, str) or not value:
        raise InvalidOffsetError(f"field {key!r} must be a non-empty string")
    return value
