"""The fault-injection points on the product path are inert in production (issue 30, item 12):
without ``AIRFLOW_CDC_FAULT`` a point is one environment lookup; with a value that is not a
fault spec of a documented point, the task is refused rather than silently left unarmed."""

from __future__ import annotations

import ast
import logging
from collections import Counter
from pathlib import Path

import pytest

import airflow_provider_cdc
from airflow_provider_cdc.cdc.basics import faults
from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError, CdcTransientError

PACKAGE = Path(airflow_provider_cdc.__file__).parent


@pytest.fixture(autouse=True)
def fresh_counts(monkeypatch):
    monkeypatch.setattr(faults, "_hits", Counter())
    monkeypatch.delenv(faults.ENV, raising=False)
    monkeypatch.delenv(faults.ONCE_ENV, raising=False)


def test_the_package_reaches_only_documented_points():
    called = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "point"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "faults"
            ):
                called.add(node.args[0].value)
    assert called == set(faults.POINTS)
    assert all(f"``{p}``" in faults.__doc__ for p in faults.POINTS)


def test_without_the_variable_every_point_is_a_no_op():
    for name in faults.POINTS:
        assert faults.point(name) is None
    assert faults._hits == Counter()


@pytest.mark.parametrize(
    "spec",
    ["window.strem:raise", "window.streaming:explode", "window.streaming:raise:0", "window.streaming:raise:x", "1"],
)
def test_a_value_that_is_not_a_fault_spec_is_refused(monkeypatch, spec):
    monkeypatch.setenv(faults.ENV, spec)
    with pytest.raises(CdcConfigurationError, match=r"AIRFLOW_CDC_FAULT=.*test hook.*unset it"):
        faults.point("window.streaming")


def test_an_armed_fault_says_so_in_the_task_log_and_fires(monkeypatch, caplog):
    monkeypatch.setenv(faults.ENV, "window.read_done:raise:2")
    with caplog.at_level(logging.WARNING, logger=faults.__name__):
        faults.point("window.streaming")  # another point: not counted
        faults.point("window.read_done")  # the first time: not yet
        with pytest.raises(CdcTransientError, match=r"fault injected at window\.read_done"):
            faults.point("window.read_done")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "fault injection is armed" in warnings[0]
