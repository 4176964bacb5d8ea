"""An Iceberg catalog connection (``table_catalog_conn_id``) chooses no code and leaks no password.

Whoever may edit an Airflow connection is not trusted to run code where the tasks and Spark jobs
run: an extra naming a class for pyiceberg to import (``py-io-impl`` and the like) is refused
before any catalog is opened. A password inside a URI (the host, or the extra's ``uri``) is
refused too, since the URI travels in the job spec; the password field is the channel for it.

Real Airflow connections (environment variables), real PostgreSQL, real pyiceberg and SQLite.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest

from airflow_provider_cdc.capture import PostgresCapture
from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.offsets.variable import VariableOffsetStore
from tests.support.crash import prepare_shop
from tests.support.databases import snapshot_window

EVIL_MODULE = "cdc_attacker_io"


def attacker_module(directory: Path, marker: Path) -> None:
    """A module of the attacker's on sys.path: importing it writes ``marker``; its FileIO works."""
    directory.mkdir()
    sys.modules.pop(EVIL_MODULE, None)  # a fresh import each time
    (directory / f"{EVIL_MODULE}.py").write_text(
        "import pathlib\n"
        f"pathlib.Path({str(marker)!r}).write_text('imported: the connection ran its code')\n"
        "from pyiceberg.io.pyarrow import PyArrowFileIO\n\n\n"
        "class QuietIO(PyArrowFileIO):\n"
        "    pass\n"
    )


def iceberg_capture(db, conn_id: str, lake: Path, catalog_conn_id: str) -> PostgresCapture:
    return PostgresCapture(
        postgres_conn_id=conn_id,
        tables=["public.orders"],
        topic_prefix="shop",
        sink_path=str(lake),
        sink_format="iceberg",
        table_catalog_conn_id=catalog_conn_id,
        slot_name=db.slot,
        publication_name=db.publication,
        offset_store=VariableOffsetStore(key_prefix=f"cdc_offset_{db.name}__"),
    )


@pytest.mark.parametrize(
    "key, value",
    [
        ("py-io-impl", f"{EVIL_MODULE}.QuietIO"),
        ("s3.retry-strategy-impl", f"{EVIL_MODULE}.QuietIO"),
        ("py-catalog-impl", f"{EVIL_MODULE}.QuietIO"),
    ],
)
def test_a_connection_naming_a_class_to_import_is_refused_before_it_is_imported(
    db15, airflow_db, tmp_path, monkeypatch, key, value
):
    """The connection's extra names a module the attacker put on the workers' path. Setup and
    table maintenance (which opens every table, and so its FileIO) refuse the connection naming the
    key; the module is never imported."""
    from pyiceberg.catalog.sql import SqlCatalog

    from airflow_provider_cdc.operators.setup import CdcSetupOperator
    from airflow_provider_cdc.operators.table_maintenance import CdcTableMaintenanceOperator

    marker = tmp_path / "marker"
    attacker_module(tmp_path / "attacker", marker)
    monkeypatch.syspath_prepend(str(tmp_path / "attacker"))
    conn_id = prepare_shop(db15, monkeypatch, "evil", customers=2, orders_per_customer=1)
    lake, catalog_db = tmp_path / "lake", tmp_path / "catalog.db"
    lake.mkdir()
    # The catalog already holds the capture's table (an earlier run's): maintenance opens it.
    catalog = SqlCatalog("cdc", uri=f"sqlite:///{catalog_db}", warehouse=f"file://{lake}")
    catalog.create_namespace(("shop", "public"))
    catalog.create_table(
        ("shop", "public", "orders"),
        schema=pa.schema([pa.field("id", pa.int64())]),
        location=f"file://{lake}/shop.public.orders",
    )
    extra = {"type": "sql", "warehouse": f"file://{lake}", key: value}
    connection = {"conn_type": "generic", "host": f"sqlite:///{catalog_db}", "extra": extra}
    monkeypatch.setenv("AIRFLOW_CONN_EVIL_CATALOG", json.dumps(connection))
    capture = iceberg_capture(db15, conn_id, lake, "evil_catalog")

    refusals = []
    for operator in (
        CdcSetupOperator(task_id="setup", capture=capture),
        CdcTableMaintenanceOperator(task_id="maintain", capture=capture, retain_hours=None),
    ):
        try:
            operator.execute({})
        except Exception as exc:
            refusals.append(f"{type(exc).__name__}: {exc}")
        else:
            refusals.append(None)
    assert not marker.exists(), marker.read_text()  # the attacker's module never ran
    assert EVIL_MODULE not in sys.modules
    for refusal in refusals:
        assert refusal is not None and f"extra key {key!r} makes pyiceberg import the class it names" in refusal
        assert "connection 'evil_catalog'" in refusal
    assert db15.slot_status() is None  # setup refused before creating anything


def test_pyicebergs_own_file_io_may_be_named(db15, airflow_db, tmp_path, monkeypatch):
    lake = tmp_path / "lake"
    extra = {"type": "sql", "warehouse": f"file://{lake}", "py-io-impl": "pyiceberg.io.pyarrow.PyArrowFileIO"}
    connection = {"conn_type": "generic", "host": f"sqlite:///{tmp_path / 'c.db'}", "extra": extra}
    monkeypatch.setenv("AIRFLOW_CONN_OWN_IO", json.dumps(connection))
    capture = iceberg_capture(db15, "unused", lake, "own_io")
    assert capture.run_options().catalog_properties()["py-io-impl"] == "pyiceberg.io.pyarrow.PyArrowFileIO"


def test_a_password_in_the_catalog_uri_never_reaches_the_job_spec(db15, airflow_db, tmp_path, monkeypatch):
    """In the host or the extra's uri, a URI with a password is refused without repeating the
    password; given as the connection's password with ``secret_property: uri``, it reaches the
    catalog but not the job spec."""
    password = "S3cr3t-" + tmp_path.name[-6:]
    lake = tmp_path / "lake"
    cases = {
        "host": {"conn_type": "generic", "host": f"postgresql+psycopg://cat:{password}@db.example/cat"},
        "extra": {"conn_type": "generic", "extra": {"type": "rest", "uri": f"https://cat:{password}@rest.example/api"}},
        "oauth": {
            "conn_type": "generic",
            "host": "https://rest.example/api",
            "extra": {"type": "rest", "oauth2-server-uri": f"https://id:{password}@auth.example/token"},
        },
    }
    for name, connection in cases.items():
        monkeypatch.setenv(f"AIRFLOW_CONN_PW_{name.upper()}", json.dumps(connection))
        with pytest.raises(CdcConfigurationError) as raised:
            iceberg_capture(db15, "unused", lake, f"pw_{name}").run_options()
        message = str(raised.value)
        assert "is a URI with a password in it" in message and ":***@" in message, message
        assert password not in message
        assert '"secret_property": "uri"' in message

    uri = f"postgresql+psycopg://cat:{password}@db.example/cat"
    channel = {"conn_type": "generic", "password": uri, "extra": {"type": "sql", "secret_property": "uri"}}
    monkeypatch.setenv("AIRFLOW_CONN_PW_CHANNEL", json.dumps(channel))
    options = iceberg_capture(db15, "unused", lake, "pw_channel").run_options()
    assert options.catalog_properties()["uri"] == uri  # the catalog gets it
    spec_json = replace(
        db15.spec(["public.orders"], snapshot_window(1), lake, prefix="shop"), options=options
    ).to_json()
    assert password not in spec_json and password not in json.dumps(options.to_dict()) and password not in repr(options)


def test_a_connection_to_a_malicious_rest_catalog_runs_nothing_on_the_worker(
    db15, airflow_db, tmp_path, monkeypatch, caplog
):
    """The connection's editor sets ``type=rest`` and the host of their own REST catalog, both
    allowed. Its config names ``subprocess.getoutput`` as the FileIO (with a shell command as its
    first key), ``subprocess.Popen`` as the auth manager and an S3 retry strategy; its table's
    metadata and config name FileIOs too. Setup (which opens the catalog) and table maintenance
    (which loads every table) carry on with pyiceberg's own FileIO; nothing the server named runs."""
    from airflow_provider_cdc.operators.setup import CdcSetupOperator
    from airflow_provider_cdc.operators.table_maintenance import CdcTableMaintenanceOperator
    from tests.support.malicious_iceberg import malicious_catalog, server_vectors

    config, metadata, table_config, markers = server_vectors(tmp_path)
    conn_id = prepare_shop(db15, monkeypatch, "restevil", customers=2, orders_per_customer=1)
    lake = tmp_path / "lake"
    with malicious_catalog(config, metadata, table_config) as uri:
        connection = {"conn_type": "generic", "host": uri, "extra": {"type": "rest"}}
        monkeypatch.setenv("AIRFLOW_CONN_REST_EVIL", json.dumps(connection))
        capture = iceberg_capture(db15, conn_id, lake, "rest_evil")
        CdcSetupOperator(task_id="setup", capture=capture).execute({})
        done = CdcTableMaintenanceOperator(task_id="maintain", capture=capture, retain_hours=None).execute({})
    written = {str(m): m.read_text() for m in markers if m.exists()}
    assert not written, f"the catalog server's code ran on the worker: {written}"
    assert "shop.public.orders" in done["tables"]
    assert "of the REST catalog server's config: they would make pyiceberg import a class" in caplog.text


STORAGE_SECRETS = [
    "adls.account-key",
    "adls.connection-string",
    "adls.sas-token",
    "adls.token",
    "adls.credential",
    "adls.client-secret",
    "gcs.oauth2.token",
    "s3.secret-access-key",
    "s3.session-token",
    "client.secret-access-key",
    "client.session-token",
    "glue.secret-access-key",
    "header.X-Api-Key",
]


@pytest.mark.parametrize("key", STORAGE_SECRETS)
def test_a_storage_secret_in_the_extra_is_refused_and_the_password_carries_it(
    db15, airflow_db, tmp_path, monkeypatch, key
):
    """Cloud storage credentials (pyiceberg's property names) in the extra would sit in plain text
    in the connection and travel in the job spec: refused, naming the key and the way to pass it;
    the value is not repeated. As the password with ``secret_property`` set to the key, the same
    secret reaches the catalog's properties and not the spec."""
    secret = "AccountKey=Zm9vYmFy" + tmp_path.name[-6:] if key == "adls.connection-string" else "Zm9v" + tmp_path.name
    lake = tmp_path / "lake"
    extra = {"type": "sql", "warehouse": f"file://{lake}", key: secret}
    connection = {"conn_type": "generic", "host": f"sqlite:///{tmp_path / 'c.db'}", "extra": extra}
    monkeypatch.setenv("AIRFLOW_CONN_STORAGE_SECRET", json.dumps(connection))
    with pytest.raises(CdcConfigurationError) as raised:
        iceberg_capture(db15, "unused", lake, "storage_secret").run_options()
    message = str(raised.value)
    assert f"extra key {key!r} looks like a secret" in message, message
    assert f'"secret_property": "{key}"' in message and "password field" in message
    assert secret not in message

    channel = {
        "conn_type": "generic",
        "host": f"sqlite:///{tmp_path / 'c.db'}",
        "password": secret,
        "extra": {"type": "sql", "warehouse": f"file://{lake}", "secret_property": key},
    }
    monkeypatch.setenv("AIRFLOW_CONN_STORAGE_CHANNEL", json.dumps(channel))
    options = iceberg_capture(db15, "unused", lake, "storage_channel").run_options()
    assert options.catalog_properties()[key] == secret
    spec_json = replace(
        db15.spec(["public.orders"], snapshot_window(1), lake, prefix="shop"), options=options
    ).to_json()
    assert secret not in spec_json and secret not in repr(options)


def test_an_account_key_pasted_under_another_key_is_refused(db15, airflow_db, tmp_path, monkeypatch):
    """A connection string (or a SAS URL) under a harmless-looking key is caught by its value."""
    lake = tmp_path / "lake"
    for key, value in {
        "adls.account-name": "DefaultEndpointsProtocol=https;AccountName=lake;AccountKey=c2VjcmV0",
        "s3.signer.uri": "https://signer.example/sign?sv=2024&sig=c2VjcmV0",
    }.items():
        extra = {"type": "sql", "warehouse": f"file://{lake}", key: value}
        connection = {"conn_type": "generic", "host": f"sqlite:///{tmp_path / 'c.db'}", "extra": extra}
        monkeypatch.setenv("AIRFLOW_CONN_PASTED", json.dumps(connection))
        with pytest.raises(CdcConfigurationError) as raised:
            iceberg_capture(db15, "unused", lake, "pasted").run_options()
        message = str(raised.value)
        assert f"extra key {key!r} holds a credential" in message and "c2VjcmV0" not in message
