"""YugabyteDB's planning, health, readiness, snapshot ranges and spec, without a server."""

from __future__ import annotations

import itertools
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError, OffsetMismatchError, WalLostError
from airflow_provider_cdc.cdc.planning.offset import OffsetIdentity
from airflow_provider_cdc.cdc.sources.yugabyte.admin import YbSlotStatus
from airflow_provider_cdc.cdc.sources.yugabyte.health import assess_expiry
from airflow_provider_cdc.cdc.sources.yugabyte.lsn import YbLsn, ht_from_datetime, ht_from_unix_us
from airflow_provider_cdc.cdc.sources.yugabyte.offset import YugabyteOffset
from airflow_provider_cdc.cdc.sources.yugabyte.pending import slot_readiness
from airflow_provider_cdc.cdc.sources.yugabyte.planning import plan_stream_window, slot_unavailable
from airflow_provider_cdc.cdc.sources.yugabyte.snapshot import HASH_SPACE, hash_ranges, partition_count

IDENTITY = OffsetIdentity("shop", "7311", "shop", "cdc_shop")
HOUR_MS = 3_600_000
NOW_MS = 1_800_000_000_000
NOW_HT = ht_from_unix_us(NOW_MS * 1000)


def slot(**changes) -> YbSlotStatus:
    base = YbSlotStatus(
        slot_name="cdc_shop",
        plugin="yboutput",
        slot_type="logical",
        database="shop",
        active=False,
        restart_lsn=None,
        confirmed_flush_lsn=None,
        stream_id="abc",
        restart_commit_ht=ht_from_unix_us((NOW_MS - 60_000) * 1000),
        lsn_type="HYBRID_TIME",
        current_ht=NOW_HT,
    )
    return replace(base, **changes)


def offset(lsn: int, *, last_read_ms: int | None = NOW_MS - 60_000, **changes) -> YugabyteOffset:
    extra = {} if last_read_ms is None else {"source_state": {"last_read_ms": last_read_ms}}
    return YugabyteOffset(
        identity=IDENTITY, lsn=YbLsn(lsn), snapshot_completed=True, window_seq=1, extra=extra, **changes
    )


def test_window_ends_after_the_end_hybrid_time_and_starts_at_the_offset():
    stored = offset(NOW_HT - 5000)
    plan = plan_stream_window(
        mode="initial",
        offset=stored,
        slot=slot(),
        identity=IDENTITY,
        end=NOW_HT - 10,
        current=NOW_HT,
        now_ms=NOW_MS,
        retention_ms=8 * HOUR_MS,
    )
    assert plan.window.from_lsn == NOW_HT - 5000
    assert plan.window.to_lsn == NOW_HT - 9  # commits at or before the end: [from, end + 1)
    assert plan.window.seq == 2 and plan.acknowledge_first is None
    assert plan.offset.pending == plan.window


def test_a_retry_reproduces_the_pending_window_whatever_the_new_end():
    stored = offset(NOW_HT - 5000)
    first = plan_stream_window(
        mode="initial",
        offset=stored,
        slot=slot(),
        identity=IDENTITY,
        end=NOW_HT - 10,
        current=NOW_HT,
        now_ms=NOW_MS,
        retention_ms=8 * HOUR_MS,
    )
    again = plan_stream_window(
        mode="initial",
        offset=first.offset,
        slot=slot(current_ht=NOW_HT + 99),
        identity=IDENTITY,
        end=NOW_HT + 50,
        current=NOW_HT + 99,
        now_ms=NOW_MS + 1,
        retention_ms=8 * HOUR_MS,
    )
    assert again.window == first.window


def test_a_slot_acknowledged_past_the_offset_fails():
    stored = offset(NOW_HT - 5000)
    ahead = slot(confirmed_flush_lsn=YbLsn(NOW_HT - 5000))  # the offset's own start: acknowledged too far
    with pytest.raises(OffsetMismatchError, match="past the stored offset"):
        plan_stream_window(
            mode="initial",
            offset=stored,
            slot=ahead,
            identity=IDENTITY,
            end=NOW_HT,
            current=NOW_HT,
            now_ms=NOW_MS,
            retention_ms=8 * HOUR_MS,
        )
    # Acknowledged exactly up to the previous window's end: the normal state.
    assert (
        slot_unavailable(stored, slot(confirmed_flush_lsn=YbLsn(NOW_HT - 5001)), retention_ms=HOUR_MS, now_ms=NOW_MS)
        is None
    )


def test_a_slot_not_read_within_the_retention_counts_as_expired():
    stored = offset(NOW_HT - 5000, last_read_ms=NOW_MS - 9 * HOUR_MS)
    reason, why = slot_unavailable(stored, slot(), retention_ms=8 * HOUR_MS, now_ms=NOW_MS)
    assert reason == "slot_expired" and "9.0 h ago" in why
    with pytest.raises(WalLostError, match="expired"):
        plan_stream_window(
            mode="initial",
            offset=stored,
            slot=slot(),
            identity=IDENTITY,
            end=NOW_HT,
            current=NOW_HT,
            now_ms=NOW_MS,
            retention_ms=8 * HOUR_MS,
        )
    assert slot_unavailable(stored, None, retention_ms=8 * HOUR_MS, now_ms=NOW_MS)[0] == "slot_missing"


def test_health_reports_time_to_expiry_and_fails_at_the_fraction():
    healthy = assess_expiry(
        slot(),
        "cdc_shop",
        last_read_ms=NOW_MS - HOUR_MS,
        retention_ms=8 * HOUR_MS,
        now_ms=NOW_MS,
        max_retention_fraction=0.5,
    )
    assert healthy.healthy and healthy.metrics["ms_to_expiry"] == 7 * HOUR_MS
    assert healthy.metrics["retention_fraction"] == 0.125
    late = assess_expiry(
        slot(),
        "cdc_shop",
        last_read_ms=NOW_MS - 5 * HOUR_MS,
        retention_ms=8 * HOUR_MS,
        now_ms=NOW_MS,
        max_retention_fraction=0.5,
    )
    assert not late.healthy and "expires in 3.00 h" in late.message
    expired = assess_expiry(
        slot(), "cdc_shop", last_read_ms=NOW_MS - 9 * HOUR_MS, retention_ms=8 * HOUR_MS, now_ms=NOW_MS
    )
    assert "has expired" in expired.message
    lagging = assess_expiry(
        slot(), "cdc_shop", last_read_ms=NOW_MS, retention_ms=8 * HOUR_MS, now_ms=NOW_MS, max_lag_ms=1000
    )
    assert not lagging.healthy and "last acknowledged commit 60000 ms ago" in lagging.message
    assert not assess_expiry(None, "cdc_shop", last_read_ms=None, retention_ms=HOUR_MS, now_ms=NOW_MS).healthy
    with pytest.raises(CdcConfigurationError):
        assess_expiry(
            slot(), "cdc_shop", last_read_ms=None, retention_ms=HOUR_MS, now_ms=NOW_MS, max_retention_fraction=0
        )


def test_readiness_waits_for_the_server_clock_to_pass_the_interval_end():
    now = datetime.fromtimestamp(NOW_MS / 1000, timezone.utc)
    assert (
        slot_readiness(slot(), "s", wait_until=now - timedelta(seconds=1), expires_ms=None, now_ms=NOW_MS).state
        == "ready"
    )
    assert (
        slot_readiness(slot(), "s", wait_until=now + timedelta(seconds=1), expires_ms=None, now_ms=NOW_MS).state
        == "waiting"
    )
    assert slot_readiness(slot(), "s", wait_until=None, expires_ms=NOW_MS - 1, now_ms=NOW_MS).state == "failed"
    assert slot_readiness(None, "s", wait_until=None, expires_ms=None, now_ms=NOW_MS).state == "failed"
    assert ht_from_datetime(now) == NOW_HT


@pytest.mark.parametrize("count", [1, 2, 3, 7, 64, 1000])
def test_hash_ranges_cover_the_hash_space_exactly_once(count):
    ranges = hash_ranges(("id",), count)
    assert ranges[0].first == 0 and ranges[-1].end == HASH_SPACE
    assert all(a.end == b.first for a, b in itertools.pairwise(ranges))
    assert len(ranges) == min(count, HASH_SPACE)


def test_partition_count_splits_large_tables_in_whole_waves():
    assert partition_count(10, max_partitions=64, parallelism=4) == 1
    assert partition_count(-1, max_partitions=64, parallelism=4) == 4  # never analysed: one wave
    assert partition_count(9_000_000, max_partitions=64, parallelism=4) == 12
    assert partition_count(900_000_000, max_partitions=64, parallelism=4) == 64


def test_a_slot_no_window_read_within_the_not_of_interest_timeout_has_lost_its_tables():
    """A snapshot records when the first window must read its new slot (the slot's creation plus
    cdcsdk_tablet_not_of_interest_timeout_secs); later, YugabyteDB keeps none of its tables' changes."""
    due = NOW_MS - 60_000
    stored = offset(NOW_HT - 5000, last_read_ms=None)
    stored = replace(stored, extra={"source_state": {"last_read_ms": due - 4 * HOUR_MS, "first_poll_due_ms": due}})
    reason, why = slot_unavailable(stored, slot(), retention_ms=8 * HOUR_MS, now_ms=NOW_MS)
    assert reason == "slot_not_of_interest" and "cdcsdk_tablet_not_of_interest_timeout_secs" in why
    with pytest.raises(WalLostError, match="not_of_interest"):
        plan_stream_window(
            mode="initial",
            offset=stored,
            slot=slot(),
            identity=IDENTITY,
            end=NOW_HT,
            current=NOW_HT,
            now_ms=NOW_MS,
            retention_ms=8 * HOUR_MS,
        )
    in_time = replace(stored, extra={"source_state": {"last_read_ms": NOW_MS - HOUR_MS, "first_poll_due_ms": NOW_MS}})
    assert slot_unavailable(in_time, slot(), retention_ms=8 * HOUR_MS, now_ms=NOW_MS) is None


@pytest.mark.parametrize(
    ("sqlstate", "text", "terminal"),
    [
        ("XX000", "stream ID 7d9c is expired for Tablet ID 55aa", True),
        ("XX000", "Stream ID 7d9c is expired for Tablet ID 55aa", True),
        ("40001", "Operation expired: Transaction 1f2e expired or aborted by a conflict", False),
        ("XX000", "Operation expired: Timed out waiting for the tablet", False),
    ],
)
def test_only_the_cdc_services_expiry_inside_a_stream_is_a_lost_slot(sqlstate, text, terminal):
    """YugabyteDB's expiry text is "Stream ID … is expired for Tablet ID …" (cdc_service.cc
    CheckStreamActive); other errors that say "expired" (a conflict, 40001; a timeout) stay transient."""
    from airflow_provider_cdc.cdc.basics.errors import CdcTransientError
    from airflow_provider_cdc.cdc.sources.postgres.replication import StreamErrorResponse
    from airflow_provider_cdc.cdc.sources.yugabyte.admin import in_stream_error

    error = in_stream_error("cdc_shop", StreamErrorResponse(f"stream failed: {text}", sqlstate, text))
    assert isinstance(error, WalLostError) is terminal
    assert isinstance(error, CdcTransientError) is not terminal
