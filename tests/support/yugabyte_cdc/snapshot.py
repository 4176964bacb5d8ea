"""A stream's consistent snapshot: one exported PostgreSQL snapshot, read a tablet page by page.

The snapshot is exported by a TEMPORARY logical slot on a replication connection that then
idles (the snapshot stays importable until that connection's next command), as the YSQL
stand-in does for ``yb_read_time``. Pages are read in ``REPEATABLE READ`` after ``SET
TRANSACTION SNAPSHOT``, the tablet's rows in DocDB order (hash, then key), after the last key
returned. Values come back in PostgreSQL's text format, as the output functions print them.
"""

from __future__ import annotations

import threading
import uuid

from psycopg import pq

from .schema import Table, TableSchema
from .tablets import parse_row_key, row_key

#: The hash the tablets are cut by, on a row: yb_standin's yb_hash_code (hashtext & 0xFFFF) of
#: the hash column's text (concat_ws prints it with its output function, as pgoutput does).
HASH_SQL = "hashtext(concat_ws(chr(31), {column})) & 65535"


def ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class HeldSnapshot:
    """An exported snapshot and the idle replication connection that keeps it importable."""

    def __init__(self, replication_conninfo: str) -> None:
        self._conn = pq.PGconn.connect(replication_conninfo.encode())
        if self._conn.status != pq.ConnStatus.OK:
            raise RuntimeError(self._conn.error_message.decode(errors="replace"))
        slot = "ybcs_" + uuid.uuid4().hex[:24]
        result = self._conn.exec_(f"CREATE_REPLICATION_SLOT {slot} TEMPORARY LOGICAL pgoutput EXPORT_SNAPSHOT".encode())
        if result.status != pq.ExecStatus.TUPLES_OK:
            message = result.error_message.decode(errors="replace")
            self._conn.finish()
            raise RuntimeError(f"could not export a snapshot: {message}")
        self.consistent_point = result.get_value(0, 1).decode()
        self.name = result.get_value(0, 2).decode()

    def close(self) -> None:
        self._conn.finish()


class SnapshotReader:
    """Reads snapshot pages; one PostgreSQL connection per calling thread."""

    def __init__(self, conninfo: str) -> None:
        self._conninfo = conninfo
        self._local = threading.local()

    def page(
        self,
        snapshot: str,
        table: Table,
        schema: TableSchema,
        bounds: tuple[int, int],
        after: bytes,
        limit: int,
    ) -> tuple[list[tuple[dict, bytes]], bool]:
        """Up to ``limit`` (row, key) pairs after key ``after`` (b"" = from the start), and
        whether more rows follow."""
        names = [c.name for c in schema.columns]
        keys = schema.key_columns
        hashed = HASH_SQL.format(column=ident(schema.hash_column.name))
        query = (
            f'SELECT * FROM (SELECT {hashed} AS "?h", {", ".join(ident(n) for n in names)} '
            f"FROM ONLY {ident(table.schema_name)}.{ident(table.name)}) AS s "
            'WHERE "?h" >= $1::int AND "?h" < $2::int'
        )
        params: list[bytes | None] = [str(bounds[0]).encode(), str(bounds[1]).encode()]
        if after:
            hash_code, values = parse_row_key(after)
            placeholders = ", ".join(f"${i + 4}::{c.type_name}" for i, c in enumerate(keys))
            query += f' AND ("?h", {", ".join(ident(c.name) for c in keys)}) > ($3::int, {placeholders})'
            params += [str(hash_code).encode(), *(str(v).encode() for v in values)]
        query += f' ORDER BY "?h", {", ".join(ident(c.name) for c in keys)} LIMIT {limit + 1}'
        result = self._run(snapshot, query, params)
        rows = []
        for r in range(min(result.ntuples, limit)):
            row = {name: result.get_value(r, i + 1) for i, name in enumerate(names)}
            hash_code = int(result.get_value(r, 0))
            rows.append((row, row_key(hash_code, tuple(row[c.name] for c in keys))))
        return rows, result.ntuples > limit

    def _run(self, snapshot: str, query: str, params: list[bytes | None]) -> pq.PGresult:
        conn = self._connection()
        try:
            self._ok(conn.exec_(b"BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"))
            self._ok(conn.exec_(f"SET TRANSACTION SNAPSHOT '{snapshot}'".encode()))
            self._ok(conn.exec_(b"SET LOCAL TimeZone = 'GMT'"))  # YB prints timestamptz in GMT
            result = self._ok(conn.exec_params(query.encode(), params))
            self._ok(conn.exec_(b"COMMIT"))
            return result
        except Exception:
            conn.finish()
            self._local.conn = None
            raise

    def _connection(self) -> pq.PGconn:
        conn = getattr(self._local, "conn", None)
        if conn is None or conn.status != pq.ConnStatus.OK:
            conn = pq.PGconn.connect(self._conninfo.encode())
            if conn.status != pq.ConnStatus.OK:
                raise RuntimeError(conn.error_message.decode(errors="replace"))
            self._local.conn = conn
        return conn

    @staticmethod
    def _ok(result: pq.PGresult) -> pq.PGresult:
        if result.status not in (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK):
            raise RuntimeError(result.error_message.decode(errors="replace"))
        return result
