"""An Airflow connection as an Iceberg catalog's properties (``table_catalog_conn_id``).

The connection's extra holds pyiceberg catalog properties, read by name: the keys below and the
prefixes pyiceberg uses for headers and storage settings (``header.*``, ``s3.*``, ``gcs.*``,
``adls.*``, ``hive.*``, ``glue.*``, ``rest.*``), never a pass-through of anything else. Its host, when
set, is the catalog's ``uri`` (unless the extra names one). Its password is the one secret: it
becomes the property the extra's ``secret_property`` names (default ``credential``, the REST
catalog's OAuth client credential; ``token`` for a bearer token), travels to Spark jobs in an
environment variable, and never appears in a spec, a log or an error. Secret-looking keys in the
extra (every credential property of pyiceberg's: ``s3.secret-access-key``, ``adls.account-key``,
``adls.connection-string``, ``gcs.oauth2.token``, ...; see :data:`SECRET_WORDS`) and values holding
an account key or a signature are refused, naming the key and the ``secret_property`` to use
instead, so a secret cannot end up stored in plain text beside the others, and so is a
URI with a password in it (``postgresql://user:secret@host/db``, in the extra or the host): put the
whole URI in the password field and set ``secret_property`` to ``uri`` instead.

A connection's editor is not trusted to run code where the tasks and Spark jobs run: properties
that make pyiceberg import a class by name (``py-io-impl``, ``py-catalog-impl``,
``s3.retry-strategy-impl``, ``auth.impl``, and any other ``*impl`` key) are refused, in the extra
and as ``secret_property``; ``py-io-impl`` may only name pyiceberg's own two file IOs.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError

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
        "py-io-impl",  # pyiceberg's own file IOs only (BUILTIN_FILE_IO)
        "client.region",
        "downcast-ns-timestamp-to-us-on-write",
    }
)
PREFIXES = ("header.", "s3.", "gcs.", "adls.", "hive.", "glue.", "rest.")
#: Parts of a key that hold a credential. pyiceberg 0.12's credential properties
#: (``pyiceberg/io/__init__.py``, ``catalog/*.py``) are all caught: ``s3.``/``client.``/``glue.``/
#: ``dynamodb.`` ``access-key-id``, ``secret-access-key``, ``session-token``; ``adls.account-key``,
#: ``adls.connection-string`` (it holds ``AccountKey=``), ``adls.sas-token``, ``adls.token``,
#: ``adls.credential``, ``adls.client-secret``; ``gcs.oauth2.token``; ``hf.token``;
#: ``gcp.bigquery.credential-file``/``credentials-info``; REST's ``credential`` and ``token``
#: and an ``Authorization`` header. Identifiers (``adls.account-name``, ``adls.tenant-id``,
#: ``adls.client-id``, ``s3.role-arn``) are not secrets and stay allowed.
SECRET_WORDS = (
    "secret",
    "password",
    "passphrase",
    "token",
    "credential",
    "key-id",
    "access-key",
    "account-key",
    "accountkey",
    "api-key",
    "apikey",
    "private-key",
    "sas-token",
    "connection-string",
    "connectionstring",
    "signature",
    "authorization",
)
#: A key whose last word is ``key`` (``adls.account-key``, ``header.X-Api-Key``).
SECRET_KEY_END = re.compile(r"(^|[._-])key$", re.IGNORECASE)
#: Values that carry a credential whatever their key: an Azure connection string's account or
#: shared access key, a SAS or presigned URL's signature.
SECRET_VALUE = re.compile(
    r"accountkey=|sharedaccesskey=|sharedaccesssignature=|[?&]sig=|x-amz-signature=|x-goog-signature=",
    re.IGNORECASE,
)
#: Keys whose value names a class to import: pyiceberg 0.12's ``py-io-impl``, ``py-catalog-impl``,
#: ``s3.retry-strategy-impl``, the REST catalog's ``auth`` ``impl``, the table property
#: ``write.py-location-provider.impl``; and, for catalogs to come, any key naming a class,
#: factory, provider or loader (Iceberg's Java ``catalog-impl``, ``io-impl``, ``client.factory``).
IMPORTING_KEY = re.compile(r"impl|(^|[.-])(class|factory|provider|loader|module)$", re.IGNORECASE)
#: ``py-io-impl`` values that import nothing but pyiceberg itself.
BUILTIN_FILE_IO = frozenset({"pyiceberg.io.pyarrow.PyArrowFileIO", "pyiceberg.io.fsspec.FsspecFileIO"})


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
    if IMPORTING_KEY.search(secret_property):
        raise CdcConfigurationError(
            f"connection {conn_id!r}: secret_property {secret_property!r} names a class for pyiceberg to import; "
            "a connection cannot choose code to run. Name the catalog's credential property (credential, token, uri)"
        )
    properties: dict[str, str] = {}
    for key, value in extra.items():
        secret_key = any(word in key.lower() for word in SECRET_WORDS) or SECRET_KEY_END.search(key)
        if secret_key or SECRET_VALUE.search(str(value)):
            # The extra is stored and shown in plain text and travels in the job spec; the
            # password is encrypted, masked, and reaches Spark jobs in an environment variable.
            what = "looks like a secret" if secret_key else "holds a credential (an account key or a signature)"
            raise CdcConfigurationError(
                f"connection {conn_id!r}: extra key {key!r} {what}; the extra travels in plain text in the job "
                "spec. Put it in the connection's password field (the one secret, sent to Spark jobs in an "
                f'environment variable) and set "secret_property": "{key}" in the extra'
            )
        if IMPORTING_KEY.search(key) and not (key == "py-io-impl" and str(value) in BUILTIN_FILE_IO):
            raise CdcConfigurationError(
                f"connection {conn_id!r}: extra key {key!r} makes pyiceberg import the class it names, which would "
                "run code of the connection's choosing wherever the catalog is opened; it is refused"
                + (f" (py-io-impl may name {' or '.join(sorted(BUILTIN_FILE_IO))})" if key == "py-io-impl" else "")
            )
        if key not in KEYS and not key.startswith(PREFIXES):
            raise CdcConfigurationError(
                f"connection {conn_id!r}: extra key {key!r} is not an Iceberg catalog property this provider "
                f"reads (it reads {', '.join(sorted(KEYS))} and keys starting {', '.join(PREFIXES)})"
            )
        properties[key] = str(value)
    if host and "uri" not in properties:
        properties["uri"] = host
    for key, value in properties.items():
        _refuse_embedded_password(conn_id, "host" if key == "uri" and "uri" not in extra else key, value)
    if password:
        return properties, secret_property, password
    return properties, None, None


def _refuse_embedded_password(conn_id: str, where: str, value: str) -> None:
    """A URI with a password would travel in plain text (job spec, logs, the connection's form)."""
    try:
        parts = urlsplit(value)
        has_password = bool(parts.scheme) and parts.password is not None
    except ValueError:  # not a URI (an unbalanced "[" in a host)
        return
    if not has_password:
        return
    shown = f"{parts.scheme}://{parts.username or ''}:***@{parts.netloc.rpartition('@')[2]}"
    label = "the connection's host" if where == "host" else f"extra key {where!r}"
    raise CdcConfigurationError(
        f"connection {conn_id!r}: {label} is a URI with a password in it ({shown}); it would travel in plain text "
        "in the job spec. Put the secret in the connection's password field instead: for a SQL catalog the whole "
        'URI, with its password, as the password and "secret_property": "uri" in the extra (and the URI without '
        "its password, or none, in the host); for a REST catalog the client credential or token as the password "
        '("secret_property": "credential" or "token")'
    )
