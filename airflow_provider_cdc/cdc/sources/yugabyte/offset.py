"""The stored offset of a YugabyteDB capture (the document is the core's, :mod:`cdc.offset`).

Key names follow Debezium's YugabyteDB (logical replication) connector, which keeps the
PostgreSQL connector's offsets (``lsn``, ``lsn_commit``, ``txId``, ``ts_usec``); positions are
the slot's own LSNs (commit hybrid times for ``HYBRID_TIME`` slots). The identity is the
universe (``IDENTIFY_SYSTEM``'s system identifier), the database and the slot.
"""

from __future__ import annotations

from airflow_provider_cdc.cdc.planning.offset import CaptureOffset, OffsetFormat
from airflow_provider_cdc.cdc.sources.yugabyte.lsn import YbLsn

CONNECTOR = "yugabytedb"
YUGABYTE_OFFSET = OffsetFormat(connector=CONNECTOR, position=YbLsn, keys={"tx_id": "txId"})


class YugabyteOffset(CaptureOffset):
    """A YugabyteDB capture's progress; positions are :class:`YbLsn`."""

    FORMAT = YUGABYTE_OFFSET
