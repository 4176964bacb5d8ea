"""Captured tables by name: ``schema.table`` as users write it, parsed by the source's rules.

A :class:`TableRef` is the exact catalog name (no quoting, exact case). How a user's text maps
to it differs per database: PostgreSQL folds unquoted names to lower case and quotes with
``"..."``; SQL Server keeps the case (its collation decides comparisons) and quotes with
``[...]`` (or ``"..."``). Each source passes its :class:`NameRules`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError, UnknownTableError


@dataclass(frozen=True)
class NameRules:
    """How one database writes identifiers."""

    dialect: str
    default_schema: str
    quotes: tuple[tuple[str, str], ...]  # (open, close) pairs; a doubled close escapes it
    fold_unquoted: bool  # PostgreSQL folds unquoted ASCII letters to lower case

    def quote(self, name: str) -> str:
        open_, close = self.quotes[0]
        return open_ + name.replace(close, close + close) + close


POSTGRES_NAMES = NameRules("PostgreSQL", "public", (('"', '"'),), fold_unquoted=True)
SQLSERVER_NAMES = NameRules("SQL Server", "dbo", (("[", "]"), ('"', '"')), fold_unquoted=False)


@dataclass(frozen=True, order=True)
class TableRef:
    """A schema-qualified table name, as stored in the catalog (no quoting, exact case)."""

    schema: str
    name: str

    @classmethod
    def parse(cls, text: str, rules: NameRules = POSTGRES_NAMES) -> TableRef:
        """Parse ``schema.table``; a bare ``table`` is in the rules' default schema.

        Quoted parts keep their case and may contain dots, spaces and a doubled closing quote.
        """
        parts = split_identifier(text, rules)
        if len(parts) == 1:
            return cls(rules.default_schema, parts[0])
        if len(parts) == 2:
            return cls(parts[0], parts[1])
        open_, close = rules.quotes[0]
        raise CdcConfigurationError(
            f"table name {text!r} has {len(parts)} parts; expected 'schema.table' "
            f"(quote parts that contain dots: '{open_}my.schema{close}.{open_}my.table{close}')"
        )

    @classmethod
    def coerce(cls, value: str | TableRef | tuple[str, str] | list[str], rules: NameRules = POSTGRES_NAMES) -> TableRef:
        if isinstance(value, TableRef):
            return value
        if isinstance(value, (tuple, list)) and len(value) == 2:
            return cls(str(value[0]), str(value[1]))
        if isinstance(value, str):
            return cls.parse(value, rules)
        raise CdcConfigurationError(f"not a table name: {value!r}")

    @property
    def data_collection(self) -> str:
        """Debezium's ``schema.table`` name (unquoted)."""
        return f"{self.schema}.{self.name}"

    def quoted(self, rules: NameRules = POSTGRES_NAMES) -> str:
        """SQL text for this table with both parts quoted (for messages and generated SQL)."""
        return f"{rules.quote(self.schema)}.{rules.quote(self.name)}"

    def to_json(self) -> list[str]:
        return [self.schema, self.name]

    def __str__(self) -> str:
        return self.quoted()


def split_identifier(text: str, rules: NameRules = POSTGRES_NAMES) -> list[str]:
    """The parts of a dotted, possibly quoted name (written by hand: no SQL library parses a
    bare qualified name with each database's folding rule)."""
    if not isinstance(text, str) or not text.strip():
        raise CdcConfigurationError(f"empty table name: {text!r}")
    closing = dict(rules.quotes)
    parts: list[str] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i].isspace():
            i += 1
        if i < n and text[i] in closing:
            close = closing[text[i]]
            i += 1
            buf = []
            while True:
                if i >= n:
                    raise CdcConfigurationError(
                        f"unterminated quoted identifier in {text!r}: close it with {close} "
                        f"(a {close} inside a name is written {close}{close})"
                    )
                if text[i] == close:
                    if i + 1 < n and text[i + 1] == close:
                        buf.append(close)
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
            while i < n and text[i] != "." and text[i] not in closing and not text[i].isspace():
                i += 1
            part = text[start:i]
            if not part:
                raise CdcConfigurationError(f"cannot parse table name {text!r}")
            extra = "_$" if rules.fold_unquoted else "_$@#"
            if not (part[0].isalpha() or part[0] in "_@#"[: 1 if rules.fold_unquoted else 3]) or not all(
                c.isalnum() or c in extra for c in part
            ):
                open_, close = rules.quotes[0]
                raise CdcConfigurationError(
                    f"{part!r} in table name {text!r} is not a valid unquoted identifier; quote it ({open_}...{close})"
                )
            if rules.fold_unquoted:
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


def select_tables(
    explicit: Sequence[TableRef],
    catalog: Callable[[], Sequence[TableRef]],
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    *,
    example: str = "dbo\\.order.*",
) -> tuple[TableRef, ...]:
    """The captured tables: ``explicit`` ones, or every table of ``catalog()`` (read only then)
    matching ``include`` (Debezium's ``table.include.list``: regular expressions on
    ``schema.table``), minus ``exclude`` matches."""

    def excluded(ref: TableRef) -> bool:
        return any(re.fullmatch(p, ref.data_collection) for p in exclude)

    if explicit:
        refs = [r for r in explicit if not excluded(r)]
    else:
        refs = [r for r in catalog() if any(re.fullmatch(p, r.data_collection) for p in include) and not excluded(r)]
    if not refs:
        raise UnknownTableError(
            f"no table to capture: table_include_list {list(include)} and table_exclude_list {list(exclude)} "
            f"leave nothing{' of ' + ', '.join(map(str, explicit)) if explicit else ''}. Patterns are regular "
            f"expressions that must match a whole 'schema.table' name (e.g. '{example}')"
        )
    return tuple(sorted(refs))


def find_column(columns: Sequence[Any], name: str) -> Any:
    """The column called ``name`` among a table's columns (anything with a ``name``)."""
    for column in columns:
        if column.name == name:
            return column
    raise KeyError(name)
