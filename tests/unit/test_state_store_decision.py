"""Airflow's state store (AIP-103) is not offered as an offset store: docs/reliability.md says
why. These checks pin the two facts that decision rests on, against the installed Airflow, so
an Airflow upgrade that changes either fails here and the decision is taken again."""

from __future__ import annotations

import inspect

import pytest

pytestmark = pytest.mark.airflow


def test_state_store_writes_are_plain_overwrites():
    from airflow.sdk.api.datamodels._generated import AssetStateStorePutBody, TaskStateStorePutBody

    # A compare-and-set needs an expected value or version in the write; there is none.
    assert set(AssetStateStorePutBody.model_fields) == {"value"}
    assert set(TaskStateStorePutBody.model_fields) == {"value", "expires_at"}
    from airflow.sdk._shared.state import BaseStoreBackend

    assert list(inspect.signature(BaseStoreBackend.set).parameters) == [
        "self",
        "scope",
        "key",
        "value",
        "expires_at",
        "session",
    ]


def test_scheduler_deletes_the_state_of_unreferenced_assets():
    from airflow.jobs.scheduler_job_runner import SchedulerJobRunner

    cleanup = inspect.getsource(SchedulerJobRunner._cleanup_orphaned_asset_state_store)
    assert "delete(AssetStateStoreModel)" in cleanup
    caller = inspect.getsource(SchedulerJobRunner)
    assert "self._cleanup_orphaned_asset_state_store(session=session)" in caller
