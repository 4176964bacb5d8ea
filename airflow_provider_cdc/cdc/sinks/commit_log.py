"""The sink's commit log: the durable record of which windows landed, and where.

Data files of a window are written under a fresh ``attempt=<id>`` directory; nothing reads them
until an entry naming that attempt is published in the log (an atomic, never-overwriting file
create, see :mod:`.storage`). Entries are numbered; when a window is committed again (a re-run),
the newest entry for that window id wins and the older attempt's files become garbage. Readers
therefore see exactly the committed windows and never a half-written one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_cdc.cdc.basics.errors import CdcStateError, InvalidOffsetError
from airflow_provider_cdc.cdc.basics.naming import commit_log_directory, landed_path_problem
from airflow_provider_cdc.cdc.basics.window import Window
from airflow_provider_cdc.cdc.sinks.storage import Storage

ENTRY_FORMAT = 1
_ENTRY_DIGITS = 20
_ENTRY_NAME = re.compile(rf"^\d{{{_ENTRY_DIGITS}}}\.json$")
#: The lake table formats a dataset's table commit may name (sinks.formats).
TABLE_FORMATS = ("iceberg", "delta")


@dataclass(frozen=True)
class DatasetCommit:
    topic: str
    path: str  # relative to the sink's base path
    events: int
    ops: dict[str, int] = field(default_factory=dict)
    # Iceberg/Delta sinks: the table commit that holds the window (formats.TableCommit's dict).
    table: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        data = {"topic": self.topic, "path": self.path, "events": self.events, "ops": dict(self.ops)}
        return data if self.table is None else {**data, "table": dict(self.table)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DatasetCommit:
        return cls(
            data["topic"], data["path"], int(data["events"]), dict(data.get("ops") or {}), data.get("table") or None
        )


@dataclass(frozen=True)
class CommitEntry:
    topic_prefix: str
    window: Window
    attempt: str
    datasets: tuple[DatasetCommit, ...]
    transactions: int
    last_commit_lsn: int | None
    last_tx_id: int | str | None  # YugabyteDB's CDC service: UUID strings
    last_commit_ts_us: int | None
    committed_at_ms: int
    stats: dict[str, Any] = field(default_factory=dict)
    log_seq: int = 0  # position in the log, set when read back

    @property
    def window_id(self) -> str:
        return self.window.window_id

    def dataset(self, topic: str) -> DatasetCommit | None:
        return next((d for d in self.datasets if d.topic == topic), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": ENTRY_FORMAT,
            "topic_prefix": self.topic_prefix,
            "window": self.window.to_dict(),
            "attempt": self.attempt,
            "datasets": [d.to_dict() for d in self.datasets],
            "transactions": self.transactions,
            "last_commit_lsn": self.last_commit_lsn,
            "last_tx_id": self.last_tx_id,
            "last_commit_ts_us": self.last_commit_ts_us,
            "committed_at_ms": self.committed_at_ms,
            "stats": self.stats,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, log_seq: int = 0) -> CommitEntry:
        if data.get("format") != ENTRY_FORMAT:
            raise InvalidOffsetError(f"commit log entry has unknown format {data.get('format')!r}")
        return cls(
            topic_prefix=data["topic_prefix"],
            window=Window.from_dict(data["window"]),
            attempt=data["attempt"],
            datasets=tuple(DatasetCommit.from_dict(d) for d in data["datasets"]),
            transactions=int(data["transactions"]),
            last_commit_lsn=data.get("last_commit_lsn"),
            last_tx_id=data.get("last_tx_id"),
            last_commit_ts_us=data.get("last_commit_ts_us"),
            committed_at_ms=int(data["committed_at_ms"]),
            stats=dict(data.get("stats") or {}),
            log_seq=log_seq,
        )


class CommitLog:
    def __init__(self, storage: Storage, topic_prefix: str):
        self.storage = storage
        self.topic_prefix = topic_prefix
        self.directory = commit_log_directory(topic_prefix)

    def _names(self) -> list[str]:
        return [n for n in self.storage.list_names(self.directory) if _ENTRY_NAME.match(n)]

    def _read(self, name: str) -> CommitEntry:
        text = self.storage.read_text(f"{self.directory}/{name}")
        where = self.storage.uri(f"{self.directory}/{name}")
        try:
            entry = CommitEntry.from_dict(json.loads(text), log_seq=int(name[: -len(".json")]))
        except (ValueError, KeyError, TypeError) as exc:
            raise CdcStateError(f"commit log entry {where} is unreadable ({exc})") from None
        problem = self._problem(entry)
        if problem:
            raise CdcStateError(
                f"commit log entry {where} is not one this capture wrote: {problem}. Whoever can write to the "
                "sink can write such an entry; nothing it names is read, deleted or acknowledged. Move it aside "
                "once you know where it came from"
            )
        return entry

    def _problem(self, entry: CommitEntry) -> str | None:
        """Why ``entry`` is not in the layout this capture writes (see :func:`naming.landed_path_problem`)."""
        if entry.topic_prefix != self.topic_prefix:
            return f"it belongs to capture {entry.topic_prefix!r}"
        for dataset in entry.datasets:
            problem = landed_path_problem(self.topic_prefix, dataset.path, entry.window_id, entry.attempt)
            if problem:
                return f"dataset {dataset.topic!r}: {problem}"
            if dataset.table is not None and (
                dataset.table.get("format") not in TABLE_FORMATS
                or dataset.table.get("attempt") != entry.attempt
                or dataset.table.get("window_seq") != entry.window.seq
            ):
                return f"dataset {dataset.topic!r}: its table commit is not of this window and attempt"
        return None

    def entries(self) -> list[CommitEntry]:
        """All entries in log order."""
        return [self._read(name) for name in self._names()]

    def committed(self) -> list[CommitEntry]:
        """The effective entry of every committed window (newest entry per window), by window."""
        latest: dict[int, CommitEntry] = {}
        for entry in self.entries():
            latest[entry.window.seq] = entry
        return [latest[seq] for seq in sorted(latest)]

    def newest_first(self) -> Iterator[CommitEntry]:
        """Entries from the newest back, read one at a time (stop early to read few)."""
        for name in reversed(self._names()):
            yield self._read(name)

    def latest(self) -> CommitEntry | None:
        """The newest entry: the last committed window (re-runs only ever repeat the newest).

        Reads one file, so a run's reconciliation costs the same after years of windows."""
        names = self._names()
        return self._read(names[-1]) if names else None

    def get(self, window_seq: int) -> CommitEntry | None:
        return next((e for e in reversed(self.entries()) if e.window.seq == window_seq), None)

    def append(self, entry: CommitEntry) -> CommitEntry:
        """Publish ``entry`` as the next log record. Fails if another writer took that number."""
        names = self._names()
        seq = (int(names[-1][: -len(".json")]) + 1) if names else 1
        rel = f"{self.directory}/{seq:0{_ENTRY_DIGITS}d}.json"
        try:
            self.storage.publish_text(rel, json.dumps(entry.to_dict(), sort_keys=True, indent=1))
        except FileExistsError:
            raise CdcStateError(
                f"commit log entry {self.storage.uri(rel)} was written concurrently: two runs of "
                f"capture {self.topic_prefix!r} committed at once"
            ) from None
        return CommitEntry.from_dict(entry.to_dict(), log_seq=seq)
