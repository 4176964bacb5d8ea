"""The schedule check of the setup task reads the DAG's schedule through public APIs, and says
when it cannot (issue 30, item 11): no Airflow-core internals behind a broad ``except``."""

from __future__ import annotations

import datetime as dt
import logging
import sys

import pendulum
import pytest

from airflow_provider_cdc.operators.setup import schedule_gap_ms

HOUR = 3_600_000


@pytest.mark.parametrize(
    ("schedule", "gap"),
    [("@hourly", HOUR), ("@daily", 24 * HOUR), ("0 9 * * 1-5", 72 * HOUR), (dt.timedelta(hours=7), 7 * HOUR)],
)
def test_the_gap_needs_no_airflow_core_internals(schedule, gap, monkeypatch):
    from airflow.sdk import DAG

    for moved in ("airflow.serialization.decoders", "airflow.serialization.encoders", "airflow.timetables.base"):
        monkeypatch.setitem(sys.modules, moved, None)  # as if they moved: importing them fails
    dag = DAG("d", schedule=schedule, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"))
    assert schedule_gap_ms(dag) == gap


def test_several_crons_and_no_schedule():
    from airflow.sdk import DAG, MultipleCronTriggerTimetable

    several = MultipleCronTriggerTimetable("0 6 * * *", "0 18 * * *", timezone="UTC")
    assert schedule_gap_ms(DAG("m", schedule=several, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"))) == 12 * HOUR
    assert schedule_gap_ms(DAG("n", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"))) is None


def test_a_custom_timetable_is_said_to_be_unchecked(caplog):
    from airflow.sdk import DAG
    from airflow.sdk.bases.timetable import BaseTimetable

    class Custom(BaseTimetable):
        periodic = True

    dag = DAG("c", schedule=Custom(), start_date=pendulum.datetime(2026, 1, 1, tz="UTC"))
    with caplog.at_level(logging.WARNING):
        assert schedule_gap_ms(dag) is None
    assert "custom timetable (Custom)" in caplog.text and "skipped" in caplog.text
