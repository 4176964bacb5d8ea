"""Bad input: every kind fails with a message that names what is wrong and what to do, and
writes nothing.

Each test fingerprints everything a capture can write (:func:`written`: the files under the sink
path, the stored offset, the replication slots with their positions, the publications and the
database's tables) before and after the failing run, and asserts both are equal. Runtime inputs
run through real Airflow (``dag.test``) against PostgreSQL 15, sharing one database; pure
configuration errors fail when the DAG file is parsed. No test starts Spark: the running captures
use ``snapshot_mode="never"``, whose stream windows write Parquet with Arrow.

Hostile identifiers (quotes, dots, spaces, SQL fragments, non-ASCII) captured end to end, snapshot
and stream window compared with the source, are covered by
``tests/integration/postgres/test_snapshot.py::test_hostile_identifiers_are_quoted_end_to_end``;
here a misspelt hostile name must come back quoted correctly in the error.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from psycopg import sql

from airflow_provider_cdc.capture import PostgresCapture
from airflow_provider_cdc.cdc.sources.postgres.lsn import Lsn
from airflow_provider_cdc.cdc.sources.postgres.tables import TableRef, pg_identifier
from airflow_provider_cdc.offsets.variable import VariableOffsetStore
from airflow_provider_cdc.testing import shop
from airflow_provider_cdc.testing.postgres_cluster import PostgresCluster, available_flavours, scratch_dir
from tests.integration.test_operators import capture_dag
from tests.support import airflow as af
from tests.support.databases import CaptureDatabase

pytestmark = [pytest.mark.airflow]

TASKS = ("setup", "snapshot", "window")
OFFSETS = VariableOffsetStore(key_prefix="bi_offset__")
HOSTILE_SCHEMA, HOSTILE_TABLE = "Sch ema", 'wé"ird.na me; DROP TABLE x--'


# -- "nothing written": a fingerprint of everything a capture can write -----------------------


@dataclass(frozen=True)
class Written:
    sink: tuple  # (path relative to the sink path, sha1 of the content or "dir")
    offset: str | None  # the stored offset document, verbatim
    slots: tuple  # (name, plugin, database, confirmed_flush_lsn, restart_lsn)
    publications: tuple  # (name, all tables, insert, update, delete, truncate, [tables])
    tables: tuple  # (schema, name, relkind, replica identity) of the database's relations


def written(db: CaptureDatabase, capture: PostgresCapture) -> Written:
    """Everything ``capture`` could have written: compare one taken before a run with one after."""
    with db.connect() as conn:
        slots = conn.execute(
            "SELECT slot_name::text, plugin::text, database::text, confirmed_flush_lsn::text, restart_lsn::text "
            "FROM pg_replication_slots WHERE database = current_database() OR slot_name = %s ORDER BY 1",
            (capture.resolved_slot_name,),
        ).fetchall()
        publications = conn.execute(
            "SELECT p.pubname::text, p.puballtables, p.pubinsert, p.pubupdate, p.pubdelete, p.pubtruncate, "
            "array(SELECT t.schemaname || '.' || t.tablename FROM pg_publication_tables t "
            "      WHERE t.pubname = p.pubname ORDER BY 1) "
            "FROM pg_publication p ORDER BY 1"
        ).fetchall()
        tables = conn.execute(
            "SELECT n.nspname::text, c.relname::text, c.relkind::text, c.relreplident::text "
            "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind IN ('r', 'p', 'v', 'm') AND n.nspname NOT IN ('pg_catalog', 'information_schema') "
            "ORDER BY 1, 2"
        ).fetchall()
        offset = _stored_offset(conn, capture)
    return Written(
        _sink_files(capture.sink_path),
        offset,
        tuple(map(tuple, slots)),
        tuple(tuple(map(_hashable, row)) for row in publications),
        tuple(map(tuple, tables)),
    )


def _stored_offset(conn, capture: PostgresCapture) -> str | None:
    if capture.offset_store == "state_table":  # read it directly: the store itself creates its table
        table = TableRef.parse(capture.offset_table)
        if conn.execute("SELECT to_regclass(%s)", (table.quoted(),)).fetchone()[0] is None:
            return None
        row = conn.execute(
            sql.SQL("SELECT document::text FROM {} WHERE capture = %s").format(pg_identifier(table)),
            (capture.topic_prefix,),
        ).fetchone()
        return None if row is None else row[0]
    from airflow.models import Variable

    store = capture.offset_store if isinstance(capture.offset_store, VariableOffsetStore) else VariableOffsetStore()
    return Variable.get(store.key(capture.topic_prefix), default_var=None)


def _sink_files(path: str) -> tuple:
    root = Path(path)
    if root.is_file():
        return ((".", _sha1(root)),)
    if not root.is_dir():
        return ()
    return tuple(sorted((str(p.relative_to(root)), _sha1(p) if p.is_file() else "dir") for p in root.rglob("*")))


def _sha1(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


# -- the source: one database for every runtime case ------------------------------------------


@dataclass
class Source:
    db: CaptureDatabase
    sinks: Path
    conn_ids: dict[str, str]
    passwords: dict[str, str] = field(default_factory=dict)

    def capture(self, name: str, *, conn: str = "superuser", **overrides: Any) -> PostgresCapture:
        """A capture of the shop tables whose names (prefix, slot, publication, sink) are ``name``'s own."""
        args: dict[str, Any] = {
            "postgres_conn_id": self.conn_ids[conn],
            "tables": list(shop.TABLES),
            "topic_prefix": name,
            "sink_path": str(self.sinks / name),
            "slot_name": f"bi_{name}",
            "publication_name": f"bi_{name}",
            "offset_store": OFFSETS,
            "spark_master": "local[2]",
        }
        return PostgresCapture(**{**args, **overrides})


@pytest.fixture(scope="module")
def src(clusters, airflow_db, tmp_path_factory) -> Iterator[Source]:
    db = CaptureDatabase.create(clusters["pg15"], "t_bad_input")
    cluster = db.cluster
    with db.connect() as conn:
        shop.create_schema(conn)
        shop.seed(conn, customers=4, orders_per_customer=1)
        conn.execute(
            "CREATE VIEW customer_view AS SELECT id, email FROM customers;"
            "CREATE TABLE keyless (v text);"
            "CREATE TABLE nothing_ident (id int PRIMARY KEY); ALTER TABLE nothing_ident REPLICA IDENTITY NOTHING;"
            "CREATE TABLE x (id int);"  # the target of the hostile name's DROP TABLE
        )
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(HOSTILE_SCHEMA)))
        conn.execute(
            sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v text)").format(
                sql.Identifier(HOSTILE_SCHEMA, HOSTILE_TABLE)
            )
        )
    passwords = {"norepl": secrets.token_urlsafe(12), "noselect": secrets.token_urlsafe(12)}
    roles = {"norepl": "bi_norepl", "noselect": "bi_noselect"}
    with db.connect() as conn:
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(roles["norepl"]), sql.Literal(passwords["norepl"])
            )
        )
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN REPLICATION PASSWORD {}").format(
                sql.Identifier(roles["noselect"]), sql.Literal(passwords["noselect"])
            )
        )
        db.created_roles.extend(roles.values())
        grant = "GRANT SELECT ON {} TO {}"
        conn.execute(sql.SQL(grant).format(sql.SQL("customers, orders, order_items"), sql.Identifier(roles["norepl"])))
        conn.execute(sql.SQL(grant).format(sql.SQL("customers, order_items"), sql.Identifier(roles["noselect"])))
    wrong_password = "Wr0ng-" + secrets.token_urlsafe(12)
    uris = {
        "superuser": cluster.airflow_uri(db.name),
        "norepl": cluster.airflow_uri(db.name, user=roles["norepl"], password=passwords["norepl"]),
        "noselect": cluster.airflow_uri(db.name, user=roles["noselect"], password=passwords["noselect"]),
        "wrong_password": cluster.airflow_uri(db.name, password=wrong_password),
    }
    conn_ids = {name: f"bi_{name}" for name in uris}
    try:
        with pytest.MonkeyPatch.context() as env:
            for name, uri in uris.items():
                env.setenv(f"AIRFLOW_CONN_{conn_ids[name].upper()}", uri)
            conn_ids["unknown"] = "bi_no_such_connection"
            yield Source(
                db,
                tmp_path_factory.mktemp("bad-input-sinks"),
                conn_ids,
                {**passwords, "wrong_password": wrong_password, "superuser": cluster.password},
            )
    finally:
        db.drop()


def run_refused(
    dag_id: str,
    capture: PostgresCapture,
    task: str,
    *,
    db: CaptureDatabase,
    before: Written,
    hour: int = 0,
    make_dag: Callable = capture_dag,
    written_by: Callable = written,
    **window_kwargs: Any,
) -> str:
    """Run setup >> snapshot >> window: ``task`` fails, the tasks after it never run, nothing is
    written (the fingerprint equals ``before``). Returns the error as ``"<class>: <message>"``.
    Another source's module passes its own ``make_dag`` and fingerprint (``written_by(db, capture)``)."""
    errors: dict = {}
    result = af.run(make_dag(dag_id, capture, errors, **window_kwargs), hour, errors=errors)
    assert result.tasks[task] == "failed", (result.tasks, errors)
    position = TASKS.index(task)
    assert all(result.tasks[t] in ("success", "skipped") for t in TASKS[:position]), (result.tasks, errors)
    assert all(result.tasks[t] == "upstream_failed" for t in TASKS[position + 1 :]), result.tasks
    assert written_by(db, capture) == before
    return result.error(task)


def assert_says(message: str, *phrases: str) -> None:
    missing = [p for p in phrases if p not in message]
    assert not missing, f"{missing} not in: {message}"


# -- parse time: PostgresCapture validates its fields when the DAG file is imported -----------

DAG_FILE = """
from airflow.sdk import DAG

from airflow_provider_cdc.capture import PostgresCapture
from airflow_provider_cdc.operators.setup import CdcSetupOperator
from airflow_provider_cdc.operators.window import CdcWindowOperator

capture = PostgresCapture(**{kwargs!r})
with DAG({dag_id!r}, schedule=None):
    CdcSetupOperator(task_id="setup", capture=capture) >> CdcWindowOperator(
        task_id="window", capture=capture
    )
"""


@pytest.mark.parametrize(
    ("overrides", "phrases"),
    [
        pytest.param(
            {"snapshot_mode": "exported"},
            ["snapshot_mode 'exported' is not supported", "choose one of initial, always, never"],
            id="unsupported-snapshot-mode",
        ),
        pytest.param(
            {"topic_prefix": "shop-eu"},
            ["topic_prefix 'shop-eu' is invalid", "use letters, digits and '_'"],
            id="invalid-topic-prefix",
        ),
        pytest.param(
            {"slot_name": "Shop-Slot"},
            ["slot_name 'Shop-Slot' is invalid", "lower-case letters, digits and '_', at most 63"],
            id="invalid-slot-name",
        ),
        pytest.param(
            {"sink_path": "  "}, ["sink_path is required", "local directory or a Hadoop URI"], id="blank-sink"
        ),
        pytest.param(
            {"tables": [], "table_include_list": ["public.(orders"]},
            ["table pattern 'public.(orders' is not a valid regular expression"],
            id="invalid-table-pattern",
        ),
        pytest.param(
            {"tables": ["orders", '"public"."orders"', "customers"]},
            ['tables listed more than once: "public"."orders"'],
            id="duplicate-tables",
        ),
        pytest.param(
            {"tables": ["shop.public.orders"]},
            ["table name 'shop.public.orders' has 3 parts", "expected 'schema.table'", "quote parts"],
            id="unparsable-table-name",
        ),
        pytest.param({"tables": "public.orders"}, ["tables must be a list, not one string"], id="tables-as-string"),
        pytest.param(
            {"decimal_handling_mode": "exact"},
            ["decimal handling mode 'exact' is not one of precise, double, string"],
            id="handling-mode-decimal",
        ),
        pytest.param(
            {"time_precision_mode": "nanos"},
            ["time_precision handling mode 'nanos' is not one of"],
            id="handling-mode-time",
        ),
        pytest.param({"binary_handling_mode": "base32"}, ["binary handling mode 'base32'"], id="handling-mode-binary"),
        pytest.param({"hstore_handling_mode": "xml"}, ["hstore handling mode 'xml'"], id="handling-mode-hstore"),
        pytest.param(
            {"interval_handling_mode": "weeks"}, ["interval handling mode 'weeks'"], id="handling-mode-interval"
        ),
        pytest.param(
            {"column_masks": {"column.mask.with.many.chars": "public.customers.email"}},
            ["unsupported column rule 'column.mask.with.many.chars'", "column.mask.with.<N>.chars"],
            id="column-mask-unknown-rule",
        ),
        pytest.param(
            {"column_masks": {"column.mask.hash.SHA-999.with.salt.s": "public.customers.email"}},
            ["unknown hash algorithm 'SHA-999'"],
            id="column-mask-unknown-hash",
        ),
        pytest.param(
            {"column_masks": {"column.mask.with.4.chars": "public.customers.(email"}},
            ["column pattern 'public.customers.(email' is not a valid regular expression"],
            id="column-mask-invalid-pattern",
        ),
        pytest.param(
            {"max_changes_per_chunk": 0},
            ["max_changes_per_chunk must be a number of at least 1, got 0"],
            id="chunk-zero",
        ),
        pytest.param(
            {"max_changes_per_chunk": -500},
            ["max_changes_per_chunk must be a number of at least 1, got -500"],
            id="chunk-negative",
        ),
        pytest.param(
            {"max_changes_per_chunk": "10000"},
            ["max_changes_per_chunk must be a number of at least 1, got '10000'"],
            id="chunk-string",
        ),
        pytest.param(
            {"offset_store": "redis"},
            ["offset_store 'redis' is not one of variable, state_table"],
            id="unknown-offset-store",
        ),
        pytest.param(
            {"offset_store": "state_table", "offset_table": "cdc state.offsets"},
            ["offset_table 'cdc state.offsets' is invalid", "unexpected 's' in table name"],
            id="state-table-malformed-name",
        ),
        pytest.param(
            {"offset_store": "state_table", "offset_table": "cdc.state.offsets"},
            ["offset_table 'cdc.state.offsets' is invalid", "has 3 parts"],
            id="state-table-three-parts",
        ),
        pytest.param(
            {"publication_autocreate_mode": "sometimes"},
            ["publication_autocreate_mode 'sometimes' is not one of filtered, all_tables, disabled"],
            id="unknown-publication-mode",
        ),
    ],
)
def test_bad_configuration_fails_the_dag_import(src, tmp_path, request, overrides, phrases):
    from airflow.dag_processing.dagbag import DagBag

    name = "parse_" + request.node.callspec.id.replace("-", "_")
    base = src.capture(name)
    before = written(src.db, base)
    kwargs = {
        "postgres_conn_id": base.postgres_conn_id,
        "tables": list(shop.TABLES),
        "topic_prefix": name,
        "sink_path": base.sink_path,
        "slot_name": base.resolved_slot_name,
        **overrides,
    }
    path = tmp_path / f"{name}.py"
    path.write_text(DAG_FILE.format(kwargs=kwargs, dag_id=name))
    bag = DagBag(dag_folder=str(path))
    assert name not in bag.dags
    (error,) = bag.import_errors.values()
    assert "CdcConfigurationError" in error
    assert_says(error, *phrases)
    assert written(src.db, base) == before


# -- setup: the server, role, tables, slot, publication, sink and offset are checked first ----


def _slot_with_plugin(plugin: str, database: str | None = None) -> Callable:
    def prepare(source: Source, capture: PostgresCapture) -> Callable[[], None]:
        dbname = database or source.db.name
        with source.db.cluster.connect(dbname) as conn:
            conn.execute("SELECT pg_create_logical_replication_slot(%s, %s)", (capture.resolved_slot_name, plugin))

        def drop() -> None:
            with source.db.cluster.connect(dbname) as conn:
                conn.execute("SELECT pg_drop_replication_slot(%s)", (capture.resolved_slot_name,))

        return drop

    return prepare


def _publication(tables: str, options: str = "") -> Callable:
    def prepare(source: Source, capture: PostgresCapture) -> Callable[[], None]:
        name = sql.Identifier(capture.resolved_publication_name)
        source.db.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE " + tables + options).format(name))
        return lambda: source.db.execute(sql.SQL("DROP PUBLICATION {}").format(name))

    return prepare


def _blocker_file(source: Source, capture: PostgresCapture) -> None:
    """A regular file where the sink path (or one of its parents) should be a directory."""
    (source.sinks / "blocker.txt").write_text("not a directory\n")


def _foreign_offset(**identity: str) -> Callable:
    """An offset document of another capture stored under this capture's key (copied Variables)."""

    def prepare(source: Source, capture: PostgresCapture) -> Callable[[], None]:
        from airflow.models import Variable

        document = {
            "format": 1,
            "connector": "postgresql",
            "topic_prefix": capture.topic_prefix,
            "system_identifier": "7000000000000000001",
            "database": "production",
            "slot_name": getattr(capture, "resolved_slot_name", None),  # None: under another source's capture
            "lsn": 123456789,
            "snapshot_completed": True,
            "window_seq": 42,
            "revision": 84,
            **identity,
        }
        key = OFFSETS.key(capture.topic_prefix)
        Variable.set(key, json.dumps(document))
        return lambda: Variable.delete(key)

    return prepare


@dataclass(frozen=True)
class SetupCase:
    phrases: tuple[str, ...]
    overrides: dict[str, Any] = field(default_factory=dict)
    conn: str = "superuser"
    prepare: Callable | None = None
    error: str = "AirflowFailException"
    secret: str | None = None  # a password that must not appear in the message
    existing: bool = False  # ``prepare`` creates the slot or publication the capture would use


HOSTILE_MISSPELT = '"Sch ema"."we""ird.na me; DROP TABLE x--"'

SETUP_CASES = {
    "unknown-table": SetupCase(
        ('table(s) not found or not visible to the capture role: "public"."refunds"', "quote mixed-case names"),
        {"tables": [*shop.TABLES, "public.refunds"]},
    ),
    "misspelt-table": SetupCase(
        ('"public"."custmers" (did you mean "public"."customers"',),
        {"tables": ["public.custmers", "public.orders"]},
    ),
    "misspelt-hostile-identifier": SetupCase(
        (f'{HOSTILE_MISSPELT} (did you mean "Sch ema"."wé""ird.na me; DROP TABLE x--"?)',),
        {"tables": [HOSTILE_MISSPELT]},
    ),
    "view": SetupCase(
        (
            "only ordinary and partitioned tables can be captured",
            '"public"."customer_view" (a view). Capture the underlying tables instead',
        ),
        {"tables": ["public.customers", "public.customer_view"]},
    ),
    "no-primary-key": SetupCase(
        (
            '"public"."keyless" has no primary key and REPLICA IDENTITY DEFAULT',
            'Add a primary key, or run: ALTER TABLE "public"."keyless" REPLICA IDENTITY FULL',
        ),
        {"tables": ["public.customers", "public.keyless"]},
    ),
    "replica-identity-nothing": SetupCase(
        (
            '"public"."nothing_ident" has REPLICA IDENTITY NOTHING',
            'Run: ALTER TABLE "public"."nothing_ident" REPLICA IDENTITY DEFAULT',
        ),
        {"tables": ["public.nothing_ident"]},
    ),
    "include-list-matches-nothing": SetupCase(
        (
            "no table to capture: table_include_list ['sales\\\\..*'] and table_exclude_list [] leave nothing",
            "must match a whole 'schema.table' name",
        ),
        {"tables": [], "table_include_list": ["sales\\..*"]},
    ),
    "mask-on-a-numeric-column": SetupCase(
        (
            'masking rule \'public.orders.total\' matches "public"."orders".total',
            "masks apply to character columns only",
        ),
        {"column_masks": {"column.mask.with.4.chars": "public.orders.total"}},
    ),
    "mask-on-a-key-column": SetupCase(
        ('"public"."customers".id is a key column: key columns are never masked',),
        {"column_masks": {"column.mask.hash.SHA-256.with.salt.pepper": "public.customers.id"}},
    ),
    "slot-with-another-plugin": SetupCase(
        ("replication slot 'bi_slot_with_another_plugin' uses plugin 'test_decoding'", "Use another slot name"),
        prepare=_slot_with_plugin("test_decoding"),
        existing=True,
    ),
    "slot-of-another-database": SetupCase(
        ("replication slot 'bi_slot_of_another_database' belongs to database 'postgres'", "choose another slot name"),
        prepare=_slot_with_plugin("pgoutput", database="postgres"),
        existing=True,
    ),
    "publication-missing-tables-autocreate-disabled": SetupCase(
        (
            "publication 'bi_publication_missing_tables_autocreate_disabled' does not contain "
            '"public"."order_items", "public"."orders"; changes to them would be silently missed',
            'Run: ALTER PUBLICATION "bi_publication_missing_tables_autocreate_disabled" ADD TABLE',
        ),
        {"publication_autocreate_mode": "disabled"},
        prepare=_publication("customers"),
        existing=True,
    ),
    "publication-absent-autocreate-disabled": SetupCase(
        (
            "publication 'bi_publication_absent_autocreate_disabled' does not exist and "
            "publication_autocreate_mode is 'disabled'",
            'Create it: CREATE PUBLICATION "bi_publication_absent_autocreate_disabled" FOR TABLE "public"."customers"',
        ),
        {"publication_autocreate_mode": "disabled"},
    ),
    "publication-without-deletes": SetupCase(
        ("does not publish delete", "SET (publish = 'insert, update, delete, truncate')"),
        prepare=_publication("customers, orders, order_items", " WITH (publish = 'insert, update')"),
        existing=True,
    ),
    "role-without-replication": SetupCase(
        ("role 'bi_norepl' lacks the REPLICATION attribute: ALTER ROLE \"bi_norepl\" REPLICATION",),
        conn="norepl",
    ),
    "role-without-select": SetupCase(
        ('the capture role cannot SELECT from "public"."orders": GRANT SELECT ON "public"."orders"',),
        conn="noselect",
    ),
    "wrong-password": SetupCase(
        (
            "Airflow connection 'bi_wrong_password' was refused by the server",
            'password authentication failed for user "postgres"',
            "Fix the connection's login and password",
        ),
        conn="wrong_password",
        secret="wrong_password",
    ),
    "unknown-airflow-connection": SetupCase(
        ("The conn_id `bi_no_such_connection` isn't defined",),
        conn="unknown",
        error="AirflowNotFoundException",
    ),
    "sink-path-is-a-file": SetupCase(
        ("exists and is not a directory: point sink_path at a directory",),
        {"sink_path": "{sinks}/blocker.txt"},
        prepare=_blocker_file,
    ),
    "sink-path-inside-a-file": SetupCase(
        ("blocker.txt/lake' cannot be created", "blocker.txt' is a file, not a directory", "Choose another sink_path"),
        {"sink_path": "{sinks}/blocker.txt/lake"},
        prepare=_blocker_file,
    ),
    "offset-copied-from-another-database": SetupCase(
        (
            "Airflow Variable 'bi_offset__offset_copied_from_another_database'",
            "belongs to another capture (system_identifier is '7000000000000000001'",
            "database is 'production', expected 't_bad_input'",
            "Delete the stored offset: the next run restores this capture's own from its sink's commit log",
        ),
        prepare=_foreign_offset(),
    ),
}


@pytest.mark.parametrize("kind", list(SETUP_CASES))
def test_setup_refuses_bad_input_before_creating_anything(src, kind):
    case = SETUP_CASES[kind]
    name = kind.replace("-", "_")
    overrides = {k: v.format(sinks=src.sinks) if isinstance(v, str) else v for k, v in case.overrides.items()}
    capture = src.capture(name, conn=case.conn, **overrides)
    cleanup = case.prepare(src, capture) if case.prepare else None
    try:
        before = written(src.db, capture)
        message = run_refused(f"bad_{name}", capture, "setup", db=src.db, before=before)
        assert message.startswith(f"{case.error}: "), message
        assert_says(message, *case.phrases)
        if case.secret:
            assert src.passwords[case.secret] not in message and src.passwords["superuser"] not in message
        if not case.existing:  # the failure came before setup creates the slot and the publication
            assert capture.resolved_slot_name not in {s[0] for s in before.slots}
            assert capture.resolved_publication_name not in {p[0] for p in before.publications}
    finally:
        if cleanup:
            cleanup()
    with src.db.connect() as conn:  # the hostile name's SQL fragment never ran
        assert conn.execute("SELECT to_regclass('public.x') IS NOT NULL").fetchone()[0]


def test_setup_reports_every_problem_in_one_error_before_creating_anything(src):
    """A typo'd table, a keyless table, missing grants, a sink path inside a file and a copied
    offset: one error lists each of them with its fix, as one traceback, and nothing is written."""
    import traceback

    capture = src.capture(
        "many_problems",
        conn="noselect",  # REPLICATION, but no SELECT on orders or keyless, owns nothing
        tables=["public.custmers", "public.orders", "public.keyless"],
        sink_path=str(src.sinks / "blocker.txt" / "lake"),
    )
    _blocker_file(src, capture)
    forget_offset = _foreign_offset()(src, capture)
    try:
        before = written(src.db, capture)
        assert capture.resolved_slot_name not in {s[0] for s in before.slots}
        assert capture.resolved_publication_name not in {p[0] for p in before.publications}
        errors: dict = {}
        result = af.run(capture_dag("bad_many_problems", capture, errors), 0, errors=errors)
        assert result.tasks == {"setup": "failed", "snapshot": "upstream_failed", "window": "upstream_failed"}
        assert written(src.db, capture) == before
    finally:
        forget_offset()
    message = result.error("setup")
    problems = {
        "sink path": ("blocker.txt/lake' cannot be created", "Choose another sink_path"),
        "typo": ('"public"."custmers" (did you mean "public"."customers"', "quote mixed-case names"),
        "keyless": (
            '"public"."keyless" has no primary key and REPLICA IDENTITY DEFAULT',
            'ALTER TABLE "public"."keyless" REPLICA IDENTITY FULL',
        ),
        "grant on orders": (
            'cannot SELECT from "public"."orders": GRANT SELECT ON "public"."orders" TO "bi_noselect"',
        ),
        "grant on keyless": ('cannot SELECT from "public"."keyless": GRANT SELECT ON "public"."keyless" TO',),
        "publication": (
            "role 'bi_noselect' may not create publication 'bi_many_problems'",
            'GRANT CREATE ON DATABASE "t_bad_input" TO "bi_noselect"',
            'ALTER TABLE "public"."orders" OWNER TO "bi_noselect"',
        ),
        "offset": (
            "Airflow Variable 'bi_offset__many_problems': the stored offset belongs to another capture",
            "Delete the stored offset: the next run restores this capture's own from its sink's commit log",
        ),
    }
    assert message.startswith(
        f"AirflowFailException: CdcConfigurationError: setup found {len(problems)} problems and created or changed "
        "nothing; fix each of them, then run it again:\n"
    ), message
    for phrases in problems.values():
        assert_says(message, *phrases)
    numbered = [line for line in message.splitlines() if line.lstrip().split(".")[0].isdigit()]
    assert len(numbered) == len(problems), message
    shown = "".join(traceback.format_exception(result.errors["setup"]))  # as the task log prints it
    assert shown.count("Traceback (most recent call last)") == 1, shown
    assert "direct cause" not in shown and "During handling" not in shown, shown


def test_server_with_wal_level_replica_is_refused(airflow_db, monkeypatch, tmp_path):
    cluster = PostgresCluster(available_flavours()["pg15"], scratch_dir("cdc-test-replica-"))
    cluster.start(settings={"wal_level": "replica"})
    try:
        db = CaptureDatabase.create(cluster, "replica_only")
        with db.connect() as conn:
            shop.create_schema(conn)
        monkeypatch.setenv("AIRFLOW_CONN_BI_REPLICA_ONLY", cluster.airflow_uri(db.name))
        capture = PostgresCapture(
            postgres_conn_id="bi_replica_only",
            tables=list(shop.TABLES),
            topic_prefix="replica_only",
            sink_path=str(tmp_path / "lake"),
            offset_store=OFFSETS,
        )
        before = written(db, capture)
        message = run_refused("bad_wal_level", capture, "setup", db=db, before=before)
        assert_says(
            message,
            "ServerConfigurationError: the server cannot do logical capture",
            "wal_level is 'replica', it must be 'logical': set wal_level = logical in postgresql.conf",
            "restart the server",
        )
        assert before.slots == () and before.publications == ()
    finally:
        cluster.stop()
        shutil.rmtree(cluster.base_dir, ignore_errors=True)


# -- run start: a running capture's stored state is checked against the server and the sink ---


@dataclass
class Running:
    capture: PostgresCapture
    offset: dict  # the good stored offset, restored after each case


@pytest.fixture(scope="module")
def running(src) -> Running:
    """A capture that committed two stream windows (one with a change)."""
    capture = src.capture("running", snapshot_mode="never")
    errors: dict = {}
    dag = capture_dag("bad_running", capture, errors)
    assert af.run(dag, 0, errors=errors).state == "success", errors
    src.db.execute("INSERT INTO customers (email, name) VALUES ('late@example.com', 'Late')")
    assert af.run(dag, 1, errors=errors).state == "success", errors
    return Running(capture, json.loads(written(src.db, capture).offset))


def _store_offset(capture: PostgresCapture, text: str) -> None:
    from airflow.models import Variable

    Variable.set(OFFSETS.key(capture.topic_prefix), text)


@pytest.mark.parametrize(
    ("corrupt", "phrases"),
    [
        pytest.param(
            lambda doc: '{"format": 1, "lsn": ',
            ["the stored offset is not valid JSON", "Delete it: the next run restores it from the sink's commit log"],
            id="malformed-json",
        ),
        pytest.param(
            lambda doc: json.dumps([doc]),
            ["the stored offset is not a JSON object", "Delete it: the next run restores it"],
            id="json-not-an-object",
        ),
        pytest.param(
            lambda doc: json.dumps({**doc, "lsn": "next Tuesday"}),
            ["malformed offset document", "not an LSN: 'next Tuesday'", "Delete it: the next run restores it"],
            id="garbage-lsn-in-document",
        ),
        pytest.param(
            lambda doc: json.dumps({**doc, "format": 7}),
            ["has format 7, newer than this provider understands (1); upgrade airflow-provider-cdc"],
            id="future-format",
        ),
        pytest.param(
            lambda doc: json.dumps({**doc, "slot_name": "cdc_other"}),
            [
                "belongs to another capture (slot_name is 'cdc_other', expected 'bi_running')",
                "Delete the stored offset",
            ],
            id="another-slot",
        ),
        pytest.param(
            lambda doc: json.dumps({**doc, "database": "shop_staging"}),
            ["database is 'shop_staging', expected 't_bad_input'", "Delete the stored offset"],
            id="another-database",
        ),
        pytest.param(
            lambda doc: json.dumps({**doc, "system_identifier": "7111111111111111111"}),
            ["system_identifier is '7111111111111111111', expected", "only valid for the server"],
            id="another-server",
        ),
        pytest.param(
            lambda doc: json.dumps({**doc, "topic_prefix": "shop"}),
            ["topic_prefix is 'shop', expected 'running'", "Delete the stored offset"],
            id="another-topic-prefix",
        ),
    ],
)
def test_bad_stored_offset_is_refused_and_left_alone(src, running, request, corrupt, phrases):
    capture = running.capture
    _store_offset(capture, corrupt(running.offset))
    try:
        before = written(src.db, capture)
        message = run_refused(f"bad_offset_{request.node.callspec.id}", capture, "setup", db=src.db, before=before)
        assert_says(
            message, "AirflowFailException: InvalidOffsetError: Airflow Variable 'bi_offset__running'", *phrases
        )
    finally:
        _store_offset(capture, json.dumps(running.offset))


@pytest.mark.parametrize(
    ("upto", "phrases"),
    [
        pytest.param(
            lambda offset, current: "abc",
            ["upto_lsn of task 'window' is invalid: not an LSN: 'abc'", "'X/Y' hexadecimal form"],
            id="not-an-lsn",
        ),
        pytest.param(
            lambda offset, current: "1/ZZ",
            ["upto_lsn of task 'window' is invalid: not an LSN: '1/ZZ'"],
            id="bad-hex",
        ),
        pytest.param(
            lambda offset, current: str(Lsn(current + (64 << 20))),
            ["is ahead of the server's current WAL position"],
            id="ahead-of-the-server",
        ),
        pytest.param(
            lambda offset, current: str(Lsn(offset - 1)),
            ["is behind the committed offset", "a window cannot end before it starts"],
            id="behind-the-offset",
        ),
    ],
)
def test_bad_upto_lsn_is_refused(src, running, request, upto, phrases):
    capture = running.capture
    value = upto(running.offset["lsn"], src.db.current_lsn())
    before = written(src.db, capture)
    dag_id = f"bad_upto_{request.node.callspec.id}"
    # hour 2: after the fixture's runs (an earlier interval would be a replay, which reads nothing)
    message = run_refused(dag_id, capture, "window", db=src.db, before=before, hour=2, upto_lsn=value)
    assert_says(message, "AirflowFailException: InvalidLsnError: ", value, *phrases)


def test_stored_offset_ahead_of_the_sink_commit_log_is_refused(src, running):
    capture = running.capture
    sink, moved = Path(capture.sink_path), Path(capture.sink_path + ".moved")
    sink.rename(moved)  # the sink's files are gone; the offset still says two windows landed
    try:
        before = written(src.db, capture)
        assert before.sink == ()
        message = run_refused("bad_sink_deleted", capture, "snapshot", db=src.db, before=before)
        assert_says(
            message,
            "OffsetMismatchError: the stored offset says window 2 of capture 'running' landed, but the sink's "
            "commit log ends at window none",
            "restore them, or delete the stored offset to re-snapshot",
        )
        assert not sink.exists()
    finally:
        moved.rename(sink)


def test_slot_advanced_past_the_stored_offset_is_refused(src):
    capture = src.capture("moved_slot", snapshot_mode="never")
    errors: dict = {}
    assert af.run(capture_dag("bad_moved_slot", capture, errors), 0, errors=errors).state == "success", errors
    src.db.execute("INSERT INTO customers (email, name) VALUES ('skipped@example.com', 'Skipped')")
    with src.db.connect() as conn:  # someone else consumes the slot: the insert is never captured
        conn.execute("SELECT pg_replication_slot_advance(%s, pg_current_wal_lsn())", (capture.resolved_slot_name,))
    before = written(src.db, capture)
    message = run_refused("bad_moved_slot_2", capture, "window", db=src.db, before=before)
    assert_says(
        message,
        "OffsetMismatchError: replication slot 'bi_moved_slot' is confirmed up to",
        "past the stored offset",
        "something else consumed or advanced the slot",
        "Re-snapshot (snapshot_mode='when_needed' or 'always')",
    )
