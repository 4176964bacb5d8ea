"""The journal: every committed transaction of the real database, read once from one real
pgoutput slot (publication FOR ALL TABLES, every captured table at REPLICA IDENTITY FULL) and
stored with its hybrid time in ``yb_standin.journal``. YB slots are views over it (stream.py).

HT = max(commit time in Unix µs << 12, previous HT + 1), assigned in commit order when the
transaction is journaled and persisted, so it never changes. The real slot is acknowledged as soon
as a transaction is journaled, which releases its WAL.
"""

from __future__ import annotations

import logging
import select
import struct
import threading
import time

import psycopg

from airflow_provider_cdc.cdc.sources.postgres.decoder import (
    PG_EPOCH_OFFSET_US,
    Begin,
    Commit,
    Delete,
    Insert,
    Relation,
    TypeInfo,
    Update,
    decode_message,
)

log = logging.getLogger(__name__)

PUBLICATION = "yb_standin_all"


def real_conninfo(cluster, database: str, *, replication: bool = False) -> str:
    from psycopg.conninfo import make_conninfo

    params = {
        "host": cluster.host,
        "port": cluster.port,
        "dbname": database,
        "user": cluster.superuser,
        "password": cluster.password,
        "application_name": "yb-standin",
    }
    if replication:
        params["replication"] = "database"
    return make_conninfo("", **params)


def status_update(flush: int) -> bytes:
    now = int(time.time() * 1_000_000) - PG_EPOCH_OFFSET_US
    return struct.pack("!cQQQqB", b"r", flush, flush, flush, now, 0)


class JournalReader:
    """A thread streaming the real slot into ``yb_standin.journal``."""

    def __init__(self, cluster, database: str, slot: str):
        self._conninfo = real_conninfo(cluster, database)
        self._repl_conninfo = real_conninfo(cluster, database, replication=True)
        self.slot = slot
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="yb-standin-journal")
        self.error: BaseException | None = None
        self.housekeeping = lambda: None  # called about every 2 s

    def start(self) -> JournalReader:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._stream()
            except Exception as exc:  # reconnect: the journal must keep going while the stand-in runs
                if self._stop.is_set():
                    return
                self.error = exc
                log.warning("yb stand-in journal reader restarting: %s", exc)
                time.sleep(0.2)

    def _stream(self) -> None:
        from psycopg import pq

        db = psycopg.connect(self._conninfo, autocommit=True)
        repl = pq.PGconn.connect(self._repl_conninfo.encode())
        try:
            if repl.status != pq.ConnStatus.OK:
                raise RuntimeError(repl.error_message.decode(errors="replace"))
            jseq, last_ht = db.execute(
                "SELECT coalesce(max(jseq), 0), coalesce(max(ht), 0) FROM yb_standin.journal"
            ).fetchone()
            command = (
                f'START_REPLICATION SLOT "{self.slot}" LOGICAL 0/0 '
                f"(proto_version '1', publication_names '{PUBLICATION}', messages 'false')"
            )
            repl.send_query(command.encode())
            result = repl.get_result()
            if result is None or result.status != pq.ExecStatus.COPY_BOTH:
                raise RuntimeError((result.error_message if result else repl.error_message).decode(errors="replace"))
            repl.nonblocking = 1
            relations: dict[int, bytes] = {}
            relation_types: dict[int, tuple[int, ...]] = {}
            types: dict[int, bytes] = {}
            txn: list[bytes] | None = None
            emitted: set[int] = set()
            begin: Begin | None = None
            last_end = 0
            next_housekeeping = time.monotonic() + 2
            while not self._stop.is_set():
                if time.monotonic() > next_housekeeping:
                    next_housekeeping = time.monotonic() + 2
                    self.housekeeping()
                nbytes, data = repl.get_copy_data(1)
                if nbytes == 0:
                    select.select([repl.socket], [], [], 0.05)
                    repl.consume_input()
                    continue
                if nbytes < 0:
                    raise RuntimeError("the journal's walsender ended the stream")
                data = bytes(data)
                if data[:1] == b"k":
                    _wal_end, _t, reply = struct.unpack_from("!QQB", data, 1)
                    if reply:
                        repl.put_copy_data(status_update(last_end))
                        repl.flush()
                    continue
                if data[:1] != b"w":
                    continue
                payload = data[25:]
                message = decode_message(payload)
                if isinstance(message, Begin):
                    begin, txn, emitted = message, [], set()
                elif isinstance(message, TypeInfo):
                    types[message.oid] = payload
                elif isinstance(message, Relation):
                    relations[message.oid] = payload
                    relation_types[message.oid] = tuple(c.type_oid for c in message.columns)
                    if txn is not None:
                        txn.extend(types[t] for t in relation_types[message.oid] if t in types)
                        txn.append(payload)
                        emitted.add(message.oid)
                elif isinstance(message, (Insert, Update, Delete)) and txn is not None:
                    if message.relation_oid not in emitted:
                        txn.extend(types[t] for t in relation_types.get(message.relation_oid, ()) if t in types)
                        txn.append(relations[message.relation_oid])
                        emitted.add(message.relation_oid)
                    txn.append(payload)
                elif isinstance(message, Commit):
                    if txn and any(m[:1] in (b"I", b"U", b"D") for m in txn) and begin is not None:
                        jseq += 1
                        last_ht = max(message.commit_ts_us << 12, last_ht + 1)
                        db.execute(
                            "INSERT INTO yb_standin.journal VALUES (%s, %s::pg_lsn, %s, %s, %s)",
                            (jseq, _lsn_text(message.commit_lsn), message.commit_ts_us, last_ht, txn),
                        )
                    last_end = message.end_lsn
                    txn, begin = None, None
                    repl.put_copy_data(status_update(last_end))
                    repl.flush()
                # TRUNCATE and logical messages are never journaled (YB never streams them)
        finally:
            repl.finish()
            db.close()


def _lsn_text(value: int) -> str:
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"
