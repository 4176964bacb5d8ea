"""Attacks through stored state, tried as an attacker would: real Airflow (dag.test), real
PostgreSQL, real Spark.

The offset (an Airflow Variable) and the sink's commit log are written by the capture, but also
writable by others: whoever may edit Variables, whoever may write to the sink's storage. A
security review showed that a staged chunk's path in the offset fed a recursive delete (an
absolute path or ``..`` deleted a directory outside the sink), that dataset paths in
``_cdc_log/*.json`` were read without a containment check, and that a forged commit-log entry
with a far-ahead end was adopted as the offset and the slot then acknowledged past changes no
window had read. Each test here makes that edit and asserts the attacker got nothing: the
directory is still there, no outside file is read, the slot has not moved, and once the forged
record is gone the capture still holds every change.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from airflow_provider_cdc.cdc.basics.errors import CdcStateError
from airflow_provider_cdc.cdc.basics.naming import commit_log_directory
from airflow_provider_cdc.cdc.sinks.reader import read_topic_arrow
from airflow_provider_cdc.testing import shop
from tests.integration.test_operators import assert_reproduces_source, capture_dag, make_capture
from tests.integration.test_operators import shop_db as shop_db  # a fixture
from tests.support import airflow as af

pytestmark = [pytest.mark.airflow, pytest.mark.spark]


def _log_dir(sink: Path) -> Path:
    return sink / commit_log_directory("shop")


def _entries(sink: Path) -> list[Path]:
    return sorted(p for p in _log_dir(sink).iterdir() if p.name.endswith(".json") and not p.name.startswith("."))


def _publish(sink: Path, entry: dict) -> Path:
    """A forged entry, written the way the capture writes one: the next number in the log."""
    last = _entries(sink)[-1]
    path = last.with_name(f"{int(last.stem) + 1:020d}.json")
    path.write_text(json.dumps(entry, indent=1), encoding="utf-8")
    return path


def _confirmed(db) -> int:
    with db.connect() as conn:
        return int(
            conn.execute(
                "SELECT confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots WHERE slot_name = %s", (db.slot,)
            ).fetchone()[0]
        )


def test_a_staged_chunk_path_edited_in_the_offset_never_reads_or_deletes_outside_the_sink(shop_db, tmp_path):
    db, conn_id = shop_db
    sink, outside = tmp_path / "lake", tmp_path / "precious"
    errors: dict = {}
    capture = make_capture(db, conn_id, sink, incremental_chunk_size=5, incremental_chunks_per_run=1)
    start = {"id": "op-1", "type": "execute-snapshot", "data": {"data-collections": ["public.orders"]}}
    dag = capture_dag(f"atk_staged_{db.name}", capture, errors, signals=[start])
    assert af.run(dag, 0, errors=errors).state == "success", errors  # snapshot; the first chunk is staged
    key = capture.store().key("shop")
    document = json.loads(af.variable(key))
    (chunk,) = document["incremental_snapshot"]["staged"]
    # The attacker's copy of the staged data in a directory of theirs choosing, beside a file they
    # want gone: before the fix the chunk was read from there, then its window directory deleted.
    target = outside / "window=1" / "attempt=0123456789abcdef"
    shutil.copytree(sink / chunk["path"], target)
    (outside / "keep.txt").write_text("do not delete", encoding="utf-8")
    for path in (str(target), f"../{outside.name}/window=1/attempt=0123456789abcdef"):
        chunk["path"] = path
        af.set_variable(key, json.dumps(document))
        errors.clear()
        run = af.run(dag, 1, errors=errors)
        assert (outside / "keep.txt").exists() and target.exists(), f"{path} deleted outside the sink"
        assert run.tasks["window"] == "failed", path
        assert "staged incremental-snapshot chunk" in run.error("window") and "The offset was edited" in run.error(
            "window"
        )


def test_a_commit_log_entry_naming_a_path_outside_the_sink_is_refused(shop_db, tmp_path):
    db, conn_id = shop_db
    sink, outside = tmp_path / "lake", tmp_path / "elsewhere"
    errors: dict = {}
    capture = make_capture(db, conn_id, sink)
    dag = capture_dag(f"atk_logpath_{db.name}", capture, errors)
    assert af.run(dag, 0, errors=errors).state == "success", errors
    entries = [json.loads(p.read_text()) for p in _entries(sink)]
    entry = next(e for e in entries if any(d["topic"] == "shop.public.orders" for d in e["datasets"]))
    orders = next(d for d in entry["datasets"] if d["topic"] == "shop.public.orders")
    seq = entries[-1]["window"]["seq"] + 1
    # Someone else's data (here: a copy of the capture's own files) in a directory outside the sink.
    shutil.copytree(sink / orders["path"], outside / "other")
    for path in (str(outside / "other"), f"../{outside.name}/other", "shop.public.orders/../../elsewhere/other"):
        forged = json.loads(json.dumps(entry))
        forged["window"].update(seq=seq, window_id=f"{seq:010d}", kind="stream")
        forged["window"].update(from_lsn=entries[-1]["window"]["to_lsn"], to_lsn=entries[-1]["window"]["to_lsn"])
        forged["datasets"] = [{**orders, "path": path}]
        published = _publish(sink, forged)
        with pytest.raises(
            CdcStateError, match=re.escape("is not one this capture wrote: dataset 'shop.public.orders'")
        ):
            read_topic_arrow(str(sink), "shop", "shop.public.orders")
        errors.clear()
        run = af.run(dag, 1, errors=errors)
        assert run.state == "failed" and "is not one this capture wrote" in str(errors), path
        published.unlink()
    assert af.run(dag, 2, errors=errors).state == "success", errors  # the forged entry gone: on it goes


def test_a_forged_far_ahead_commit_log_entry_never_moves_the_slot(shop_db, tmp_path):
    """The review's attack: an entry for the next window number, ending far ahead, adopted as the
    offset; the slot was then acknowledged past the changes in between, which no window read."""
    db, conn_id = shop_db
    sink = tmp_path / "lake"
    errors: dict = {}
    capture = make_capture(db, conn_id, sink)
    dag = capture_dag(f"atk_forged_{db.name}", capture, errors)
    assert af.run(dag, 0, errors=errors).state == "success", errors
    with db.connect() as conn:
        shop.mutate(conn, round_no=1)  # changes the attacker wants skipped
        shop.mutate(conn, round_no=2)
        far = int(conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()[0])
    before = _confirmed(db)
    entry = json.loads(_entries(sink)[-1].read_text())
    seq = entry["window"]["seq"] + 1
    forged = {
        **entry,
        "window": {**entry["window"], "seq": seq, "window_id": f"{seq:010d}", "kind": "stream"},
        "datasets": [],
        "transactions": 0,
        "stats": {},
    }
    forged["window"].update(from_lsn=entry["window"]["to_lsn"], to_lsn=far)
    published = _publish(sink, forged)
    for hour in (1, 2):  # the window task and, in the next run, a replayed report
        errors.clear()
        run = af.run(dag, hour, errors=errors)
        assert run.state == "failed"  # the first task that reads the log refuses it
        assert "so the offset was restored from the log alone" in str(errors), errors
        assert _confirmed(db) == before, "the slot was acknowledged on a forged entry's word"
    published.unlink()
    errors.clear()
    assert af.run(dag, 3, errors=errors).state == "success", errors
    assert_reproduces_source(db, sink)  # nothing was skipped
