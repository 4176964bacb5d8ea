"""Offsets in a PostgreSQL table, written with an atomic compare-and-set.

The table is created on first use::

    CREATE TABLE IF NOT EXISTS <schema>.<table> (
        capture     text PRIMARY KEY,
        revision    bigint NOT NULL,
        document    jsonb NOT NULL,
        updated_at  timestamptz NOT NULL DEFAULT now()
    )

Keep it out of the captured tables' publication (the default ``filtered`` publication does).
"""

from __future__ import annotations

from functools import cached_property

import psycopg
from psycopg import sql

from airflow_provider_cdc.cdc.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.sources.postgres.connection import first_line
from airflow_provider_cdc.cdc.sources.postgres.tables import TableRef, pg_identifier, quote_ident
from airflow_provider_cdc.hooks.postgres_cdc import PostgresCdcHook
from airflow_provider_cdc.offsets.base import StaleOffsetError


class PostgresStateTableOffsetStore:
    def __init__(self, postgres_conn_id: str, table: str = "public.airflow_cdc_offsets"):
        self.postgres_conn_id = postgres_conn_id
        self.table = TableRef.parse(table)
        self._created = False

    @cached_property
    def hook(self) -> PostgresCdcHook:
        return PostgresCdcHook(self.postgres_conn_id)

    def _ensure_table(self, conn) -> None:
        if self._created:
            return
        self._check_privileges(conn)
        exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (self.table.quoted(),)).fetchone()[0]
        if not exists:
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
        self._created = True

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

    def peek(self, capture: str) -> str | None:
        """The stored document, read without creating the table (setup's checks): fails like
        creating it would (a missing schema, a missing grant), and finds nothing while it is absent."""
        with self.hook.session() as conn:
            self._check_privileges(conn)
            schema, table = conn.execute(
                "SELECT to_regnamespace(%s) IS NOT NULL, to_regclass(%s) IS NOT NULL",
                (quote_ident(self.table.schema), self.table.quoted()),
            ).fetchone()
            if not schema:
                raise CdcConfigurationError(
                    f"cannot create the offset table {self.table} (offset_table): schema "
                    f"{quote_ident(self.table.schema)} does not exist. Create its schema, grant CREATE on it, "
                    "or choose another offset_table"
                )
            if not table:
                return None
            row = conn.execute(
                sql.SQL("SELECT document::text FROM {} WHERE capture = %s").format(pg_identifier(self.table)),
                (capture,),
            ).fetchone()
        return None if row is None else row[0]

    def load(self, capture: str) -> str | None:
        with self.hook.session() as conn:
            self._ensure_table(conn)
            row = conn.execute(
                sql.SQL("SELECT document::text FROM {} WHERE capture = %s").format(pg_identifier(self.table)),
                (capture,),
            ).fetchone()
        return None if row is None else row[0]

    def save(self, capture: str, document: str, *, revision: int, expected_revision: int | None) -> None:
        with self.hook.session() as conn:
            self._ensure_table(conn)
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
        with self.hook.session() as conn:
            self._ensure_table(conn)
            conn.execute(sql.SQL("DELETE FROM {} WHERE capture = %s").format(pg_identifier(self.table)), (capture,))

    def describe(self, capture: str) -> str:
        return f"state table {self.table} (capture {capture!r}, connection {self.postgres_conn_id!r})"
