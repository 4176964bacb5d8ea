"""No other role's code runs as the capture role, through the objects those roles own.

The capture role holds REPLICATION: it can drop any replication slot (another consumer's), or
create a ``test_decoding`` slot and read every table. Code that runs as it is worth having, and
other roles can attach code to what they own: the application role that owns the captured tables
(the documented least-privilege setup) and the signal table, or any role that may create in
``public``. Each test is the attack as that role would try it, through the product's own sessions
and statements: its code tries to drop another consumer's slot and records as whom it ran. The
capture refuses, names what it found and the fix, and the code never runs.

Real PostgreSQL 15 (and 18 where it matters), real roles.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import psycopg
import pytest
from psycopg import sql

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.sources.postgres import admin
from airflow_provider_cdc.cdc.sources.postgres.chunks import Watermarks
from airflow_provider_cdc.cdc.sources.postgres.connection import PgConnectionInfo, connect
from airflow_provider_cdc.cdc.sources.postgres.events import EventContext, EventSettings
from airflow_provider_cdc.cdc.sources.postgres.snapshot import (
    BlockRange,
    SnapshotPoint,
    copy_text_columns,
    read_partition,
)
from airflow_provider_cdc.cdc.sources.postgres.tables import TableRef
from tests.integration.test_security import create_role

SIGNAL = TableRef("public", "cdc_signal")
SIGNAL_DDL = (
    "CREATE TABLE public.cdc_signal (id varchar(64) PRIMARY KEY, type varchar(32) NOT NULL, data varchar(2048))"
)
#: The attacker's code: records that it ran and as whom, and drops another consumer's slot when it can.
MARK = (
    "CREATE TABLE public.ran (what text, as_role text)",
    "GRANT INSERT, SELECT ON public.ran TO PUBLIC",
    "CREATE FUNCTION public.mark(what text) RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN "
    "INSERT INTO public.ran VALUES (what, current_user); "
    "IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = current_user AND rolreplication) THEN "
    "PERFORM pg_catalog.pg_drop_replication_slot(slot_name) FROM pg_catalog.pg_replication_slots "
    "WHERE slot_name = 'other_consumer'; END IF; RETURN true; END $$",
    "CREATE FUNCTION public.mark_trigger() RETURNS trigger LANGUAGE plpgsql AS "
    "$$ BEGIN PERFORM public.mark(TG_NAME); RETURN NEW; END $$",
    # An index expression, a generated column must be IMMUTABLE: nothing checks that one is.
    "CREATE FUNCTION public.mark_immutable(v text) RETURNS text LANGUAGE plpgsql IMMUTABLE AS "
    "$$ BEGIN PERFORM public.mark('immutable'); RETURN v; END $$",
)


@dataclass
class Roles:
    db: object
    capture: str  # LOGIN REPLICATION, the grants it is given below, nothing else
    app: str  # the application role: owns the tables, may create in public
    info: PgConnectionInfo  # the capture's connection

    def as_app(self, *statements) -> None:
        with self.db.connect() as conn:
            conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(self.app)))
            for statement in statements:
                conn.execute(statement.format(capture=self.capture) if isinstance(statement, str) else statement)

    def ran(self) -> list[tuple[str, str]]:
        with self.db.connect() as conn:
            return conn.execute("SELECT what, as_role FROM public.ran ORDER BY 1").fetchall()

    def other_consumer_exists(self) -> bool:
        with self.db.connect() as conn:
            return bool(
                conn.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'other_consumer'").fetchone()[
                    0
                ]
            )


@pytest.fixture
def roles(db15) -> Roles:
    return _roles(db15)


@pytest.fixture
def roles_any(db) -> Roles:
    return _roles(db)


def _roles(db) -> Roles:
    password = "pw-" + secrets.token_hex(8)
    capture = create_role(db, password)
    app = f"app_{db.name}"[:63]
    with db.connect() as conn:
        conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(app)))
        db.created_roles.append(app)
        for statement in (
            "GRANT CONNECT ON DATABASE {db} TO {capture}",
            "GRANT USAGE ON SCHEMA public TO {capture}",
            "GRANT USAGE, CREATE ON SCHEMA public TO {app}",
        ):
            conn.execute(
                sql.SQL(statement).format(
                    db=sql.Identifier(db.name), capture=sql.Identifier(capture), app=sql.Identifier(app)
                )
            )
        conn.execute("SELECT pg_create_logical_replication_slot('other_consumer', 'pgoutput')")
    info = PgConnectionInfo(
        db.cluster.host, db.cluster.port, db.name, capture, password=password, options=(("sslmode", "disable"),)
    )
    found = Roles(db, capture, app, info)
    found.as_app(*MARK)
    return found


# -- (A) the signal table: the capture writes its watermark rows there ----------------------------

GRANT_SIGNAL = "GRANT SELECT, INSERT, DELETE ON public.cdc_signal TO {capture}"


@dataclass(frozen=True)
class Attached:
    name: str
    statements: tuple[str, ...]  # run by the app role after it made the signal table
    expected: str  # in the refusal


ATTACHED = [
    # The review's: a trigger that runs as whoever inserts.
    Attached(
        "trigger",
        ("CREATE TRIGGER t BEFORE INSERT ON public.cdc_signal FOR EACH ROW EXECUTE FUNCTION public.mark_trigger()",),
        'trigger "t": DROP TRIGGER "t" ON "public"."cdc_signal"',
    ),
    Attached(
        "rule",
        ("CREATE RULE r AS ON INSERT TO public.cdc_signal DO ALSO SELECT public.mark('rule')",),
        'rule "r": DROP RULE "r" ON "public"."cdc_signal"',
    ),
    Attached(
        "default",
        ("ALTER TABLE public.cdc_signal ADD COLUMN noted boolean DEFAULT public.mark('default')",),
        'the default (or generated value) of column "noted" calls public.mark(text), owned by role',
    ),
    Attached(
        "generated column",
        ("ALTER TABLE public.cdc_signal ADD COLUMN g text GENERATED ALWAYS AS (public.mark_immutable(data)) STORED",),
        'the default (or generated value) of column "g" calls public.mark_immutable(text)',
    ),
    Attached(
        "check constraint",
        ("ALTER TABLE public.cdc_signal ADD CONSTRAINT c CHECK (public.mark('check'))",),
        'constraint "c" calls public.mark(text)',
    ),
    Attached(
        "index expression",
        ("CREATE INDEX i ON public.cdc_signal (public.mark_immutable(data))",),
        'index "i" calls public.mark_immutable(text)',
    ),
    Attached(
        "domain",
        (
            "CREATE DOMAIN public.signal_text AS varchar(2048) CHECK (public.mark('domain'))",
            "ALTER TABLE public.cdc_signal ALTER COLUMN data TYPE public.signal_text",
        ),
        'column "data" has domain public.signal_text (in its type), owned by role',
    ),
    Attached(
        "row level security",
        (
            "CREATE POLICY p ON public.cdc_signal USING (true) WITH CHECK (public.mark('policy'))",
            "ALTER TABLE public.cdc_signal ENABLE ROW LEVEL SECURITY",
        ),
        'row level security is enabled (policies "p") and applies to the capture role: '
        'ALTER TABLE "public"."cdc_signal" DISABLE ROW LEVEL SECURITY',
    ),
    Attached(
        "partitioned",
        (
            "DROP TABLE public.cdc_signal",
            "CREATE TABLE public.cdc_signal (id varchar(64), type varchar(32) NOT NULL, data varchar(2048)) "
            "PARTITION BY LIST (type)",
            "CREATE TABLE public.cdc_signal_w PARTITION OF public.cdc_signal DEFAULT",
            "CREATE TRIGGER t BEFORE INSERT ON public.cdc_signal_w FOR EACH ROW EXECUTE FUNCTION public.mark_trigger()",
            GRANT_SIGNAL,
        ),
        "it is a partitioned table, not a plain table",
    ),
]


@pytest.mark.parametrize("mode", ["insert_insert", "insert_delete"])
@pytest.mark.parametrize("attached", ATTACHED, ids=lambda a: a.name)
def test_code_on_the_signal_table_never_runs_as_the_capture_role(roles, attached, mode):
    """The signal table's owner attaches code to it and waits for an incremental snapshot's
    watermark write: nothing is written, the code does not run, the error names it and the fix."""
    roles.as_app(SIGNAL_DDL, GRANT_SIGNAL, *attached.statements)
    error = write_watermark(roles, mode)
    assert roles.ran() == [], "the attacker's code ran (what, as whom)"
    assert roles.other_consumer_exists(), "the attacker's code dropped another consumer's slot"
    message = str(error)
    assert isinstance(error, CdcConfigurationError) and attached.expected in message, message
    assert 'the signal table "public"."cdc_signal" has code attached' in message and "nothing was written" in message
    assert "incremental_watermarks='message'" in message
    with roles.db.connect() as conn:
        assert conn.execute("SELECT count(*) FROM public.cdc_signal").fetchone() == (0,)
    # setup's check says the same before any run
    with connect(roles.info) as conn:
        described = admin.describe_tables(conn, [SIGNAL])[SIGNAL]
        assert any(attached.expected in p for p in admin.check_signal_table(conn, described, mode))
        assert admin.check_signal_table(conn, described, "message") == []  # nothing written: nothing runs
    assert roles.ran() == []


def write_watermark(roles: Roles, mode: str) -> Exception | None:
    """An incremental snapshot's low watermark, written by the product as the capture role."""
    with connect(roles.info) as conn:
        try:
            Watermarks(mode, SIGNAL).open(conn, "0000000001-0001-abcd")
        except Exception as exc:
            return exc
    return None


def test_the_reviews_trigger_drops_no_slot(roles):
    """The review's script: a BEFORE INSERT trigger calling pg_drop_replication_slot('other_consumer')."""
    roles.as_app(
        SIGNAL_DDL,
        GRANT_SIGNAL,
        "CREATE FUNCTION public.f() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "PERFORM pg_drop_replication_slot('other_consumer'); RETURN NEW; END $$",
        "CREATE TRIGGER t BEFORE INSERT ON public.cdc_signal FOR EACH ROW EXECUTE FUNCTION public.f()",
    )
    error = write_watermark(roles, "insert_insert")
    assert roles.other_consumer_exists(), "the trigger dropped another consumer's slot as the capture role"
    assert isinstance(error, CdcConfigurationError) and 'DROP TRIGGER "t"' in str(error), error


def test_a_plain_signal_table_of_another_role_is_written(roles):
    """What the checks accept: another role's table with builtin defaults and constraints, an index."""
    roles.as_app(
        "CREATE TABLE public.cdc_signal (id varchar(64) PRIMARY KEY, type varchar(32) NOT NULL CHECK (type <> ''), "
        "data varchar(2048), created_at timestamptz NOT NULL DEFAULT now(), seq bigserial)",
        "CREATE INDEX ON public.cdc_signal (lower(type))",
        GRANT_SIGNAL,
        "GRANT USAGE ON SEQUENCE public.cdc_signal_seq_seq TO {capture}",
    )
    with connect(roles.info) as conn:
        for mode in ("insert_insert", "insert_delete"):
            marks = Watermarks(mode, SIGNAL)
            low = marks.open(conn, f"c-{mode}")
            high = marks.close(conn, f"c-{mode}")
            assert 0 < low <= high
        described = admin.describe_tables(conn, [SIGNAL])[SIGNAL]
        assert admin.check_signal_table(conn, described, "insert_insert") == []
    with roles.db.connect() as conn:
        ids = [r[0] for r in conn.execute("SELECT id FROM public.cdc_signal ORDER BY id").fetchall()]
    assert ids == ["c-insert_insert-close", "c-insert_insert-open"]


def test_a_trigger_cannot_be_added_while_a_watermark_is_written(roles):
    """The check and the write are one transaction holding ROW EXCLUSIVE on the table: a CREATE
    TRIGGER waits for it (a trigger added between the check and the insert could not run)."""
    roles.as_app(SIGNAL_DDL, GRANT_SIGNAL)
    with connect(roles.info) as conn, conn.transaction():
        conn.execute('LOCK TABLE "public"."cdc_signal" IN ROW EXCLUSIVE MODE')  # what Watermarks holds
        with roles.db.connect() as app:
            app.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(roles.app)))
            app.execute("SET lock_timeout = '200ms'")
            with pytest.raises(psycopg.errors.LockNotAvailable):
                app.execute(
                    "CREATE TRIGGER t BEFORE INSERT ON public.cdc_signal FOR EACH ROW "
                    "EXECUTE FUNCTION public.mark_trigger()"
                )


# -- (B) row level security on a captured table ------------------------------------------------

ORDERS = TableRef("public", "orders")
RLS = (
    "CREATE TABLE public.orders (id int PRIMARY KEY, total int)",
    "INSERT INTO public.orders SELECT g, g * 10 FROM generate_series(1, 5) g",
    "GRANT SELECT ON public.orders TO {capture}",
    # The review's: a policy whose expression runs as the reader; it also hides rows.
    "CREATE POLICY p ON public.orders USING (public.mark('policy') AND id < 3)",
    "ALTER TABLE public.orders ENABLE ROW LEVEL SECURITY",
)


def attempt(read):
    try:
        return read()
    except Exception as exc:
        return exc


def copy_rows(info: PgConnectionInfo, statement: str) -> int:
    with connect(info) as conn, conn.cursor().copy(statement) as copy:
        return sum(bytes(chunk).count(b"\n") for chunk in copy)


def text_rows(info: PgConnectionInfo, statement: str) -> int:
    with connect(info) as conn, conn.cursor() as cur:
        return sum(len(columns[0]) for columns in copy_text_columns(cur, statement, 2))


def read_snapshot(info: PgConnectionInfo, table) -> int:
    """The snapshot's partition read (a plain REPEATABLE READ transaction stands in for the slot's
    exported snapshot): the number of rows read."""
    point = SnapshotPoint("unused", 0, None, 0)
    batches = read_partition(
        info,
        point,
        table,
        BlockRange(0, None),
        EventContext("t", info.dbname, "x", 0),
        EventSettings(),
        enter_snapshot=lambda conn, _point: conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"),
    )
    return sum(b.num_rows for b in batches)


def test_a_policy_on_a_captured_table_never_runs_and_never_hides_rows(roles_any):
    roles = roles_any
    roles.as_app(*RLS)
    with connect(roles.info) as conn:
        table = admin.describe_tables(conn, [ORDERS])[ORDERS]
    # The review's read (the product's session, the snapshot's COPY), the snapshot's partition read,
    # and the incremental chunks' and query extraction's reads.
    copy_sql = 'COPY (SELECT "id", "total" FROM "public"."orders") TO STDOUT (FORMAT csv)'
    outcomes = {
        "copy": attempt(lambda: copy_rows(roles.info, copy_sql)),
        "snapshot": attempt(lambda: read_snapshot(roles.info, table)),
        "chunks": attempt(lambda: text_rows(roles.info, copy_sql)),
    }
    assert roles.ran() == [], f"the policy ran as the capture role: {roles.ran()} ({outcomes})"
    assert roles.other_consumer_exists(), "the policy dropped another consumer's slot"
    assert isinstance(outcomes["copy"], psycopg.errors.InsufficientPrivilege), outcomes  # not 2 rows of 5
    assert "row-level security" in str(outcomes["copy"])
    for name in ("snapshot", "chunks"):
        assert isinstance(outcomes[name], CdcConfigurationError), outcomes
        assert "BYPASSRLS" in str(outcomes[name]) and "row_security = off" in str(outcomes[name])
    # setup's table checks name the table, the policy and the fix
    with connect(roles.info) as conn:
        problems = admin.check_tables(conn, [table])
    assert len(problems) == 1 and '"public"."orders" has row level security enabled (policies "p")' in problems[0]
    assert f'ALTER ROLE "{roles.capture}" BYPASSRLS' in problems[0] and "DISABLE ROW LEVEL SECURITY" in problems[0]

    # The fix the error names: the capture reads every row, and the policy still does not run.
    roles.db.execute(sql.SQL("ALTER ROLE {} BYPASSRLS").format(sql.Identifier(roles.capture)))
    with connect(roles.info) as conn:
        assert admin.check_tables(conn, [table]) == []
    assert read_snapshot(roles.info, table) == 5
    assert roles.ran() == []


def test_forced_row_security_on_a_table_the_capture_role_owns_is_reported(roles):
    roles.as_app(*RLS)
    roles.db.execute(sql.SQL("ALTER TABLE public.orders OWNER TO {}").format(sql.Identifier(roles.capture)))
    with connect(roles.info) as conn:
        table = admin.describe_tables(conn, [ORDERS])[ORDERS]
        assert admin.check_tables(conn, [table]) == []  # the owner is not subject to its policies
        conn.execute('ALTER TABLE "public"."orders" FORCE ROW LEVEL SECURITY')
        (problem,) = admin.check_tables(conn, [table])
        assert 'ALTER TABLE "public"."orders" NO FORCE ROW LEVEL SECURITY' in problem, problem
    with pytest.raises(CdcConfigurationError, match="row level security"):
        read_snapshot(roles.info, table)
    assert roles.ran() == []


# -- search_path: nothing the capture calls unqualified resolves to another role's function -------


def test_a_better_matching_function_in_public_is_never_called(roles):
    """CVE-2018-1058's pattern: a role that may create in public defines functions named like the
    builtins the capture calls, with argument types that match its parameters better than the
    builtin's (``has_table_privilege(oid, text)`` against an integer parameter). With public on the
    search_path they would be chosen over pg_catalog's; the capture's sessions search pg_catalog only."""
    roles.as_app(
        SIGNAL_DDL,
        GRANT_SIGNAL,
        *(
            f"CREATE FUNCTION public.has_table_privilege({kind}, text) RETURNS boolean LANGUAGE sql "
            "AS $$ SELECT public.mark('shadow') $$"
            for kind in ("smallint", "integer", "bigint")
        ),
    )
    # The database's and the role's own defaults (which an owner or administrator may set) change nothing.
    roles.db.execute(
        sql.SQL("ALTER DATABASE {} SET search_path = public, pg_catalog").format(sql.Identifier(roles.db.name))
    )
    roles.db.execute(sql.SQL("ALTER ROLE {} SET row_security = on").format(sql.Identifier(roles.capture)))
    with connect(roles.info) as conn:
        described = admin.describe_tables(conn, [SIGNAL])[SIGNAL]
        problems = admin.check_signal_table(conn, described, "insert_delete")  # has_table_privilege(%s, %s)
        settings = conn.execute("SELECT current_setting('search_path'), current_setting('row_security')").fetchone()
    assert roles.ran() == [], "another role's function ran as the capture role"
    assert roles.other_consumer_exists(), "another role's function dropped another consumer's slot"
    assert problems == [] and settings == ("pg_catalog,pg_temp", "off")


def test_a_heartbeat_query_names_its_tables_with_their_schema(roles):
    """``heartbeat_action_query`` is the DAG author's SQL, run in a capture session: unqualified
    names are not looked up in public (where they could be another role's), and the error says so."""
    roles.as_app(
        "CREATE TABLE public.beats (n int PRIMARY KEY, at timestamptz)",
        "GRANT UPDATE, SELECT ON public.beats TO {capture}",
    )
    with connect(roles.info) as conn:
        with pytest.raises(CdcConfigurationError, match=r"search_path = pg_catalog, pg_temp: name tables") as raised:
            admin.run_heartbeat(conn, "UPDATE beats SET at = now()")
        assert 'relation "beats" does not exist' in str(raised.value)
        admin.run_heartbeat(conn, "UPDATE public.beats SET at = now()")
