"""Hook for change capture from YugabyteDB (YSQL): the PostgreSQL hook, with YugabyteDB's slot view.

Its connection type is ``yugabytedb_cdc`` (default port 5433); plain ``postgres`` connections
work too (a YSQL endpoint speaks PostgreSQL's protocol). Extras are read by name from the same
allowlist as PostgreSQL's.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from airflow_provider_cdc.hooks.extras import connection_extras, scrubbed_test
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

    def test_connection(self) -> tuple[bool, str]:
        """The YSQL endpoint as PostgreSQL's hook tests it; where the extra is a CDC-service
        connection's (``master_addresses`` or an ``rpc_`` setting), also each master's RPC port,
        opened with the connection's TLS settings (handshake and certificate check included)."""
        status, message = super().test_connection()
        extra = connection_extras(self.connection)
        if not status or not any(key == "master_addresses" or key.startswith("rpc_") for key in extra):
            return status, message
        service = YugabyteCdcServiceHook(self.yugabytedb_conn_id)
        return scrubbed_test(service.test_masters, self.connection.password)

    def yb_slot_status(self, slot_name: str) -> Any:
        from airflow_provider_cdc.cdc.sources.yugabyte import admin

        with self.session() as conn:
            return admin.slot_status(conn, slot_name)


#: The CDC service's default RPC port on the masters.
MASTER_RPC_PORT = 7100
#: ``rpc_sslmode`` values: TLS verified with the host name checked (the default), TLS verified
#: without the host name check (certificates that name other addresses), plaintext.
RPC_SSLMODES = ("verify-full", "verify-ca", "disable")


class YugabyteCdcServiceHook(YugabyteCdcHook):
    """The same ``yugabytedb_cdc`` connection, for a capture through the CDC service: its YSQL
    endpoint holds the capture lock and the catalog; its extra names the masters
    (``master_addresses``, ``"h1:7100,h2:7100"``; default the connection's host on port 7100)
    and the RPC port's transport:

    - ``rpc_sslmode``: ``verify-full`` (default: TLS, the server's certificate verified and checked
      to name the address connected to), ``verify-ca`` (verified, any name: YB certificates often
      name IPs only), or ``disable`` (plaintext: only ever by this explicit setting; the task log
      warns). The names follow libpq's ``sslmode``, as Debezium's YugabyteDB connector's
      ``database.sslmode`` does; the downgrading modes (``allow``, ``prefer``) do not exist here;
    - ``rpc_ssl_root_cert``, ``rpc_ssl_cert``, ``rpc_ssl_key``: paths on the workers (the
      connector's ``database.sslrootcert``/``sslcert``/``sslkey``); without a root certificate the
      system's CA store verifies the servers. ``rpc_ssl_check_hostname: false`` is the older
      spelling of ``verify-ca``;
    - ``rpc_get_changes_max_bytes``: the largest ``GetChanges`` response frame read (default
      64 MiB, at most 255 MiB: YugabyteDB's ``rpc_max_message_size``)."""

    hook_name = "YugabyteDB CDC service (change capture)"

    def __init__(
        self, yugabytedb_conn_id: str = YugabyteCdcHook.default_conn_name, *, master_addresses: str | None = None
    ) -> None:
        super().__init__(yugabytedb_conn_id)
        self._master_addresses = master_addresses

    def _extra(self) -> dict[str, Any]:
        return connection_extras(self.get_connection(self.yugabytedb_conn_id))

    @cached_property
    def master_addresses(self) -> str:
        """``host:port,...`` of the masters (checked when the client parses it)."""
        from airflow_provider_cdc.cdc.sources.yugabyte_cdc.addresses import parse_addresses

        text = self._master_addresses or self._extra().get("master_addresses")
        if not text:
            text = f"{self.connection_info.host}:{MASTER_RPC_PORT}"
        parse_addresses(str(text))
        return str(text)

    @cached_property
    def rpc_tls(self) -> Any:
        """The RPC port's TLS options; None (plaintext) only with ``rpc_sslmode=disable``, which
        is logged as a warning."""
        from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
        from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol.client import TlsOptions

        extra = self._extra()
        files = {k: extra.get(f"rpc_ssl_{k}") for k in ("root_cert", "cert", "key")}
        mode = str(extra.get("rpc_sslmode", "verify-full")).strip().lower()
        where = f"connection {self.yugabytedb_conn_id!r}"
        if mode not in RPC_SSLMODES:
            raise CdcConfigurationError(
                f"{where}: rpc_sslmode {mode!r} is not one of {', '.join(RPC_SSLMODES)}. The CDC service's RPC "
                "port is reached over TLS unless rpc_sslmode is 'disable'; there is no mode that falls back to "
                "plaintext by itself"
            )
        if mode == "disable":
            given = [f"rpc_ssl_{k}" for k, v in files.items() if v]
            if given:
                raise CdcConfigurationError(
                    f"{where}: rpc_sslmode is 'disable' (plaintext) but {', '.join(given)} is set: drop "
                    "rpc_sslmode to use TLS, or the TLS files to connect in plaintext"
                )
            self.log.warning(
                "%s: rpc_sslmode=disable: the CDC service's RPC connections to the masters and tablet servers "
                "(%s) are NOT encrypted and the servers are not authenticated: the captured rows cross the "
                "network in clear text and anyone on the path can read them or pose as the cluster. Enable TLS "
                "on the cluster (use_client_to_server_encryption) and remove rpc_sslmode from the connection",
                where,
                self.master_addresses,
            )
            return None
        check = str(extra.get("rpc_ssl_check_hostname", "true")).lower() not in ("false", "0", "no")
        return TlsOptions(
            ca_file=files["root_cert"],
            cert_file=files["cert"],
            key_file=files["key"],
            check_hostname=mode == "verify-full" and check,
        )

    @cached_property
    def rpc_get_changes_max_bytes(self) -> int:
        """The cap on a ``GetChanges`` response frame (``rpc_get_changes_max_bytes``)."""
        from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
        from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import methods
        from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol.framing import DEFAULT_MAX_MESSAGE_SIZE

        value = self._extra().get("rpc_get_changes_max_bytes")
        if value is None:
            return methods.GET_CHANGES_MAX_BYTES
        try:
            cap = int(value)
        except (TypeError, ValueError):
            cap = -1
        if not methods.MIB <= cap <= DEFAULT_MAX_MESSAGE_SIZE:
            raise CdcConfigurationError(
                f"connection {self.yugabytedb_conn_id!r}: rpc_get_changes_max_bytes {value!r} must be a number of "
                f"bytes from {methods.MIB} (1 MiB) to {DEFAULT_MAX_MESSAGE_SIZE} (YugabyteDB's rpc_max_message_size)"
            )
        return cap

    def test_masters(self) -> tuple[bool, str]:
        """Open (and close) an RPC session with each master, as the capture's client would."""
        from airflow_provider_cdc.cdc.sources.yugabyte_cdc.addresses import parse_addresses
        from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol.client import RpcConnection

        tls = self.rpc_tls
        masters = parse_addresses(self.master_addresses)
        for host, port in masters:
            session = RpcConnection(host, port, connect_timeout=10.0, tls=tls)
            try:
                session.connect()
            finally:
                session.close()
        transport = "TLS" if tls is not None else "plaintext (rpc_sslmode=disable)"
        listed = ", ".join(f"{host}:{port}" for host, port in masters)
        return True, f"Connection successfully tested: YSQL, and the CDC service's masters ({listed}) over {transport}"

    def cdc_client(self, stream_id: str) -> Any:
        """A :class:`~cdc.sources.yugabyte_cdc.client.YbCdcClient` of ``stream_id`` (close it)."""
        from airflow_provider_cdc.cdc.sources.yugabyte_cdc.addresses import parse_addresses
        from airflow_provider_cdc.cdc.sources.yugabyte_cdc.client import YbCdcClient

        return YbCdcClient(
            parse_addresses(self.master_addresses),
            stream_id,
            tls=self.rpc_tls,
            get_changes_max_bytes=self.rpc_get_changes_max_bytes,
        )
