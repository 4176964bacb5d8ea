from __future__ import annotations

import pytest

from airflow_provider_cdc.cdc.basics.errors import InvalidOffsetError
from airflow_provider_cdc.cdc.basics.window import Window, window_id_for
from airflow_provider_cdc.cdc.sources.postgres.lsn import Lsn


def window(start: int, end: int) -> Window:
    return Window(seq=3, kind="stream", from_lsn=Lsn(start), to_lsn=Lsn(end), planned_at_ms=1)


def test_bounds_are_half_open_on_commit_lsns():
    w = window(100, 200)
    assert not w.contains_commit(99)
    assert w.contains_commit(100)  # the lower bound belongs to the window
    assert w.contains_commit(199)
    assert not w.contains_commit(200)  # the upper bound belongs to the next window


def test_adjacent_windows_partition_commits():
    first, second = window(100, 200), window(200, 300)
    for commit in range(90, 310):
        assert first.contains_commit(commit) + second.contains_commit(commit) == (100 <= commit < 300)


def test_empty_range():
    assert window(5, 5).is_empty_range
    assert not window(5, 5).contains_commit(5)


def test_invalid_windows():
    with pytest.raises(InvalidOffsetError, match="before it starts"):
        window(200, 100)
    with pytest.raises(InvalidOffsetError, match="start at 1"):
        Window(seq=0, kind="snapshot", from_lsn=None, to_lsn=None, planned_at_ms=1)
    with pytest.raises(InvalidOffsetError, match="both"):
        Window(seq=1, kind="stream", from_lsn=Lsn(1), to_lsn=None, planned_at_ms=1)
    with pytest.raises(InvalidOffsetError, match="kind"):
        Window(seq=1, kind="weekly", from_lsn=None, to_lsn=None, planned_at_ms=1)  # type: ignore[arg-type]


def test_ids_are_deterministic_and_sort_in_order():
    assert window(1, 2).window_id == "0000000003"
    assert sorted(window_id_for(n) for n in (10, 9, 100)) == [window_id_for(n) for n in (9, 10, 100)]


def test_round_trip():
    w = window(0x16B3748, 0x16B9000)
    assert Window.from_dict(w.to_dict()) == w
    with pytest.raises(InvalidOffsetError, match="malformed"):
        Window.from_dict({"seq": "x"})
