"""Object-store settings at DAG parse (issue 31): a bucket that cannot exist and credentials in a
path's URI are refused, for ``sink_path`` and ``state_path``; ``object_store_conn_id`` names an
``aws`` connection for an S3 sink and is refused elsewhere; without the Amazon provider the
connection is Airflow's optional-feature error naming the install line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_provider_cdc.captures.postgres import PostgresCapture
from airflow_provider_cdc.captures.sqlserver import SqlServerCapture
from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.operators.current_state import CdcCurrentStateOperator

ROOT = Path(__file__).resolve().parents[2]
COMMON = {"tables": ["public.orders"], "topic_prefix": "shop", "sink_path": "s3://lake/cdc"}
SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCY"


def capture(**overrides):
    return PostgresCapture(postgres_conn_id="db", **{**COMMON, **overrides})


REFUSED_PATHS = [
    ("s3://Lake_Data/cdc", r"does not name a valid bucket \('Lake_Data'\).*lowercase"),
    ("s3a://ab/cdc", r"does not name a valid bucket \('ab'\)"),
    ("s3:///cdc", r"does not name a valid bucket \(''\)"),
    ("gs://-lake/cdc", r"does not name a valid bucket \('-lake'\)"),
    (f"s3://AKIAEXAMPLE:{SECRET}@lake/cdc", r"holds credentials before '@'.*s3://lake/cdc.*object_store_conn_id"),
    ("s3a://AKIAEXAMPLE@lake/cdc", r"holds credentials before '@'"),
    (f"abfss://user:{SECRET}@container.dfs.core.windows.net/cdc", r"holds credentials before '@'"),
]


@pytest.mark.parametrize(("path", "message"), REFUSED_PATHS, ids=[p for p, _ in REFUSED_PATHS])
def test_an_object_store_path_that_cannot_work_is_refused_at_parse(path, message):
    with pytest.raises(CdcConfigurationError, match=message) as refused:
        capture(sink_path=path)
    assert SECRET not in str(refused.value)
    with pytest.raises(CdcConfigurationError, match=message.replace("sink_path", "state_path")) as refused:
        CdcCurrentStateOperator(task_id="state", capture=capture(), state_path=path)
    assert SECRET not in str(refused.value)


@pytest.mark.parametrize(
    "path",
    ["s3://lake/cdc", "s3a://my.lake-2/a/b", "gs://lake_data/cdc", "abfss://lake@account.dfs.core.windows.net/cdc"],
)
def test_object_store_paths_that_can_work_are_accepted(path):
    assert capture(sink_path=path).sink_path == path


def test_object_store_conn_id_names_the_connection_of_an_s3_sink():
    cap = capture(object_store_conn_id="lake_s3")
    assert cap.object_store_conn_id == "lake_s3"
    assert "object_store_conn_id='lake_s3'" in repr(cap)
    # Shared by every source (captures/base.py).
    assert (
        SqlServerCapture(
            sqlserver_conn_id="db", **{**COMMON, "tables": ["dbo.orders"]}, object_store_conn_id="lake_s3"
        ).object_store_conn_id
        == "lake_s3"
    )


@pytest.mark.parametrize(
    ("sink_path", "conn_id", "message"),
    [
        ("/data/lake", "lake_s3", r"is for a sink_path on S3.*'/data/lake'.*remove object_store_conn_id"),
        ("hdfs:///lake", "lake_s3", r"is for a sink_path on S3"),
        ("gs://lake/cdc", "lake_s3", r"GCS and Azure paths use their libraries' default credentials"),
        ("s3://lake/cdc", "", r"must be the id of an Airflow 'aws' connection"),
        ("s3://lake/cdc", "{{ var.value.conn }}", r"must be the id of an Airflow 'aws' connection"),
    ],
)
def test_object_store_conn_id_without_an_s3_sink_is_refused_at_parse(sink_path, conn_id, message):
    with pytest.raises(CdcConfigurationError, match=message):
        capture(sink_path=sink_path, object_store_conn_id=conn_id)


def test_without_the_amazon_provider_the_connection_is_an_optional_feature_error():
    # A finder that makes the Amazon provider (and boto3) unimportable, as on a worker without the extra.
    code = """
import json, sys
class NoAmazon:
    def find_spec(self, name, path=None, target=None):
        if name.startswith(("airflow.providers.amazon.aws", "boto3", "botocore")):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, NoAmazon())
from airflow.sdk.exceptions import AirflowOptionalProviderFeatureException
from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.captures.postgres import PostgresCapture
capture = PostgresCapture(postgres_conn_id="db", tables=["public.orders"], topic_prefix="shop",
                          sink_path="s3://lake/cdc", object_store_conn_id="lake_s3")
try:
    capture.object_store_access()
except Exception as exc:
    print(json.dumps({"optional": isinstance(exc, AirflowOptionalProviderFeatureException),
                      "configuration": isinstance(exc, CdcConfigurationError), "message": str(exc)}))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert outcome["optional"] and outcome["configuration"]
    assert "pip install 'airflow-provider-cdc[s3]'" in outcome["message"]


def test_the_query_extraction_takes_the_same_connection_setting():
    from airflow_provider_cdc.operators.query_extract import PostgresQueryExtractOperator

    settings = {"postgres_conn_id": "db", "table": "public.orders", "cursor_column": "updated_at"}
    task = PostgresQueryExtractOperator(
        task_id="q", topic_prefix="q", sink_path="s3://lake/q", object_store_conn_id="lake_s3", **settings
    )
    assert task.object_store_conn_id == "lake_s3"
    with pytest.raises(CdcConfigurationError, match=r"is for a sink_path on S3"):
        PostgresQueryExtractOperator(
            task_id="q2", topic_prefix="q", sink_path="/data/lake", object_store_conn_id="lake_s3", **settings
        )


def test_without_a_region_the_environment_s_region_is_used(monkeypatch):
    # Review finding 7: a connection without region_name signs for the session's (environment's,
    # profile's) region, not a hard-coded us-east-1; so does an access that names none.
    from airflow_provider_cdc.captures.object_store_connection import object_store_access
    from airflow_provider_cdc.cdc.sinks.object_store import ObjectStoreAccess

    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-3")
    connection = {"conn_type": "aws", "login": "key", "password": SECRET, "extra": {"endpoint_url": "http://s3.test:9"}}
    monkeypatch.setenv("AIRFLOW_CONN_LAKE_NO_REGION", json.dumps(connection))
    assert object_store_access("lake_no_region").region == "eu-west-3"
    bare = ObjectStoreAccess(endpoint_url="http://s3.test:9")
    assert bare.arrow_filesystem().region == "eu-west-3"
    assert bare.delta_storage_options()["AWS_REGION"] == "eu-west-3"
    assert bare.iceberg_properties()["s3.region"] == "eu-west-3"
    monkeypatch.setenv("AWS_REGION", "ap-south-1")  # the newer variable wins, as in the AWS SDKs
    assert bare.delta_storage_options()["AWS_REGION"] == "ap-south-1"


@pytest.mark.parametrize("style", [None, True, False])
def test_the_addressing_decision_travels_with_a_submitted_job_s_spec(style):
    # Review finding 3: "no style" (path-style with an endpoint) must not become "virtual" on the
    # way through the spec file of a spark-submit job.
    from airflow_provider_cdc.cdc.sinks.object_store import ObjectStoreAccess

    access = ObjectStoreAccess(endpoint_url="http://s3.test:9", path_style=style)
    back = ObjectStoreAccess.from_dict(json.loads(json.dumps(access.to_dict())))
    assert back.path_style is style and back.uses_path_style is (style is not False)
