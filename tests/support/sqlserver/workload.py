"""A small shop workload in T-SQL for the SQL Server source's tests (the stand-in runs it)."""

from __future__ import annotations

import random
from decimal import Decimal

from .standin import SqlServerStandIn

TABLES = ("dbo.customers", "dbo.orders")
KEYS = {"dbo.customers": ["id"], "dbo.orders": ["id"]}
#: The transactions one ``mutate`` round commits (each touches a captured table).
TRANSACTIONS_PER_ROUND = 4

SCHEMA = (
    "CREATE TABLE dbo.customers (id int NOT NULL PRIMARY KEY, name nvarchar(100) NOT NULL, "
    "balance decimal(12,2) NULL, active bit NOT NULL)",
    "CREATE TABLE dbo.orders (id bigint NOT NULL PRIMARY KEY, customer_id int NOT NULL, "
    "amount decimal(10,2) NOT NULL, note nvarchar(max) NULL)",
)


def create(standin: SqlServerStandIn, *, customers: int = 10, orders_per_customer: int = 2) -> None:
    """Tables, CDC on the database and both tables, and seed rows."""
    for statement in SCHEMA:
        standin.execute_tsql(statement)
    standin.enable_db()
    standin.set_snapshot_isolation(True)  # snapshot_isolation_mode='snapshot' (the default) needs it
    for table in TABLES:
        schema, name = table.split(".")
        standin.enable_table(schema, name)
    seed(standin, customers=customers, orders_per_customer=orders_per_customer)


def seed(standin: SqlServerStandIn, *, customers: int, orders_per_customer: int) -> None:
    for c in range(1, customers + 1):
        standin.execute_tsql(
            "INSERT INTO dbo.customers (id, name, balance, active) VALUES (?, ?, ?, ?)",
            (c, f"customer {c}", Decimal(c * 10) + Decimal("0.25"), c % 2 == 0),
        )
        for o in range(orders_per_customer):
            order_id = c * 100 + o
            standin.execute_tsql(
                "INSERT INTO dbo.orders (id, customer_id, amount, note) VALUES (?, ?, ?, ?)",
                (order_id, c, Decimal(order_id) / 10, None if o % 2 else f"note {order_id}"),
            )


def mutate(standin: SqlServerStandIn, round_no: int, *, seed_value: int = 0) -> dict[str, int]:
    """Inserts, updates, deletes, a key change and a two-table transaction (``TRANSACTIONS_PER_ROUND``
    transactions); returns op counts. ``round_no`` must be unique per database (it picks the new keys);
    rounds may run concurrently on separate connections."""
    rng = random.Random(round_no * 7919 + seed_value)
    counts = {"c": 0, "u": 0, "d": 0}
    base = 1000 * (round_no + 1)
    conn = standin.connect(autocommit=False)
    try:
        cursor = conn.cursor()
        # One transaction over both tables: a new customer with two orders.
        cursor.execute(
            "INSERT INTO dbo.customers (id, name, balance, active) VALUES (?, ?, ?, ?)",
            base,
            f"new {round_no}",
            Decimal("1.00"),
            True,
        )
        for i in range(2):
            cursor.execute(
                "INSERT INTO dbo.orders (id, customer_id, amount, note) VALUES (?, ?, ?, ?)",
                base * 10 + i,
                base,
                Decimal(i + 1),
                "x" * rng.randint(0, 50),
            )
        conn.commit()
        counts["c"] += 3
        cursor.execute(
            "UPDATE dbo.customers SET balance = balance + 1, name = CONCAT(name, N'!') WHERE id = ?", rng.randint(1, 5)
        )
        conn.commit()
        counts["u"] += 1
        cursor.execute("DELETE FROM dbo.orders WHERE id = ?", base * 10 + 1)
        conn.commit()
        counts["d"] += 1
        cursor.execute("UPDATE dbo.orders SET note = NULL, amount = amount * 2 WHERE id = ?", base * 10)
        conn.commit()
        counts["u"] += 1
    finally:
        conn.close()
    return counts


def source_rows(standin: SqlServerStandIn, table: str) -> dict[tuple, dict]:
    """The table's rows now, by key (values as pyodbc returns them)."""
    conn = standin.connect()
    try:
        cursor = conn.cursor()
        cursor.execute(f"SELECT * FROM {table}")
        names = [d[0] for d in cursor.description]
        keys = KEYS[table]
        rows = [dict(zip(names, row)) for row in cursor.fetchall()]
    finally:
        conn.close()
    return {tuple(r[k] for k in keys): r for r in rows}
