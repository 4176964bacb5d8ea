"""Order inside a transaction in function mode (commit_order.seqval_order_is_ambiguous and the re-read).

Rows are ``(__$start_lsn, __$seqval, __$operation, id, name)`` as the change function returns them;
re-read rows carry ``__$command_id`` after the operation, as the change table does.
"""

from __future__ import annotations

from airflow_provider_cdc.cdc.sources.sqlserver.change_queries import ChangesQuery
from airflow_provider_cdc.cdc.sources.sqlserver.commit_order import _in_command_order, seqval_order_is_ambiguous

T1, T2 = b"\x00" * 9 + b"\x01", b"\x00" * 9 + b"\x02"


def _seq(n: int) -> bytes:
    return n.to_bytes(10, "big")


QUERY = ChangesQuery(sql="", command_ids=False, transaction_sql="<one transaction>", key_positions=(3,))


def test_an_insert_before_a_delete_of_one_key_is_ambiguous():
    # KB3030352: a deferred update's insert may come first in __$seqval order
    assert seqval_order_is_ambiguous([(T1, _seq(1), 2, 7, "new"), (T1, _seq(1), 1, 7, "old")], (3,))
    # a delete then an insert (the order __$command_id gives) and other keys are not
    assert not seqval_order_is_ambiguous([(T1, _seq(1), 1, 7, "old"), (T1, _seq(1), 2, 7, "new")], (3,))
    assert not seqval_order_is_ambiguous([(T1, _seq(1), 2, 7, "a"), (T1, _seq(2), 1, 8, "b")], (3,))
    # without a key, any delete after an insert
    assert seqval_order_is_ambiguous([(T1, _seq(1), 2, 7, "a"), (T1, _seq(2), 1, 8, "b")], ())


def test_only_an_ambiguous_transaction_is_read_again_in_command_id_order():
    rows = [
        (T1, _seq(1), 2, 7, "new"),  # ambiguous: insert of 7, then its delete
        (T1, _seq(1), 1, 7, "old"),
        (T2, _seq(5), 3, 9, "x"),
        (T2, _seq(5), 4, 9, "y"),
    ]
    asked: list[bytes] = []

    def read_transaction(lsn: bytes):
        asked.append(lsn)
        return iter([(T1, _seq(1), 1, 1, 7, "old"), (T1, _seq(1), 2, 2, 7, "new")])

    out = list(_in_command_order(iter(rows), QUERY, read_transaction))
    assert asked == [T1]
    assert [row for _key, row in out] == [
        (T1, _seq(1), 1, 7, "old"),
        (T1, _seq(1), 2, 7, "new"),
        (T2, _seq(5), 3, 9, "x"),
        (T2, _seq(5), 4, 9, "y"),
    ]
    # Merge keys across tables: the log position (commit LSN, __$seqval, operation), as Debezium merges.
    assert [key for key, _row in out] == [(T1, _seq(1), 1), (T1, _seq(1), 2), (T2, _seq(5), 3), (T2, _seq(5), 4)]


def test_a_transaction_too_large_to_hold_is_read_from_the_change_table(monkeypatch):
    from airflow_provider_cdc.cdc.sources.sqlserver import commit_order

    monkeypatch.setattr(commit_order, "BUFFERED_TRANSACTION_ROWS", 2)
    rows = [(T1, _seq(i), 2, i, "n") for i in range(1, 5)] + [(T2, _seq(9), 2, 9, "n")]
    asked: list[bytes] = []

    def read_transaction(lsn: bytes):
        asked.append(lsn)
        return iter([(T1, _seq(i), 2, i, i, "n") for i in range(1, 5)])

    out = [row for _key, row in _in_command_order(iter(rows), QUERY, read_transaction)]
    assert asked == [T1]
    assert out == rows  # the change table's rows once, none of the function's twice
