"""The stored offset of a PostgreSQL capture (the document is the core's, :mod:`cdc.offset`).

Key names follow Debezium's PostgreSQL offsets (``lsn``, ``lsn_commit``, ``txId``,
``ts_usec``, ``snapshot_completed``); the identity is the server's system identifier, the
database and the slot.
"""

from __future__ import annotations

from airflow_provider_cdc.cdc.planning.offset import OFFSET_FORMAT, CaptureOffset, OffsetFormat, OffsetIdentity
from airflow_provider_cdc.cdc.sources.postgres.lsn import Lsn

CONNECTOR = "postgresql"
POSTGRES_OFFSET = OffsetFormat(connector=CONNECTOR, position=Lsn, keys={"tx_id": "txId"})

__all__ = ["CONNECTOR", "OFFSET_FORMAT", "POSTGRES_OFFSET", "OffsetIdentity", "PostgresOffset"]


class PostgresOffset(CaptureOffset):
    """A PostgreSQL capture's progress; positions are :class:`Lsn`."""

    FORMAT = POSTGRES_OFFSET
