"""Incremental (DBLog watermark) snapshots, for every source: the state kept in the offset, and signals.

An incremental snapshot re-reads tables while capture continues, one chunk at a time, ordered
by the table's key (or a surrogate key) with keyset pagination: no locks, no long transaction,
and progress is kept in the offset, so it resumes at the next chunk after a crash or across runs.

Each chunk is read between a low and a high watermark (positions in the source's change log)
and may remember which transactions its SELECT saw (a source-specific visibility token, e.g.
PostgreSQL's ``pg_current_snapshot()``). A chunk read by one window's job is emitted by the
next window, the first whose stream covers the high watermark: chunk rows whose key was changed
inside the watermark window, or by a transaction the chunk's SELECT did not see, are dropped in
favour of the stream events; the rest become ``op = r`` events with ``source.snapshot =
"incremental"``, ordered at the high watermark.

This module is pure (state and signals); each source reads and emits chunks.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import re2

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.basics.tables import TableRef
from airflow_provider_cdc.cdc.planning.row_filter import FilterError, canonical, parse_filter

WATERMARK_OPEN = "airflow_provider_cdc.snapshot-window-open"
WATERMARK_CLOSE = "airflow_provider_cdc.snapshot-window-close"
#: How chunk watermarks are written: "message" (PostgreSQL's non-transactional logical messages) or
#: Debezium's signal-table rows (insert then insert, or insert then delete).
WATERMARK_MODES = ("message", "insert_insert", "insert_delete")

#: Signal types (Debezium's names); the watermark rows of the signal-table strategies are not signals.
SIGNAL_TYPES = ("execute-snapshot", "stop-snapshot", "pause-snapshot", "resume-snapshot", "log")
WATERMARK_SIGNAL_TYPES = ("snapshot-window-open", "snapshot-window-close")

#: What a DAG run's conf may never carry in a signal (anyone who may trigger the DAG writes it):
#: row filters and surrogate keys shape the SQL the capture role runs.
RUN_CONF_FORBIDDEN_KEYS = ("additional-conditions", "surrogate-key")
MAX_RUN_CONF_SIGNALS = 20

_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # the error is raised with its reason; nothing on stderr
_MAX_PATTERNS = 100
_MAX_PATTERN_CHARS = 1_000
_APPLIED_SIGNALS_KEPT = 200
_HISTORY_KEPT = 50


class SignalError(CdcConfigurationError):
    """A signal that cannot be applied (bad JSON, unknown table, unsupported type)."""


@dataclass(frozen=True)
class TableProgress:
    """One table of the incremental snapshot. Keys are kept in PostgreSQL's text form."""

    table: TableRef
    signal_id: str
    # Debezium's additional-conditions filter, in row_filter's canonical text: parsed again
    # wherever it is read (never pasted into SQL), so an edited offset meets the same rules.
    condition: str | None = None
    surrogate_key: str | None = None  # chunk by this column instead of the primary key
    status: str = "pending"  # pending → running → done | failed | stopped
    max_key: tuple[str, ...] | None = None  # the table's last key when the snapshot started
    last_key: tuple[str, ...] | None = None  # the last key read (chunks continue after it)
    chunks: int = 0
    rows: int = 0
    error: str | None = None

    @property
    def active(self) -> bool:
        return self.status in ("pending", "running")

    def to_dict(self) -> dict[str, Any]:
        return {
            "table": self.table.to_json(),
            "signal_id": self.signal_id,
            "condition": self.condition,
            "surrogate_key": self.surrogate_key,
            "status": self.status,
            "max_key": None if self.max_key is None else list(self.max_key),
            "last_key": None if self.last_key is None else list(self.last_key),
            "chunks": self.chunks,
            "rows": self.rows,
            "error": self.error,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TableProgress:
        return cls(
            table=TableRef(*data["table"]),
            signal_id=str(data["signal_id"]),
            condition=data.get("condition"),
            surrogate_key=data.get("surrogate_key"),
            status=data.get("status", "pending"),
            max_key=None if data.get("max_key") is None else tuple(data["max_key"]),
            last_key=None if data.get("last_key") is None else tuple(data["last_key"]),
            chunks=int(data.get("chunks", 0)),
            rows=int(data.get("rows", 0)),
            error=data.get("error"),
        )


@dataclass(frozen=True)
class StagedChunk:
    """A chunk read by one window's job, waiting for the next window to emit it."""

    chunk_id: str
    table: TableRef
    signal_id: str
    path: str  # its dataset in the sink (relative), rows tagged with ``chunk_id``
    rows: int
    low_lsn: int
    high_lsn: int
    snapshot: str | None  # what the chunk's SELECT saw, in the source's text form (None: nothing to check)
    match_columns: tuple[str, ...]  # what identifies a row: the primary key (or the surrogate key)
    key_columns: tuple[str, ...]  # the event layout's key columns
    read_ts_ms: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "chunk_id": self.chunk_id,
            "table": self.table.to_json(),
            "signal_id": self.signal_id,
            "path": self.path,
            "rows": self.rows,
            "low_lsn": self.low_lsn,
            "high_lsn": self.high_lsn,
            "snapshot": self.snapshot,
            "match_columns": list(self.match_columns),
            "key_columns": list(self.key_columns),
            "read_ts_ms": self.read_ts_ms,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StagedChunk:
        return cls(
            chunk_id=data["chunk_id"],
            table=TableRef(*data["table"]),
            signal_id=data["signal_id"],
            path=data["path"],
            rows=int(data["rows"]),
            low_lsn=int(data["low_lsn"]),
            high_lsn=int(data["high_lsn"]),
            snapshot=data.get("snapshot"),
            match_columns=tuple(data["match_columns"]),
            key_columns=tuple(data["key_columns"]),
            read_ts_ms=int(data["read_ts_ms"]),
        )


@dataclass(frozen=True)
class IncrementalState:
    """The incremental snapshot's progress, stored in the offset (see module doc)."""

    tables: tuple[TableProgress, ...] = ()  # in order; finished ones move to ``history``
    paused: bool = False
    staged: tuple[StagedChunk, ...] = ()
    applied_signals: tuple[str, ...] = ()  # ids of Airflow-side signals already applied
    history: tuple[TableProgress, ...] = ()
    # Transactions (32-bit ids, as in the WAL) of earlier windows that no chunk read has seen
    # yet: a commit held back (by a synchronous standby) across windows. Until a chunk's
    # snapshot sees them, chunks are not kept (see incremental_run.IncrementalRun.unseen).
    unresolved_xids: tuple[int, ...] = ()

    @property
    def active(self) -> tuple[TableProgress, ...]:
        return tuple(t for t in self.tables if t.active)

    @property
    def idle(self) -> bool:
        return not self.active and not self.staged

    def progress(self, ref: TableRef) -> TableProgress | None:
        return next((t for t in self.tables if t.table == ref and t.active), None)

    def with_table(self, progress: TableProgress) -> IncrementalState:
        """Replace the active entry of ``progress.table``; a finished table moves to the history."""
        tables = [progress if t.table == progress.table and t.active else t for t in self.tables]
        if progress.active:
            return replace(self, tables=tuple(tables))
        remaining = tuple(t for t in tables if t is not progress)
        return replace(self, tables=remaining, history=(*self.history, progress)[-_HISTORY_KEPT:])

    def to_dict(self) -> dict[str, Any]:
        return {
            "tables": [t.to_dict() for t in self.tables],
            "paused": self.paused,
            "staged": [c.to_dict() for c in self.staged],
            "applied_signals": list(self.applied_signals),
            "history": [t.to_dict() for t in self.history],
            "unresolved_xids": list(self.unresolved_xids),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> IncrementalState:
        data = data or {}
        return cls(
            tables=tuple(TableProgress.from_dict(t) for t in data.get("tables", ())),
            paused=bool(data.get("paused", False)),
            staged=tuple(StagedChunk.from_dict(c) for c in data.get("staged", ())),
            applied_signals=tuple(data.get("applied_signals", ())),
            history=tuple(TableProgress.from_dict(t) for t in data.get("history", ())),
            unresolved_xids=tuple(int(x) for x in data.get("unresolved_xids", ())),
        )

    def summary(self) -> dict[str, Any]:
        """For logs and XCom: what is running, waiting and finished."""
        return {
            "paused": self.paused,
            "tables": {
                t.table.data_collection: {"status": t.status, "chunks": t.chunks, "rows": t.rows} for t in self.tables
            },
            "staged_chunks": len(self.staged),
            "finished": {
                t.table.data_collection: {"status": t.status, "rows": t.rows, **({"error": t.error} if t.error else {})}
                for t in self.history[-10:]
            },
        }


@dataclass(frozen=True)
class Signal:
    """A Debezium signal: from the signal table (``id``, ``type``, ``data``) or from Airflow."""

    id: str
    type: str
    data: dict[str, Any] = field(default_factory=dict)
    origin: str = "signal table"

    @classmethod
    def parse(cls, id: Any, type: Any, data: Any, *, origin: str) -> Signal:
        import json

        if not isinstance(type, str) or not type.strip():
            raise SignalError(f"signal {id!r} from the {origin} has no type")
        if data is None or data == "":
            parsed: Any = {}
        elif isinstance(data, str):
            try:
                parsed = json.loads(data)
            except ValueError as exc:
                raise SignalError(f"signal {id!r} ({type}) from the {origin}: data is not JSON ({exc})") from None
        else:
            parsed = data
        if not isinstance(parsed, dict):
            raise SignalError(f"signal {id!r} ({type}) from the {origin}: data must be a JSON object")
        return cls(str(id), type.strip(), parsed, origin)

    def describe(self) -> str:
        return f"signal {self.id!r} ({self.type}) from the {self.origin}"


def apply_signal(
    state: IncrementalState, signal: Signal, captured: Sequence[TableRef], *, position: str = ""
) -> tuple[IncrementalState, str]:
    """Apply one signal; returns the new state and what it did (for the log and XCom).

    Raises :class:`SignalError` for a signal that cannot apply; the state is then unchanged."""
    kind = signal.type
    data = signal.data
    if kind == "execute-snapshot":
        snapshot_type = str(data.get("type", "incremental")).lower()
        if snapshot_type != "incremental":
            raise SignalError(
                f"{signal.describe()}: snapshot type {snapshot_type!r} is not supported; a batch capture "
                "runs incremental snapshots (for a full consistent re-snapshot, run the snapshot task "
                "with snapshot_mode='always' once)"
            )
        tables = _matching(signal, data.get("data-collections"), captured, required=True)
        if not tables:
            return state, f"{signal.describe()}: empty data-collections, nothing to do"
        conditions = _conditions(signal, data.get("additional-conditions"), tables)
        surrogate = data.get("surrogate-key")
        if surrogate is not None and (not isinstance(surrogate, str) or not surrogate.strip() or "\x00" in surrogate):
            raise SignalError(f"{signal.describe()}: surrogate-key must be a column name")
        added, already = [], []
        for ref in tables:
            if state.progress(ref) is not None:
                already.append(ref.data_collection)
                continue
            state = replace(
                state,
                tables=(*state.tables, TableProgress(ref, signal.id, conditions.get(ref), surrogate or None)),
            )
            added.append(ref.data_collection)
        note = f"{signal.describe()}: incremental snapshot of {', '.join(added) or 'no new table'}"
        if already:
            note += f" ({', '.join(already)} already in progress: stop it first to restart it)"
        return state, note
    if kind == "stop-snapshot":
        if str(data.get("type", "")).lower() != "incremental":
            raise SignalError(f"{signal.describe()}: stop-snapshot needs data {{'type': 'incremental'}}")
        collections = data.get("data-collections")
        targets = (
            [t.table for t in state.active]
            if not collections
            else _matching(signal, collections, [t.table for t in state.active], required=False)
        )
        for ref in targets:
            progress = state.progress(ref)
            if progress is None:
                raise RuntimeError(f"active incremental snapshot table {ref} has no progress")
            state = state.with_table(replace(progress, status="stopped"))
        stopped = set(targets)
        state = replace(state, staged=tuple(c for c in state.staged if c.table not in stopped))
        return state, f"{signal.describe()}: stopped {', '.join(r.data_collection for r in targets) or 'nothing'}"
    if kind == "pause-snapshot":
        return replace(state, paused=True), f"{signal.describe()}: incremental snapshot paused"
    if kind == "resume-snapshot":
        return replace(state, paused=False), f"{signal.describe()}: incremental snapshot resumed"
    if kind == "log":
        message = " ".join(str(data.get("message", "")).split())  # one log line, whoever wrote it
        return state, f"{signal.describe()}: {message.replace('{}', position)}"
    raise SignalError(f"{signal.describe()}: unknown signal type (known: {', '.join(SIGNAL_TYPES)})")


def validate_run_conf_signals(types: Any) -> tuple[str, ...]:
    """The capture's ``run_conf_signals``: a list of Debezium signal types."""
    if isinstance(types, str) or not isinstance(types, (list, tuple)) or not all(isinstance(t, str) for t in types):
        raise CdcConfigurationError(
            f"run_conf_signals must be a list of signal types ({', '.join(SIGNAL_TYPES)}), got {types!r}"
        )
    unknown = [t for t in types if t not in SIGNAL_TYPES]
    if unknown:
        raise CdcConfigurationError(
            f"run_conf_signals lists unknown signal type(s) {', '.join(map(repr, unknown))}; known: "
            f"{', '.join(SIGNAL_TYPES)}"
        )
    return tuple(types)


def check_run_conf_signal(signal: Signal, allowed: Sequence[str], capture: str) -> Signal:
    """A signal from a DAG run's conf, held to the capture's allowlist; its data-collections are
    matched as exact table names (a triggerer's regular expression could take the worker's CPU)."""
    if signal.type not in allowed:
        enable = f"run_conf_signals=[..., {signal.type!r}]" if signal.type in SIGNAL_TYPES else "nothing"
        raise SignalError(
            f"{signal.describe()}: capture {capture!r} takes "
            + (f"only {', '.join(allowed)} signals" if allowed else "no signals")
            + " from DAG run conf, since anyone who may trigger the DAG writes it; the DAG author can allow "
            f"this type with {enable} on the capture, or send it through the operator's signals or the signal table"
        )
    forbidden = [k for k in RUN_CONF_FORBIDDEN_KEYS if k in signal.data]
    if forbidden:
        raise SignalError(
            f"{signal.describe()}: {' and '.join(forbidden)} are never taken from DAG run conf (they shape the "
            "queries the capture role runs); put them in the operator's signals or a signal-table row"
        )
    collections = signal.data.get("data-collections")
    if isinstance(collections, str):
        collections = [collections]
    if isinstance(collections, list) and all(isinstance(c, str) for c in collections):
        return replace(signal, data={**signal.data, "data-collections": [re.escape(c) for c in collections]})
    return signal


def _matching(signal: Signal, patterns: Any, captured: Sequence[TableRef], *, required: bool) -> list[TableRef]:
    """Captured tables matching Debezium's data-collections (regular expressions on schema.table)."""
    if patterns is None:
        if required:
            raise SignalError(f"{signal.describe()}: data-collections is required")
        return []
    if isinstance(patterns, str):
        patterns = [patterns]
    if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
        raise SignalError(f"{signal.describe()}: data-collections must be a list of table names or patterns")
    if len(patterns) > _MAX_PATTERNS or any(len(p) > _MAX_PATTERN_CHARS for p in patterns):
        raise SignalError(
            f"{signal.describe()}: data-collections takes at most {_MAX_PATTERNS} patterns of at most "
            f"{_MAX_PATTERN_CHARS} characters"
        )
    found: list[TableRef] = []
    for pattern in patterns:
        # RE2, not re: a signal's pattern comes from whoever may write a signal, and a crafted one
        # ("(?:(?:.)*)*X") keeps Python's backtracking matcher busy for hours; RE2 is linear.
        try:
            regex = re2.compile(pattern, _RE2_OPTIONS)
        except re2.error as exc:
            detail = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
            raise SignalError(
                f"{signal.describe()}: {pattern!r} is not a regular expression this capture accepts ({detail}; "
                "RE2 syntax: no look-around or back-references)"
            ) from None
        matched = [r for r in captured if regex.fullmatch(r.data_collection)]
        if not matched:
            raise SignalError(
                f"{signal.describe()}: {pattern!r} matches no table of this capture "
                f"({', '.join(r.data_collection for r in captured) or 'none'})"
            )
        found += [r for r in matched if r not in found]
    return found


def _conditions(signal: Signal, conditions: Any, tables: list[TableRef]) -> dict[TableRef, str]:
    if conditions is None:
        return {}
    if not isinstance(conditions, list):
        raise SignalError(f"{signal.describe()}: additional-conditions must be a list")
    out: dict[TableRef, str] = {}
    for item in conditions:
        if not isinstance(item, dict) or not isinstance(item.get("filter"), (str, dict, list)):
            raise SignalError(
                f"{signal.describe()}: each additional condition needs 'data-collection' and 'filter' "
                "(a condition such as \"status = 'open' AND total > 10\", or its JSON form)"
            )
        try:
            text = canonical(parse_filter(item["filter"], what="the filter"))
        except FilterError as exc:
            raise SignalError(f"{signal.describe()}: {exc}") from None
        for ref in _matching(signal, item.get("data-collection"), tables, required=True):
            out[ref] = text
    return out


def signal_columns_problem(names: Sequence[str], table: str, example: str) -> str | None:
    """Debezium's signal table starts with the columns ``id``, ``type``, ``data``; ``example``: its DDL."""
    if list(names[:3]) == ["id", "type", "data"]:
        return None
    return (
        f"signal table {table} must start with the columns id, type, data (it has {', '.join(names) or 'none'}); "
        f"e.g. {example}"
    )


def remember_applied(state: IncrementalState, signal_id: str) -> IncrementalState:
    return replace(state, applied_signals=(*state.applied_signals, signal_id)[-_APPLIED_SIGNALS_KEPT:])
