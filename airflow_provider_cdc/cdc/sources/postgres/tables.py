"""Captured tables: names as users write them, and their shape as the catalog describes it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from airflow_provider_cdc.cdc.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.sources.postgres.types import PgType

REPLICA_IDENTITY_NAMES = {"d": "DEFAULT", "n": "NOTHING", "f": "FULL", "i": "USING INDEX"}


@dataclass(frozen=True, order=True)
class TableRef:
    """A schema-qualified table name, as stored in the catalog (no quoting, exact case)."""

    schema: str
    name: str

    @classmethod
    def parse(cls, text: str) -> TableRef:
        """Parse ``schema.table`` with PostgreSQL's identifier rules.

        Unquoted parts fold to lower case; double-quoted parts keep their case and may contain
        dots, spaces and ``""`` for a quote. A bare ``table`` means ``public.table``.
        """
        parts = _split_identifier(text)
        if len(parts) == 1:
            return cls("public", parts[0])
        if len(parts) == 2:
            return cls(parts[0], parts[1])
        raise CdcConfigurationError(
            f"table name {text!r} has {len(parts)} parts; expected 'schema.table' "
            '(quote parts that contain dots: \'"my.schema"."my.table"\')'
        )

    @classmethod
    def coerce(cls, value: str | TableRef | tuple[str, str] | list[str]) -> TableRef:
        if isinstance(value, TableRef):
            return value
        if isinstance(value, (tuple, list)) and len(value) == 2:
            return cls(str(value[0]), str(value[1]))
        if isinstance(value, str):
            return cls.parse(value)
        raise CdcConfigurationError(f"not a table name: {value!r}")

    @property
    def data_collection(self) -> str:
        """Debezium's ``schema.table`` name (unquoted)."""
        return f"{self.schema}.{self.name}"

    def quoted(self) -> str:
        """SQL text for this table with both parts quoted (for messages and generated DDL)."""
        return f"{quote_ident(self.schema)}.{quote_ident(self.name)}"

    def sql(self):  # -> psycopg.sql.Composable
        from psycopg import sql

        return sql.Identifier(self.schema, self.name)

    def to_json(self) -> list[str]:
        return [self.schema, self.name]

    def __str__(self) -> str:
        return self.quoted()


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
    replica_identity: str  # pg_class.relreplident: d, n, f, i
    has_primary_key: bool

    def column(self, name: str) -> Column:
        for column in self.columns:
            if column.name == name:
                return column
        raise KeyError(name)

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
    return '"' + name.replace('"', '""') + '"'


def _split_identifier(text: str) -> list[str]:
    if not isinstance(text, str) or not text.strip():
        raise CdcConfigurationError(f"empty table name: {text!r}")
    parts: list[str] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i].isspace():
            i += 1
        if i < n and text[i] == '"':
            i += 1
            buf = []
            while True:
                if i >= n:
                    raise CdcConfigurationError(f"unterminated quoted identifier in {text!r}")
                if text[i] == '"':
                    if i + 1 < n and text[i + 1] == '"':
                        buf.append('"')
                        i += 2
                        continue
                    i += 1
                    break
                buf.append(text[i])
                i += 1
            part = "".join(buf)
            if not part:
                raise CdcConfigurationError(f"zero-length quoted identifier in {text!r}")
        else:
            start = i
            while i < n and text[i] not in '."' and not text[i].isspace():
                i += 1
            part = text[start:i]
            if not part:
                raise CdcConfigurationError(f"cannot parse table name {text!r}")
            if not (part[0].isalpha() or part[0] == "_") or not all(c.isalnum() or c in "_$" for c in part):
                raise CdcConfigurationError(
                    f"{part!r} in table name {text!r} is not a valid unquoted identifier; double-quote it"
                )
            # PostgreSQL folds only ASCII letters of unquoted identifiers in UTF-8 databases.
            part = "".join(c.lower() if "A" <= c <= "Z" else c for c in part)
        parts.append(part)
        while i < n and text[i].isspace():
            i += 1
        if i >= n:
            return parts
        if text[i] != ".":
            raise CdcConfigurationError(f"unexpected {text[i]!r} in table name {text!r}")
        i += 1
