from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.sources.postgres.tables import TableRef, quote_ident

identifier = st.text(st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)), min_size=1, max_size=30)


@given(identifier, identifier)
def test_quoted_names_round_trip(schema, name):
    ref = TableRef(schema, name)
    assert TableRef.parse(ref.quoted()) == ref
    assert TableRef.parse(str(ref)) == ref


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("orders", TableRef("public", "orders")),
        ("public.orders", TableRef("public", "orders")),
        ("Public.Orders", TableRef("public", "orders")),
        ('"Sales"."Orders"', TableRef("Sales", "Orders")),
        ('"my.schema"."my.table"', TableRef("my.schema", "my.table")),
        ('"with ""quote"""."x y"', TableRef('with "quote"', "x y")),
        ("  s . t  ", TableRef("s", "t")),
        ("ünïcode.tàble", TableRef("ünïcode", "tàble")),
        ('"ÜPPER".t', TableRef("ÜPPER", "t")),
        ("s$1.t_2", TableRef("s$1", "t_2")),
    ],
)
def test_postgres_identifier_rules(text, expected):
    assert TableRef.parse(text) == expected


@pytest.mark.parametrize(
    "text",
    ["", "a.b.c", '"unterminated', '""', "a..b", "a b", "1abc", "a;drop table x", "a.b;", "a-b", ".a", "a."],
)
def test_bad_names_are_refused(text):
    with pytest.raises(CdcConfigurationError):
        TableRef.parse(text)


def test_quote_ident_doubles_quotes():
    assert quote_ident('a"b') == '"a""b"'
    assert TableRef("s", 'x"; DROP TABLE y; --').quoted() == '"s"."x""; DROP TABLE y; --"'
