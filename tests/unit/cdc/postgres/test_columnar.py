"""The vectorised row decoder agrees with the per-message decoder, and rejects what it rejects."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_cdc.cdc.basics.errors import DecodingError
from airflow_provider_cdc.cdc.sources.postgres import columnar
from airflow_provider_cdc.cdc.sources.postgres.decoder import (
    UNCHANGED_TOAST,
    Delete,
    Insert,
    Update,
    decode_message,
    encode_delete,
    encode_insert,
    encode_update,
)
from tests.support.pgoutput import encode

text_value = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30).map(str.encode)
value = st.one_of(st.none(), st.just(UNCHANGED_TOAST), text_value)


def rows_of(width: int):
    row = st.lists(value, min_size=width, max_size=width).map(tuple)
    return st.one_of(
        st.builds(Insert, st.just(7), row),
        st.builds(Update, st.just(7), st.none(), st.none(), row),
        st.builds(Update, st.just(7), st.sampled_from("KO"), row, row),
        st.builds(Delete, st.just(7), st.sampled_from("KO"), row),
        st.just("truncate"),
    )


chunks = st.integers(1, 6).flatmap(lambda width: st.tuples(st.just(width), st.lists(rows_of(width), max_size=40)))


def payload(message) -> bytes:
    return columnar.TRUNCATE_ROW if message == "truncate" else encode(message)


def images(message):
    """(old, new) tuples as the per-message decoder sees them."""
    if message == "truncate":
        return None, None
    decoded = decode_message(encode(message))
    return getattr(decoded, "old", None), getattr(decoded, "new", None)


def expected_column(tuples, j):
    return [None if t is None or t[j] is None or t[j] is UNCHANGED_TOAST else t[j].decode() for t in tuples]


@settings(max_examples=300, deadline=None)
@given(chunks)
def test_columns_match_the_per_message_decoder(chunk):
    width, messages = chunk
    rows = columnar.decode_rows([payload(m) for m in messages], width)
    assert len(rows) == len(messages)
    assert bytes(rows.kinds) == b"".join(payload(m)[:1] for m in messages)
    olds, news = zip(*(images(m) for m in messages)) if messages else ((), ())
    for image, tuples in ((rows.old, olds), (rows.new, news)):
        assert list(image.present) == [t is not None for t in tuples]
        for j in range(width):
            assert rows.text(image, j).to_pylist() == expected_column(tuples, j)
            unchanged = [t is not None and t[j] is UNCHANGED_TOAST for t in tuples]
            assert list(image.kinds[j] == columnar.UNCHANGED) == unchanged


@settings(max_examples=200, deadline=None)
@given(rows_of(3).filter(lambda m: m != "truncate"))
def test_the_product_encoders_match_the_independent_test_encoder(message):
    if isinstance(message, Insert):
        produced = encode_insert(message.relation_oid, message.new)
    elif isinstance(message, Update):
        produced = encode_update(message.relation_oid, message.old_kind, message.old, message.new)
    else:
        produced = encode_delete(message.relation_oid, message.old_kind, message.old)
    assert produced == encode(message)


@settings(max_examples=300, deadline=None)
@given(chunks, st.data())
def test_a_truncated_message_is_rejected_naming_its_row(chunk, data):
    width, messages = chunk
    tupled = [i for i, m in enumerate(messages) if m != "truncate"]
    if not tupled:
        return
    victim = data.draw(st.sampled_from(tupled))
    payloads = [payload(m) for m in messages]
    cut = data.draw(st.integers(0, len(payloads[victim]) - 1))
    payloads[victim] = payloads[victim][:cut]
    with pytest.raises(columnar.MalformedRow) as caught:
        columnar.decode_rows(payloads, width)
    assert caught.value.row == victim
    with pytest.raises(DecodingError):  # the reference decoder agrees the message is malformed
        decode_message(payloads[victim])


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        (encode(Insert(7, (b"1", b"2"))) + b"x", "trailing bytes"),
        (encode(Insert(7, (b"1",))), "relation.s 2 columns"),
        (b"I\0\0\0\x07N\0\x02b\0\0\0\x011t\0\0\0\x012", "binary column values"),
        (b"I\0\0\0\x07N\0\x02x\0\0\0\x011t\0\0\0\x012", "unknown column kind"),
        (b"I\0\0\0\x07K\0\x02t\0\0\0\x011t\0\0\0\x012", "no 'N' tuple"),
        (b"D\0\0\0\x07N\0\x02t\0\0\0\x011t\0\0\0\x012", "no 'K' or 'O' tuple"),
        (b"I\0\0\0\x07N\0\x02t\xff\xff\xff\xfe1t\0\0\0\x012", "negative value length"),
        (b"I\0\0\0\x07N\0\x02t\0\0\0\x011t\0\0\0\x092", "runs past its end"),
        (b"B\0\0\0\x07N", "not an Insert, Update or Delete"),
        (b"Tx", "trailing bytes after a truncate marker"),
    ],
)
def test_malformed_messages_are_named(payload, problem):
    good = encode(Insert(7, (b"a", b"b")))
    with pytest.raises(columnar.MalformedRow, match=problem) as caught:
        columnar.decode_rows([good, payload, good], 2)
    assert caught.value.row == 1


def test_a_length_read_from_the_next_message_does_not_walk_before_the_buffer():
    # Found by the property test above: a cut inside a length field reads the next message's
    # bytes as a large negative length; the walk must still stay inside the buffer.
    good = encode(Insert(7, (b"a", b"b", b"c")))
    cut = b"I\0\0\0\x07N\0\x03t\0\0\0\x02\xc2\x80t\xc2\x80"
    with pytest.raises(columnar.MalformedRow, match="negative value length") as caught:
        columnar.decode_rows([good, cut, good], 3)
    assert caught.value.row == 1


def test_text_that_is_not_utf8_is_a_clear_error():
    rows = columnar.decode_rows([encode(Insert(7, (b"\xff\xfe",)))], 1)
    with pytest.raises(DecodingError, match=r"not valid UTF-8.*UTF8"):
        rows.text(rows.new, 0)


def test_an_empty_chunk_decodes_to_nothing():
    rows = columnar.decode_rows([], 3)
    assert len(rows) == 0
    assert rows.text(rows.new, 2).to_pylist() == []
