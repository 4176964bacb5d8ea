"""The YugabyteDB stand-in's publication refresh, tables not of interest and restart time without
an ack (docs/yugabytedb-standin.md), driven over real replication connections."""

from __future__ import annotations

import select
import time

import pytest
from psycopg import pq

from airflow_provider_cdc.cdc.sources.postgres.decoder import Insert
from tests.standin.test_yugabyte_standin import Stream, replication_command
from tests.support.yugabyte import YugabyteStandIn

pytestmark = pytest.mark.pg

HOUR_MS = 3600 * 1000


def make_tables(yb, *names: str) -> None:
    with yb.connect() as conn:
        for name in names:
            conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v text)")


def create_slot(yb, slot: str = "s") -> None:
    """A slot (no snapshot), and the clock past its consistent hybrid time."""
    command = f"CREATE_REPLICATION_SLOT {slot} LOGICAL yboutput HYBRID_TIME NOEXPORT_SNAPSHOT"
    status, row = replication_command(yb, command)
    assert status == "ok", row
    snapshot_ht = yb.admin_query("SELECT snapshot_ht FROM yb_standin.slots WHERE slot_name = %s", (slot,))[0][0]
    while yb.current_ht() <= snapshot_ht:
        time.sleep(0.02)


def insert(yb, table: str, key: int) -> None:
    """One journaled transaction (waits for the journal, so a later ``pass_time`` comes after it)."""
    count = "SELECT count(*) FROM yb_standin.journal"
    before = yb.admin_query(count)[0][0]
    with yb.connect() as conn:
        conn.execute(f"INSERT INTO {table} VALUES ({key}, 'x')")
    deadline = time.monotonic() + 10
    while yb.admin_query(count)[0][0] <= before:
        assert time.monotonic() < deadline, "the stand-in's journal did not catch up"
        time.sleep(0.02)


def streamed(yb, seconds: float = 1.2, slot: str = "s") -> list[tuple[str, int]]:
    """(table, key) of the inserts one session streams within ``seconds``."""
    stream = Stream(yb, slot)
    assert stream.error is None, stream.error
    try:
        messages = stream.quiet(seconds)
    finally:
        stream.close()
    names = {m.oid: m.name for m in messages if type(m).__name__ == "Relation"}
    return [(names[m.relation_oid], int(m.new[0])) for m in messages if isinstance(m, Insert)]


def slot_stream_id(yb, slot: str = "s") -> str:
    return yb.admin_query("SELECT stream_id FROM yb_standin.slots WHERE slot_name = %s", (slot,))[0][0]


def stream_error(yb, slot: str = "s", timeout: float = 5.0) -> tuple[str, str]:
    """(SQLSTATE, message) of the ErrorResponse that ends a session (inside COPY BOTH, as YB's)."""
    stream = Stream(yb, slot)
    assert stream.error is None, stream.error  # the failure comes from the CDC service, inside the stream
    try:
        deadline = time.monotonic() + timeout
        while True:
            assert time.monotonic() < deadline, "the session did not fail"
            nbytes, _data = stream.conn.get_copy_data(1)
            if nbytes < 0:
                break
            if nbytes == 0:
                select.select([stream.conn.socket], [], [], 0.1)
                stream.conn.consume_input()
        result = stream.conn.get_result()
        return (
            result.error_field(pq.DiagnosticField.SQLSTATE).decode(),
            result.error_field(pq.DiagnosticField.MESSAGE_PRIMARY).decode(),
        )
    finally:
        stream.close()


def test_skip_unqualified_flag_exists_only_in_its_releases(pg15):
    """``set_flags`` refuses a flag the emulated release does not have (checked before anything runs)."""
    for release in ("2025.2.6.0", "2026.1.1.0"):
        with pytest.raises(ValueError, match="does not exist in YugabyteDB"):
            YugabyteStandIn(pg15, "unused", release=release).set_flags(cdc_skip_unqualified_tables_for_polling=True)


def test_publication_history_and_pass_time(yugabyte):
    """The emulation's clock: publication membership is recorded over time, and ``pass_time`` moves
    every stored time back and applies the refreshes that fell due."""
    make_tables(yugabyte, "t1", "t2")
    with yugabyte.connect() as conn:
        conn.execute("CREATE PUBLICATION p FOR TABLE t1")
    create_slot(yugabyte)
    with yugabyte.connect() as conn:
        conn.execute("ALTER PUBLICATION p ADD TABLE t2")
        conn.execute("ALTER PUBLICATION p DROP TABLE t1")
    history = (
        "SELECT relid::regclass::text, removed_ms IS NULL FROM yb_standin.pub_history WHERE pubname = 'p' ORDER BY 1"
    )
    assert yugabyte.admin_query(history) == [("-", True), ("t1", False), ("t2", True)]
    created = yugabyte.admin_query("SELECT created_ms FROM yb_standin.slots")[0][0]
    yugabyte.pass_time(HOUR_MS)
    assert yugabyte.admin_query("SELECT created_ms FROM yb_standin.slots")[0][0] == created - HOUR_MS
    refreshes = yugabyte.admin_query(
        "SELECT refresh_ms - (SELECT created_ms FROM yb_standin.slots) FROM yb_standin.slot_refresh ORDER BY 1"
    )
    assert refreshes == [(0,), (3_600_000,)]  # creation, then the last 900 s grid point passed
