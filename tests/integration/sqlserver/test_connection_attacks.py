"""A connection editor cannot make a worker load a library (the security review's finding).

The attack as the review reproduced it and as an attacker would vary it: an Airflow connection's
extra names a shared object as the ODBC driver (``{"driver": "/tmp/.../evil.so"}``), or smuggles a
``DRIVER=`` (or a data source that names one) into the ODBC connection string through another
extra key, an attribute value, the host, the login or the password. unixODBC loads whatever
library a ``DRIVER`` names and runs its constructors before the driver is even asked to connect;
the last ``DRIVER`` of a connection string wins.

The planted library is real (compiled with gcc); its constructor writes a marker file. Each case
runs the product's own paths, with a real Airflow connection (``AIRFLOW_CONN_<ID>``) and the real
driver manager and driver (psqlODBC, as the tests' stand-in driver, towards a closed port): the hook's
``get_conn``, the capture's setup (``CdcSetupOperator`` calls it) and the readiness trigger. The
marker must never be written, and the error must say what is wrong and what to do, without the
connection's password.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import shutil
import socket
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from tests.support.sqlserver import ODBC_DRIVER

pytestmark = [pytest.mark.airflow]

PASSWORD = "Pa55-w0rd-of-the-connection"
ALLOW_DRIVER_IN_EXTRA = "AIRFLOW__CDC__SQLSERVER_ALLOW_DRIVER_IN_EXTRA"
PLANTED_SOURCE = r"""
#include <stdio.h>

__attribute__((constructor)) static void planted(void) {
    FILE *marker = fopen(MARKER, "w");
    if (marker) {
        fputs("the planted library ran inside the worker\n", marker);
        fclose(marker);
    }
}
"""


@dataclass(frozen=True)
class Planted:
    library: Path  # the shared object an attacker placed on the worker
    marker: Path  # written by its constructor: the library was loaded

    def loaded(self) -> bool:
        return self.marker.exists()


@pytest.fixture
def planted(tmp_path: Path) -> Planted:
    """A fresh library per test (a path is loaded once per process: a new path runs it again)."""
    if shutil.which("gcc") is None:
        pytest.fail("gcc is needed to build the planted library (apt-get install gcc)", pytrace=False)
    source, marker = tmp_path / "evil.c", tmp_path / "constructor-ran"
    source.write_text(PLANTED_SOURCE)
    library = tmp_path / "evil.so"
    subprocess.run(
        ["gcc", "-shared", "-fPIC", f'-DMARKER="{marker}"', "-o", str(library), str(source)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return Planted(library, marker)


def closed_port() -> int:
    """A port nothing listens on: a connection that got past the driver manager is refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def use_connection(monkeypatch, conn_id: str, **changes: Any) -> dict[str, Any]:
    """A real Airflow connection (type mssql) whose fields an attacker changed; returns its fields."""
    fields = {
        "conn_type": "mssql",
        "host": "127.0.0.1",
        "port": closed_port(),
        "schema": "shop",
        "login": "cdc",
        "password": PASSWORD,
        "extra": {},
        **changes,
    }
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(fields))
    return fields


# -- the product's paths to the ODBC driver manager -----------------------------------------------


def through_the_hook(conn_id: str, driver: str | None, tmp_path: Path) -> str:
    from airflow_provider_cdc.hooks.sqlserver_cdc import SqlServerCdcHook

    with pytest.raises(Exception) as raised:
        SqlServerCdcHook(conn_id, driver=driver).get_conn().close()
    return f"{type(raised.value).__name__}: {raised.value}"


def through_the_setup(conn_id: str, driver: str | None, tmp_path: Path) -> str:
    from airflow_provider_cdc.captures.sqlserver import SqlServerCapture

    capture = SqlServerCapture(
        sqlserver_conn_id=conn_id,
        tables=["dbo.orders"],
        topic_prefix="attack",
        sink_path=str(tmp_path / "sink"),
        odbc_driver=driver,
    )
    with pytest.raises(Exception) as raised:
        capture.setup(logging.getLogger("attack"))
    return f"{type(raised.value).__name__}: {raised.value}"


def through_the_trigger(conn_id: str, driver: str | None, tmp_path: Path) -> str:
    from airflow_provider_cdc.triggers.sqlserver_cdc import SqlServerCdcChangesTrigger

    async def first_event() -> dict:
        async for event in SqlServerCdcChangesTrigger(conn_id, None, 1.0, driver=driver).run():
            return event.payload
        raise AssertionError("the trigger fired nothing")

    event = asyncio.run(first_event())
    assert event["status"] == "error", event
    return event["message"]


PATHS: dict[str, Callable[[str, str | None, Path], str]] = {
    "hook": through_the_hook,
    "setup": through_the_setup,
    "trigger": through_the_trigger,
}


# -- the attacks -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Attack:
    connection: Callable[[Planted, Path], dict[str, Any]]  # the connection fields the attacker set
    says: tuple[str, ...]  # what the error must say
    driver: str | None = ODBC_DRIVER  # what the DAG named (the trusted side)
    allow_driver_in_extra: bool = False  # the deployment's setting
    refused: bool = True  # False: the string is safe, the connection goes out (to the closed port)


NOT_ALLOWED = ("of the connection's extra is not allowed", "allowed:")
ATTACKS = {
    # The review's reproduction: the DAG names no driver, the extra names the library.
    "driver-extra": Attack(
        lambda p, _: {"extra": {"driver": str(p.library)}},
        ("names ODBC driver", "in its 'driver' extra", "sqlserver_allow_driver_in_extra", "odbc_driver"),
        driver=None,
    ),
    # The same where the DAG names a driver: the extra's must not win.
    "driver-extra-beside-the-dags": Attack(
        lambda p, _: {"extra": {"driver": str(p.library)}}, ("sqlserver_allow_driver_in_extra",)
    ),
    # A deployment that trusts editors with the driver still only takes an installed driver's name.
    "driver-extra-allowed": Attack(
        lambda p, _: {"extra": {"driver": str(p.library)}},
        ("is not an ODBC driver name", "never a path to a library"),
        driver=None,
        allow_driver_in_extra=True,
    ),
    "driver-extra-allowed-not-installed": Attack(
        lambda p, _: {"extra": {"driver": "Planted Driver"}},
        ("ODBC driver 'Planted Driver' is not installed on this worker", f"'{ODBC_DRIVER}'"),
        driver=None,
        allow_driver_in_extra=True,
    ),
    # Other spellings of the key: ODBC keys are case-insensitive, and a second DRIVER wins.
    "Driver-key": Attack(lambda p, _: {"extra": {"Driver": str(p.library)}}, ("in its 'Driver' extra",)),
    "padded-DRIVER-key": Attack(lambda p, _: {"extra": {"DRIVER ": str(p.library)}}, ("in its 'DRIVER ' extra",)),
    "prefixed-form-field": Attack(
        lambda p, _: {"conn_type": "mssql_cdc", "extra": {"extra__mssql_cdc__driver": str(p.library)}},
        ("sqlserver_allow_driver_in_extra",),
    ),
    # A data source names its driver itself: in odbc.ini, or in a file the attacker points to.
    "dsn": Attack(lambda p, _: {"extra": {"dsn": "planted"}}, ("ODBC attribute 'dsn'", *NOT_ALLOWED)),
    "filedsn": Attack(
        lambda p, tmp: {"extra": {"FILEDSN": str(file_dsn(p, tmp))}}, ("ODBC attribute 'FILEDSN'", *NOT_ALLOWED)
    ),
    "savefile": Attack(
        lambda p, tmp: {"extra": {"SAVEFILE": str(tmp / "saved.dsn")}}, ("ODBC attribute 'SAVEFILE'", *NOT_ALLOWED)
    ),
    "unknown-key-with-path": Attack(
        lambda p, _: {"extra": {"Encrypt": "yes", "Setup": str(p.library)}},
        ("ODBC attribute 'Setup'", *NOT_ALLOWED),
    ),
    # Breaking out of an allowed attribute's value (the same allowlist whatever the driver, the DAG's
    # psqlODBC here): a separator, then a brace that ends a braced value early.
    "value-with-separator": Attack(
        lambda p, _: {"extra": {"Encrypt": f"yes;DRIVER={p.library}"}},
        ("ODBC attribute 'Encrypt' of the connection's extra must be one of",),
    ),
    "braced-value-escape": Attack(
        lambda p, _: {"extra": {"APP": f"capture}};DRIVER={p.library};x={{"}},
        ("ODBC attribute 'APP' of the connection's extra must be text without ; { }",),
    ),
    # psqlODBC's own settings are its driver entry's, not a connection's (tests/support/odbc.py).
    "driver-specific-key": Attack(
        lambda p, _: {"extra": {"pqopt": f"sslkey={p.library}"}}, ("ODBC attribute 'pqopt'", *NOT_ALLOWED)
    ),
    # The connection's own fields go into the string too.
    "host": Attack(lambda p, _: {"host": f"127.0.0.1}};DRIVER={p.library};x={{"}, ("the connection's host",)),
    "login-line-break": Attack(lambda p, _: {"login": f"cdc\nDRIVER={p.library}"}, ("the connection's login",)),
    "database-nul": Attack(lambda p, _: {"schema": f"shop\x00;DRIVER={p.library}"}, ("the connection's database",)),
    # Braces in a login or password are legitimate: escaped, they stay inside the value.
    "login-braced": Attack(lambda p, _: {"login": f"cdc}}}};DRIVER={p.library};x={{"}, (), refused=False),
    "password-braced": Attack(lambda p, _: {"password": f"x}};DRIVER={p.library};"}, (), refused=False),
}


def file_dsn(planted: Planted, tmp_path: Path) -> Path:
    """A file data source naming the planted library as its driver."""
    path = tmp_path / "planted.dsn"
    path.write_text(f"[ODBC]\nDRIVER={planted.library}\nSERVER=127.0.0.1\n")
    return path


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_connection_editor_cannot_load_a_library_into_the_worker(
    attack, path, planted, tmp_path, monkeypatch, capfd, caplog
):
    case = ATTACKS[attack]
    monkeypatch.setenv(ALLOW_DRIVER_IN_EXTRA, str(case.allow_driver_in_extra))
    conn_id = "ss_attack_" + attack.replace("-", "_").lower()
    password = use_connection(monkeypatch, conn_id, **case.connection(planted, tmp_path))["password"]

    with caplog.at_level(logging.DEBUG):
        message = PATHS[path](conn_id, case.driver, tmp_path)

    assert not planted.loaded(), f"the planted library ran in the worker ({attack} through the {path})"
    missing = [phrase for phrase in case.says if phrase not in message]
    assert not missing, f"{missing} not in: {message}"
    assert ("cannot connect" not in message) == case.refused, message
    output = capfd.readouterr()
    for where, text in (("error", message), ("log", caplog.text), ("output", output.out + output.err)):
        assert password not in text, f"the password is in the {where}"


def test_the_review_reproduction_is_refused_before_odbc_is_asked(planted, monkeypatch):
    """The refusal comes from the connection's settings, not from a failed load: no library named
    by an extra reaches the driver manager, allowed or not."""
    from airflow_provider_cdc.hooks.sqlserver_cdc import SqlServerCdcHook

    monkeypatch.delenv(ALLOW_DRIVER_IN_EXTRA, raising=False)
    use_connection(monkeypatch, "ss_attack_review", extra={"driver": str(planted.library)})
    with pytest.raises(CdcConfigurationError) as refused:
        SqlServerCdcHook("ss_attack_review").connection_info  # noqa: B018 (reading it is the test)
    assert "Airflow connection 'ss_attack_review' names ODBC driver" in str(refused.value)
    assert not planted.loaded()


def test_a_trusted_driver_name_in_the_extra_connects_when_the_deployment_allows_it(planted, monkeypatch):
    """The allowed way still works: an installed driver's name, from the extra, reaches the server
    (here: psqlODBC towards a closed port, so the connection is refused by the network)."""
    from airflow_provider_cdc.cdc.basics.errors import CdcTransientError
    from airflow_provider_cdc.hooks.sqlserver_cdc import SqlServerCdcHook

    monkeypatch.setenv(ALLOW_DRIVER_IN_EXTRA, "True")
    use_connection(monkeypatch, "ss_attack_allowed", extra={"driver": ODBC_DRIVER, "APP": "nightly capture"})
    hook = SqlServerCdcHook("ss_attack_allowed")
    assert hook.connection_info.driver == ODBC_DRIVER
    with pytest.raises(CdcTransientError, match=r"cannot connect to SQL Server at cdc@127\.0\.0\.1"):
        hook.get_conn()
    assert not planted.loaded()


# -- the driver manager's own reading of hostile values -----------------------------------------

BRACE_NOISE = st.lists(st.sampled_from(["}", "{", ";", "=", "}}", "};", "{}", " ", "a"]), max_size=5).map("".join)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    field=st.sampled_from(["login", "password", "schema"]),
    before=BRACE_NOISE,
    after=BRACE_NOISE,
    key=st.sampled_from(["DRIVER", "Driver", "driver ", "FILEDSN"]),
)
def test_hostile_braces_in_the_connections_fields_never_reach_the_driver_manager_as_keys(
    field, before, after, key, planted, tmp_path
):
    """unixODBC itself reads the string: whatever surrounds a ``;DRIVER=<library>;`` in a field
    the connection keeps (braces, separators, escapes), the field stays one value. Each example
    plants its own copy of the library (a path loads once per process)."""
    from airflow.sdk import Connection

    from airflow_provider_cdc.cdc.basics.errors import CdcTransientError
    from airflow_provider_cdc.cdc.sources.sqlserver.connection import connect
    from airflow_provider_cdc.hooks.sqlserver_cdc import connection_info_from

    library = tmp_path / f"evil-{secrets.token_hex(6)}.so"
    shutil.copy(planted.library, library)
    fields = {"login": "cdc", "password": PASSWORD, "schema": "shop"}
    fields[field] = f"{before};{key}={library};{after}"
    conn = Connection(
        conn_id="ss_attack_fuzz", conn_type="mssql", host="127.0.0.1", port=closed_port(), extra="{}", **fields
    )
    with pytest.raises(CdcTransientError, match="cannot connect to SQL Server"):
        connect(connection_info_from(conn, ODBC_DRIVER))  # the network refuses it, not a planted driver
    assert not planted.loaded(), f"{field}={fields[field]!r} loaded the planted library"


# -- what connection editors can still do ----------------------------------------------------------


def test_the_setting_is_declared_and_off_unless_the_deployment_turns_it_on(monkeypatch):
    from airflow.configuration import conf

    from airflow_provider_cdc.get_provider_info import get_provider_info

    option = get_provider_info()["config"]["cdc"]["options"]["sqlserver_allow_driver_in_extra"]
    assert (option["type"], option["default"]) == ("boolean", "False")
    monkeypatch.delenv(ALLOW_DRIVER_IN_EXTRA, raising=False)
    assert conf.getboolean("cdc", "sqlserver_allow_driver_in_extra") is False  # the declared default


def test_an_extra_naming_the_dags_own_driver_and_airflows_keys_are_fine(monkeypatch):
    """A connection made in the form (or for Airflow's own mssql/odbc hooks) carries the DAG's own
    driver and Airflow's keys: nothing new for ODBC, nothing to refuse."""
    from airflow_provider_cdc.hooks.sqlserver_cdc import SqlServerCdcHook

    monkeypatch.delenv(ALLOW_DRIVER_IN_EXTRA, raising=False)
    extra = {"driver": ODBC_DRIVER, "sqlalchemy_scheme": "mssql+pyodbc", "placeholder": "?", "Encrypt": "yes"}
    use_connection(monkeypatch, "ss_attack_form", extra=extra)
    info = SqlServerCdcHook("ss_attack_form", driver=ODBC_DRIVER).connection_info
    assert (info.driver, info.options) == (ODBC_DRIVER, (("Encrypt", "yes"),))


def test_where_the_deployment_allows_the_extras_driver_the_dags_still_wins(monkeypatch):
    from airflow_provider_cdc.hooks.sqlserver_cdc import SqlServerCdcHook

    monkeypatch.setenv(ALLOW_DRIVER_IN_EXTRA, "True")
    use_connection(monkeypatch, "ss_attack_both", extra={"driver": "PostgreSQL ANSI"})
    assert SqlServerCdcHook("ss_attack_both", driver=ODBC_DRIVER).connection_info.driver == ODBC_DRIVER
    assert SqlServerCdcHook("ss_attack_both").connection_info.driver == "PostgreSQL ANSI"
