"""Master addresses as a connection gives them (``database.master.addresses``): parsed without
loading the RPC client, so a job spec and a capture check them at parse time.
"""

from __future__ import annotations

from collections.abc import Iterable

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError

Address = tuple[str, int]


def parse_addresses(text: str | Iterable[str]) -> tuple[Address, ...]:
    """``"h1:7100,h2:7100"`` (``database.master.addresses``) or a list of ``host:port``."""
    parts = text.split(",") if isinstance(text, str) else list(text)
    addresses = []
    for part in (p.strip() for p in parts):
        host, sep, port = part.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise CdcConfigurationError(f"not a host:port master address: {part!r}")
        addresses.append((host.strip("[]"), int(port)))
    if not addresses:
        raise CdcConfigurationError("no master addresses")
    return tuple(addresses)


__all__ = ["Address", "parse_addresses"]
