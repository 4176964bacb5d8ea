"""Every trigger survives the trip to the triggerer: Airflow re-creates it from ``serialize()``
(its class path and keyword arguments), so each constructor argument must come back as given."""

from __future__ import annotations

import importlib

import pytest

from airflow_provider_cdc.triggers.postgres_cdc import PostgresCdcChangesTrigger, PostgresCdcSlotHealthTrigger
from airflow_provider_cdc.triggers.sqlserver_cdc import SqlServerCdcChangesTrigger
from airflow_provider_cdc.triggers.yugabyte_cdc import YugabyteCdcChangesTrigger
from airflow_provider_cdc.triggers.yugabyte_cdc_service import YugabyteCdcServiceChangesTrigger

#: Each trigger with a value other than its default for every argument.
TRIGGERS = {
    "postgres": lambda: PostgresCdcChangesTrigger("pg", "slot_a", 7, 1.5, "pub_a", 9.0),
    "postgres health": lambda: PostgresCdcSlotHealthTrigger("pg", "slot_a", {"max_lag_bytes": 5}, 1.5, 30.0, 9.0),
    "sqlserver": lambda: SqlServerCdcChangesTrigger("ms", "2026-11-27T10:00:00+00:00", 1.5, "FreeTDS", "CET", 9.0),
    "yugabytedb": lambda: YugabyteCdcChangesTrigger("yb", "slot_a", "2026-11-27T10:00:00+00:00", 1.5, 123, 9.0),
    "yugabytedb cdc service": lambda: YugabyteCdcServiceChangesTrigger(
        "ybc", "0" * 32, "2026-11-27T10:00:00+00:00", 1.5, 123, 9.0, "127.0.0.1:7100"
    ),
}


@pytest.mark.parametrize("source", TRIGGERS)
def test_a_trigger_is_recreated_from_its_serialized_form(source):
    trigger = TRIGGERS[source]()
    path, kwargs = trigger.serialize()
    module, _, name = path.rpartition(".")
    again = getattr(importlib.import_module(module), name)(**kwargs)
    assert type(again) is type(trigger)
    assert again.serialize() == (path, kwargs)
    assert 9.0 in kwargs.values() and 1.5 in kwargs.values()  # check_timeout and poll_interval travel too
    assert again.conn_id == trigger.conn_id
