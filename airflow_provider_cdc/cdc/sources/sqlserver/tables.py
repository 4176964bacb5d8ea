"""The captured tables as SQL Server knows them: their columns, keys and capture instances, found
by name (with the closest name offered for a missing one), and the ``sys.sp_cdc_enable_table`` /
``sp_cdc_disable_table`` calls a message tells an administrator to run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from airflow_provider_cdc.cdc.basics.tables import SQLSERVER_NAMES, TableRef, find_column, select_tables
from airflow_provider_cdc.cdc.sources.sqlserver.connection import (
    USER_SQL,
    error_number,
    quote,
    rows,
    server_said,
    value,
)
from airflow_provider_cdc.cdc.sources.sqlserver.lsn import SqlServerLsn, lsn_or_none
from airflow_provider_cdc.cdc.sources.sqlserver.types import CATALOG_SQL, SqlServerType


@dataclass(frozen=True)
class SqlColumn:
    name: str
    type: SqlServerType

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.type.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SqlColumn:
        return cls(data["name"], SqlServerType.from_json(data["type"]))


@dataclass(frozen=True)
class CaptureInstance:
    """One capture instance of a table (``cdc.change_tables``): its name, where its change rows
    start (``start_lsn``, raised by the cleanup job) and the columns it captures, in order."""

    name: str
    table: TableRef
    start_lsn: SqlServerLsn | None
    object_id: int
    index_name: str | None
    columns: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "table": self.table.to_json(),
            "start_lsn": None if self.start_lsn is None else int(self.start_lsn),
            "object_id": self.object_id,
            "index_name": self.index_name,
            "columns": list(self.columns),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CaptureInstance:
        return cls(
            name=data["name"],
            table=TableRef(*data["table"]),
            start_lsn=lsn_or_none(data.get("start_lsn")),
            object_id=int(data["object_id"]),
            index_name=data.get("index_name"),
            columns=tuple(data["columns"]),
        )


@dataclass(frozen=True)
class TableInfo:
    """A captured table: its columns (as the table has them now), key and capture instances
    (oldest first: after a schema change the newer one takes over at its ``start_lsn``)."""

    ref: TableRef
    columns: tuple[SqlColumn, ...]
    key_columns: tuple[str, ...]
    instances: tuple[CaptureInstance, ...]

    def column(self, name: str) -> SqlColumn:
        return find_column(self.columns, name)

    def to_json(self) -> dict[str, Any]:
        return {
            "ref": self.ref.to_json(),
            "columns": [c.to_json() for c in self.columns],
            "key_columns": list(self.key_columns),
            "instances": [i.to_json() for i in self.instances],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TableInfo:
        return cls(
            ref=TableRef(*data["ref"]),
            columns=tuple(SqlColumn.from_json(c) for c in data["columns"]),
            key_columns=tuple(data["key_columns"]),
            instances=tuple(CaptureInstance.from_json(i) for i in data["instances"]),
        )


INSTANCES_SQL = (
    "SELECT s.name, t.name, ct.capture_instance, ct.start_lsn, ct.object_id, ct.index_name, ct.create_date "
    "FROM cdc.change_tables ct "
    "JOIN sys.tables t ON ct.source_object_id = t.object_id "
    "JOIN sys.schemas s ON t.schema_id = s.schema_id "
    "ORDER BY s.name, t.name, ct.create_date, ct.capture_instance"
)


#: Computed columns are always NULL in change rows (Learn, cdc.fn_cdc_get_all_changes_<capture_instance>):
#: not captured (types.CATALOG_SQL leaves them out of the table too).
CAPTURED_COLUMNS_SQL = (
    "SELECT column_name FROM cdc.captured_columns WHERE object_id = ? AND is_computed = 0 ORDER BY column_ordinal"
)


#: Every captured column, computed ones included: reading change data needs SELECT on all of them.
ALL_CAPTURED_COLUMNS_SQL = "SELECT column_name FROM cdc.captured_columns WHERE object_id = ? ORDER BY column_ordinal"


#: Change tables written before SQL Server added __$command_id (KB3030352: a cumulative update of
#: 2012-2016, applied to existing change tables by sp_vupgrade_replication) lack the column.
WITHOUT_COMMAND_ID_SQL = (
    "SELECT ct.capture_instance FROM cdc.change_tables ct WHERE NOT EXISTS (SELECT 1 FROM sys.columns c "
    "WHERE c.object_id = ct.object_id AND c.name = N'__$command_id') ORDER BY ct.capture_instance"
)


_KEY_COLUMNS = (
    "SELECT c.name FROM sys.indexes i "
    "JOIN sys.index_columns ic ON ic.object_id = i.object_id AND ic.index_id = i.index_id "
    "JOIN sys.columns c ON c.object_id = ic.object_id AND c.column_id = ic.column_id "
    "JOIN sys.tables t ON t.object_id = i.object_id JOIN sys.schemas s ON s.schema_id = t.schema_id "
    "WHERE s.name = ? AND t.name = ? AND ic.key_ordinal > 0 AND "
)


#: The primary key's columns; with @index_name, that unique index's (Debezium's rule).
PRIMARY_KEY_SQL = _KEY_COLUMNS + "i.is_primary_key = 1 ORDER BY ic.key_ordinal"


INDEX_KEY_SQL = _KEY_COLUMNS + "i.name = ? ORDER BY ic.key_ordinal"


#: User tables a pattern may match: not SQL Server's own, not CDC's (its change tables, and
#: dbo.systranschemas, which sp_cdc_enable_db creates: Debezium leaves it out by name,
#: SqlServerConnectorConfig.SystemTablesPredicate, as its is_ms_shipped flag is not documented).
TABLES_SQL = (
    "SELECT s.name, t.name FROM sys.tables t JOIN sys.schemas s ON s.schema_id = t.schema_id "
    "WHERE t.is_ms_shipped = 0 AND s.name <> N'cdc' AND t.name <> N'systranschemas'"
)


def capture_instances(conn: Any) -> dict[TableRef, list[CaptureInstance]]:
    """Every capture instance of the database, per table, oldest first: by ``start_lsn``, and by
    ``create_date`` where a cleanup raised both of a table's instances to one low water mark (as
    Debezium picks the newest: ``ORDER BY ct.create_date DESC`` in SqlServerConnection). Never by
    name: a new instance may be named anything."""
    out: dict[TableRef, list[tuple[tuple[Any, ...], CaptureInstance]]] = {}
    for schema, table, name, start_lsn, object_id, index_name, created in rows(conn, INSTANCES_SQL):
        ref = TableRef(schema, table)
        columns = tuple(r[0] for r in rows(conn, CAPTURED_COLUMNS_SQL, object_id))
        instance = CaptureInstance(name, ref, lsn_or_none(start_lsn), int(object_id), index_name, columns)
        out.setdefault(ref, []).append(((instance.start_lsn or 0, created), instance))
    return {ref: [i for _, i in sorted(found, key=lambda pair: pair[0])] for ref, found in out.items()}


def resolve_tables(
    conn: Any, explicit: Sequence[TableRef], include: Sequence[str] = (), exclude: Sequence[str] = ()
) -> tuple[TableRef, ...]:
    """The captured tables: ``explicit`` ones, or every user table matching ``include``, minus
    ``exclude`` matches (:func:`cdc.tables.select_tables`)."""
    return select_tables(
        explicit, lambda: [TableRef(s, t) for s, t in rows(conn, TABLES_SQL)], include, exclude, example="dbo\\.order.*"
    )


def table_columns(conn: Any, ref: TableRef) -> tuple[SqlColumn, ...]:
    return tuple(
        SqlColumn(name, SqlServerType(str(type_name).lower(), int(max_length), int(precision), int(scale)))
        for name, type_name, max_length, precision, scale, _nullable, _computed in rows(
            conn, CATALOG_SQL, ref.schema, ref.name
        )
    )


def describe_tables(
    conn: Any, refs: Sequence[TableRef], *, cdc_enabled: bool = True
) -> tuple[dict[TableRef, TableInfo], list[str]]:
    """The catalog description of each of ``refs``, and a problem (with its fix) for each that
    cannot be captured: missing (with the likely intended name), a view, no capture instance, no
    key, a key column the instance does not capture, a captured column missing. With
    ``cdc_enabled`` False (CDC is not enabled on the database, so there is no ``cdc`` schema) every
    existing table is reported as needing its capture instance, to be created after the database's."""
    try:
        instances = capture_instances(conn) if cdc_enabled else {}
    except Exception as exc:
        if error_number(exc) != 229:
            raise
        user = quote(str(value(conn, USER_SQL)))
        return {}, [
            f"the capture login (database user {user}) cannot read CDC's catalog (cdc.change_tables: "
            f"{server_said(exc)}), where the capture instances are listed. "
            f"Run: GRANT SELECT ON SCHEMA::[cdc] TO {user};"
        ]
    existing = {TableRef(s, t) for s, t in rows(conn, TABLES_SQL)}
    found: dict[TableRef, TableInfo] = {}
    problems: list[str] = []
    missing = [r for r in refs if r not in existing]
    if missing:
        problems.append(_missing_tables(conn, missing, existing))
    for ref in refs:
        if ref in missing:
            continue
        name = ref.quoted(SQLSERVER_NAMES)
        table_instances = tuple(instances.get(ref, ()))
        if not table_instances:
            problems.append(
                f"table {name} has no capture instance: CDC is not enabled on it. Run: {_enable_table(ref)}"
            )
            continue
        # Only columns some capture instance records (@captured_column_list): the others have no change
        # data, so events (the snapshot's too) leave them out, as Debezium does (docs/sqlserver-standin.md).
        captured = {c for instance in table_instances for c in instance.columns}
        source_columns = table_columns(conn, ref)
        columns = tuple(c for c in source_columns if c.name in captured)
        newest = table_instances[-1]
        index_name = newest.index_name
        key = tuple(
            r[0]
            for r in (
                rows(conn, INDEX_KEY_SQL, ref.schema, ref.name, index_name)
                if index_name
                else rows(conn, PRIMARY_KEY_SQL, ref.schema, ref.name)
            )
        )
        if not key:
            unique = [r[0] for r in rows(conn, UNIQUE_INDEXES_SQL, ref.schema, ref.name)]
            index = unique[0] if unique else "<a unique index>"
            problems.append(
                f"table {name} has no primary key and its capture instance {newest.name!r} names no unique index "
                f"(@index_name): change events need a key. Add a primary key (ALTER TABLE {name} ADD PRIMARY KEY "
                f"(<key columns>)), or re-create the capture instance on a unique index"
                f"{' (the table has ' + ', '.join(map(quote, unique)) + ')' if unique else ''}: "
                f"{_disable_table(ref, newest.name)} {_enable_table(ref, newest.name, index_name=index)}"
            )
            continue
        names = {c.name for c in source_columns}
        gone = [c for c in newest.columns if c not in names]
        if gone:
            problems.append(
                f"capture instance {newest.name!r} of {name} captures column(s) {', '.join(map(quote, gone))} "
                "the table no longer has. Create a capture instance for the table's current columns (at most two "
                f"per table; the capture switches to it): {_enable_table(ref, '<new instance name>')} Once this "
                f"capture has read past its start, drop the old one: {_disable_table(ref, newest.name)}"
            )
        uncaptured_keys = [k for k in key if k not in newest.columns]
        if uncaptured_keys:
            captured = [*newest.columns, *(k for k in uncaptured_keys if k in names)]
            problems.append(
                f"capture instance {newest.name!r} of {name} does not capture key column(s) "
                f"{', '.join(map(quote, uncaptured_keys))}: change events need the key. Re-create it with the key "
                f"in @captured_column_list: {_disable_table(ref, newest.name)} "
                + _enable_table(
                    ref, newest.name, index_name=index_name, captured_column_list=", ".join(map(quote, captured))
                )
            )
            continue
        found[ref] = TableInfo(ref, columns, key, table_instances)
    return found, problems


UNIQUE_INDEXES_SQL = (
    "SELECT i.name FROM sys.indexes i JOIN sys.tables t ON t.object_id = i.object_id "
    "JOIN sys.schemas s ON s.schema_id = t.schema_id "
    "WHERE s.name = ? AND t.name = ? AND i.is_unique = 1 AND i.is_primary_key = 0 ORDER BY i.name"
)


VIEWS_SQL = (
    "SELECT s.name, o.name FROM sys.objects o JOIN sys.schemas s ON s.schema_id = o.schema_id WHERE o.type = 'V'"
)


def _missing_tables(conn: Any, missing: Sequence[TableRef], existing: set[TableRef]) -> str:
    """The tables not found, each with what it probably is: a view, or a misspelt table."""
    views = {TableRef(s, t) for s, t in rows(conn, VIEWS_SQL)}
    described = []
    for ref in missing:
        text = ref.quoted(SQLSERVER_NAMES)
        if ref in views:
            text += " (a view: change data capture records tables only; capture the tables it reads instead)"
        else:
            guess = _closest(ref, existing)
            if guess is not None:
                text += f" (did you mean {guess.quoted(SQLSERVER_NAMES)}?)"
        described.append(text)
    return (
        f"these tables do not exist (or are not visible to the capture login): {', '.join(described)}. Check the "
        "spelling and the schema (a name without one is in dbo); quote names that contain dots or spaces with "
        "brackets: [my.schema].[my table]"
    )


def _closest(ref: TableRef, candidates: set[TableRef]) -> TableRef | None:
    """The existing table ``ref`` most likely meant: the same name in another case, else the
    closest spelling (as ``schema.table``), else the same name in another schema."""
    import difflib

    by_name = {c.data_collection.lower(): c for c in sorted(candidates)}
    wanted = ref.data_collection.lower()
    if wanted in by_name:
        return by_name[wanted]
    close = difflib.get_close_matches(wanted, list(by_name), n=1, cutoff=0.75)
    if close:
        return by_name[close[0]]
    same_name = sorted(c for c in candidates if c.name.lower() == ref.name.lower())
    return same_name[0] if len(same_name) == 1 else None


def _enable_table(
    ref: TableRef,
    capture_instance: str | None = None,
    *,
    index_name: str | None = None,
    captured_column_list: str | None = None,
) -> str:
    """The ``sys.sp_cdc_enable_table`` call that creates a capture instance of ``ref``."""
    arguments = [f"@source_schema = {_nstring(ref.schema)}", f"@source_name = {_nstring(ref.name)}"]
    if capture_instance is not None:
        arguments.append(f"@capture_instance = {_nstring(capture_instance)}")
    if index_name is not None:
        arguments.append(f"@index_name = {_nstring(index_name)}")
    if captured_column_list is not None:
        arguments.append(f"@captured_column_list = {_nstring(captured_column_list)}")
    arguments.append("@role_name = NULL")
    return f"EXEC sys.sp_cdc_enable_table {', '.join(arguments)};"


def _disable_table(ref: TableRef, capture_instance: str) -> str:
    return (
        f"EXEC sys.sp_cdc_disable_table @source_schema = {_nstring(ref.schema)}, @source_name = "
        f"{_nstring(ref.name)}, @capture_instance = {_nstring(capture_instance)};"
    )


def _nstring(text: str) -> str:
    return f"N'{_literal(text)}'"


def _literal(text: str) -> str:
    return text.replace("'", "''")
