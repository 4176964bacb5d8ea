"""Slot health verdicts: thresholds against max_slot_wal_keep_size, lag and retained bytes."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.sources.postgres.health import HealthThresholds, assess
from airflow_provider_cdc.cdc.sources.postgres.lsn import Lsn
from tests.unit.cdc.postgres.test_planning import slot

MB = 1024 * 1024


def reading(restart: int, confirmed: int, current: int, wal_status: str = "reserved", safe: int | None = None):
    return dataclasses.replace(
        slot(confirmed=confirmed, wal_status=wal_status, current=current),
        restart_lsn=Lsn(restart),
        safe_wal_size=safe,
    )


def test_healthy_slot_reports_its_metrics():
    health = assess(reading(0, 5 * MB, 10 * MB), "slot", 100 * MB, HealthThresholds())
    assert health.healthy and not health.warnings
    assert health.metrics["retained_bytes"] == 10 * MB and health.metrics["lag_bytes"] == 5 * MB
    assert health.metrics["retained_fraction"] == 0.1
    assert "is healthy" in health.summary()


@pytest.mark.parametrize(
    ("status", "keep", "thresholds", "expected"),
    [
        (None, 100 * MB, HealthThresholds(), "does not exist"),
        (reading(0, 0, 10 * MB, "lost"), 100 * MB, HealthThresholds(), "wal_status 'lost'"),
        (reading(0, 0, 10 * MB, "unreserved"), 8 * MB, HealthThresholds(), "wal_status 'unreserved'"),
        (reading(0, 0, 85 * MB, safe=15 * MB), 100 * MB, HealthThresholds(), "85% of max_slot_wal_keep_size"),
        (reading(0, 0, 30 * MB), 100 * MB, HealthThresholds(max_retained_fraction=0.25), "30% of"),
        (reading(0, 0, 30 * MB), -1, HealthThresholds(max_retained_bytes=20 * MB), "limit 20971520"),
        (reading(0, 1 * MB, 30 * MB), 100 * MB, HealthThresholds(max_lag_bytes=MB), "bytes behind the server"),
    ],
)
def test_unhealthy_verdicts_say_what_to_do(status, keep, thresholds, expected):
    health = assess(status, "slot", keep, thresholds)
    assert not health.healthy
    assert expected in health.summary()
    assert health.to_dict()["healthy"] is False


def test_unlimited_keep_size_is_stated_not_warned_every_run():
    """Setup warns about an unlimited keep size once, when it creates the slot; the per-run check
    states it among the facts (and explains why restart_lsn trails the acknowledged position)."""
    health = assess(reading(2 * MB, 29 * MB, 30 * MB), "slot", -1, HealthThresholds())
    assert health.healthy and not health.warnings
    assert health.metrics["max_slot_wal_keep_size"] is None
    summary = health.summary()
    assert "acknowledged up to 0/1D00000, 1048576 bytes behind the server" in summary
    assert "29360128 bytes of WAL retained from restart_lsn 0/200000, max_slot_wal_keep_size unlimited" in summary
    assert "running-transactions record decoded since the previous acknowledgement" in summary
    limited = assess(reading(2 * MB, 29 * MB, 30 * MB), "slot", 100 * MB, HealthThresholds()).summary()
    assert "28% of max_slot_wal_keep_size (104857600)" in limited


def test_the_bytes_behind_are_explained_in_terms_that_match_their_size():
    """Right after a window the slot is about one end-of-window message behind; 50 kB behind is the
    server's other WAL since, not "at least a 96-byte message"."""
    just_after = assess(reading(0, 5 * MB, 5 * MB + 96), "slot", 100 * MB, HealthThresholds()).summary()
    assert "96 bytes behind the server (about what a window leaves: its 96-byte end-of-window message" in just_after
    idle = assess(reading(0, 5 * MB, 5 * MB), "slot", 100 * MB, HealthThresholds()).summary()
    assert "0 bytes behind the server (nothing written since the last acknowledgement)" in idle
    busy = assess(reading(0, 5 * MB, 5 * MB + 50_000), "slot", 100 * MB, HealthThresholds()).summary()
    assert "50000 bytes behind the server (WAL the whole server wrote since the last window" in busy
    assert "96-byte" not in busy


@pytest.mark.parametrize("bad", [{"max_retained_fraction": 0}, {"max_retained_fraction": 1.5}, {"max_lag_bytes": 0}])
def test_bad_thresholds_are_refused(bad):
    with pytest.raises(CdcConfigurationError):
        HealthThresholds(**bad)


@given(
    retained=st.integers(0, 10**12),
    keep=st.integers(1, 10**12),
    fraction=st.floats(0.01, 1.0),
)
def test_fraction_threshold_is_exact(retained, keep, fraction):
    status = reading(0, retained, retained)
    health = assess(status, "slot", keep, HealthThresholds(max_retained_fraction=fraction))
    assert health.healthy == (retained / keep < fraction)
