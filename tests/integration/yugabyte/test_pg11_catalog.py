"""YugabyteDB 2024.2 is PostgreSQL 11.2 underneath: it reports ``11.2-YB-<release>-b0`` and its
``pg_attribute`` has no ``attgenerated`` (generated columns came with PostgreSQL 12, and to YSQL
with the PostgreSQL 15 line, 2025.1). The capture's catalog queries must work on both lines."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from airflow_provider_cdc.cdc.basics.tables import TableRef
from airflow_provider_cdc.cdc.sources.postgres import admin as pg_admin
from tests.support.yugabyte.fixtures import standin_for
from tests.support.yugabyte.standin import YugabyteStandIn

pytestmark = pytest.mark.pg

PG11_RELEASE = "2024.2.4.0"


@pytest.fixture
def yb(request, pg15) -> Iterator[YugabyteStandIn]:
    yield from standin_for(request, pg15, release=PG11_RELEASE)


def test_a_pg11_release_reports_11_2_and_has_no_attgenerated(yb):
    with yb.connect() as conn:
        assert conn.info.parameter_status("server_version") == f"11.2-YB-{PG11_RELEASE}-b0"
        assert conn.info.server_version == 110002
        # refused whether sent as a simple query or parsed with parameters
        with pytest.raises(psycopg.errors.UndefinedColumn, match=r"column a\.attgenerated does not exist"):
            conn.execute("SELECT a.attname FROM pg_attribute a WHERE a.attgenerated = ''")
        with pytest.raises(psycopg.errors.UndefinedColumn, match=r"column a\.attgenerated does not exist"):
            conn.execute("SELECT a.attname FROM pg_attribute a WHERE a.attrelid = %s AND a.attgenerated = ''", (1,))
        assert conn.execute("SELECT 1").fetchone() == (1,)  # the session carries on


def test_the_tables_are_described_on_a_pg11_release(yb):
    with yb.connect() as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, v text)")
        described, problems = pg_admin.find_tables(conn, [TableRef("public", "items")])
    assert problems == []
    assert [c.name for c in described[TableRef("public", "items")].columns] == ["id", "v"]


def test_generated_columns_are_still_left_out_on_postgresql(db15):
    with db15.connect() as conn:
        conn.execute("CREATE TABLE priced (id int PRIMARY KEY, net int, gross int GENERATED ALWAYS AS (net) STORED)")
        described, _ = pg_admin.find_tables(conn, [TableRef("public", "priced")])
    assert [c.name for c in described[TableRef("public", "priced")].columns] == ["id", "net"]
