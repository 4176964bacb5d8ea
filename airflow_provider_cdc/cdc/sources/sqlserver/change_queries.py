"""What a window reads from the change tables: each capture instance's part of the window (an older
instance below the newer one's ``start_lsn``), the T-SQL that reads it in ``direct`` or ``function``
mode, the columns whose before image SQL Server may leave out, and the check that the cleanup job
has not purged what the window needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from airflow_provider_cdc.cdc.basics.errors import CdcStateError
from airflow_provider_cdc.cdc.sources.sqlserver import admin
from airflow_provider_cdc.cdc.sources.sqlserver.connection import quote
from airflow_provider_cdc.cdc.sources.sqlserver.events import (
    TableEncoder,
)
from airflow_provider_cdc.cdc.sources.sqlserver.lsn import SqlServerLsn
from airflow_provider_cdc.cdc.sources.sqlserver.tables import CaptureInstance, TableInfo
from airflow_provider_cdc.cdc.sources.sqlserver.types import MAX


class ChangesPurgedError(CdcStateError):
    """The cleanup job removed change rows the window still needed (retention too short)."""


@dataclass(frozen=True)
class InstanceRange:
    """One capture instance's part of a window: commit LSNs in ``[low, high)``."""

    instance: CaptureInstance
    low: SqlServerLsn
    high: SqlServerLsn


def instance_ranges(
    tables: Sequence[TableInfo], window_from: SqlServerLsn, window_to: SqlServerLsn
) -> list[InstanceRange]:
    """Which instance reads which part of the window: each instance from its ``start_lsn`` (the
    window's start for the oldest) up to the next instance's ``start_lsn``."""
    out = []
    for table in tables:
        instances = table.instances
        for i, instance in enumerate(instances):
            low = window_from if i == 0 else max(window_from, instance.start_lsn or window_from)
            high = window_to
            if i + 1 < len(instances) and instances[i + 1].start_lsn is not None:
                high = min(window_to, instances[i + 1].start_lsn)
            if low < high:
                out.append(InstanceRange(instance, SqlServerLsn(low), SqlServerLsn(high)))
    return out


def readable(ranges: Sequence[InstanceRange]) -> list[InstanceRange]:
    """The ranges from where each instance's changes begin: SQL Server refuses a range that starts
    before an instance's start_lsn (error 313), and an instance created on a quiet database starts
    above the window's start. Call after :func:`check_retention`, which tells that from a purge."""
    out = []
    for part in ranges:
        start = part.instance.start_lsn
        low = max(part.low, SqlServerLsn(start)) if start is not None else part.low
        if low < part.high:
            out.append(InstanceRange(part.instance, SqlServerLsn(low), part.high))
    return out


#: Columns a change row may not carry (Learn, cdc.fn_cdc_get_all_changes_<capture_instance>,
#: Remarks): image/text/ntext are NULL when __$operation is 1 or 3; varchar(max)/nvarchar(max)/
#: varbinary(max) are NULL when it is 3 unless the column changed. (Computed columns, always NULL,
#: are not captured at all: types.CATALOG_SQL, admin.CAPTURED_COLUMNS_SQL.)
_LOB_TYPES = ("text", "ntext", "image")
_MAX_TYPES = ("varchar", "nvarchar", "varbinary")


def uncarried_columns(encoder: TableEncoder) -> list[tuple[int, str]]:
    """``(index, "lob" | "max")`` of the encoder's columns whose before image SQL Server may leave NULL."""
    out = []
    for i, column in enumerate(encoder.columns):
        if column.type.name in _LOB_TYPES:
            out.append((i, "lob"))
        elif column.type.name in _MAX_TYPES and column.type.max_length == MAX:
            out.append((i, "max"))
    return out


def _literal(text: str) -> str:
    return text.replace("'", "''")


@dataclass(frozen=True)
class ChangesQuery:
    """How one instance's change rows are read. ``sql`` reads ``[?, ?]`` (both inclusive); its rows
    are ``__$start_lsn, __$seqval, __$operation``, then ``__$command_id`` when ``command_ids``, then
    the captured columns. ``transaction_sql`` reads one transaction (``__$start_lsn = ?``) from the
    change table in ``__$command_id`` order, with ``__$command_id``: function mode uses it for a
    transaction whose ``__$seqval`` order may be wrong. After the captured columns, a row has one
    ``__$update_mask`` flag (changed or not) per :func:`uncarried_columns`. ``key_positions``: the
    key's columns in a row without ``__$command_id``."""

    sql: str
    command_ids: bool
    transaction_sql: str
    key_positions: tuple[int, ...]


_METADATA = "__$start_lsn, __$seqval, __$operation"
# Microsoft: __$seqval "Should not be used for ordering. Instead, use the __$command_id column"
# (cdc.<capture_instance>_CT); Debezium's direct mode orders so too (SqlServerConnection.java).
_COMMAND_ORDER = "ORDER BY __$start_lsn, __$command_id, __$seqval, __$operation"


def changes_sql(instance: CaptureInstance, encoder: TableEncoder, mode: str) -> ChangesQuery:
    """The T-SQL that reads one instance's change rows, ordered (see :class:`ChangesQuery`)."""
    table = quote(f"{instance.name}_CT")
    columns = encoder.select_list() + "".join(
        f", sys.fn_cdc_has_column_changed(N'{_literal(instance.name)}', N'{_literal(encoder.columns[i].name)}', "
        f"__$update_mask) AS {quote('__$changed_' + encoder.columns[i].name)}"
        for i, _kind in uncarried_columns(encoder)
    )
    direct = f"SELECT {_METADATA}, __$command_id, {columns} FROM cdc.{table} "
    transaction_sql = direct + "WHERE __$start_lsn = ? " + _COMMAND_ORDER
    keys = tuple(3 + i for i in encoder.key_indexes)
    if mode == "function":
        function = quote(f"fn_cdc_get_all_changes_{instance.name}")
        sql = (
            f"SELECT {_METADATA}, {columns} FROM cdc.{function}(?, ?, N'all update old') "
            "ORDER BY __$start_lsn, __$seqval, __$operation"
        )
        return ChangesQuery(sql, False, transaction_sql, keys)
    sql = direct + "WHERE __$start_lsn >= ? AND __$start_lsn <= ? " + _COMMAND_ORDER
    return ChangesQuery(sql, True, transaction_sql, keys)


def check_retention(
    conn: Any, ranges: Sequence[InstanceRange], known: set[str], starts: dict[str, str] | None = None
) -> None:
    """Fail when the cleanup job purged changes a range needs: an instance read before (``known``)
    whose oldest change is now past the range's start, and past where it started when a window first
    saw it (``starts``: an instance created on a quiet database starts above the capture job's
    newest LSN, and has lost nothing). A new instance starts where it starts."""
    starts = starts or {}
    for part in ranges:
        oldest = admin.min_lsn(conn, part.instance.name)
        if oldest is None:
            raise CdcStateError(
                f"capture instance {part.instance.name!r} of {part.instance.table} no longer exists: it was disabled "
                "(sys.sp_cdc_disable_table) while the capture still needed its changes. Re-enable CDC on the table "
                "and re-snapshot (snapshot_mode='when_needed' or 'always')"
            )
        unmoved = starts.get(part.instance.name) == str(oldest)
        if part.instance.name in known and oldest > part.low and not unmoved:
            raise ChangesPurgedError(
                f"the changes of capture instance {part.instance.name!r} from {part.low} are gone: its oldest change "
                f"is now {oldest} (the cleanup job's retention is shorter than the time between runs). "
                "Re-snapshot (snapshot_mode='when_needed' records the gap and re-snapshots), and raise the retention "
                "(sys.sp_cdc_change_job @job_type = N'cleanup', @retention = <minutes>)"
            )


__all__ = [
    "ChangesPurgedError",
    "ChangesQuery",
    "InstanceRange",
    "changes_sql",
    "check_retention",
    "instance_ranges",
    "readable",
    "uncarried_columns",
]
