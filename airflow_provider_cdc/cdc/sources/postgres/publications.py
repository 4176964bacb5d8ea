"""The publication a capture reads through: what it publishes, created or checked for the captured
tables and operations (mode ``filtered``, ``all_tables`` or ``disabled``), dropped; the privileges
creating one needs, each missing one named with its fix.
"""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql

from airflow_provider_cdc.cdc.basics.errors import (
    CdcConfigurationError,
    PublicationError,
)
from airflow_provider_cdc.cdc.sources.postgres import PUBLICATION_MODES
from airflow_provider_cdc.cdc.sources.postgres.tables import (
    TableRef,
    pg_identifier,
    sql_ident,
)


def drop_publication(conn, name: str) -> bool:
    if publication_tables(conn, name) is None:
        return False
    conn.execute(f"DROP PUBLICATION {sql_ident(name)}")
    return True


def publication_tables(conn, name: str) -> tuple[bool, set[TableRef], dict[str, bool]] | None:
    """(all_tables, tables, publish flags) of a publication, or None if it does not exist."""
    row = conn.execute(
        "SELECT puballtables, pubinsert, pubupdate, pubdelete, pubtruncate FROM pg_publication WHERE pubname = %s",
        (name,),
    ).fetchone()
    if row is None:
        return None
    tables = {
        TableRef(s, t)
        for s, t in conn.execute(
            "SELECT schemaname::text, tablename::text FROM pg_publication_tables WHERE pubname = %s", (name,)
        )
    }
    flags = {"insert": row[1], "update": row[2], "delete": row[3], "truncate": row[4]}
    return row[0], tables, flags


def ensure_publication(conn, name: str, refs: Sequence[TableRef], mode: str = "filtered") -> str:
    """Create or verify the publication; returns what was done ('created', 'altered', 'verified').

    ``filtered`` creates ``FOR TABLE <captured>`` and adds missing captured tables to an existing
    publication; ``all_tables`` creates ``FOR ALL TABLES``; ``disabled`` never changes anything.
    """
    if mode not in PUBLICATION_MODES:
        raise CdcConfigurationError(
            f"publication_autocreate_mode {mode!r} is not one of {', '.join(PUBLICATION_MODES)}"
        )
    existing = publication_tables(conn, name)
    if existing is None:
        if mode == "disabled":
            raise PublicationError(_absent_publication(name, refs))
        _require_publication_privileges(conn, name, refs, mode, create=True)
        if mode == "all_tables":
            conn.execute(sql.SQL("CREATE PUBLICATION {} FOR ALL TABLES").format(sql.Identifier(name)))
        else:
            conn.execute(
                sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
                    sql.Identifier(name), sql.SQL(", ").join(pg_identifier(r) for r in refs)
                )
            )
        return "created"
    all_tables, tables, _flags = existing
    missing = [r for r in refs if not all_tables and r not in tables]
    if missing and mode == "filtered":
        _require_publication_privileges(conn, name, missing, mode, create=False)
        conn.execute(
            sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(
                sql.Identifier(name), sql.SQL(", ").join(pg_identifier(r) for r in missing)
            )
        )
        return "altered"
    verify_publication(conn, name, refs)
    return "verified"


def verify_publication(conn, name: str, refs: Sequence[TableRef]) -> None:
    existing = publication_tables(conn, name)
    if existing is None:
        raise PublicationError(f"publication {name!r} does not exist; run the setup task to create it")
    all_tables, tables, flags = existing
    missing = [r for r in refs if not all_tables and r not in tables]
    if missing:
        raise PublicationError(_tables_not_published(name, missing))
    off = [op for op in ("insert", "update", "delete") if not flags[op]]
    if off:
        raise PublicationError(_operations_not_published(name, off))


def publication_problems(conn, name: str, refs: Sequence[TableRef], mode: str = "filtered") -> list[str]:
    """What :func:`ensure_publication` would refuse, found without changing anything: a missing
    publication it may not create, tables it may not (or must not) add, operations not published."""
    existing = publication_tables(conn, name)
    if existing is None:
        if mode == "disabled":
            return [_absent_publication(name, refs)]
        problem = _publication_privilege_problem(conn, name, refs, mode, create=True)
        return [problem] if problem else []
    all_tables, tables, flags = existing
    problems = []
    missing = [r for r in refs if not all_tables and r not in tables]
    if missing and mode == "filtered":
        problem = _publication_privilege_problem(conn, name, missing, mode, create=False)
        problems += [problem] if problem else []
    elif missing:
        problems.append(_tables_not_published(name, missing))
    off = [op for op in ("insert", "update", "delete") if not flags[op]]
    if off:
        problems.append(_operations_not_published(name, off))
    return problems


def _absent_publication(name: str, refs: Sequence[TableRef]) -> str:
    return (
        f"publication {name!r} does not exist and publication_autocreate_mode is 'disabled'. "
        f"Create it: CREATE PUBLICATION {sql_ident(name)} FOR TABLE {', '.join(str(r) for r in refs)}"
    )


def _tables_not_published(name: str, missing: Sequence[TableRef]) -> str:
    tables = ", ".join(str(r) for r in missing)
    return (
        f"publication {name!r} does not contain {tables}; changes to them would be silently missed. "
        f"Run: ALTER PUBLICATION {sql_ident(name)} ADD TABLE {tables}"
    )


def _operations_not_published(name: str, off: Sequence[str]) -> str:
    return (
        f"publication {name!r} does not publish {', '.join(off)}; those changes would be missed. "
        f"Run: ALTER PUBLICATION {sql_ident(name)} SET (publish = 'insert, update, delete, truncate')"
    )


def _require_publication_privileges(conn, name: str, refs: Sequence[TableRef], mode: str, *, create: bool) -> None:
    """Fail naming the statements to run when the role may not create (or add tables to) the publication."""
    problem = _publication_privilege_problem(conn, name, refs, mode, create=create)
    if problem:
        raise PublicationError(problem)


def _publication_privilege_problem(conn, name: str, refs: Sequence[TableRef], mode: str, *, create: bool) -> str | None:
    """The statements to run when the role may not create (or add tables to) the publication."""
    user, database, superuser, can_create, owns_publication = conn.execute(
        "SELECT current_user, current_database(), r.rolsuper, has_database_privilege(current_database(), 'CREATE'), "
        "(SELECT pg_has_role(p.pubowner, 'USAGE') FROM pg_publication p WHERE p.pubname = %s) "
        "FROM pg_roles r WHERE r.rolname = current_user",
        (name,),
    ).fetchone()
    if superuser:
        return None
    role, tables = sql_ident(user), ", ".join(str(r) for r in refs)
    if create and mode == "all_tables":
        needs, fixes = "FOR ALL TABLES needs a superuser", []
        statement = f"CREATE PUBLICATION {sql_ident(name)} FOR ALL TABLES"
    else:
        not_owned = conn.execute(
            "SELECT w.s, w.t FROM unnest(%s::text[], %s::text[]) AS w(s, t) JOIN pg_namespace n ON n.nspname = w.s "
            "JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = w.t WHERE NOT pg_has_role(c.relowner, 'USAGE')",
            ([r.schema for r in refs], [r.name for r in refs]),
        ).fetchall()
        fixes = [f"ALTER TABLE {TableRef(s, t)} OWNER TO {role}" for s, t in not_owned]
        if create:
            needs = "CREATE PUBLICATION ... FOR TABLE needs CREATE on the database and ownership of every table"
            fixes[:0] = [] if can_create else [f"GRANT CREATE ON DATABASE {sql_ident(database)} TO {role}"]
            statement = f"CREATE PUBLICATION {sql_ident(name)} FOR TABLE {tables}"
        else:
            needs = "ALTER PUBLICATION ... ADD TABLE needs ownership of the publication and of the tables"
            fixes[:0] = [] if owns_publication else [f"ALTER PUBLICATION {sql_ident(name)} OWNER TO {role}"]
            statement = f"ALTER PUBLICATION {sql_ident(name)} ADD TABLE {tables}"
        if not fixes:
            return None
    return (
        f"role {user!r} may not {'create' if create else 'alter'} publication {name!r} ({needs}). "
        + (f"Run: {'; '.join(fixes)}. Or have" if fixes else "Have")
        + f" an administrator run: {statement}; and set publication_autocreate_mode='disabled'"
    )
