"""What a CDC-service capture asks the cluster outside a window: the stream, its tablets, the clock.

- **The stream** (:func:`stream_status`): its namespace and tables (``GetCDCDBStreamInfo``) and
  options (``GetCDCStream``); None when the masters do not know it.
- **Its fit** (:func:`stream_problems`): the stream belongs to the capture's database, captures
  every table the capture reads, and checkpoints explicitly (an IMPLICIT stream moves its
  checkpoint on every ``GetChanges``, so the server would drop changes the sink has not committed).
- **Tablets to start from** without a snapshot (:func:`bootstrap_tablets`): ``SetCDCCheckpoint``
  with ``bootstrap`` (the tablet's latest op), the ``snapshot_done_key`` ``GetChanges`` (no snapshot
  is needed: a stream created with a consistent snapshot has its rows marked "snapshot in
  progress" by the master), then ``GetCheckpoint``, as the connector does for ``snapshot.mode=never``.
- **The window's end** (:func:`current_hybrid_time`): the YSQL node's clock as a hybrid time
  (physical microseconds << 12). Every release has it (``yb_get_current_hybrid_time_lsn()`` only
  v2024.2+); a commit whose hybrid time is above it lands in the next window, whichever node's
  clock assigned it, because a window waits for every tablet's safe time to pass its end.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_cdc.cdc.basics.errors import SlotMissingError
from airflow_provider_cdc.cdc.basics.tables import POSTGRES_NAMES, TableRef
from airflow_provider_cdc.cdc.sources.yugabyte_cdc import ids
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.checkpoints import (
    Checkpoint,
    TabletCheckpoints,
    TabletPosition,
    TabletState,
)
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.client import YbCdcClient
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import methods
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StreamStatus:
    """A DB stream as the masters describe it."""

    stream_id: str
    namespace_id: str
    table_ids: tuple[str, ...]
    options: Mapping[str, str] = field(default_factory=dict)

    @property
    def checkpoint_type(self) -> str:
        return self.options.get("checkpoint_type", "IMPLICIT")

    @property
    def record_type(self) -> str:
        return self.options.get("record_type", "CHANGE")

    def to_dict(self) -> dict[str, Any]:
        return {
            "stream_id": self.stream_id,
            "namespace_id": self.namespace_id,
            "tables": len(self.table_ids),
            "checkpoint_type": self.checkpoint_type,
            "record_type": self.record_type,
        }


def stream_status(client: YbCdcClient) -> StreamStatus | None:
    """The stream, or None when the masters do not know it (deleted, or a mistyped id)."""
    try:
        namespace, tables = client.stream_tables()
        options = client.stream_options()
    except SlotMissingError:
        return None
    return StreamStatus(client.stream_id, namespace, tables, options)


@dataclass(frozen=True)
class DatabaseIds:
    """The YB ids of the capture's database and tables (:mod:`.ids`). A table's DocDB id is built
    from its relfilenode, not its oid (``pg_yb_utils.h`` ``YbGetRelfileNodeId``: "In YB, the
    relfilenode OID maps to the relation's DocDB table ID"); a table rewrite changes it."""

    database: str
    namespace_id: str
    tables: Mapping[TableRef, str]  # table → its YB table id
    rewritten: frozenset[TableRef] = frozenset()  # tables whose relfilenode is no longer their oid


def database_ids(conn: Any, tables: Iterable[TableRef]) -> DatabaseIds:
    """The ids of the connected database and of ``tables`` (those that exist)."""
    database, database_oid = conn.execute(
        "SELECT current_database(), oid FROM pg_database WHERE datname = current_database()"
    ).fetchone()
    found: dict[TableRef, str] = {}
    rewritten: set[TableRef] = set()
    for ref in tables:
        row = conn.execute(
            "SELECT c.oid, c.relfilenode FROM pg_class c WHERE c.oid = to_regclass(%s)", (ref.quoted(POSTGRES_NAMES),)
        ).fetchone()
        if row is None:
            continue
        oid, relfilenode = int(row[0]), int(row[1] or row[0])
        found[ref] = ids.table_id(int(database_oid), relfilenode)
        if relfilenode != oid:
            rewritten.add(ref)
    return DatabaseIds(str(database), ids.namespace_id(int(database_oid)), found, frozenset(rewritten))


def stream_problems(status: StreamStatus | None, database: DatabaseIds, stream_id: str) -> list[str]:
    """Why ``status`` cannot serve the capture (empty: it can), each with its fix."""
    create = (
        f"create one with `yb-admin create_change_data_stream ysql.{database.database} EXPLICIT <record type>` "
        "and set stream_id"
    )
    if status is None:
        return [f"the masters know no CDC stream {stream_id!r}: {create}"]
    if status.namespace_id != database.namespace_id:
        return [
            f"CDC stream {stream_id!r} belongs to another database (namespace {status.namespace_id}), not "
            f"{database.database!r} (namespace {database.namespace_id}): {create}"
        ]
    problems = []
    if status.checkpoint_type != "EXPLICIT":
        problems.append(
            f"CDC stream {stream_id!r} checkpoints {status.checkpoint_type}: every GetChanges would move the "
            "server's checkpoint before the sink commits; use a stream created with EXPLICIT checkpointing "
            f"({create})"
        )
    absent = [r for r, table_id in database.tables.items() if table_id not in status.table_ids]
    for ref in sorted(r for r in absent if r in database.rewritten):
        problems.append(
            f"table {ref.quoted(POSTGRES_NAMES)} was rewritten after CDC stream {stream_id!r} was created "
            f"(ALTER TABLE ... ALTER COLUMN TYPE, ADD or DROP PRIMARY KEY, TRUNCATE and the like give it a new "
            f"DocDB table id, {database.tables[ref]}; the stream keeps the old table, which gets no new "
            f"changes): create a new stream ({create}) and snapshot the table again"
        )
    missing = sorted(r.quoted(POSTGRES_NAMES) for r in absent if r not in database.rewritten)
    if missing:
        problems.append(
            f"table(s) {', '.join(missing)} are not in CDC stream {stream_id!r} (a stream captures the tables "
            "it was created with, and tables created later in its database when the server adds them): remove "
            f"them from the capture, or {create}"
        )
    return problems


def stream_tablets(client: YbCdcClient, table_ids: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """The active tablets of the stream's tables that the capture reads (tablet → its tables)."""
    return client.tablets(table_ids)


def bootstrap_tablets(client: YbCdcClient, tablets: Mapping[str, Sequence[str]]) -> TabletCheckpoints:
    """Each tablet checkpointed at its latest op on the server, as where its stream starts (the
    connector's ``bootstrapTablet``: ``SetCDCCheckpoint(bootstrap)``, ``markNoSnapshotNeeded``,
    ``GetCheckpoint``). The bootstrap also sets the tablet's active time, so a stream created
    without a consistent snapshot is served from here on."""
    states = {}
    for tablet_id, table_ids in tablets.items():
        stream, tablet = client.stream_id.encode(), tablet_id.encode()
        client.tablet_call(
            tablet_id,
            methods.SET_CDC_CHECKPOINT,
            pb.SetCDCCheckpointRequestPB(stream_id=stream, tablet_id=tablet, bootstrap=True),
            f"SetCDCCheckpoint(bootstrap) of tablet {tablet_id} (stream {client.stream_id})",
        )
        client.mark_snapshot_done(tablet_id)
        stored = client.get_checkpoint(tablet_id)
        states[tablet_id] = TabletState(TabletPosition(stored.checkpoint), table_ids=tuple(table_ids))
    log.info("stream %s: %d tablet(s) checkpointed at their latest ops", client.stream_id, len(states))
    return TabletCheckpoints(states)


def server_checkpoints(client: YbCdcClient, tablet_ids: Sequence[str]) -> dict[str, Checkpoint]:
    """What the server keeps as each tablet's checkpoint of the stream (``GetCheckpoint``)."""
    return {tablet_id: client.get_checkpoint(tablet_id).checkpoint for tablet_id in tablet_ids}


def current_hybrid_time(conn: Any) -> int:
    """The YSQL node's clock as a hybrid time (physical microseconds << 12, logical 0)."""
    micros = conn.execute("SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint").fetchone()[0]
    return int(micros) << 12


__all__ = [
    "DatabaseIds",
    "StreamStatus",
    "bootstrap_tablets",
    "current_hybrid_time",
    "database_ids",
    "server_checkpoints",
    "stream_problems",
    "stream_status",
    "stream_tablets",
]
