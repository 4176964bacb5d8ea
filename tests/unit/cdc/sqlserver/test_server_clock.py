"""The server's local commit times to UTC across DST changes, and the zone check (no database)."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.sources.sqlserver.server_clock import (
    JITTER,
    CommitClock,
    ServerClock,
    is_repeated,
    repeated_hour,
    to_utc,
    zone_of,
)

UTC = timezone.utc
#: (zone, an instant at which its clocks go back, by how much)
FALL_BACKS = [
    ("Europe/Berlin", datetime(2026, 10, 25, 1, 0, tzinfo=UTC), timedelta(hours=1)),
    ("America/New_York", datetime(2026, 11, 1, 6, 0, tzinfo=UTC), timedelta(hours=1)),
    ("Australia/Lord_Howe", datetime(2026, 4, 4, 15, 0, tzinfo=UTC), timedelta(minutes=30)),  # 02:00 -> 01:30
    ("America/Santiago", datetime(2026, 4, 5, 3, 0, tzinfo=UTC), timedelta(hours=1)),
]


def _local(at: datetime, zone: ZoneInfo) -> datetime:
    return at.astimezone(zone).replace(tzinfo=None)


def test_the_repeated_hour_is_found_with_its_bounds():
    berlin = ZoneInfo("Europe/Berlin")
    assert repeated_hour(datetime(2026, 10, 25, 2, 30), berlin) == (
        datetime(2026, 10, 25, 2, 0),
        datetime(2026, 10, 25, 3, 0),
    )
    assert repeated_hour(datetime(2026, 10, 25, 3, 0), berlin) is None
    assert repeated_hour(datetime(2026, 3, 29, 2, 30), berlin) is None  # a gap, not a repeat
    lord_howe = ZoneInfo("Australia/Lord_Howe")
    assert repeated_hour(datetime(2026, 4, 5, 1, 45), lord_howe) == (
        datetime(2026, 4, 5, 1, 30),
        datetime(2026, 4, 5, 2, 0),
    )


def test_a_time_in_the_repeated_hour_is_the_second_pass_after_a_later_first_pass_commit():
    berlin = ZoneInfo("Europe/Berlin")
    first_pass = datetime(2026, 10, 25, 0, 40, tzinfo=UTC)  # 02:40 CEST
    assert to_utc(datetime(2026, 10, 25, 2, 40), berlin) == first_pass
    assert to_utc(datetime(2026, 10, 25, 2, 10), berlin, after=first_pass) == datetime(2026, 10, 25, 1, 10, tzinfo=UTC)
    # 02:50 after 02:10 CET (already past the change): the second pass too, though 02:50 CEST is after 02:40 CEST
    assert to_utc(datetime(2026, 10, 25, 2, 50), berlin, after=datetime(2026, 10, 25, 1, 10, tzinfo=UTC)) == datetime(
        2026, 10, 25, 1, 50, tzinfo=UTC
    )
    # jitter is not the clocks going back
    jittered = to_utc(datetime(2026, 10, 25, 2, 39, 59, 500000), berlin, after=first_pass)
    assert jittered == first_pass - timedelta(milliseconds=500)


def test_a_time_in_the_spring_gap_is_read_with_the_offset_before_the_change():
    berlin = ZoneInfo("Europe/Berlin")
    assert to_utc(datetime(2026, 3, 29, 1, 59, 40), berlin) == datetime(2026, 3, 29, 0, 59, 40, tzinfo=UTC)
    assert to_utc(datetime(2026, 3, 29, 3, 0, 20), berlin) == datetime(2026, 3, 29, 1, 0, 20, tzinfo=UTC)
    assert not is_repeated(datetime(2026, 3, 29, 2, 30), berlin)


@settings(max_examples=300, deadline=None)
@given(
    case=st.sampled_from(FALL_BACKS),
    seconds=st.lists(st.integers(min_value=-3 * 3600, max_value=3 * 3600), min_size=1, max_size=12),
    millis=st.integers(min_value=0, max_value=999),
)
def test_commit_times_in_commit_order_come_back_as_their_instants(case, seconds, millis):
    name, change, step = case
    zone = ZoneInfo(name)
    truth = sorted(change + timedelta(seconds=s, milliseconds=millis) for s in seconds)
    resolved = list(CommitClock(zone).resolve(_local(t, zone) for t in truth))
    # Always: the same wall-clock times, never going back by more than jitter.
    assert [_local(r, zone) for r in resolved] == [_local(t, zone) for t in truth]
    assert all(b >= a - JITTER for a, b in itertools.pairwise(resolved))
    # Exact whenever the order shows the clocks went back: the repeated hour's first second-pass
    # commit follows one whose instant is later than that commit's first-pass reading.
    second_pass = [i for i, t in enumerate(truth) if change <= t < change + step]
    if second_pass:
        i = second_pass[0]
        if i == 0 or truth[i - 1] <= truth[i] - step + JITTER:
            return  # ambiguous: nothing before it is later than its first-pass reading
    assert resolved == truth


@given(offset=st.integers(min_value=-14 * 60, max_value=14 * 60))
def test_only_the_servers_offset_now_passes(offset):
    summer = datetime(2026, 7, 1, 12, tzinfo=UTC)
    problem = ServerClock(offset, summer).mismatch("Europe/Berlin")
    assert (problem is None) == (offset == 120)
    if problem is not None:
        assert "'Europe/Berlin' (UTC+02:00" in problem and f"SYSDATETIMEOFFSET()) = {offset})" in problem


def test_a_fixed_offset_that_matched_in_summer_does_not_match_in_winter():
    assert ServerClock(120, datetime(2026, 7, 1, tzinfo=UTC)).mismatch("Etc/GMT-2") is None
    winter = ServerClock(60, datetime(2026, 12, 1, tzinfo=UTC)).mismatch("Etc/GMT-2")
    assert winter is not None and "UTC+01:00" in winter


def test_an_unknown_zone_names_the_fix():
    with pytest.raises(CdcConfigurationError, match="IANA time zone name"):
        zone_of("W. Europe Standard Time")
