"""Least privilege on SQL Server (the stand-in): the example DAG as a login with exactly the grants
docs/sqlserver.md documents, and each required grant shown to be needed.

The grants are read from the docs' DBA block ("Setting up the server"), not restated here, and run
as T-SQL through the stand-in (``GRANT SELECT ON dbo.<table>``, ``GRANT SELECT ON SCHEMA::cdc``),
which translates them into PostgreSQL privileges (tests/support/sqlserver/translate.py, catalog.sql:
a schema-scope grant is membership of a role holding the permission on every object of the schema,
present and future, as SQL Server's schema permissions cover them). The login is
``create_login``'s (what any database user can read: the catalog views, INFORMATION_SCHEMA,
msdb.dbo.cdc_jobs and the cdc metadata tables) on a database whose PUBLIC privileges are revoked, so
that database access itself is the one explicit grant ``CREATE USER ... FOR LOGIN`` stands for. The
optional ``VIEW SERVER STATE`` is left out: the DAG must run without it.

What the stand-in cannot show (docs/sqlserver-standin.md, Permissions): db_owner and gating-role
semantics, the CDC procedures' own permission checks, and which catalog objects a real login
without the cdc grant can read.
"""

from __future__ import annotations

import importlib.util
import re
import secrets
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
from psycopg import sql as pgsql

from tests.support import airflow as af
from tests.support.oracle import assert_same_state, events_of, replay
from tests.support.sqlserver import workload
from tests.support.sqlserver.fixtures import DRIVER_IN_EXTRA_ALLOWED, airflow_connection

pytestmark = [pytest.mark.airflow, pytest.mark.spark]
ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs" / "sqlserver.md"
DOCS_LOGIN = "cdc_reader"
DOCS_TABLE = "dbo.orders"


def documented_block() -> list[tuple[str, str]]:
    """(statement, comment) of each line of the DBA's T-SQL block in docs/sqlserver.md."""
    text = DOCS.read_text(encoding="utf-8")
    section = text[text.index("## Setting up the server (the DBA's part)") :]
    match = re.search(r"```sql\n(.*?)\n```", section, re.DOTALL)
    assert match, f"no ```sql block in {DOCS}'s DBA section"
    lines = []
    for line in match.group(1).splitlines():
        statement, _, comment = line.partition("--")
        lines.append((statement.strip(), comment.strip()))
    return lines


def documented_grants(login: str, tables: list[str], *, database: str = "shop") -> tuple[list[str], list[str]]:
    """The docs' GRANT statements for ``login`` in ``database`` (the block's ``USE`` lines say which
    database a statement runs in): (required, optional). The docs grant on their one example table;
    that statement is made once per captured table."""
    required, optional = [], []
    current = None
    for statement, comment in documented_block():
        used = re.match(r"USE (\w+);$", statement)
        if used:
            current = used.group(1)
            continue
        if current != database or not statement.upper().startswith("GRANT"):
            continue
        assert re.search(rf"\bTO {DOCS_LOGIN};$", statement), statement
        statement = statement.replace(f"TO {DOCS_LOGIN};", f"TO {login};")
        grants = [statement.replace(DOCS_TABLE, t) for t in tables] if DOCS_TABLE in statement else [statement]
        (optional if comment.lower().startswith("optional") else required).extend(grants)
    return required, optional


def test_the_documented_grants_are_what_this_test_runs():
    """The docs' block is what the tests below grant: a database user, SELECT on each table and on the
    cdc schema (both required), VIEW SERVER STATE (optional)."""
    statements = [s for s, _ in documented_block()]
    assert f"CREATE USER {DOCS_LOGIN} FOR LOGIN {DOCS_LOGIN};" in statements
    required, optional = documented_grants("x", ["dbo.customers", "dbo.orders"])
    assert required == [
        "GRANT SELECT ON dbo.customers TO x;",
        "GRANT SELECT ON dbo.orders TO x;",
        "GRANT SELECT ON SCHEMA::cdc TO x;",
    ]
    assert optional == ["GRANT VIEW SERVER STATE TO x;"]
    # In msdb, for the retention health check: a database user and SELECT on the job table.
    assert "USE msdb;" in statements
    assert documented_grants("x", [], database="msdb") == (["GRANT SELECT ON dbo.cdc_jobs TO x;"], [])


def load_example_dag():
    path = ROOT / "dags" / "examples" / "sqlserver_cdc_hourly.py"
    spec = importlib.util.spec_from_file_location("sqlserver_cdc_hourly", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: Everything a role may do in the stand-in's database, read on the PostgreSQL side.
PRIVILEGES_SQL = """
SELECT 'table', n.nspname || '.' || c.relname, p
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
CROSS JOIN unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'REFERENCES', 'TRIGGER']) AS p
WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f') AND n.nspname NOT IN ('pg_catalog', 'information_schema')
  AND has_table_privilege(%(role)s, c.oid, p)
UNION ALL
SELECT 'schema', n.nspname, p FROM pg_namespace n CROSS JOIN unnest(ARRAY['USAGE', 'CREATE']) AS p
WHERE n.nspname NOT LIKE 'pg\\_%%' AND has_schema_privilege(%(role)s, n.oid, p)
UNION ALL
SELECT 'database', current_database(), p FROM unnest(ARRAY['CONNECT', 'CREATE', 'TEMPORARY']) AS p
WHERE has_database_privilege(%(role)s, current_database(), p)
UNION ALL
SELECT 'member of', r.rolname, '' FROM pg_roles r
WHERE r.rolname <> %(role)s AND pg_has_role(%(role)s, r.oid, 'MEMBER')
UNION ALL
SELECT 'attribute', a, '' FROM pg_roles r
CROSS JOIN unnest(ARRAY[CASE WHEN r.rolsuper THEN 'SUPERUSER' END, CASE WHEN r.rolcreatedb THEN 'CREATEDB' END,
                        CASE WHEN r.rolcreaterole THEN 'CREATEROLE' END,
                        CASE WHEN r.rolreplication THEN 'REPLICATION' END,
                        CASE WHEN r.rolbypassrls THEN 'BYPASSRLS' END]) AS a
WHERE r.rolname = %(role)s AND a IS NOT NULL
"""


def privileges(standin, role: str) -> set[tuple[str, str, str]]:
    return set(standin.admin_query(PRIVILEGES_SQL, {"role": role}))


class LeastPrivileged:
    """The shop on the stand-in, and a login with the documented required grants and nothing else."""

    def __init__(self, standin, monkeypatch, tmp_path):
        self.standin = standin
        self.tables = list(workload.TABLES)
        workload.create(standin, customers=6, orders_per_customer=2)
        self.login, self.password = f"lp_{standin.database}"[:63], "Pw-" + secrets.token_urlsafe(12)
        standin.create_login(self.login, self.password)
        # Database access only through the login's database user (CREATE USER ... FOR LOGIN): PUBLIC's
        # default privileges on the database (CONNECT, TEMPORARY) are taken away.
        database, login = pgsql.Identifier(standin.database), pgsql.Identifier(self.login)
        standin.admin_query(pgsql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(database))
        standin.admin_query(pgsql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(database, login))
        self.baseline = privileges(standin, self.login)
        self.required, self.optional = documented_grants(self.login, self.tables)
        for statement in self.required:  # T-SQL, through the stand-in's translation
            standin.execute_tsql(statement)
        # The docs' msdb grant: the stand-in has one database, so its msdb job table is granted by name.
        assert documented_grants(self.login, [], database="msdb")[0] == [
            f"GRANT SELECT ON dbo.cdc_jobs TO {self.login};"
        ]
        standin.grant_msdb_cdc_jobs(self.login)
        self.granted = privileges(standin, self.login)
        self.conn_id = f"lp_{standin.database}"
        monkeypatch.setenv(
            f"AIRFLOW_CONN_{self.conn_id.upper()}", connection(standin, login=self.login, password=self.password)
        )
        monkeypatch.setenv(*DRIVER_IN_EXTRA_ALLOWED)
        monkeypatch.setenv("CDC_EXAMPLE_SQLSERVER_CONN_ID", self.conn_id)
        self.lake, self.state = tmp_path / "lake", tmp_path / "state"
        monkeypatch.setenv("CDC_EXAMPLE_SINK_PATH", str(self.lake))
        monkeypatch.setenv("CDC_EXAMPLE_STATE_PATH", str(self.state))
        monkeypatch.setenv("CDC_EXAMPLE_SPARK_CONN_ID", "")

    def expected_grants(self) -> set[tuple[str, str, str]]:
        """What the required grants add to a bare login: SELECT on each captured table and on every
        table and view of schema cdc it could not read already (through the schema grant's role), and
        nothing else."""
        cdc = {
            ("table", f"cdc.{name}", "SELECT")
            for (name,) in self.standin.admin_query(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = 'cdc' AND c.relkind IN ('r', 'v')"
            )
        }
        holder = self.standin.admin_query("SELECT standin.schema_permission_role('cdc', 'SELECT')")[0][0]
        msdb = {("table", "standin.msdb_cdc_jobs", "SELECT")}
        return (
            {("table", t, "SELECT") for t in self.tables} | cdc | msdb | {("member of", holder, "")}
        ) - self.baseline


def connection(standin, **changes) -> str:
    import json

    return json.dumps({**json.loads(airflow_connection(standin)), **changes})


@pytest.fixture
def least(sqlserver, airflow_db, spark, monkeypatch, tmp_path):
    from airflow.models import Variable

    Variable.delete("cdc_offset__shop")
    yield LeastPrivileged(sqlserver, monkeypatch, tmp_path)
    Variable.delete("cdc_offset__shop")


def _interval_ends_at(dag, when: datetime) -> None:
    """dag.test() runs at fixed logical dates: the run's interval ends at ``when`` instead, every
    commit before it already captured by the capture job (so the sensor waits for nothing)."""
    dag.task_dict["interval_captured"].wait_until = None
    dag.task_dict["capture_window"].upto_time = when.isoformat()


def record_failures(dag) -> dict:
    """Each task's exception, and no retries: a failure shows at once, with its cause."""
    errors: dict = {}
    for task in dag.tasks:
        task.on_failure_callback = [af.failure_recorder(errors)]
        task.retries = 0
    return errors


def _ops(window: dict) -> dict[str, int]:
    return {op: sum(c.get(op, 0) for c in window["events"].values()) for op in "cud"}


def test_example_dag_runs_with_exactly_the_documented_grants(least):
    """Setup, snapshot, sensor, two windows, current state and the retention check, every task as the
    least-privileged login; the events reproduce the source; the login has nothing else."""
    standin = least.standin
    assert least.granted - least.baseline == least.expected_grants()
    assert least.baseline - least.granted == set()
    assert ("database", standin.database, "CONNECT") in least.baseline
    assert not any(kind == "attribute" for kind, _, _ in least.baseline)
    assert not any(p in ("INSERT", "UPDATE", "DELETE", "TRUNCATE") for kind, _, p in least.granted if kind == "table")

    dag = load_example_dag().dag
    errors = record_failures(dag)
    af.register(dag)
    standin.wait_until_captured()

    _interval_ends_at(dag, datetime.now(timezone.utc))
    first = af.run(dag, 0, errors=errors)  # the snapshot, and an empty window after it
    assert first.state == "success", errors
    assert set(first.tasks.values()) == {"success"}, first.tasks
    assert first.xcom["snapshot"]["events"] == {"shop.dbo.customers": {"r": 6}, "shop.dbo.orders": {"r": 12}}
    assert first.xcom["capture_window"]["changes"] == 0
    assert first.xcom["retention_health"]["healthy"] is True

    windows = []
    for hour in (1, 2):
        made = workload.mutate(standin, hour)
        standin.wait_until_captured()
        time.sleep(0.05)
        _interval_ends_at(dag, datetime.now(timezone.utc))
        result = af.run(dag, hour, errors=errors)
        assert result.state == "success", errors
        assert result.tasks["snapshot"] == "skipped"
        # The sensor keeps the default trigger rule, so the snapshot's skip skips it too in the example DAG.
        assert result.tasks["interval_captured"] == "success", result.tasks
        assert {t: result.tasks[t] for t in ("setup", "capture_window", "current_state", "retention_health")} == (
            dict.fromkeys(("setup", "capture_window", "current_state", "retention_health"), "success")
        ), result.tasks
        assert _ops(result.xcom["capture_window"]) == made
        windows.append(result)
    assert windows[0].xcom["capture_window"]["to_lsn"] == windows[1].xcom["capture_window"]["from_lsn"]

    for table, keys in workload.KEYS.items():
        assert_same_state(replay(events_of(least.lake, "shop", table), keys), workload.source_rows(standin, table))
    states = {r["topic"]: r["rows"] for r in windows[-1].xcom["current_state"]}
    assert states == {f"shop.{t}": len(workload.source_rows(standin, t)) for t in workload.TABLES}
    # Nothing was granted, created or owned on the way.
    assert privileges(standin, least.login) == least.granted
    owned = standin.admin_query("SELECT count(*) FROM pg_class WHERE relowner = %s::regrole", (least.login,))
    assert owned == [(0,)]


def test_each_documented_grant_is_needed(least):
    """Without SELECT on one table, or on the cdc schema, setup fails before anything is written, and
    the error names the GRANT that fixes it."""
    from airflow_provider_cdc.operators.setup import CdcSetupOperator

    standin, login = least.standin, least.login
    capture = load_example_dag().capture
    standin.wait_until_captured()
    cases = [  # (what is taken away, the documented grant, how it is revoked, what the error must name)
        (
            "SELECT on a table",
            f"GRANT SELECT ON dbo.orders TO {login};",
            f"REVOKE SELECT ON OBJECT::[dbo].[orders] FROM [{login}];",
            f"GRANT SELECT ON [dbo].[orders] TO [{login}];",
        ),
        (
            "SELECT on the cdc schema",
            f"GRANT SELECT ON SCHEMA::cdc TO {login};",
            f"REVOKE SELECT ON SCHEMA::cdc FROM {login};",
            f"GRANT SELECT ON SCHEMA::[cdc] TO [{login}];",
        ),
    ]
    for name, grant, revoke, expected in cases:
        assert grant in least.required, (name, least.required)
        standin.execute_tsql(revoke)
        assert privileges(standin, login) < least.granted, name
        with pytest.raises(Exception) as failure:
            CdcSetupOperator(task_id="setup", capture=capture).execute({})
        message = f"{type(failure.value).__name__}: {failure.value}"
        assert "missing permissions" in message and expected in message, (name, message)
        assert af.variable("cdc_offset__shop") is None, name
        assert not least.lake.exists() or not any(p.is_file() for p in least.lake.rglob("*")), name
        standin.execute_tsql(grant)
        assert privileges(standin, login) == least.granted, name
    # With every grant back, the same setup passes.
    result = CdcSetupOperator(task_id="setup", capture=capture).execute({})
    assert sorted(result["key_columns"]) == ["dbo.customers", "dbo.orders"], result


def test_view_server_state_is_recorded_and_gates_the_agent_view(sqlserver):
    """The optional grant translates, HAS_PERMS_BY_NAME reports it, and sys.dm_server_services needs
    it: error 300 without it, as on SQL Server (Learn, sys.dm_server_services, Permissions)."""
    import pyodbc

    login, password = f"vss_{sqlserver.database}"[:63], "Pw-" + secrets.token_urlsafe(12)
    sqlserver.create_login(login, password)
    (_, optional) = documented_grants(login, [])
    conn = pyodbc.connect(sqlserver.connection_string(user=login, password=password), autocommit=True)
    try:
        check = "SELECT HAS_PERMS_BY_NAME(NULL, NULL, 'VIEW SERVER STATE')"
        assert conn.execute(check).fetchone()[0] == 0
        agent = "SELECT status_desc FROM sys.dm_server_services WHERE servicename LIKE N'SQL Server Agent%'"
        with pytest.raises(pyodbc.Error, match=r"VIEW SERVER STATE permission was denied.*\(300\)"):
            conn.execute(agent).fetchall()
        for statement in optional:
            sqlserver.execute_tsql(statement)
        assert conn.execute(check).fetchone()[0] == 1
        assert conn.execute(agent).fetchone()[0] == "Running"
        sqlserver.execute_tsql(f"REVOKE VIEW SERVER STATE FROM [{login}];")
        assert conn.execute(check).fetchone()[0] == 0
    finally:
        conn.close()
