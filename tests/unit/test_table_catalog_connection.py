"""An Airflow connection as an Iceberg catalog: properties by name, the password as the one
secret, which never reaches a job spec's JSON."""

from __future__ import annotations

import json

import pytest

from airflow_provider_cdc.captures.table_catalog import catalog_properties
from airflow_provider_cdc.cdc.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.spec import CATALOG_SECRET_ENV, CaptureOptions


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
