"""yboutput messages, hand-built byte by byte (reference §4.3 item 1), through the shared decoder.

yboutput is pgoutput's code with YB's replica identities: the bytes here follow the research
note (§3, §4) — Relation replica identity 'c'/'d'/'f'/'n', 'u' for a column the server did not
send, 'n' for an explicit NULL, BEGIN's final LSN = the commit LSN and COMMIT's end LSN = commit + 1.
"""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_cdc.cdc.sources.postgres import columnar
from airflow_provider_cdc.cdc.sources.postgres.decoder import (
    PG_EPOCH_OFFSET_US,
    UNCHANGED_TOAST,
    Begin,
    Commit,
    Delete,
    Insert,
    Relation,
    Update,
    decode_message,
)
from airflow_provider_cdc.cdc.sources.yugabyte.lsn import ht_from_unix_us
from airflow_provider_cdc.cdc.sources.yugabyte.stream import strip_unavailable_old_tuple

OID = 16384
COMMIT_HT = ht_from_unix_us(1_732_000_000_123_456, 7)
COMMIT_PG_US = 1_732_000_000_123_456 - PG_EPOCH_OFFSET_US  # commit_time: PG-epoch µs (as Debezium reads it)


def t(text: bytes) -> bytes:
    return b"t" + struct.pack("!i", len(text)) + text


def tup(*columns: bytes) -> bytes:
    return struct.pack("!h", len(columns)) + b"".join(columns)


N, U = b"n", b"u"


def relation(replident: bytes) -> bytes:
    return (
        b"R"
        + struct.pack("!I", OID)
        + b"public\0employee\0"
        + replident
        + struct.pack("!h", 3)
        + b"\x01employee_id\0"
        + struct.pack("!Ii", 23, -1)
        + b"\x00employee_name\0"
        + struct.pack("!Ii", 25, -1)
        + b"\x00employee_dept\0"
        + struct.pack("!Ii", 25, -1)
    )


def test_relation_replica_identities():
    for byte, name in ((b"c", "c"), (b"d", "d"), (b"f", "f"), (b"n", "n")):
        message = decode_message(relation(byte))
        assert isinstance(message, Relation)
        assert message.replica_identity == name
        assert (message.namespace, message.name) == ("public", "employee")
        assert [(c.name, c.type_oid, c.is_replica_identity) for c in message.columns] == [
            ("employee_id", 23, True),
            ("employee_name", 25, False),
            ("employee_dept", 25, False),
        ]


def test_begin_and_commit_carry_the_commit_hybrid_time():
    begin = decode_message(b"B" + struct.pack("!QqI", COMMIT_HT, COMMIT_PG_US, 2))
    assert begin == Begin(final_lsn=COMMIT_HT, commit_ts_us=1_732_000_000_123_456, xid=2)
    commit = decode_message(b"C" + struct.pack("!BQQq", 0, COMMIT_HT, COMMIT_HT + 1, COMMIT_PG_US))
    assert commit == Commit(flags=0, commit_lsn=COMMIT_HT, end_lsn=COMMIT_HT + 1, commit_ts_us=1_732_000_000_123_456)
    assert commit.commit_lsn == begin.final_lsn


def test_insert_new_tuple():
    message = decode_message(b"I" + struct.pack("!I", OID) + b"N" + tup(t(b"1001"), t(b"Alice"), t(b"Packaging")))
    assert message == Insert(OID, (b"1001", b"Alice", b"Packaging"))


def test_update_without_old_tuple_change_and_default():
    # CHANGE: key + changed column sent, the rest 'u'; DEFAULT: the full row; neither has an old tuple
    change = decode_message(b"U" + struct.pack("!I", OID) + b"N" + tup(t(b"1001"), t(b"Bob"), U))
    assert change == Update(OID, None, None, (b"1001", b"Bob", UNCHANGED_TOAST))
    default = decode_message(b"U" + struct.pack("!I", OID) + b"N" + tup(t(b"1001"), t(b"Bob"), t(b"Packaging")))
    assert default == Update(OID, None, None, (b"1001", b"Bob", b"Packaging"))


def test_update_with_an_all_unsent_old_key_tuple_older_builds():
    payload = b"U" + struct.pack("!I", OID) + b"K" + tup(U, U, U) + b"N" + tup(t(b"1001"), t(b"Bob"), U)
    message = decode_message(payload)
    assert message == Update(OID, "K", (UNCHANGED_TOAST,) * 3, (b"1001", b"Bob", UNCHANGED_TOAST))
    stripped = strip_unavailable_old_tuple(payload)
    assert decode_message(stripped) == Update(OID, None, None, (b"1001", b"Bob", UNCHANGED_TOAST))


def test_update_with_old_row_full():
    payload = (
        b"U"
        + struct.pack("!I", OID)
        + b"O"
        + tup(t(b"1001"), t(b"Alice"), t(b"Packaging"))
        + b"N"
        + tup(t(b"1001"), t(b"Bob"), t(b"Packaging"))
    )
    assert decode_message(payload) == Update(
        OID, "O", (b"1001", b"Alice", b"Packaging"), (b"1001", b"Bob", b"Packaging")
    )
    assert strip_unavailable_old_tuple(payload) is payload  # a real before image stays


def test_update_with_all_null_old_row_full_same_transaction():
    payload = b"U" + struct.pack("!I", OID) + b"O" + tup(N, N, N) + b"N" + tup(t(b"1001"), t(b"Bob"), t(b"X"))
    assert decode_message(payload).old == (None, None, None)
    assert decode_message(strip_unavailable_old_tuple(payload)) == Update(OID, None, None, (b"1001", b"Bob", b"X"))


def test_delete_key_and_old_row():
    key = decode_message(b"D" + struct.pack("!I", OID) + b"K" + tup(t(b"1001"), N, N))
    assert key == Delete(OID, "K", (b"1001", None, None))  # key + NULL non-key columns
    full = decode_message(b"D" + struct.pack("!I", OID) + b"O" + tup(t(b"1001"), t(b"Bob"), t(b"Packaging")))
    assert full == Delete(OID, "O", (b"1001", b"Bob", b"Packaging"))
    # strip only concerns updates
    payload = b"D" + struct.pack("!I", OID) + b"K" + tup(N, N, N)
    assert strip_unavailable_old_tuple(payload) is payload


def test_set_unset_and_null_are_told_apart():
    # UPDATE t1 SET b = NULL, c = false under CHANGE: ('2', n, 'f'); and a column not sent: 'u'
    payload = b"U" + struct.pack("!I", OID) + b"N" + tup(t(b"2"), N, t(b"f"), U, t(b""))
    message = decode_message(payload)
    assert message.new == (b"2", None, b"f", UNCHANGED_TOAST, b"")
    assert message.new[1] is None and message.new[3] is UNCHANGED_TOAST and message.new[4] == b""
    # the column-wise decoder of the stream keeps the same three kinds
    rows = columnar.decode_rows([payload], 5)
    assert rows.new.kinds[:, 0].tolist() == [ord("t"), ord("n"), ord("t"), ord("u"), ord("t")]
    assert rows.text(rows.new, 3).to_pylist() == [None]
    assert rows.text(rows.new, 4).to_pylist() == [""]


# -- strip_unavailable_old_tuple, property-based ---------------------------------------------

kind = st.sampled_from(["t", "n", "u"])
value = st.binary(max_size=12)
columns = st.lists(st.tuples(kind, value), min_size=0, max_size=8)


def encode_columns(cols: list[tuple[str, bytes]]) -> bytes:
    return tup(*[t(v) if k == "t" else k.encode() for k, v in cols])


@given(st.sampled_from([None, "K", "O"]), columns, columns)
@settings(max_examples=400)
def test_strip_removes_exactly_value_less_old_tuples(old_kind, old, new):
    head = b"U" + struct.pack("!I", OID)
    payload = head + (b"" if old_kind is None else old_kind.encode() + encode_columns(old)) + b"N" + encode_columns(new)
    stripped = strip_unavailable_old_tuple(payload)
    decoded = decode_message(payload)
    valueless = old_kind is not None and len(old) > 0 and all(k in "nu" for k, _ in old)
    if valueless:
        assert stripped == head + b"N" + encode_columns(new)
        after = decode_message(stripped)
        assert after.old is None and after.old_kind is None and after.new == decoded.new
    else:
        assert stripped is payload


@given(st.binary(max_size=40))
def test_strip_never_fails_on_garbage(garbage):
    for prefix in (b"", b"U", b"U\0\0\0\1K", b"U\0\0\0\1O\0\2"):
        result = strip_unavailable_old_tuple(prefix + garbage)
        assert isinstance(result, bytes)


def test_strip_leaves_other_messages_alone():
    insert = b"I" + struct.pack("!I", OID) + b"N" + tup(N, U)
    assert strip_unavailable_old_tuple(insert) is insert
    no_old = b"U" + struct.pack("!I", OID) + b"N" + tup(N, U)
    assert strip_unavailable_old_tuple(no_old) is no_old
