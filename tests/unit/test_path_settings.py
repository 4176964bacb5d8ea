"""Path settings (``sink_path``, ``state_path``) are fixed when the DAG is parsed: they name the
outlets. Jinja, relative and ``~`` paths (and URIs with a relative path), ``%``, Spark's glob
characters, ``?``/``#`` and control characters are refused there with what to write instead,
for every source (they share ``captures/base.py``) and for the current-state operator."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_cdc.captures.postgres import PostgresCapture
from airflow_provider_cdc.captures.sqlserver import SqlServerCapture
from airflow_provider_cdc.captures.yugabyte import YugabyteCapture
from airflow_provider_cdc.captures.yugabyte_cdc_service import YugabyteCdcServiceCapture
from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError

COMMON = {"tables": ["public.orders"], "topic_prefix": "shop", "sink_path": "/tmp/lake"}
CAPTURES = {
    "postgres": lambda **kw: PostgresCapture(postgres_conn_id="db", **{**COMMON, **kw}),
    "sqlserver": lambda **kw: SqlServerCapture(sqlserver_conn_id="db", **{**COMMON, "tables": ["dbo.orders"], **kw}),
    "yugabyte": lambda **kw: YugabyteCapture(postgres_conn_id="db", **{**COMMON, **kw}),
    "yugabyte_cdc": lambda **kw: YugabyteCdcServiceCapture(
        yugabytedb_conn_id="yb", stream_id="0" * 32, **{**COMMON, **kw}
    ),
}
REFUSED = [
    ("{{ var.value.lake }}", r"holds a Jinja template, but sink_path is not templated.*Variable\.get"),
    ("{% if x %}/a{% endif %}", "holds a Jinja template"),
    ("lake/cdc", r"is not absolute.*DAG processor.*Path\(__file__\)\.parent / 'lake/cdc'"),
    ("./lake", "is not absolute"),
    ("~/lake", "is not absolute"),
    ("/data/100%/lake", "contains '%'"),
    ("file:///data/my%20lake", "contains '%'"),
    # Spark globs its read paths: the read would miss the directory or take in other lakes' data.
    ("/data/lake[1]", r"contains '\['.*glob pattern.*character class"),
    ("/data/lake]", r"contains '\]'.*glob pattern"),
    ("/data/lake{a,b}", r"contains '\{'.*glob pattern.*alternatives"),
    ("/data/lake}", r"contains '\}'.*glob pattern"),
    ("s3a://bucket/lake*", r"contains '\*'.*glob pattern.*other directories"),
    ("/data/la\\ke", r"contains '\\\\'.*glob pattern.*escapes"),
    # A URI's query or fragment: every outlet would be cut down to the base path.
    ("/data/lake?v2", r"contains '\?'.*query.*one Asset for every dataset"),
    ("s3a://bucket/lake#v2", r"contains '#'.*fragment"),
    ("/data/la\tke", r"control character '\\t'"),
    # A URI is no way around an absolute path.
    ("file:./lake", r"URI with a relative path \('./lake'\).*file:///abs/dir"),
    ("file:relative/dir", r"URI with a relative path \('relative/dir'\)"),
    ("hdfs:relative", r"URI with a relative path \('relative'\)"),
    ("file://data/lake", r"names the host 'data'.*file:///data/lake for the directory /data/lake"),
]


@pytest.mark.parametrize("source", CAPTURES)
@pytest.mark.parametrize(("path", "message"), REFUSED, ids=[p for p, _ in REFUSED])
def test_a_sink_path_that_cannot_name_the_outlets_is_refused_at_parse(source, path, message):
    with pytest.raises(CdcConfigurationError, match=message):
        CAPTURES[source](sink_path=path)


KEPT = [
    "/data/lake",
    Path("/data/lake"),
    "/data/my lake/cdc (v2)",
    "s3a://lake/cdc",
    "s3://lake/cdc",
    "s3a://lake",
    "gs://lake/cdc",
    "abfss://container@account.dfs.core.windows.net/path",
    "hdfs://namenode:8020/path",
    "hdfs:///path",
    "file:///data/lake",
    "file://localhost/data/lake",
]


@pytest.mark.parametrize("path", KEPT, ids=str)
def test_absolute_paths_and_uris_are_kept(path):
    capture = CAPTURES["postgres"](sink_path=path)
    assert capture.sink_path == str(path) and isinstance(capture.sink_path, str)


def test_each_outlet_names_its_own_dataset_under_a_path_with_spaces():
    from airflow_provider_cdc.utils.assets import window_outlets

    capture = CAPTURES["postgres"](sink_path="/data/my lake", tables=["public.orders", "public.items"])
    assert [o.uri for o in window_outlets(capture)] == [
        "file:///data/my lake/shop.public.orders",
        "file:///data/my lake/shop.public.items",
        "file:///data/my lake/shop.transaction",
        "file:///data/my lake/shop.message",
    ]


@pytest.mark.parametrize(("path", "message"), REFUSED, ids=[p for p, _ in REFUSED])
def test_a_state_path_that_cannot_name_the_outlets_is_refused_at_parse(path, message):
    from airflow_provider_cdc.operators.current_state import CdcCurrentStateOperator

    with pytest.raises(CdcConfigurationError, match=message.replace("sink_path", "state_path")):
        CdcCurrentStateOperator(task_id="state", capture=CAPTURES["postgres"](), state_path=path)


def test_state_outlets_are_the_given_absolute_directory():
    from airflow_provider_cdc.operators.current_state import CdcCurrentStateOperator

    state = CdcCurrentStateOperator(task_id="state", capture=CAPTURES["postgres"](), state_path="/data/state/")
    assert [o.uri for o in state.outlets] == ["file:///data/state/shop.public.orders"]


def test_delta_refuses_names_it_cannot_hold_at_parse():
    with pytest.raises(CdcConfigurationError, match=r"""cannot hold table\(s\) \["Sales Dept.o'rders"\]"""):
        CAPTURES["postgres"](sink_format="delta", tables=['"Sales Dept"."o\'rders"', "public.orders"])
    CAPTURES["postgres"](sink_format="iceberg", tables=['"Sales Dept"."o\'rders"'])  # Iceberg holds them
