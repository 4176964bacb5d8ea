"""What a PostgreSQL connection's editor can put into the capture's libpq connection string.

The editor chooses where the capture connects and as whom; the allowlisted extras never let them
choose code the worker loads (``sslkey=engine:key``), a file of more parameters (``service``), nor
the session's settings (``options``), which the product pins. The real-server side of the same
attacks is in ``tests/integration/postgres/test_tls.py``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from psycopg.conninfo import conninfo_to_dict

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.sources.postgres.connection import (
    ALLOWED_OPTIONS,
    SECURITY_SETTINGS,
    PgConnectionInfo,
    session_options,
)
from airflow_provider_cdc.hooks.postgres_cdc import connection_info_from


def airflow_connection(**extra) -> SimpleNamespace:
    return SimpleNamespace(
        conn_type="postgres", host="db.example.com", port=5432, schema="shop", login="cdc", password="pw",
        extra_dejson=extra,
    )  # fmt: skip


@pytest.mark.parametrize("sslkey", ["/tmp/evil.so:anything", "/tmp/evil.so:", "dynamic:/tmp/evil.so", "pkcs11:id=1"])
def test_an_sslkey_in_libpqs_engine_form_is_refused(sslkey):
    """libpq reads ``engine:key`` in sslkey and has OpenSSL load the engine (a shared library)."""
    conn = airflow_connection(sslmode="require", sslcert="/etc/ssl/certs/ca-certificates.crt", sslkey=sslkey)
    with pytest.raises(CdcConfigurationError, match="OpenSSL engine"):
        connection_info_from(conn)


def test_a_job_spec_cannot_carry_one_either():
    with pytest.raises(CdcConfigurationError, match="OpenSSL engine"):
        PgConnectionInfo.from_dict(
            {"host": "h", "port": 5432, "dbname": "d", "user": "u", "options": [["sslkey", "/tmp/evil.so:x"]]}
        )


def test_a_key_file_is_fine():
    info = connection_info_from(airflow_connection(sslcert="/certs/client.crt", sslkey="/certs/client.key"))
    assert conninfo_to_dict(info.conninfo())["sslkey"] == "/certs/client.key"


@pytest.mark.parametrize(
    "extra",
    [
        {"options": "-c search_path=public -c row_security=on"},
        {"service": "evil"},
        {"passfile": "/etc/airflow/admin.pgpass"},
        {"sslpassword": "x"},
        {"gsslib": "gssapi"},
        {"krbsrvname": "evil"},
        {"sslcrldir": "/tmp"},
        {"require_auth": "none"},
        {"channel_binding": "disable"},
        {"replication": "database"},
        {"hostaddr": "10.0.0.1"},
    ],
)
def test_extras_outside_the_allowlist_never_reach_libpq(extra):
    params = conninfo_to_dict(connection_info_from(airflow_connection(**extra)).conninfo())
    for key in extra:
        assert key not in params or (key == "options" and params[key] == session_options())


def test_the_session_settings_are_the_products_and_pin_search_path_and_row_security():
    assert "options" not in ALLOWED_OPTIONS and "service" not in ALLOWED_OPTIONS
    params = conninfo_to_dict(PgConnectionInfo("h", 5432, "d", "u", options=(("application_name", "x"),)).conninfo())
    assert "-c search_path=pg_catalog,pg_temp" in params["options"]
    assert "-c row_security=off" in params["options"]
    assert params["application_name"] == "x"  # an extra the product allows still wins over its default
    assert SECURITY_SETTINGS == {"search_path": "pg_catalog, pg_temp", "row_security": "off"}
