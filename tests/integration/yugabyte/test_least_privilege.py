"""Least privilege on YugabyteDB logical replication (the stand-in): the example DAG as a role with
exactly the grants docs/yugabytedb.md documents, and each of them shown to be needed.

The administrator's part and the role's grants are read from the docs (the block after the
``<!-- least-privilege:`` marker, and the read-time procedure's block through
tests/support/yugabyte/read_time_procedure.py), on a database whose PUBLIC privileges are revoked,
so every privilege the capture uses is one the docs grant. The role is created with nothing but
``LOGIN REPLICATION``. The stand-in checks the read-time procedure's privileges where YugabyteDB
would (its proxy answers the ``CALL`` with the slot's snapshot instead of running the body:
docs/yugabytedb-standin.md); PostgreSQL checks everything else itself, the REPLICATION attribute
included (a replication connection is refused without it).
"""

from __future__ import annotations

import importlib.util
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
from tests.support.yugabyte.fixtures import airflow_connection, standin_for
from tests.support.yugabyte.read_time_procedure import DOCS, documented, with_role

pytestmark = [pytest.mark.airflow, pytest.mark.spark]
ROOT = Path(__file__).resolve().parents[3]
MARKER = "<!-- least-privilege:"
LOCK_TABLE_MARKER = "<!-- least-privilege-lock-table:"
DOCS_DATABASE = "shop"
HARDEN = ("REVOKE ALL ON DATABASE {db} FROM PUBLIC", "REVOKE ALL ON SCHEMA public FROM PUBLIC")


def documented_grants(marker: str = MARKER, docs: Path = DOCS) -> str:
    """The SQL block after ``marker`` in docs/yugabytedb.md, exactly as written."""
    text = docs.read_text(encoding="utf-8")
    assert text.count(marker) == 1, f"{docs} must mark exactly one {marker} block"
    match = re.match(r"[^\n]*\n```sql\n(.*?)\n```", text[text.index(marker) :], re.DOTALL)
    assert match, f"no ```sql block right after the {marker} marker in {docs}"
    return match.group(1) + "\n"


def for_database(block: str, role: str, database: str, password: str) -> str:
    """The docs' block for this stand-in: its role, database and password."""
    block = with_role(block, role)
    block = re.sub(rf"\bDATABASE {DOCS_DATABASE}\b", f'DATABASE "{database}"', block)
    return block.replace("'<password>'", sql.Literal(password).as_string(None))


def load_example_dag():
    path = ROOT / "dags" / "examples" / "yugabytedb_cdc_hourly.py"
    spec = importlib.util.spec_from_file_location("yugabytedb_cdc_hourly", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _interval_ends_at(dag, when: datetime) -> None:
    dag.task_dict["interval_committed"].wait_until = when.isoformat()
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


ROLE_FACTS_SQL = """
SELECT r.rolsuper, r.rolcreatedb, r.rolcreaterole, r.rolbypassrls, r.rolreplication, r.rolcanlogin,
       (SELECT count(*) FROM pg_auth_members m WHERE m.member = r.oid),
       (SELECT count(*) FROM pg_class c WHERE c.relowner = r.oid),
       (SELECT count(*) FROM pg_namespace n WHERE n.nspowner = r.oid),
       (SELECT count(*) FROM pg_proc p WHERE p.proowner = r.oid)
FROM pg_roles r WHERE r.rolname = %s
"""
#: Every table, schema and database privilege a role has (PUBLIC's included), read by the superuser.
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
SELECT 'procedure', p.oid::regprocedure::text, 'EXECUTE' FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'yb_standin') AND p.prokind = 'p'
  AND has_function_privilege(%(role)s, p.oid, 'EXECUTE')
"""


class LeastPrivileged:
    """The shop on the stand-in, hardened, with the docs' administrator part and role."""

    def __init__(self, standin, monkeypatch, tmp_path, *, lock_table: bool = False):
        self.standin = standin
        workload.create(standin, customers=6, orders_per_customer=2)
        self.role, self.password = f"lp_{standin.database}"[:63], "pw-" + secrets.token_hex(8)
        blocks = [documented_grants(), documented()] + ([documented_grants(LOCK_TABLE_MARKER)] if lock_table else [])
        with standin.connect() as conn:
            for statement in HARDEN:
                conn.execute(sql.SQL(statement).format(db=sql.Identifier(standin.database)))
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(self.role)))
            for block in blocks:  # several statements each: the simple query protocol
                conn.execute(for_database(block, self.role, standin.database, self.password))
        self.conn_id = f"lp_{standin.database}"
        connection = {**_json(airflow_connection(standin)), "login": self.role, "password": self.password}
        monkeypatch.setenv(f"AIRFLOW_CONN_{self.conn_id.upper()}", _dumps(connection))
        monkeypatch.setenv("CDC_EXAMPLE_YUGABYTEDB_CONN_ID", self.conn_id)
        self.lake, self.state = tmp_path / "lake", tmp_path / "state"
        monkeypatch.setenv("CDC_EXAMPLE_SINK_PATH", str(self.lake))
        monkeypatch.setenv("CDC_EXAMPLE_STATE_PATH", str(self.state))
        monkeypatch.setenv("CDC_EXAMPLE_SPARK_CONN_ID", "")
        self.granted = self.privileges()

    def privileges(self) -> set[tuple[str, str, str]]:
        return set(self.standin.admin_query(PRIVILEGES_SQL, {"role": self.role}))

    def facts(self) -> tuple:
        return self.standin.admin_query(ROLE_FACTS_SQL, (self.role,))[0]

    def example(self):
        """The example DAG's module, its capture given the docs' read-time procedure (the one
        setting a role that is not a superuser needs)."""
        module = load_example_dag()
        module.capture.read_time_procedure = "cdc.set_yb_read_time"
        return module


def _json(text: str) -> dict:
    import json

    return json.loads(text)


def _dumps(value: dict) -> str:
    import json

    return json.dumps(value)


def _least(standin, monkeypatch, tmp_path, **options):
    from airflow.models import Variable

    Variable.delete("cdc_offset__shop")
    setup = LeastPrivileged(standin, monkeypatch, tmp_path, **options)
    yield setup
    Variable.delete("cdc_offset__shop")
    with standin.connect() as conn:  # the role owns nothing: dropping it is all
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(setup.role)))
        conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(setup.role)))


@pytest.fixture
def least(yugabyte, airflow_db, spark, monkeypatch, tmp_path):
    yield from _least(yugabyte, monkeypatch, tmp_path)


@pytest.fixture
def least_without_advisory_locks(request, pg15, airflow_db, monkeypatch, tmp_path):
    """The same on a stand-in of a release before v2025.1 (no advisory locks), with the lock table."""
    for standin in standin_for(request, pg15, active_window_ms=1000, advisory_locks=False):
        yield from _least(standin, monkeypatch, tmp_path, lock_table=True)


def test_example_dag_runs_with_exactly_the_documented_grants(least):
    """Setup, snapshot (through the read-time procedure), sensor, two windows, current state and the
    slot check as the least-privileged role; the events reproduce the source; it gained nothing."""
    standin = least.standin
    # LOGIN REPLICATION, no other attribute, no membership, owns nothing; exactly the documented grants
    assert least.facts() == (False, False, False, False, True, True, 0, 0, 0, 0)
    heartbeat = "public.airflow_cdc_heartbeat"
    assert least.granted == {
        ("database", standin.database, "CONNECT"),
        ("schema", "public", "USAGE"),
        ("schema", "cdc", "USAGE"),
        ("table", "public.customers", "SELECT"),
        ("table", "public.orders", "SELECT"),
        *(("table", heartbeat, p) for p in ("SELECT", "INSERT", "UPDATE")),
        ("procedure", "cdc.set_yb_read_time(text)", "EXECUTE"),
    }
    example = least.example()
    dag = example.dag
    errors = record_failures(dag)
    af.register(dag)

    _interval_ends_at(dag, datetime.now(timezone.utc))
    first = af.run(dag, 0, errors=errors)  # the snapshot, and an empty window after it
    assert first.state == "success", errors
    assert set(first.tasks.values()) == {"success"}, first.tasks
    assert first.xcom["setup"]["publication_action"] == "verified"
    assert first.xcom["snapshot"]["events"] == {"shop.public.customers": {"r": 6}, "shop.public.orders": {"r": 12}}
    assert first.xcom["capture_window"]["changes"] == 0
    assert first.xcom["slot_health"]["healthy"] is True

    windows = []
    for hour in (1, 2):
        made = workload.mutate(standin, hour)
        time.sleep(0.2)
        _interval_ends_at(dag, datetime.now(timezone.utc))
        result = af.run(dag, hour, errors=errors)
        assert result.state == "success", errors
        assert result.tasks["snapshot"] == "skipped"
        # The sensor keeps the default trigger rule, so the snapshot's skip skips it too in the example DAG.
        assert result.tasks["interval_committed"] == "success", result.tasks
        assert {t: result.tasks[t] for t in ("setup", "capture_window", "current_state", "slot_health")} == (
            dict.fromkeys(("setup", "capture_window", "current_state", "slot_health"), "success")
        ), result.tasks
        assert _ops(result.xcom["capture_window"]) == made
        windows.append(result.xcom)
    assert windows[0]["capture_window"]["to_lsn"] == windows[1]["capture_window"]["from_lsn"]
    for table, keys in workload.KEYS.items():
        assert_same_state(replay(events_of(least.lake, "shop", table), keys), workload.source_rows(standin, table))
    states = {r["topic"]: r["rows"] for r in windows[-1]["current_state"]}
    assert states == {f"shop.{t}": len(workload.source_rows(standin, t)) for t in workload.TABLES}
    assert least.facts() == (False, False, False, False, True, True, 0, 0, 0, 0)
    assert least.privileges() == least.granted


#: (what is taken away, statements that take it, statements that give it back, the task that fails,
#: what its error must say). ``{role}``, ``{db}``: the role and the database.
SETUP_CASES = [
    (
        "REPLICATION",
        ["ALTER ROLE {role} NOREPLICATION"],
        ["ALTER ROLE {role} REPLICATION"],
        "setup",
        "must be superuser or replication role to start walsender. The role needs the REPLICATION attribute",
    ),
    (
        "CONNECT on the database",
        ["REVOKE CONNECT ON DATABASE {db} FROM {role}"],
        ["GRANT CONNECT ON DATABASE {db} TO {role}"],
        "setup",
        'Run: GRANT CONNECT ON DATABASE "{db}" TO "{role}"',
    ),
    (
        "USAGE on schema public",
        ["REVOKE USAGE ON SCHEMA public FROM {role}"],
        ["GRANT USAGE ON SCHEMA public TO {role}"],
        "setup",
        'GRANT USAGE ON SCHEMA "public" TO "{role}"',
    ),
    (
        "SELECT on a table",
        ["REVOKE SELECT ON public.orders FROM {role}"],
        ["GRANT SELECT ON public.orders TO {role}"],
        "setup",
        'GRANT SELECT ON "public"."orders" TO "{role}"',
    ),
    (
        "the heartbeat table in the publication",
        ["ALTER PUBLICATION cdc_shop DROP TABLE public.airflow_cdc_heartbeat"],
        ["ALTER PUBLICATION cdc_shop ADD TABLE public.airflow_cdc_heartbeat"],
        "setup",
        'have an administrator run: ALTER PUBLICATION "cdc_shop" ADD TABLE "public"."airflow_cdc_heartbeat"',
    ),
]
SNAPSHOT_CASES = [
    (
        "EXECUTE on the read-time procedure",
        ["REVOKE EXECUTE ON PROCEDURE cdc.set_yb_read_time(text) FROM {role}"],
        ["GRANT EXECUTE ON PROCEDURE cdc.set_yb_read_time(text) TO {role}"],
        "snapshot",
        "permission denied for procedure set_yb_read_time",
    ),
    (
        "USAGE on schema cdc",
        ["REVOKE USAGE ON SCHEMA cdc FROM {role}"],
        ["GRANT USAGE ON SCHEMA cdc TO {role}"],
        "snapshot",
        "permission denied for schema cdc",
    ),
    (  # not a grant: the procedure must run as a superuser, the only role that may set yb_read_time
        "a superuser owning the read-time procedure",
        ["ALTER PROCEDURE cdc.set_yb_read_time(text) OWNER TO {role}"],
        [  # (the owner's ACL entries move with the ownership: the role's EXECUTE goes with it)
            "ALTER PROCEDURE cdc.set_yb_read_time(text) OWNER TO CURRENT_USER",
            "GRANT EXECUTE ON PROCEDURE cdc.set_yb_read_time(text) TO {role}",
        ],
        "snapshot",
        'permission denied to set parameter "yb_read_time"',
    ),
]
#: The fence row's privileges, which only a window uses (after a snapshot).
WINDOW_CASES = [
    (
        f"{privilege} on the heartbeat table", [f"REVOKE {privilege} ON public.airflow_cdc_heartbeat FROM {{role}}"],
        [f"GRANT {privilege} ON public.airflow_cdc_heartbeat TO {{role}}"], "capture_window",
        'GRANT SELECT, INSERT, UPDATE ON "public"."airflow_cdc_heartbeat" to the capture role',
    )
    for privilege in ("INSERT", "UPDATE", "SELECT")
]  # fmt: skip


def _alter(least, statements) -> None:
    names = {"role": sql.Identifier(least.role), "db": sql.Identifier(least.standin.database)}
    with least.standin.connect() as conn:
        for statement in statements:
            conn.execute(sql.SQL(statement).format(**names))


def _check(least, case, failed: str | None, message: str) -> None:
    name, _take, _give_back, failing, expected = case
    assert failed == failing, (name, failed, message)
    assert expected.format(role=least.role, db=least.standin.database) in message, (name, message)


def test_each_documented_grant_is_needed(least):
    """Without any one of the documented grants (or the heartbeat table in the publication) a task of
    the example fails, its error naming what is missing; with all of them back, it runs."""
    from airflow_provider_cdc.operators.setup import CdcSetupOperator

    example = least.example()
    # Setup's checks come first (a bare execute: it fails before it reads the offset's Variable).
    for case in SETUP_CASES:
        _alter(least, case[1])
        try:
            CdcSetupOperator(task_id="setup", capture=example.capture).execute({})
            failed, message = None, ""
        except Exception as exc:
            failed, message = "setup", f"{type(exc).__name__}: {exc}"
        finally:
            _alter(least, case[2])
        _check(least, case, failed, message)
    # The snapshot's and the window's, through the example DAG.
    dag = example.dag
    errors = record_failures(dag)
    af.register(dag)
    runs = iter(range(100))

    def run(case=None) -> af.DagResult:
        errors.clear()
        if case is not None:
            _alter(least, case[1])
        try:
            _interval_ends_at(dag, datetime.now(timezone.utc))
            return af.run(dag, next(runs), errors=errors)
        finally:
            if case is not None:
                _alter(least, case[2])

    for case in SNAPSHOT_CASES:
        result = run(case)
        failed = next((t for t, state in result.tasks.items() if state == "failed"), None)
        _check(least, case, failed, f"{type(errors[failed]).__name__}: {errors[failed]}" if failed else "")
    assert run().state == "success", errors  # the snapshot, with every grant back
    for case in WINDOW_CASES:
        result = run(case)
        failed = next((t for t, state in result.tasks.items() if state == "failed"), None)
        _check(least, case, failed, f"{type(errors[failed]).__name__}: {errors[failed]}" if failed else "")
    final = run()
    assert final.state == "success", errors
    assert final.tasks["snapshot"] == "skipped"
    assert least.privileges() == least.granted


def test_lock_table_grants_before_v2025_1(least_without_advisory_locks):
    """Without advisory locks the capture lock is a row lock in the administrator's lock table: the
    documented grants take it (a second run is refused), and without SELECT, INSERT or UPDATE on the
    table the run cannot start. Setup, which takes no lock, is not affected."""
    import logging

    from airflow_provider_cdc.cdc.basics.errors import ConcurrentCaptureError

    least = least_without_advisory_locks
    capture = least.example().capture
    log = logging.getLogger("test")
    with capture.open_run(log):
        with pytest.raises(ConcurrentCaptureError, match="airflow_cdc_locks"), capture.open_run(log):
            pass
    for privilege in ("SELECT", "INSERT", "UPDATE"):
        _alter(least, [f"REVOKE {privilege} ON public.airflow_cdc_locks FROM {{role}}"])
        try:
            with pytest.raises(Exception, match="permission denied for table airflow_cdc_locks"), capture.open_run(log):
                pass
        finally:
            _alter(least, [f"GRANT {privilege} ON public.airflow_cdc_locks TO {{role}}"])
    with capture.open_run(log):
        pass
    assert least.privileges() == least.granted
