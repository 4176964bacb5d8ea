"""An Airflow connection as an Iceberg catalog: properties by name, the password as the one
secret, which never reaches a job spec's JSON."""

from __future__ import annotations

import json

import pytest

from airflow_provider_cdc.captures.table_catalog import catalog_properties
from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.planning.spec import CATALOG_SECRET_ENV, CaptureOptions


def test_properties_are_read_by_name_and_the_password_is_the_secret():
    props, prop, secret = catalog_properties(
        "ice",
        {"type": "rest", "warehouse": "lake", "header.X-Iceberg-Access-Delegation": "vended-credentials"},
        "https://catalog.example.com/api",
        "client:s3cr3t",
    )
    assert props == {
        "type": "rest",
        "warehouse": "lake",
        "header.X-Iceberg-Access-Delegation": "vended-credentials",
        "uri": "https://catalog.example.com/api",
    }
    assert (prop, secret) == ("credential", "client:s3cr3t")
    assert catalog_properties("ice", {"secret_property": "token"}, None, "t0k")[1:] == ("token", "t0k")
    sql = catalog_properties("ice", {"uri": "sqlite:///x.db"}, "ignored", None)
    assert sql == ({"uri": "sqlite:///x.db"}, None, None)


@pytest.mark.parametrize("key", ["credential", "s3.secret-access-key", "token", "unknown-thing"])
def test_secrets_and_unknown_keys_in_the_extra_are_refused(key):
    with pytest.raises(CdcConfigurationError, match=key) as raised:
        catalog_properties("ice", {key: "value"}, None, None)
    assert "value" not in str(raised.value)


def test_the_secret_never_reaches_the_spec_json_and_comes_back_from_the_environment(monkeypatch):
    options = CaptureOptions(
        sink_format="iceberg",
        table_catalog={"type": "rest", "uri": "https://c"},
        table_catalog_secret_property="credential",
        table_catalog_secret="client:s3cr3t",
    )
    text = json.dumps(options.to_dict())
    assert "s3cr3t" not in text and "s3cr3t" not in repr(options)
    assert options.catalog_properties()["credential"] == "client:s3cr3t"
    monkeypatch.setenv(CATALOG_SECRET_ENV, "client:s3cr3t")
    assert CaptureOptions.from_dict(json.loads(text)).catalog_properties() == options.catalog_properties()
    monkeypatch.delenv(CATALOG_SECRET_ENV)
    assert "credential" not in CaptureOptions.from_dict(json.loads(text)).catalog_properties()


@pytest.mark.parametrize(
    "key",
    [
        "py-io-impl",
        "py-catalog-impl",
        "s3.retry-strategy-impl",
        "rest.auth.impl",
        "header.x-impl",
        "catalog-impl",
        "io-impl",
        "s3.client.factory",
        "hive.metastore-provider",
    ],
)
def test_keys_naming_a_class_to_import_are_refused(key):
    """A connection's editor cannot choose code for pyiceberg to import (``module.Class``)."""
    with pytest.raises(CdcConfigurationError, match=f"extra key '{key}' makes pyiceberg import the class"):
        catalog_properties("ice", {"type": "sql", key: "attacker.Module"}, "sqlite:///x.db", None)
    with pytest.raises(CdcConfigurationError, match="names a class for pyiceberg to import"):
        catalog_properties("ice", {"secret_property": key}, None, "attacker.Module")


def test_pyicebergs_own_file_ios_may_be_named():
    for io in ("pyiceberg.io.pyarrow.PyArrowFileIO", "pyiceberg.io.fsspec.FsspecFileIO"):
        assert catalog_properties("ice", {"py-io-impl": io}, None, None)[0] == {"py-io-impl": io}


@pytest.mark.parametrize(
    "extra, host, where",
    [
        ({"type": "sql"}, "postgresql://cat:pw-s3cr3t@db/cat", "the connection's host"),
        ({"uri": "postgresql+psycopg://cat:pw-s3cr3t@db/cat"}, None, "extra key 'uri'"),
        ({"uri": "https://user:pw-s3cr3t@rest.example/api"}, "ignored", "extra key 'uri'"),
        ({"oauth2-server-uri": "https://id:pw-s3cr3t@auth/token"}, None, "extra key 'oauth2-server-uri'"),
        ({"s3.endpoint": "http://key:pw-s3cr3t@minio:9000"}, None, "extra key 's3.endpoint'"),
    ],
)
def test_a_uri_with_a_password_is_refused_without_repeating_it(extra, host, where):
    with pytest.raises(CdcConfigurationError, match="is a URI with a password in it") as raised:
        catalog_properties("ice", extra, host, None)
    message = str(raised.value)
    assert where in message and ":***@" in message and "pw-s3cr3t" not in message
    assert "connection's password field" in message


def test_a_uri_without_a_password_and_the_uri_as_the_secret_are_accepted():
    assert catalog_properties("ice", {}, "postgresql://cat@db/cat", None)[0] == {"uri": "postgresql://cat@db/cat"}
    uri = "postgresql://cat:pw-s3cr3t@db/cat"
    props, prop, secret = catalog_properties("ice", {"type": "sql", "secret_property": "uri"}, None, uri)
    assert (props, prop, secret) == ({"type": "sql"}, "uri", uri)
    options = CaptureOptions(
        sink_format="iceberg", table_catalog=props, table_catalog_secret_property=prop, table_catalog_secret=secret
    )
    assert options.catalog_properties()["uri"] == uri
    assert "pw-s3cr3t" not in json.dumps(options.to_dict()) + repr(options)


def test_an_authorization_header_is_a_secret():
    with pytest.raises(CdcConfigurationError, match="looks like a secret") as raised:
        catalog_properties("ice", {"header.Authorization": "Bearer t0k3n"}, None, None)
    assert "t0k3n" not in str(raised.value)
