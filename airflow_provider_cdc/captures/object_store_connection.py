"""An Airflow ``aws`` connection as the object store's access (``object_store_conn_id``).

A capture whose ``sink_path`` (and a current-state task whose ``state_path``) is on S3 or an
S3-compatible store names the Amazon provider's ``aws`` connection users already have. It is
read when a task runs, never when the DAG is parsed, with the Amazon provider's own
``AwsBaseHook``, so every way that connection type gives credentials works: keys in the login
and password, a role to assume (``role_arn``, its session token included), a profile, the
machine's own role. From the extra: ``endpoint_url`` (or ``service_config.s3.endpoint_url``),
``region_name`` (else the session's: ``AWS_REGION``, the profile's, ``AWS_DEFAULT_REGION``), and
the S3 addressing style (``config_kwargs: {"s3": {"addressing_style": "path"}}``; unset, it is
path-style with an endpoint).

Credentials the connection names (keys, a role, a profile) become an :class:`ObjectStoreAccess`
(its ``repr`` and ``to_dict`` leave them out; ``get_credentials`` masks the secret and the
session token in the task log). They are frozen for the task: an assumed role's session must
outlive it (``assume_role_kwargs.DurationSeconds``). A connection naming none leaves the keys
out, so each library's own chain finds, and refreshes, the machine's role.
"""

from __future__ import annotations

import os
from typing import Any

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.sinks.object_store import ObjectStoreAccess, redact
from airflow_provider_cdc.version_compat import AirflowOptionalProviderFeatureException

#: How to get the Amazon provider (and obstore, the commit log's conditional writes).
S3_INSTALL_LINE = "pip install 'airflow-provider-cdc[s3]'"
CONN_TYPE = "aws"


class AmazonProviderNotInstalledError(CdcConfigurationError, AirflowOptionalProviderFeatureException):
    """``object_store_conn_id`` is set where the Amazon provider is not installed (a retry
    cannot install it: the task fails without retries)."""


def aws_base_hook_class() -> Any:
    """The Amazon provider's ``AwsBaseHook``, or the error naming the install line."""
    try:
        from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook
    except ImportError as exc:
        if not (exc.name or "").startswith(("airflow.providers.amazon", "boto3", "botocore")):
            raise  # the provider is there but broken: its own error says more
        raise AmazonProviderNotInstalledError(
            f"object_store_conn_id reads an 'aws' connection through the Amazon provider, which is not installed "
            f"in this Python ({exc}). Install it on the workers: {S3_INSTALL_LINE}"
        ) from None
    return AwsBaseHook


def object_store_access(conn_id: str) -> ObjectStoreAccess:
    """The access the ``aws`` connection ``conn_id`` gives: endpoint, region, addressing style, keys."""
    hook_class = aws_base_hook_class()
    conn = _connection(hook_class, conn_id)
    if conn.conn_type != CONN_TYPE:
        raise CdcConfigurationError(
            f"object_store_conn_id {conn_id!r} is a {conn.conn_type!r} connection: give an {CONN_TYPE!r} connection "
            "(the Amazon provider's type: keys in login/password, endpoint_url, region_name and "
            "config_kwargs.s3.addressing_style in the extra)"
        )
    hook = hook_class(aws_conn_id=conn_id, client_type="s3")
    config = hook.conn_config
    region = config.region_name or _session_region(config)
    try:
        credentials = hook.get_credentials(region_name=region)
    except CdcConfigurationError:
        raise
    except Exception as exc:  # botocore's errors (no credentials, STS refused the role) name no secret of ours
        raise CdcConfigurationError(
            f"the 'aws' connection {conn_id!r} gives no usable credentials ({type(exc).__name__}: "
            f"{redact(str(exc), _access_of(conn))}): set its login/password (access key id and secret), a role_arn, "
            "or run the workers with their own AWS role"
        ) from None
    # Keys of its own (login/password, a role, a profile) are frozen for the task; with none,
    # each library's own default chain is left to find (and refresh) the machine's role.
    own = _has_own_credentials(config)
    try:
        return ObjectStoreAccess(
            endpoint_url=config.get_service_endpoint_url("s3"),
            region=region,
            path_style=_path_style(config.botocore_config),
            access_key_id=credentials.access_key if own else None,
            secret_access_key=credentials.secret_key if own else None,
            session_token=credentials.token if own else None,
        )
    except CdcConfigurationError as exc:
        raise CdcConfigurationError(f"the 'aws' connection {conn_id!r}: {exc}") from None


def _connection(hook_class: Any, conn_id: str) -> Any:
    # AwsBaseHook falls back to an empty connection (the machine's credentials) when the id is
    # unknown: a typo would then write with whatever role the worker has. Refuse it instead.
    try:
        return hook_class.get_connection(conn_id)
    except Exception as exc:
        if type(exc).__name__ != "AirflowNotFoundException":
            raise
        raise CdcConfigurationError(
            f"object_store_conn_id {conn_id!r} names no Airflow connection: create an 'aws' connection with that id "
            "(or leave object_store_conn_id unset to use the workers' own AWS credentials)"
        ) from None


def _path_style(botocore_config: Any) -> bool | None:
    """Path-style addressing (``http://host/bucket/key``) as the connection's botocore config says:
    True for ``path``, False for ``virtual``, None (``auto`` or unset: path-style with an
    ``endpoint_url``, virtual-hosted on AWS; :attr:`ObjectStoreAccess.path_style`)."""
    s3 = getattr(botocore_config, "s3", None) or {}
    style = s3.get("addressing_style")
    return True if style == "path" else False if style == "virtual" else None


def _has_own_credentials(config: Any) -> bool:
    """Whether the connection names credentials (keys, a role to assume, a profile) rather than
    leaving them to the machine (an instance, pod or task role)."""
    return bool(config.aws_access_key_id or config.role_arn or config.profile_name)


def _session_region(config: Any) -> str | None:
    """The region when the connection names none: ``AWS_REGION``, else botocore's (the profile's,
    ``AWS_DEFAULT_REGION``); None leaves it to each library."""
    if os.environ.get("AWS_REGION"):
        return os.environ["AWS_REGION"]
    try:
        import botocore.session

        return botocore.session.Session(profile=config.profile_name).get_config_variable("region") or None
    except Exception:  # an unknown profile: the libraries' own defaults apply
        return None


def _access_of(conn: Any) -> ObjectStoreAccess:
    """The connection's own keys, for redacting a message (no endpoint check)."""
    return ObjectStoreAccess(access_key_id=conn.login or None, secret_access_key=conn.password or None)
