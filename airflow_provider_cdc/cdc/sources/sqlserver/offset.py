"""The stored offset of a SQL Server capture (the document is the core's, :mod:`cdc.offset`).

Key names follow Debezium's SQL Server offsets where the concept exists there: ``commit_lsn``
(the last captured transaction's commit LSN) and ``snapshot_completed``; the next window's start
is ``next_lsn`` (Debezium restarts inside a transaction, a window never splits one). The
identity is the database's GUID (``sys.database_recovery_status.database_guid``) and name:
SQL Server has no server-side reader to pin, so there is no slot.
"""

from __future__ import annotations

from airflow_provider_cdc.cdc.planning.offset import OFFSET_FORMAT, CaptureOffset, OffsetFormat, OffsetIdentity
from airflow_provider_cdc.cdc.sources.sqlserver.lsn import SqlServerLsn

CONNECTOR = "sqlserver"
SQLSERVER_OFFSET = OffsetFormat(
    connector=CONNECTOR,
    position=SqlServerLsn,
    keys={
        "lsn": "next_lsn",
        "lsn_commit": "commit_lsn",
        "tx_id": "transaction_id",
        "system_identifier": "database_guid",
    },
    slot=False,
)

__all__ = ["CONNECTOR", "OFFSET_FORMAT", "SQLSERVER_OFFSET", "OffsetIdentity", "SqlServerOffset"]


class SqlServerOffset(CaptureOffset):
    """A SQL Server capture's progress; positions are :class:`SqlServerLsn`."""

    FORMAT = SQLSERVER_OFFSET
