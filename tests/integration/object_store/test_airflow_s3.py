"""The example DAG with its lake on S3, credentials from an Airflow ``aws`` connection (issue 31).

The shipped PostgreSQL example, pointed through its ``CDC_EXAMPLE_*`` settings at the suite's S3
server (SeaweedFS) with ``object_store_conn_id``, runs setup → snapshot → window → current state
through real Airflow (``dag.test``), for each sink format; the landed data is read back from the
store with the product's reader and with Polars. The access comes from the connection only: the
``s3_prefix`` fixture's access is switched off for these tests.

The secret key never shows: not in a spec file written for ``spark-submit`` (one window run with
a ``spark_conn_id``; the keys travel in its environment), XCom, the task log, the rendered
template fields, the asset events, or an exception.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from airflow_provider_cdc.cdc.sinks import object_store
from airflow_provider_cdc.cdc.sinks.reader import committed_windows, read_topic_arrow
from airflow_provider_cdc.testing import shop
from tests.dags.test_example_dag import KEYS, load_example_dag
from tests.support import airflow as af
from tests.support.oracle import assert_same_state, replay, source_rows
from tests.support.s3_server import ADMIN, BUCKET, REGION

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.slow]

CONN_ID = "lake_s3"  # the s3_aws_connection fixture's
CATALOG_CONN_ID = "lake_catalog"


def _polars_options(s3_server) -> dict[str, str]:
    return {
        "aws_endpoint_url": s3_server.endpoint_url,
        "aws_region": REGION,
        "aws_access_key_id": ADMIN[0],
        "aws_secret_access_key": ADMIN[1],
        "aws_allow_http": "true",
        "aws_virtual_hosted_style_request": "false",
    }


def _example_on_s3(db, s3_server, s3_prefix, monkeypatch, sink_format: str):
    """The shop database and the example DAG with sink and state under ``s3_prefix``."""
    from airflow.models import Variable

    with db.connect() as conn:
        shop.create_schema(conn)
        shop.seed(conn)
    # Only the connection (the s3_aws_connection fixture) gives access, not s3_prefix's.
    monkeypatch.setenv("AIRFLOW_CONN_SHOP_DB", db.cluster.airflow_uri(db.name))
    monkeypatch.setenv("CDC_EXAMPLE_SINK_PATH", s3_prefix)
    monkeypatch.setenv("CDC_EXAMPLE_STATE_PATH", f"{s3_prefix}/state")
    monkeypatch.setenv("CDC_EXAMPLE_OBJECT_STORE_CONN_ID", CONN_ID)
    monkeypatch.setenv("CDC_EXAMPLE_SINK_FORMAT", sink_format)
    if sink_format == "iceberg":  # a SQL catalog in the suite's PostgreSQL; its URI is the secret
        cluster = db.cluster
        uri = f"postgresql+psycopg://{cluster.superuser}:{cluster.password}@{cluster.host}:{cluster.port}/{db.name}"
        catalog = {"conn_type": "generic", "password": uri, "extra": {"type": "sql", "secret_property": "uri"}}
        monkeypatch.setenv(f"AIRFLOW_CONN_{CATALOG_CONN_ID.upper()}", json.dumps(catalog))
        monkeypatch.setenv("CDC_EXAMPLE_TABLE_CATALOG_CONN_ID", CATALOG_CONN_ID)
    Variable.delete("cdc_offset__shop")
    dag, capture = load_example_dag()
    assert capture.object_store_conn_id == CONN_ID and capture.sink_format == sink_format
    errors: dict = {}
    dag.default_args["on_failure_callback"] = af.failure_recorder(errors)
    return dag, capture, errors


@pytest.mark.parametrize("sink_format", ["parquet", "delta", "iceberg"])
def test_example_dag_lands_on_s3_with_an_aws_connection(
    db15, airflow_db, spark, s3_server, s3_prefix, s3_aws_connection, monkeypatch, capfd, sink_format
):
    from airflow.models import Variable

    db = db15
    dag, capture, errors = _example_on_s3(db, s3_server, s3_prefix, monkeypatch, sink_format)
    capfd.readouterr()
    result = af.run(dag, 0, errors=errors)
    printed = capfd.readouterr()
    assert result.state == "success", {t: result.error(t) for t in errors}
    assert result.tasks["snapshot"] == "success" and result.tasks["current_state"] == "success"

    _, root = object_store.split_bucket(s3_prefix)
    keys = s3_server.keys(BUCKET, root + "/")
    assert any("/_cdc_log/" in k for k in keys), keys  # the commit log is in the bucket
    assert any(k.startswith(f"{root}/state/") for k in keys), keys  # and the current-state tables
    assert not [k for k in keys if ".cdc-setup-probe-" in k]  # setup's probe objects are gone

    # The product's reader, from the store (with the connection's access, as a task has it).
    catalog = capture.catalog_properties() if sink_format == "iceberg" else None
    with object_store.using(capture.object_store_access()):
        assert [e.window.kind for e in committed_windows(s3_prefix, "shop")][:1] == ["snapshot"]
        with db.connect() as conn:
            for table, keys_of in KEYS.items():
                events = read_topic_arrow(s3_prefix, "shop", f"shop.{table}", table_catalog=catalog)
                assert events is not None, table
                assert_same_state(replay(events.to_pylist(), keys_of), source_rows(conn, table, keys_of))

    # A third-party reader, from the store with its own S3 client: Polars.
    import polars as pl

    options = _polars_options(s3_server)
    orders = f"{s3_prefix}/shop.public.orders"
    if sink_format == "parquet":
        frame = pl.read_parquet(f"{orders}/**/*.parquet", storage_options=options)
    elif sink_format == "delta":
        frame = pl.scan_delta(orders, storage_options=options).collect()
    else:
        from airflow_provider_cdc.cdc.basics.naming import Topic
        from airflow_provider_cdc.cdc.sinks.lake_tables import table_format

        with object_store.using(capture.object_store_access()):
            tables = table_format("iceberg", s3_prefix, "shop", catalog)
            metadata = tables.load(Topic.for_table("shop", "public", "orders")).metadata_location
        iceberg_options = {
            "s3.endpoint": s3_server.endpoint_url,
            "s3.access-key-id": ADMIN[0],
            "s3.secret-access-key": ADMIN[1],
            "s3.region": REGION,
            "s3.force-virtual-addressing": "false",
        }
        frame = pl.scan_iceberg(metadata, storage_options=iceberg_options).collect()
    with db.connect() as conn:
        assert frame.height >= len(source_rows(conn, "public.orders", ["id"]))

    # The secret key is nowhere a user or another task sees.
    _assert_secret_kept(dag, result, printed.out + printed.err, [ADMIN[1]])
    Variable.delete("cdc_offset__shop")


def _assert_secret_kept(dag, result, log_text: str, secrets: list[str]) -> None:
    from airflow.models.asset import AssetEvent
    from airflow.models.renderedtifields import RenderedTaskInstanceFields
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rendered = [
            json.dumps(r.rendered_fields, default=str)
            for r in session.scalars(
                select(RenderedTaskInstanceFields).where(RenderedTaskInstanceFields.dag_id == dag.dag_id)
            )
        ]
        events = [
            json.dumps(e.extra, default=str)
            for e in session.scalars(select(AssetEvent).where(AssetEvent.source_dag_id == dag.dag_id))
        ]
    assert events  # the runs' asset events were recorded, and are checked
    places = {
        "xcom": json.dumps(result.xcom, default=str),
        "task log": log_text,
        "rendered template fields": "\n".join(rendered),
        "asset events": "\n".join(events),
        "exceptions": "\n".join(f"{type(e).__name__}: {e}" for e in result.errors.values()),
        "repr of the tasks": "\n".join(repr(t) + repr(getattr(t, "capture", "")) for t in dag.tasks),
    }
    for secret in secrets:
        leaked = [where for where, text in places.items() if secret in text]
        assert not leaked, f"the secret key shows in: {leaked}"


def test_a_submitted_window_gets_the_keys_in_its_environment_not_its_spec(
    db15, airflow_db, spark, s3_server, s3_prefix, s3_aws_connection, monkeypatch, capfd
):
    """One window through ``spark-submit``: the spec file holds the endpoint and no key; the job
    reads the keys from its environment and lands on the store."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
    from airflow.sdk import DAG

    from airflow_provider_cdc.cdc.sinks.object_store import OBJECT_STORE_SECRET_ENV
    from airflow_provider_cdc.operators.setup import CdcSetupOperator
    from airflow_provider_cdc.operators.snapshot import CdcSnapshotOperator
    from airflow_provider_cdc.operators.window import CdcWindowOperator

    db = db15
    _, capture, errors = _example_on_s3(db, s3_server, s3_prefix, monkeypatch, "parquet")
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    submitted: list[dict] = []
    original_submit = SparkSubmitHook.submit

    def recording_submit(self, application: str = "", **kwargs):
        args = self._application_args
        spec_path = Path(args[args.index("--spec") + 1])
        submitted.append({"spec": spec_path.read_text(), "env": {**(kwargs.get("env") or {}), **(self._env or {})}})
        return original_submit(self, application, **kwargs)

    monkeypatch.setattr(SparkSubmitHook, "submit", recording_submit)
    with DAG("s3_submitted", schedule=None, default_args={"on_failure_callback": af.failure_recorder(errors)}) as dag:
        setup = CdcSetupOperator(task_id="setup", capture=capture)
        snapshot = CdcSnapshotOperator(task_id="snapshot", capture=capture)
        window = CdcWindowOperator(task_id="window", capture=replace(capture, spark_conn_id="spark_local"))
        setup >> snapshot >> window
    af.register(dag)
    result = af.run(dag, 0, errors=errors)
    printed = capfd.readouterr()
    assert result.state == "success", {t: result.error(t) for t in errors}
    assert len(submitted) == 1
    spec = json.loads(submitted[0]["spec"])
    assert spec["options"]["object_store"] == {
        "endpoint_url": s3_server.endpoint_url,
        "region": REGION,
        "path_style": True,
    }
    assert ADMIN[0] not in submitted[0]["spec"] and ADMIN[1] not in submitted[0]["spec"]
    assert json.loads(submitted[0]["env"][OBJECT_STORE_SECRET_ENV])["secret_access_key"] == ADMIN[1]
    assert result.xcom["window"]["job_pid"] != os.getpid()  # the submitted job landed, with the keys of its env
    _assert_secret_kept(dag, result, printed.out + printed.err, [ADMIN[1]])
