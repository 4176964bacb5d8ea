"""Turns the journal (every committed transaction, from the real pgoutput slot) into tablet logs.

A thread reads ``yb_standin.journal`` in commit order (the YSQL stand-in's JournalReader fills
it, with each transaction's hybrid time), routes every row change to the tablet its key hashes
into, and appends one op per touched tablet. A primary-key change becomes a DELETE on the old
key's tablet and an INSERT on the new key's, as DocDB stores it.

It also keeps the safe time moving: a heartbeat transaction on ``yb_cdc_standin.heartbeat``
every ``heartbeat_interval`` seconds. Once a journaled transaction is distributed, everything
committed before it is in the logs and everything after it gets a larger hybrid time, so its
hybrid time is safe.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time

import psycopg

from airflow_provider_cdc.cdc.sources.postgres.decoder import (
    UNCHANGED_TOAST,
    Delete,
    Insert,
    Relation,
    Update,
    decode_message,
)
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb

from .cluster import Cluster
from .schema import Table, TableSchema, capturable_tables, read_table, relfilenodes, version_from_relation
from .tablets import RowChange, row_key

log = logging.getLogger(__name__)

HEARTBEAT_TABLE = "yb_cdc_standin.heartbeat"
_OP = pb.RowMessage


class Distributor:
    def __init__(self, cluster: Cluster, conninfo: str, heartbeat_interval: float = 0.1) -> None:
        self.cluster = cluster
        self.conninfo = conninfo
        self.heartbeat_interval = heartbeat_interval
        self.error: BaseException | None = None
        self._jseq = 0
        self._hashes: dict[str, int] = {}
        self._not_capturable: set[tuple] = set()  # (oid, columns) of tables without a primary key
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="yb-cdc-distributor")

    def start(self) -> Distributor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with psycopg.connect(self.conninfo, autocommit=True) as conn:
                    self._loop(conn)
            except Exception as exc:  # keep distributing while the stand-in runs
                if self._stop.is_set():
                    return
                self.error = exc
                log.warning("yb cdc stand-in distributor restarting: %s", exc)
                time.sleep(0.2)

    def _loop(self, conn: psycopg.Connection) -> None:
        heartbeat_relid = conn.execute(f"SELECT '{HEARTBEAT_TABLE}'::regclass::oid::int").fetchone()[0]
        next_heartbeat = next_collection = next_catalog = 0.0
        while not self._stop.is_set():
            rows = conn.execute(
                "SELECT jseq, commit_lsn::text, ht, messages FROM yb_standin.journal WHERE jseq > %s "
                "ORDER BY jseq LIMIT 200",
                (self._jseq,),
            ).fetchall()
            for jseq, commit_lsn, ht, messages in rows:
                self._distribute(conn, heartbeat_relid, commit_lsn, ht, [bytes(m) for m in messages])
                self._jseq = jseq
            now = time.monotonic()
            if now >= next_heartbeat:
                conn.execute(f"UPDATE {HEARTBEAT_TABLE} SET n = n + 1")
                next_heartbeat = now + self.heartbeat_interval
            if now >= next_collection:
                self.cluster.collect_garbage()
                next_collection = now + 1.0
            if now >= next_catalog:  # every table has its tablets from the start, changed or not
                self._register_new_tables(conn)
                next_catalog = now + 0.5
            if not rows:
                self._stop.wait(0.02)

    def _distribute(self, conn, heartbeat_relid: int, commit_lsn: str, ht: int, messages: list[bytes]) -> None:
        relations: dict[int, Relation] = {}
        dml: list[Insert | Update | Delete] = []
        for payload in messages:
            message = decode_message(payload)
            if isinstance(message, Relation):
                relations[message.oid] = message
            elif isinstance(message, (Insert, Update, Delete)):
                dml.append(message)
        if heartbeat_relid in relations:
            beats = [int(m.new[1]) for m in dml if isinstance(m, Update) and m.relation_oid == heartbeat_relid]
            self.cluster.note_heartbeat(ht, max(beats, default=0))
            dml = [m for m in dml if m.relation_oid != heartbeat_relid]
        tables, new_schemas = self._tables(conn, relations, ht)
        pieces: list[tuple[Table, TableSchema, int, dict | None, dict | None]] = []
        for message in dml:
            table = tables.get(message.relation_oid)
            if table is None:
                continue
            schema = new_schemas.get(table.relid) or table.schema
            names = [c.name for c in relations[message.relation_oid].columns]
            pieces.extend((table, schema, *piece) for piece in _split(message, names, schema))
        wanted = {_hash_input(schema, old, new) for _t, schema, _op, old, new in pieces}
        self._hash(conn, wanted - self._hashes.keys())
        changes = []
        for table, schema, op, old, new in pieces:
            routing = new if new is not None else old
            hash_code = self._hashes[_hash_input(schema, old, new)]
            key = row_key(hash_code, tuple(routing[c.name] for c in schema.key_columns))
            changes.append((table, hash_code, RowChange(op, old, new, key)))
        txn_id = hashlib.md5(f"{self.cluster.database}/{commit_lsn}".encode()).digest()
        self.cluster.apply(ht, txn_id, new_schemas, changes)

    def _tables(self, conn, relations: dict[int, Relation], ht: int):
        """The registered tables this transaction touched (registering new ones), and the new
        schema versions of those whose columns differ from the last version seen."""
        tables: dict[int, Table] = {}
        new_schemas: dict[int, TableSchema] = {}
        nodes = relfilenodes(conn, list(relations))
        for oid, relation in relations.items():
            signature = [(c.name, c.type_oid) for c in relation.columns]
            with self.cluster.lock:
                table = self.cluster.tables.get(oid)
            if table is not None and nodes.get(oid, table.relfilenode) != table.relfilenode:
                table = None  # rewritten since: its rows now go to a new DocDB table
            if table is None:
                if (oid, tuple(signature)) in self._not_capturable:
                    continue
                found = read_table(conn, oid)
                if found is None:
                    self._not_capturable.add((oid, tuple(signature)))
                    continue
                first = version_from_relation(found[2], signature, 0, 0)
                if first is None:
                    continue
                table = self.cluster.register_table(oid, found[0], found[1], first, nodes.get(oid))
            elif tuple(signature) != table.schema.signature():
                found = read_table(conn, oid)
                version = version_from_relation(found[2], signature, table.schema.version + 1, ht) if found else None
                if version is None:
                    continue
                new_schemas[oid] = version
            with self.cluster.lock:
                table.schema_name, table.name = relation.namespace, relation.name
            tables[oid] = table
        return tables, new_schemas

    def _register_new_tables(self, conn) -> None:
        with self.cluster.lock:
            known = set(self.cluster.tables)
        fresh = [relid for relid in capturable_tables(conn) if relid not in known]
        nodes = relfilenodes(conn, fresh)
        for relid in fresh:
            found = read_table(conn, relid)
            if found is not None:
                self.cluster.register_table(relid, *found, nodes.get(relid))

    def _hash(self, conn, values: set[str]) -> None:
        """yb_hash_code of the hash column's text, computed by PostgreSQL itself."""
        if not values:
            return
        ordered = sorted(values)
        rows = conn.execute(
            "SELECT hashtext(v) & 65535 FROM unnest(%s::text[]) WITH ORDINALITY AS u(v, i) ORDER BY i",
            (ordered,),
        ).fetchall()
        self._hashes.update(zip(ordered, (r[0] for r in rows)))


def _hash_input(schema: TableSchema, old: dict | None, new: dict | None) -> str:
    """The text yb_hash_code hashes: the hash column of the row (the new one, else the old)."""
    row = new if new is not None else old
    return row[schema.hash_column.name].decode()


def _split(message, names: list[str], schema: TableSchema):
    """(op, old row, new row) pieces of one pgoutput change."""
    keys = [c.name for c in schema.key_columns]
    if isinstance(message, Insert):
        yield _OP.INSERT, None, dict(zip(names, message.new))
    elif isinstance(message, Delete):
        yield _OP.DELETE, _old_row(names, message.old, message.old_kind, keys), None
    else:
        old = _old_row(names, message.old, message.old_kind, keys) if message.old is not None else None
        new = dict(zip(names, message.new))
        if old is not None:  # unchanged TOAST values: the FULL before image has them
            new = {n: (old.get(n, v) if v is UNCHANGED_TOAST else v) for n, v in new.items()}
        if old is not None and [old.get(k) for k in keys] != [new.get(k) for k in keys]:
            yield _OP.DELETE, old, None
            yield _OP.INSERT, None, new
        else:
            yield _OP.UPDATE, old, new


def _old_row(names: list[str], values, kind: str | None, keys: list[str]) -> dict:
    row = dict(zip(names, values))
    if kind == "K":  # a key-only image: the other columns are unknown, not NULL
        row = {n: (v if n in keys else UNCHANGED_TOAST) for n, v in row.items()}
    return row
