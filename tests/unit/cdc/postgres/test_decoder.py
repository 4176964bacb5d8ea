"""The pgoutput decoder: property-based round trips and malformed input."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_cdc.cdc.basics.errors import DecodingError
from airflow_provider_cdc.cdc.sources.postgres.decoder import (
    UNCHANGED_TOAST,
    Begin,
    Commit,
    Delete,
    Insert,
    LogicalMessage,
    MessageType,
    Origin,
    Relation,
    RelationColumn,
    Truncate,
    TypeInfo,
    Update,
    decode_message,
)
from tests.support.pgoutput import encode

u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
ts_us = st.integers(-(2**62), 2**62)
names = st.text(st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)), max_size=40)
value = st.one_of(st.none(), st.just(UNCHANGED_TOAST), st.binary(max_size=64))
row = st.lists(value, max_size=12).map(tuple)
key_row = st.lists(st.one_of(st.none(), st.binary(max_size=16)), max_size=6).map(tuple)

messages = st.one_of(
    st.builds(Begin, u64, ts_us, u32),
    st.builds(Commit, st.just(0), u64, u64, ts_us),
    st.builds(Origin, u64, names),
    st.builds(
        Relation,
        u32,
        names,
        names,
        st.sampled_from("dnfi"),
        st.lists(st.builds(RelationColumn, names, u32, st.integers(-1, 2**31 - 1), st.booleans()), max_size=8).map(
            tuple
        ),
    ),
    st.builds(TypeInfo, u32, names, names),
    st.builds(Insert, u32, row),
    st.one_of(
        st.builds(Update, u32, st.none(), st.none(), row),
        st.builds(Update, u32, st.just("K"), key_row, row),
        st.builds(Update, u32, st.just("O"), row, row),
    ),
    st.builds(Delete, u32, st.sampled_from("KO"), row),
    st.builds(Truncate, st.lists(u32, max_size=5).map(tuple), st.booleans(), st.booleans()),
    st.builds(LogicalMessage, st.booleans(), u64, names, st.binary(max_size=100)),
)


@given(messages)
@settings(max_examples=600)
def test_round_trip(message):
    assert decode_message(encode(message)) == message


@given(messages, st.data())
@settings(max_examples=300)
def test_truncated_messages_fail_cleanly(message, data):
    payload = encode(message)
    cut = data.draw(st.integers(0, len(payload) - 1))
    if cut == 0:
        with pytest.raises(DecodingError):
            decode_message(payload[:0])
        return
    try:
        decoded = decode_message(payload[:cut])
    except DecodingError:
        return
    # A prefix can itself be a valid message only when nothing was lost (e.g. empty tails).
    assert encode(decoded) == payload[:cut]


@given(messages)
def test_trailing_bytes_are_rejected(message):
    with pytest.raises(DecodingError, match="trailing"):
        decode_message(encode(message) + b"\x00")


def test_unknown_message_type_is_named():
    with pytest.raises(DecodingError, match=r"unsupported pgoutput message type b'S'"):
        decode_message(b"S\x00\x00\x00\x01")


def test_binary_column_values_are_refused():
    payload = b"I" + (5).to_bytes(4, "big") + b"N" + (1).to_bytes(2, "big") + b"b" + (1).to_bytes(4, "big") + b"x"
    with pytest.raises(DecodingError, match="binary"):
        decode_message(payload)


def test_begin_decodes_postgres_epoch_timestamps():
    # 2000-01-01T00:00:00Z is 0 in PostgreSQL's epoch and 946684800 s in Unix time.
    payload = b"B" + (0x16B3748).to_bytes(8, "big") + (0).to_bytes(8, "big") + (571).to_bytes(4, "big")
    assert decode_message(payload) == Begin(final_lsn=0x16B3748, commit_ts_us=946_684_800_000_000, xid=571)


def test_message_types_are_an_enum():
    assert MessageType.for_byte(ord("I")) is MessageType.INSERT
    with pytest.raises(DecodingError):
        MessageType.for_byte(0)
