"""The SQL Server's clock: its time zone, checked against the server, and its local times in UTC.

``cdc.lsn_time_mapping`` (``tran_begin_time``, ``tran_end_time``), ``sys.fn_cdc_map_lsn_to_time``
and ``sys.fn_cdc_map_time_to_lsn`` work in the server's **local** time, as ``datetime`` without an
offset. The capture reads them in the zone ``server_time_zone`` names (an IANA name, so its DST
rules are known), and checks that zone against the server's own offset now
(``DATEPART(TZOFFSET, SYSDATETIMEOFFSET())``) at setup and at every run: a wrong zone would shift
every ``ts_ms`` silently. Debezium instead applies the offset of *now* to every commit time
(``TODATETIMEOFFSET(..., DATEPART(TZOFFSET, SYSDATETIMEOFFSET()))``), which is an hour off for the
commits on the other side of a DST change.

When the clocks go back, one hour of local times happens twice. A commit time in it is resolved
with the commit order: commit times never decrease in LSN order, so a time is read in the first
pass (the earlier instant) unless the previous commit rules that out (it is already past the
change, or later than the first pass by more than clock jitter), then in the second pass. A run
whose first commit of a repeated hour is not the hour's first reads the hour's earlier commits
(``resolve_at``). What stays ambiguous: the hour's first commit when no commit happened in its
first pass (nothing before it is later), read as the first pass; SQL Server's capture job writes
``lsn_time_mapping`` rows on an idle database too, which makes that rare. Local times in a gap
(clocks going forward) do not occur on a server whose clock follows the zone; they are read with
the offset before the change.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError


def rows(conn: Any, statement: str, *params: Any) -> list[tuple]:
    # admin (types: numpy, pyarrow) loads on first query: zone_of runs when a DAG file is parsed
    from airflow_provider_cdc.cdc.sources.sqlserver.connection import rows as admin_rows

    return admin_rows(conn, statement, *params)


#: The server's offset now (minutes east of UTC) and the instant it is for, on its own clock.
OFFSET_SQL = "SELECT DATEPART(TZOFFSET, SYSDATETIMEOFFSET()), SYSUTCDATETIME()"
#: The commits of a repeated hour up to a commit, in commit order (to resolve its local time).
REPEATED_HOUR_SQL = (
    "SELECT tran_end_time FROM cdc.lsn_time_mapping "
    "WHERE start_lsn <= ? AND tran_end_time >= ? AND tran_end_time < ? ORDER BY start_lsn"
)
#: The commits of a repeated hour, in commit order (to find the last one before an instant).
REPEATED_HOUR_COMMITS_SQL = (
    "SELECT start_lsn, tran_end_time FROM cdc.lsn_time_mapping "
    "WHERE tran_end_time >= ? AND tran_end_time < ? ORDER BY start_lsn"
)
#: Commit times are datetime (1/300 s) from a clock that may be slewed: a step back this small is
#: jitter, not the clocks going back.
JITTER = timedelta(seconds=1)


def zone_of(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise CdcConfigurationError(
            f"server_time_zone {name!r} is not an IANA time zone name (e.g. 'UTC', 'Europe/Berlin', "
            "'America/New_York'): give the zone of the SQL Server's clock"
        ) from None


def _offset_text(minutes: int) -> str:
    sign = "-" if minutes < 0 else "+"
    return f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


@dataclass(frozen=True)
class ServerClock:
    """What the server says about its clock: its offset now, and the instant (UTC) that is."""

    offset_minutes: int
    utc_now: datetime

    @classmethod
    def read(cls, conn: Any) -> ServerClock:
        offset, utc_now = rows(conn, OFFSET_SQL)[0]
        return cls(int(offset), utc_now.replace(tzinfo=timezone.utc))

    def zone_offset_minutes(self, zone: ZoneInfo) -> int:
        offset = self.utc_now.astimezone(zone).utcoffset()
        if offset is None:
            raise RuntimeError(f"time zone {zone} gives no UTC offset")
        return int(offset.total_seconds() // 60)

    def mismatch(self, zone_name: str) -> str | None:
        """Why ``zone_name`` is not the server's zone now, or None when its offset matches."""
        expected = self.zone_offset_minutes(zone_of(zone_name))
        if expected == self.offset_minutes:
            return None
        return (
            f"server_time_zone is {zone_name!r} (UTC{_offset_text(expected)} at {self.utc_now:%Y-%m-%d %H:%M} UTC), "
            f"but the SQL Server's clock is at UTC{_offset_text(self.offset_minutes)} "
            f"(DATEPART(TZOFFSET, SYSDATETIMEOFFSET()) = {self.offset_minutes}): cdc.lsn_time_mapping's local commit "
            "times would be read in the wrong zone and every ts_ms shifted. Set server_time_zone to the IANA name of "
            "the server's zone (SELECT CURRENT_TIMEZONE_ID() names it on SQL Server 2022 and Azure SQL, in Windows "
            "form, e.g. 'W. Europe Standard Time' = 'Europe/Berlin'; the server's operating system settings name it "
            "elsewhere)"
        )


def check_server_zone(conn: Any, zone_name: str) -> ServerClock:
    """Fails when the configured zone's offset now differs from the server's. A zone whose offset
    only matches today (a fixed offset in summer) is caught at the next DST change: every run checks."""
    clock = ServerClock.read(conn)
    problem = clock.mismatch(zone_name)
    if problem is not None:
        # The offset changes at a DST change: read again so a check on the very instant cannot race it.
        clock = ServerClock.read(conn)
        problem = clock.mismatch(zone_name)
    if problem is not None:
        raise CdcConfigurationError(problem)
    return clock


# -- local times ----------------------------------------------------------------------------------


def _candidates(local: datetime, zone: ZoneInfo) -> tuple[datetime, datetime]:
    """The instants (UTC) of a naive local time read in its first and its second pass."""
    naive = local.replace(tzinfo=None)
    first = naive.replace(tzinfo=zone, fold=0).astimezone(timezone.utc)
    second = naive.replace(tzinfo=zone, fold=1).astimezone(timezone.utc)
    return first, second


def is_repeated(local: datetime, zone: ZoneInfo) -> bool:
    """A local time that happens twice (the clocks went back over it)."""
    first, second = _candidates(local, zone)
    return second > first


def repeated_hour(local: datetime, zone: ZoneInfo) -> tuple[datetime, datetime] | None:
    """The local times ``[start, end)`` that happen twice around ``local``, or None."""
    first, second = _candidates(local, zone)
    if second <= first:
        return None
    low, high = first, second  # the change is in (first, second]: find it to the second
    while high - low > timedelta(seconds=1):
        middle = low + (high - low) / 2
        if middle.astimezone(zone).utcoffset() == first.astimezone(zone).utcoffset():
            low = middle
        else:
            high = middle
    change = high.replace(microsecond=0)
    start = change.astimezone(zone).replace(tzinfo=None)
    return start, start + (second - first)


def to_utc(local: datetime, zone: ZoneInfo, *, after: datetime | None = None) -> datetime:
    """A local time of the server as an aware UTC datetime. In a repeated hour: the first pass,
    unless ``after`` (the previous commit's instant) rules it out, then the second: ``after`` is
    already past the change (a later commit cannot be before it), or the first pass is before
    ``after`` by more than clock jitter."""
    if local.tzinfo is not None:
        return local.astimezone(timezone.utc)
    first, second = _candidates(local, zone)
    if second > first and after is not None:
        past_the_change = after > first and after.astimezone(zone).utcoffset() == second.astimezone(zone).utcoffset()
        if past_the_change or first < after - JITTER:
            return second
    return first


class CommitClock:
    """Local commit times, in commit (LSN) order, to UTC: remembers the last instant so that the
    second pass of a repeated hour is recognised."""

    def __init__(self, zone: ZoneInfo, last: datetime | None = None):
        self.zone = zone
        self.last = last

    def utc(self, local: datetime) -> datetime:
        found = to_utc(local, self.zone, after=self.last)
        if self.last is None or found > self.last:
            self.last = found
        return found

    def resolve(self, times: Iterable[datetime]) -> Iterator[datetime]:
        for local in times:
            yield self.utc(local)


def resolve_at(conn: Any, zone: ZoneInfo, lsn: bytes, local: datetime) -> datetime:
    """The instant of the commit at ``lsn`` whose local time is ``local``: in a repeated hour,
    resolved through the commits of that hour up to it, in commit order."""
    hour = repeated_hour(local, zone)
    if hour is None:
        return to_utc(local, zone)
    clock = CommitClock(zone)
    resolved = [clock.utc(t) for (t,) in rows(conn, REPEATED_HOUR_SQL, lsn, *hour)]
    return resolved[-1] if resolved else to_utc(local, zone)


def last_commit_before(conn: Any, zone: ZoneInfo, until: datetime) -> bytes | None:
    """The LSN of the last commit before ``until`` (aware), when ``until``'s local time is in a
    repeated hour (``sys.fn_cdc_map_time_to_lsn`` compares local times, which are ambiguous there);
    None when it is not, or no commit of that hour is before it. The caller also takes the last
    commit before the hour itself."""
    hour = repeated_hour(local_time(until, zone), zone)
    if hour is None:
        return None
    clock = CommitClock(zone)
    last = None
    for start_lsn, end_time in rows(conn, REPEATED_HOUR_COMMITS_SQL, *hour):
        if clock.utc(end_time) < until:
            last = bytes(start_lsn)
    return last


def local_time(until: datetime, zone: ZoneInfo) -> datetime:
    """An aware instant as the server's naive local time (what ``fn_cdc_map_time_to_lsn`` takes)."""
    return until.astimezone(zone).replace(tzinfo=None)


__all__ = [
    "CommitClock",
    "ServerClock",
    "check_server_zone",
    "is_repeated",
    "last_commit_before",
    "local_time",
    "repeated_hour",
    "resolve_at",
    "to_utc",
    "zone_of",
]
