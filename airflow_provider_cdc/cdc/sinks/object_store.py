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

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError

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


def _is_ip_address(host: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


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
    #: True: path-style (``host/bucket/key``); False: virtual-hosted (``bucket.host/key``); None
    #: (the connection names no style, boto3's ``auto``): path-style with an ``endpoint_url``
    #: (S3-compatible stores), virtual-hosted on AWS. One decision, given to every engine.
    path_style: bool | None = None
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
            if self.path_style is False and _is_ip_address(parsed.hostname or ""):
                raise CdcConfigurationError(
                    f"virtual-hosted addressing puts the bucket in the endpoint's host name, and the endpoint_url "
                    f"{self.endpoint_url!r} is an IP address: give the store's host name, or set the connection's "
                    'extra config_kwargs: {"s3": {"addressing_style": "path"}}'
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
        style = data.get("path_style")
        access = cls(
            endpoint_url=data.get("endpoint_url"),
            region=data.get("region"),
            path_style=None if style is None else bool(style),
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

    @property
    def uses_path_style(self) -> bool:
        """The addressing every engine uses (see :attr:`path_style`)."""
        return self.path_style if self.path_style is not None else self.endpoint_url is not None

    @property
    def signing_region(self) -> str | None:
        """The connection's region, else the environment's (``AWS_REGION``, ``AWS_DEFAULT_REGION``);
        None leaves it to each library's own default (its profile, the bucket's region)."""
        return self.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None

    def rust_endpoint(self, bucket: str | None) -> str | None:
        """The endpoint for the Rust object_store (obstore, delta-rs): with virtual-hosted
        requests it takes the endpoint as the *bucket's* and never adds the bucket itself
        (arrow-rs PR #2782), so the bucket goes in front of the host here."""
        if self.endpoint_url is None or self.uses_path_style or not bucket:
            return self.endpoint_url
        parsed = urlparse(self.endpoint_url)
        return parsed._replace(netloc=f"{bucket}.{parsed.netloc}").geturl()

    # -- each engine's client ------------------------------------------------------------------

    def arrow_filesystem(self) -> Any:
        import pyarrow.fs as pafs

        kwargs: dict[str, Any] = {
            "connect_timeout": CONNECT_TIMEOUT_SECONDS,
            "request_timeout": REQUEST_TIMEOUT_SECONDS,
            "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=MAX_RETRIES),
            # Arrow puts the bucket in the host itself (always, without an endpoint).
            "force_virtual_addressing": not self.uses_path_style,
        }
        if self.signing_region:
            kwargs["region"] = self.signing_region
        if self.endpoint_url is not None:
            parsed = urlparse(self.endpoint_url)
            kwargs["endpoint_override"] = parsed.netloc + parsed.path.rstrip("/")
            kwargs["scheme"] = parsed.scheme
        if self.access_key_id is not None:
            kwargs.update(access_key=self.access_key_id, secret_key=self.secret_access_key)
            if self.session_token:
                kwargs["session_token"] = self.session_token
        return pafs.S3FileSystem(**kwargs)

    def delta_storage_options(self, bucket: str | None = None) -> dict[str, str]:
        """delta-rs's options for a table in ``bucket`` (needed for virtual-hosted requests to an
        ``endpoint_url``: delta-rs's object_store wants the bucket's own endpoint)."""
        options: dict[str, str] = {
            "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false" if self.uses_path_style else "true",
            "timeout": f"{REQUEST_TIMEOUT_SECONDS}s",
            "connect_timeout": f"{CONNECT_TIMEOUT_SECONDS}s",
            # delta-rs (>= 1.0) publishes _delta_log/<version>.json with one create-only PUT
            # (If-None-Match: *): a writer that lost the race gets "version exists" and retries
            # on the new version. Said explicitly so the environment (AWS_CONDITIONAL_PUT,
            # AWS_S3_ALLOW_UNSAFE_RENAME) cannot turn it off: docs/architecture.md.
            "AWS_CONDITIONAL_PUT": "etag",
            "AWS_S3_ALLOW_UNSAFE_RENAME": "false",
        }
        if self.signing_region:
            options["AWS_REGION"] = self.signing_region
        if self.endpoint_url is not None:
            options["AWS_ENDPOINT_URL"] = self.rust_endpoint(bucket) or self.endpoint_url
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
            # pyiceberg hands this to Arrow's S3FileSystem: the same addressing as arrow_filesystem.
            "s3.force-virtual-addressing": "false" if self.uses_path_style else "true",
            "s3.connect-timeout": str(CONNECT_TIMEOUT_SECONDS),
            "s3.request-timeout": str(REQUEST_TIMEOUT_SECONDS),
        }
        # Without a region pyiceberg asks AWS for the bucket's: right on AWS, not for another
        # endpoint, where it signs for us-east-1 as Arrow and obstore do by default.
        region = self.signing_region or ("us-east-1" if self.endpoint_url is not None else None)
        if region:
            props["s3.region"] = region
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
            "virtual_hosted_style_request": not self.uses_path_style,
            "client_options": {
                "connect_timeout": f"{CONNECT_TIMEOUT_SECONDS}s",
                "timeout": f"{REQUEST_TIMEOUT_SECONDS}s",
                "allow_http": self.allow_http,
            },
            "retry_config": {"max_retries": MAX_RETRIES},
        }
        if self.signing_region:
            kwargs["region"] = self.signing_region
        if self.endpoint_url is not None:
            kwargs["endpoint"] = self.rust_endpoint(bucket)
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


@contextlib.contextmanager
def task_access(access: ObjectStoreAccess | None) -> Iterator[None]:
    """Exactly ``access`` (None included) active for one Spark task's work: the driver's access
    travels pickled with the task, and a reused Python worker keeps no other job's keys."""
    global _active
    previous = _active
    _active = access
    try:
        yield
    finally:
        _active = previous


# -- clients for a URI ----------------------------------------------------------------------


def filesystem(uri: str, access: ObjectStoreAccess | None = None) -> tuple[Any, str]:
    """Arrow's file system for ``uri`` and the path inside it (``bucket/key`` on S3), with
    ``access`` or else the active one.

    ``uri`` is taken verbatim (not percent-decoded, on every scheme): escaped topic directories
    hold ``%`` in their names, and the path returned names exactly those keys."""
    import pyarrow.fs as pafs

    from airflow_provider_cdc.cdc.basics.naming import encoded_uri

    scheme = scheme_of(uri)
    if scheme in S3_SCHEMES:
        bucket, key = split_bucket(uri)
        access = access or current() or ObjectStoreAccess()
        return access.arrow_filesystem(), f"{bucket}/{key}".rstrip("/")
    if scheme == "gcs":
        uri = "gs" + str(uri)[len("gcs") :]
    elif scheme in ("abfss", "az"):
        uri = "abfs" + str(uri)[len(scheme) :]
    fs, path = pafs.FileSystem.from_uri(encoded_uri(uri))  # from_uri decodes: the path comes back verbatim
    return fs, path


def delta_storage_options(uri: str) -> dict[str, str] | None:
    """delta-rs's storage options for a table at ``uri`` (None: local, or the default chain)."""
    if scheme_of(uri) in S3_SCHEMES:
        return (current() or ObjectStoreAccess()).delta_storage_options(split_bucket(uri)[0])
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


def put_if_absent(uri: str, data: bytes, access: ObjectStoreAccess | None = None) -> None:
    """Create the object at ``uri`` with ``data``, atomically, only if no object has that name:
    :class:`FileExistsError` otherwise. One conditional PUT: the object appears whole or not at
    all, and an existing one is never replaced (S3 ``If-None-Match: *``, GCS
    ``ifGenerationMatch=0``, Azure ``If-None-Match: *``)."""
    import obstore
    from obstore.exceptions import AlreadyExistsError, PreconditionError

    store, key = _obstore(uri, access)
    try:
        obstore.put(store, key, data, mode="create")
    except (AlreadyExistsError, PreconditionError) as exc:
        raise FileExistsError(uri) from exc


def _obstore(uri: str, access: ObjectStoreAccess | None = None) -> tuple[Any, str]:
    """obstore's store of ``uri``'s bucket (with ``access``, else the active one) and the key."""
    scheme = scheme_of(uri)
    bucket, key = split_bucket(uri)
    if scheme in S3_SCHEMES:
        return (access or current() or ObjectStoreAccess()).obstore_store(bucket), key
    from obstore.store import from_url

    return from_url(f"{'gs' if scheme in GCS_SCHEMES else scheme}://{bucket}"), key


def delete_prefix(uri: str, access: ObjectStoreAccess | None = None) -> int:
    """Delete the object ``uri`` and every object under the "directory" ``uri`` (and its marker,
    if any); how many were listed.

    Not Arrow's ``delete_dir``: on S3 it leaves an empty marker object for the parent directory
    (Arrow keeps directories alive), which would be garbage beside every deleted attempt."""
    import obstore

    store, key = _obstore(uri, access)
    key = key.rstrip("/")
    if not key:
        raise ValueError(f"refusing to delete a whole bucket ({uri!r})")
    listed = [meta["path"] for batch in obstore.list(store, key) for meta in batch]
    obstore.delete(store, sorted({key, *listed}))  # deleting an absent key is no error on these stores
    return len(listed)


def delete_object(uri: str) -> None:
    """Delete the object ``uri`` (absent: no error). Not Arrow's ``delete_file``: on S3 it writes
    an empty marker object for the parent "directory" (Arrow keeps directories alive)."""
    import obstore

    store, key = _obstore(uri)
    if not key.strip("/"):
        raise ValueError(f"refusing to delete a whole bucket ({uri!r})")
    obstore.delete(store, key)


def redact(text: str, access: ObjectStoreAccess | None = None) -> str:
    """``text`` without the access's credentials (error messages of the clients may echo them)."""
    for secret in (access or current() or ObjectStoreAccess()).secrets():
        text = text.replace(secret, "***")
    return text


def without_secrets(function: Any) -> Any:
    """``function``, its errors raised again without the active access's credentials (of the
    same type, chained to nothing) when their message holds one: the clients' errors quote the
    store's answers, and AWS's ``SignatureDoesNotMatch`` quotes the access key id."""
    import functools

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except Exception as exc:
            message = redact(str(exc))
            if message == str(exc):
                raise
            try:
                clean = type(exc)(message)
            except Exception:
                clean = RuntimeError(message)
            raise clean from None

    return wrapper
