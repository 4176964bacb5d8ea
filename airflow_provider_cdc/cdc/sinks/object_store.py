"""Object stores (S3 and S3-compatible, GCS, Azure) under a sink or state path: one access
object, and each engine's own client built from it.

A capture on ``s3://bucket/prefix`` names an Airflow connection (``object_store_conn_id``, the
Amazon provider's ``aws`` type: keys or a role, region, ``endpoint_url`` and the S3 addressing
style for S3-compatible stores). The operator resolves it into an :class:`ObjectStoreAccess`;
every engine that touches the store gets its native client from that one value:

- Arrow (windows, snapshot tasks, readers, the commit log's reads): ``pyarrow.fs.S3FileSystem``;
- delta-rs: its ``storage_options``;
- pyiceberg: its FileIO properties (``s3.*``);
- the commit log's create-only publish: obstore's ``put(mode="create")``, a conditional write
  (``If-None-Match: *`` on S3, ``ifGenerationMatch=0`` on GCS, ``If-None-Match`` on Azure):
  Arrow's file systems have no conditional write, and the log must never replace an entry.

Credentials are never serialized: :meth:`ObjectStoreAccess.to_dict` holds only the endpoint,
region and addressing style, and a job submitted with ``spark-submit`` reads the keys from
:data:`OBJECT_STORE_SECRET_ENV` in its environment, as it reads the database password.

Inside a job the access is *active* (:func:`using`): the storage, formats and readers ask
:func:`current` instead of threading it through every call, as Hadoop's configuration does.
Spark tasks get it explicitly (pickled with the task, like the database connection). Without an
active access (GCS, Azure, or S3 from the machine's own role), each library's default credential
chain applies.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlparse

from airflow_provider_cdc.cdc.errors import CdcConfigurationError

#: Where a submitted job finds the object store's keys (never in the spec file).
OBJECT_STORE_SECRET_ENV = "AIRFLOW_CDC_OBJECT_STORE_SECRET"

S3_SCHEMES = frozenset({"s3", "s3a", "s3n"})
GCS_SCHEMES = frozenset({"gs", "gcs"})
AZURE_SCHEMES = frozenset({"abfs", "abfss", "az", "adl"})
OBJECT_STORE_SCHEMES = S3_SCHEMES | GCS_SCHEMES | AZURE_SCHEMES

#: How long a request may wait for the store to answer before the run fails with a message
#: (Arrow's and obstore's defaults retry for minutes against an endpoint that does not answer).
CONNECT_TIMEOUT_SECONDS = 5
REQUEST_TIMEOUT_SECONDS = 60
MAX_RETRIES = 3


def scheme_of(uri: str) -> str:
    return urlparse(str(uri)).scheme.lower()


def is_object_store(uri: str) -> bool:
    return scheme_of(uri) in OBJECT_STORE_SCHEMES


def split_bucket(uri: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` → ``("bucket", "a/b")``."""
    parsed = urlparse(str(uri))
    return parsed.netloc, parsed.path.lstrip("/")


@dataclass(frozen=True)
class ObjectStoreAccess:
    """How to reach an S3-compatible store: endpoint, region, addressing style and credentials.

    ``repr`` and :meth:`to_dict` never show the credentials."""

    endpoint_url: str | None = None
    region: str | None = None
    path_style: bool = False
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False, compare=False)
    session_token: str | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.endpoint_url is not None:
            parsed = urlparse(self.endpoint_url)
            if parsed.scheme not in ("http", "https") or not parsed.netloc:
                raise CdcConfigurationError(
                    f"the object store's endpoint_url must be an http(s) URL such as https://s3.example.com:9000, "
                    f"got {self.endpoint_url!r}"
                )

    # -- transport: the public part in the spec, the keys in the environment -----------------

    def to_dict(self) -> dict[str, Any]:
        return {"endpoint_url": self.endpoint_url, "region": self.region, "path_style": self.path_style}

    def secret_json(self) -> str:
        return json.dumps(
            {
                "access_key_id": self.access_key_id,
                "secret_access_key": self.secret_access_key,
                "session_token": self.session_token,
            }
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any], secret_json: str | None = None) -> ObjectStoreAccess:
        access = cls(
            endpoint_url=data.get("endpoint_url"), region=data.get("region"), path_style=bool(data.get("path_style"))
        )
        if secret_json:
            keys = json.loads(secret_json)
            access = replace(
                access,
                access_key_id=keys.get("access_key_id"),
                secret_access_key=keys.get("secret_access_key"),
                session_token=keys.get("session_token"),
            )
        return access

    @classmethod
    def from_env_dict(cls, data: dict[str, Any]) -> ObjectStoreAccess:
        """The access a submitted job's spec names, with the keys from its environment."""
        return cls.from_dict(data, os.environ.get(OBJECT_STORE_SECRET_ENV))

    @property
    def allow_http(self) -> bool:
        return self.endpoint_url is not None and self.endpoint_url.startswith("http://")

    # -- each engine's client ------------------------------------------------------------------

    def arrow_filesystem(self) -> Any:
        import pyarrow.fs as pafs

        kwargs: dict[str, Any] = {
            "region": self.region or "us-east-1",
            "connect_timeout": CONNECT_TIMEOUT_SECONDS,
            "request_timeout": REQUEST_TIMEOUT_SECONDS,
            "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=MAX_RETRIES),
            "force_virtual_addressing": not self.path_style if self.endpoint_url is None else False,
        }
        if self.endpoint_url is not None:
            parsed = urlparse(self.endpoint_url)
            kwargs["endpoint_override"] = parsed.netloc + parsed.path.rstrip("/")
            kwargs["scheme"] = parsed.scheme
        if self.access_key_id is not None:
            kwargs.update(access_key=self.access_key_id, secret_key=self.secret_access_key)
            if self.session_token:
                kwargs["session_token"] = self.session_token
        return pafs.S3FileSystem(**kwargs)

    def delta_storage_options(self) -> dict[str, str]:
        options: dict[str, str] = {
            "AWS_REGION": self.region or "us-east-1",
            "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false" if self.path_style else "true",
            "timeout": f"{REQUEST_TIMEOUT_SECONDS}s",
            "connect_timeout": f"{CONNECT_TIMEOUT_SECONDS}s",
        }
        if self.endpoint_url is not None:
            options["AWS_ENDPOINT_URL"] = self.endpoint_url
            if self.allow_http:
                options["AWS_ALLOW_HTTP"] = "true"
        if self.access_key_id is not None:
            options["AWS_ACCESS_KEY_ID"] = self.access_key_id
            options["AWS_SECRET_ACCESS_KEY"] = self.secret_access_key or ""
            if self.session_token:
                options["AWS_SESSION_TOKEN"] = self.session_token
        return options

    def iceberg_properties(self) -> dict[str, str]:
        props: dict[str, str] = {
            "s3.region": self.region or "us-east-1",
            "s3.force-virtual-addressing": "false" if self.path_style else "true",
            "s3.connect-timeout": str(CONNECT_TIMEOUT_SECONDS),
            "s3.request-timeout": str(REQUEST_TIMEOUT_SECONDS),
        }
        if self.endpoint_url is not None:
            props["s3.endpoint"] = self.endpoint_url
        if self.access_key_id is not None:
            props["s3.access-key-id"] = self.access_key_id
            props["s3.secret-access-key"] = self.secret_access_key or ""
            if self.session_token:
                props["s3.session-token"] = self.session_token
        return props

    def obstore_store(self, bucket: str) -> Any:
        from obstore.store import S3Store

        kwargs: dict[str, Any] = {
            "region": self.region or "us-east-1",
            "virtual_hosted_style_request": not self.path_style,
            "client_options": {
                "connect_timeout": f"{CONNECT_TIMEOUT_SECONDS}s",
                "timeout": f"{REQUEST_TIMEOUT_SECONDS}s",
                "allow_http": self.allow_http,
            },
            "retry_config": {"max_retries": MAX_RETRIES},
        }
        if self.endpoint_url is not None:
            kwargs["endpoint"] = self.endpoint_url
        if self.access_key_id is not None:
            kwargs.update(access_key_id=self.access_key_id, secret_access_key=self.secret_access_key)
            if self.session_token:
                kwargs["token"] = self.session_token
        return S3Store(bucket, **kwargs)

    def secrets(self) -> list[str]:
        """The values a message must never show."""
        return [s for s in (self.access_key_id, self.secret_access_key, self.session_token) if s]


# -- the active access of this process (a job, an operator's execute) ------------------------

_active: ObjectStoreAccess | None = None


def current() -> ObjectStoreAccess | None:
    return _active


@contextlib.contextmanager
def using(access: ObjectStoreAccess | None) -> Iterator[None]:
    """Make ``access`` the one every store client of this process is built from, for the block."""
    global _active
    previous = _active
    _active = access if access is not None else previous
    try:
        yield
    finally:
        _active = previous


def activate(access: ObjectStoreAccess | None) -> None:
    """Make ``access`` active for the rest of this process (a Spark task's worker, a job)."""
    global _active
    if access is not None:
        _active = access


# -- clients for a URI ----------------------------------------------------------------------


def filesystem(uri: str) -> tuple[Any, str]:
    """Arrow's file system for ``uri`` and the path inside it (``bucket/key`` on S3)."""
    import pyarrow.fs as pafs

    scheme = scheme_of(uri)
    if scheme in S3_SCHEMES:
        bucket, key = split_bucket(uri)
        access = current() or ObjectStoreAccess()
        return access.arrow_filesystem(), f"{bucket}/{key}".rstrip("/")
    if scheme == "gcs":
        uri = "gs" + str(uri)[len("gcs") :]
    elif scheme in ("abfss", "az"):
        uri = "abfs" + str(uri)[len(scheme) :]
    fs, path = pafs.FileSystem.from_uri(uri)
    return fs, path


def delta_storage_options(uri: str) -> dict[str, str] | None:
    """delta-rs's storage options for a table at ``uri`` (None: local, or the default chain)."""
    if scheme_of(uri) in S3_SCHEMES:
        return (current() or ObjectStoreAccess()).delta_storage_options()
    return None


def iceberg_io_properties(uri: str) -> dict[str, str]:
    """pyiceberg FileIO properties for tables under ``uri`` (empty: local, or the default chain)."""
    if scheme_of(uri) in S3_SCHEMES:
        return (current() or ObjectStoreAccess()).iceberg_properties()
    return {}


def library_uri(uri: str) -> str:
    """``uri`` with the scheme the Rust and Arrow libraries know (``s3a://`` → ``s3://``)."""
    scheme = scheme_of(uri)
    if scheme in ("s3a", "s3n"):
        return "s3" + str(uri)[len(scheme) :]
    return str(uri)


def put_if_absent(uri: str, data: bytes) -> None:
    """Create the object at ``uri`` with ``data``, atomically, only if no object has that name:
    :class:`FileExistsError` otherwise. One conditional PUT: the object appears whole or not at
    all, and an existing one is never replaced (S3 ``If-None-Match: *``, GCS
    ``ifGenerationMatch=0``, Azure ``If-None-Match: *``)."""
    import obstore
    from obstore.exceptions import AlreadyExistsError, PreconditionError

    scheme = scheme_of(uri)
    bucket, key = split_bucket(uri)
    if scheme in S3_SCHEMES:
        store = (current() or ObjectStoreAccess()).obstore_store(bucket)
    else:
        from obstore.store import from_url

        store = from_url(f"{'gs' if scheme in GCS_SCHEMES else scheme}://{bucket}")
    try:
        obstore.put(store, key, data, mode="create")
    except (AlreadyExistsError, PreconditionError) as exc:
        raise FileExistsError(uri) from exc


def redact(text: str, access: ObjectStoreAccess | None = None) -> str:
    """``text`` without the access's credentials (error messages of the clients may echo them)."""
    for secret in (access or current() or ObjectStoreAccess()).secrets():
        text = text.replace(secret, "***")
    return text
