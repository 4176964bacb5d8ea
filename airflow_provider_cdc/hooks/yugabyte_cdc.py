"""Hook for change capture from YugabyteDB (YSQL): the PostgreSQL hook, with YugabyteDB's slot view.

Its connection type is ``yugabytedb_cdc`` (default port 5433); plain ``postgres`` connections
work too (a YSQL endpoint speaks PostgreSQL's protocol). Extras are read by name from the same
allowlist as PostgreSQL's.
"""

from __future__ import annotations

from functools import cached_property
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


#: The CDC service's default RPC port on the masters.
MASTER_RPC_PORT = 7100


class YugabyteCdcServiceHook(YugabyteCdcHook):
    """The same ``yugabytedb_cdc`` connection, for a capture through the CDC service: its YSQL
    endpoint holds the capture lock and the catalog; its extra names the masters
    (``master_addresses``, ``"h1:7100,h2:7100"``; default the connection's host on port 7100)
    and the RPC port's TLS files (``rpc_ssl_root_cert``, ``rpc_ssl_cert``, ``rpc_ssl_key``: paths
    on the workers; ``rpc_ssl_check_hostname``: false for certificates that name IPs only)."""

    hook_name = "YugabyteDB CDC service (change capture)"

    def __init__(
        self, yugabytedb_conn_id: str = YugabyteCdcHook.default_conn_name, *, master_addresses: str | None = None
    ) -> None:
        super().__init__(yugabytedb_conn_id)
        self._master_addresses = master_addresses

    def _extra(self) -> dict[str, Any]:
        from airflow_provider_cdc.hooks.extras import connection_extras

        return connection_extras(self.get_connection(self.yugabytedb_conn_id))

    @cached_property
    def master_addresses(self) -> str:
        """``host:port,...`` of the masters (checked when the client parses it)."""
        from airflow_provider_cdc.cdc.sources.yugabyte_cdc.client import parse_addresses

        text = self._master_addresses or self._extra().get("master_addresses")
        if not text:
            text = f"{self.connection_info.host}:{MASTER_RPC_PORT}"
        parse_addresses(str(text))
        return str(text)

    @cached_property
    def rpc_tls(self) -> Any:
        """The RPC port's TLS options (None: plain TCP)."""
        from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol.client import TlsOptions

        extra = self._extra()
        files = {k: extra.get(f"rpc_ssl_{k}") for k in ("root_cert", "cert", "key")}
        if not any(files.values()):
            return None
        check = str(extra.get("rpc_ssl_check_hostname", "true")).lower() not in ("false", "0", "no")
        return TlsOptions(
            ca_file=files["root_cert"], cert_file=files["cert"], key_file=files["key"], check_hostname=check
        )

    def cdc_client(self, stream_id: str) -> Any:
        """A :class:`~cdc.sources.yugabyte_cdc.client.YbCdcClient` of ``stream_id`` (close it)."""
        from airflow_provider_cdc.cdc.sources.yugabyte_cdc.client import YbCdcClient, parse_addresses

        return YbCdcClient(parse_addresses(self.master_addresses), stream_id, tls=self.rpc_tls)
