"""Hook for change capture from YugabyteDB (YSQL): the PostgreSQL hook, with YugabyteDB's slot view.

Its connection type is ``yugabytedb_cdc`` (default port 5433); plain ``postgres`` connections
work too (a YSQL endpoint speaks PostgreSQL's protocol). Extras are read by name from the same
allowlist as PostgreSQL's.
"""

from __future__ import annotations

from typing import Any

from airflow_provider_cdc.hooks.postgres_cdc import PostgresCdcHook


class YugabyteCdcHook(PostgresCdcHook):
    """Publication administration (PostgreSQL's), YugabyteDB's slot status."""

    conn_name_attr = "yugabytedb_conn_id"
    default_conn_name = "yugabytedb_default"
    conn_type = "yugabytedb_cdc"
    hook_name = "YugabyteDB (change capture)"

    def __init__(self, yugabytedb_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(yugabytedb_conn_id, **kwargs)
        self.yugabytedb_conn_id = yugabytedb_conn_id

    def yb_slot_status(self, slot_name: str) -> Any:
        from airflow_provider_cdc.cdc.sources.yugabyte import admin

        with self.session() as conn:
            return admin.slot_status(conn, slot_name)
