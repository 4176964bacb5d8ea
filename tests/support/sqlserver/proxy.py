"""A PostgreSQL-protocol proxy that translates T-SQL on the wire (tests only).

psqlODBC connects here instead of to PostgreSQL. Client messages pass through byte for byte
except the SQL text of Query ('Q') and Parse ('P') messages, which is translated from T-SQL.
psqlODBC's own statements (BEGIN/COMMIT, its per-statement savepoints, DEALLOCATE, catalog
queries on pg_catalog, FETCH/MOVE/CLOSE on its cursors) pass untouched; in a Query they are split
off the product's statement they are glued to (``BEGIN;<stmt>``, ``SAVEPOINT _EXEC_SVP_x;<stmt>``,
``<stmt>;fetch 2000 in "SQL_CUR..."``). A SELECT comes wrapped in the driver's cursor
(``declare "SQL_CUR..." cursor with hold for <stmt>``, UseDeclareFetch=1) with its parameters
written in as literals: only ``<stmt>`` is translated and recorded, without the casts psqlODBC adds
to some of those literals.

Errors the stand-in raises itself (an untranslatable statement; error 3952) are answered by the
proxy: the statement is not sent, the server only gets a Sync (or the driver's prefix), and the
ErrorResponse is slipped in before the ReadyForQuery that comes back. Server errors that have a
SQL Server counterpart (permission denied -> 229) are rewritten on the way back.
"""

from __future__ import annotations

import re
import socket
import struct
import threading
from collections import deque
from collections.abc import Callable

from ..pgwire import Listener, close_quietly, connect_pair, error_fields, read_message, read_startup
from ..pgwire import error_response as error_response
from ..pgwire import message as _message
from .translate import Resolver, Untranslatable, is_batch, to_tsql_markers, translate, translate_batch

# psqlODBC's cursors (UseDeclareFetch=1) are named "SQL_CUR<address>": its FETCH/MOVE/CLOSE on them
# are the driver's own, never the product's (T-SQL cursors are FETCH ... FROM <unquoted name>).
_DRIVER_CURSOR = r'"SQL_CUR\w+"'
_INTERNAL = re.compile(
    r"^\s*(?:BEGIN|COMMIT|ROLLBACK|SAVEPOINT\s+_\w+|RELEASE(?:\s+SAVEPOINT)?\s+_\w+|ROLLBACK\s+TO(?:\s+SAVEPOINT)?\s+_\w+"
    r"|DEALLOCATE\s+\"?_\w+\"?|SET\s+DateStyle\b.*|SET\s+extra_float_digits\b.*|SET\s+client_encoding\b.*|show\s+\w+"
    rf"|(?:fetch|move)\s+(?:\w+\s+)*in\s+{_DRIVER_CURSOR}|close\s+{_DRIVER_CURSOR}"
    r"|select\s+.*\bpg_(?:catalog|type|class|attribute|namespace|index|proc)\b.*)\s*$",
    re.IGNORECASE | re.DOTALL,
)
# The driver wraps a SELECT in a cursor of its own: only the statement after FOR is the product's.
_DECLARE = re.compile(
    rf"^(\s*declare\s+{_DRIVER_CURSOR}(?:\s+scroll)?\s+cursor(?:\s+with\s+hold)?\s+for\s+)(.*)$",
    re.IGNORECASE | re.DOTALL,
)
# In a cursor's statement psqlODBC writes the parameters in as quoted literals (it cannot bind them
# to a DECLARE) and casts some: '2024-01-02 03:04:05'::timestamp, '1.5'::float8. Without the cast
# the literal is untyped, so PostgreSQL types it from its context as it did the unbound parameter,
# and the statement is T-SQL again. Quoted names are matched too, so nothing inside one is touched.
_INLINED_CAST = re.compile(
    r"""('(?:[^']|'')*'|"(?:[^"]|"")*"|\[[^\]]*\])(?:::(?:date|time|timestamp|float4|float8|int4|smallint)\b)?"""
)
_PERMISSION = re.compile(r"permission denied for (table|view|function|schema|sequence|relation) (\S+)")
_MISSING_RELATION = re.compile(r'relation "([^"]+)" does not exist')
_MISSING_FUNCTION = re.compile(r"function ([\w.\"$]+)\(")
_MSDB_NAME = re.compile(r"(?<![\w\].])\[?msdb\]?\s*\.\s*(?:\[?\w*\]?)\s*\.\s*\[?\w+\]?", re.IGNORECASE)


def _is_internal(segment: str) -> bool:
    return bool(_INTERNAL.match(segment))


def unwrap_cursor(text: str) -> tuple[str, str]:
    """``'declare "SQL_CUR1" cursor with hold for SELECT 1'`` -> ('declare ... for ', 'SELECT 1');
    ('', text) for any other statement."""
    m = _DECLARE.match(text)
    return (m.group(1), m.group(2)) if m else ("", text)


def drop_inlined_casts(statement: str) -> str:
    """The casts psqlODBC appends to the parameters it writes into a cursor's statement, removed."""
    return _INLINED_CAST.sub(lambda m: m.group(1), statement)


def split_driver_statements(text: str) -> tuple[list[str], str, list[str]]:
    """``'BEGIN;SAVEPOINT s;<stmt>'`` -> (['BEGIN', 'SAVEPOINT s'], '<stmt>', [])."""
    head: list[str] = []
    rest = text
    while ";" in rest:
        first, remainder = rest.split(";", 1)
        if not _is_internal(first):
            break
        head.append(first)
        rest = remainder
    tail: list[str] = []
    while ";" in rest:
        remainder, last = rest.rsplit(";", 1)
        if last.strip() == "":
            rest = remainder
            continue
        if not _is_internal(last):
            break
        tail.insert(0, last)
        rest = remainder
    if _is_internal(rest) or not rest.strip():
        return [*head, *([rest] if rest.strip() else []), *tail], "", []
    return head, rest, tail


class _Session:
    """One client connection: two pump threads and the little state translation needs."""

    def __init__(self, proxy: TsqlProxy, client: socket.socket):
        self.proxy = proxy
        self.client = client
        self.server = connect_pair(client, proxy.upstream_host, proxy.upstream_port)
        self.client_lock = threading.Lock()
        self.isolation = "READ COMMITTED"
        self.status = b"I"  # last ReadyForQuery status from the server
        self.pending_error: bytes | None = None  # sent before the next ReadyForQuery
        self.last_verb = "SELECT"
        self.fresh_txn = False  # a transaction began and has run nothing yet
        self.nocount = False  # SET NOCOUNT: row counts of a batch's DML are not sent
        # Per statement of the Query in flight, what the client gets of its result: "show", "hide" (a
        # batch's DECLARE/SET/EXEC, NOCOUNT row counts) or "count" (rows reported as a row count), from
        # translate.translate_batch. Empty: everything shown.
        self.results: deque[str] = deque()
        self.count_rows = 0
        self.batch_results: list[str] | None = None  # of the statement last translated

    def run(self) -> None:
        threading.Thread(target=self._server_to_client, daemon=True, name="tsql-proxy-s2c").start()
        try:
            self._client_to_server()
        finally:
            close_quietly(self.client, self.server)

    # -- plumbing ---------------------------------------------------------------------------

    def _send_client(self, data: bytes) -> None:
        with self.client_lock:
            self.client.sendall(data)

    # -- client -> server -------------------------------------------------------------------

    def _client_to_server(self) -> None:
        try:
            # startup (and a possible SSLRequest, refused: the DSN says sslmode=disable)
            self.server.sendall(read_startup(self.client, self._send_client))
            skipping = False
            while True:
                kind, body = read_message(self.client)
                length = len(body) + 4
                if skipping:  # a Parse the proxy refused: drop the rest up to Sync
                    if kind == b"S":
                        skipping = False
                        self.server.sendall(_message(b"S", b""))
                    continue
                if kind == b"Q":
                    self.server.sendall(self._query(body))
                elif kind == b"P":
                    out = self._parse(body)
                    if out is None:
                        skipping = True
                        continue
                    self.server.sendall(out)
                else:
                    self.server.sendall(kind + struct.pack("!I", length) + body)
                    if kind == b"X":
                        return
        except (EOFError, OSError):
            return

    def _refuse(self, sqlstate: str, message: str) -> None:
        self.pending_error = error_response(sqlstate, message)

    def _translate(self, statement: str) -> tuple[str | None, list[str]]:
        """T-SQL -> PostgreSQL, or None after arranging an error for the client."""
        self.proxy.recorder.record(to_tsql_markers(statement))
        self.batch_results = None
        azure = self._azure_refusal(statement)
        if azure is not None:
            self._refuse("42000", azure)
            return None, []
        try:
            if is_batch(statement):
                result = translate_batch(statement, self.proxy.resolver, nocount=self.nocount)
            else:
                result = translate(statement, self.proxy.resolver)
        except Untranslatable as error:
            self._refuse("42000", f"{error} (standin)")
            return None, []
        if result.nocount is not None:
            self.nocount = result.nocount
        self.batch_results = result.results
        if result.isolation:
            self.isolation = result.isolation
        elif result.sql == "BEGIN":
            self.fresh_txn = True
        elif result.data_access and self.isolation == "SNAPSHOT" and not self.proxy.snapshot_allowed():
            self._refuse(
                "42000",
                f"Snapshot isolation transaction failed accessing database '{self.proxy.database}' because snapshot "
                "isolation is not allowed in this database. Use ALTER DATABASE to allow snapshot isolation. (3952)",
            )
            return None, []
        verb = statement.strip().split(None, 1)[0].upper() if statement.strip() else "SELECT"
        self.last_verb = verb if verb in ("SELECT", "INSERT", "UPDATE", "DELETE", "EXEC", "EXECUTE") else "SELECT"
        return result.sql, result.extra

    def _query(self, body: bytes) -> bytes:
        text = body.rstrip(b"\0").decode()
        head, statement, tail = split_driver_statements(text)
        if not statement:
            return _message(b"Q", body)
        cursor, statement = unwrap_cursor(statement)
        if cursor and _is_internal(statement):  # the driver's own catalog query in a cursor
            return _message(b"Q", body)
        sql, extra = self._translate(drop_inlined_casts(statement) if cursor else statement)
        if sql is None:
            prefix = ";".join(head)
            return _message(b"Q", prefix.encode() + b"\0") if prefix else _message(b"S", b"")
        # isolation for a transaction psqlODBC opened right before this statement
        in_new_txn = any(h.strip().upper() == "BEGIN" for h in head) or self.fresh_txn
        if sql != "BEGIN" and not extra:
            self.fresh_txn = False
        parts = [*head, cursor + sql, *(extra if in_new_txn else []), *tail]
        if self.batch_results:  # in statement order (the server answers each in turn)
            added = len(extra) if in_new_txn else 0
            self.results = deque(["show"] * len(head) + self.batch_results + ["show"] * (added + len(tail)))
        return _message(b"Q", ";".join(parts).encode() + b"\0")

    def _parse(self, body: bytes) -> bytes | None:
        name_end = body.index(b"\0")
        query_end = body.index(b"\0", name_end + 1)
        text = body[name_end + 1 : query_end].decode()
        cursor, statement = unwrap_cursor(text)
        if _is_internal(statement):
            return _message(b"P", body)
        sql, _extra = self._translate(drop_inlined_casts(statement) if cursor else statement)
        if sql is not None and self.batch_results:  # PostgreSQL prepares one statement only
            self._refuse("42000", f"the SQL Server stand-in cannot prepare the batch {statement!r} (standin)")
            return None
        if sql is None:
            return None
        new_body = body[: name_end + 1] + (cursor + sql).encode() + b"\0" + body[query_end + 1 :]
        return _message(b"P", new_body)

    # -- server -> client -------------------------------------------------------------------

    def _server_to_client(self) -> None:
        try:
            while True:
                kind, body = read_message(self.server)
                kind, body = self._as_the_client_sees(kind, body)
                if not kind:
                    continue
                if kind == b"Z":
                    self.status = body[:1]
                    if self.pending_error is not None:
                        error, self.pending_error = self.pending_error, None
                        status = b"E" if self.status in (b"T", b"E") else b"I"
                        self._send_client(error + _message(b"Z", status))
                        continue
                elif kind == b"E":
                    body = self._rewrite_error(body)
                self._send_client(kind + struct.pack("!I", len(body) + 4) + body)
        except (EOFError, OSError):
            try:
                self.client.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _as_the_client_sees(self, kind: bytes, body: bytes) -> tuple[bytes, bytes]:
        """A batch statement's result as the client gets it (``self.results``): shown; hidden (its
        RowDescription, DataRows and CommandComplete/EmptyQueryResponse dropped: kind b""); or its
        rows counted and reported as ``INSERT 0 <n>`` (a result without columns). An error ends the
        batch (PostgreSQL runs none of the later statements), as does ReadyForQuery."""
        if kind in (b"E", b"Z"):
            self.results.clear()
            return kind, body
        if not self.results or self.results[0] == "show":
            if self.results and kind in (b"C", b"I"):
                self.results.popleft()
            return kind, body
        if kind == b"D":
            self.count_rows += 1
        if kind in (b"C", b"I"):
            shown, rows = self.results.popleft(), self.count_rows
            self.count_rows = 0
            if shown == "count":
                return b"C", f"INSERT 0 {rows}".encode() + b"\0"
        return b"", b""

    def _azure_refusal(self, statement: str) -> str | None:
        """Azure SQL Database: a name into another database (three-part msdb.dbo.x) fails with error
        40515, "Reference to database and/or server name in '<name>' is not supported in this version
        of SQL Server." (the message as Azure SQL Database's clients report it; see
        docs/sqlserver-standin.md, Permissions)."""
        if not self.proxy.azure_sql_database:
            return None
        m = _MSDB_NAME.search(statement)
        if m is None:
            return None
        return (
            f"Reference to database and/or server name in '{m.group(0)}' is not supported in this version of SQL "
            "Server. (40515)"
        )

    def _rewrite_error(self, body: bytes) -> bytes:
        fields = error_fields(body)
        code, text = fields.get(b"C"), fields.get(b"M", "")
        # Refused logins as SQL Server reports them (test-only emulation): a wrong login or password is
        # error 18456 (SQLSTATE 28000), a database that does not exist 4060; drivers name the number.
        if code in ("28P01", "28000"):
            m = re.search(r'(?:authentication failed|role) (?:for user )?"([^"]+)"', text)
            user = m.group(1) if m else ""
            return error_response("28000", f"Login failed for user '{user}'. (18456)", "FATAL")[5:]
        if code == "3D000":
            m = re.search(r'database "([^"]+)" does not exist', text)
            database = m.group(1) if m else ""
            return error_response(
                "42000",
                f'Cannot open database "{database}" requested by the login. The login failed. (4060)',
                "FATAL",
            )[5:]
        if code in ("42P01", "42883"):  # SQL Server: Invalid object name (208)
            m = _MISSING_RELATION.search(text) or _MISSING_FUNCTION.search(text)
            if m:
                return error_response("42S02", f"Invalid object name '{m.group(1).replace(chr(34), '')}'. (208)")[5:]
            return body
        if code == "42703":  # SQL Server: Invalid column name (207)
            m = re.search(r'column "?([^"\s]+)"? does not exist', text)
            if m:
                column = m.group(1).split(".")[-1]
                return error_response("42S22", f"Invalid column name '{column}'. (207)")[5:]
            return body
        if code != "42501":
            return body
        m = _PERMISSION.search(fields.get(b"M", ""))
        if not m:
            return body
        kind, name = m.groups()
        database = self.proxy.database
        if name.startswith("msdb_"):  # standin.msdb_<table> is msdb.dbo.<table> (translate.py)
            name, database = name[len("msdb_") :], "msdb"
        permission = "EXECUTE" if kind == "function" or self.last_verb.startswith("EXEC") else self.last_verb
        schema = name if kind == "schema" else "dbo"
        obj = "" if kind == "schema" else name
        message = (
            f"The {permission} permission was denied on the object '{obj}', database '{database}', "
            f"schema '{schema}'. (229)"
        )
        rewritten = error_response("42000", message)
        return rewritten[5:]


class TsqlProxy(Listener):
    """Listens on 127.0.0.1:<port> and relays to PostgreSQL, translating T-SQL."""

    def __init__(
        self,
        upstream_host: str,
        upstream_port: int,
        database: str,
        *,
        recorder,
        resolver: Resolver | None = None,
        snapshot_allowed: Callable[[], bool] = lambda: True,
        azure_sql_database: bool = False,
    ):
        super().__init__(lambda client: _Session(self, client).run(), "tsql-proxy")
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.database = database
        self.recorder = recorder
        self.resolver = resolver
        self.snapshot_allowed = snapshot_allowed
        self.azure_sql_database = azure_sql_database
