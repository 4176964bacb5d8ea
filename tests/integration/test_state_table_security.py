"""The state-table offset store runs no one else's code as the capture role.

Another database user who can create the offset table before the capture does (the default
``public.airflow_cdc_offsets``, in a ``public`` schema every role may create in, as before
PostgreSQL 15) can attach code to it: a trigger, a rule, a column default, a policy, an index
expression, a check constraint, a domain type. That code would run as the capture role whenever it
saves or reads its offset, with everything the capture role may read. The store refuses such a
table, before anything is read or written, naming the table, what it found and the fix.

Real PostgreSQL (15 and 18), real roles with the grants of the documented setups, real Airflow.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from functools import partial

import pytest
from psycopg import sql

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.offsets.state_table import PostgresStateTableOffsetStore
from tests.integration.test_operators import capture_dag, make_capture
from tests.integration.test_security import COMMON, HARDEN, OWNER, create_role, run_sql, shop_as_role
from tests.support import airflow as af

pytestmark = [pytest.mark.airflow]

OFFSETS_COLUMNS = (
    "capture text PRIMARY KEY, revision bigint NOT NULL, document jsonb NOT NULL, "
    "updated_at timestamptz NOT NULL DEFAULT now()"
)
#: The attacker's marker: every piece of attached code records that it ran, and as whom.
MARKER = (
    "CREATE TABLE public.ran (what text, as_role text)",
    "GRANT INSERT, SELECT ON public.ran TO PUBLIC",
    "CREATE FUNCTION public.mark(what text) RETURNS text LANGUAGE plpgsql AS "
    "$$ BEGIN INSERT INTO public.ran VALUES (what, current_user); RETURN what; END $$",
    "CREATE FUNCTION public.mark_trigger() RETURNS trigger LANGUAGE plpgsql AS "
    "$$ BEGIN PERFORM public.mark(TG_NAME); RETURN NEW; END $$",
    "CREATE FUNCTION public.mark_time() RETURNS timestamptz LANGUAGE plpgsql AS "
    "$$ BEGIN PERFORM public.mark('default'); RETURN now(); END $$",
    "CREATE FUNCTION public.mark_bool(what text) RETURNS boolean LANGUAGE plpgsql AS "
    "$$ BEGIN PERFORM public.mark(what); RETURN true; END $$",
    # an index expression must be IMMUTABLE: nothing checks that it is
    "CREATE FUNCTION public.mark_index(v jsonb) RETURNS text LANGUAGE plpgsql IMMUTABLE AS "
    "$$ BEGIN PERFORM public.mark('index'); RETURN v::text; END $$",
)


def as_role(db, role: str, statements) -> None:
    """Run ``statements`` as ``role`` (SET ROLE: its privileges, and it owns what it creates)."""
    with db.connect() as conn:
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
        for statement in statements:
            conn.execute(statement)


def make_role(db, name: str) -> str:
    role = f"{name}_{db.name}"[:63]
    with db.connect() as conn:
        conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(role)))
    db.created_roles.append(role)
    return role


def ran(db) -> list[tuple[str, str]]:
    with db.connect() as conn:
        return conn.execute("SELECT what, as_role FROM public.ran ORDER BY 1").fetchall()


@dataclass
class Roles:
    db: object
    capture: str  # the capture role: LOGIN and the grants of the documented setups, nothing else
    conn_id: str  # its Airflow connection
    attacker: str  # another database user: may create in public and cdc_state, like everyone once could
    admin: str  # a trusted administrator who is not a superuser (offset_table_owner)


@pytest.fixture
def roles(db, airflow_db, monkeypatch) -> Roles:
    password = "pw-" + secrets.token_hex(8)
    capture = create_role(db, password)
    attacker, admin = make_role(db, "mallory"), make_role(db, "admin")
    run_sql(
        db,
        [
            *HARDEN,
            *COMMON,
            "GRANT USAGE, CREATE ON SCHEMA public TO PUBLIC",  # PostgreSQL 14's default
            "CREATE SCHEMA cdc_state",
            "GRANT USAGE, CREATE ON SCHEMA cdc_state TO PUBLIC",
        ],
        capture,
    )
    db.execute(sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(sql.Identifier(db.name), sql.Identifier(attacker)))
    as_role(db, attacker, MARKER)
    conn_id = f"sts_{db.name}"
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{conn_id.upper()}", db.cluster.airflow_uri(db.name, user=capture, password=password)
    )
    return Roles(db, capture, conn_id, attacker, admin)


# -- the attack, end to end --------------------------------------------------------------------


@pytest.mark.spark  # only reached when the attack is not refused: the snapshot saves the offset
def test_a_table_pre_created_by_another_role_is_refused_before_its_trigger_runs(
    db15, airflow_db, tmp_path, monkeypatch
):
    """The review's attack: another role creates the (then default) offset table with a trigger that copies
    a captured table for itself and grants itself rights on it, then waits for the capture's first
    offset save. The setup task refuses the table (naming it, its owner and the fix) before the
    slot, the publication or any offset exists, and the trigger never runs."""
    db = db15
    capture_role, conn_id = shop_as_role(db, monkeypatch, "pw-" + secrets.token_hex(8), grants=OWNER)
    run_sql(db, ["GRANT USAGE, CREATE ON SCHEMA public TO PUBLIC"], capture_role)
    mallory = make_role(db, "mallory")
    as_role(
        db,
        mallory,
        [
            f"CREATE TABLE public.airflow_cdc_offsets ({OFFSETS_COLUMNS})",
            sql.SQL("GRANT SELECT, INSERT, UPDATE ON public.airflow_cdc_offsets TO {}").format(
                sql.Identifier(capture_role)
            ),
            # Runs as whoever saves an offset: the capture role, which owns the captured tables.
            sql.SQL(
                "CREATE FUNCTION public.audit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                "CREATE TABLE public.loot AS SELECT * FROM public.customers; "
                "GRANT SELECT ON public.loot TO {m}; GRANT SELECT ON public.customers TO {m}; "
                "RETURN NEW; END $$"
            ).format(m=sql.Identifier(mallory)),
            "CREATE TRIGGER audit AFTER INSERT OR UPDATE ON public.airflow_cdc_offsets "
            "FOR EACH ROW EXECUTE FUNCTION public.audit()",
        ],
    )
    # The default before this fix; the default is now a schema of the capture's own (cdc_state).
    capture = make_capture(
        db, conn_id, tmp_path / "sink", offset_store="state_table", offset_table="public.airflow_cdc_offsets"
    )
    errors: dict = {}
    result = af.run(capture_dag(f"sts_{db.name}", capture, errors), 0, errors=errors)

    with db.connect() as conn:  # the attacker gained nothing
        loot = conn.execute("SELECT to_regclass('public.loot')").fetchone()[0]
        readable = conn.execute("SELECT has_table_privilege(%s, 'public.customers', 'SELECT')", (mallory,)).fetchone()[
            0
        ]
        saved = conn.execute("SELECT count(*) FROM public.airflow_cdc_offsets").fetchone()[0]
    assert (loot, readable, saved) == (None, False, 0), "the attacker's trigger ran as the capture role"
    assert result.tasks["setup"] == "failed" and result.tasks["snapshot"] != "success", result.tasks
    message = f"{type(errors['setup']).__name__}: {errors['setup']}"
    for expected in (
        'the offset table "public"."airflow_cdc_offsets" (offset_table) is not safe to use',
        f"it is owned by role {mallory!r}, not by the capture role {capture_role!r}",
        f"set offset_table_owner={mallory!r}",
        f'ALTER TABLE "public"."airflow_cdc_offsets" OWNER TO "{capture_role}"',
        'DROP TRIGGER "audit" ON "public"."airflow_cdc_offsets"',
    ):
        assert expected in message, message
    assert db.slot_status() is None  # refused before setup created anything
    with db.connect() as conn:
        assert conn.execute("SELECT count(*) FROM pg_publication").fetchone()[0] == 0
    assert not (tmp_path / "sink").exists()


# -- each way to attach code, through the store ------------------------------------------------


@dataclass(frozen=True)
class Unsafe:
    name: str
    prepare: tuple[str, ...]  # run by `by` ({t}: the table, {capture}: the capture role, {attacker})
    expected: tuple[str, ...]  # in the error
    by: str = "admin"  # who makes the table: "admin" (named as offset_table_owner) or "attacker"
    table: str = "cdc_state.offsets"
    row: bool = False  # a stored row: the save is an UPDATE (else an INSERT)


GRANTS = "GRANT SELECT, INSERT, UPDATE ON {t} TO {capture}"
TABLE = f"CREATE TABLE {{t}} ({OFFSETS_COLUMNS})"
UNSAFE = [
    Unsafe(
        "a wrong owner", (TABLE, GRANTS),
        ("it is owned by role '{attacker}', not by the capture role '{capture}' or offset_table_owner '{admin}'",
         "set offset_table_owner='{attacker}'", 'ALTER TABLE {t} OWNER TO "{capture}"'),
        by="attacker",
    ),
    Unsafe(
        "a trigger", (TABLE, GRANTS, "CREATE TRIGGER t1 BEFORE INSERT OR UPDATE ON {t} "
                      "FOR EACH ROW EXECUTE FUNCTION public.mark_trigger()"),
        ('trigger "t1": DROP TRIGGER "t1" ON {t}',),
    ),
    Unsafe(
        "a rule", (TABLE, GRANTS, "CREATE RULE r1 AS ON UPDATE TO {t} DO ALSO SELECT public.mark('rule')"),
        ('rule "r1": DROP RULE "r1" ON {t}',), row=True,
    ),
    Unsafe(
        "a default calling a function",
        (TABLE, GRANTS, "ALTER TABLE {t} ALTER COLUMN updated_at SET DEFAULT public.mark_time()"),
        ('column "updated_at" has the default (or generated value) public.mark_time()',
         'ALTER TABLE {t} ALTER COLUMN "updated_at" SET DEFAULT now()'),
    ),
    Unsafe(
        "a default on another column", (TABLE, GRANTS, "ALTER TABLE {t} ALTER COLUMN revision SET DEFAULT 1"),
        ('ALTER TABLE {t} ALTER COLUMN "revision" DROP DEFAULT',),
    ),
    Unsafe(
        "a policy calling a function",
        (TABLE, GRANTS, "ALTER TABLE {t} ENABLE ROW LEVEL SECURITY",
         "CREATE POLICY p1 ON {t} USING (public.mark_bool('policy'))"),
        ('policy "p1": DROP POLICY "p1" ON {t}', "ALTER TABLE {t} DISABLE ROW LEVEL SECURITY"), row=True,
    ),
    Unsafe(
        "an index expression", (TABLE, GRANTS, "CREATE INDEX i1 ON {t} (public.mark_index(document))"),
        ('index "i1" has an expression or a predicate: DROP INDEX "cdc_state"."i1"',),
    ),
    Unsafe(
        "a check constraint", (TABLE, GRANTS, "ALTER TABLE {t} ADD CONSTRAINT c1 CHECK (public.mark_bool('check'))"),
        ('constraint "c1": ALTER TABLE {t} DROP CONSTRAINT "c1"',),
    ),
    Unsafe(
        "a domain type",
        ("CREATE DOMAIN public.doc AS jsonb CHECK (public.mark_bool('domain'))",
         f"CREATE TABLE {{t}} ({OFFSETS_COLUMNS.replace('document jsonb', 'document public.doc')})", GRANTS),
        ("its columns are (capture text, revision bigint, document public.doc, updated_at timestamp with time "
         "zone), expected exactly (capture text, revision bigint, document jsonb,",),
    ),
    Unsafe(
        "a view", ("CREATE VIEW {t} AS SELECT public.mark('view') AS capture, 1::bigint AS revision, "
                   "'{{}}'::jsonb AS document, now() AS updated_at", GRANTS),
        ("it is a view, not a plain table",), by="attacker",
    ),
    Unsafe(
        "a trigger grant to another role", (TABLE, GRANTS, "GRANT TRIGGER ON {t} TO {attacker}"),
        ("role '{attacker}' may create triggers on it: REVOKE TRIGGER ON {t} FROM \"{attacker}\"",),
    ),
    Unsafe(
        "a schema another role owns",
        ("CREATE SCHEMA m_state", "GRANT USAGE, CREATE ON SCHEMA m_state TO {capture}"),
        ("its schema \"m_state\" is owned by role '{attacker}', which can drop the table and put another in "
         "its place", 'ALTER SCHEMA "m_state" OWNER TO "{admin}"'),
        by="attacker", table="m_state.offsets",
    ),
]  # fmt: skip


def test_a_table_with_attached_code_is_refused_before_any_read_or_write(roles):
    """Setup's check (peek), load and save each refuse the table before reading or writing it:
    the attached code never runs and no offset is stored; the error names each problem's fix."""
    db = roles.db
    names = {"capture": roles.capture, "attacker": roles.attacker, "admin": roles.admin}
    failures = []
    for n, case in enumerate(UNSAFE):
        schema = case.table.split(".")[0]
        table = f"{schema}.case{n}" if schema == "cdc_state" else case.table
        quoted = ".".join(f'"{part}"' for part in table.split("."))
        ids = {k: sql.Identifier(v) for k, v in names.items()}
        maker = roles.admin if case.by == "admin" else roles.attacker
        as_role(db, maker, [sql.SQL(s.replace("{t}", table)).format(**ids) for s in case.prepare])
        if case.row:
            as_role(db, maker, [f"INSERT INTO {table} (capture, revision, document) VALUES ('shop', 1, '{{}}')"])
        store = PostgresStateTableOffsetStore(roles.conn_id, table, owner=roles.admin)
        expected_revision = 1 if case.row else None
        for call in (
            partial(store.peek, "shop"),  # setup
            partial(store.load, "shop"),
            partial(store.save, "shop", '{"n": 2}', revision=2, expected_revision=expected_revision),
            partial(store.delete, "shop"),
        ):
            try:
                call()
            except CdcConfigurationError as exc:
                message = str(exc)
                expected = [e.format(t=quoted, **names) for e in case.expected]
                expected.append(f"the offset table {quoted} (offset_table) is not safe to use")
                if missing := [e for e in expected if e not in message]:
                    failures.append((case.name, "message", missing, message))
            else:
                failures.append((case.name, "not refused"))
        with db.connect() as conn:
            kind = conn.execute("SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)", (table,)).fetchone()
            stored = conn.execute(f"SELECT revision FROM {table}").fetchall() if kind == ("r",) else []
        if stored != ([(1,)] if case.row else []):
            failures.append((case.name, "written", stored))
        if ran(db):
            failures.append((case.name, "ran", ran(db)))
            db.execute("TRUNCATE public.ran")
    assert failures == []


def test_trusted_owners_are_accepted_and_named_when_refused(roles):
    """The capture role's own table (created by the store), a table an administrator made and named
    as offset_table_owner, and a superuser's table are used; the administrator's table without the
    setting is refused, naming the setting."""
    db = roles.db
    own = PostgresStateTableOffsetStore(roles.conn_id, "cdc_state.own")
    assert own.peek("shop") is None  # setup: nothing created yet
    own.save("shop", '{"n": 1}', revision=1, expected_revision=None)
    own.save("shop", '{"n": 2}', revision=2, expected_revision=1)
    assert own.load("shop") == '{"n": 2}' and own.peek("shop") == '{"n": 2}'
    with db.connect() as conn:
        owner = conn.execute("SELECT tableowner FROM pg_tables WHERE tablename = 'own'").fetchone()[0]
    assert owner == roles.capture

    grants = sql.SQL("GRANT SELECT, INSERT, UPDATE ON cdc_state.made TO {}").format(sql.Identifier(roles.capture))
    as_role(db, roles.admin, [f"CREATE TABLE cdc_state.made ({OFFSETS_COLUMNS})", grants])
    with pytest.raises(CdcConfigurationError, match=f"set offset_table_owner='{roles.admin}'"):
        PostgresStateTableOffsetStore(roles.conn_id, "cdc_state.made").save(
            "shop", "{}", revision=1, expected_revision=None
        )
    named = PostgresStateTableOffsetStore(roles.conn_id, "cdc_state.made", owner=roles.admin)
    named.save("shop", '{"n": 1}', revision=1, expected_revision=None)
    assert named.load("shop") == '{"n": 1}'

    db.execute(f"CREATE TABLE cdc_state.by_superuser ({OFFSETS_COLUMNS})")
    db.execute(
        sql.SQL("GRANT SELECT, INSERT, UPDATE ON cdc_state.by_superuser TO {}").format(sql.Identifier(roles.capture))
    )
    PostgresStateTableOffsetStore(roles.conn_id, "cdc_state.by_superuser").save(
        "shop", "{}", revision=1, expected_revision=None
    )
    assert ran(db) == []


def test_public_follows_the_database_owner(roles):
    """PostgreSQL 15+'s ``public`` is owned by ``pg_database_owner``: the database's owner, who can
    drop the table there. A database owned by a role that is not trusted is refused, naming it and
    offset_table_owner as the way to trust it."""
    db = roles.db
    store = PostgresStateTableOffsetStore(roles.conn_id, "public.airflow_cdc_offsets")
    store.save("shop", "{}", revision=1, expected_revision=None)  # a superuser owns the database: fine
    db.execute(sql.SQL("ALTER DATABASE {} OWNER TO {}").format(sql.Identifier(db.name), sql.Identifier(roles.admin)))
    with pytest.raises(CdcConfigurationError) as raised:
        store.load("shop")
    assert (
        f"its schema \"public\" is owned by role '{roles.admin}' (the database's owner, as pg_database_owner)"
        in str(raised.value)
    )
    assert f"set offset_table_owner='{roles.admin}' if that role is trusted" in str(raised.value)
    assert PostgresStateTableOffsetStore(roles.conn_id, "public.airflow_cdc_offsets", roles.admin).load("shop") == "{}"


def test_the_query_extraction_operator_refuses_the_same_tables(roles, tmp_path):
    """PostgresQueryExtractOperator keeps its watermark in the same store: a pre-created table is
    refused before the extraction reads or lands anything; offset_table_owner names a trusted one."""
    from airflow_provider_cdc.operators.query_extract import PostgresQueryExtractOperator

    db = roles.db
    db.execute("CREATE TABLE public.items (id int PRIMARY KEY, updated_at timestamptz NOT NULL DEFAULT now())")
    db.execute(sql.SQL("GRANT SELECT ON public.items TO {}").format(sql.Identifier(roles.capture)))
    as_role(
        db,
        roles.attacker,
        [
            f"CREATE TABLE public.query_offsets ({OFFSETS_COLUMNS})",
            sql.SQL("GRANT SELECT, INSERT, UPDATE ON public.query_offsets TO {}").format(sql.Identifier(roles.capture)),
            "CREATE TRIGGER t1 BEFORE INSERT OR UPDATE ON public.query_offsets "
            "FOR EACH ROW EXECUTE FUNCTION public.mark_trigger()",
        ],
    )

    def extractor(**kwargs):
        return PostgresQueryExtractOperator(
            task_id="extract",
            postgres_conn_id=roles.conn_id,
            table="public.items",
            cursor_column="updated_at",
            topic_prefix="q",
            sink_path=str(tmp_path / "sink"),
            offset_store="state_table",
            offset_table="public.query_offsets",
            **kwargs,
        )

    for operator in (extractor(), extractor(offset_table_owner=roles.admin)):
        with pytest.raises(Exception, match=f"it is owned by role '{roles.attacker}'") as raised:
            operator.execute({})
        assert 'DROP TRIGGER "t1" ON "public"."query_offsets"' in str(raised.value)
    assert ran(db) == [] and not (tmp_path / "sink").exists()


def test_the_default_table_lives_in_a_schema_the_capture_role_creates_and_owns(db, airflow_db, monkeypatch):
    """The default offset_table is ``cdc_state.offsets``: with CREATE on the database the store
    creates the schema itself (so the capture role owns it); without, the error names the
    administrator's statement; a ``cdc_state`` someone else created first is refused."""
    password = "pw-" + secrets.token_hex(8)
    capture = create_role(db, password)
    run_sql(db, [*HARDEN, *COMMON], capture)
    conn_id = f"sts_default_{db.name}"
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{conn_id.upper()}", db.cluster.airflow_uri(db.name, user=capture, password=password)
    )
    store = PostgresStateTableOffsetStore(conn_id)
    assert store.table.quoted() == '"cdc_state"."offsets"'

    with pytest.raises(
        CdcConfigurationError, match=rf'Have an administrator run: CREATE SCHEMA "cdc_state" AUTHORIZATION "{capture}"'
    ):
        store.save("shop", "{}", revision=1, expected_revision=None)

    attacker = make_role(db, "mallory")
    db.execute(sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(sql.Identifier(db.name), sql.Identifier(attacker)))
    as_role(
        db,
        attacker,
        [
            "CREATE SCHEMA cdc_state",
            sql.SQL("GRANT USAGE, CREATE ON SCHEMA cdc_state TO {}").format(sql.Identifier(capture)),
        ],
    )
    with pytest.raises(CdcConfigurationError, match=f"owned by role '{attacker}'"):
        store.save("shop", "{}", revision=1, expected_revision=None)
    db.execute("DROP SCHEMA cdc_state")

    db.execute(sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(sql.Identifier(db.name), sql.Identifier(capture)))
    assert store.peek("shop") is None  # setup's check creates nothing
    store.save("shop", '{"n": 1}', revision=1, expected_revision=None)
    assert store.load("shop") == '{"n": 1}'
    with db.connect() as conn:
        owners = conn.execute(
            "SELECT n.nspowner::regrole::text, c.relowner::regrole::text FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'cdc_state' AND c.relname = 'offsets'"
        ).fetchone()
    assert [o.strip('"') for o in owners] == [capture, capture]
