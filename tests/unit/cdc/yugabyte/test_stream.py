"""YbWindowCollector against the documented yboutput examples, into real Arrow event batches.

The employee table (reference §1.2/§1.3, research §3): INSERT (1001, 'Alice', 'Packaging'), UPDATE
name = 'Bob', DELETE, under replica identity CHANGE, DEFAULT and FULL, as YB sends them; then
YB's window rules (retransmitted transactions, the hybrid-time bound, keepalives) and the
current-state fold of CHANGE events (patches) against full-row events.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_cdc.cdc.basics.errors import DecodingError
from airflow_provider_cdc.cdc.basics.window import Window
from airflow_provider_cdc.cdc.events.settings import EventContext
from airflow_provider_cdc.cdc.events.value_modes import DEFAULT_PLACEHOLDER
from airflow_provider_cdc.cdc.sources.postgres.decoder import (
    UNCHANGED_TOAST,
    Begin,
    Commit,
    Delete,
    Insert,
    LogicalMessage,
    Origin,
    Relation,
    RelationColumn,
    Truncate,
    Update,
)
from airflow_provider_cdc.cdc.sources.postgres.replication import Keepalive, XLogData
from airflow_provider_cdc.cdc.sources.postgres.stream import WindowCollector
from airflow_provider_cdc.cdc.sources.postgres.tables import Column, TableInfo, TableRef
from airflow_provider_cdc.cdc.sources.postgres.types import PgType
from airflow_provider_cdc.cdc.sources.yugabyte.lsn import YbLsn, ht_from_unix_us
from airflow_provider_cdc.cdc.sources.yugabyte.stream import YbWindowCollector, window_bound_after
from tests.support.pgoutput import encode

OID = 16384
REF = TableRef("public", "employee")
COLUMNS = (
    Column("employee_id", PgType(23, -1, "integer", "int4")),
    Column("employee_name", PgType(25, -1, "text", "text")),
    Column("employee_dept", PgType(25, -1, "text", "text")),
)
TOPIC = "yb.public.employee"
T0 = 1_732_000_000_000_000  # µs
U = UNCHANGED_TOAST  # on YB: a column the server did not send


def ht(second: int) -> int:
    """A commit hybrid time ``second`` seconds after T0 (a YB HYBRID_TIME slot's commit LSN)."""
    return ht_from_unix_us(T0 + second * 1_000_000)


def relation(replident: str) -> XLogData:
    columns = tuple(RelationColumn(c.name, c.type.oid, -1, c.name == "employee_id") for c in COLUMNS)
    return XLogData(0, encode(Relation(OID, "public", "employee", replident, columns)))  # Relation frames: LSN 0


def transaction(commit: int, xid: int, *changes) -> list[XLogData]:
    """YB's frames of one transaction: every record carries the commit HT; COMMIT's data_start
    and end_lsn are commit + 1; BEGIN's final_lsn is the commit."""
    ts = ht_to_us(commit)
    return [
        XLogData(commit, encode(Begin(commit, ts, xid))),
        *(XLogData(commit, encode(change)) for change in changes),
        XLogData(commit + 1, encode(Commit(0, commit, commit + 1, ts))),
    ]


def ht_to_us(value: int) -> int:
    return value >> 12


class Collected:
    def __init__(self) -> None:
        self.batches: dict[str, list[pa.RecordBatch]] = {}
        self.transactions: list[pa.RecordBatch] = []

    def __call__(self, batches: dict[str, list[pa.RecordBatch]], tx_batch: pa.RecordBatch | None) -> None:
        for topic, items in batches.items():
            self.batches.setdefault(topic, []).extend(items)
        if tx_batch is not None:
            self.transactions.append(tx_batch)

    def table(self, topic: str = TOPIC) -> pa.Table:
        return pa.Table.from_batches(self.batches[topic])

    def rows(self, topic: str = TOPIC) -> list[dict]:
        return self.table(topic).to_pylist() if topic in self.batches else []


def collector(
    replident: str = "c",
    *,
    from_lsn: int = ht(0),
    to_lsn: int = ht(100),
    max_changes: int = 1000,
    cls: type[WindowCollector] = YbWindowCollector,
) -> tuple[WindowCollector, Collected]:
    window = Window(1, "stream", YbLsn(from_lsn), YbLsn(to_lsn), 1_732_000_500_000)
    table = TableInfo(REF, OID, COLUMNS, ("employee_id",), replident, True)
    out = Collected()
    return (
        cls(
            window=window,
            tables={REF: table},
            context=EventContext.of_window("yb", "yugabyte", window),
            topic_prefix="yb",
            previous_commit_lsn=None,
            max_changes_per_chunk=max_changes,
            flush=out,
        ),
        out,
    )


def envelopes(rows: list[dict]) -> list[tuple]:
    return [(r["op"], r["before"], r["after"], r["unchanged_toast_columns"]) for r in rows]


def run(replident: str, *changes_by_tx: tuple, end: int = ht(100)) -> tuple[YbWindowCollector, Collected]:
    c, out = collector(replident)
    frames = [relation(replident)]
    for i, changes in enumerate(changes_by_tx):
        frames += transaction(ht(1 + i), 2 + i, *changes)
    frames += transaction(end, 99)  # the heartbeat after the end: its BEGIN completes the window
    c.consume(frames)
    assert c.done
    c.finish()
    return c, out


def row(id_: int, name: str | None, dept: str | None) -> dict:
    return {"employee_id": id_, "employee_name": name, "employee_dept": dept}


ALICE = (b"1001", b"Alice", b"Packaging")
INSERT = Insert(OID, ALICE)

# -- the documented employee example under each replica identity -----------------------------


def test_employee_change():
    # CHANGE: the update sends the key and the changed column ('u' for the rest, no old tuple);
    # the delete's 'K' is the key with NULL non-key columns.
    _, out = run(
        "c",
        (INSERT,),
        (Update(OID, None, None, (b"1001", b"Bob", U)),),
        (Delete(OID, "K", (b"1001", None, None)),),
    )
    assert envelopes(out.rows()) == [
        ("c", None, row(1001, "Alice", "Packaging"), None),
        ("u", None, row(1001, "Bob", DEFAULT_PLACEHOLDER), ["employee_dept"]),
        ("d", row(1001, None, None), None, None),
    ]


def test_employee_default():
    _, out = run(
        "d",
        (INSERT,),
        (Update(OID, None, None, (b"1001", b"Bob", b"Packaging")),),
        (Delete(OID, "K", (b"1001", None, None)),),
    )
    assert envelopes(out.rows()) == [
        ("c", None, row(1001, "Alice", "Packaging"), None),
        ("u", None, row(1001, "Bob", "Packaging"), None),
        ("d", row(1001, None, None), None, None),
    ]


def test_employee_full():
    bob = (b"1001", b"Bob", b"Packaging")
    _, out = run("f", (INSERT,), (Update(OID, "O", ALICE, bob),), (Delete(OID, "O", bob),))
    assert envelopes(out.rows()) == [
        ("c", None, row(1001, "Alice", "Packaging"), None),
        ("u", row(1001, "Alice", "Packaging"), row(1001, "Bob", "Packaging"), None),
        ("d", row(1001, "Bob", "Packaging"), None, None),
    ]


def test_change_update_tells_explicit_null_from_not_sent():
    # UPDATE employee SET employee_dept = NULL: dept 'n' (a real null), name 'u' (not sent)
    _, out = run("c", (INSERT,), (Update(OID, None, None, (b"1001", U, None)),))
    update = out.rows()[1]
    assert update["after"] == row(1001, DEFAULT_PLACEHOLDER, None)
    assert update["unchanged_toast_columns"] == ["employee_name"]  # the null dept is not listed


def test_older_builds_all_unsent_old_key_is_no_before_image():
    _, out = run("c", (INSERT,), (Update(OID, "K", (U, U, U), (b"1001", b"Bob", U)),))
    assert envelopes(out.rows())[1] == ("u", None, row(1001, "Bob", DEFAULT_PLACEHOLDER), ["employee_dept"])


def test_full_update_of_a_row_inserted_in_the_same_transaction():
    # FULL + cdc_send_null_before_image_if_not_exists: the old 'O' is all 'n' ("unavailable")
    c, out = run("f", (INSERT, Update(OID, "O", (None, None, None), (b"1001", b"Bob", b"Packaging"))))
    assert envelopes(out.rows()) == [
        ("c", None, row(1001, "Alice", "Packaging"), None),
        ("u", None, row(1001, "Bob", "Packaging"), None),
    ]
    assert c.stats.key_changes == 0  # not mistaken for a key change (old key NULL vs 1001)


def test_source_and_transaction_blocks_carry_the_commit_hybrid_time():
    c, out = run("c", (INSERT,))
    event = out.rows()[0]
    assert event["source"]["commit_lsn"] == ht(1) == event["source"]["lsn"]
    assert event["source"]["ts_ms"] == (T0 + 1_000_000) // 1000
    assert event["transaction"]["id"] == f"2:{ht(1)}"
    assert c.stats.last_commit_lsn == ht(1) and c.stats.transactions == 1
    statuses = pa.Table.from_batches(out.transactions).column("status").to_pylist()
    assert statuses == ["BEGIN", "END"]


# -- YB's window rules ------------------------------------------------------------------------


def test_window_bounds_are_just_after_the_positions():
    assert window_bound_after(ht(5)) == ht(5) + 1 and isinstance(window_bound_after(0), YbLsn)


@pytest.mark.parametrize("path", ["consume", "feed"])
def test_retransmitted_transactions_are_skipped_whole(path):
    # The previous window ended at commit ht(1): this one starts at ht(1) + 1. After a
    # reconnect YB re-sends ht(1) whole (with a Relation inside), then the new transaction.
    c, out = collector("c", from_lsn=window_bound_after(ht(1)))
    frames = [
        relation("c"),
        *transaction(ht(1), 2, INSERT, Update(OID, None, None, (b"1001", b"Old", U))),
        *transaction(ht(2), 3, Update(OID, None, None, (b"1001", b"Bob", U))),
        *transaction(ht(100), 4),
    ]
    frames.insert(3, relation("c"))  # a Relation inside the skipped transaction is still applied
    if path == "consume":
        c.consume(frames)
    else:
        for frame in frames:
            if c.feed(frame):
                break
    assert c.done
    stats = c.finish()
    assert stats.retransmitted_skipped == 1 and stats.retransmitted_changes_skipped == 2
    assert stats.transactions == 1 and stats.changes == 1 and stats.last_commit_lsn == ht(2)
    assert envelopes(out.rows()) == [("u", None, row(1001, "Bob", DEFAULT_PLACEHOLDER), ["employee_dept"])]


def test_postgres_collector_would_refuse_the_retransmission():
    c, _ = collector("c", from_lsn=window_bound_after(ht(1)), cls=WindowCollector)
    with pytest.raises(DecodingError, match="before the window start"):
        c.consume([relation("c"), *transaction(ht(1), 2, INSERT)])


def test_skipped_transaction_must_end_with_its_own_commit():
    c, _ = collector("c", from_lsn=ht(5))
    frames = [relation("c"), *transaction(ht(1), 2, INSERT)]
    frames[-1] = XLogData(ht(3) + 1, encode(Commit(0, ht(3), ht(3) + 1, T0)))
    with pytest.raises(DecodingError, match="skipped Begin"):
        c.consume(frames)
    c, _ = collector("c", from_lsn=ht(5))
    c.consume([relation("c"), *transaction(ht(1), 2, INSERT)[:-1]])
    with pytest.raises(DecodingError, match="retransmitted"):
        c.finish()


def test_the_hybrid_time_bound_ends_the_window():
    end = ht(10)
    c, out = collector("c", to_lsn=window_bound_after(end))
    consumed: list[XLogData] = []

    def frames() -> Iterator[XLogData]:
        for frame in [
            relation("c"),
            *transaction(end, 2, INSERT),  # commit == end HT: inside [from, end + 1)
            *transaction(end + 1, 3, Update(OID, None, None, (b"1001", b"Bob", U))),  # the next window's
            *transaction(end + 2, 4, Delete(OID, "K", (b"1001", None, None))),
        ]:
            consumed.append(frame)
            yield frame

    c.consume(frames())
    assert c.done
    c.finish()
    assert [r["op"] for r in out.rows()] == ["c"]
    assert len(consumed) == 5  # stopped at the BEGIN at end + 1, reading no further


def test_keepalives_never_end_a_window():
    c, out = collector("c", to_lsn=ht(10))
    c.consume(
        [
            relation("c"),
            Keepalive(2**64 - 1),  # YB's walEnd is no commit bound
            *transaction(ht(1), 2, INSERT),
            Keepalive(ht(50)),
        ]
    )
    assert not c.done
    assert c.feed(Keepalive(2**64 - 1)) is False
    c.consume([*transaction(ht(2), 3, Delete(OID, "K", (b"1001", None, None))), *transaction(ht(10), 4)])
    assert c.done
    c.finish()
    assert [r["op"] for r in out.rows()] == ["c", "d"]


def test_chunks_split_inside_and_around_skipped_transactions():
    c, out = collector("c", from_lsn=ht(2), max_changes=2)
    frames = [relation("c"), *transaction(ht(1), 2, INSERT, INSERT, INSERT)]
    frames += transaction(ht(2), 3, *[Insert(OID, (str(i).encode(), b"x", None)) for i in range(5)])
    frames += transaction(ht(100), 4)
    c.consume(frames)
    c.finish()
    assert [r["employee_id"] for r in out.rows()] == [0, 1, 2, 3, 4]
    assert c.stats.chunks >= 3 and c.stats.retransmitted_changes_skipped == 3


def test_truncate_message_and_origin_are_tolerated_as_on_postgres():
    # YB never sends them; should one arrive it is handled as PostgreSQL's collector does.
    c, out = collector("c")
    frames = transaction(ht(1), 2, INSERT)
    frames[1:1] = [
        XLogData(ht(1), encode(Origin(0, "elsewhere"))),
        XLogData(ht(1), encode(Truncate((OID,), False, False))),
        XLogData(ht(1), encode(LogicalMessage(True, ht(1), "app", b"hi"))),
    ]
    c.consume([relation("c"), *frames, *transaction(ht(100), 3)])
    c.finish()
    assert [r["op"] for r in out.rows()] == ["t", "c"]
    assert c.stats.messages == 1


# -- the current-state fold: CHANGE patches ≡ full rows ----------------------------------------

STATEMENTS_CHANGE = (
    (INSERT, Insert(OID, (b"1002", b"Carol", b"Sales"))),
    (Update(OID, None, None, (b"1001", b"Bob", U)),),  # SET name = 'Bob'
    (Update(OID, None, None, (b"1002", U, None)),),  # SET dept = NULL: explicit null
    (Update(OID, None, None, (b"1001", U, b"Ops")),),  # SET dept = 'Ops'
    (Insert(OID, (b"1003", b"Dan", b"QA")), Delete(OID, "K", (b"1003", None, None))),
)
STATEMENTS_DEFAULT = (
    (INSERT, Insert(OID, (b"1002", b"Carol", b"Sales"))),
    (Update(OID, None, None, (b"1001", b"Bob", b"Packaging")),),
    (Update(OID, None, None, (b"1002", b"Carol", None)),),
    (Update(OID, None, None, (b"1001", b"Bob", b"Ops")),),
    (Insert(OID, (b"1003", b"Dan", b"QA")), Delete(OID, "K", (b"1003", None, None))),
)


def test_folding_change_events_equals_folding_full_rows(spark, tmp_path):
    from airflow_provider_cdc.cdc.state.spark_fold import fold

    states = {}
    for replident, statements in (("c", STATEMENTS_CHANGE), ("d", STATEMENTS_DEFAULT)):
        _, out = run(replident, *statements)
        path = tmp_path / f"{replident}.parquet"
        pq.write_table(out.table(), path)
        folded = fold(spark, spark.read.parquet(str(path)), None)
        states[replident] = sorted(tuple(r) for r in folded.collect())
    expected = [(1001, "Bob", "Ops"), (1002, "Carol", None)]
    assert states["d"] == expected
    assert states["c"] == expected  # 'u' kept the previous value; the explicit NULL is a null


# -- char(n) and numeric(p,s) as YugabyteDB's walsender prints them --------------------------------


def test_char_and_numeric_text_match_the_snapshots():
    # YB's walsender rebuilds datums with typmod -1 (ybc_pggate.cc, YBCPgGetCDCConsistentChanges):
    # char(n) arrives right-trimmed (DocDB stores it so) and numeric without trailing fraction
    # zeros. The snapshot, a YSQL scan, prints both at the column's typmod: the events must agree.
    from airflow_provider_cdc.cdc.events.settings import EventSettings
    from airflow_provider_cdc.cdc.events.value_modes import ValueModes

    code = PgType(1042, 7, "character(3)", "bpchar")  # typmod = n + 4
    amount = PgType(1700, (14 << 16 | 4) + 4, "numeric(14,4)", "numeric")
    columns = (Column("code", code), Column("amount", amount), Column("note", PgType(1042, -1, "bpchar", "bpchar")))
    table = TableInfo(REF, OID, columns, ("code",), "f", True)
    window = Window(1, "stream", YbLsn(ht(0)), YbLsn(ht(100)), 1_732_000_500_000)
    out = Collected()
    c = YbWindowCollector(
        window=window,
        tables={REF: table},
        context=EventContext.of_window("yb", "yugabyte", window),
        topic_prefix="yb",
        previous_commit_lsn=None,
        max_changes_per_chunk=1000,
        flush=out,
        settings=EventSettings(modes=ValueModes(decimal="string")),
    )
    rel = tuple(RelationColumn(col.name, col.type.oid, col.type.modifier, col.name == "code") for col in columns)
    frames = [XLogData(0, encode(Relation(OID, "public", "employee", "f", rel)))]
    frames += transaction(ht(1), 2, Insert(OID, (b"x", b"1.5", b"y ")))
    frames += transaction(ht(2), 3, Delete(OID, "O", (b"x", b"10", b"y ")))
    frames += transaction(ht(100), 99)
    c.consume(frames)
    c.finish()
    insert, delete = out.rows()
    assert insert["after"] == {"code": "x  ", "amount": "1.5000", "note": "y "}  # bpchar without length: as sent
    assert delete["before"] == {"code": "x  ", "amount": "10.0000", "note": "y "}
