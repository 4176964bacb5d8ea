"""Attacks through signals and stored filters, tried as an attacker would: real Airflow (dag.test),
real PostgreSQL, real Spark.

A security review showed that an execute-snapshot signal's filter was SQL pasted into the chunk
queries, run by the capture role: whoever could trigger the DAG (its run conf), write the signal
table, or edit the stored offset read an uncaptured table through an error text, dropped another
consumer's replication slot, emitted forged logical messages, and (through the offset, whose
filter went into a simple-protocol COPY) dropped a table. Each attack here is the review's, sent
through the channel an attacker has; each asserts the attacker got nothing: no secret in any log,
error, XCom or offset, the other slot alive, no forged message, the table still there.
"""

from __future__ import annotations

import json
import logging

import pytest

from airflow_provider_cdc.cdc.sinks.reader import read_topic_arrow
from tests.integration.test_operators import capture_dag, make_capture
from tests.integration.test_operators import shop_db as shop_db  # a fixture
from tests.support import airflow as af

pytestmark = [pytest.mark.airflow, pytest.mark.spark]

SECRET = "s3cr3t-payroll-9731"
OTHER_SLOT = "other_consumer"

#: What the review sent as ``additional-conditions[].filter``.
EXFILTRATE = "id > 0 AND CAST((SELECT secret FROM payroll LIMIT 1) AS int) > 0"
DROP_SLOT = f"id > 0 AND pg_drop_replication_slot('{OTHER_SLOT}') IS NULL"
FORGE = "id > 0 AND pg_logical_emit_message(false, 'airflow_provider_cdc.forged', 'forged') IS NOT NULL"
# Closes the filter, the subquery and the chunk's COPY, ends the read-only transaction, drops a
# table, and opens a COPY that the
# rest of the chunk statement completes: three statements in one simple-protocol query.
STACKED = "false)) AS o) TO STDOUT; COMMIT; DROP TABLE public.victim; COPY (SELECT 1 FROM (SELECT 1 AS id WHERE (true"


def _execute_snapshot(filter_text: str, table: str = "public.orders") -> dict:
    return {
        "type": "execute-snapshot",
        "data": {
            "data-collections": [table],
            "additional-conditions": [{"data-collection": table, "filter": filter_text}],
        },
    }


@pytest.fixture
def target(shop_db, tmp_path):
    """The shop database with what an attacker is after: an uncaptured table holding a secret,
    another consumer's replication slot, a table to drop."""
    db, conn_id = shop_db
    with db.connect() as conn:
        conn.execute("CREATE TABLE payroll (id int PRIMARY KEY, secret text)")
        conn.execute("INSERT INTO payroll VALUES (1, %s)", (SECRET,))
        conn.execute("CREATE TABLE victim (id int PRIMARY KEY)")
        conn.execute("CREATE TABLE dbz_signal (id varchar(64) PRIMARY KEY, type varchar(32) NOT NULL, data text)")
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (OTHER_SLOT,))
    yield db, conn_id
    with db.connect() as conn:
        conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", (OTHER_SLOT,)
        )


def _unharmed(db) -> None:
    with db.connect() as conn:
        slots = [r[0] for r in conn.execute("SELECT slot_name FROM pg_replication_slots").fetchall()]
        victim = conn.execute("SELECT to_regclass('public.victim') IS NOT NULL").fetchone()[0]
    assert OTHER_SLOT in slots, "the other consumer's slot was dropped"
    assert victim, "public.victim was dropped"


def _said(result, caplog, capfd, store) -> str:
    out = capfd.readouterr()
    return "\n".join(
        [
            out.out,
            out.err,
            caplog.text,
            json.dumps(result.xcom, default=str),
            str(result.errors),
            af.variable(store.key("shop")) or "",
        ]
    )


def test_dag_run_conf_cannot_send_signals_unless_allowed_and_never_a_filter(target, tmp_path, caplog, capfd):
    db, conn_id = target
    caplog.set_level(logging.INFO)
    errors: dict = {}
    capture = make_capture(db, conn_id, tmp_path)
    dag = capture_dag(f"atk_conf_{db.name}", capture, errors)
    assert af.run(dag, 0, errors=errors).state == "success", errors
    store = capture.store()
    before = af.variable(store.key("shop"))
    assert before is not None

    # Anyone who may trigger the DAG: the review's three filters, sent in the run conf.
    conf = {"cdc_signals": [_execute_snapshot(f) for f in (EXFILTRATE, DROP_SLOT, FORGE)]}
    refused = af.run(dag, 1, errors=errors, conf=conf)
    assert refused.tasks["window"] == "failed"
    assert "takes no signals from DAG run conf" in refused.error("window")
    assert af.variable(store.key("shop")) == before  # nothing was stored

    # A capture that takes execute-snapshot from the conf still never takes a filter from it.
    errors.clear()
    allowing = make_capture(db, conn_id, tmp_path, run_conf_signals=["execute-snapshot"])
    dag = capture_dag(f"atk_conf_allowed_{db.name}", allowing, errors)
    refused = af.run(dag, 2, errors=errors, conf=conf)
    assert refused.tasks["window"] == "failed"
    assert "additional-conditions are never taken from DAG run conf" in refused.error("window")
    assert af.variable(store.key("shop")) == before

    _unharmed(db)
    said = _said(refused, caplog, capfd, store)
    assert SECRET not in said
    assert "forged" not in json.dumps(_messages(tmp_path), default=str)


def test_signal_table_filters_select_rows_and_nothing_else(target, tmp_path, caplog, capfd):
    """Database users who may write the signal table: the same filters, as signal rows."""
    db, conn_id = target
    caplog.set_level(logging.INFO)
    errors: dict = {}
    capture = make_capture(db, conn_id, tmp_path, signal_table="public.dbz_signal", incremental_chunk_size=50)
    dag = capture_dag(f"atk_table_{db.name}", capture, errors)
    assert af.run(dag, 0, errors=errors).state == "success", errors
    attacks = {"exfiltrate": EXFILTRATE, "drop-slot": DROP_SLOT, "forge": FORGE, "stacked": STACKED}
    with db.connect() as conn:
        for name, text in attacks.items():
            signal = _execute_snapshot(text)
            conn.execute(
                "INSERT INTO dbz_signal VALUES (%s, %s, %s)", (name, signal["type"], json.dumps(signal["data"]))
            )
        # and one honest filter, which must still work
        honest = _execute_snapshot("customer_id <= 3 AND status <> 'x'")
        conn.execute("INSERT INTO dbz_signal VALUES ('honest', %s, %s)", (honest["type"], json.dumps(honest["data"])))
    first = af.run(dag, 1, errors=errors)
    assert first.state == "success", errors
    second = af.run(dag, 2, errors=errors)
    assert second.state == "success", errors

    notes = json.dumps(first.xcom["window"])
    for name in attacks:
        assert f"signal '{name}'" in notes and "not an accepted filter" in notes, notes
    _unharmed(db)
    said = _said(second, caplog, capfd, capture.store())
    assert SECRET not in said
    assert not [m for m in _messages(tmp_path) if "forged" in json.dumps(m, default=str)]
    orders = read_topic_arrow(str(tmp_path), "shop", "shop.public.orders").to_pylist()
    incremental = sorted(e["after"]["id"] for e in orders if e["source"]["snapshot"] == "incremental")
    with db.connect() as conn:
        expected = [r[0] for r in conn.execute("SELECT id FROM orders WHERE customer_id <= 3 ORDER BY id").fetchall()]
    assert incremental == expected


def test_a_filter_edited_into_the_stored_offset_is_parsed_again_and_never_run(target, tmp_path, caplog, capfd):
    """Whoever may edit Airflow Variables: the offset's filter went into a COPY sent through the
    simple protocol, where ``false) TO STDOUT; DROP TABLE ...`` ran as a second statement."""
    db, conn_id = target
    caplog.set_level(logging.INFO)
    errors: dict = {}
    capture = make_capture(db, conn_id, tmp_path, incremental_chunk_size=2, incremental_chunks_per_run=1)
    start = {"id": "op-1", "type": "execute-snapshot", "data": {"data-collections": ["public.orders"]}}
    dag = capture_dag(f"atk_offset_{db.name}", capture, errors, signals=[start])
    assert af.run(dag, 0, errors=errors).state == "success", errors
    assert af.run(dag, 1, errors=errors).state == "success", errors  # the snapshot runs: one chunk read
    store = capture.store()
    document = json.loads(af.variable(store.key("shop")))
    (table,) = document["incremental_snapshot"]["tables"]
    assert table["status"] == "running"
    table["condition"] = STACKED  # the edit, as in the Variables UI
    af.set_variable(store.key("shop"), json.dumps(document))
    after = af.run(dag, 2, errors=errors)
    assert after.state == "success", errors  # the capture goes on; the table's snapshot fails
    _unharmed(db)
    finished = after.xcom["window"]["incremental_snapshot"]["finished"]["public.orders"]
    assert finished["status"] == "failed" and "not an accepted filter" in finished["error"]


def _messages(sink) -> list[dict]:
    table = read_topic_arrow(str(sink), "shop", "shop.message")
    return [] if table is None else table.to_pylist()
