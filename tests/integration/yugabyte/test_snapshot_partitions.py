"""The snapshot's hash ranges use the table's hash columns only (YSQL pushes ``yb_hash_code`` down
only on exactly those), and together read every row once, on the stand-in."""

from __future__ import annotations

import pytest
from psycopg import sql

from airflow_provider_cdc.cdc.sources.postgres import admin as pg_admin
from airflow_provider_cdc.cdc.sources.postgres.tables import TableRef
from airflow_provider_cdc.cdc.sources.yugabyte.snapshot import plan_hash_ranges

pytestmark = pytest.mark.pg

TABLES = {
    # YSQL's PRIMARY KEY (a, b) is (a HASH, b ASC): only a decides the tablet.
    "composite": ("CREATE TABLE composite (a int, b text, v int, PRIMARY KEY (a, b))", ("a",)),
    "grouped": ("CREATE TABLE grouped (a int, b text, v int, PRIMARY KEY ((a, b) HASH, v))", ("a", "b")),
    "ranged": ("CREATE TABLE ranged (a int, b text, v int, PRIMARY KEY (a ASC, b))", ()),
}


def test_hash_ranges_use_the_hash_columns_and_read_every_row_once(yugabyte):
    with yugabyte.connect() as conn:
        for name, (ddl, _) in TABLES.items():
            conn.execute(ddl)
            conn.execute(
                sql.SQL("INSERT INTO {} SELECT i % 50, 'k' || i, i FROM generate_series(1, 400) i").format(
                    sql.Identifier(name)
                )
            )
        refs = [TableRef("public", name) for name in TABLES]
        described = pg_admin.describe_tables(conn, refs)
        for ref in refs:
            table = described[ref]
            ranges = plan_hash_ranges(conn, table, max_partitions=4, parallelism=4)  # unanalysed: one wave
            assert {r.key for r in ranges} == {TABLES[ref.name][1]}, ref
            assert len(ranges) == (1 if not TABLES[ref.name][1] else 4)
            seen: list[int] = []
            for hash_range in ranges:
                where = hash_range.conditions() or [sql.SQL("true")]
                query = sql.SQL("SELECT v FROM {} WHERE {}").format(
                    sql.Identifier(ref.name), sql.SQL(" AND ").join(where)
                )
                seen += [v for (v,) in conn.execute(query)]
            assert sorted(seen) == list(range(1, 401)), ref
