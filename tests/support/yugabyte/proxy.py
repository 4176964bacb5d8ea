"""The wire proxy in front of PostgreSQL that clients of the YB stand-in connect to (tests only).

Plain SQL connections pass through, with a few statements rewritten (``rewrite_sql``).
Replication connections (``replication=database``): IDENTIFY_SYSTEM and SQL pass through;
CREATE_REPLICATION_SLOT, DROP_REPLICATION_SLOT and START_REPLICATION are answered by the stand-in.
"""

from __future__ import annotations

import logging
import re
import socket
import struct
import threading
from dataclasses import dataclass

from ..pgwire import (
    Listener,
    close_quietly,
    connect_pair,
    message,
    read_message,
    read_startup,
    startup_parameters,
)
from .releases import pg11_refusal, server_version
from .stream import StreamRefused, StreamSession, _lsn_int

log = logging.getLogger(__name__)

_NAME = r'(?:"(?:[^"]|"")+"|[\w$]+)'
_ALTER_IDENTITY = re.compile(
    rf"ALTER\s+TABLE\s+(?:IF\s+EXISTS\s+)?(?:ONLY\s+)?({_NAME}(?:\s*\.\s*{_NAME})?)\s+REPLICA\s+IDENTITY\s+"
    r"(CHANGE|DEFAULT|FULL|NOTHING)\b",
    re.IGNORECASE,
)
_READ_TIME = re.compile(r"SET\s+LOCAL\s+yb_read_time\s*(?:TO|=)\s*'\s*(\d+)\s*(ht)?\s*'", re.IGNORECASE)
_READ_TIME_CALL = re.compile(
    rf"CALL\s+(?:({_NAME})\s*\.\s*)?(?:set_yb_read_time|\"set_yb_read_time\")\s*\(\s*'\s*(\d+)\s*(ht)?\s*'\s*\)",
    re.IGNORECASE,
)
_CATALOG_CHECK = re.compile(r'(?<![\w."])yb_disable_catalog_version_check\b', re.IGNORECASE)
_CREATE_TABLE = re.compile(r"^\s*CREATE\s+(?:UNLOGGED\s+|TEMP(?:ORARY)?\s+)?TABLE\b", re.IGNORECASE)
_PRIMARY_KEY = re.compile(r"\bPRIMARY\s+KEY\s*\(", re.IGNORECASE)
_SHARDING_WORD = re.compile(r"\s+(HASH|ASC|DESC)\s*$", re.IGNORECASE)
_HASH_CODE = re.compile(r'(?<![\w."])yb_hash_code\s*\(', re.IGNORECASE)
_CREATE_SLOT = re.compile(rf"^\s*CREATE_REPLICATION_SLOT\s+({_NAME})\s+(.*?)\s*;?\s*$", re.IGNORECASE | re.DOTALL)
_DROP_SLOT = re.compile(rf"^\s*DROP_REPLICATION_SLOT\s+({_NAME})(\s+WAIT)?\s*;?\s*$", re.IGNORECASE)
_START = re.compile(
    rf"^\s*START_REPLICATION\s+SLOT\s+({_NAME})\s+(LOGICAL|PHYSICAL)\s+([0-9A-Fa-f]+/[0-9A-Fa-f]+)\s*(?:\((.*)\))?\s*;?\s*$",
    re.IGNORECASE | re.DOTALL,
)
_OPTION = re.compile(rf"({_NAME})\s+'((?:[^']|'')*)'")
_ISOLATION = re.compile(
    r"ISOLATION\s+LEVEL\s+(SERIALIZABLE|REPEATABLE\s+READ|READ\s+COMMITTED|READ\s+UNCOMMITTED)", re.IGNORECASE
)
_USE = "CREATE_REPLICATION_SLOT ... (SNAPSHOT 'use')"
_EXPORT = "CREATE_REPLICATION_SLOT ... (SNAPSHOT 'export')"
# YBCheckSnapshotsAllowed with the flag off (its text as issue yugabyte-db#30211 reports it)
EXPORT_DISABLED = "cannot export or import snapshot when ysql_enable_pg_export_snapshot is disabled."


@dataclass
class _Transaction:
    """What YB's walsender checks of the replication session's transaction block (walsender.c @
    d0352220 ``CreateReplicationSlot``), as far as the proxy can tell from the SQL it forwards."""

    isolation: str = "READ COMMITTED"  # default_transaction_isolation's default (guess for YB)
    deferrable: bool = False
    queried: bool = False  # FirstSnapshotSet: a statement that takes a snapshot ran
    subtransactions: int = 0

    @classmethod
    def begun(cls, text: str) -> _Transaction:
        upper = " ".join(text.upper().split())
        level = _ISOLATION.search(upper)
        return cls(
            isolation=" ".join(level.group(1).split()) if level else cls.isolation,
            deferrable="DEFERRABLE" in upper.replace("NOT DEFERRABLE", ""),
        )

    def use_snapshot_refusal(self, in_block: bool) -> str | None:
        """The first of the walsender's USE_SNAPSHOT checks (flag on) that fails, in its order;
        "batched execution mode" (YbIsBatchedExecution) never applies to a simple query."""
        if in_block and self.deferrable:
            return f"{_USE} must not be called in a DEFERRABLE transaction"
        if not in_block:
            return f"{_USE} must be called inside a transaction"
        if self.isolation != "REPEATABLE READ":
            return f"{_USE} must be called in REPEATABLE READ isolation mode transaction"
        if self.queried:
            return f"{_USE} must be called before any query"
        if self.subtransactions:
            return f"{_USE} must not be called in a subtransaction"
        return None


def unquote(name: str) -> str:
    return name[1:-1].replace('""', '"') if name.startswith('"') else name.lower()


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _raise(sqlstate: str, text: str) -> str:
    return f"DO $yb$BEGIN RAISE EXCEPTION USING ERRCODE = '{sqlstate}', MESSAGE = {_literal(text)}; END$yb$"


def _closing(sql: str, start: int) -> int:
    """The index just past the parenthesis that closes the one open before ``start``."""
    depth, i = 1, start
    while i < len(sql) and depth:
        depth += {"(": 1, ")": -1}.get(sql[i], 0)
        i += 1
    return i


def _sharded_key(sql: str) -> str:
    """YSQL's ``PRIMARY KEY ((a, b) HASH, c ASC)`` / ``(a ASC)`` / ``(a HASH)`` as PostgreSQL's
    ``PRIMARY KEY (a, b, c)``, with a marker comment the create-table trigger records as the table's
    number of hash columns (the first key column alone is HASH when nothing is said)."""
    if not _CREATE_TABLE.match(sql):
        return sql
    m = _PRIMARY_KEY.search(sql)
    if m is None:
        return sql
    end = _closing(sql, m.end())
    inner = sql[m.end() : end - 1].strip()
    if inner.startswith("("):  # (a, b) HASH, c ...
        group_end = _closing(inner, 1)
        group = inner[1 : group_end - 1]
        rest = inner[group_end:].strip()
        if not rest.upper().startswith("HASH"):
            return sql
        hash_columns = len(group.split(","))
        parts = [group, *[p for p in rest[4:].split(",") if p.strip()]]
    else:
        parts = inner.split(",")
        word = _SHARDING_WORD.search(parts[0])
        if not any(_SHARDING_WORD.search(p) for p in parts):
            return sql
        hash_columns = 1 if word is None or word.group(1).upper() == "HASH" else 0
    columns = ", ".join(_SHARDING_WORD.sub("", p).strip() for p in parts)
    return f"/*yb_standin:hash_columns={hash_columns}*/ {sql[: m.end()]}{columns}){sql[end:]}"


def _hash_code_calls(sql: str) -> str:
    """``yb_hash_code(a, b)`` -> ``yb_standin.yb_hash_code(concat_ws(chr(31), a, b))``."""
    out, pos = [], 0
    for m in _HASH_CODE.finditer(sql):
        if m.start() < pos:
            continue
        depth, i, quote = 1, m.end(), None
        while i < len(sql) and depth:
            ch = sql[i]
            if quote:
                if ch == quote:
                    quote = None
            elif ch in "'\"":
                quote = ch
            elif ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
            i += 1
        args = _hash_code_calls(sql[m.end() : i - 1])
        out.append(sql[pos : m.start()] + f"yb_standin.yb_hash_code(concat_ws(chr(31), {args}))")
        pos = i
    return "".join(out) + sql[pos:]


def rewrite_sql(sql: str, snapshot_for, refuse_call=None, refuse_read_time=None, release: str | None = None) -> str:
    """The YSQL the stand-in accepts, as PostgreSQL statements. ``snapshot_for(ht)`` -> the exported
    snapshot held for a slot whose consistent point is ``ht``, or None. ``refuse_call(schema, name)``
    -> ``(sqlstate, message)`` when the session's role may not call the read-time procedure (its
    body never runs here, so its privileges are checked instead), or None. ``refuse_read_time(ht)``
    -> ``(sqlstate, message)`` for a read time YB refuses (one in the future of its clock), or None.
    ``release``: a PG11-based one refuses PostgreSQL 12+ catalog columns (releases.pg11_refusal)."""
    refused = pg11_refusal(sql, release)
    if refused is not None:
        return refused

    def identity(m: re.Match) -> str:
        return f"SELECT yb_standin.set_replica_identity({_literal(m.group(1))}, {_literal(m.group(2).upper())})"

    def read_time_value(digits: str, ht_suffix: str | None) -> str:
        value = int(digits)
        ht = value if ht_suffix else value << 12  # without ' ht': Unix microseconds
        refusal = refuse_read_time(ht) if refuse_read_time else None
        if refusal is not None:
            return _raise(*refusal)
        snapshot = snapshot_for(ht)
        if snapshot is None:
            return _raise(
                "22023",
                f"yb_read_time {value}{' ht' if ht_suffix else ''}: the YugabyteDB stand-in only supports the "
                "consistent snapshot points of replication slots it created with USE_SNAPSHOT/EXPORT_SNAPSHOT",
            )
        return f"SET TRANSACTION SNAPSHOT {_literal(snapshot)}"

    def read_time(m: re.Match) -> str:
        return read_time_value(m.group(1), m.group(2))

    def read_time_call(m: re.Match) -> str:
        refusal = refuse_call(unquote(m.group(1)) if m.group(1) else None, "set_yb_read_time") if refuse_call else None
        if refusal is not None:
            return _raise(*refusal)
        return read_time_value(m.group(2), m.group(3))

    sql = _sharded_key(sql)
    sql = _ALTER_IDENTITY.sub(identity, sql)
    sql = _READ_TIME.sub(read_time, sql)
    sql = _READ_TIME_CALL.sub(read_time_call, sql)
    sql = _CATALOG_CHECK.sub("yb_standin.yb_disable_catalog_version_check", sql)
    if _HASH_CODE.search(sql):
        sql = _hash_code_calls(sql)
    return sql


_PINNED_SEARCH_PATH = re.compile(r"(-c\s*search_path=)pg_catalog\b")


def standin_search_path(startup: bytes) -> bytes:
    """The client's StartupMessage with ``yb_standin`` put first in a ``search_path`` its
    ``options`` pin to ``pg_catalog`` (the product's sessions: ``-c search_path=pg_catalog,pg_temp``):
    on YugabyteDB the shims' originals live in ``pg_catalog``, so the stand-in's ``pg_catalog`` is
    ``yb_standin`` followed by the real one."""
    parts = startup[8:].split(b"\0")
    pairs = [(parts[i].decode(), parts[i + 1].decode()) for i in range(0, len(parts) - 1, 2) if parts[i]]
    options = dict(pairs).get("options", "")
    if not _PINNED_SEARCH_PATH.search(options):
        return startup
    rewritten = _PINNED_SEARCH_PATH.sub(r"\1yb_standin,pg_catalog", options)
    fields = [(key, rewritten if key == "options" else value) for key, value in pairs]
    body = startup[4:8] + b"".join(f"{key}\0{value}\0".encode() for key, value in fields) + b"\0"
    return struct.pack("!I", len(body) + 4) + body


def _rows(columns: list[str], rows: list[list[bytes | None]], tag: str, status: bytes = b"I") -> bytes:
    desc = struct.pack("!h", len(columns)) + b"".join(
        name.encode() + b"\0" + struct.pack("!IhIhih", 0, 0, 25, -1, -1, 0) for name in columns
    )
    out = message(b"T", desc)
    for row in rows:
        out += message(
            b"D",
            struct.pack("!h", len(row))
            + b"".join(struct.pack("!i", -1) if v is None else struct.pack("!i", len(v)) + v for v in row),
        )
    return out + message(b"C", tag.encode() + b"\0") + message(b"Z", status)


class _Session:
    def __init__(self, proxy: YugabyteProxy, client: socket.socket):
        self.proxy = proxy
        self.standin = proxy.standin
        self.client = client
        self.server = connect_pair(client, proxy.upstream_host, proxy.upstream_port)
        self.client_lock = threading.Lock()
        self.replication = False
        self.user = ""
        # the replication session's transaction: the server's last ReadyForQuery status, and what
        # the walsender's snapshot checks look at
        self.status = b"I"
        self.transaction = _Transaction()
        self.read_at: int | None = None  # a USE_SNAPSHOT slot's HT this transaction must read at
        self.swallow = 0  # answers (up to ReadyForQuery) to statements the proxy sent itself

    def send_client(self, data: bytes) -> None:
        with self.client_lock:
            self.client.sendall(data)

    def run(self) -> None:
        threading.Thread(target=self._server_to_client, daemon=True, name="yb-proxy-s2c").start()
        try:
            self._client_to_server()
        finally:
            close_quietly(self.client, self.server)
            self.proxy.sessions.discard(self)

    def _client_to_server(self) -> None:
        try:
            startup = standin_search_path(read_startup(self.client, self.send_client))
            self.user = startup_parameters(startup).get("user", "")
            self.replication = startup_parameters(startup).get("replication", "").lower() in (
                "database",
                "true",
                "on",
                "1",
            )
            self.server.sendall(startup)
            while True:
                kind, body = read_message(self.client)
                if kind == b"Q":
                    text = body.rstrip(b"\0").decode()
                    if self.replication:
                        if self._replication_command(text):
                            continue
                        self._track(text)
                    body = (
                        rewrite_sql(
                            text,
                            self.standin.snapshot_for,
                            self._refuse_call,
                            self.standin.read_time_refusal,
                            self.standin.release,
                        )
                        + "\0"
                    ).encode()
                elif kind == b"P":
                    name_end = body.index(b"\0")
                    query_end = body.index(b"\0", name_end + 1)
                    text = rewrite_sql(
                        body[name_end + 1 : query_end].decode(),
                        self.standin.snapshot_for,
                        self._refuse_call,
                        self.standin.read_time_refusal,
                        self.standin.release,
                    )
                    body = body[: name_end + 1] + text.encode() + b"\0" + body[query_end + 1 :]
                self.server.sendall(message(kind, body))
                if kind == b"X":
                    return
        except (EOFError, OSError):
            return
        except Exception:
            log.exception("yb stand-in proxy session failed")

    def _track(self, text: str) -> None:
        """Follow the replication session's transaction block from the SQL the client sends; the
        first statement after a USE_SNAPSHOT slot's creation (flag on) reads at its HT."""
        words = text.strip().rstrip(";").upper().split()
        word = words[0] if words else ""
        ends = word in ("COMMIT", "END", "ABORT") or (word == "ROLLBACK" and "TO" not in words[1:3])
        if word in ("BEGIN", "START"):
            self.transaction = _Transaction.begun(text)
        elif ends:
            self.transaction, self.read_at = _Transaction(), None
        elif word == "SAVEPOINT":
            self.transaction.subtransactions += 1
        elif word == "RELEASE":
            self.transaction.subtransactions = max(0, self.transaction.subtransactions - 1)
        elif word == "SET" and _ISOLATION.search(text) and "TRANSACTION" in words[1:3]:
            self.transaction.isolation = " ".join(_ISOLATION.search(text).group(1).upper().split())
        elif word not in ("SET", "SHOW", "RESET", "ROLLBACK"):  # these take no snapshot
            self.transaction.queried = True
        if self.read_at is not None and not ends:
            # YbUseSnapshotReadTime: the transaction reads at the slot's consistent point
            snapshot = self.standin.snapshot_for(self.read_at)
            self.read_at = None
            if snapshot is not None:
                self.swallow += 1
                self.server.sendall(message(b"Q", f"SET TRANSACTION SNAPSHOT {_literal(snapshot)}\0".encode()))

    def _refuse_call(self, schema: str | None, name: str) -> tuple[str, str] | None:
        return self.standin.read_time_call_refusal(self.user, schema, name)

    def _server_to_client(self) -> None:
        try:
            while True:
                kind, body = read_message(self.server)
                if kind == b"Z":
                    self.status = body[:1]
                if self.swallow:  # the answer to a statement the proxy sent, not the client
                    if kind == b"Z":
                        self.swallow -= 1
                    continue
                if kind == b"S" and body.startswith(b"server_version\0"):  # as YB reports it
                    backing = body[len(b"server_version\0") : -1].decode()
                    body = b"server_version\0" + server_version(self.standin.release, backing).encode() + b"\0"
                self.send_client(message(kind, body))
        except (EOFError, OSError):
            close_quietly(self.client)

    # -- replication commands ----------------------------------------------------------------

    def _replication_command(self, text: str) -> bool:
        word = text.strip().split(None, 1)[0].upper() if text.strip() else ""
        if word in ("CREATE_REPLICATION_SLOT", "START_REPLICATION") and self.status != b"I":
            return self._in_transaction_block(text)
        try:
            if word == "CREATE_REPLICATION_SLOT":
                self.send_client(self._create_slot(text))
                return True
            if word == "DROP_REPLICATION_SLOT":
                m = _DROP_SLOT.match(text)
                if not m:
                    raise StreamRefused("42601", "syntax error in DROP_REPLICATION_SLOT")
                if m.group(2):
                    raise StreamRefused("0A000", "DROP_REPLICATION_SLOT with WAIT is not yet supported")
                self.standin.drop_slot(unquote(m.group(1)))
                self.send_client(message(b"C", b"DROP_REPLICATION_SLOT\0") + message(b"Z", b"I"))
                return True
            if word == "START_REPLICATION":
                self._start(text)
                return True
        except StreamRefused as refused:
            self.send_client(refused.response() + message(b"Z", self.status))
            return True
        return False

    def _in_transaction_block(self, text: str) -> bool:
        """A replication command inside the session's transaction block. An error must abort
        that transaction as the walsender's would, so it is raised by the real server: in a failed
        block PostgreSQL answers 25P02 "current transaction is aborted" itself, as walsender.c's
        ``exec_replication_command`` does."""
        try:
            if self.status == b"E":
                raise StreamRefused("25P02", "current transaction is aborted")
            if text.strip().split(None, 1)[0].upper() != "CREATE_REPLICATION_SLOT":
                # PostgreSQL's PreventInTransactionBlock(true, "START_REPLICATION")
                raise StreamRefused("25001", "START_REPLICATION cannot run inside a transaction block")
            self.send_client(self._create_slot(text))
        except StreamRefused as refused:
            statement = "SELECT 1" if self.status == b"E" else _raise(refused.sqlstate, refused.text)
            self.server.sendall(message(b"Q", statement.encode() + b"\0"))
        return True

    def _create_slot(self, text: str) -> bytes:
        m = _CREATE_SLOT.match(text)
        if not m:
            raise StreamRefused("42601", "syntax error in CREATE_REPLICATION_SLOT")
        name = unquote(m.group(1))
        rest = m.group(2)
        generic = re.search(r"\((.*)\)\s*$", rest, re.DOTALL)
        words = re.sub(r"\(.*\)\s*$", "", rest, flags=re.DOTALL).split()
        upper = [w.upper() for w in words]
        if "PHYSICAL" in upper or "LOGICAL" not in upper:
            raise StreamRefused("0A000", "YSQL only supports logical replication slots")
        index = upper.index("LOGICAL")
        if index + 1 >= len(words):
            raise StreamRefused("42601", "syntax error in CREATE_REPLICATION_SLOT: no output plugin")
        plugin = unquote(words[index + 1])
        lsn_type, action = "SEQUENCE", self.standin.default_snapshot_action()
        for word in upper[index + 2 :]:
            if word in ("SEQUENCE", "HYBRID_TIME"):
                lsn_type = word
            elif word in ("USE_SNAPSHOT", "NOEXPORT_SNAPSHOT", "EXPORT_SNAPSHOT"):
                action = word
            elif word not in ("RESERVE_WAL", "TWO_PHASE", "ROW", "TRANSACTION"):
                raise StreamRefused("42601", f'syntax error at or near "{word}"')
        if generic:
            for key, value in _OPTION.findall(generic.group(1)):
                key, value = unquote(key).lower(), value.replace("''", "'")
                if key == "snapshot":
                    action = {"use": "USE_SNAPSHOT", "nothing": "NOEXPORT_SNAPSHOT", "export": "EXPORT_SNAPSHOT"}[
                        value.lower()
                    ]
                elif key == "lsn_type":
                    lsn_type = value
        flag = self.standin.export_snapshot_enabled()
        self._check_snapshot_action(action, flag)
        if "TEMPORARY" in upper:  # checked after the snapshot action (walsender.c @ d0352220)
            raise StreamRefused("0A000", "temporary replication slot is not yet supported")
        snapshot = self.standin.create_slot(name, plugin, lsn_type=lsn_type, snapshot_action=action)
        if action == "USE_SNAPSHOT" and flag and self.status == b"T":
            # GetTransactionSnapshot(); YbUseSnapshotReadTime(ht): this transaction reads at the HT
            self.transaction.queried = True
            self.read_at = int(snapshot)
        return _rows(
            ["slot_name", "consistent_point", "snapshot_name", "output_plugin"],
            [
                [
                    name.encode(),
                    self.standin.consistent_point().encode(),
                    snapshot.encode() if snapshot else None,
                    plugin.encode(),
                ]
            ],
            "CREATE_REPLICATION_SLOT",
            self.status,
        )

    def _check_snapshot_action(self, action: str, flag: bool) -> None:
        """walsender.c @ d0352220 ``CreateReplicationSlot``: EXPORT needs the flag and no
        transaction block; USE, with the flag on, PostgreSQL's rules plus YB's (with it off, none:
        "YB has its own snapshot mechanism"). No errcode: XX000."""
        in_block = self.status != b"I"
        if action == "EXPORT_SNAPSHOT":
            if not flag:
                raise StreamRefused("XX000", EXPORT_DISABLED)
            if in_block:
                raise StreamRefused("XX000", f"{_EXPORT} must not be called inside a transaction")
        elif action == "USE_SNAPSHOT" and flag:
            refusal = self.transaction.use_snapshot_refusal(in_block)
            if refusal is not None:
                raise StreamRefused("XX000", refusal)

    def _start(self, text: str) -> None:
        m = _START.match(text)
        if not m:
            raise StreamRefused("42601", "syntax error in START_REPLICATION")
        if m.group(2).upper() == "PHYSICAL":
            raise StreamRefused("0A000", "YSQL only supports logical replication slots")
        options = {unquote(k).lower(): v.replace("''", "'") for k, v in _OPTION.findall(m.group(4) or "")}
        session = StreamSession(
            self.standin, self.client, self.send_client, unquote(m.group(1)), _lsn_int(m.group(3)), options
        )
        try:
            session.prepare()
            session.run()
        finally:
            session.close()


class YugabyteProxy(Listener):
    """Listens on 127.0.0.1:<port>; one _Session per client connection."""

    def __init__(self, standin, upstream_host: str, upstream_port: int):
        super().__init__(self._serve, "yb-proxy")
        self.standin = standin
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.sessions: set[_Session] = set()

    def _serve(self, client: socket.socket) -> None:
        session = _Session(self, client)
        self.sessions.add(session)
        session.run()

    def stop(self) -> None:
        super().stop()
        for session in list(self.sessions):
            close_quietly(session.client, session.server)
