"""The SQL Server connection string (no database, no Airflow): only an installed driver's name as
the driver, only allowlisted ODBC attributes from the connection's extra, and no value that can
leave its ``key=value;`` pair.

The property tests read the built string back as the ODBC connection string grammar reads it
(MS-ODBCSTR: ``;``-separated pairs, braced values with ``}}`` for a ``}``) and require exactly the
pairs the engine meant: one ``DRIVER``, its own, and nothing an editor smuggled in.
"""

from __future__ import annotations

import pyodbc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.sources.sqlserver.connection import (
    DEFAULT_DRIVER,
    MICROSOFT_ATTRIBUTES,
    SqlServerConnectionInfo,
    check_driver_name,
    check_installed,
)

PSQLODBC = "PostgreSQL Unicode"


def parse(text: str) -> list[tuple[str, str]]:
    """``text`` as the ODBC connection string grammar reads it (keys upper-cased)."""
    pairs, at = [], 0
    while at < len(text):
        equals = text.index("=", at)
        key, at = text[at:equals].strip().upper(), equals + 1
        if text.startswith("{", at):
            value, at = "", at + 1
            while True:
                close = text.index("}", at)
                value += text[at:close]
                if not text.startswith("}", close + 1):
                    at = close + 1
                    break
                value, at = value + "}", close + 2  # "}}" is one "}"
        else:
            end = text.find(";", at)
            end = len(text) if end < 0 else end
            value, at = text[at:end], end
        assert text.startswith(";", at), f"a pair does not end with ';' at {at} of {text!r}"
        pairs.append((key, value))
        at += 1
    return pairs


def info(**changes) -> SqlServerConnectionInfo:
    fields = {"host": "db.example.com", "port": 1433, "database": "shop", "user": "cdc", "password": "pw"}
    return SqlServerConnectionInfo(**{**fields, **changes})


def refusal(**changes) -> str:
    with pytest.raises(CdcConfigurationError) as refused:
        info(**changes)
    return str(refused.value)


# -- the driver --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [DEFAULT_DRIVER, "ODBC Driver 17 for SQL Server", "FreeTDS", PSQLODBC])
def test_a_driver_name_is_a_driver_name(name):
    check_driver_name(name)
    assert info(driver=name).driver == name


@pytest.mark.parametrize(
    "name",
    [
        "/tmp/evil.so",
        "./evil.so",
        "evil.so",  # unixODBC finds a bare file name on the library path
        "libevil.so.1",
        "C:\\drivers\\evil.dll",
        "evil.DLL",
        "/Library/evil.dylib",
        "{ODBC Driver 18 for SQL Server}",
        "ODBC Driver 18 for SQL Server;DRIVER=/tmp/evil.so",
        " ODBC Driver 18 for SQL Server",
        "ODBC Driver 18\nfor SQL Server",
        "",
    ],
)
def test_a_library_or_a_broken_name_is_not_a_driver(name):
    with pytest.raises(CdcConfigurationError, match=r"is not an ODBC driver name.*never a path to a library"):
        check_driver_name(name)
    assert "is not an ODBC driver name" in refusal(driver=name)


def test_only_an_installed_driver_is_used_and_the_error_names_the_installed_ones():
    installed = pyodbc.drivers()
    assert PSQLODBC in installed, "scripts/bootstrap.sh installs psqlODBC"
    check_installed(PSQLODBC)
    with pytest.raises(CdcConfigurationError) as refused:
        check_installed("No Such Driver 42")
    message = str(refused.value)
    assert "ODBC driver 'No Such Driver 42' is not installed on this worker" in message
    assert all(repr(name) in message for name in installed)


# -- the attributes of the extra -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "spelled"),
    [
        ("Encrypt", "strict", "Encrypt"),
        ("encrypt", "yes", "Encrypt"),
        ("TRUSTSERVERCERTIFICATE", "no", "TrustServerCertificate"),
        ("HostNameInCertificate", "*.database.windows.net", "HostNameInCertificate"),
        ("ApplicationIntent", "ReadOnly", "ApplicationIntent"),
        ("MultiSubnetFailover", "Yes", "MultiSubnetFailover"),
        ("Authentication", "ActiveDirectoryServicePrincipal", "Authentication"),
        ("ConnectRetryCount", "3", "ConnectRetryCount"),
        ("ConnectTimeout", "30", "ConnectTimeout"),
        ("app", "nightly capture (shop)", "APP"),
    ],
)
def test_allowed_attributes_pass_in_their_documented_spelling(key, value, spelled):
    connection = info(options=((key, value),))
    assert connection.options == ((spelled, value),)
    assert parse(connection.odbc())[-1] == (spelled.upper(), value)


@pytest.mark.parametrize(
    ("key", "because"),
    [
        ("Driver", "the driver comes from the DAG"),
        ("DRIVER ", "the driver comes from the DAG"),
        ("DSN", "a data source names its own driver"),
        ("FileDSN", "a file data source"),
        ("SaveFile", "password included, to a file"),
        ("Trusted_Connection", "the worker's own identity"),
        ("Server", "host field"),
        ("Addr", "host field"),
        ("UID", "login field"),
        ("PWD", "password field"),
        ("Database", "schema field"),
        ("KeystoreAuthentication", ""),
        ("KeystorePrincipalId", ""),
        ("KeystoreSecret", ""),
        ("ServerCertificate", ""),
        ("ClientCertificate", ""),
        ("ClientKey", ""),
        ("AttachDBFileName", ""),
        ("QueryLogFile", ""),
        ("StatsLogFile", ""),
        ("Setup", ""),
        ("ColumnEncryption", ""),
        ("Encrypt ", ""),
    ],
)
def test_keys_that_load_files_or_change_identity_are_refused_with_the_allowed_ones(key, because):
    message = refusal(options=((key, "x"),))
    assert f"ODBC attribute {key!r} of the connection's extra is not allowed" in message
    assert because in message
    assert "allowed: " + ", ".join(a.name for a in MICROSOFT_ATTRIBUTES.values()) in message


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("Encrypt", "maybe", "one of yes, no, true, false, mandatory, optional, strict"),
        ("Authentication", "ActiveDirectoryIntegrated", "one of SqlPassword"),  # the worker's Kerberos identity
        ("Authentication", "ActiveDirectoryMsi", "one of SqlPassword"),  # the worker's managed identity
        ("Authentication", "ActiveDirectoryInteractive", "one of SqlPassword"),
        ("ConnectRetryCount", "-1", "a whole number from 0 to 255"),
        ("ConnectRetryCount", "٣", "a whole number from 0 to 255"),  # a digit, not an ASCII one
        ("HostNameInCertificate", "evil.com;DRIVER=/tmp/evil.so", "a host name"),
        ("APP", "x\x00", "text without ; { }"),
    ],
)
def test_allowed_attributes_take_only_their_values(key, value, expected):
    message = refusal(options=((key, value),))
    assert f"must be {expected}" in message
    assert value not in message


@pytest.mark.parametrize("driver", [DEFAULT_DRIVER, "FreeTDS", PSQLODBC])
def test_every_driver_gets_the_same_allowlist(driver):
    """Another driver's own settings (psqlODBC's here: fetching, rollback, TLS, libpq pass-through)
    belong in its odbcinst.ini entry on the workers, never in a connection (the tests' stand-in
    driver gets its settings that way, tests/support/odbc.py)."""
    assert info(driver=driver, options=(("encrypt", "yes"),)).options == (("Encrypt", "yes"),)
    for key, value in (
        ("UseDeclareFetch", "1"),
        ("Fetch", "2000"),
        ("BoolsAsChar", "0"),
        ("Protocol", "7.4-1"),
        ("SSLmode", "disable"),
        ("pqopt", "sslkey=/tmp/key"),
    ):
        message = refusal(driver=driver, options=((key, value),))
        assert f"ODBC attribute {key!r} of the connection's extra is not allowed" in message
        assert "allowed: " + ", ".join(a.name for a in MICROSOFT_ATTRIBUTES.values()) in message


def test_an_attribute_set_twice_is_refused():
    assert "Encrypt set more than once" in refusal(options=(("Encrypt", "yes"), ("encrypt", "no")))


def test_a_job_spec_carries_the_checked_attributes_and_a_tampered_one_is_refused():
    connection = info(options=(("encrypt", "strict"),))
    assert SqlServerConnectionInfo.from_dict(connection.to_dict()).options == (("Encrypt", "strict"),)
    tampered = {**connection.to_dict(), "options": [["Driver", "/tmp/evil.so"]]}
    with pytest.raises(CdcConfigurationError, match="ODBC attribute 'Driver'"):
        SqlServerConnectionInfo.from_dict(tampered)
    with pytest.raises(CdcConfigurationError, match="never a path"):
        SqlServerConnectionInfo.from_dict({**connection.to_dict(), "driver": "/tmp/evil.so"})


# -- the connection's own fields -------------------------------------------------------------------


@pytest.mark.parametrize("host", ["db.example.com", "10.0.0.5", "tcp:db.example.com", "db\\SQLEXPRESS", "[::1]"])
def test_host_names_and_instances_are_hosts(host):
    assert parse(info(host=host).odbc())[1] == ("SERVER", f"{host},1433")


@pytest.mark.parametrize("host", ["db;DRIVER=/tmp/evil.so", "db}", "{db", "db example", "db\n", ""])
def test_a_host_that_is_no_host_is_refused(host):
    assert "is not a host name" in refusal(host=host)


@pytest.mark.parametrize("field", ["database", "user", "password"])
def test_line_breaks_and_nul_are_refused_without_showing_the_value(field):
    secret = "S3cret-value\nDRIVER=/tmp/evil.so"
    message = refusal(**{field: secret})
    assert "must not contain line breaks or NUL characters" in message
    assert "S3cret" not in message


# -- properties: whatever an editor writes stays in its pair -------------------------------------

FIELD_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40)
HOSTILE = st.lists(
    st.sampled_from(["}", "{", ";", "=", "}}", "};", ";DRIVER=/tmp/evil.so;", " ", "a", "é"]), max_size=8
)


def expected_pairs(connection: SqlServerConnectionInfo) -> list[tuple[str, str]]:
    return [
        ("DRIVER", connection.driver),
        ("SERVER", f"{connection.host},{connection.port}"),
        ("DATABASE", connection.database),
        ("UID", connection.user),
        ("PWD", connection.password),
        *[(key.upper(), value) for key, value in connection.options],
    ]


@settings(max_examples=300, deadline=None)
@given(
    database=st.one_of(FIELD_TEXT, HOSTILE.map("".join).filter(bool)),
    user=st.one_of(FIELD_TEXT, HOSTILE.map("".join)),
    password=st.one_of(FIELD_TEXT, HOSTILE.map("".join)),
)
def test_the_connections_fields_are_read_back_exactly(database, user, password):
    try:
        connection = info(database=database, user=user, password=password)
    except CdcConfigurationError as refused:
        assert any(c in "\x00\r\n" for c in database + user + password), refused
        return
    assert parse(connection.odbc()) == expected_pairs(connection)


@settings(max_examples=300, deadline=None)
@given(
    attribute=st.sampled_from(sorted(MICROSOFT_ATTRIBUTES)),
    value=st.one_of(FIELD_TEXT, HOSTILE.map("".join), st.sampled_from(["yes", "strict", "ReadOnly", "12", "a.b"])),
)
def test_an_attribute_value_is_refused_or_read_back_exactly(attribute, value):
    try:
        connection = info(options=((attribute, value),))
    except CdcConfigurationError as refused:
        assert "must be" in str(refused)
        return
    assert not any(c in ";{}\x00\r\n" for c in value)
    assert parse(connection.odbc()) == expected_pairs(connection)


@settings(max_examples=200, deadline=None)
@given(key=st.text(min_size=1, max_size=30))
def test_any_key_outside_the_allowlist_is_refused(key):
    if key.lower() in MICROSOFT_ATTRIBUTES:
        return
    assert "is not allowed" in refusal(options=((key, "yes"),))


@settings(max_examples=100, deadline=None)
@given(
    key=st.sampled_from(["KeystoreSecret", "Encrypt", "Foo"]),
    secret=st.from_regex(r"S3cr3t-[A-Za-z0-9]{8}", fullmatch=True),
)
def test_a_refused_attribute_never_shows_its_value(key, secret):
    assert secret not in refusal(options=((key, secret),))
