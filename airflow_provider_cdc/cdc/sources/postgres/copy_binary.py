"""Reading ``COPY (SELECT ...) TO STDOUT (FORMAT binary)`` in chunks of rows, framed with numpy.

The binary COPY format is a header (signature, flags, extension), then per row an int16 field
count and per field an int32 length (-1: NULL) and that many bytes, then an int16 -1 trailer.
PostgreSQL sends every row as its own CopyData message ("messages sent from the backend will
always correspond to single data rows", protocol docs, COPY operations), so the row boundaries
come with the messages: the rows of a chunk are concatenated and their fields are walked column
by column over all rows at once (as :mod:`.columnar` walks pgoutput tuples), and every row is
checked to end exactly where its message ends. The Python cost per row is one
``PQgetCopyData`` call and one buffer append.

Hand-written because psycopg's binary rows are Python objects per value (several times slower
than the server produces them), and because the library that parses binary COPY into Arrow in C,
the ADBC PostgreSQL driver (``adbc-driver-postgresql`` 1.13.0), is not faster (issue 32,
``bench/snapshot_adbc.py``, docs/benchmarks.md "The snapshot's COPY parser against ADBC"): the
same ``SELECT`` through ADBC, plus the casts that give today's arrays, took 1.15 x the client
CPU of this parser on the benchmark table, 1.0 x on a table of every binary-read type. Its own
parsing costs 45-65 % more than this read loop and framing together; it catches up only in the
conversion, where its columnar arrays are cheaper to type than a chunk's row-major buffer. Its
output can be made equal bit for bit (its one change of value, the shift of dates and
timestamps from 2000-01-01 to 1970-01-01 in wrapping arithmetic, which turns ``±infinity`` into
wrapped counts, can be undone exactly), so switching is a measurement away if a later driver
parses faster.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from airflow_provider_cdc.cdc.basics.errors import DecodingError
from airflow_provider_cdc.cdc.sources.postgres.binary_values import BinaryColumn, read_at

SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
TRAILER = b"\xff\xff"
_HEADER = len(SIGNATURE) + 8  # signature, int32 flags, int32 header extension length
#: Zero bytes after the last row, so fixed-width reads at any value start stay in the buffer.
_PADDING = b"\0" * 8

#: A chunk ends after this many bytes of rows. Small enough that the server, writing into the
#: socket's buffers, stays busy while the client decodes a chunk; large enough that numpy's
#: per-call costs vanish (measured: docs/benchmarks.md).
CHUNK_BYTES = 4 * 1024 * 1024
_INT16, _INT32 = np.dtype(">i2"), np.dtype(">i4")


class CopyFormatError(DecodingError):
    """Binary COPY data that does not frame as the rows asked for."""


@dataclass(frozen=True)
class CopyChunk:
    """Rows of a binary COPY, column-major: the value of column ``j`` in row ``i`` is at
    ``starts[j, i]`` of ``buffer``, ``lengths[j, i]`` bytes long (-1: NULL)."""

    buffer: np.ndarray  # uint8, the rows concatenated, then padding
    starts: np.ndarray  # int64 (width, n)
    lengths: np.ndarray  # int64 (width, n)

    def __len__(self) -> int:
        return self.starts.shape[1]

    def column(self, j: int) -> BinaryColumn:
        return BinaryColumn(self.buffer, self.starts[j], self.lengths[j])


def frame_rows(buffer: bytes | bytearray, sizes: np.ndarray, width: int) -> CopyChunk:
    """Frame ``len(sizes)`` rows of ``width`` fields concatenated in ``buffer`` (row ``i`` is
    ``sizes[i]`` bytes), which must end with at least 8 bytes of padding.

    Raises :class:`CopyFormatError` if any row is not ``width`` fields that end exactly where the
    row ends; nothing is partially returned."""
    data = np.frombuffer(buffer, np.uint8)
    n = len(sizes)
    ends = np.cumsum(sizes, dtype=np.int64)
    pos = ends - sizes
    if n and len(data) < ends[-1] + len(_PADDING):
        raise ValueError("the buffer must end with padding")
    _check(sizes >= 2, pos, "is shorter than its field count")
    count = read_at(data, pos, _INT16)
    _check(count == width, pos, f"does not have the {width} fields selected")
    pos = pos + 2
    starts = np.empty((width, n), np.int64)
    lengths = np.empty((width, n), np.int64)
    for j in range(width):
        # Reads are clipped to the buffer; a malformed row shows as one that runs past its end.
        length = read_at(data, pos, _INT32)
        starts[j] = pos = pos + 4
        lengths[j] = length
        pos = pos + np.maximum(length, 0)
    if width:
        _check((lengths >= -1).all(axis=0), ends - sizes, "has a negative field length")
    _check(pos == ends, ends - sizes, "does not end where its fields end")
    return CopyChunk(data, starts, lengths)


def _check(ok: np.ndarray, row_starts: np.ndarray, problem: str) -> None:
    if not ok.all():
        first = int(np.flatnonzero(~ok)[0])
        raise CopyFormatError(f"binary COPY row {first} of the chunk (at byte {int(row_starts[first])}) {problem}")


def read_copy_chunks(conn: Any, statement: Any, width: int, chunk_bytes: int | None = None) -> Iterator[CopyChunk]:
    """Run a binary ``COPY ... TO STDOUT`` of ``width`` columns on a psycopg connection and
    yield its rows in chunks of about ``chunk_bytes`` (default :data:`CHUNK_BYTES`)."""
    from psycopg import errors

    chunk_bytes = chunk_bytes or CHUNK_BYTES

    with conn.cursor() as cursor, cursor.copy(statement):
        pgconn = conn.pgconn
        # psycopg's Copy iterator costs about 1 µs per row in Python; the rows are read here
        # with libpq directly (blocking), and the COPY's end is checked below.
        get = pgconn.get_copy_data
        nbytes, first = get(0)
        if nbytes < _HEADER or bytes(first[: len(SIGNATURE)]) != SIGNATURE:
            raise CopyFormatError("the COPY did not start with the binary format's signature")
        flags, extension = np.frombuffer(bytes(first[len(SIGNATURE) : _HEADER]), ">i4")
        if flags & (1 << 16):
            raise CopyFormatError("the binary COPY carries OIDs, which were not requested")
        pending: Any = first[_HEADER + int(extension) :]
        done = False
        while not done:
            buffer = bytearray()
            sizes: list[int] = []
            size = 0
            extend, append = buffer.extend, sizes.append
            if pending is not None:
                nbytes, data, pending = len(pending), pending, None
            else:
                nbytes, data = get(0)
            while True:
                if nbytes <= 2:  # the trailer (a row has at least one field: 6 bytes), empty, or the end
                    if nbytes == 0:
                        nbytes, data = get(0)
                        continue
                    done = True
                    if nbytes < 0:
                        _raise_copy_end(pgconn, errors)
                    elif bytes(data) != TRAILER:
                        raise CopyFormatError(f"a {nbytes}-byte binary COPY message that is not the trailer")
                    break
                extend(data)
                append(nbytes)
                size += nbytes
                if size >= chunk_bytes:
                    break
                nbytes, data = get(0)
            if sizes:
                extend(_PADDING)
                yield frame_rows(buffer, np.array(sizes, np.int64), width)
        # After the trailer the server sends CopyDone and the command's result.
        nbytes, _ = get(0)
        if nbytes != -1:
            raise CopyFormatError("binary COPY data after the trailer")
        _raise_copy_end(pgconn, errors, ended=True)


def _raise_copy_end(pgconn: Any, errors: Any, *, ended: bool = False) -> None:
    """Collect the COPY's final result; raise the server's error if it failed."""
    from psycopg import pq

    results = []
    while (result := pgconn.get_result()) is not None:
        results.append(result)
    failed = [r for r in results if r.status != pq.ExecStatus.COMMAND_OK]
    if failed:
        raise errors.error_from_result(failed[0], encoding=conn_encoding(pgconn))
    if not ended:
        raise CopyFormatError("the binary COPY ended without its trailer")


def conn_encoding(pgconn: Any) -> str:
    return getattr(pgconn, "_encoding", "utf-8")
