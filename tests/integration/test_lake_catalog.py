"""An Iceberg sink whose catalog is an Airflow connection (``table_catalog_conn_id``): the
snapshot, a window, the current state and maintenance all use that catalog, not a default one."""

from __future__ import annotations

import json
import stat

import pytest

from airflow_provider_cdc.cdc.sinks.reader import committed_windows
from airflow_provider_cdc.operators.current_state import CdcCurrentStateOperator
from airflow_provider_cdc.operators.table_maintenance import CdcTableMaintenanceOperator
from tests.support.crash import CrashCapture, Workload, prepare_shop
from tests.support.crash_sources import PostgresCrashSource

pytestmark = [pytest.mark.spark]

KEYS = {"public.customers": ["id"], "public.orders": ["id"]}


def test_the_catalog_of_an_airflow_connection_holds_every_table(db15, spark, tmp_path, monkeypatch):
    conn_id = prepare_shop(db15, monkeypatch, "lakecat", customers=5, orders_per_customer=2)
    catalog_db = tmp_path / "catalogs" / "shared.db"
    catalog_db.parent.mkdir()
    monkeypatch.setenv(
        "AIRFLOW_CONN_LAKE_CATALOG",
        json.dumps(
            {
                "conn_type": "generic",
                "host": f"sqlite:///{catalog_db}",
                "extra": {"type": "sql", "warehouse": f"file://{tmp_path}"},
            }
        ),
    )
    overrides = {"sink_format": "iceberg", "table_catalog_conn_id": "lake_catalog"}
    capture = CrashCapture(db15, conn_id, "cat", tmp_path / "lake", KEYS, overrides=overrides)
    capture.run("setup")
    capture.run("snapshot")
    workload = Workload(PostgresCrashSource(db15, conn_id=""))
    workload.mutate()
    capture.catch_up()

    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("cdc", uri=f"sqlite:///{catalog_db}", warehouse=f"file://{tmp_path}")
    assert ("cat",) in catalog.list_namespaces()
    orders = catalog.load_table(("cat", "public", "orders")).scan().to_arrow()
    logged = sum(
        d.events
        for e in committed_windows(str(tmp_path / "lake"), "cat")
        for d in e.datasets
        if d.topic == "cat.public.orders"
    )
    assert orders.num_rows == logged > 10
    assert not (tmp_path / "lake" / "_cdc_catalog").exists()  # no default catalog was made

    state = CdcCurrentStateOperator(task_id="state", capture=capture.capture(), state_path=str(tmp_path / "state"))
    assert {r["action"] for r in state.execute({})} == {"applied"}
    with db15.connect() as conn:
        source_orders = conn.execute("SELECT count(*) FROM orders").fetchone()[0]
    assert catalog.load_table(("cat_state", "public", "orders")).scan().to_arrow().num_rows == source_orders
    for root in (tmp_path / "lake", tmp_path / "state"):  # created by the capture: only its owner may enter
        assert stat.S_IMODE(root.stat().st_mode) == 0o700, root
    done = CdcTableMaintenanceOperator(task_id="maintain", capture=capture.capture(), retain_hours=None).execute({})
    assert set(done["tables"]) >= {"cat.public.orders", "cat.public.customers"}
