"""Which tables a YugabyteDB slot can stream: everything a window needs must have been in the
publication when the slot was created.

YugabyteDB differs from PostgreSQL here (docs/yugabytedb.md, "Publications and the slot"):

- up to v2025.2 a slot re-reads its publications only at a periodic refresh
  (``cdcsdk_publication_list_refresh_interval_secs``, 900 s, on a grid from slot creation), as of
  the refresh time: a table added later is invisible until then, and its changes committed before
  the refresh are not streamed;
- in every release a table of the database that the slot does not poll within
  ``cdcsdk_tablet_not_of_interest_timeout_secs`` (4 h) of its creation loses its retention: added
  to the publication later, the slot fails on it (or skips it with
  ``cdc_skip_unqualified_tables_for_polling``, from v2025.2.7.0 / v2026.1.2.0).

So a table added to the publication after the slot exists (a table joining the capture, a new
heartbeat table, a publication changed by hand) is refused whatever the release: the only correct
move is a new slot created after the change, with a snapshot. The capture keeps, per slot
(``yb_stream_id``), the tables it found published when it first planned a window on that slot
(``offset.extra["yb_slot"]``). The first window must read a new slot within the 4 hours: the slot
is not read earlier (a first poll may move its restart time, and the history retention, past the
snapshot's read time), so a snapshot records when that read is due (``planning.not_of_interest_why``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from airflow_provider_cdc.cdc.basics.errors import SnapshotRequiredError
from airflow_provider_cdc.cdc.basics.tables import TableRef

#: ``offset.extra`` key: ``{"stream_id": <slot's yb_stream_id>, "published": [[schema, name], ...]}``
SLOT_KEY = "yb_slot"

_WHY = (
    "a YugabyteDB slot streams only the tables that were in its publication when it was created: up to "
    "v2025.2 it sees a table added later only at its next publication refresh "
    "(cdcsdk_publication_list_refresh_interval_secs, 900 s by default) and never streams that table's "
    "changes committed before the refresh, and in every release a table not polled within "
    "cdcsdk_tablet_not_of_interest_timeout_secs (4 h) of the slot's creation has lost its changes"
)


def needed(tables: Iterable[TableRef], heartbeat: TableRef) -> list[TableRef]:
    """The tables a window reads: the captured ones and the heartbeat table (its fence rows end windows)."""
    refs = list(dict.fromkeys([*tables, heartbeat]))
    return sorted(refs, key=str)


def slot_record(offset: Any) -> dict[str, Any] | None:
    if offset is None:
        return None
    record = offset.extra.get(SLOT_KEY)
    return record if isinstance(record, dict) else None


def record_for(stream_id: str | None, tables: Sequence[TableRef]) -> dict[str, Any]:
    return {"stream_id": stream_id, "published": [list(r.to_json()) for r in tables]}


def late_tables(record: dict[str, Any] | None, stream_id: str | None, tables: Sequence[TableRef]) -> list[TableRef]:
    """The tables of ``tables`` that were not published when this capture first read slot ``stream_id``
    (none when the record is of another slot: a new slot starts a new record)."""
    if record is None or record.get("stream_id") != stream_id:
        return []
    known = {TableRef(*t) for t in record.get("published") or ()}
    return [r for r in tables if r not in known]


def late_tables_error(slot: str, publication: str, late: Sequence[TableRef], *, never: bool) -> SnapshotRequiredError:
    names = ", ".join(str(r) for r in late)
    fix = (
        f"Drop slot {slot!r} (the changes since the last window are lost) and run the setup task again, which "
        "creates a new slot after the publication; or switch to snapshot_mode='always' for one run"
        if never
        else f"Re-snapshot once with snapshot_mode='always': the snapshot drops slot {slot!r} and creates a new "
        "one after the publication change"
    )
    return SnapshotRequiredError(
        f"table(s) {names} were added to publication {publication!r} after replication slot {slot!r} was "
        f"created; {_WHY}. Windows on this slot would wait for a fence row that never arrives or silently miss "
        f"rows. {fix}."
    )


def check_before_slot(published: set[TableRef] | None, tables: Sequence[TableRef], publication: str) -> list[str]:
    """Problems with creating a slot now: every table a window needs must already be published
    (``published`` None: the publication is missing)."""
    missing = list(tables) if published is None else [r for r in tables if r not in published]
    if not missing:
        return []
    names = ", ".join(str(r) for r in missing)
    return [
        f"publication {publication!r} does not contain {names}, and the replication slot is about to be created: "
        f"{_WHY}. Run the setup task first (it creates and fills the publication), then the snapshot"
    ]
