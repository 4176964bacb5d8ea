from __future__ import annotations

from airflow_provider_cdc.cdc.sources.postgres.lsn import Lsn
from airflow_provider_cdc.cdc.sources.postgres.pending import slot_readiness
from airflow_provider_cdc.cdc.sources.postgres.slots import SlotStatus


def status(confirmed: int, current: int, wal_status: str = "reserved") -> SlotStatus:
    return SlotStatus(
        "s", "pgoutput", "logical", "db", False, False, None, Lsn(0), Lsn(confirmed), wal_status, None, Lsn(current)
    )


def test_ready_once_enough_wal_is_pending():
    assert slot_readiness(status(100, 100), "s", 1).state == "waiting"
    ready = slot_readiness(status(100, 164), "s", 64)
    assert ready.state == "ready" and ready.pending_bytes == 64
    assert ready.to_event()["status"] == "success"


def test_missing_or_lost_slots_fail_with_advice():
    missing = slot_readiness(None, "s", 1)
    assert missing.state == "failed" and "setup task" in missing.message
    lost = slot_readiness(status(100, 200, wal_status="lost"), "s", 1)
    assert lost.state == "failed" and "when_needed" in lost.message
    assert lost.to_event()["status"] == "error"
