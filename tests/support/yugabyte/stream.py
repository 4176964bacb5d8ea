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


def not_of_interest_message(stream_id: str, relid: int) -> str:
    # guess: YB's text was not found (the unqualified-table failure without
    # cdc_skip_unqualified_tables_for_polling); the tablet id is derived as for expiry
    tablet = hashlib.md5(f"{stream_id}/{relid}".encode()).hexdigest()
    return (
        f"Tablet ID {tablet} of table {relid} is not of interest for stream ID {stream_id}: it was not polled "
        "within cdcsdk_tablet_not_of_interest_timeout_secs of the slot's creation"
    )


BPCHAR_OID, NUMERIC_OID = 1042, 1700
_C_SPACE = b" \t\n\v\f\r"  # isspace() in the C locale


def _docdb_text(value: object, type_oid: int) -> object:
    """A value as YB's walsender prints it: the datum is rebuilt with typmod -1 (ybc_pggate.cc,
    YBCPgGetCDCConsistentChanges, ``YBCPgTypeAttrs type_attrs{-1 /* typmod */}``) from what DocDB
    stores: char(n) right-trimmed of isspace() (ybctype.c YbDatumToBPChar), numeric as
    numeric_normalize() text (YbDatumToDecimalText). Arrays are stored whole and keep both."""
    if not isinstance(value, bytes):
        return value
    if type_oid == BPCHAR_OID:
        return value.rstrip(_C_SPACE)
    if type_oid == NUMERIC_OID and b"." in value:
        return value.rstrip(b"0").rstrip(b".")
    return value


def _docdb_row(row: tuple | None, relation: Relation) -> tuple | None:
    if row is None:
        return None
    return tuple(_docdb_text(v, c.type_oid) for v, c in zip(row, relation.columns))


def _as_docdb_prints(msg, relation: Relation):
    if isinstance(msg, Insert):
        return Insert(msg.relation_oid, _docdb_row(msg.new, relation))
    if isinstance(msg, Delete):
        return Delete(msg.relation_oid, msg.old_kind, _docdb_row(msg.old, relation))
    return Update(msg.relation_oid, msg.old_kind, _docdb_row(msg.old, relation), _docdb_row(msg.new, relation))


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
        msg = _as_docdb_prints(msg, relations[relid])
        ident = identity.get(relid, "c")
        key = keys.get(relid, ())
        ncols = len(relations[relid].columns)

        def key_image(row: tuple, key=key, ncols=ncols) -> tuple:
            return tuple(row[i] if i in key else None for i in range(ncols))

        def key_of(row: tuple, key=key) -> tuple:
            return tuple(row[i] for i in key)

        if isinstance(msg, Insert):
            inserted.add((relid, key_of(msg.new)))
            out.append(_Change(relid, encode(msg)))
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
        # What YBCInitVirtualWal and the first CDC-service calls refuse: YB's walsender sends
        # CopyBothResponse before YBCInitVirtualWal (walsender.c @ d0352220,
        # StartLogicalReplication), so these arrive as an ErrorResponse inside the stream (run()).
        self.refusal = self._virtual_wal_refusal(plugin, stream_id, idle_ms > retention_ms)
        if self.refusal is None:
            self._touch()

    def _virtual_wal_refusal(self, plugin: str, stream_id: str, expired: bool) -> StreamRefused | None:
        missing = sorted(
            set(self.publications)
            - {r[0] for r in self.db.execute("SELECT pubname::text FROM pg_catalog.pg_publication").fetchall()}
        )
        if missing:  # YBGetPublicationsByNames(..., missing_ok=false) -> GetPublicationByName
            return StreamRefused("42704", f'publication "{missing[0]}" does not exist')
        if expired:
            relid = min(self.published) if self.published else 0
            return StreamRefused("XX000", expiry_message(stream_id, relid))
        if plugin == "pgoutput":
            for relid in sorted(self.published):
                if self.identity.get(relid, "c") == "c":
                    return StreamRefused(
                        "0A000",
                        f"replica identity CHANGE (for table: {relid}) is not supported for output plugin pgoutput",
                        "Consider using output plugin yboutput instead",
                    )
        return None

    def _refresh_published(self) -> None:
        """The slot's table list: ``self.published`` (the newest) and, before 2026.1, the list each
        journal transaction sees (:meth:`_published_at`).

        Up to 2025.2 YB re-reads the publications only at its periodic refresh, as of the refresh
        time (``yb_virtual_wal_client.c`` ``InitVirtualWal``: ``yb_read_time`` =
        ``yb_last_pub_refresh_time``; ``YBCReadRecord``: ``needs_publication_table_list_refresh``),
        on a grid of ``cdcsdk_publication_list_refresh_interval_secs`` from slot creation. Here a
        refresh that fell due applies from the next journaled transaction on (YB: from the refresh
        record's commit time): changes of a newly published table committed before it are never
        streamed. From 2026.1 the publications as they are now."""
        settings = self._settings()
        now = self.db.execute("SELECT yb_standin.now_ms()").fetchone()[0]
        created = self.db.execute(
            "SELECT created_ms FROM yb_standin.slots WHERE slot_name = %s", (self.slot,)
        ).fetchone()
        created_ms = created[0] if created else now
        if settings["refresh_at_commit"]:
            self._refreshes = None
            current = {
                int(r[0])
                for r in self.db.execute(
                    "SELECT format('%%I.%%I', schemaname, tablename)::regclass::oid::bigint "
                    "FROM pg_catalog.pg_publication_tables WHERE pubname = ANY(%s)",
                    (self.publications,),
                ).fetchall()
            }
        else:
            interval = max(1, settings["pub_refresh_interval_ms"])
            due = created_ms + (now - created_ms) // interval * interval
            self.db.execute(  # slots from before refreshes were modelled: their creation is the first
                "INSERT INTO yb_standin.slot_refresh VALUES (%s, %s, 0) ON CONFLICT DO NOTHING", (self.slot, created_ms)
            )
            self.db.execute(
                "INSERT INTO yb_standin.slot_refresh SELECT %s, %s, coalesce(max(jseq), 0) FROM yb_standin.journal "
                "WHERE %s > (SELECT max(refresh_ms) FROM yb_standin.slot_refresh WHERE slot_name = %s) "
                "ON CONFLICT DO NOTHING",
                (self.slot, due, due, self.slot),
            )
            refreshes = self.db.execute(
                "SELECT refresh_ms, from_jseq FROM yb_standin.slot_refresh WHERE slot_name = %s "
                "ORDER BY from_jseq, refresh_ms",
                (self.slot,),
            ).fetchall()
            self._refreshes = []
            for at_ms, from_jseq in refreshes:
                rows = self.db.execute(
                    "SELECT yb_standin.published_as_of(%s, %s)::bigint", (self.publications, at_ms)
                ).fetchall()
                self._refreshes.append((from_jseq, {int(r[0]) for r in rows}))
            current = set(self._refreshes[-1][1]) if self._refreshes else set()
        unqualified = self._unqualified(current, now - created_ms, settings)
        self.unqualified = unqualified
        self.published = current - unqualified
        if unqualified and not settings["skip_unqualified"] and hasattr(self, "unacked"):
            # A GetChanges failure on the table's tablet: only once streaming (after 'W', in run()).
            raise StreamRefused("XX000", not_of_interest_message(self.stream_id(), min(unqualified)))

    def _settings(self) -> dict:
        cursor = self.db.execute("SELECT * FROM yb_standin.settings")
        return dict(zip([c.name for c in cursor.description], cursor.fetchone()))

    def stream_id(self) -> str:
        row = self.db.execute("SELECT stream_id FROM yb_standin.slots WHERE slot_name = %s", (self.slot,)).fetchone()
        return row[0] if row else ""

    def _unqualified(self, tables: set[int], age_ms: int, settings: dict) -> set[int]:
        """The tables of ``tables`` that are no longer of interest: never polled, and the slot is older
        than ``cdcsdk_tablet_not_of_interest_timeout_secs`` (their retention barriers were released:
        ``CDCSDKConsistentSnapshotTest.TestReleaseResourcesOnUnpolledTablets``). The others are polled
        now. Tables created after the slot are left out (their own clock is not modelled)."""
        polled = {
            int(r[0])
            for r in self.db.execute(
                "SELECT relid::bigint FROM yb_standin.slot_polled WHERE slot_name = %s", (self.slot,)
            ).fetchall()
        }
        fresh = tables - polled
        if not fresh:
            return set()
        if age_ms <= settings["not_of_interest_ms"]:
            self.db.execute(
                "INSERT INTO yb_standin.slot_polled SELECT %s, unnest(%s::oid[]) ON CONFLICT DO NOTHING",
                (self.slot, sorted(fresh)),
            )
            return set()
        return fresh & set(self.identity)

    def _published_at(self, jseq: int) -> set[int]:
        """The slot's table list for the journal transaction ``jseq``."""
        if not self._refreshes:
            return self.published
        chosen = self._refreshes[0][1]
        for from_jseq, tables in self._refreshes:
            if from_jseq < jseq:
                chosen = tables
        return chosen - self.unqualified

    def _maybe_advance_restart(self) -> None:
        """``cdcsdk_update_restart_time_when_nothing_to_stream``: every
        ``cdcsdk_update_restart_time_interval_secs`` the restart time moves to the last popped
        COMMIT / SAFEPOINT when nothing shipped is unacknowledged (``cdcsdk_virtual_wal.cc``
        ``UpdateRestartTimeIfRequired``: ``if (last_received_restart_lsn == last_seen_lsn_)``).
        Popped here: the last journaled transaction this session went past (a safepoint stands for
        the commits of tables the slot does not poll)."""
        now = time.monotonic()
        settings = self._settings()
        if not settings["update_restart_time"]:
            return
        due = getattr(self, "_restart_check_at", None)
        if due is None:
            self._restart_check_at = now + settings["restart_update_interval_ms"] / 1000
            return
        if now < due:
            return
        self._restart_check_at = now + settings["restart_update_interval_ms"] / 1000
        popped = getattr(self, "popped", None)
        if popped is None or getattr(self, "unacked", None):
            return
        self.db.execute(
            "UPDATE yb_standin.slots SET restart_ht = greatest(coalesce(restart_ht, snapshot_ht), %s), "
            "restart_jseq = greatest(restart_jseq, %s) WHERE slot_name = %s",
            (popped[1], popped[0], self.slot),
        )

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
        if self.refusal is not None:  # after 'W', as YB's (the proxy answers it, then ReadyForQuery)
            raise self.refusal
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
                self.popped = (jseq, ht)
                meta, changes = yb_changes([bytes(m) for m in messages], self.identity, self._published_at(jseq), keys)
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
                self._refresh_published()  # a refresh that fell due while idle; unqualified tables fail here
                self._maybe_advance_restart()
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
            "UPDATE yb_standin.slots SET confirmed_flush = %s, restart_lsn = %s, "
            "restart_ht = greatest(restart_ht, %s), restart_jseq = greatest(restart_jseq, %s) WHERE slot_name = %s",
            (flush, last[0] + 1, last[2], last[1], self.slot),
        )
        self.unacked = [t for t in self.unacked if t[0] > flush]


def _lsn_int(text: str) -> int:
    high, low = text.split("/")
    return (int(high, 16) << 32) | int(low, 16)
