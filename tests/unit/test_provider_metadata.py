"""The provider as Airflow sees it: the CLI lists it with its hooks and connection types, the
connection form gets the CDC fields, and the metadata names every module the package has."""

from __future__ import annotations

import json
import logging
import os
import pkgutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import airflow_provider_cdc
from airflow_provider_cdc.get_provider_info import get_provider_info

pytestmark = pytest.mark.airflow

CONNECTION_TYPES = {
    "postgres_cdc": "airflow_provider_cdc.hooks.postgres_cdc.PostgresCdcHook",
    "mssql_cdc": "airflow_provider_cdc.hooks.sqlserver_cdc.SqlServerCdcHook",
    "yugabytedb_cdc": "airflow_provider_cdc.hooks.yugabyte_cdc.YugabyteCdcHook",
}


def airflow_cli(tmp_path: Path, *args: str) -> object:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env["AIRFLOW_HOME"] = str(tmp_path / "airflow-home")
    result = subprocess.run(
        [str(Path(sys.executable).parent / "airflow"), *args, "-o", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(result.stdout)


def test_the_cli_shows_the_provider_its_hooks_and_connection_types(tmp_path):
    (info,) = airflow_cli(tmp_path, "providers", "get", "airflow-provider-cdc", "--full")
    assert info["package-name"] == "airflow-provider-cdc"
    assert {c["connection-type"]: c["hook-class-name"] for c in info["connection-types"]} == CONNECTION_TYPES
    hooks = airflow_cli(tmp_path, "providers", "hooks")
    ours = {h["connection_type"]: h for h in hooks if h["package_name"] == "airflow-provider-cdc"}
    assert {t: h["class"] for t, h in ours.items()} == CONNECTION_TYPES
    # The standard types stay their providers' own.
    assert next(h for h in hooks if h["connection_type"] == "postgres")["package_name"] == (
        "apache-airflow-providers-postgres"
    )


def test_the_connection_form_gets_the_cdc_fields_without_conflicts(caplog):
    from airflow.providers_manager import ProvidersManager

    manager = ProvidersManager()
    with caplog.at_level(logging.WARNING):
        widgets = manager.connection_form_widgets
        behaviours = manager.field_behaviours
        hooks = manager.hooks
    assert not [r for r in caplog.records if "cdc" in r.getMessage().lower()], caplog.text
    for field in ("sslmode", "sslrootcert", "target_session_attrs", "application_name"):
        assert f"extra__postgres_cdc__{field}" in widgets
        assert f"extra__yugabytedb_cdc__{field}" in widgets
    for field in ("driver", "Encrypt", "TrustServerCertificate"):
        assert f"extra__mssql_cdc__{field}" in widgets
    assert behaviours["postgres_cdc"]["relabeling"] == {"schema": "Database"}
    assert behaviours["yugabytedb_cdc"]["placeholders"]["port"] == "5433"
    assert hooks["postgres_cdc"].hook_class_name == CONNECTION_TYPES["postgres_cdc"]
    assert hooks["postgres"].package_name == "apache-airflow-providers-postgres"


def test_the_hooks_read_form_fields_under_either_name(monkeypatch):
    from airflow_provider_cdc.hooks.postgres_cdc import connection_info_from
    from airflow_provider_cdc.hooks.sqlserver_cdc import connection_info_from as odbc_info_from

    def conn(conn_type, extra, port=None):
        return SimpleNamespace(
            conn_type=conn_type,
            extra_dejson=extra,
            host="db",
            port=port,
            schema="shop",
            login="cdc",
            password="s3cret",
        )

    prefixed = conn("postgres_cdc", {"extra__postgres_cdc__sslmode": "verify-full", "extra__postgres_cdc__sslcrl": ""})
    assert connection_info_from(prefixed).options == (("sslmode", "verify-full"),)
    assert connection_info_from(conn("postgres", {"sslmode": "require"})).options == (("sslmode", "require"),)
    assert connection_info_from(conn("yugabytedb_cdc", {})).port == 5433
    assert connection_info_from(conn("postgres", {})).port == 5432
    # The driver field counts only where the deployment allows it (docs/sqlserver.md).
    monkeypatch.setenv("AIRFLOW__CDC__SQLSERVER_ALLOW_DRIVER_IN_EXTRA", "True")
    odbc = odbc_info_from(conn("mssql_cdc", {"extra__mssql_cdc__driver": "FreeTDS", "Encrypt": "yes"}, port=1433))
    assert (odbc.driver, odbc.options) == ("FreeTDS", (("Encrypt", "yes"),))


def _modules(package: str) -> set[str]:
    path = Path(airflow_provider_cdc.__file__).parent / package
    return {
        f"airflow_provider_cdc.{package}.{m.name}"
        for m in pkgutil.iter_modules([str(path)])
        if not m.name.startswith("_") and m.name not in ("runs", "assets", "lineage", "extras", "polling")
    }


@pytest.mark.parametrize(
    "kind,package", [("hooks", "hooks"), ("operators", "operators"), ("sensors", "sensors"), ("triggers", "triggers")]
)
def test_the_metadata_lists_every_module(kind, package):
    listed = {m for entry in get_provider_info()[kind] for m in entry["python-modules"]}
    assert listed == _modules(package)
