"""Vectorised decoding of many pgoutput row messages of one relation at once.

The per-message decoder (:mod:`.decoder`) turns each Insert/Update/Delete into Python tuples of
``bytes``: about 9 Python objects per row, then a transpose to build Arrow columns. That is what
bounded a stream window at a fraction of the server's decode rate. Here the messages of one
chunk stay raw: they are concatenated into one buffer, and the tuple layout (kind byte, int32
length, text) is walked column by column with numpy over all rows at once, so the Python cost
per row is a list append. Each column's text values are then gathered into an Arrow string
array without creating a Python object per value.

Hand-written because no library decodes pgoutput (see :mod:`.decoder`); the per-message decoder
stays the reference, and ``tests/unit/cdc/postgres/test_columnar.py`` checks both agree on
arbitrary messages (property-based).

A row message here is one of (see PostgreSQL's "Logical Replication Message Formats"):

- ``I`` oid ``N`` tuple
- ``U`` oid [``K``|``O`` tuple] ``N`` tuple
- ``D`` oid ``K``|``O`` tuple
- ``T``: a truncate event of this relation (our own one-byte marker; it has no tuple).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from airflow_provider_cdc.cdc.basics.errors import DecodingError

INSERT, UPDATE, DELETE, TRUNCATE = 0x49, 0x55, 0x44, 0x54
_NEW, _KEY, _OLD = 0x4E, 0x4B, 0x4F
TEXT, NULL, UNCHANGED = 0x74, 0x6E, 0x75
TRUNCATE_ROW = b"T"


def _byte_set(*members: int) -> np.ndarray:
    """A lookup table of bytes: ``table[array]`` is ``np.isin(array, members)`` for uint8 arrays,
    a third faster (0.6 against 0.9 ms for a 50 000-row chunk of 9 columns)."""
    table = np.zeros(256, bool)
    table[list(members)] = True
    return table


_ROW_KINDS = _byte_set(INSERT, UPDATE, DELETE, TRUNCATE)
_VALUE_KINDS = _byte_set(TEXT, NULL, UNCHANGED)


class MalformedRow(DecodingError):
    """A row message that does not parse; ``row`` is its index in the chunk."""

    def __init__(self, message: str, row: int):
        super().__init__(message)
        self.row = row


@dataclass(frozen=True)
class TupleImage:
    """One tuple image (old or new) of ``n`` rows, column-major: ``kinds[j, i]`` is the kind of
    column ``j`` in row ``i`` (``t``/``n``/``u``; ``n`` for rows without this image). Where its
    text is in the chunk buffer is in :attr:`RowMessages.values`."""

    present: np.ndarray  # bool (n,)
    kinds: np.ndarray  # uint8 (width, n)


@dataclass(frozen=True)
class RowMessages:
    """Decoded layout of a chunk of row messages of one relation."""

    buffer: np.ndarray  # uint8: the messages, concatenated
    kinds: np.ndarray  # uint8 (n,): I/U/D/T
    old: TupleImage
    new: TupleImage
    # Every value of the chunk as one binary array over ``buffer``, without copying: values and
    # the bytes between them (headers) alternate as elements, in buffer order (row by row; old
    # tuple, then new tuple), so a column is one ``take`` (:meth:`text`).
    values: pa.Array

    def __len__(self) -> int:
        return len(self.kinds)

    def text(self, image: TupleImage, column: int) -> pa.Array:
        """Column ``column`` of ``image`` as a string array (null for NULL, unchanged TOAST and
        rows without the image). Raises :class:`DecodingError` on text that is not UTF-8."""
        width = image.kinds.shape[0]
        which = 0 if image is self.old else 1
        # element index of each row's value in ``values``: rows are 4 * width elements apart
        index = np.arange(1 + 2 * (which * width + column), 4 * width * len(self) + 1, 4 * width)
        values = self.values.take(pa.array(index))
        try:
            return values.cast(pa.string())
        except pa.ArrowInvalid as exc:
            raise DecodingError(f"a text column value is not valid UTF-8 ({exc}); the database must use UTF8") from None


_INT32_LIMIT = 2**31 - 1


def decode_rows(payloads: list[bytes], width: int) -> RowMessages:
    """Decode the layout of row messages whose tuples all have ``width`` columns.

    Raises :class:`DecodingError` naming the first malformed message (by its index) if any
    message is malformed; nothing is partially returned."""
    sizes = np.fromiter(map(len, payloads), dtype=np.int64, count=len(payloads))
    return decode_buffer(np.frombuffer(b"".join([*payloads, PADDING]), dtype=np.uint8), sizes, width)


def decode_array(payloads: pa.Array, width: int) -> RowMessages:
    """:func:`decode_rows` of the row messages of an Arrow binary array (no nulls), without a
    Python object per message: its values are already one buffer."""
    offsets, values = binary_buffers(payloads)
    return decode_buffer(values[offsets[0] : offsets[-1]], np.diff(offsets), width)


def binary_buffers(array: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The value offsets (int64, ``len(array) + 1``) and the value bytes of a binary or large
    binary array, as zero-copy numpy views (offsets index the bytes)."""
    if array.type == pa.binary():
        dtype = np.int32
    elif array.type == pa.large_binary():
        dtype = np.int64
    else:
        raise TypeError(f"expected a binary array of pgoutput messages, got {array.type}")
    _, offsets_buffer, data_buffer = array.buffers()
    n = len(array)
    if offsets_buffer is None:  # an empty array may have no buffers at all
        return np.zeros(1, np.int64), np.zeros(0, np.uint8)
    offsets = np.frombuffer(offsets_buffer, dtype)[array.offset : array.offset + n + 1].astype(np.int64)
    values = np.zeros(0, np.uint8) if data_buffer is None else np.frombuffer(data_buffer, np.uint8)
    return offsets, values


#: Zero bytes after a chunk's messages: the walk reads 4 bytes at a time, up to the last byte.
#: A buffer that ends with them is decoded without a padded copy.
PADDING = bytes(4)


def decode_buffer(buffer: np.ndarray, sizes: np.ndarray, width: int) -> RowMessages:
    """:func:`decode_rows` of messages stored back to back in ``buffer`` (``sizes``: each one's
    length in bytes), which may end with :data:`PADDING` after them (saves a copy)."""
    n = len(sizes)
    if len(buffer) > _INT32_LIMIT:  # the values' offsets are int32
        raise DecodingError(f"a chunk of {len(buffer)} bytes is too large; lower max_changes_per_chunk")
    ends = np.cumsum(sizes)
    starts = ends - sizes
    if n and sizes.min() < 1:
        raise MalformedRow("empty pgoutput message", int(np.argmin(sizes)))
    kinds = buffer[starts] if n else np.zeros(0, np.uint8)
    _check(_ROW_KINDS[kinds], "is not an Insert, Update or Delete", kinds)
    tupled = kinds != TRUNCATE
    _check(~tupled | (sizes >= 6), "is too short for a row message", kinds)
    _check(tupled | (sizes == 1), "has trailing bytes after a truncate marker", kinds)
    marker = np.where(tupled, buffer[np.where(tupled, starts + 5, starts)], 0) if n else kinds

    has_old = tupled & ((marker == _KEY) | (marker == _OLD)) & (kinds != INSERT)
    _check(~(kinds == DELETE) | has_old, "(a Delete) has no 'K' or 'O' tuple", kinds)
    _check(~(kinds == INSERT) | (marker == _NEW), "(an Insert) has no 'N' tuple", kinds)
    # The values' offsets are written in place by the walks, after a leading 0: for each row, old
    # then new image, for each column its start and end (see RowMessages.values). Two int32 per
    # (row, column, image) is all the position memory a decode holds.
    offsets = np.empty(1 + n * 2 * width * 2, np.int32)
    offsets[0] = 0
    bounds = offsets[1:].reshape(n, 2, width, 2)
    total = int(ends[-1]) if n else 0
    padded = buffer[: total + 4]
    if len(padded) < total + 4 or padded[total:].any():
        padded = np.concatenate([buffer[:total], np.zeros(4, np.uint8)])
    old, old_end = _parse_image(padded, starts + 6, ends, has_old, width, absent_at=starts, bounds=bounds[:, 0])

    wants_new = tupled & (kinds != DELETE)
    new_marker_at = np.where(has_old, old_end, starts + 5)
    _check(~wants_new | (new_marker_at < ends), "ends before its new tuple", kinds)
    new_marker = buffer[np.where(wants_new, new_marker_at, starts)] if n else kinds
    _check(~wants_new | (new_marker == _NEW), "has no 'N' tuple where one is due", kinds)
    new, new_end = _parse_image(padded, new_marker_at + 1, ends, wants_new, width, absent_at=ends, bounds=bounds[:, 1])
    del padded

    final = np.where(wants_new, new_end, old_end)
    _check(~tupled | (final == ends), "has trailing bytes after its last tuple", kinds)
    valid = np.ones((n, 2, width, 2), bool)
    valid[:, 0, :, 1] = (old.kinds == TEXT).T
    valid[:, 1, :, 1] = (new.kinds == TEXT).T
    values = pa.Array.from_buffers(
        pa.binary(),
        len(offsets) - 1,
        [pa.py_buffer(np.packbits(valid, bitorder="little")), pa.py_buffer(offsets), pa.py_buffer(buffer)],
    )
    return RowMessages(buffer, kinds, old, new, values)


def _parse_image(
    padded: np.ndarray,
    at: np.ndarray,
    ends: np.ndarray,
    rows: np.ndarray,
    width: int,
    *,
    absent_at: np.ndarray,
    bounds: np.ndarray,
) -> tuple[TupleImage, np.ndarray]:
    """Walk the tuples starting at ``at`` for the ``rows`` that have one (``padded``: the chunk
    buffer and 4 zero bytes); returns the image and where each tuple ends, and writes each
    value's start and end into ``bounds`` (int32, ``(n, width, 2)``).

    The walk is optimistic: every read is clipped to the buffer, and the checks run once at the
    end. Positions only move forward (a text value moves by 5 + its length, clamped at 0,
    anything else by 1), so a malformed tuple always shows as one that runs past its message, a
    negative length or an unknown column kind.

    Every (row, column) gets a start in buffer order, also where there is no value (a NULL
    starts after its kind byte, a missing image at ``absent_at``, both with length 0), so that
    all values of a chunk form one monotonic sequence (see :attr:`RowMessages.values`)."""
    n = len(at)
    kinds = np.full((width, n), NULL, np.uint8)
    index = np.flatnonzero(rows)
    full = len(index) == n  # every row has this image: no scatter needed
    # (width, n) here, written to ``bounds`` at the end: column by column into its strided view is slower
    starts = np.repeat(absent_at[None, :].astype(np.int32), width, axis=0) if width else np.zeros((0, n), np.int32)
    stops = starts.copy()
    pos = at if full else at[index]
    limit = ends if full else ends[index]
    negative = np.zeros(len(index), bool)
    ncols = _be_int(padded, pos, 2)
    width_ok = (pos + 2 <= limit) & (ncols == width)
    _check_rows(width_ok, index, f"does not have a tuple of its relation's {width} columns")
    pos = pos + 2
    for j in range(width):
        kind = padded.take(pos, mode="clip")
        text = kind == TEXT
        raw_length = _be_int(padded, pos + 1, 4)
        start = pos + np.where(text, 5, 1)
        length = np.where(text, raw_length, 0)
        # A negative length is reported below; the walk itself never moves backwards, so no
        # read can land before the buffer.
        pos = start + np.maximum(length, 0)
        negative |= length < 0
        if full:
            kinds[j], starts[j], stops[j] = kind, start, start + length
        else:
            kinds[j, index], starts[j, index], stops[j, index] = kind, start, start + length
    # A negative length is checked first (what follows it is garbage); then the end, then the kinds.
    _check_rows(~negative, index, "has a negative value length")
    _check_rows(pos <= limit, index, "has a tuple that runs past its end")
    present = kinds if full else kinds[:, index]
    if not _VALUE_KINDS[present].all():
        _check_rows(~(present == 0x62).any(axis=0), index, "has binary column values, which were not requested")
        _check_rows(_VALUE_KINDS[present].all(axis=0), index, "has an unknown column kind")
    bounds[:, :, 0] = starts.T
    bounds[:, :, 1] = stops.T
    end = np.zeros(n, np.int64)
    end[index] = pos
    return TupleImage(rows, kinds), end


def _be_int(padded: np.ndarray, at: np.ndarray, size: int) -> np.ndarray:
    """The signed big-endian integers of ``size`` (2 or 4) bytes at ``at`` (int32), each byte
    read clipped to the buffer (past its end: the zero padding). One gather per byte: a gather
    of 4-byte rows (a strided window view, or an unaligned ``>i4`` view) is 4 to 15 times slower."""
    value = padded.take(at, mode="clip").astype(np.int32)
    if size == 2:
        value = (value << 24) >> 16  # sign-extended
    else:
        value <<= 24
        value |= padded.take(at + 1, mode="clip").astype(np.int32) << 16
        value |= padded.take(at + 2, mode="clip").astype(np.int32) << 8
    return value | padded.take(at + size - 1, mode="clip")


def _check(ok: np.ndarray, problem: str, kinds: np.ndarray) -> None:
    if not ok.all():
        first = int(np.flatnonzero(~ok)[0])
        raise MalformedRow(f"malformed pgoutput {chr(int(kinds[first]))!r} message: {problem}", first)


def _check_rows(ok: np.ndarray, index: np.ndarray, problem: str) -> None:
    if not ok.all():
        first = int(index[np.flatnonzero(~ok)[0]])
        raise MalformedRow(f"malformed pgoutput row message: {problem}", first)
