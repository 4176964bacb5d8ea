"""The "Test connection" of each of the provider's connection types, as Airflow's UI runs it
(``Connection.test_connection``: the hook registered for the type, then its ``test_connection``),
against the real PostgreSQL of the suite, the SQL Server stand-in and the YugabyteDB stand-ins.

A refused login answers ``(False, message)``: the message says what the server refused and never
carries the password.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.sqlserver import StatementRecorder
from tests.support.sqlserver.fixtures import DRIVER_IN_EXTRA_ALLOWED, standin_for

pytestmark = [pytest.mark.airflow]

WRONG_PASSWORD = "not-the-Pa55word-9f3k"
CONNECTION_TYPES = ("postgres_cdc", "mssql_cdc", "yugabytedb_cdc")


def ui_test(monkeypatch, conn_id: str, fields: dict[str, Any]) -> tuple[bool, str]:
    """What the UI's "Test" button does: the connection made visible under its id, then tested."""
    from airflow.models.connection import Connection

    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(fields))
    extra = fields.get("extra")
    conn = Connection(
        conn_id=conn_id,
        **{k: v for k, v in fields.items() if k != "extra"},
        extra=json.dumps(extra) if extra is not None else None,
    )
    return conn.test_connection()


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def assert_refused(result: tuple[bool, str]) -> None:
    status, message = result
    assert status is False, message
    assert "password authentication failed" in message or "Login failed" in message, message
    assert WRONG_PASSWORD not in message


def test_postgres_cdc_connection(db15, monkeypatch):
    cluster = db15.cluster
    fields = {
        "conn_type": "postgres_cdc",
        "host": cluster.host,
        "port": cluster.port,
        "schema": db15.name,
        "login": cluster.superuser,
        "password": cluster.password,
        "extra": {"sslmode": "disable"},
    }
    status, message = ui_test(monkeypatch, "pg_cdc_ok", fields)
    assert status is True, message
    assert_refused(ui_test(monkeypatch, "pg_cdc_bad", {**fields, "password": WRONG_PASSWORD}))

    # The UI offers the "Test" button for every CDC connection type (the hooks loaded above).
    from airflow.providers_manager import ProvidersManager

    hooks = ProvidersManager().hooks
    assert {t: hooks[t].connection_testable for t in CONNECTION_TYPES} == dict.fromkeys(CONNECTION_TYPES, True)

    # An IAM login (RDS/Aurora) goes through PostgresHook's token path: the Amazon provider (the
    # s3 extra, installed here) is asked for a token, and without a region it refuses before any
    # password is tried, with its own message (not an empty-password login failure).
    status, message = ui_test(monkeypatch, "pg_cdc_iam", {**fields, "password": None, "extra": {"iam": True}})
    assert status is False
    assert "region" in message, message

    # What the standard hook gives on top: OpenLineage's database identity of the connection.
    from airflow_provider_cdc.hooks.postgres_cdc import PostgresCdcHook

    hook = PostgresCdcHook("pg_cdc_ok")
    info = hook.get_openlineage_database_info(hook.get_connection("pg_cdc_ok"))
    assert (info.scheme, info.authority, info.database) == ("postgres", f"{cluster.host}:{cluster.port}", db15.name)
    # PostgresHook's other ways in (DbApiHook's get_first, SQLAlchemy and pandas through
    # get_sqlalchemy_engine) open the same sessions as the capture: its pinned search_path.
    assert hook.get_first("SHOW search_path") == ("pg_catalog,pg_temp",)
    from sqlalchemy import text

    with hook.get_sqlalchemy_engine().connect() as conn:
        assert conn.execute(text("SHOW search_path")).scalar() == "pg_catalog,pg_temp"


@pytest.fixture
def standin_sqlserver(request, pg15) -> Iterator[Any]:
    recorder = StatementRecorder()
    yield from standin_for(request, pg15, recorder)
    assert recorder.invalid() == []


def test_mssql_cdc_connection(standin_sqlserver, monkeypatch):
    from tests.support.sqlserver import ODBC_DRIVER

    monkeypatch.setenv(*DRIVER_IN_EXTRA_ALLOWED)  # the stand-in is reached through psqlODBC
    fields = {
        "conn_type": "mssql_cdc",
        "host": "127.0.0.1",
        "port": standin_sqlserver.proxy.port,
        "schema": standin_sqlserver.database,
        "login": standin_sqlserver.cluster.superuser,
        "password": standin_sqlserver.cluster.password,
        "extra": {"driver": ODBC_DRIVER},
    }
    status, message = ui_test(monkeypatch, "ss_cdc_ok", fields)
    assert status is True, message
    status, message = ui_test(monkeypatch, "ss_cdc_bad", {**fields, "password": WRONG_PASSWORD})
    assert status is False, message
    assert WRONG_PASSWORD not in message
    assert "refused" in message, message

    from airflow_provider_cdc.hooks.sqlserver_cdc import SqlServerCdcHook

    hook = SqlServerCdcHook("ss_cdc_ok")
    info = hook.get_openlineage_database_info(hook.connection)
    assert (info.scheme, info.authority) == ("mssql", f"127.0.0.1:{standin_sqlserver.proxy.port}")


def test_yugabytedb_cdc_connection_ysql(request, pg15, monkeypatch):
    from tests.support.yugabyte.fixtures import standin_for as yb_standin_for

    for yb in yb_standin_for(request, pg15):
        fields = {
            "conn_type": "yugabytedb_cdc",
            "host": yb.host,
            "port": yb.port,
            "schema": yb.database,
            "login": yb.cluster.superuser,
            "password": yb.cluster.password,
            "extra": {"sslmode": "disable"},
        }
        status, message = ui_test(monkeypatch, "yb_cdc_ok", fields)
        assert status is True, message
        assert_refused(ui_test(monkeypatch, "yb_cdc_bad", {**fields, "password": WRONG_PASSWORD}))


def test_yugabytedb_cdc_connection_cdc_service(request, pg15, monkeypatch):
    """A connection that names the CDC service's masters: its YSQL endpoint and the masters' RPC port."""
    from tests.support.yugabyte_cdc import airflow_connection
    from tests.support.yugabyte_cdc import standin_for as cdc_standin_for

    small = {"tablets_per_table": 1, "tablet_servers": 1, "masters": 1, "rpc_heartbeat_interval": 0.3}
    for yb in cdc_standin_for(request, pg15, **small):
        fields = json.loads(airflow_connection(yb))
        status, message = ui_test(monkeypatch, "ybc_ok", fields)
        assert status is True, message
        assert yb.master_addresses_flag in message, message
        assert_refused(ui_test(monkeypatch, "ybc_bad", {**fields, "password": WRONG_PASSWORD}))
        # YSQL answers but the masters named do not: the test says which address failed.
        nowhere = f"127.0.0.1:{closed_port()}"
        no_masters = {**fields, "extra": {**fields["extra"], "master_addresses": nowhere}}
        status, message = ui_test(monkeypatch, "ybc_no_masters", no_masters)
        assert status is False
        assert f"cannot connect to {nowhere}" in message, message
