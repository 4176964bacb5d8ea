"""Reconciliation of offset, commit log and slot; snapshot decisions; window planning."""

from __future__ import annotations

import pytest

from airflow_provider_cdc.cdc.basics.errors import (
    CdcConfigurationError,
    InvalidLsnError,
    OffsetMismatchError,
    SnapshotRequiredError,
    WalLostError,
)
from airflow_provider_cdc.cdc.basics.window import Window
from airflow_provider_cdc.cdc.sinks.commit_log import CommitEntry
from airflow_provider_cdc.cdc.sources.postgres.lsn import Lsn
from airflow_provider_cdc.cdc.sources.postgres.offset import OffsetIdentity, PostgresOffset
from airflow_provider_cdc.cdc.sources.postgres.planning import (
    decide_snapshot,
    offset_after_commit,
    plan_snapshot_window,
    plan_stream_window,
    reconcile,
)
from airflow_provider_cdc.cdc.sources.postgres.slots import SlotStatus

ID = OffsetIdentity("shop", "42", "db", "slot")


def slot(confirmed: int | None = 100, wal_status: str = "reserved", current: int = 1000) -> SlotStatus:
    return SlotStatus(
        slot_name="slot",
        plugin="pgoutput",
        slot_type="logical",
        database="db",
        temporary=False,
        active=False,
        active_pid=None,
        restart_lsn=Lsn(50),
        confirmed_flush_lsn=None if confirmed is None else Lsn(confirmed),
        wal_status=wal_status,
        safe_wal_size=None,
        current_lsn=Lsn(current),
    )


def entry(seq: int, start: int | None, end: int, kind: str = "stream", last_commit: int | None = None) -> CommitEntry:
    window = Window(seq, kind, None if start is None else Lsn(start), Lsn(end), 1)  # type: ignore[arg-type]
    return CommitEntry("shop", window, "a", (), 0, last_commit, 7 if last_commit else None, None, 1)


def offset(
    lsn: int | None = 100, seq: int = 1, completed: bool = True, pending: Window | None = None
) -> PostgresOffset:
    return PostgresOffset(
        identity=ID,
        lsn=None if lsn is None else Lsn(lsn),
        window_seq=seq,
        snapshot_completed=completed,
        pending=pending,
        revision=3,
    )


def plan(mode="initial", off=None, status=None, target=500, current=1000):
    return plan_stream_window(
        mode=mode,
        offset=off,
        slot=status or slot(),
        identity=ID,
        target=Lsn(target),
        current_lsn=Lsn(current),
        now_ms=5,
    )


class TestReconcile:
    def test_agreeing_records_change_nothing(self):
        assert reconcile(offset(), entry(1, None, 100, "snapshot"), ID).offset == offset()

    def test_log_ahead_of_offset_rolls_forward(self):
        planned = offset(lsn=100, seq=1, pending=Window(2, "stream", Lsn(100), Lsn(300), 1))
        result = reconcile(planned, entry(2, 100, 300, last_commit=250), ID)
        assert result.offset.lsn == 300 and result.offset.window_seq == 2 and result.offset.pending is None
        assert result.offset.lsn_commit == 250 and result.offset.tx_id == 7
        assert "adopting the sink's record" in result.notes[0] and result.corroborated

    def test_an_entry_that_is_not_the_planned_window_is_never_adopted(self):
        """A forged entry for the pending window's number, ending far ahead: the planned window
        says where it ends, and the entry disagrees."""
        planned = offset(lsn=100, seq=1, pending=Window(2, "stream", Lsn(100), Lsn(300), 1))
        for forged in (entry(2, 100, 900_000), entry(2, 50, 300), entry(2, None, 300, "snapshot")):
            with pytest.raises(OffsetMismatchError, match="is not that run's"):
                reconcile(planned, forged, ID)

    def test_an_entry_without_the_stores_word_is_restored_but_not_corroborated(self):
        result = reconcile(offset(lsn=100, seq=1), entry(2, 100, 300), ID)
        assert result.offset.lsn == 300 and not result.corroborated
        assert not reconcile(None, entry(1, None, 100, "snapshot"), ID).corroborated

    def test_the_store_and_the_log_must_agree_where_the_last_window_ended(self):
        with pytest.raises(OffsetMismatchError, match="disagree about where window 0000000002"):
            reconcile(offset(lsn=900_000, seq=2), entry(2, 100, 300), ID)

    def test_lost_offset_is_rebuilt_from_the_log(self):
        result = reconcile(None, entry(1, None, 100, "snapshot"), ID)
        assert result.offset.snapshot_completed and result.offset.lsn == 100 and result.offset.snapshot_lsn == 100

    def test_a_lost_or_reset_offset_is_restored_from_the_entrys_checkpoint(self):
        from dataclasses import replace

        from airflow_provider_cdc.cdc.planning.runs import record_run
        from airflow_provider_cdc.cdc.sources.postgres.incremental import IncrementalState
        from airflow_provider_cdc.cdc.sources.postgres.planning import checkpoint

        runs = record_run(
            None, {"dag_id": "d", "run_id": "r2", "run_type": "scheduled", "start_ms": 1, "end_ms": 1}, "stream"
        )
        planned = replace(
            offset(lsn=300, seq=2),
            lsn_commit=Lsn(250),
            snapshot_lsn=Lsn(100),
            incremental=IncrementalState(),
            extra={"tables": [["public", "a"]], "runs": runs},
            pending=Window(3, "stream", Lsn(300), Lsn(400), 1),
        )
        run3 = {"dag_id": "d", "run_id": "r3", "run_type": "manual", "start_ms": None, "end_ms": None}
        last = replace(entry(3, 300, 400, last_commit=390), stats={"offset": checkpoint(planned), "run": run3})
        for stored in (
            None,
            offset(lsn=100, seq=1),
            replace(offset(lsn=100, seq=1), pending=Window(2, "stream", Lsn(100), Lsn(300), 1)),
        ):
            result = reconcile(stored, last, ID)
            restored = result.offset
            assert (restored.lsn, restored.window_seq, restored.lsn_commit, restored.tx_id) == (400, 3, 390, 7)
            assert restored.snapshot_completed and restored.snapshot_lsn == 100 and restored.pending is None
            assert restored.extra["tables"] == [["public", "a"]]
            assert restored.extra["runs"]["d"]["last"] == {"stream": run3}
            assert restored.incremental == IncrementalState()
            assert restored.revision == (0 if stored is None else stored.revision)  # the store's, for its CAS
            assert "restored it from the commit log" in result.notes[0]
        foreign = replace(
            last, stats={"offset": checkpoint(replace(planned, identity=OffsetIdentity("shop", "43", "db", "slot")))}
        )
        with pytest.raises(CdcConfigurationError, match="another capture"):
            reconcile(None, foreign, ID)

    def test_logs_from_before_checkpoints_are_replayed_from_the_first_window(self):
        entries = [entry(1, None, 100, "snapshot"), entry(2, 100, 200, last_commit=150), entry(3, 200, 300)]
        result = reconcile(None, entries[-1], ID, committed=lambda: entries)
        assert result.offset.snapshot_completed and result.offset.snapshot_lsn == 100
        assert (result.offset.lsn, result.offset.window_seq, result.offset.lsn_commit) == (300, 3, 150)

    def test_offset_ahead_of_log_fails(self):
        with pytest.raises(OffsetMismatchError, match="sink's commit log ends at window 1"):
            reconcile(offset(seq=2), entry(1, None, 100, "snapshot"), ID)
        with pytest.raises(OffsetMismatchError, match="ends at window none"):
            reconcile(offset(seq=2), None, ID)

    def test_foreign_offset_fails(self):
        foreign = PostgresOffset(identity=OffsetIdentity("shop", "43", "db", "slot"))
        with pytest.raises(CdcConfigurationError, match="another capture"):
            reconcile(foreign, None, ID)


class TestSnapshotDecision:
    @pytest.mark.parametrize(
        ("mode", "off", "status", "run"),
        [
            ("initial", None, slot(), True),
            ("initial", offset(completed=False), slot(), True),
            ("initial", offset(), slot(), False),
            ("initial", offset(), None, False),  # a lost slot is the window's problem in 'initial'
            ("always", offset(), slot(), True),
            ("never", None, slot(), False),
            ("initial_only", None, None, True),
            ("initial_only", offset(), None, False),
            ("when_needed", None, slot(), True),
            ("when_needed", offset(), slot(), False),
            ("when_needed", offset(), None, True),
            ("when_needed", offset(), slot(wal_status="lost"), True),
            ("when_needed", offset(lsn=100), slot(confirmed=200), True),
        ],
    )
    def test_debezium_snapshot_modes(self, mode, off, status, run):
        decision = decide_snapshot(mode, off, status)
        assert decision.run is run
        assert mode in decision.reason

    @pytest.mark.parametrize(
        ("mode", "off", "status", "gap"),
        [
            ("when_needed", None, None, None),  # first snapshot: nothing was captured, nothing lost
            ("when_needed", offset(completed=False), None, None),
            ("when_needed", offset(), None, "slot_missing"),
            ("when_needed", offset(), slot(wal_status="lost"), "wal_lost"),
            ("when_needed", offset(lsn=100), slot(confirmed=200), "slot_ahead"),
            ("always", offset(), None, None),  # every run re-snapshots by choice: not a gap
        ],
    )
    def test_a_resnapshot_after_lost_changes_is_a_gap(self, mode, off, status, gap):
        assert decide_snapshot(mode, off, status).gap_reason == gap

    def test_unknown_mode(self):
        with pytest.raises(CdcConfigurationError, match="snapshot_mode 'exported' is not supported"):
            decide_snapshot("exported", None, None)


class TestStreamPlan:
    def test_next_window_starts_at_the_offset_and_ends_at_the_target(self):
        result = plan(off=offset(lsn=100, seq=1))
        assert (result.window.seq, result.window.from_lsn, result.window.to_lsn) == (2, 100, 500)
        assert result.offset.pending == result.window
        assert result.acknowledge_first is None

    def test_retry_reuses_the_pending_window(self):
        pending = Window(2, "stream", Lsn(100), Lsn(400), 1)
        result = plan(off=offset(lsn=100, seq=1, pending=pending), target=900)
        assert result.window == pending
        assert "retrying" in result.notes[0]

    def test_a_pending_window_ending_past_the_server_was_not_planned_and_is_refused(self):
        """An edited offset whose pending window ends beyond what the server has written: retried
        as planned, it would be acknowledged past changes no window read."""
        pending = Window(2, "stream", Lsn(100), Lsn(5_000), 1)
        with pytest.raises(InvalidLsnError, match="ends past the server's current WAL position"):
            plan(off=offset(lsn=100, seq=1, pending=pending), current=1000)

    def test_stale_pending_window_is_replaced(self):
        pending = Window(2, "stream", Lsn(50), Lsn(400), 1)
        assert plan(off=offset(lsn=100, seq=1, pending=pending)).window.from_lsn == 100

    def test_slot_behind_offset_is_acknowledged_first(self):
        result = plan(off=offset(lsn=300), status=slot(confirmed=100))
        assert result.acknowledge_first == 300 and result.window.from_lsn == 300

    def test_slot_ahead_of_offset_fails(self):
        with pytest.raises(OffsetMismatchError, match="past the stored offset"):
            plan(off=offset(lsn=100), status=slot(confirmed=200))

    def test_lost_wal_fails(self):
        with pytest.raises(WalLostError, match="wal_status 'lost'"):
            plan(off=offset(), status=slot(wal_status="lost"))

    def test_no_snapshot_yet(self):
        with pytest.raises(SnapshotRequiredError, match="no completed snapshot"):
            plan(off=None)
        with pytest.raises(SnapshotRequiredError, match="has not completed"):
            plan(off=offset(completed=False))

    def test_never_mode_starts_at_the_slot(self):
        result = plan(mode="never", off=None, status=slot(confirmed=120))
        assert (result.window.seq, result.window.from_lsn) == (1, 120)

    def test_target_behind_offset_or_ahead_of_server_fails(self):
        with pytest.raises(InvalidLsnError, match="behind the committed offset"):
            plan(off=offset(lsn=100), target=99)
        with pytest.raises(InvalidLsnError, match="ahead of the server"):
            plan(off=offset(lsn=100), target=2000, current=1000)

    def test_empty_window_when_nothing_moved(self):
        result = plan(off=offset(lsn=100), target=100)
        assert result.window.is_empty_range


def test_snapshot_window_follows_the_last_window():
    window, pending = plan_snapshot_window(offset(seq=4), ID, now_ms=9)
    assert (window.seq, window.kind, pending.pending) == (5, "snapshot", window)


def test_offset_after_snapshot_commit():
    after = offset_after_commit(None, entry(1, None, 700, "snapshot"), ID)
    assert after.snapshot_completed and after.lsn == 700 and after.window_seq == 1
