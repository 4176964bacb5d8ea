"""OpenLineage of the capture operators, as the OpenLineage provider's own ExtractorManager reads it
(issue 30, item 2): no event claims a read or a write the run did not do."""

from __future__ import annotations

from types import SimpleNamespace

import pendulum
import pytest

from airflow_provider_cdc.capture import PostgresCapture
from airflow_provider_cdc.cdc.basics.naming import Topic
from airflow_provider_cdc.operators.current_state import CdcCurrentStateOperator
from airflow_provider_cdc.operators.snapshot import CdcSnapshotOperator
from airflow_provider_cdc.operators.window import CdcWindowOperator

pytest.importorskip("airflow.providers.openlineage")

START = pendulum.datetime(2026, 1, 1, tz="UTC")


def _capture(sink, **overrides) -> PostgresCapture:
    settings = {"postgres_conn_id": "src", "tables": ["public.t"], "topic_prefix": "acc", "sink_path": str(sink)}
    return PostgresCapture(**{**settings, **overrides})


def _extract(operator, state: str) -> tuple[list, list]:
    from airflow.providers.openlineage.extractors.manager import ExtractorManager
    from airflow.utils.state import TaskInstanceState

    found = ExtractorManager().extract_metadata(SimpleNamespace(run_id="r"), operator, TaskInstanceState(state), None)
    return [(d.namespace, d.name) for d in found.inputs], [(d.namespace, d.name) for d in found.outputs]


def test_start_events_claim_no_dataset(tmp_path):
    """The START event comes before the run decided anything: a snapshot that is not due, a window
    with nothing to land read and write nothing (the COMPLETE event says what a run did)."""
    from airflow.sdk import DAG

    capture = _capture(tmp_path / "lake")
    with DAG("lineage_start", schedule=None, start_date=START):
        operators = [
            CdcSnapshotOperator(task_id="snapshot", capture=capture),
            CdcWindowOperator(task_id="window", capture=capture),
            CdcCurrentStateOperator(task_id="state", capture=capture, state_path=str(tmp_path / "state")),
        ]
    for operator in operators:
        assert operator.outlets, "the task keeps its outlets (its asset events)"
        assert _extract(operator, "running") == ([], []), operator.task_id


@pytest.mark.parametrize(
    ("result", "changed"),
    [
        ({"action": "applied"}, True),
        ({"action": "rebuilt"}, True),
        ({"action": "applied", "merge": {"action": "merged"}}, True),
        ({"action": "applied", "merge": {"action": "rewritten"}}, True),
        # A lake table's MERGE with nothing to merge committed nothing.
        ({"action": "applied", "merge": {"action": "empty"}}, False),
        # A cleared or past run on Iceberg/Delta reading a state version that exists.
        ({"action": "time_travel"}, False),
        ({"action": "unchanged"}, False),
        ({"action": "empty"}, False),
    ],
)
def test_state_lineage_reports_only_versions_written(tmp_path, result, changed):
    from airflow.sdk import DAG

    capture = _capture(tmp_path / "lake", sink_format="iceberg")
    with DAG("lineage_state", schedule=None, start_date=START):
        operator = CdcCurrentStateOperator(task_id="s", capture=capture, state_path=str(tmp_path / "state"))
    operator._ran = True
    operator._state_results = [{"topic": Topic.for_table("acc", "public", "t").name, **result}]
    inputs, outputs = _extract(operator, "success")
    if changed:
        assert [n for _, n in outputs] == [f"{tmp_path}/state/acc.public.t"] and len(inputs) == 1
    else:
        assert (inputs, outputs) == ([], []), f"{result} wrote nothing"
