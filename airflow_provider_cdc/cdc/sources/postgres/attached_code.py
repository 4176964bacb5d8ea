"""Code attached to a table that runs as the role whose statement touches the table.

Whoever owns a table (and members of its owner's role, and a ``TRIGGER`` grantee) can attach code
to it that PostgreSQL runs with the privileges of the role whose statement fires it, not the
owner's: triggers (unless their function is ``SECURITY DEFINER``) and rules, row level security
policies, column defaults and generated columns, check constraints, index expressions and
predicates, and the checks and defaults of a domain used as a column's type. A table the capture
*writes* that another role owns would run that role's code as the capture role, which holds
REPLICATION (it can drop other consumers' slots, or create one to read every table).

:func:`table_code` reads all of that for one table from the catalog, in one statement, and
:func:`write_problems` says what makes the table unsafe to write, each with its fix:

- any trigger or rule (whoever wrote it: a trigger's function can be replaced by its owner at any
  time, without locking the table);
- row level security that applies to the capture role (its sessions run with
  ``row_security = off``, so its writes would fail);
- a default, generated column, constraint, index expression or predicate, or a column's domain
  whose expression calls a function (or an operator's function) owned by a role other than the
  capture role or a superuser: its owner can change what it does at any time; and a domain owned
  by such a role (it can add checks to it without locking the table);
- a relation that is not a plain table (a partition's key expressions, a partitioned table's
  partitions, a foreign table's wrapper are code or tables of their own).

The capture writes one table another role usually owns, the signal table (watermark rows of an
incremental snapshot with ``incremental_watermarks='insert_insert'``/``'insert_delete'``):
:class:`.chunks.Watermarks` locks it ``ROW EXCLUSIVE`` (which waits for, and then holds off,
``CREATE TRIGGER``, ``CREATE RULE``, ``ALTER TABLE``, ``CREATE INDEX``, ``CREATE POLICY``), checks it
with this module, writes and commits, in one transaction, every time; setup reports the same
problems (:func:`.admin.check_signal_table`). The offset state table's store
(:mod:`airflow_provider_cdc.offsets.state_table`) applies stricter rules of its own to its table,
which the capture role or a named trusted role must own.

The statement runs under the capture's ``search_path = pg_catalog, pg_temp`` and names every
catalog object qualified anyway.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from airflow_provider_cdc.cdc.sources.postgres.tables import TableRef

_RELKINDS = {
    "p": "a partitioned table",
    "v": "a view",
    "m": "a materialized view",
    "f": "a foreign table",
}


def _quoted(name: str) -> str:
    """SQL for ``name`` (a column of type name or text) double-quoted as an identifier, always."""
    return f"('\"' || pg_catalog.replace({name}::text, '\"', '\"\"') || '\"')"


# Trusted owners of code: superusers (who can run anything as anyone anyway) and the capture role.
_UNTRUSTED = "NOT (r.rolsuper OR r.rolname = current_user)"

TABLE_CODE_SQL = f"""
WITH RECURSIVE
t AS (
  SELECT c.oid FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
  WHERE n.nspname = %(schema)s AND c.relname = %(table)s
),
-- Each column's type, and the types inside it: a domain's base type, an array's elements, a
-- composite's attributes (a domain anywhere in there is checked when a row is written).
col_types(typid, attname) AS (
  SELECT a.atttypid, a.attname::text FROM pg_catalog.pg_attribute a JOIN t ON a.attrelid = t.oid
  WHERE a.attnum > 0 AND NOT a.attisdropped
  UNION
  SELECT inner_type.typid, ct.attname
  FROM col_types ct
  JOIN pg_catalog.pg_type ty ON ty.oid = ct.typid
  CROSS JOIN LATERAL (
    SELECT ty.typbasetype WHERE ty.typtype = 'd'
    UNION ALL SELECT ty.typelem WHERE ty.typcategory = 'A' AND ty.typelem <> 0
    UNION ALL SELECT a.atttypid FROM pg_catalog.pg_attribute a
      WHERE ty.typtype = 'c' AND a.attrelid = ty.typrelid AND a.attnum > 0 AND NOT a.attisdropped
  ) AS inner_type(typid)
),
domains AS (
  SELECT DISTINCT ty.oid, ty.typowner, ty.typdefaultbin IS NOT NULL AS has_default, ct.attname
  FROM col_types ct JOIN pg_catalog.pg_type ty ON ty.oid = ct.typid WHERE ty.typtype = 'd'
),
-- The catalog objects whose expressions a write evaluates, and what to call them.
holders(classid, objid, what) AS (
  SELECT 'pg_catalog.pg_attrdef'::pg_catalog.regclass, d.oid,
         'the default (or generated value) of column ' || {_quoted("a.attname")}
  FROM pg_catalog.pg_attrdef d JOIN t ON d.adrelid = t.oid
  JOIN pg_catalog.pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
  UNION ALL
  SELECT 'pg_catalog.pg_constraint'::pg_catalog.regclass, k.oid, 'constraint ' || {_quoted("k.conname")}
  FROM pg_catalog.pg_constraint k JOIN t ON k.conrelid = t.oid
  UNION ALL
  SELECT 'pg_catalog.pg_class'::pg_catalog.regclass, i.indexrelid, 'index ' || {_quoted("x.relname")}
  FROM pg_catalog.pg_index i JOIN t ON i.indrelid = t.oid JOIN pg_catalog.pg_class x ON x.oid = i.indexrelid
  UNION ALL
  SELECT 'pg_catalog.pg_constraint'::pg_catalog.regclass, k.oid,
         'constraint ' || {_quoted("k.conname")} || ' of domain ' || k.contypid::pg_catalog.regtype::text
         || ' (in the type of column ' || {_quoted("d.attname")} || ')'
  FROM domains d JOIN pg_catalog.pg_constraint k ON k.contypid = d.oid
  UNION ALL
  SELECT 'pg_catalog.pg_type'::pg_catalog.regclass, d.oid,
         'the default of domain ' || d.oid::pg_catalog.regtype::text
         || ' (in the type of column ' || {_quoted("d.attname")} || ')'
  FROM domains d WHERE d.has_default
),
-- The functions those expressions call, directly or through an operator.
calls(what, fn) AS (
  SELECT h.what, dep.refobjid FROM holders h
  JOIN pg_catalog.pg_depend dep ON dep.classid = h.classid AND dep.objid = h.objid
   AND dep.refclassid = 'pg_catalog.pg_proc'::pg_catalog.regclass
  UNION ALL
  SELECT h.what, o.oprcode::pg_catalog.oid FROM holders h
  JOIN pg_catalog.pg_depend dep ON dep.classid = h.classid AND dep.objid = h.objid
   AND dep.refclassid = 'pg_catalog.pg_operator'::pg_catalog.regclass
  JOIN pg_catalog.pg_operator o ON o.oid = dep.refobjid
)
SELECT c.relkind::text, c.relispartition, o.rolname::text, c.relrowsecurity, c.relforcerowsecurity,
  (SELECT me.rolsuper OR me.rolbypassrls FROM pg_catalog.pg_roles me WHERE me.rolname = current_user)
    OR (NOT c.relforcerowsecurity AND pg_catalog.pg_has_role(c.relowner, 'USAGE')),
  array(SELECT tg.tgname::text FROM pg_catalog.pg_trigger tg WHERE tg.tgrelid = c.oid AND NOT tg.tgisinternal
        ORDER BY 1),
  array(SELECT rw.rulename::text FROM pg_catalog.pg_rewrite rw WHERE rw.ev_class = c.oid ORDER BY 1),
  array(SELECT p.polname::text FROM pg_catalog.pg_policy p WHERE p.polrelid = c.oid ORDER BY 1),
  array(SELECT DISTINCT calls.what || ' calls ' || calls.fn::pg_catalog.regprocedure::text
                        || ', owned by role ' || pg_catalog.quote_literal(r.rolname)
        FROM calls JOIN pg_catalog.pg_proc f ON f.oid = calls.fn JOIN pg_catalog.pg_roles r ON r.oid = f.proowner
        WHERE {_UNTRUSTED}
        UNION
        SELECT 'column ' || {_quoted("d.attname")} || ' has domain ' || d.oid::pg_catalog.regtype::text
               || ' (in its type), owned by role ' || pg_catalog.quote_literal(r.rolname)
        FROM domains d JOIN pg_catalog.pg_roles r ON r.oid = d.typowner
        WHERE {_UNTRUSTED}
        ORDER BY 1)
FROM t
JOIN pg_catalog.pg_class c ON c.oid = t.oid
JOIN pg_catalog.pg_roles o ON o.oid = c.relowner
"""


@dataclass(frozen=True)
class TableCode:
    """What can run as the capture role when it writes ``table`` (see the module docstring)."""

    table: TableRef
    relkind: str
    partition: bool
    owner: str
    row_security: bool
    force_row_security: bool
    rls_exempt: bool  # the capture role bypasses the table's policies (superuser, BYPASSRLS, owner)
    triggers: tuple[str, ...]
    rules: tuple[str, ...]
    policies: tuple[str, ...]
    untrusted_calls: tuple[str, ...]  # expressions that call code (or use a domain) an untrusted role owns

    def write_problems(self) -> list[str]:
        """Why writing the table could run another role's code as the capture role (or would fail),
        each with the statement that fixes it; empty: safe to write."""
        table = str(self.table)
        if self.relkind != "r" or self.partition:
            other = "a partition" if self.partition else f"a relation of kind {self.relkind!r}"
            what = _RELKINDS.get(self.relkind, other)
            return [f"it is {what}, not a plain table: use a plain table"]
        problems = [f"trigger {_ident(t)}: DROP TRIGGER {_ident(t)} ON {table}" for t in self.triggers]
        problems += [f"rule {_ident(r)}: DROP RULE {_ident(r)} ON {table}" for r in self.rules]
        if self.row_security and not self.rls_exempt:
            policies = f" (policies {', '.join(_ident(p) for p in self.policies)})" if self.policies else ""
            problems.append(
                f"row level security is enabled{policies} and applies to the capture role: "
                f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY"
            )
        problems += [
            f"{call}: drop it, or have a superuser (or the capture role) own that code" for call in self.untrusted_calls
        ]
        return problems


def table_code(conn: Any, table: TableRef) -> TableCode | None:
    """The catalog's facts about ``table`` for :meth:`TableCode.write_problems`; None: no such table."""
    row = conn.execute(TABLE_CODE_SQL, {"schema": table.schema, "table": table.name}).fetchone()
    if row is None:
        return None
    relkind, partition, owner, rls, force, exempt, triggers, rules, policies, calls = row
    return TableCode(
        table, relkind, partition, owner, rls, force, bool(exempt), tuple(triggers), tuple(rules), tuple(policies),
        tuple(calls),
    )  # fmt: skip


def signal_table_write_problems(conn: Any, table: TableRef) -> list[str]:
    """What makes writing watermark rows into ``table`` run another role's code (see the
    module docstring); empty: nothing."""
    code = table_code(conn, table)
    return [] if code is None else code.write_problems()


def unsafe_signal_table_message(table: TableRef, mode: str, problems: list[str]) -> str:
    return (
        f"the signal table {table} has code attached that would run as the capture role when the incremental "
        f"snapshot writes its watermark rows into it (incremental_watermarks={mode!r}); nothing was written: "
        + "; ".join(f"({n}) {p}" for n, p in enumerate(problems, 1))
        + ". Or set incremental_watermarks='message' (the watermarks are then logical decoding messages, and "
        "the signal table is only read)"
    )


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
