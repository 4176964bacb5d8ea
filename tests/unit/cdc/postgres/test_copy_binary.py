"""Framing of binary COPY rows: every field found where the format puts it, every malformed row
rejected (never framed into garbage), and the column accessors' values."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_cdc.cdc.sources.postgres.binary_values import BinaryColumn
from airflow_provider_cdc.cdc.sources.postgres.copy_binary import CopyFormatError, frame_rows

field = st.one_of(st.none(), st.binary(max_size=40))
chunks = st.integers(1, 6).flatmap(
    lambda width: st.tuples(st.just(width), st.lists(st.lists(field, min_size=width, max_size=width), max_size=40))
)


def encode_row(fields: list[bytes | None]) -> bytes:
    """One row as PostgreSQL sends it: int16 field count, then per field int32 length + bytes."""
    out = struct.pack(">h", len(fields))
    for value in fields:
        out += struct.pack(">i", -1) if value is None else struct.pack(">i", len(value)) + value
    return out


def framed(messages: list[bytes], width: int):
    buffer = bytearray(b"".join(messages)) + bytes(8)
    return frame_rows(buffer, np.array([len(m) for m in messages], np.int64), width)


@settings(max_examples=300, deadline=None)
@given(chunks)
def test_every_field_is_found(chunk):
    width, rows = chunk
    copy = framed([encode_row(r) for r in rows], width)
    assert len(copy) == len(rows)
    for j in range(width):
        expected = [r[j] for r in rows]
        column = copy.column(j)
        assert column.binary().to_pylist() == expected
        assert [None if n < 0 else bytes(copy.buffer[s : s + n]) for s, n in zip(column.starts, column.lengths)] == (
            expected
        )


@settings(max_examples=300, deadline=None)
@given(chunks, st.data())
def test_a_malformed_row_is_rejected(chunk, data):
    width, rows = chunk
    if not rows:
        return
    messages = [encode_row(r) for r in rows]
    victim = data.draw(st.integers(0, len(rows) - 1))
    message = messages[victim]
    damage = data.draw(st.sampled_from(["truncate", "extend", "count", "length"]))
    if damage == "truncate":
        message = message[: data.draw(st.integers(0, len(message) - 1))]
    elif damage == "extend":
        message += data.draw(st.binary(min_size=1, max_size=8))
    elif damage == "count":
        message = (
            struct.pack(">h", data.draw(st.integers(-(2**15), 2**15 - 1).filter(lambda c: c != width))) + (message[2:])
        )
    else:  # a field length below -1, or running past the row (a length-prefixed format cannot
        # tell every other wrong length from data, but a row never frames past its message)
        lengths = [-1 if f is None else len(f) for f in rows[victim]]
        j = data.draw(st.integers(0, width - 1))
        at = 2 + sum(4 + max(n, 0) for n in lengths[:j])
        past = len(message) - at - 4 + 1
        wrong = data.draw(st.one_of(st.integers(-(2**31), -2), st.integers(max(past, 0), 2**31 - 1)))
        message = message[:at] + struct.pack(">i", wrong) + message[at + 4 :]
    messages[victim] = message
    with pytest.raises(CopyFormatError, match=rf"binary COPY row {victim} of the chunk"):
        framed(messages, width)


def test_an_empty_chunk_frames():
    assert len(framed([], 3)) == 0


def test_text_values_must_be_utf8():
    from airflow_provider_cdc.cdc.basics.errors import DecodingError

    copy = framed([encode_row(["é".encode()]), encode_row([b"\xff"])], 1)
    with pytest.raises(DecodingError, match="not valid UTF-8"):
        copy.column(0).text()
    assert framed([encode_row(["é".encode()]), encode_row([None])], 1).column(0).text().to_pylist() == ["é", None]


def test_fixed_width_values_must_have_their_width():
    from airflow_provider_cdc.cdc.basics.errors import DecodingError

    column = framed([encode_row([b"\x00\x00\x00\x01"]), encode_row([b"\x00\x02"])], 1).column(0)
    with pytest.raises(DecodingError, match="2 bytes where 4 were expected"):
        column.big_endian(">i4")


def test_big_endian_reads_at_any_alignment():
    buffer = np.frombuffer(b"\x00" + struct.pack(">q", -5) + struct.pack(">i", 7) + bytes(8), np.uint8)
    assert BinaryColumn(buffer, np.array([1, 13]), np.array([8, -1])).big_endian(">i8")[0] == -5
    assert BinaryColumn(buffer, np.array([9]), np.array([4])).big_endian(">i4").tolist() == [7]
    assert BinaryColumn(buffer, np.array([9, 13]), np.array([4, -1])).binary().to_pylist() == [
        b"\x00\x00\x00\x07",
        None,
    ]
