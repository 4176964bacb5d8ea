"""An Airflow connection as an Iceberg catalog's properties (``table_catalog_conn_id``).

The connection's extra holds pyiceberg catalog properties, read by name: the keys below and the
prefixes pyiceberg uses for headers and storage settings (``header.*``, ``s3.*``, ``gcs.*``,
``adls.*``, ``hive.*``, ``glue.*``, ``rest.*``), never a pass-through of anything else. Its host, when
set, is the catalog's ``uri`` (unless the extra names one). Its password is the one secret: it
becomes the property the extra's ``secret_property`` names (default ``credential``, the REST
catalog's OAuth client credential; ``token`` for a bearer token), travels to Spark jobs in an
environment variable, and never appears in a spec, a log or an error. Secret-looking keys in the
extra are refused, so a secret cannot end up stored in plain text beside the others.
"""

from __future__ import annotations

from typing import Any

from airflow_provider_cdc.cdc.errors import CdcConfigurationError

KEYS = frozenset(
    {
        "type",
        "uri",
        "warehouse",
        "prefix",
        "scope",
        "audience",
        "resource",
        "oauth2-server-uri",
        "py-io-impl",
        "client.region",
        "downcast-ns-timestamp-to-us-on-write",
    }
)
PREFIXES = ("header.", "s3.", "gcs.", "adls.", "hive.", "glue.", "rest.")
SECRET_WORDS = ("secret", "password", "token", "credential", "key-id", "access-key", "sas-token")


def catalog_connection(conn_id: str) -> tuple[dict[str, str], str | None, str | None]:
    """``(properties, secret property, secret)`` of the connection ``conn_id``."""
    from airflow_provider_cdc.version_compat import BaseHook

    connection = BaseHook.get_connection(conn_id)
    return catalog_properties(conn_id, connection.extra_dejson or {}, connection.host, connection.password)


def catalog_properties(
    conn_id: str, extra: dict[str, Any], host: str | None, password: str | None
) -> tuple[dict[str, str], str | None, str | None]:
    extra = dict(extra)
    secret_property = str(extra.pop("secret_property", "credential"))
    properties: dict[str, str] = {}
    for key, value in extra.items():
        if any(word in key for word in SECRET_WORDS):
            raise CdcConfigurationError(
                f"connection {conn_id!r}: extra key {key!r} looks like a secret; put the secret in the "
                "connection's password and name its catalog property in the extra's 'secret_property'"
            )
        if key not in KEYS and not key.startswith(PREFIXES):
            raise CdcConfigurationError(
                f"connection {conn_id!r}: extra key {key!r} is not an Iceberg catalog property this provider "
                f"reads (it reads {', '.join(sorted(KEYS))} and keys starting {', '.join(PREFIXES)})"
            )
        properties[key] = str(value)
    if host and "uri" not in properties:
        properties["uri"] = host
    if password:
        return properties, secret_property, password
    return properties, None, None
