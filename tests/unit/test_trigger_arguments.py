"""Every trigger survives the trip to the triggerer: Airflow re-creates it from ``serialize()``
(its class path and keyword arguments), so each constructor argument must come back as given."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import airflow_provider_cdc.triggers as triggers_package
from airflow_provider_cdc.triggers.polling import ArgumentsTrigger
from airflow_provider_cdc.triggers.postgres_cdc import PostgresCdcChangesTrigger, PostgresCdcSlotHealthTrigger
from airflow_provider_cdc.triggers.sqlserver_cdc import SqlServerCdcChangesTrigger
from airflow_provider_cdc.triggers.yugabyte_cdc import YugabyteCdcChangesTrigger
from airflow_provider_cdc.triggers.yugabyte_cdc_service import YugabyteCdcServiceChangesTrigger

UNTIL = "2026-11-27T10:00:00+00:00"
#: Each trigger with a value other than its default for every argument, by position.
ARGUMENTS = {
    PostgresCdcChangesTrigger: ("pg", "slot_a", 7, 1.5, "pub_a", 9.0),
    PostgresCdcSlotHealthTrigger: ("pg", "slot_a", {"max_lag_bytes": 5}, 1.5, 30.0, 9.0),
    SqlServerCdcChangesTrigger: ("ms", UNTIL, 1.5, "FreeTDS", "CET", 9.0),
    YugabyteCdcChangesTrigger: ("yb", "slot_a", UNTIL, 1.5, 123, 9.0),
    YugabyteCdcServiceChangesTrigger: ("ybc", "0" * 32, UNTIL, 1.5, 123, 9.0, "127.0.0.1:7100"),
}


def _concrete_triggers() -> set[type]:
    for module in pkgutil.iter_modules(triggers_package.__path__):
        importlib.import_module(f"{triggers_package.__name__}.{module.name}")
    found, pending = set(), [ArgumentsTrigger]
    while pending:
        for subclass in pending.pop().__subclasses__():
            pending.append(subclass)
            if not inspect.isabstract(subclass):
                found.add(subclass)
    return found


def test_every_trigger_is_covered():
    assert _concrete_triggers() == set(ARGUMENTS)


@pytest.mark.parametrize("cls", ARGUMENTS, ids=lambda cls: cls.__name__)
def test_a_trigger_is_recreated_from_its_serialized_form(cls):
    arguments = ARGUMENTS[cls]
    path, kwargs = cls(*arguments).serialize()
    assert path == f"{cls.__module__}.{cls.__qualname__}"
    # Exactly the constructor's arguments, each as given (none left at a default here).
    given = inspect.signature(cls).bind(*arguments)
    given.apply_defaults()
    assert kwargs == dict(given.arguments)
    module, _, name = path.rpartition(".")
    again = getattr(importlib.import_module(module), name)(**kwargs)
    assert again.serialize() == (path, kwargs)
