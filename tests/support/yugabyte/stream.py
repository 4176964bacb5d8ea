"""A YB walsender session: a slot's journaled transactions rewritten as YB streams them.

Runs on the proxy's client socket after START_REPLICATION (no real walsender behind it): whole
transactions in commit order, per-slot synthetic xids and LSNs (HYBRID_TIME or SEQUENCE), the
slot's frozen replica identity applied to the FULL images of the real stream, acks as YB takes
them (only for transactions streamed in this session), keepalives, no end of stream.
"""

from __future__ import annotations

import hashlib
import select
import socket
import struct
import time
from dataclasses import dataclass

import psycopg

from airflow_provider_cdc.cdc.sources.postgres.decoder import (
    PG_EPOCH_OFFSET_US,
    UNCHANGED_TOAST,
    Delete,
    Insert,
    Relation,
    RelationColumn,
    TypeInfo,
    Update,
    decode_message,
)
from tests.support.pgoutput import encode

from ..pgwire import error_response, message, recv_exact


class StreamRefused(Exception):
    def __init__(self, sqlstate: str, text: str, hint: str | None = None):
        super().__init__(text)
        self.sqlstate, self.text, self.hint = sqlstate, text, hint

    def response(self) -> bytes:
        return error_response(self.sqlstate, self.text, hint=self.hint)


@dataclass
class _Change:
    relid: int
    payload: bytes


def expiry_message(stream_id: str, relid: int) -> str:
    # YB's CDC service: STATUS_FORMAT(InternalError, "stream ID $0 is expired for Tablet ID $1", ...)
    tablet = hashlib.md5(f"{stream_id}/{relid}".encode()).hexdigest()
    return f"stream ID {stream_id} is expired for Tablet ID {tablet}"


def yb_changes(
    messages: list[bytes], identity: dict[int, str], published: set[int], keys: dict[int, tuple[int, ...]]
) -> tuple[list[bytes], list[_Change]]:
    """(Y/R payloads of the real stream, YB change payloads) for one journaled transaction.

    ``identity``: the slot's frozen identity per relid ('c' when absent); ``keys``: primary-key
    column positions per relid."""
    relations: dict[int, Relation] = {}
    meta: list[bytes] = []
    out: list[_Change] = []
    inserted: set[tuple[int, tuple]] = set()  # rows inserted in this transaction (no before image)
    for payload in messages:
        msg = decode_message(payload)
        if isinstance(msg, (Relation, TypeInfo)):
            meta.append(payload)
            if isinstance(msg, Relation):
                relations[msg.oid] = msg
            continue
        relid = msg.relation_oid
        if relid not in published:
            continue
        ident = identity.get(relid, "c")
        key = keys.get(relid, ())
        ncols = len(relations[relid].columns)

        def key_image(row: tuple, key=key, ncols=ncols) -> tuple:
            return tuple(row[i] if i in key else None for i in range(ncols))

        def key_of(row: tuple, key=key) -> tuple:
            return tuple(row[i] for i in key)

        if isinstance(msg, Insert):
            inserted.add((relid, key_of(msg.new)))
            out.append(_Change(relid, payload))
        elif isinstance(msg, Delete):
            old = msg.old
            if ident == "f":
                out.append(_Change(relid, encode(Delete(relid, "O", old))))
            else:
                out.append(_Change(relid, encode(Delete(relid, "K", key_image(old)))))
        elif isinstance(msg, Update):
            old = msg.old
            if old is None:  # no before image underneath (not captured FULL): send what there is
                out.append(_Change(relid, encode(Update(relid, None, None, msg.new))))
                continue
            new = tuple(o if n is UNCHANGED_TOAST else n for o, n in zip(old, msg.new))
            if key and key_of(old) != key_of(new):  # primary-key change: DELETE(old key) + INSERT(new row)
                if ident == "f":
                    out.append(_Change(relid, encode(Delete(relid, "O", old))))
                else:
                    out.append(_Change(relid, encode(Delete(relid, "K", key_image(old)))))
                out.append(_Change(relid, encode(Insert(relid, new))))
                inserted.add((relid, key_of(new)))
                continue
            if ident == "f":
                before = (None,) * ncols if (relid, key_of(old)) in inserted else old
                out.append(_Change(relid, encode(Update(relid, "O", before, new))))
            elif ident == "c":
                image = tuple(new[i] if (i in key or new[i] != old[i]) else UNCHANGED_TOAST for i in range(ncols))
                out.append(_Change(relid, encode(Update(relid, None, None, image))))
            else:  # 'd' (and 'n', which PostgreSQL refuses before it gets here)
                out.append(_Change(relid, encode(Update(relid, None, None, new))))
    return meta, out


def _xlog(wal_start: int, wal_end: int, payload: bytes) -> bytes:
    now = int(time.time() * 1_000_000) - PG_EPOCH_OFFSET_US
    return message(b"d", b"w" + struct.pack("!QQq", wal_start, wal_end, now) + payload)


def _keepalive(wal_end: int) -> bytes:
    now = int(time.time() * 1_000_000) - PG_EPOCH_OFFSET_US
    return message(b"d", b"k" + struct.pack("!QqB", wal_end, now, 0))


class StreamSession:
    """One START_REPLICATION on the client socket; returns when the client ends the copy."""

    def __init__(self, standin, client: socket.socket, send, slot: str, start_lsn: int, options: dict[str, str]):
        self.standin = standin
        self.client = client
        self.send = send
        self.slot = slot
        self.start_lsn = start_lsn
        self.options = options
        self.db = psycopg.connect(standin.real_conninfo(), autocommit=True)

    def close(self) -> None:
        self.db.close()

    # -- checks at START_REPLICATION ---------------------------------------------------------

    def prepare(self) -> None:
        row = self.db.execute(
            "SELECT s.plugin, s.lsn_type, s.stream_id, yb_standin.now_ms() - coalesce(s.last_poll_ms, s.created_ms), "
            "st.retention_ms, s.confirmed_flush, s.restart_jseq, s.snapshot_ht, s.boundary_lsn::text "
            "FROM yb_standin.slots s CROSS JOIN yb_standin.settings st WHERE s.slot_name = %s",
            (self.slot,),
        ).fetchone()
        if row is None:
            raise StreamRefused("42704", f'replication slot "{self.slot}" does not exist')
        (
            plugin,
            self.lsn_type,
            stream_id,
            idle_ms,
            retention_ms,
            self.confirmed,
            self.cursor,
            self.snapshot_ht,
            boundary,
        ) = row
        self.boundary = _lsn_int(boundary) if boundary else None
        self.plugin = plugin
        self.identity = dict(
            self.db.execute(
                "SELECT relid::bigint, ident::text FROM yb_standin.slot_identity WHERE slot_name = %s", (self.slot,)
            ).fetchall()
        )
        self.publications = [p.strip().strip('"') for p in self.options.get("publication_names", "").split(",") if p]
        self._refresh_published()
        if idle_ms > retention_ms:
            relid = min(self.published) if self.published else 0
            raise StreamRefused("XX000", expiry_message(stream_id, relid))
        if plugin == "pgoutput":
            for relid in sorted(self.published):
                if self.identity.get(relid, "c") == "c":
                    raise StreamRefused(
                        "0A000",
                        f"replica identity CHANGE (for table: {relid}) is not supported for output plugin pgoutput",
                        "Consider using output plugin yboutput instead",
                    )
        self._touch()

    def _refresh_published(self) -> None:
        self.published = {
            int(r[0])
            for r in self.db.execute(
                "SELECT format('%%I.%%I', schemaname, tablename)::regclass::oid::bigint "
                "FROM pg_catalog.pg_publication_tables WHERE pubname = ANY(%s)",
                (self.publications,),
            ).fetchall()
        }

    def _touch(self) -> None:
        self.db.execute(
            "UPDATE yb_standin.slots SET last_poll_ms = yb_standin.now_ms() WHERE slot_name = %s", (self.slot,)
        )

    def _keys(self, relid: int) -> tuple[int, ...]:
        if relid not in self._key_cache:
            rows = self.db.execute(
                "SELECT a.attnum FROM pg_catalog.pg_index i JOIN pg_catalog.pg_attribute a "
                "ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey) WHERE i.indrelid = %s AND i.indisprimary",
                (relid,),
            ).fetchall()
            # attnum -> position among the non-dropped columns the real stream sends
            live = [
                r[0]
                for r in self.db.execute(
                    "SELECT attnum FROM pg_catalog.pg_attribute WHERE attrelid = %s AND attnum > 0 "
                    "AND NOT attisdropped AND attgenerated = '' ORDER BY attnum",
                    (relid,),
                ).fetchall()
            ]
            self._key_cache[relid] = tuple(sorted(live.index(r[0]) for r in rows if r[0] in live))
        return self._key_cache[relid]

    # -- streaming ---------------------------------------------------------------------------

    def run(self) -> None:
        self._key_cache: dict[int, tuple[int, ...]] = {}
        self.send(message(b"W", struct.pack("!bh", 0, 0)))
        skip_below = max(self.start_lsn, self.confirmed)
        sent_relations: dict[int, bytes] = {}
        self.unacked: list[tuple[int, int, int]] = []  # (commit lsn, jseq, ht) streamed in this session
        self.last_sent = 0
        next_keepalive = time.monotonic() + 1.0
        next_touch = time.monotonic() + 0.5
        while not self.standin.closed:
            rows = self.db.execute(
                "SELECT jseq, commit_lsn::text, commit_time_us, ht, messages FROM yb_standin.journal "
                "WHERE jseq > %s ORDER BY jseq LIMIT 100",
                (self.cursor,),
            ).fetchall()
            if rows:
                self._refresh_published()
            for jseq, commit_lsn, commit_us, ht, messages in rows:
                self.cursor = jseq
                if self.boundary is not None:
                    if _lsn_int(commit_lsn) < self.boundary:
                        continue
                elif ht <= self.snapshot_ht:
                    continue
                keys = {}
                for payload in messages:
                    if payload[:1] == b"R":
                        relid = struct.unpack_from("!I", payload, 1)[0]
                        self._key_cache.pop(relid, None)
                        keys[relid] = self._keys(relid)
                meta, changes = yb_changes([bytes(m) for m in messages], self.identity, self.published, keys)
                if not changes:
                    continue
                xid, begin_lsn, commit = self._assign(jseq, ht, len(changes))
                if commit < skip_below:
                    continue
                self._send_txn(meta, changes, sent_relations, xid, begin_lsn, commit, commit_us)
                self.unacked.append((commit, jseq, ht))
                if self._client_input():
                    return
            now = time.monotonic()
            if now >= next_keepalive:
                self.send(_keepalive(self.last_sent))
                next_keepalive = now + 1.0
            if now >= next_touch:
                self._touch()
                next_touch = now + 0.5
            if self._client_input(0.0 if rows else 0.05):
                return

    def _assign(self, jseq: int, ht: int, nchanges: int) -> tuple[int, int, int]:
        with self.db.transaction():
            found = self.db.execute(
                "SELECT xid, begin_lsn, commit_lsn FROM yb_standin.slot_txn WHERE slot_name = %s AND jseq = %s",
                (self.slot, jseq),
            ).fetchone()
            if found:
                return found
            next_xid, next_lsn = self.db.execute(
                "SELECT next_xid, next_lsn FROM yb_standin.slots WHERE slot_name = %s FOR UPDATE", (self.slot,)
            ).fetchone()
            found = self.db.execute(
                "SELECT xid, begin_lsn, commit_lsn FROM yb_standin.slot_txn WHERE slot_name = %s AND jseq = %s",
                (self.slot, jseq),
            ).fetchone()
            if found:
                return found
            if self.lsn_type == "SEQUENCE":
                begin_lsn, commit = next_lsn, next_lsn + nchanges + 1
                next_lsn = commit + 1
            else:
                begin_lsn = commit = ht
            self.db.execute(
                "INSERT INTO yb_standin.slot_txn VALUES (%s, %s, %s, %s, %s)",
                (self.slot, jseq, next_xid, begin_lsn, commit),
            )
            self.db.execute(
                "UPDATE yb_standin.slots SET next_xid = %s, next_lsn = %s, assigned_jseq = %s WHERE slot_name = %s",
                (next_xid + 1, next_lsn, jseq, self.slot),
            )
            return next_xid, begin_lsn, commit

    def _send_txn(self, meta, changes, sent_relations, xid, begin_lsn, commit, commit_us) -> None:
        pg_time = commit_us - PG_EPOCH_OFFSET_US
        hybrid = self.lsn_type == "HYBRID_TIME"
        out = [_xlog(begin_lsn, begin_lsn, b"B" + struct.pack("!QqI", commit, pg_time, xid & 0xFFFFFFFF))]
        relations = {}
        types = {}
        for payload in meta:
            decoded = decode_message(payload)
            if isinstance(decoded, Relation):
                relations[decoded.oid] = decoded
            else:
                types[decoded.oid] = payload
        for i, change in enumerate(changes, start=1):
            lsn = commit if hybrid else begin_lsn + i
            real = relations[change.relid]
            key = self._keys(change.relid)
            yb_relation = encode(
                Relation(
                    real.oid,
                    real.namespace,
                    real.name,
                    self.identity.get(change.relid, "c"),
                    tuple(
                        RelationColumn(c.name, c.type_oid, c.type_modifier, idx in key)
                        for idx, c in enumerate(real.columns)
                    ),
                )
            )
            if sent_relations.get(change.relid) != yb_relation:
                for column in real.columns:
                    if column.type_oid in types:
                        out.append(_xlog(0, 0, types[column.type_oid]))
                out.append(_xlog(0, 0, yb_relation))
                sent_relations[change.relid] = yb_relation
            out.append(_xlog(lsn, lsn, change.payload))
        out.append(_xlog(commit + 1, commit + 1, b"C" + struct.pack("!BQQq", 0, commit, commit + 1, pg_time)))
        self.send(b"".join(out))
        self.last_sent = commit + 1 if not hybrid else commit

    def _client_input(self, timeout: float = 0.0) -> bool:
        """Reads what the client sent; True when it ended the copy or went away."""
        while True:
            readable, _, _ = select.select([self.client], [], [], timeout)
            if not readable:
                return False
            timeout = 0.0
            try:
                kind = recv_exact(self.client, 1)
                length = struct.unpack("!I", recv_exact(self.client, 4))[0]
                body = recv_exact(self.client, length - 4)
            except (EOFError, OSError):
                raise EOFError from None
            if kind == b"d" and body[:1] == b"r":
                flush = struct.unpack_from("!Q", body, 9)[0]
                self._ack(flush)
            elif kind == b"c":
                self.send(message(b"c", b"") + message(b"C", b"COPY 0\0") + message(b"Z", b"I"))
                return True
            elif kind == b"X":
                raise EOFError

    def _ack(self, flush: int) -> None:
        if flush == 0:
            return
        covered = [t for t in self.unacked if t[0] <= flush]
        if not covered:
            return  # YB: "No unacked transaction were found, skipping the persistence"
        last = max(covered)
        self.db.execute(
            "UPDATE yb_standin.slots SET confirmed_flush = %s, restart_lsn = %s, restart_ht = %s, "
            "restart_jseq = greatest(restart_jseq, %s) WHERE slot_name = %s",
            (flush, last[0] + 1, last[2], last[1], self.slot),
        )
        self.unacked = [t for t in self.unacked if t[0] > flush]


def _lsn_int(text: str) -> int:
    high, low = text.split("/")
    return (int(high, 16) << 32) | int(low, 16)
