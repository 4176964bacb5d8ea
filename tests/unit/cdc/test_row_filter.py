"""Row filters (Debezium's additional-conditions) as data: what is accepted, what is refused, and
that whatever is accepted renders to SQL with nothing but quoted columns and literal values.

The SQL checks parse the rendered text with sqlglot, a parser written by others: it is the
independent reader that says whether a function call, subquery or second statement got through.
"""

from __future__ import annotations

from decimal import Decimal

import pytest
import sqlglot
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg import sql
from sqlglot import exp

from airflow_provider_cdc.cdc.planning.row_filter import (
    COMPARISONS,
    AllOf,
    AnyOf,
    Between,
    Column,
    Compare,
    FilterError,
    InList,
    IsNull,
    Like,
    Not,
    canonical,
    parse_filter,
    render,
    resolve_columns,
)
from airflow_provider_cdc.cdc.sources.postgres.chunks import _fold_unquoted, _PgSpeller
from airflow_provider_cdc.cdc.sources.sqlserver.chunks import _TsqlSpeller

COLUMNS = ["id", "status", "total", "Region"]


def _pg(text: str) -> str:
    node = parse_filter(text)
    names = resolve_columns(node, COLUMNS, fold=_fold_unquoted, table="t")
    return render(node, names, _PgSpeller()).as_string(None)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("status = 'open'", Compare(Column("status", False), "=", "open")),
        (
            "total > 10 AND status <> 'x'",
            AllOf((Compare(Column("total", False), ">", 10), Compare(Column("status", False), "<>", "x"))),
        ),
        ("total != 1.50", Compare(Column("total", False), "<>", Decimal("1.50"))),
        ("id IN (1, 2, -3)", InList(Column("id", False), (1, 2, -3))),
        ("id NOT BETWEEN 1 AND 5", Between(Column("id", False), 1, 5, negated=True)),
        ('"Region" IS NOT NULL', IsNull(Column("Region", True), negated=True)),
        ("[Region] like N'E%'", Like(Column("Region", True), "E%")),
        (
            "NOT (id = 1 OR id = 2)",
            Not(AnyOf((Compare(Column("id", False), "=", 1), Compare(Column("id", False), "=", 2)))),
        ),
        ("status = 'it''s'", Compare(Column("status", False), "=", "it's")),
        ("flag = true", Compare(Column("flag", False), "=", True)),
    ],
)
def test_debeziums_kind_of_filter_parses_to_a_tree(text, expected):
    assert parse_filter(text) == expected


def test_the_json_form_is_the_same_tree():
    assert parse_filter({"column": "status", "op": "=", "value": "open"}) == Compare(
        Column("status", True), "=", "open"
    )
    assert parse_filter(
        [{"column": "id", "op": "in", "values": [1, 2]}, {"column": "total", "op": "between", "values": [1.5, 3]}]
    ) == AllOf((InList(Column("id", True), (1, 2)), Between(Column("total", True), Decimal("1.5"), 3)))
    assert parse_filter({"not": {"column": "id", "op": "is null"}}) == Not(IsNull(Column("id", True)))
    with pytest.raises(FilterError, match="keys"):
        parse_filter({"column": "id", "op": "=", "value": 1, "sql": "1=1"})
    with pytest.raises(FilterError, match="not a literal"):
        parse_filter({"column": "id", "op": "=", "value": {"raw": "now()"}})


ATTACKS = [
    # what a security review sent through DAG run conf and the signal table
    "id > 0 AND CAST((SELECT secret FROM secrets LIMIT 1) AS int) > 0",
    "pg_drop_replication_slot('other_consumer') IS NOT NULL",
    "id > 0 AND pg_logical_emit_message(false, 'x', 'forged') IS NOT NULL",
    "false) TO STDOUT; DROP TABLE items; COPY (SELECT 1",
    "1=1) OR (1=1",
    "id = 1; DELETE FROM items",
    "id = 1 -- comment",
    "id = 1 /* comment */",
    "id = '1'::int",
    "id = 1 || 2",
    "status = (SELECT max(status) FROM other)",
    "id IN (SELECT id FROM other)",
    "EXISTS (SELECT 1)",
    "status = current_user",
    "id = $1",
    "id = @p",
    "status LIKE 'a' ESCAPE '!'",
    "id = 1 UNION SELECT 1",
    "status = E'\\x41'",
    "status = $$x$$",
    "id + 1 = 2",
    "lower(status) = 'x'",
    "",
    "   ",
    "(((id = 1)",
    "NOT",
    "id IS 1",
]


@pytest.mark.parametrize("text", ATTACKS)
def test_anything_but_comparisons_of_columns_with_literals_is_refused(text):
    with pytest.raises(FilterError, match=r"not an accepted filter|empty"):
        parse_filter(text)


def test_a_filter_may_only_name_captured_unmasked_columns():
    with pytest.raises(FilterError, match=r"secret.*not one of its captured, unmasked columns"):
        resolve_columns(parse_filter("secret = 'x'"), COLUMNS, fold=_fold_unquoted, table="t")
    # PostgreSQL folds bare names: Region needs its quotes, region does not exist
    with pytest.raises(FilterError, match="Region"):
        resolve_columns(parse_filter("Region = 'EU'"), COLUMNS, fold=_fold_unquoted, table="t")
    assert _pg("\"Region\" = 'EU'") == "(\"Region\" = 'EU')"
    assert _pg("ID = 1") == '("id" = 1)'
    # SQL Server: bare names match without regard to case
    names = resolve_columns(parse_filter("region = 'EU'"), COLUMNS, fold=None, table="t")
    assert list(names.values()) == ["Region"]


def test_rendering_quotes_names_and_values_and_sends_t_sql_values_as_parameters():
    assert _pg("status = 'a''b' AND total BETWEEN 1 AND 2.5") == (
        "((\"status\" = 'a''b') AND (\"total\" BETWEEN 1 AND 2.5))"
    )
    node = parse_filter("status IN ('a', 'b') OR NOT total < 3")
    speller = _TsqlSpeller()
    text = render(node, resolve_columns(node, COLUMNS, fold=None, table="t"), speller)
    assert text == "(([status] IN (?, ?)) OR (NOT ([total] < ?)))"
    assert speller.params == ["a", "b", 3]


# -- properties ---------------------------------------------------------------------------------

_names = st.sampled_from(COLUMNS).map(lambda n: Column(n, quoted=True)) | st.sampled_from(["id", "status"]).map(
    lambda n: Column(n, quoted=False)
)
_values = (
    st.integers(-(10**12), 10**12)
    | st.decimals(allow_nan=False, allow_infinity=False, places=3).filter(lambda d: d != d.to_integral_value())
    | st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=12)
    | st.booleans()
)
_predicates = st.one_of(
    st.builds(Compare, _names, st.sampled_from(COMPARISONS), _values),
    st.builds(InList, _names, st.lists(_values, min_size=1, max_size=4).map(tuple), st.booleans()),
    st.builds(Between, _names, _values, _values, st.booleans()),
    st.builds(IsNull, _names, st.booleans()),
    st.builds(
        Like,
        _names,
        st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=8),
        st.booleans(),
    ),
)
_trees = st.recursive(
    _predicates,
    lambda inner: (
        st.lists(inner, min_size=2, max_size=3).map(lambda xs: AllOf(tuple(xs)))
        | st.lists(inner, min_size=2, max_size=3).map(lambda xs: AnyOf(tuple(xs)))
        | inner.map(Not)
    ),
    max_leaves=8,
)


@given(_trees)
def test_the_canonical_text_parses_back_to_the_same_tree(tree):
    assert parse_filter(canonical(tree)) == tree


#: What a rendered filter may consist of, as sqlglot reads it: nothing else (no function, cast,
#: subquery, parameter, operator of another kind) may appear.
_ALLOWED = (
    exp.Where,
    exp.Paren,
    exp.And,
    exp.Or,
    exp.Not,
    exp.EQ,
    exp.NEQ,
    exp.LT,
    exp.LTE,
    exp.GT,
    exp.GTE,
    exp.In,
    exp.Between,
    exp.Like,
    exp.Is,
    exp.Null,
    exp.Boolean,
    exp.Literal,
    exp.ByteString,  # psycopg writes a string with a backslash as E'...'
    exp.Neg,
    exp.Column,
    exp.Identifier,
)


def _forbidden(where: exp.Expression) -> list[exp.Expression]:
    return [n for n in where.walk() if not isinstance(n, _ALLOWED)]


_PIECES = [*"ab1'\"()=<>;-/*,. $:|", " AND ", " OR ", " IN ", "SELECT ", "NOT ", "id", "x(", "::", "--"]


@settings(max_examples=300)
@given(st.lists(st.sampled_from(_PIECES), max_size=14).map("".join))
def test_whatever_text_is_accepted_renders_to_one_expression_of_columns_and_literals(text):
    try:
        node = parse_filter(text)
        names = resolve_columns(node, ["a", "b", "id", "ab"], fold=_fold_unquoted, table="t")
    except FilterError:
        return
    rendered = render(node, names, _PgSpeller()).as_string(None)
    statements = sqlglot.parse(f"SELECT * FROM t WHERE {rendered}", read="postgres")
    assert len(statements) == 1
    where = statements[0].args["where"]
    found = _forbidden(where)
    assert not found, (text, rendered, found)
    assert {c.name for c in where.find_all(exp.Column)} <= {"a", "b", "id", "ab"}


@given(_trees)
def test_rendered_sql_holds_only_the_filters_columns_in_both_dialects(tree):
    names = {c: c.name for c in _columns(tree)}
    pg = render(tree, names, _PgSpeller()).as_string(None)
    speller = _TsqlSpeller()
    tsql = render(tree, names, speller)
    for text, dialect in ((pg, "postgres"), (tsql.replace("?", "1"), "tsql")):
        where = sqlglot.parse_one(f"SELECT * FROM t WHERE {text}", read=dialect).args["where"]
        assert not _forbidden(where), text
        assert {c.name for c in where.find_all(exp.Column)} <= set(names.values())


def _columns(tree):
    from airflow_provider_cdc.cdc.planning.row_filter import columns_of

    return columns_of(tree)


def test_psycopg_literal_is_what_the_postgres_speller_uses():
    # The speller's values are psycopg's own quoting: an injection in a value stays a string.
    assert _PgSpeller().value("x'); DROP TABLE t; --").as_string(None) == sql.Literal(
        "x'); DROP TABLE t; --"
    ).as_string(None)
