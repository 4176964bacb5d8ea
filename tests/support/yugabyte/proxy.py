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

from ..pgwire import (
    Listener,
    close_quietly,
    connect_pair,
    message,
    read_message,
    read_startup,
    startup_parameters,
)
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
_HASH_CODE = re.compile(r'(?<![\w."])yb_hash_code\s*\(', re.IGNORECASE)
_CREATE_SLOT = re.compile(rf"^\s*CREATE_REPLICATION_SLOT\s+({_NAME})\s+(.*?)\s*;?\s*$", re.IGNORECASE | re.DOTALL)
_DROP_SLOT = re.compile(rf"^\s*DROP_REPLICATION_SLOT\s+({_NAME})(\s+WAIT)?\s*;?\s*$", re.IGNORECASE)
_START = re.compile(
    rf"^\s*START_REPLICATION\s+SLOT\s+({_NAME})\s+(LOGICAL|PHYSICAL)\s+([0-9A-Fa-f]+/[0-9A-Fa-f]+)\s*(?:\((.*)\))?\s*;?\s*$",
    re.IGNORECASE | re.DOTALL,
)
_OPTION = re.compile(rf"({_NAME})\s+'((?:[^']|'')*)'")


def unquote(name: str) -> str:
    return name[1:-1].replace('""', '"') if name.startswith('"') else name.lower()


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _raise(sqlstate: str, text: str) -> str:
    return f"DO $yb$BEGIN RAISE EXCEPTION USING ERRCODE = '{sqlstate}', MESSAGE = {_literal(text)}; END$yb$"


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


def rewrite_sql(sql: str, snapshot_for, refuse_call=None) -> str:
    """The YSQL the stand-in accepts, as PostgreSQL statements. ``snapshot_for(ht)`` -> the exported
    snapshot held for a slot whose consistent point is ``ht``, or None. ``refuse_call(schema, name)``
    -> ``(sqlstate, message)`` when the session's role may not call the read-time procedure (its
    body never runs here, so its privileges are checked instead), or None."""

    def identity(m: re.Match) -> str:
        return f"SELECT yb_standin.set_replica_identity({_literal(m.group(1))}, {_literal(m.group(2).upper())})"

    def read_time_value(digits: str, ht_suffix: str | None) -> str:
        value = int(digits)
        ht = value if ht_suffix else value << 12  # without ' ht': Unix microseconds
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


def _rows(columns: list[str], rows: list[list[bytes | None]], tag: str) -> bytes:
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
    return out + message(b"C", tag.encode() + b"\0") + message(b"Z", b"I")


class _Session:
    def __init__(self, proxy: YugabyteProxy, client: socket.socket):
        self.proxy = proxy
        self.standin = proxy.standin
        self.client = client
        self.server = connect_pair(client, proxy.upstream_host, proxy.upstream_port)
        self.client_lock = threading.Lock()
        self.replication = False
        self.user = ""

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
                    if self.replication and self._replication_command(text):
                        continue
                    body = rewrite_sql(text, self.standin.snapshot_for, self._refuse_call).encode() + b"\0"
                elif kind == b"P":
                    name_end = body.index(b"\0")
                    query_end = body.index(b"\0", name_end + 1)
                    text = rewrite_sql(
                        body[name_end + 1 : query_end].decode(), self.standin.snapshot_for, self._refuse_call
                    )
                    body = body[: name_end + 1] + text.encode() + b"\0" + body[query_end + 1 :]
                self.server.sendall(message(kind, body))
                if kind == b"X":
                    return
        except (EOFError, OSError):
            return
        except Exception:
            log.exception("yb stand-in proxy session failed")

    def _refuse_call(self, schema: str | None, name: str) -> tuple[str, str] | None:
        return self.standin.read_time_call_refusal(self.user, schema, name)

    def _server_to_client(self) -> None:
        try:
            while True:
                kind, body = read_message(self.server)
                if kind == b"S" and body.startswith(b"server_version\0"):  # as YB reports it
                    body = body[:-1] + f"-YB-{self.standin.release}-b0".encode() + b"\0"
                self.send_client(message(kind, body))
        except (EOFError, OSError):
            close_quietly(self.client)

    # -- replication commands ----------------------------------------------------------------

    def _replication_command(self, text: str) -> bool:
        word = text.strip().split(None, 1)[0].upper() if text.strip() else ""
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
            self.send_client(refused.response() + message(b"Z", b"I"))
            return True
        return False

    def _create_slot(self, text: str) -> bytes:
        m = _CREATE_SLOT.match(text)
        if not m:
            raise StreamRefused("42601", "syntax error in CREATE_REPLICATION_SLOT")
        name = unquote(m.group(1))
        rest = m.group(2)
        generic = re.search(r"\((.*)\)\s*$", rest, re.DOTALL)
        words = re.sub(r"\(.*\)\s*$", "", rest, flags=re.DOTALL).split()
        upper = [w.upper() for w in words]
        if "TEMPORARY" in upper:
            raise StreamRefused("0A000", "temporary replication slot is not yet supported")
        if "PHYSICAL" in upper or "LOGICAL" not in upper:
            raise StreamRefused("0A000", "YSQL only supports logical replication slots")
        index = upper.index("LOGICAL")
        if index + 1 >= len(words):
            raise StreamRefused("42601", "syntax error in CREATE_REPLICATION_SLOT: no output plugin")
        plugin = unquote(words[index + 1])
        lsn_type, action = "SEQUENCE", "USE_SNAPSHOT"
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
        snapshot = self.standin.create_slot(name, plugin, lsn_type=lsn_type, snapshot_action=action)
        return _rows(
            ["slot_name", "consistent_point", "snapshot_name", "output_plugin"],
            [[name.encode(), b"0/2", snapshot.encode() if snapshot else None, plugin.encode()]],
            "CREATE_REPLICATION_SLOT",
        )

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
