"""Capture configuration is validated at DAG-parse time, without I/O."""

from __future__ import annotations

import pytest

from airflow_provider_cdc.capture import PostgresCapture
from airflow_provider_cdc.cdc.errors import CdcConfigurationError
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
        ({"tables": "public.orders"}, "a list of table names"),
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
