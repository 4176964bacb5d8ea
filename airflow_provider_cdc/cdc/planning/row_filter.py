"""Row filters of incremental snapshots (Debezium's ``additional-conditions``): data, never SQL text.

Debezium pastes a signal's ``filter`` (a WHERE fragment) into its chunk queries, so whoever may
write a signal runs SQL with the capture role's rights: read other tables (through error texts),
call functions (``pg_drop_replication_slot``), end the statement and start another. Here a filter
is parsed into a small tree, comparisons of one column with literal values joined by AND, OR and
NOT, and each source renders the tree itself with quoted identifiers and literal values (or
parameters). A filter can therefore only choose rows of its own table by its own captured,
unmasked columns: no function, operator of the user's choosing, subquery, other table or statement
can be expressed, whatever the text says. The text is parsed again wherever it is read back (the
offset stores its canonical text), so an edited offset is held to the same rules.

Accepted text (Debezium's documented examples parse unchanged)::

    color = 'blue' AND quantity > 10
    region IN ('EU', 'UK') OR (created_at >= '2024-01-01' AND NOT archived = true)
    deleted_at IS NULL        price BETWEEN 10 AND 20        name LIKE 'A%'

Identifiers are bare (``[A-Za-z_][A-Za-z0-9_$]*``, matched as the source matches unquoted names)
or quoted (``"Name"``, or ``[Name]`` for SQL Server); values are string literals (``'...'``,
``N'...'``), numbers and ``TRUE``/``FALSE``. The same filter as JSON::

    {"column": "color", "op": "=", "value": "blue"}
    {"all": [{"column": "region", "op": "in", "values": ["EU", "UK"]}, {"column": "price", "op": "between",
     "values": [10, 20]}]}                 ({"any": [...]}, {"not": {...}}, ops "is null", "like", ...)

Hand-written because what is needed is the opposite of a SQL parser: a grammar of a dozen rules
that refuses everything else. A general parser (sqlglot) would accept the whole language and leave
the whitelist to us, and the rendering would still be ours.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Generic, Protocol, TypeVar

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError

#: Comparison operators, as written in SQL (``!=`` is read as ``<>``).
COMPARISONS = ("=", "<>", "<", "<=", ">", ">=")
MAX_FILTER_CHARS = 4_000
MAX_NODES = 200

Value = str | int | Decimal | bool


class FilterError(CdcConfigurationError):
    """A filter outside the accepted form, or naming a column the table does not capture."""


@dataclass(frozen=True)
class Column:
    name: str
    quoted: bool  # written "Name" or [Name]: matched exactly; bare names as the source folds them


@dataclass(frozen=True)
class Compare:
    column: Column
    op: str  # one of COMPARISONS
    value: Value


@dataclass(frozen=True)
class InList:
    column: Column
    values: tuple[Value, ...]
    negated: bool = False


@dataclass(frozen=True)
class Between:
    column: Column
    low: Value
    high: Value
    negated: bool = False


@dataclass(frozen=True)
class IsNull:
    column: Column
    negated: bool = False


@dataclass(frozen=True)
class Like:
    column: Column
    pattern: str
    negated: bool = False


@dataclass(frozen=True)
class AllOf:
    items: tuple[Node, ...]


@dataclass(frozen=True)
class AnyOf:
    items: tuple[Node, ...]


@dataclass(frozen=True)
class Not:
    item: Node


Node = Compare | InList | Between | IsNull | Like | AllOf | AnyOf | Not
Predicate = Compare | InList | Between | IsNull | Like


# -- reading --------------------------------------------------------------------------------------


def parse_filter(value: Any, *, what: str = "filter") -> Node:
    """A filter from its text or JSON form; :class:`FilterError` says what is not accepted."""
    if isinstance(value, str):
        node = _Parser(value, what).parse()
    elif isinstance(value, (dict, list)):
        node = _from_json(value, what)
    else:
        raise FilterError(f"{what} must be a condition text or a JSON object, got {type(value).__name__}")
    if _count(node) > MAX_NODES:
        raise FilterError(f"{what} has more than {MAX_NODES} conditions")
    return node


def canonical(node: Node) -> str:
    """The filter's text in the accepted form (``parse_filter(canonical(n)) == n``): what the offset
    stores and the logs show."""
    if isinstance(node, AllOf):
        return " AND ".join(_grouped(i, AllOf, AnyOf) for i in node.items)
    if isinstance(node, AnyOf):
        return " OR ".join(_grouped(i, AllOf, AnyOf) for i in node.items)
    if isinstance(node, Not):
        return f"NOT {_grouped(node.item, AllOf, AnyOf)}"
    column = _column_text(node.column)
    if isinstance(node, Compare):
        return f"{column} {node.op} {_value_text(node.value)}"
    if isinstance(node, InList):
        return f"{column} {'NOT ' if node.negated else ''}IN ({', '.join(_value_text(v) for v in node.values)})"
    if isinstance(node, Between):
        return f"{column} {'NOT ' if node.negated else ''}BETWEEN {_value_text(node.low)} AND {_value_text(node.high)}"
    if isinstance(node, IsNull):
        return f"{column} IS {'NOT ' if node.negated else ''}NULL"
    return f"{column} {'NOT ' if node.negated else ''}LIKE {_value_text(node.pattern)}"


def _grouped(node: Node, *compound: type) -> str:
    text = canonical(node)
    return f"({text})" if isinstance(node, compound) else text


def _column_text(column: Column) -> str:
    return '"' + column.name.replace('"', '""') + '"' if column.quoted else column.name


def _value_text(value: Value) -> str:
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, (int, Decimal)):
        return str(value)
    return "'" + value.replace("'", "''") + "'"


def _count(node: Node) -> int:
    if isinstance(node, (AllOf, AnyOf)):
        return 1 + sum(_count(i) for i in node.items)
    if isinstance(node, Not):
        return 1 + _count(node.item)
    return 1


_TOKEN = re.compile(
    r"""\s*(?:
        (?P<string>[Nn]?'(?:[^']|'')*')
      | (?P<number>[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
      | (?P<quoted>"(?:[^"]|"")+")
      | (?P<bracketed>\[(?:[^\]]|\]\])+\])
      | (?P<word>[A-Za-z_][A-Za-z0-9_$]*)
      | (?P<op><>|!=|<=|>=|=|<|>)
      | (?P<punct>[(),])
    )""",
    re.VERBOSE,
)
_KEYWORDS = frozenset({"and", "or", "not", "in", "is", "null", "between", "like", "true", "false"})


class _Parser:
    """Recursive descent over: or := and (OR and)*; and := unary (AND unary)*;
    unary := NOT unary | '(' or ')' | predicate."""

    def __init__(self, text: str, what: str):
        self.what = what
        self.text = text
        if len(text) > MAX_FILTER_CHARS:
            raise FilterError(f"{what} is longer than {MAX_FILTER_CHARS} characters")
        if "\x00" in text:
            raise FilterError(f"{what} holds a NUL character")
        self.tokens: list[tuple[str, str]] = []
        pos = 0
        while pos < len(text):
            if text[pos:].strip() == "":
                break
            match = _TOKEN.match(text, pos)
            if match is None or match.end() == pos:
                raise self.error(f"unexpected {text[pos:].lstrip()[:20]!r}")
            kind = match.lastgroup
            if kind is None:
                raise RuntimeError(f"token at {pos} matched no named group")
            self.tokens.append((kind, match.group(kind)))
            pos = match.end()
        self.i = 0
        self.depth = 0

    def error(self, detail: str) -> FilterError:
        return FilterError(
            f"{self.what} {self.text!r} is not an accepted filter ({detail}): give comparisons of the table's "
            "columns with literal values, joined by AND, OR and NOT (=, <>, <, <=, >, >=, IN, BETWEEN, LIKE, "
            "IS [NOT] NULL); functions, subqueries and other SQL are refused"
        )

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def next(self) -> tuple[str, str]:
        token = self.peek()
        if token is None:
            raise self.error("it ends too early")
        self.i += 1
        return token

    def keyword(self, *words: str) -> bool:
        token = self.peek()
        if token is not None and token[0] == "word" and token[1].lower() in words:
            self.i += 1
            return True
        return False

    def expect_keyword(self, word: str) -> None:
        if not self.keyword(word):
            raise self.error(f"expected {word.upper()}")

    def expect(self, punct: str) -> None:
        token = self.next()
        if token != ("punct", punct):
            raise self.error(f"expected {punct!r}, found {token[1]!r}")

    def parse(self) -> Node:
        if not self.tokens:
            raise self.error("it is empty")
        node = self.disjunction()
        if self.peek() is not None:
            raise self.error(f"unexpected {self.peek()[1]!r}")  # type: ignore[index]
        return node

    def disjunction(self) -> Node:
        items = [self.conjunction()]
        while self.keyword("or"):
            items.append(self.conjunction())
        return items[0] if len(items) == 1 else AnyOf(tuple(items))

    def conjunction(self) -> Node:
        items = [self.unary()]
        while self.keyword("and"):
            items.append(self.unary())
        return items[0] if len(items) == 1 else AllOf(tuple(items))

    def unary(self) -> Node:
        if self.keyword("not"):
            return Not(self.unary())
        if self.peek() == ("punct", "("):
            self.i += 1
            self.depth += 1
            if self.depth > 32:
                raise self.error("parentheses nest too deep")
            node = self.disjunction()
            self.expect(")")
            self.depth -= 1
            return node
        return self.predicate()

    def predicate(self) -> Predicate:
        column = self.column()
        if self.keyword("is"):
            negated = self.keyword("not")
            self.expect_keyword("null")
            return IsNull(column, negated)
        negated = self.keyword("not")
        if self.keyword("in"):
            self.expect("(")
            values = [self.value()]
            while self.peek() == ("punct", ","):
                self.i += 1
                values.append(self.value())
            self.expect(")")
            return InList(column, tuple(values), negated)
        if self.keyword("between"):
            low = self.value()
            self.expect_keyword("and")
            return Between(column, low, self.value(), negated)
        if self.keyword("like"):
            pattern = self.value()
            if not isinstance(pattern, str):
                raise self.error("LIKE takes a string pattern")
            return Like(column, pattern, negated)
        if negated:
            raise self.error("NOT must precede IN, BETWEEN or LIKE here")
        kind, op = self.next()
        if kind != "op":
            raise self.error(f"expected a comparison after {column.name!r}, found {op!r}")
        return Compare(column, "<>" if op == "!=" else op, self.value())

    def column(self) -> Column:
        kind, text = self.next()
        if kind == "word" and text.lower() not in _KEYWORDS:
            return Column(text, quoted=False)
        if kind == "quoted":
            return Column(text[1:-1].replace('""', '"'), quoted=True)
        if kind == "bracketed":
            return Column(text[1:-1].replace("]]", "]"), quoted=True)
        raise self.error(f"expected a column name, found {text!r}")

    def value(self) -> Value:
        kind, text = self.next()
        if kind == "string":
            return text[text.index("'") + 1 : -1].replace("''", "'")
        if kind == "number":
            return _number(text, self.error)
        if kind == "word" and text.lower() in ("true", "false"):
            return text.lower() == "true"
        raise self.error(f"expected a literal value, found {text!r}")


def _number(text: str, error: Callable[[str], FilterError]) -> int | Decimal:
    if re.fullmatch(r"[+-]?\d+", text):
        return int(text)
    try:
        number = Decimal(text)
    except InvalidOperation:
        raise error(f"{text!r} is not a number") from None
    if not number.is_finite():
        raise error(f"{text!r} is not a finite number")
    return number


_JSON_OPS = {
    **{op: op for op in COMPARISONS},
    "!=": "<>",
    "in": "in",
    "not in": "not in",
    "between": "between",
    "not between": "not between",
    "like": "like",
    "not like": "not like",
    "is null": "is null",
    "is not null": "is not null",
}


def _from_json(value: Any, what: str) -> Node:
    def fail(detail: str) -> FilterError:
        return FilterError(
            f"{what} is not an accepted filter ({detail}): give {{'column', 'op', 'value' | 'values'}} objects, "
            "or {'all': [...]}, {'any': [...]}, {'not': {...}} of them"
        )

    def node(item: Any, depth: int) -> Node:
        if depth > 32:
            raise fail("it nests too deep")
        if isinstance(item, list):  # a list means all of its conditions
            item = {"all": item}
        if not isinstance(item, dict):
            raise fail(f"{type(item).__name__} where a condition object belongs")
        if set(item) in ({"all"}, {"any"}):
            ((key, items),) = item.items()
            if not isinstance(items, list) or not items:
                raise fail(f"{key!r} needs a non-empty list")
            children = tuple(node(i, depth + 1) for i in items)
            return children[0] if len(children) == 1 else (AllOf if key == "all" else AnyOf)(children)
        if set(item) == {"not"}:
            return Not(node(item["not"], depth + 1))
        return predicate(item)

    def predicate(item: dict[str, Any]) -> Predicate:
        column = item.get("column")
        if not isinstance(column, str) or not column or "\x00" in column:
            raise fail("a condition needs 'column', a column name")
        op = _JSON_OPS.get(str(item.get("op", "")).strip().lower())
        if op is None:
            raise fail(f"unknown op {item.get('op')!r} (use {', '.join(_JSON_OPS)})")
        expected = {"column", "op"} | (
            set()
            if op.startswith("is ")
            else {"values"}
            if op in ("in", "not in", "between", "not between")
            else {"value"}
        )
        if set(item) != expected:
            raise fail(f"a {op!r} condition has the keys {sorted(expected)}, not {sorted(item)}")
        col = Column(column, quoted=True)  # a JSON name is the column's exact name
        negated = op.startswith("not ") or op == "is not null"
        if op in ("is null", "is not null"):
            return IsNull(col, negated)
        if op in ("in", "not in", "between", "not between"):
            values = item["values"]
            if not isinstance(values, list) or not values:
                raise fail(f"{op!r} needs a non-empty list of values")
            parsed = tuple(json_value(v) for v in values)
            if op.endswith("between"):
                if len(parsed) != 2:
                    raise fail("'between' needs two values")
                return Between(col, parsed[0], parsed[1], negated)
            return InList(col, parsed, negated)
        value = json_value(item["value"])
        if op.endswith("like"):
            if not isinstance(value, str):
                raise fail("'like' takes a string pattern")
            return Like(col, value, negated)
        return Compare(col, op, value)

    def json_value(value: Any) -> Value:
        if isinstance(value, str) and "\x00" in value:
            raise fail("a value holds a NUL character")
        if isinstance(value, (bool, int, str)):
            return value
        if isinstance(value, float):
            number = Decimal(repr(value))
            if not number.is_finite():
                raise fail(f"{value!r} is not a finite number")
            return number
        raise fail(f"{value!r} is not a literal value (a string, a number or a boolean)")

    return node(value, 0)


# -- resolving and rendering -----------------------------------------------------------------------


def columns_of(node: Node) -> list[Column]:
    if isinstance(node, (AllOf, AnyOf)):
        return [c for i in node.items for c in columns_of(i)]
    if isinstance(node, Not):
        return columns_of(node.item)
    return [node.column]


def resolve_columns(
    node: Node, allowed: Sequence[str], *, fold: Callable[[str], str] | None, table: str
) -> dict[Column, str]:
    """Each column of the filter → the name of one of ``allowed`` (the table's captured, unmasked
    columns). ``fold``: how the source reads a bare name (PostgreSQL lowercases it); None matches
    bare names without regard to case (SQL Server's usual collations)."""
    out: dict[Column, str] = {}
    for column in columns_of(node):
        if column.quoted:
            found = [a for a in allowed if a == column.name]
        elif fold is not None:
            found = [a for a in allowed if a == fold(column.name)]
        else:
            found = [a for a in allowed if a.lower() == column.name.lower()]
        if len(found) != 1:
            raise FilterError(
                f"the filter of {table} names {_column_text(column)}, which is not one of its captured, unmasked "
                f"columns ({', '.join(allowed) or 'none'})"
            )
        out[column] = found[0]
    return out


T = TypeVar("T")


class Speller(Protocol, Generic[T]):
    """How a source writes a filter: quoted names, literal values or parameters, keywords."""

    def column(self, name: str) -> T: ...

    def value(self, value: Value) -> T: ...

    def keyword(self, text: str) -> T: ...

    def join(self, parts: Sequence[T]) -> T: ...


def render(node: Node, names: Mapping[Column, str], spell: Speller[T]) -> T:
    """The filter in a source's SQL, every part written by ``spell`` (never the filter's text)."""

    def r(n: Node) -> T:
        if isinstance(n, (AllOf, AnyOf)):
            glue = spell.keyword(" AND " if isinstance(n, AllOf) else " OR ")
            parts: list[T] = [spell.keyword("(")]
            for k, item in enumerate(n.items):
                if k:
                    parts.append(glue)
                parts.append(r(item))
            return spell.join([*parts, spell.keyword(")")])
        if isinstance(n, Not):
            return spell.join([spell.keyword("(NOT "), r(n.item), spell.keyword(")")])
        column = spell.column(names[n.column])
        neg = "NOT " if getattr(n, "negated", False) else ""
        if isinstance(n, Compare):
            if n.op not in COMPARISONS:
                raise RuntimeError(f"comparison {n.op!r} is not one of {', '.join(COMPARISONS)}")
            return spell.join(
                [spell.keyword("("), column, spell.keyword(f" {n.op} "), spell.value(n.value), spell.keyword(")")]
            )
        if isinstance(n, InList):
            parts = [spell.keyword("("), column, spell.keyword(f" {neg}IN (")]
            for k, v in enumerate(n.values):
                if k:
                    parts.append(spell.keyword(", "))
                parts.append(spell.value(v))
            return spell.join([*parts, spell.keyword("))")])
        if isinstance(n, Between):
            return spell.join(
                [
                    spell.keyword("("),
                    column,
                    spell.keyword(f" {neg}BETWEEN "),
                    spell.value(n.low),
                    spell.keyword(" AND "),
                    spell.value(n.high),
                    spell.keyword(")"),
                ]
            )
        if isinstance(n, IsNull):
            return spell.join([spell.keyword("("), column, spell.keyword(f" IS {neg}NULL)")])
        return spell.join(
            [spell.keyword("("), column, spell.keyword(f" {neg}LIKE "), spell.value(n.pattern), spell.keyword(")")]
        )

    return r(node)
