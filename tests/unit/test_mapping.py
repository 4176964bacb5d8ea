"""Dynamic task mapping of the capture operators (issue 30, item 6): mapped tasks carry the same
outlets as unmapped ones, what the outlets derive from cannot be mapped, and no credential of a
capture reaches the serialized DAG (what the scheduler, the API server and the UI read)."""

from __future__ import annotations

import json

import pendulum
import pytest

from airflow_provider_cdc.capture import PostgresCapture
from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.operators.current_state import CdcCurrentStateOperator
from airflow_provider_cdc.operators.setup import CdcSetupOperator
from airflow_provider_cdc.operators.window import CdcWindowOperator

SECRET = "s3cr3t-KEY-4b1d"
START = pendulum.datetime(2026, 1, 1, tz="UTC")


def _capture(**overrides) -> PostgresCapture:
    settings = {
        "postgres_conn_id": "src",
        "tables": ["public.orders", "public.customers"],
        "topic_prefix": "shop",
        "sink_path": "/lake",
        "spark_conf": {"spark.hadoop.fs.s3a.secret.key": SECRET},
    }
    return PostgresCapture(**{**settings, **overrides})


def _uris(outlets) -> list[str]:
    return sorted(getattr(o, "uri", None) or o.name for o in outlets)


def _serialized(dag) -> str:
    from airflow.serialization.serialized_objects import DagSerialization

    return json.dumps(DagSerialization.to_dict(dag), default=str)


def test_mapped_operators_carry_the_outlets_of_unmapped_ones():
    from airflow.sdk import DAG

    capture = _capture()
    include = _capture(tables=(), table_include_list=["public\\..*"])
    with DAG("mapped_outlets", schedule=None, start_date=START) as dag:
        window = CdcWindowOperator.partial(task_id="w", capture=capture).expand(upto_lsn=["0/10", "0/20"])
        state = CdcCurrentStateOperator.partial(task_id="s", capture=capture, state_path="/state").expand(
            as_of_window=["1", "2"]
        )
        by_pattern = CdcWindowOperator.partial(task_id="p", capture=include).expand(upto_lsn=["0/10"])
        plain_window = CdcWindowOperator(task_id="plain_w", capture=capture)
        plain_state = CdcCurrentStateOperator(task_id="plain_s", capture=capture, state_path="/state")
        plain_pattern = CdcWindowOperator(task_id="plain_p", capture=include)
    assert _uris(window.outlets) == _uris(plain_window.outlets) and window.outlets
    assert _uris(state.outlets) == _uris(plain_state.outlets) and state.outlets
    assert _uris(by_pattern.outlets) == _uris(plain_pattern.outlets)
    serialized = _serialized(dag)
    for uri in _uris(window.outlets) + _uris(state.outlets):
        assert serialized.count(uri) >= 2, f"{uri} is not an outlet of the serialized mapped task"


@pytest.mark.parametrize(
    ("operator", "partial", "expand", "refused"),
    [
        (CdcWindowOperator, {}, {"capture": "captures"}, "capture"),
        (CdcSetupOperator, {}, {"capture": "captures"}, "capture"),
        (CdcCurrentStateOperator, {"capture": "one"}, {"state_path": ["/a", "/b"]}, "state_path"),
        (
            CdcCurrentStateOperator,
            {"capture": "one", "state_path": "/s"},
            {"tables": [["public.orders"]]},
            "tables",
        ),
    ],
)
def test_mapping_over_what_outlets_derive_from_is_refused(operator, partial, expand, refused):
    from airflow.sdk import DAG

    captures = [_capture(), _capture(topic_prefix="other")]
    values = {"captures": captures, "one": captures[0]}
    partial = {k: values.get(v, v) for k, v in partial.items()}
    expand = {k: values.get(v, v) if isinstance(v, str) else v for k, v in expand.items()}
    with DAG("mapped_refused", schedule=None, start_date=START):
        with pytest.raises(CdcConfigurationError, match=f"'{refused}'.*cannot be mapped") as err:
            operator.partial(task_id="t", **partial).expand(**expand)
    assert SECRET not in str(err.value)


@pytest.mark.parametrize(
    "secret_setting",
    [
        {},  # spark_conf (the default _capture)
        # A pseudonymisation salt is part of the mask's name (Debezium's column.mask.hash option).
        {"column_masks": {f"column.mask.hash.SHA-256.with.salt.{SECRET}": "public.orders.email"}},
        {"table_catalog": {"uri": f"https://catalog/?token={SECRET}"}, "sink_format": "iceberg"},
        {"heartbeat_action_query": f"SELECT '{SECRET}'"},
    ],
    ids=["spark_conf", "column_masks", "table_catalog", "heartbeat_action_query"],
)
def test_no_credential_of_a_capture_reaches_the_serialized_dag_or_its_repr(secret_setting):
    from airflow.sdk import DAG

    capture = _capture(**secret_setting)
    with DAG("mapped_secret", schedule=None, start_date=START) as dag:
        CdcWindowOperator.partial(task_id="w", capture=capture).expand(upto_lsn=["0/10", "0/20"])
        CdcCurrentStateOperator.partial(task_id="s", capture=capture, state_path="/state").expand(as_of_window=["1"])
        CdcSetupOperator(task_id="setup", capture=capture)
    serialized = _serialized(dag)
    assert "PostgresCapture" in serialized and "'shop'" in serialized  # the capture is there, by its identifiers...
    assert SECRET not in serialized  # ...without its secret
    assert SECRET not in repr(capture) and SECRET not in str(capture)  # what a log line would print
