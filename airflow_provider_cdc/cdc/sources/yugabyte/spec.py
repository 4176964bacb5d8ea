"""The job spec of a YugabyteDB window: PostgreSQL's, with YugabyteDB's positions and read time.

The password is never in it (:class:`PgConnectionInfo` leaves it out of ``to_dict``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from airflow_provider_cdc.cdc.planning.spec import common_from_json
from airflow_provider_cdc.cdc.sources.postgres.connection import PgConnectionInfo
from airflow_provider_cdc.cdc.sources.postgres.spec import PostgresJobSpec
from airflow_provider_cdc.cdc.sources.yugabyte.lsn import YbLsn


@dataclass(frozen=True)
class YugabyteJobSpec(PostgresJobSpec):
    # A snapshot reads at this hybrid time (the slot's consistent point); None for stream windows.
    snapshot_ht: int | None = None
    # Where the stream continues after the snapshot (HYBRID_TIME: snapshot_ht + 1; SEQUENCE: the
    # slot's consistent point).
    snapshot_end: int | None = None
    # The SECURITY DEFINER procedure that sets yb_read_time for a role that may not set it.
    read_time_procedure: str | None = None
    lsn_type: str = "HYBRID_TIME"
    # YugabyteDB's cdcsdk_tablet_not_of_interest_timeout_secs, in ms: a snapshot must end within it.
    not_of_interest_timeout_ms: int = 14_400_000

    connector = "yugabytedb"
    default_watermarks = "insert_insert"

    def to_dict(self) -> dict[str, Any]:
        return {
            **super().to_dict(),
            "snapshot_ht": self.snapshot_ht,
            "snapshot_end": self.snapshot_end,
            "read_time_procedure": self.read_time_procedure,
            "lsn_type": self.lsn_type,
            "not_of_interest_timeout_ms": self.not_of_interest_timeout_ms,
        }

    @classmethod
    def from_json(cls, text: str) -> YugabyteJobSpec:
        data, common = common_from_json(text, cls.connector, "YugabyteDB", cls.default_watermarks)
        previous = data.get("previous_commit_lsn")
        return cls(
            **common,
            connection=PgConnectionInfo.from_dict(data["connection"]),
            slot_name=data["slot_name"],
            publication_name=data["publication_name"],
            previous_commit_lsn=None if previous is None else YbLsn(previous),  # type: ignore[arg-type]
            snapshot_ht=data.get("snapshot_ht"),
            snapshot_end=data.get("snapshot_end"),
            read_time_procedure=data.get("read_time_procedure"),
            lsn_type=data.get("lsn_type", "HYBRID_TIME"),
            not_of_interest_timeout_ms=int(data.get("not_of_interest_timeout_ms", 14_400_000)),
        )
