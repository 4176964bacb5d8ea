"""Security under real Airflow (dag.test), real PostgreSQL, real Spark.

Least privilege: a role with nothing but ``LOGIN REPLICATION`` and the grants below runs the
whole DAG, in the two documented setups, with both offset stores, on a database whose default
PUBLIC privileges are revoked (so every grant the capture relies on is explicit). Taking away
any one of the grants fails the run before anything is created or written, naming the statement
to run.

Credentials: a distinctive password never shows up in logs, XComs, errors, offsets, the sink,
job spec files, command lines or temporary files.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import stat
import subprocess
import tempfile
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import quote, quote_plus

import pyarrow.parquet as pq
import pytest
from psycopg import sql

from airflow_provider_cdc.cdc.basics.window import Window
from airflow_provider_cdc.cdc.sources.postgres.lsn import Lsn
from airflow_provider_cdc.cdc.sources.postgres.spec import PostgresJobSpec
from airflow_provider_cdc.cdc.sources.postgres.tables import TableRef
from airflow_provider_cdc.testing import shop
from tests.integration.test_operators import assert_reproduces_source, capture_dag, make_capture
from tests.support import airflow as af

pytestmark = [pytest.mark.airflow, pytest.mark.spark]

CAPTURED = sql.SQL(", ").join(sql.Identifier("public", t.split(".")[1]) for t in shop.TABLES)
OFFSETS_DDL = (
    "CREATE TABLE cdc_state.offsets (capture text PRIMARY KEY, revision bigint NOT NULL, "
    "document jsonb NOT NULL, updated_at timestamptz NOT NULL DEFAULT now())"
)

#: Run by an administrator (a superuser, or the database and table owner). The capture role is
#: created with nothing but ``LOGIN REPLICATION PASSWORD ...``.
HARDEN = ("REVOKE ALL ON DATABASE {db} FROM PUBLIC", "REVOKE ALL ON SCHEMA public FROM PUBLIC")
COMMON = ("GRANT CONNECT ON DATABASE {db} TO {role}", "GRANT USAGE ON SCHEMA public TO {role}")
#: (a) the role owns the captured tables; setup creates the publication itself.
OWNER = (
    "GRANT CREATE ON DATABASE {db} TO {role}",
    *(f"ALTER TABLE {t} OWNER TO {{role}}" for t in shop.TABLES),
)
#: (b) an administrator creates the publication; the role only reads the tables.
ADMIN_PUBLICATION = ("CREATE PUBLICATION {pub} FOR TABLE {captured}", "GRANT SELECT ON {captured} TO {role}")
#: state-table offset store: the role creates the table in a schema it may create in ...
STATE_TABLE_BY_ROLE = ("CREATE SCHEMA cdc_state", "GRANT USAGE, CREATE ON SCHEMA cdc_state TO {role}")
#: ... or an administrator creates it and grants what the store does with it.
STATE_TABLE_BY_ADMIN = (
    "CREATE SCHEMA cdc_state",
    OFFSETS_DDL,
    "GRANT USAGE ON SCHEMA cdc_state TO {role}",
    "GRANT SELECT, INSERT, UPDATE ON cdc_state.offsets TO {role}",
)


def run_sql(db, statements, role: str, **names) -> None:
    identifiers = {
        "db": sql.Identifier(db.name),
        "role": sql.Identifier(role),
        "pub": sql.Identifier(db.publication),
        "captured": CAPTURED,
        **{k: sql.Identifier(v) for k, v in names.items()},
    }
    with db.connect() as conn:
        for statement in statements:
            conn.execute(sql.SQL(statement).format(**identifiers))


def create_role(db, password: str) -> str:
    """``LOGIN REPLICATION`` and nothing else. The password reaches the server already hashed
    (libpq's PQencryptPasswordConn), so not even the server log or WAL could hold it."""
    role = f"cdc_{db.name}"[:63]
    with db.connect() as conn:
        verifier = conn.pgconn.encrypt_password(password.encode(), role.encode(), b"scram-sha-256").decode()
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN REPLICATION PASSWORD {}").format(sql.Identifier(role), sql.Literal(verifier))
        )
    db.created_roles.append(role)
    return role


def shop_as_role(db, monkeypatch, password: str, *, grants) -> tuple[str, str]:
    """The shop tables (owned by the administrator), a hardened database, a least-privileged
    role with ``grants``, and an Airflow connection (env var) that logs in as that role."""
    with db.connect() as conn:
        shop.create_schema(conn)
        shop.seed(conn, customers=12, orders_per_customer=2)
    role = create_role(db, password)
    run_sql(db, [*HARDEN, *COMMON, *grants], role)
    conn_id = f"lp_{db.name}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", db.cluster.airflow_uri(db.name, user=role, password=password))
    return role, conn_id


def assert_role_has_nothing_else(db, role: str) -> None:
    with db.connect() as conn:
        attributes = conn.execute(
            "SELECT rolsuper, rolcreatedb, rolcreaterole, rolbypassrls, rolinherit, rolreplication, rolcanlogin, "
            "(SELECT count(*) FROM pg_auth_members m WHERE m.member = r.oid) FROM pg_roles r WHERE rolname = %s",
            (role,),
        ).fetchone()
    assert attributes == (False, False, False, False, True, True, True, 0)


SETUPS = {
    # (grants, publication_autocreate_mode, expected publication action)
    "role_owns_tables": (OWNER, "filtered", "created"),
    # the default path: the default mode finds the administrator's publication complete
    "admin_publication": (ADMIN_PUBLICATION, "filtered", "verified"),
}


@contextmanager
def no_physical_replication(db, role: str):
    """pg_hba.conf with the role's ``replication`` lines set to ``reject``: logical replication
    connections match the database column, so the capture needs none (docs/reliability.md)."""
    hba = db.cluster.data_dir / "pg_hba.conf"
    original = hba.read_text()
    hba.write_text(f"local replication {role} reject\nhost replication {role} 127.0.0.1/32 reject\n" + original)
    db.execute("SELECT pg_reload_conf()")
    try:
        yield
    finally:
        hba.write_text(original)
        db.execute("SELECT pg_reload_conf()")


def assert_no_base_backup(db, role: str, password: str, target: Path) -> None:
    """The role cannot take a physical copy of the cluster (every database) with pg_basebackup."""
    result = subprocess.run(
        [str(db.cluster.bin_dir / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(db.cluster.port), "-U", role,
         "-D", str(target), "-X", "none", "-w"],
        env={**os.environ, "PGPASSWORD": password}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode != 0, "pg_basebackup as the capture role succeeded"
    assert "pg_hba.conf rejects replication connection" in result.stderr, result.stderr


@pytest.mark.parametrize(
    "setup, store",
    [
        ("role_owns_tables", "variable"),
        ("role_owns_tables", "state_table"),  # the role creates the state table
        ("admin_publication", "variable"),
        # admin_publication with a state table an administrator made: test_credentials_never_appear_anywhere
    ],
)
def test_least_privilege_role_runs_the_whole_dag(db15, airflow_db, spark, tmp_path, monkeypatch, setup, store):
    db = db15
    grants, mode, action = SETUPS[setup]
    state_grants = STATE_TABLE_BY_ROLE if store == "state_table" else ()
    password = "pw-" + secrets.token_hex(8)
    role, conn_id = shop_as_role(db, monkeypatch, password, grants=[*grants, *state_grants])
    overrides = {"publication_autocreate_mode": mode}
    if store == "state_table":
        overrides.update(offset_store="state_table", offset_table="cdc_state.offsets")
    errors: dict = {}
    sink = tmp_path / "lake"
    dag = capture_dag(f"lp_{db.name}", make_capture(db, conn_id, sink, **overrides), errors)

    with no_physical_replication(db, role):
        first = af.run(dag, 0, errors=errors)
        assert first.tasks == {"setup": "success", "snapshot": "success", "window": "success"}, errors
        assert first.xcom["setup"]["publication_action"] == action
        with db.connect() as conn:
            shop.mutate(conn, round_no=1)
        second = af.run(dag, 1, errors=errors)
        assert second.tasks == {"setup": "success", "snapshot": "skipped", "window": "success"}, errors
        assert second.xcom["window"]["transactions"] > 0
        assert_no_base_backup(db, role, password, tmp_path / "basebackup")
    assert_reproduces_source(db, sink)

    with db.connect() as conn:
        owner = conn.execute("SELECT pubowner::regrole::text FROM pg_publication").fetchone()[0]
        assert owner.strip('"') == (role if setup == "role_owns_tables" else db.cluster.superuser)
        if store == "state_table":
            table_owner, revision = conn.execute(
                "SELECT tableowner, (SELECT revision FROM cdc_state.offsets) FROM pg_tables "
                "WHERE schemaname = 'cdc_state'"
            ).fetchone()
            assert table_owner == role
            assert revision == 6  # snapshot and two windows: pending + committed each
    assert_role_has_nothing_else(db, role)


@dataclass(frozen=True)
class MissingGrant:
    name: str
    take: tuple[str, ...]  # statements that take one grant away (from setup (a) + state schema)
    give_back: tuple[str, ...]
    expected: str  # the statement the error must name
    settings: tuple[tuple[str, str], ...] = ()  # capture settings of the case


MISSING_GRANTS = [
    MissingGrant(
        "replication", ("ALTER ROLE {role} NOREPLICATION",), ("ALTER ROLE {role} REPLICATION",),
        'ALTER ROLE "{role}" REPLICATION',
    ),
    MissingGrant(
        "connect", ("REVOKE CONNECT ON DATABASE {db} FROM {role}",), ("GRANT CONNECT ON DATABASE {db} TO {role}",),
        'GRANT CONNECT ON DATABASE "{db}" TO "{role}"',
    ),
    MissingGrant(
        "schema usage", ("REVOKE USAGE ON SCHEMA public FROM {role}",), ("GRANT USAGE ON SCHEMA public TO {role}",),
        'GRANT USAGE ON SCHEMA "public" TO "{role}"',
    ),
    MissingGrant(
        "create on the database", ("REVOKE CREATE ON DATABASE {db} FROM {role}",),
        ("GRANT CREATE ON DATABASE {db} TO {role}",), 'GRANT CREATE ON DATABASE "{db}" TO "{role}"',
    ),
    MissingGrant(  # setup (b): the publication exists, the role does not own a table and cannot read it
        "select", ("ALTER TABLE public.orders OWNER TO {admin}", "CREATE PUBLICATION {case_pub} FOR TABLE {captured}"),
        (), 'GRANT SELECT ON "public"."orders" TO "{role}"', (("publication_autocreate_mode", "disabled"),),
    ),
    MissingGrant(  # setup (a) with a table the role can read but does not own
        "table ownership", ("GRANT SELECT ON public.orders TO {role}",), ("ALTER TABLE public.orders OWNER TO {role}",),
        'ALTER TABLE "public"."orders" OWNER TO "{role}"',
    ),
    MissingGrant(
        "create on the state schema", ("REVOKE CREATE ON SCHEMA cdc_state FROM {role}",),
        ("GRANT CREATE ON SCHEMA cdc_state TO {role}",), 'GRANT CREATE ON SCHEMA "cdc_state" TO "{role}"',
        (("offset_store", "state_table"), ("offset_table", "cdc_state.offsets")),
    ),
    MissingGrant(
        "update on a state table made by an administrator",
        (OFFSETS_DDL.replace("offsets", "made"), "GRANT SELECT, INSERT ON cdc_state.made TO {role}"), (),
        'GRANT UPDATE ON "cdc_state"."made" TO "{role}"',
        (("offset_store", "state_table"), ("offset_table", "cdc_state.made")),
    ),
]  # fmt: skip


def run_until_failure(capture) -> tuple[str | None, str]:
    """The setup, then the snapshot task's code (outside a DAG: much faster) until one fails."""
    from airflow_provider_cdc.operators.setup import CdcSetupOperator
    from airflow_provider_cdc.operators.snapshot import CdcSnapshotOperator

    for task_id, operator in (("setup", CdcSetupOperator), ("snapshot", CdcSnapshotOperator)):
        try:
            operator(task_id=task_id, capture=capture).execute({})
        except Exception as exc:
            return task_id, f"{type(exc).__name__}: {exc}"
    return None, ""


def test_each_missing_grant_fails_naming_the_statement_to_run(db, airflow_db, tmp_path, monkeypatch):
    """Every grant of the least-privilege setups is needed: without it the run fails before it
    creates or writes anything, and the error names the statement that fixes it (PostgreSQL 15 and 18)."""
    role, conn_id = shop_as_role(db, monkeypatch, "pw-" + secrets.token_hex(8), grants=[*OWNER, *STATE_TABLE_BY_ROLE])
    for n, case in enumerate(MISSING_GRANTS):
        names = {"admin": db.cluster.superuser, "case_pub": f"pub_case{n}"}
        slot, sink = f"case{n}_{db.name}"[:63], tmp_path / f"case{n}"
        run_sql(db, case.take, role, **names)
        capture = replace(
            make_capture(db, conn_id, sink, **dict(case.settings)), publication_name=f"pub_case{n}", slot_name=slot
        )
        failed, message = run_until_failure(capture)
        assert failed in ("setup", "snapshot"), (case.name, failed)
        assert case.expected.format(role=role, db=db.name) in message, (case.name, message)
        with db.connect() as conn:
            (publications,) = conn.execute(
                "SELECT count(*) FROM pg_publication WHERE pubname = %s", (f"pub_case{n}",)
            ).fetchone()
        if failed == "setup":  # nothing created (the administrator's publication aside)
            assert db.slot_status(slot) is None, case.name
            assert publications == (1 if "{case_pub}" in " ".join(case.take) else 0), case.name
        assert not list(sink.rglob("*.json")) and not list(sink.rglob("*.parquet")), case.name  # nothing written
        run_sql(db, case.give_back, role, **names)


class _DryRun(Exception):
    pass


def _files(root: Path) -> dict[Path, tuple[int, int]]:
    found = {}
    for base, _dirs, names in os.walk(root):
        for name in names:
            path = Path(base, name)
            try:
                info = path.lstat()
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                found[path] = (info.st_mtime_ns, info.st_size)
    return found


def _read(path: Path) -> bytes:
    """A file's bytes, read by another process. Closing any descriptor of a file drops every POSIX
    lock its process holds on that file, and SQLite holds the Airflow metadata database's locks that
    way: reading ``airflow.db`` (or its ``-shm``) from this process would leave this process's open
    connection unlocked, and the next crash child to close its connection would delete the WAL under
    it ("database disk image is malformed" later; sqlite.org/howtocorrupt.html, section 2.2)."""
    try:
        if path.stat().st_size >= 256 * 1024 * 1024:
            return b""
    except OSError:  # gone meanwhile
        return b""
    done = subprocess.run(["cat", "--", str(path)], capture_output=True, check=False)
    return done.stdout if done.returncode == 0 else b""  # gone meanwhile, or a file of another user


def test_credentials_never_appear_anywhere(db15, airflow_db, spark, tmp_path, monkeypatch, capfd, caplog):
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
    from airflow.sdk import DAG

    from airflow_provider_cdc import spark_runner
    from airflow_provider_cdc.hooks.postgres_cdc import PostgresCdcHook
    from airflow_provider_cdc.sensors.cdc import CdcChangesSensor
    from airflow_provider_cdc.triggers.postgres_cdc import PostgresCdcChangesTrigger

    caplog.set_level(logging.INFO)
    caplog.set_level(logging.DEBUG, logger="airflow_provider_cdc")
    system_tmp = Path(tempfile.gettempdir())
    tmp_before = _files(system_tmp)
    db = db15
    token = f"S3cr3t-p4ss-{secrets.token_hex(8)}"
    password = token + ":/@+ %'\""  # characters a URI, a conninfo string or JSON must escape
    wrong = f"Wr0ng-p4ss-{secrets.token_hex(8)}"
    needles = {password, quote(password, safe=""), quote_plus(password), json.dumps(password)[1:-1], token, wrong}
    role, conn_id = shop_as_role(db, monkeypatch, password, grants=[*ADMIN_PUBLICATION, *STATE_TABLE_BY_ADMIN])
    monkeypatch.setenv("AIRFLOW_CONN_WRONG_PW", db.cluster.airflow_uri(db.name, user=role, password=wrong))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_YARN", json.dumps({"conn_type": "spark", "host": "yarn"}))

    # spark-submit: keep what it was given (the spec file is deleted when the job ends)
    submitted: list[dict] = []
    original_submit = SparkSubmitHook.submit

    def recording_submit(self, application: str = "", **kwargs):
        args = self._application_args
        spec_path, result_path = Path(args[args.index("--spec") + 1]), Path(args[args.index("--result") + 1])
        command = self._build_spark_submit_command(application)
        record = {
            "command": command,
            "spec": spec_path.read_bytes(),
            "spec_mode": stat.S_IMODE(spec_path.stat().st_mode),
            "env": {**(kwargs.get("env") or {}), **(self._env or {})},
        }
        submitted.append(record)
        if "yarn" in self._connection["master"]:
            raise _DryRun  # no YARN here: the command line is what matters
        outcome = original_submit(self, application, **kwargs)
        record["workdir"] = b"".join(_read(p) for p in spec_path.parent.rglob("*") if p.is_file())
        record["result"] = _read(result_path)
        return outcome

    monkeypatch.setattr(SparkSubmitHook, "submit", recording_submit)

    settings = {"publication_autocreate_mode": "disabled", "offset_store": "state_table"}
    capture = make_capture(db, conn_id, tmp_path / "sink", offset_table="cdc_state.offsets", **settings)
    results, failures = [], []

    def run(make_dag, hour: int):
        errors: dict = {}
        result = af.run(make_dag(errors), hour, errors=errors)
        results.append(result)
        failures.extend(errors.values())
        return result

    def dag_of(dag_id: str, capture, **window_kwargs):
        return lambda errors: capture_dag(dag_id, capture, errors, **window_kwargs)

    def sensor_dag(errors):
        with DAG(
            f"pw_sensor_{db.name}",
            schedule=None,
            start_date=af.START,
            default_args={"on_failure_callback": af.failure_recorder(errors)},
        ) as dag:
            CdcChangesSensor(task_id="wait", capture=capture, poke_interval=1, timeout=60, require_captured_change=True)
        af.register(dag)
        return dag

    assert run(dag_of(f"pw_{db.name}", capture), 0).state == "success", failures
    with db.connect() as conn:
        shop.mutate(conn, round_no=1)
    assert run(sensor_dag, 0).tasks == {"wait": "success"}, failures
    assert run(dag_of(f"pw_{db.name}", capture), 1).state == "success", failures
    with db.connect() as conn:
        shop.mutate(conn, round_no=2)
    through_submit = run(dag_of(f"pw_submit_{db.name}", replace(capture, spark_conn_id="spark_local")), 2)
    assert through_submit.tasks["window"] == "success", failures
    assert through_submit.xcom["window"]["job_pid"] != os.getpid()
    behind = run(dag_of(f"pw_behind_{db.name}", capture, upto_lsn="0/1"), 3)
    assert behind.tasks["window"] == "failed"
    refused = run(dag_of(f"pw_wrong_{db.name}", replace(capture, postgres_conn_id="wrong_pw")), 4)
    assert refused.tasks["setup"] == "failed"
    assert_reproduces_source(db, tmp_path / "sink")
    messages = [f"{type(e).__name__}: {e}" for e in failures]
    assert any("behind the committed offset" in m for m in messages), messages
    assert any("password authentication failed" in m for m in messages), messages

    # The connection value, the job spec and the trigger, as they print and serialise.
    info = PostgresCdcHook(conn_id).connection_info
    assert info.password == password  # it is there, and only there
    spec = PostgresJobSpec(
        topic_prefix="shop",
        connection=info,
        slot_name=db.slot,
        publication_name=db.publication,
        tables=tuple(TableRef.parse(t) for t in shop.TABLES),
        window=Window(seq=9, kind="stream", from_lsn=Lsn(1), to_lsn=Lsn(2), planned_at_ms=0),
        sink_path=str(tmp_path / "sink"),
    )
    with pytest.raises(_DryRun):  # a YARN master: the password must not go on the command line
        spark_runner.run_submitted(spec, spark_conn_id="spark_yarn", conf={})
    shown = [repr(info), str(info), info.describe(), json.dumps(info.to_dict()), repr(spec), str(spec), spec.to_json()]
    shown += [repr(capture), json.dumps(capture.describe(), default=str)]
    shown += [json.dumps(PostgresCdcChangesTrigger(conn_id, db.slot).serialize(), default=str)]

    # Everything that was written or said.
    with db.connect() as conn:
        offsets = conn.execute("SELECT * FROM cdc_state.offsets").fetchall()
    assert [row[0] for row in offsets] == ["shop"]
    assert_role_has_nothing_else(db, role)
    from airflow.models.variable import Variable as VariableRow
    from airflow.utils.session import create_session

    with create_session() as session:
        variables = [(row.key, row.val) for row in session.query(VariableRow)]
    captured = capfd.readouterr()
    said = {
        "stdout": captured.out,
        "stderr": captured.err,
        "log records": "\n".join(f"{r.getMessage()} {r.exc_text or ''} {r.args!r}" for r in caplog.records),
        "log text": caplog.text,
        "xcom": json.dumps([r.xcom for r in results], default=str),
        "errors": "\n".join(
            "".join(traceback.format_exception(e)) + repr(e) + repr(getattr(e, "__cause__", None)) for e in failures
        ),
        "offsets": repr(offsets),
        "variables": repr(variables),
        "values": "\n".join(shown),
    }
    for n, record in enumerate(submitted):
        said[f"submit {n} command"] = " ".join(record["command"])
        said[f"submit {n} spec"] = record["spec"].decode()
        said[f"submit {n} files"] = (record.get("workdir", b"") + record.get("result", b"")).decode()
        assert record["spec_mode"] == 0o600
        # The password travels in the spark-submit process environment, under the name the spec gives.
        assert record["env"]["AIRFLOW_CDC_SOURCE_PASSWORD"] == password
    assert len(submitted) == 2 and b"AIRFLOW_CDC_SOURCE_PASSWORD" in submitted[0]["spec"]
    files = {
        path: _read(path) for root in (Path(os.environ["AIRFLOW_HOME"]), tmp_path / "sink") for path in _files(root)
    }
    tmp_after = _files(system_tmp)
    files.update({p: _read(p) for p, seen in tmp_after.items() if tmp_before.get(p) != seen})
    files[db.cluster.log_file] = _read(db.cluster.log_file)
    assert any(p.suffix == ".parquet" for p in files) and any(p.name == "airflow.db" for p in files)
    tables = {p: pq.read_table(p).to_pylist() for p in (tmp_path / "sink").rglob("*.parquet")}
    said["parquet values"] = repr(tables)

    # The scan looks where things are: task logs, the role named by the refused login, the data.
    assert "committed" in said["stdout"] + said["log text"] and role in said["errors"]
    assert "***" not in said["stdout"] + said["log text"]  # Airflow's secret masker had nothing to hide
    assert any(b"shop.public.orders" in blob for path, blob in files.items() if "_cdc_log" in str(path))
    leaks = [where for where, text in said.items() if any(n in text for n in needles)]
    leaks += [str(p) for p, blob in files.items() if any(n.encode() in blob for n in needles)]
    assert leaks == []
