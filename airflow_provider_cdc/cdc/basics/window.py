"""The capture window: one Airflow run's finite, deterministic slice of changes.

A stream window covers the transactions whose commit position is in ``[from_lsn, to_lsn)``: the
lower bound is inclusive and the upper bound exclusive, for every source. On PostgreSQL this is
the server's own rule for a slot confirmed at ``to_lsn`` (``SnapBuildXactNeedsSkip`` skips
commits that start before the confirmed position), so acknowledging ``to_lsn`` after the window
never loses or repeats a transaction; on SQL Server it is ``__$start_lsn`` (the commit LSN) in
``[from, to)``, read as ``[from, fn_cdc_decrement_lsn(to)]``. A snapshot window has no range
until it runs: its ``to_lsn`` becomes the consistent point of the snapshot, where the stream
continues. Positions are the source's own type (:mod:`positions`); the stored form names it.

Window ids are the zero-padded sequence number, fixed when the window is planned and stored as
"pending" in the offset, so a retry runs the same window id with the same bounds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from airflow_provider_cdc.cdc.basics.errors import InvalidOffsetError
from airflow_provider_cdc.cdc.basics.positions import Position, position_class, position_or_none

WindowKind = Literal["snapshot", "stream", "query"]
WINDOW_KINDS = ("snapshot", "stream", "query")  # query: a query-based extraction (no LSNs)


@dataclass(frozen=True)
class Window:
    seq: int
    kind: WindowKind
    from_lsn: Position | None
    to_lsn: Position | None
    planned_at_ms: int

    def __post_init__(self) -> None:
        if self.seq < 1:
            raise InvalidOffsetError(f"window sequence numbers start at 1, got {self.seq}")
        if self.kind not in WINDOW_KINDS:
            raise InvalidOffsetError(f"unknown window kind {self.kind!r}")
        if self.kind == "stream":
            if self.from_lsn is None or self.to_lsn is None:
                raise InvalidOffsetError("a stream window needs both from_lsn and to_lsn")
            if self.to_lsn < self.from_lsn:
                raise InvalidOffsetError(f"window ends ({self.to_lsn}) before it starts ({self.from_lsn})")

    @property
    def window_id(self) -> str:
        return window_id_for(self.seq)

    @property
    def is_empty_range(self) -> bool:
        return self.kind == "stream" and self.from_lsn == self.to_lsn

    def contains_commit(self, commit_lsn: int) -> bool:
        """Does a transaction whose commit record starts at ``commit_lsn`` belong here?"""
        if self.from_lsn is None or self.to_lsn is None:
            raise RuntimeError(f"{self.describe()} has no positions: only stream windows contain commits")
        return self.from_lsn <= commit_lsn < self.to_lsn

    @property
    def source(self) -> str | None:
        """The source whose positions bound this window (None: no positions yet)."""
        position = self.to_lsn if self.to_lsn is not None else self.from_lsn
        return getattr(position, "SOURCE", None) or None

    def with_end(self, to_lsn: Position) -> Window:
        return replace(self, to_lsn=to_lsn)

    def to_dict(self) -> dict[str, Any]:
        source = self.source
        return {
            "seq": self.seq,
            "window_id": self.window_id,
            "kind": self.kind,
            "from_lsn": _int_or_none(self.from_lsn),
            "to_lsn": _int_or_none(self.to_lsn),
            "planned_at_ms": self.planned_at_ms,
            **({"source": source} if source else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Window:
        try:
            position = position_class(data.get("source"))
            return cls(
                seq=int(data["seq"]),
                kind=data["kind"],
                from_lsn=position_or_none(data.get("from_lsn"), position),
                to_lsn=position_or_none(data.get("to_lsn"), position),
                planned_at_ms=int(data["planned_at_ms"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidOffsetError(f"malformed window record {data!r}: {exc}") from None

    def describe(self) -> str:
        if self.kind == "snapshot":
            where = f" at {self.to_lsn}" if self.to_lsn is not None else ""
            return f"snapshot window {self.window_id}{where}"
        if self.kind == "query":
            return f"query window {self.window_id}"
        return f"stream window {self.window_id} [{self.from_lsn}, {self.to_lsn})"


def window_id_for(seq: int) -> str:
    return f"{seq:010d}"


def _int_or_none(lsn: Position | None) -> int | None:
    return None if lsn is None else int(lsn)
