"""Offsets in a PostgreSQL table, written with an atomic compare-and-set.

The table is created on first use::

    CREATE TABLE IF NOT EXISTS <schema>.<table> (
        capture     text PRIMARY KEY,
        revision    bigint NOT NULL,
        document    jsonb NOT NULL,
        updated_at  timestamptz NOT NULL DEFAULT now()
    )

Keep it out of the captured tables' publication (the default ``filtered`` publication does).

Whoever owns the table can attach code to it that runs *as the capture role* whenever the
capture reads or writes its offset: a trigger, a rule, a column default, a row-level security
policy, an index expression, a check constraint, a domain type (triggers run with the privileges
of the user whose statement fired them unless their function is ``SECURITY DEFINER``). A table
another database user pre-created under the configured name would hand that user everything the
capture role may read. So, before anything is read or written (at setup, and before every load,
save and delete), the store checks that:

- the table is owned by a trusted role: the capture role itself (``current_user``), the role named
  by ``owner`` (the capture's ``offset_table_owner``, for a table an administrator creates and
  grants ``SELECT, INSERT, UPDATE`` on), or a superuser (who can run code as any role anyway);
- its schema is owned by a trusted role (a schema's owner can drop the table and put another in
  its place; ``pg_database_owner`` stands for the database's owner);
- it is a plain table (``relkind 'r'``: no view, partitioned, foreign or partition table, no
  inheritance) with exactly the expected columns and types, no triggers, rules, policies or row
  level security, no default but ``now()`` on ``updated_at``, no constraint beyond primary key,
  unique and not-null, no index on an expression or with a predicate, and no ``TRIGGER`` grant to
  an untrusted role.

Each failure names the table, what was found and the statement that fixes it. The store's
sessions run with ``search_path = pg_catalog, pg_temp``, and the table's name is always
schema-qualified and quoted, so no function or operator of its statements can be shadowed.
Between the check and the write nobody but a trusted role can change the table: only its owner,
members of its owner's role, the schema's owner or a ``TRIGGER`` grantee could.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import psycopg
from psycopg import sql

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.sources.postgres.connection import first_line
from airflow_provider_cdc.cdc.sources.postgres.tables import TableRef, pg_identifier, quote_ident
from airflow_provider_cdc.hooks.postgres_cdc import PostgresCdcHook
from airflow_provider_cdc.offsets.base import StaleOffsetError

#: A schema of its own, which the capture role creates (and so owns) when it may create schemas:
#: nobody else's objects beside it, nothing for another role to pre-create in ``public``.
DEFAULT_OFFSET_TABLE = "cdc_state.offsets"
#: The columns of the table, in order, as ``format_type`` names them (search_path pg_catalog).
COLUMNS = (
    ("capture", "text"),
    ("revision", "bigint"),
    ("document", "jsonb"),
    ("updated_at", "timestamp with time zone"),
)
#: The only column default accepted: the one the store's CREATE TABLE gives.
DEFAULTS = {"updated_at": "now()"}
#: Nothing the store's statements call (``=``, ``::jsonb``, ``now()``) can be shadowed.
SAFE_SEARCH_PATH = "SET search_path = pg_catalog, pg_temp"
_RELKINDS = {
    "v": "a view",
    "m": "a materialized view",
    "p": "a partitioned table",
    "f": "a foreign table",
    "S": "a sequence",
    "c": "a composite type",
    "i": "an index",
    "I": "a partitioned index",
    "t": "a TOAST table",
}

_SCHEMA_FACTS = """
SELECT current_user::text, n.oid IS NOT NULL, so.rolname::text, coalesce(so.rolsuper, false),
       dbo.rolname::text, dbo.rolsuper
FROM pg_database d
JOIN pg_roles dbo ON dbo.oid = d.datdba
LEFT JOIN pg_namespace n ON n.nspname = %(schema)s
LEFT JOIN pg_roles so ON so.oid = n.nspowner
WHERE d.datname = current_database()
"""

_TABLE_FACTS = """
SELECT c.relkind::text, o.rolname::text, o.rolsuper, c.relrowsecurity, c.relispartition,
  EXISTS (SELECT FROM pg_inherits i WHERE i.inhrelid = c.oid OR i.inhparent = c.oid),
  array(SELECT t.tgname::text FROM pg_trigger t WHERE t.tgrelid = c.oid AND NOT t.tgisinternal ORDER BY 1),
  array(SELECT r.rulename::text FROM pg_rewrite r WHERE r.ev_class = c.oid ORDER BY 1),
  array(SELECT p.polname::text FROM pg_policy p WHERE p.polrelid = c.oid ORDER BY 1),
  array(SELECT a.attname::text || ' ' || format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
        WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum),
  array(SELECT a.attname::text || ' ' || pg_get_expr(d.adbin, d.adrelid) FROM pg_attrdef d
        JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
        WHERE d.adrelid = c.oid ORDER BY a.attnum),
  array(SELECT x.relname::text FROM pg_index i JOIN pg_class x ON x.oid = i.indexrelid
        WHERE i.indrelid = c.oid AND (i.indexprs IS NOT NULL OR i.indpred IS NOT NULL) ORDER BY 1),
  array(SELECT k.conname::text FROM pg_constraint k
        WHERE k.conrelid = c.oid AND k.contype NOT IN ('p', 'u', 'n') ORDER BY 1),
  EXISTS (SELECT FROM pg_index i JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'capture'
          WHERE i.indrelid = c.oid AND i.indisunique AND i.indnkeyatts = 1 AND i.indkey[0] = a.attnum
            AND i.indexprs IS NULL AND i.indpred IS NULL),
  array(SELECT DISTINCT coalesce(g.rolname::text, 'PUBLIC') || '/' || coalesce(g.rolsuper, false)::text
        FROM aclexplode(c.relacl) x LEFT JOIN pg_roles g ON g.oid = x.grantee
        WHERE x.privilege_type = 'TRIGGER')
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_roles o ON o.oid = c.relowner
WHERE n.nspname = %(schema)s AND c.relname = %(table)s
"""


@dataclass(frozen=True)
class _Trust:
    """Who may own the table and its schema: the capture role, the named owner, superusers."""

    user: str
    owner: str | None

    def trusts(self, role: str | None, superuser: bool) -> bool:
        return bool(superuser) or role in (self.user, self.owner)

    def describe(self) -> str:
        named = f" or offset_table_owner {self.owner!r}" if self.owner and self.owner != self.user else ""
        return f"the capture role {self.user!r}{named} (or a superuser)"


class PostgresStateTableOffsetStore:
    """The offset of each capture in a row of ``table``, owned by the capture role or by ``owner``
    (see the module docstring for what is checked before every read and write)."""

    def __init__(self, postgres_conn_id: str, table: str = DEFAULT_OFFSET_TABLE, owner: str | None = None):
        self.postgres_conn_id = postgres_conn_id
        self.table = TableRef.parse(table)
        self.owner = owner or None

    @cached_property
    def hook(self) -> PostgresCdcHook:
        return PostgresCdcHook(self.postgres_conn_id)

    @contextmanager
    def _session(self) -> Iterator[Any]:
        with self.hook.session() as conn:
            conn.execute(SAFE_SEARCH_PATH)
            yield conn

    # -- the checks ------------------------------------------------------------------------------

    def _check_safe(self, conn) -> bool:
        """Refuse a table (or schema) someone untrusted could attach code to; True if the table exists."""
        user, schema_exists, schema_owner, schema_super, db_owner, db_super = conn.execute(
            _SCHEMA_FACTS, {"schema": self.table.schema}
        ).fetchone()
        if not schema_exists:
            return False
        trust = _Trust(user, self.owner)
        problems: list[str] = []
        schema = quote_ident(self.table.schema)
        via = ""
        if schema_owner == "pg_database_owner":  # PostgreSQL 15+'s public schema: the database owner
            schema_owner, schema_super, via = db_owner, db_super, " (the database's owner, as pg_database_owner)"
        if not trust.trusts(schema_owner, schema_super):
            problems.append(
                f"its schema {schema} is owned by role {schema_owner!r}{via}, which can drop the table and put "
                f"another in its place: use a schema owned by {trust.describe()}"
                + ("" if self.owner else f", or set offset_table_owner={schema_owner!r} if that role is trusted")
                + f", or have an administrator run: ALTER SCHEMA {schema} OWNER TO {quote_ident(self.owner or user)}"
            )
        row = conn.execute(_TABLE_FACTS, {"schema": self.table.schema, "table": self.table.name}).fetchone()
        if row is not None:
            problems += self._table_problems(trust, row)
        if problems:
            raise CdcConfigurationError(
                f"the offset table {self.table} (offset_table) is not safe to use (code attached to it would run "
                "as the capture role); nothing was read or written: "
                + "; ".join(f"({n}) {p}" for n, p in enumerate(problems, 1))
            )
        return row is not None

    def _table_problems(self, trust: _Trust, row: tuple) -> list[str]:
        (relkind, owner, owner_super, rls, partition, inherits, triggers, rules, policies, columns, defaults,
         indexes, constraints, unique_capture, trigger_grants) = row  # fmt: skip
        table, problems = self.table, []
        if not trust.trusts(owner, owner_super):
            problems.append(
                f"it is owned by role {owner!r}, not by {trust.describe()}: its owner can attach triggers, rules "
                f"or defaults that run as the capture role. If {owner!r} is trusted with that, set "
                f"offset_table_owner={owner!r}; otherwise have an administrator inspect it and drop it (the "
                f"capture creates its own), or run: ALTER TABLE {table} OWNER TO {quote_ident(trust.user)}"
            )
        if relkind != "r" or partition or inherits:
            what = _RELKINDS.get(relkind, "a partition" if partition else "part of an inheritance tree")
            problems.append(
                f"it is {what}, not a plain table: drop it (the capture creates its own) or choose another offset_table"
            )
            return problems  # its columns and the rest are beside the point
        problems += [f"trigger {quote_ident(t)}: DROP TRIGGER {quote_ident(t)} ON {table}" for t in triggers]
        problems += [f"rule {quote_ident(r)}: DROP RULE {quote_ident(r)} ON {table}" for r in rules]
        problems += [f"policy {quote_ident(p)}: DROP POLICY {quote_ident(p)} ON {table}" for p in policies]
        if rls:
            problems.append(f"row level security is enabled: ALTER TABLE {table} DISABLE ROW LEVEL SECURITY")
        expected = [f"{name} {kind}" for name, kind in COLUMNS]
        if list(columns) != expected:
            problems.append(
                f"its columns are ({', '.join(columns)}), expected exactly ({', '.join(expected)}): drop it "
                "(the capture creates its own) or choose another offset_table"
            )
        for default in defaults:
            column, expression = default.split(" ", 1)
            if DEFAULTS.get(column) != expression:
                fix = f"SET DEFAULT {DEFAULTS[column]}" if column in DEFAULTS else "DROP DEFAULT"
                problems.append(
                    f"column {quote_ident(column)} has the default (or generated value) {expression}: "
                    f"ALTER TABLE {table} ALTER COLUMN {quote_ident(column)} {fix}"
                )
        schema = quote_ident(table.schema)
        problems += [
            f"index {quote_ident(i)} has an expression or a predicate: DROP INDEX {schema}.{quote_ident(i)}"
            for i in indexes
        ]
        problems += [
            f"constraint {quote_ident(c)}: ALTER TABLE {table} DROP CONSTRAINT {quote_ident(c)}" for c in constraints
        ]
        if not unique_capture and list(columns) == expected:
            problems.append(f"it has no primary key on capture: ALTER TABLE {table} ADD PRIMARY KEY (capture)")
        for grant in trigger_grants:
            grantee, superuser = grant.rsplit("/", 1)
            if grantee != owner and not trust.trusts(grantee, superuser == "true"):
                target = "PUBLIC" if grantee == "PUBLIC" else quote_ident(grantee)
                problems.append(f"role {grantee!r} may create triggers on it: REVOKE TRIGGER ON {table} FROM {target}")
        return problems

    def _check_privileges(self, conn) -> None:
        """Before anything is written: name the GRANT the role needs to create or use the table."""
        row = conn.execute(
            "SELECT current_user, has_schema_privilege(n.oid, 'USAGE'), has_schema_privilege(n.oid, 'CREATE'), "
            "EXISTS (SELECT FROM pg_class c WHERE c.relnamespace = n.oid AND c.relname = %s), "
            "array(SELECT p FROM unnest(ARRAY['SELECT', 'INSERT', 'UPDATE']) AS p, pg_class c "
            "      WHERE c.relnamespace = n.oid AND c.relname = %s AND NOT has_table_privilege(c.oid, p)) "
            "FROM pg_namespace n WHERE n.nspname = %s",
            (self.table.name, self.table.name, self.table.schema),
        ).fetchone()
        if row is None:
            return  # no such schema: creating the table says so
        user, usage, create, exists, missing = row
        role, schema = quote_ident(user), quote_ident(self.table.schema)
        fixes = [f"GRANT USAGE ON SCHEMA {schema} TO {role}"] if not usage else []
        fixes += [f"GRANT CREATE ON SCHEMA {schema} TO {role}"] if not exists and not create else []
        fixes += [f"GRANT {', '.join(missing)} ON {self.table} TO {role}"] if missing else []
        if fixes:
            raise CdcConfigurationError(
                f"role {user!r} cannot {'use' if exists else 'create'} the offset table {self.table} "
                f"(offset_table). Run: {'; '.join(fixes)}"
                + ("" if exists else " (or have an administrator create it and GRANT SELECT, INSERT, UPDATE on it)")
            )

    def _schema_plan(self, conn) -> bool:
        """Does the table's schema exist? If not, may this role create it (``CREATE`` on the
        database)? Otherwise the error names the statement an administrator runs."""
        exists, may_create, user = conn.execute(
            "SELECT to_regnamespace(%s) IS NOT NULL, has_database_privilege(current_database(), 'CREATE'), "
            "current_user",
            (quote_ident(self.table.schema),),
        ).fetchone()
        if exists:
            return True
        if not may_create:
            raise CdcConfigurationError(
                f"cannot create the offset table {self.table} (offset_table): schema {quote_ident(self.table.schema)} "
                f"does not exist and role {user!r} may not create schemas. Have an administrator run: CREATE SCHEMA "
                f"{quote_ident(self.table.schema)} AUTHORIZATION {quote_ident(user)}; or choose another offset_table"
            )
        return False

    def _open(self, conn) -> None:
        """The checks, then the schema and table created if they are missing (and checked again: a
        table someone else made meanwhile is not taken over by ``IF NOT EXISTS``)."""
        exists = self._check_safe(conn)
        if not exists and not self._schema_plan(conn):
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.table.schema)))
            self._check_safe(conn)  # a schema someone else made meanwhile is checked like any other
        self._check_privileges(conn)
        if exists:
            return
        try:
            conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} (capture text PRIMARY KEY, revision bigint NOT NULL, "
                    "document jsonb NOT NULL, updated_at timestamptz NOT NULL DEFAULT now())"
                ).format(pg_identifier(self.table))
            )
        except (psycopg.errors.InvalidSchemaName, psycopg.errors.InsufficientPrivilege) as exc:
            raise CdcConfigurationError(
                f"cannot create the offset table {self.table} (offset_table): {first_line(exc)}. "
                "Create its schema, grant CREATE on it, or choose another offset_table"
            ) from None
        self._check_safe(conn)

    # -- the store -------------------------------------------------------------------------------

    def peek(self, capture: str) -> str | None:
        """The stored document, read without creating the table (setup's checks): fails like
        creating it would (a missing schema, a missing grant, a table or schema that is not safe),
        and finds nothing while it is absent."""
        with self._session() as conn:
            exists = self._check_safe(conn)
            if not self._schema_plan(conn):
                return None  # the first save creates the schema and the table
            self._check_privileges(conn)
            if not exists:
                return None
            row = conn.execute(
                sql.SQL("SELECT document::text FROM {} WHERE capture = %s").format(pg_identifier(self.table)),
                (capture,),
            ).fetchone()
        return None if row is None else row[0]

    def load(self, capture: str) -> str | None:
        with self._session() as conn:
            self._open(conn)
            row = conn.execute(
                sql.SQL("SELECT document::text FROM {} WHERE capture = %s").format(pg_identifier(self.table)),
                (capture,),
            ).fetchone()
        return None if row is None else row[0]

    def save(self, capture: str, document: str, *, revision: int, expected_revision: int | None) -> None:
        with self._session() as conn:
            self._open(conn)
            if expected_revision is None:
                cursor = conn.execute(
                    sql.SQL(
                        "INSERT INTO {} (capture, revision, document) VALUES (%s, %s, %s::jsonb) "
                        "ON CONFLICT (capture) DO NOTHING"
                    ).format(pg_identifier(self.table)),
                    (capture, revision, document),
                )
            else:
                cursor = conn.execute(
                    sql.SQL(
                        "UPDATE {} SET revision = %s, document = %s::jsonb, updated_at = now() "
                        "WHERE capture = %s AND revision = %s"
                    ).format(pg_identifier(self.table)),
                    (revision, document, capture, expected_revision),
                )
            if cursor.rowcount != 1:
                raise StaleOffsetError(
                    f"{self.describe(capture)} changed while this run was working (expected revision "
                    f"{expected_revision}); another run wrote it"
                )

    def delete(self, capture: str) -> None:
        with self._session() as conn:
            self._open(conn)
            conn.execute(sql.SQL("DELETE FROM {} WHERE capture = %s").format(pg_identifier(self.table)), (capture,))

    def describe(self, capture: str) -> str:
        return f"state table {self.table} (capture {capture!r}, connection {self.postgres_conn_id!r})"
