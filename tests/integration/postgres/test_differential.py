"""Differential check of the decoder against PostgreSQL's built-in ``test_decoding`` plugin.

Two slots on one database (ours with pgoutput, one with test_decoding) see the same random DML
workloads; the changes we capture must agree one for one, in order, with what test_decoding
reports for the same transactions.
"""

from __future__ import annotations

import os
import re
from decimal import Decimal

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_cdc.cdc.sinks.reader import read_topic_arrow
from tests.support.scenario import Scenario

TABLES = ["public.keyed", "public.keyless"]
DDL = (
    "CREATE TABLE keyed (id int PRIMARY KEY, k int, v text, n numeric(10,2), flag boolean);"
    "CREATE TABLE keyless (a int, b text); ALTER TABLE keyless REPLICA IDENTITY FULL;"
)
COLUMNS = {"public.keyed": ["id", "k", "v", "n", "flag"], "public.keyless": ["a", "b"]}

texts = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=12)
keys = st.integers(1, 12)
operation = st.one_of(
    st.tuples(st.just("insert"), keys, st.integers(-5, 5), texts, st.decimals(-999, 999, places=2), st.booleans()),
    st.tuples(st.just("update"), keys, texts),
    st.tuples(st.just("rekey"), keys, keys),
    st.tuples(st.just("delete"), keys),
    st.tuples(st.just("insert_keyless"), st.integers(0, 3), texts),
    st.tuples(st.just("update_keyless"), st.integers(0, 3), texts),
    st.tuples(st.just("delete_keyless"), st.integers(0, 3)),
    st.tuples(st.just("truncate")),
)
workload = st.lists(st.lists(operation, min_size=1, max_size=6), min_size=1, max_size=8)


def run(conn, op) -> None:
    kind = op[0]
    if kind == "insert":
        conn.execute("INSERT INTO keyed VALUES (%s, %s, %s, %s, %s) ON CONFLICT (id) DO NOTHING", op[1:])
    elif kind == "update":
        conn.execute("UPDATE keyed SET v = %s, k = k + 1 WHERE id = %s", (op[2], op[1]))
    elif kind == "rekey":
        conn.execute(
            "UPDATE keyed SET id = %s WHERE id = %s AND NOT EXISTS (SELECT 1 FROM keyed WHERE id = %s)",
            (op[2] + 100, op[1], op[2] + 100),
        )
    elif kind == "delete":
        conn.execute("DELETE FROM keyed WHERE id = %s", (op[1],))
    elif kind == "insert_keyless":
        conn.execute("INSERT INTO keyless VALUES (%s, %s)", op[1:])
    elif kind == "update_keyless":
        conn.execute(
            "UPDATE keyless SET b = %s WHERE ctid = (SELECT min(ctid) FROM keyless WHERE a = %s)", (op[2], op[1])
        )
    elif kind == "delete_keyless":
        conn.execute("DELETE FROM keyless WHERE ctid = (SELECT min(ctid) FROM keyless WHERE a = %s)", (op[1],))
    else:
        conn.execute("TRUNCATE keyed, keyless")


_VALUE = re.compile(r"(\S+?)\[[^\]]+\]:('(?:[^']|'')*'|\S+)")


def parse_values(text: str) -> dict[str, str | None]:
    out = {}
    for name, raw in _VALUE.findall(text):
        if raw == "null":
            out[name] = None
        elif raw.startswith("'"):
            out[name] = raw[1:-1].replace("''", "'")
        else:
            out[name] = raw
    return out


def changes_from_test_decoding(lines: list[str]) -> list[tuple]:
    """test_decoding's lines → (op, table, values) in order (a key change → d then c)."""
    out: list[tuple] = []
    for line in lines:
        if not line.startswith("table "):
            continue
        head, _, rest = line.partition(": ")
        tables = [t.strip() for t in head[len("table ") :].split(",")]
        action, _, data = rest.partition(": ")
        action = action.rstrip(":")
        if action == "TRUNCATE":
            out += [("t", t, {}) for t in tables]
            continue
        (table,) = tables
        if action == "INSERT":
            out.append(("c", table, parse_values(data)))
        elif action == "DELETE":
            out.append(("d", table, parse_values(data)))
        elif action == "UPDATE":
            if data.startswith("old-key: "):
                old, _, new = data[len("old-key: ") :].partition(" new-tuple: ")
                if table == "public.keyed":
                    out.append(("d", table, parse_values(old)))
                    out.append(("c", table, parse_values(new)))
                else:
                    out.append(("u", table, parse_values(new)))
            else:
                out.append(("u", table, parse_values(data)))
    return out


def text_of(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Decimal):
        return format(value, "f")
    return str(value)


def our_changes(events: list[dict]) -> list[tuple]:
    out = []
    for e in events:
        table = f"{e['source']['schema']}.{e['source']['table']}"
        if e["op"] == "t":
            out.append(("t", table, {}))
            continue
        image = e["before"] if e["op"] == "d" else e["after"]
        values = {k: text_of(v) for k, v in image.items()}
        if e["op"] == "d" and table == "public.keyed":
            values = {"id": values["id"]}  # test_decoding prints the key of a DEFAULT-identity delete
        out.append((e["op"], table, values))
    return out


@settings(
    max_examples=int(os.environ.get("CDC_DIFFERENTIAL_EXAMPLES", "20")),
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
@given(transactions=workload)
def test_decoded_changes_agree_with_test_decoding(clusters, tmp_path_factory, transactions):
    from tests.support.databases import CaptureDatabase

    db = CaptureDatabase.create(clusters["pg15"], f"t_diff_{abs(hash(repr(transactions))) % 10**8}")
    try:
        db.execute(DDL)
        scenario = Scenario(db, TABLES, tmp_path_factory.mktemp("diff"))
        db.execute("SELECT pg_create_logical_replication_slot('td_' || current_database(), 'test_decoding')")
        with db.connect() as conn:
            for transaction in transactions:
                with conn.transaction():
                    for op in transaction:
                        run(conn, op)
        scenario.window()
        ours = []
        for table in TABLES:
            ours += scenario.events(table)
        ours.sort(key=lambda e: (e["source"]["commit_lsn"], e["transaction"]["total_order"]))
        with db.connect() as conn:
            lines = [
                row[0]
                for row in conn.execute(
                    "SELECT data FROM pg_logical_slot_peek_changes('td_' || current_database(), NULL, NULL,"
                    " 'skip-empty-xacts', '1')"
                )
            ]
        expected = changes_from_test_decoding(lines)
        assert our_changes(ours) == expected
        tx_rows = read_topic_arrow(str(scenario.sink), "t", "t.transaction")
        commits = sum(1 for line in lines if line.startswith("COMMIT"))
        assert (0 if tx_rows is None else tx_rows.num_rows // 2) == commits
    finally:
        db.drop()
