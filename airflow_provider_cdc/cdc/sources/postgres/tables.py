"""PostgreSQL tables: their shape as the catalog describes it (names: :mod:`cdc.tables`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from airflow_provider_cdc.cdc.basics.tables import POSTGRES_NAMES, TableRef, find_column
from airflow_provider_cdc.cdc.sources.postgres.types import PgType

__all__ = ["Column", "TableInfo", "TableRef", "pg_identifier", "quote_ident"]

# 'c': YugabyteDB's CHANGE (an update sends the key and the changed columns only)
REPLICA_IDENTITY_NAMES = {"d": "DEFAULT", "n": "NOTHING", "f": "FULL", "i": "USING INDEX", "c": "CHANGE"}


@dataclass(frozen=True)
class Column:
    name: str
    type: PgType

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "oid": self.type.oid, "modifier": self.type.modifier, "type": self.type.name}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Column:
        return cls(data["name"], PgType(int(data["oid"]), int(data["modifier"]), data.get("type", "")))


@dataclass(frozen=True)
class TableInfo:
    """A captured table as the catalog describes it at capture time."""

    ref: TableRef
    oid: int
    columns: tuple[Column, ...]
    key_columns: tuple[str, ...]  # primary key, else the replica identity index, else none
    replica_identity: str  # pg_class.relreplident: d, n, f, i (YugabyteDB: also c)
    has_primary_key: bool

    def column(self, name: str) -> Column:
        return find_column(self.columns, name)

    def to_json(self) -> dict[str, Any]:
        return {
            "ref": self.ref.to_json(),
            "oid": self.oid,
            "columns": [c.to_json() for c in self.columns],
            "key_columns": list(self.key_columns),
            "replica_identity": self.replica_identity,
            "has_primary_key": self.has_primary_key,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TableInfo:
        return cls(
            ref=TableRef(*data["ref"]),
            oid=int(data["oid"]),
            columns=tuple(Column.from_json(c) for c in data["columns"]),
            key_columns=tuple(data["key_columns"]),
            replica_identity=data["replica_identity"],
            has_primary_key=bool(data["has_primary_key"]),
        )


def quote_ident(name: str) -> str:
    return POSTGRES_NAMES.quote(name)


def pg_identifier(ref: TableRef):  # -> psycopg.sql.Identifier
    """The table as a psycopg identifier (both parts quoted)."""
    from psycopg import sql

    return sql.Identifier(ref.schema, ref.name)


def sql_ident(name: str) -> str:
    """``name`` as a quoted SQL identifier, for the statements a message tells an administrator to run."""
    return '"' + name.replace('"', '""') + '"'
