from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_cdc.cdc.basics.errors import InvalidOffsetError
from airflow_provider_cdc.cdc.basics.window import Window
from airflow_provider_cdc.cdc.sources.postgres.lsn import MAX_LSN, Lsn
from airflow_provider_cdc.cdc.sources.postgres.offset import OffsetIdentity, PostgresOffset

IDENTITY = OffsetIdentity("shop", "7310000000000000001", "shopdb", "cdc_shop")
lsns = st.integers(0, MAX_LSN).map(Lsn)


@given(
    lsn=st.one_of(st.none(), lsns),
    commit=st.one_of(st.none(), lsns),
    seq=st.integers(0, 10**9),
    completed=st.booleans(),
    revision=st.integers(0, 10**6),
    pending_end=st.one_of(st.none(), st.integers(0, 1000)),
)
def test_round_trip(lsn, commit, seq, completed, revision, pending_end):
    pending = None
    if pending_end is not None and lsn is not None and lsn + pending_end <= MAX_LSN:
        pending = Window(seq + 1, "stream", lsn, Lsn(lsn + pending_end), 123)
    offset = PostgresOffset(
        identity=IDENTITY,
        lsn=lsn,
        lsn_commit=commit,
        tx_id=5,
        ts_usec=6,
        snapshot_completed=completed,
        window_seq=seq,
        pending=pending,
        revision=revision,
    )
    assert PostgresOffset.from_json(offset.to_json()) == offset


def test_document_uses_debezium_key_names_and_integer_lsns():
    doc = json.loads(PostgresOffset(identity=IDENTITY, lsn=Lsn("0/16B3748"), lsn_commit=Lsn(10), tx_id=571).to_json())
    assert doc["lsn"] == 0x16B3748 and doc["lsn_commit"] == 10 and doc["txId"] == 571
    assert doc["format"] == 1 and doc["connector"] == "postgresql" and "ts_usec" in doc
    assert "snapshot_completed" in doc


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "not valid JSON"),
        ("[1, 2]", "not a JSON object"),
        ("{}", "no valid 'format'"),
        ('{"format": 99, "connector": "postgresql"}', "newer than this provider"),
        ('{"format": 1, "connector": "sqlserver"}', "belongs to connector 'sqlserver'"),
        ('{"format": 1, "connector": "postgresql"}', "malformed offset document"),
        (
            '{"format": 1, "connector": "postgresql", "topic_prefix": "shop", "system_identifier": "1",'
            ' "database": "d", "slot_name": "s", "lsn": "zz"}',
            "not an LSN",
        ),
        (
            '{"format": 1, "connector": "postgresql", "topic_prefix": "", "system_identifier": "1",'
            ' "database": "d", "slot_name": "s"}',
            "non-empty string",
        ),
    ],
)
def test_malformed_documents_are_refused_clearly(text, message):
    with pytest.raises(InvalidOffsetError, match=message) as info:
        PostgresOffset.from_json(text, source="Variable 'x'")
    assert "Variable 'x'" in str(info.value)


@pytest.mark.parametrize("field", ["topic_prefix", "system_identifier", "database", "slot_name"])
def test_offsets_of_another_capture_are_refused(field):
    other = OffsetIdentity(**{**IDENTITY.__dict__, field: "other"})
    with pytest.raises(InvalidOffsetError, match=f"belongs to another capture.*{field}"):
        PostgresOffset(identity=other).check_identity(IDENTITY)
    PostgresOffset(identity=IDENTITY).check_identity(IDENTITY)
