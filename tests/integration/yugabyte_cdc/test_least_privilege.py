"""Least privilege on YugabyteDB's CDC service (the stand-in): the example DAG as a YSQL role with
exactly the grants docs/yugabytedb.md documents for it, and each of them shown to be needed.

The capture's YSQL session only resolves the captured tables in the catalog, holds the capture lock
(an advisory lock) and reads the clock: the snapshot and the windows come over the RPC ports, which
know no YSQL users (access there is network reachability and TLS client certificates, not grants:
docs/yugabytedb.md). So the role gets no SELECT on the tables. The grants are read from the docs'
block (after the ``<!-- least-privilege-cdc-service:`` marker) and run on a database whose PUBLIC
privileges are revoked; the stand-in's YSQL side is the PostgreSQL database itself, so PostgreSQL
checks every privilege.
"""

from __future__ import annotations

import importlib.util
import json
import re
import secrets
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
from psycopg import sql

from tests.support import airflow as af
from tests.support import yb_workload as workload
from tests.support.oracle import assert_same_state, events_of, replay
from tests.support.yugabyte_cdc import airflow_connection, standin_for

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.pg]
ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs" / "yugabytedb.md"
MARKER = "<!-- least-privilege-cdc-service:"
DOCS_ROLE, DOCS_DATABASE = "cdc_reader", "shop"
HARDEN = ("REVOKE ALL ON DATABASE {db} FROM PUBLIC", "REVOKE ALL ON SCHEMA public FROM PUBLIC")


def documented_grants(docs: Path = DOCS) -> str:
    """The SQL block after the CDC-service least-privilege marker in docs/yugabytedb.md, as written."""
    text = docs.read_text(encoding="utf-8")
    assert text.count(MARKER) == 1, f"{docs} must mark exactly one CDC-service least-privilege block"
    match = re.match(r"[^\n]*\n```sql\n(.*?)\n```", text[text.index(MARKER) :], re.DOTALL)
    assert match, f"no ```sql block right after the {MARKER} marker in {docs}"
    return match.group(1) + "\n"


def for_database(block: str, role: str, database: str, password: str) -> str:
    """The docs' block for this stand-in: its role, database and password."""
    block, roles = re.subn(rf"\b{DOCS_ROLE}\b", role, block)
    block, databases = re.subn(rf"\bDATABASE {DOCS_DATABASE}\b", f'DATABASE "{database}"', block)
    assert roles >= 1 and databases >= 1, block
    return block.replace("'<password>'", sql.Literal(password).as_string(None))


def load_example_dag():
    path = ROOT / "dags" / "examples" / "yugabytedb_cdc_service_hourly.py"
    spec = importlib.util.spec_from_file_location("yugabytedb_cdc_service_hourly", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: Every table, schema and database privilege a role has (PUBLIC's included), and what it is.
PRIVILEGES_SQL = """
SELECT 'table', n.nspname || '.' || c.relname, p
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
CROSS JOIN unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'REFERENCES', 'TRIGGER']) AS p
WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f') AND n.nspname NOT IN ('pg_catalog', 'information_schema', 'yb_standin')
  AND has_table_privilege(%(role)s, c.oid, p)
UNION ALL
SELECT 'schema', n.nspname, p FROM pg_namespace n CROSS JOIN unnest(ARRAY['USAGE', 'CREATE']) AS p
WHERE n.nspname NOT LIKE 'pg\\_%%' AND n.nspname NOT IN ('information_schema', 'yb_standin')
  AND has_schema_privilege(%(role)s, n.oid, p)
UNION ALL
SELECT 'database', current_database(), p FROM unnest(ARRAY['CONNECT', 'CREATE', 'TEMPORARY']) AS p
WHERE has_database_privilege(%(role)s, current_database(), p)
UNION ALL
SELECT 'role', a, '' FROM pg_roles r
CROSS JOIN unnest(ARRAY[CASE WHEN r.rolsuper THEN 'SUPERUSER' END, CASE WHEN r.rolcreatedb THEN 'CREATEDB' END,
                        CASE WHEN r.rolcreaterole THEN 'CREATEROLE' END,
                        CASE WHEN r.rolreplication THEN 'REPLICATION' END,
                        CASE WHEN r.rolbypassrls THEN 'BYPASSRLS' END, CASE WHEN r.rolcanlogin THEN 'LOGIN' END,
                        CASE WHEN EXISTS (SELECT 1 FROM pg_auth_members m WHERE m.member = r.oid) THEN 'MEMBER' END,
                        CASE WHEN EXISTS (SELECT 1 FROM pg_class c WHERE c.relowner = r.oid) THEN 'OWNER' END]) AS a
WHERE r.rolname = %(role)s AND a IS NOT NULL
"""


def privileges(yb, role: str) -> set[tuple[str, str, str]]:
    with yb.connect() as conn:
        return set(conn.execute(PRIVILEGES_SQL, {"role": role}).fetchall())


@pytest.fixture
def yb(request, pg15):
    yield from standin_for(request, pg15, rpc_heartbeat_interval=0.3, snapshot_batch_size=4)


@pytest.fixture
def least(yb, airflow_db, spark, monkeypatch, tmp_path):
    """The shop and its stream; a hardened database; the docs' role; the example's settings."""
    from airflow.models import Variable

    workload.create(yb, customers=6, orders_per_customer=2)
    yb.wait_caught_up()
    stream = yb.create_stream("CHANGE", "EXPLICIT", tables=["customers", "orders"])
    role, password = f"lp_{yb.database}"[:63], "pw-" + secrets.token_hex(8)
    with yb.connect() as conn:
        for statement in HARDEN:
            conn.execute(sql.SQL(statement).format(db=sql.Identifier(yb.database)))
        conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))
        conn.execute(for_database(documented_grants(), role, yb.database, password))  # the simple query protocol
    conn_id = f"lp_{yb.database}"
    connection = {**json.loads(airflow_connection(yb)), "login": role, "password": password}
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(connection))
    monkeypatch.setenv("CDC_EXAMPLE_YUGABYTEDB_CONN_ID", conn_id)
    monkeypatch.setenv("CDC_EXAMPLE_STREAM_ID", stream)
    monkeypatch.setenv("CDC_EXAMPLE_SINK_PATH", str(tmp_path / "lake"))
    monkeypatch.setenv("CDC_EXAMPLE_STATE_PATH", str(tmp_path / "state"))
    monkeypatch.setenv("CDC_EXAMPLE_SPARK_CONN_ID", "")
    Variable.delete("cdc_offset__shop")
    yield {"yb": yb, "role": role, "lake": tmp_path / "lake", "granted": privileges(yb, role)}
    Variable.delete("cdc_offset__shop")
    with yb.connect() as conn:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def record_failures(dag) -> dict:
    """Each task's exception, and no retries: a failure shows at once, with its cause."""
    errors: dict = {}
    for task in dag.tasks:
        task.on_failure_callback = [af.failure_recorder(errors)]
        task.retries = 0
    return errors


def _interval_ends_at(dag, when: datetime) -> None:
    dag.task_dict["interval_committed"].wait_until = when.isoformat()
    dag.task_dict["capture_window"].upto_time = when.isoformat()


def _ops(window: dict) -> dict[str, int]:
    return {op: sum(c.get(op, 0) for c in window["events"].values()) for op in "cud"}


def test_documented_grants_are_ysql_access_only(least):
    """The documented role: LOGIN, CONNECT on the database and USAGE on the tables' schema; no
    privilege on any table (PUBLIC's revoked), nothing owned."""
    assert least["granted"] == {
        ("role", "LOGIN", ""),
        ("database", least["yb"].database, "CONNECT"),
        ("schema", "public", "USAGE"),
    }


def test_example_dag_runs_with_exactly_the_documented_grants(least):
    """Setup, snapshot, sensor, two windows, current state and the stream check as the least-privileged
    role; the events reproduce the source; the role gained nothing."""
    yb = least["yb"]
    dag = load_example_dag().dag
    errors = record_failures(dag)
    af.register(dag)

    _interval_ends_at(dag, datetime.now(timezone.utc))
    first = af.run(dag, 0, errors=errors)  # the stream's snapshot, and an empty window after it
    assert first.state == "success", errors
    assert set(first.tasks.values()) == {"success"}, first.tasks
    assert first.xcom["snapshot"]["events"] == {"shop.public.customers": {"r": 6}, "shop.public.orders": {"r": 12}}
    assert first.xcom["stream_health"]["healthy"] is True

    windows = []
    for hour in (1, 2):
        made = workload.mutate(yb, hour)
        yb.wait_caught_up()
        time.sleep(0.2)
        _interval_ends_at(dag, datetime.now(timezone.utc))
        result = af.run(dag, hour, errors=errors)
        assert result.state == "success", errors
        assert result.tasks["snapshot"] == "skipped"
        # The sensor keeps the default trigger rule, so the snapshot's skip skips it too in the example DAG.
        assert result.tasks["interval_committed"] == "success", result.tasks
        assert {t: result.tasks[t] for t in ("setup", "capture_window", "current_state", "stream_health")} == (
            dict.fromkeys(("setup", "capture_window", "current_state", "stream_health"), "success")
        ), result.tasks
        assert _ops(result.xcom["capture_window"]) == made
        windows.append(result.xcom)
    for table, keys in workload.KEYS.items():
        assert_same_state(replay(events_of(least["lake"], "shop", table), keys), workload.source_rows(yb, table))
    states = {r["topic"]: r["rows"] for r in windows[-1]["current_state"]}
    assert states == {f"shop.{t}": len(workload.source_rows(yb, t)) for t in workload.TABLES}
    assert privileges(yb, least["role"]) == least["granted"]


@pytest.mark.parametrize(
    ("take", "give_back", "expected"),
    [
        pytest.param(
            "REVOKE CONNECT ON DATABASE {db} FROM {role}", "GRANT CONNECT ON DATABASE {db} TO {role}",
            'GRANT CONNECT ON DATABASE "{db}" TO "{role}"', id="connect",
        ),
        pytest.param(
            "REVOKE USAGE ON SCHEMA public FROM {role}", "GRANT USAGE ON SCHEMA public TO {role}",
            "permission denied for schema public", id="schema-usage",
        ),
    ],
)  # fmt: skip
def test_each_documented_grant_is_needed(least, take, give_back, expected):
    """Without CONNECT, or USAGE on the tables' schema, setup fails naming what is missing."""
    from airflow_provider_cdc.operators.setup import CdcSetupOperator

    yb, role = least["yb"], least["role"]
    capture = load_example_dag().capture
    names = {"db": sql.Identifier(yb.database), "role": sql.Identifier(role)}
    with yb.connect() as conn:
        conn.execute(sql.SQL(take).format(**names))
    with pytest.raises(Exception) as failure:
        CdcSetupOperator(task_id="setup", capture=capture).execute({})
    message = f"{type(failure.value).__name__}: {failure.value}"
    assert expected.format(db=yb.database, role=role) in message, message
    with yb.connect() as conn:
        conn.execute(sql.SQL(give_back).format(**names))
    assert privileges(yb, role) == least["granted"]
