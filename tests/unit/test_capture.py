"""Capture configuration is validated at DAG-parse time, without I/O."""

from __future__ import annotations

import pytest

from airflow_provider_cdc.capture import PostgresCapture
from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.sources.postgres.tables import TableRef


def capture(**overrides) -> PostgresCapture:
    args = {"postgres_conn_id": "db", "tables": ["public.orders"], "topic_prefix": "shop", "sink_path": "/lake"}
    return PostgresCapture(**{**args, **overrides})


def test_defaults():
    c = capture(tables=["Orders", '"Mixed"."Case"'])
    assert c.table_refs == (TableRef("public", "orders"), TableRef("Mixed", "Case"))
    assert c.resolved_slot_name == "cdc_shop" and c.resolved_publication_name == "cdc_shop"
    assert c.snapshot_mode == "initial"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"topic_prefix": "my-shop"}, "topic_prefix 'my-shop' is invalid"),
        ({"topic_prefix": "1shop"}, "topic_prefix"),
        ({"snapshot_mode": "exported"}, "snapshot_mode 'exported' is not supported"),
        ({"publication_autocreate_mode": "everything"}, "publication_autocreate_mode"),
        ({"tables": []}, "at least one table"),
        ({"tables": "public.orders"}, "tables must be a list"),
        ({"tables": ["a.b.c"]}, "3 parts"),
        ({"tables": ["orders", "public.orders"]}, "more than once"),
        ({"slot_name": "Has-Caps"}, "slot_name 'Has-Caps' is invalid"),
        ({"slot_name": "x" * 64}, "slot_name"),
        ({"sink_path": " "}, "sink_path is required"),
        ({"offset_store": "redis"}, "offset_store 'redis'"),
        ({"max_changes_per_chunk": 0}, "max_changes_per_chunk"),
        ({"postgres_conn_id": ""}, "postgres_conn_id is required"),
    ],
)
def test_bad_configuration_is_refused(overrides, message):
    with pytest.raises(CdcConfigurationError, match=message):
        capture(**overrides)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"decimal_handling_mode": "exact"}, "decimal handling mode 'exact'"),
        ({"time_precision_mode": "nanoseconds"}, "time_precision handling mode"),
        ({"binary_handling_mode": "base32"}, "binary handling mode"),
        ({"column_include_list": ["a"], "column_exclude_list": ["b"]}, "not both"),
        ({"column_exclude_list": ["public.orders.(unclosed"]}, "not a valid regular expression"),
        ({"column_masks": {"column.mask.with.x.chars": "a"}}, "unsupported column rule"),
        ({"column_masks": {"column.mask.hash.NOPE.with.salt.s": "a"}}, "unknown hash algorithm 'NOPE'"),
        ({"column_exclude_list": "public.orders.secret"}, "take a list of patterns"),
    ],
)
def test_bad_value_and_column_options_are_refused(overrides, message):
    with pytest.raises(CdcConfigurationError, match=message):
        capture(**overrides)


def test_event_settings_follow_debezium_options():
    settings = capture(
        decimal_handling_mode="string",
        column_exclude_list=["public.orders.secret"],
        column_masks={"column.mask.with.4.chars": "public.orders.email", "column.truncate.to.3.chars": ".*note"},
    ).event_settings()
    assert settings.modes.decimal == "string"
    assert not settings.columns.keeps("public.orders.secret", is_key=False)
    assert settings.columns.keeps("public.orders.secret", is_key=True)  # keys are always kept
    assert settings.columns.mask_for("public.orders.email").length == 4
    assert settings.columns.mask_for("public.orders.note").kind == "truncate"


def test_table_patterns():
    patterned = capture(tables=[], table_include_list=["public\\.order.*"], table_exclude_list=["public\\.order_audit"])
    assert patterned.table_refs == () and patterned.table_include_list == ["public\\.order.*"]
    with pytest.raises(CdcConfigurationError, match="not both"):
        capture(table_include_list=["public\\..*"])
    with pytest.raises(CdcConfigurationError, match="not a valid regular expression"):
        capture(tables=[], table_include_list=["public.(oops"])
    with pytest.raises(CdcConfigurationError, match="must be a list"):
        capture(tables=[], table_include_list="public\\..*")
