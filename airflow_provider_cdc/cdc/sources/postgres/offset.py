"""The stored offset of a PostgreSQL capture: a small, versioned JSON document.

Key names follow Debezium's PostgreSQL offsets where a concept exists there (``lsn``,
``lsn_commit``, ``txId``, ``ts_usec``, ``snapshot_completed``) so state can be migrated; LSNs
are stored as integers like Debezium does. ``format`` versions the document: loaders accept
every older format and refuse newer ones with a clear message. Meanings never change.

The offset also pins its identity (server system identifier, database, slot): an offset copied
from another database or slot is refused instead of silently skipping data.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from airflow_provider_cdc import __version__
from airflow_provider_cdc.cdc.errors import InvalidOffsetError
from airflow_provider_cdc.cdc.sources.postgres.incremental import IncrementalState
from airflow_provider_cdc.cdc.sources.postgres.lsn import Lsn, lsn_or_none
from airflow_provider_cdc.cdc.window import Window

OFFSET_FORMAT = 1
CONNECTOR = "postgresql"
_REMEDY = (
    " Delete it: the next run restores it from the sink's commit log (with an empty sink, the capture"
    " starts over with a new snapshot)."
)


@dataclass(frozen=True)
class OffsetIdentity:
    topic_prefix: str
    system_identifier: str
    database: str
    slot_name: str


@dataclass(frozen=True)
class PostgresOffset:
    identity: OffsetIdentity
    lsn: Lsn | None = None  # the next stream window starts here (commit LSNs >= lsn)
    lsn_commit: Lsn | None = None  # commit LSN of the last captured transaction
    tx_id: int | None = None
    ts_usec: int | None = None  # commit time of the last captured transaction
    snapshot_completed: bool = False
    snapshot_lsn: Lsn | None = None
    window_seq: int = 0  # last committed window
    pending: Window | None = None  # planned, not yet committed (retries reuse it)
    revision: int = 0  # increases on every save; stores compare it before writing
    # A running incremental snapshot: tables, their progress and chunks waiting to be emitted
    # (Debezium keeps the same in incremental_snapshot_* offset keys).
    incremental: IncrementalState | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def window_id(self) -> str | None:
        from airflow_provider_cdc.cdc.window import window_id_for

        return window_id_for(self.window_seq) if self.window_seq else None

    def with_pending(self, window: Window | None) -> PostgresOffset:
        return replace(self, pending=window)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": OFFSET_FORMAT,
            "connector": CONNECTOR,
            "topic_prefix": self.identity.topic_prefix,
            "system_identifier": self.identity.system_identifier,
            "database": self.identity.database,
            "slot_name": self.identity.slot_name,
            "lsn": _int(self.lsn),
            "lsn_commit": _int(self.lsn_commit),
            "txId": self.tx_id,
            "ts_usec": self.ts_usec,
            "snapshot_completed": self.snapshot_completed,
            "snapshot_lsn": _int(self.snapshot_lsn),
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
    def from_json(cls, text: str | bytes | dict, *, source: str = "offset store") -> PostgresOffset:
        if isinstance(text, dict):
            data = text
        else:
            try:
                data = json.loads(text)
            except (TypeError, ValueError) as exc:
                raise InvalidOffsetError(f"{source}: the stored offset is not valid JSON ({exc}).{_REMEDY}") from None
        if not isinstance(data, dict):
            raise InvalidOffsetError(f"{source}: the stored offset is not a JSON object.{_REMEDY}")
        fmt = data.get("format")
        if not isinstance(fmt, int) or fmt < 1:
            raise InvalidOffsetError(
                f"{source}: the stored offset has no valid 'format' version; it was not written by "
                f"airflow-provider-cdc (or was edited by hand).{_REMEDY}"
            )
        if fmt > OFFSET_FORMAT:
            raise InvalidOffsetError(
                f"{source}: the stored offset has format {fmt}, newer than this provider understands "
                f"({OFFSET_FORMAT}); upgrade airflow-provider-cdc"
            )
        if data.get("connector") != CONNECTOR:
            raise InvalidOffsetError(
                f"{source}: the stored offset belongs to connector {data.get('connector')!r}, not {CONNECTOR!r}."
                f"{_REMEDY}"
            )
        try:
            return cls(
                identity=OffsetIdentity(
                    topic_prefix=_str(data, "topic_prefix"),
                    system_identifier=_str(data, "system_identifier"),
                    database=_str(data, "database"),
                    slot_name=_str(data, "slot_name"),
                ),
                lsn=lsn_or_none(data.get("lsn")),
                lsn_commit=lsn_or_none(data.get("lsn_commit")),
                tx_id=_opt_int(data.get("txId")),
                ts_usec=_opt_int(data.get("ts_usec")),
                snapshot_completed=bool(data.get("snapshot_completed", False)),
                snapshot_lsn=lsn_or_none(data.get("snapshot_lsn")),
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
        mismatches = [
            f"{name} is {getattr(self.identity, name)!r}, expected {getattr(expected, name)!r}"
            for name in ("topic_prefix", "system_identifier", "database", "slot_name")
            if getattr(self.identity, name) != getattr(expected, name)
        ]
        if mismatches:
            raise InvalidOffsetError(
                f"{source}: the stored offset belongs to another capture ({'; '.join(mismatches)}). "
                "Offsets are only valid for the server, database and slot that produced them; using "
                "them elsewhere would skip or repeat changes. Delete the stored offset: the next run restores "
                "this capture's own from its sink's commit log (with an empty sink, it starts over with a new "
                "snapshot)."
            )


def _int(lsn: Lsn | None) -> int | None:
    return None if lsn is None else int(lsn)


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _str(data: dict, key: str) -> str:
    value = data[key]
    if not isinstance(value, str) or not value:
        raise InvalidOffsetError(f"field {key!r} must be a non-empty string")
    return value
