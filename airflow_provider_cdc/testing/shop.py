"""A small shop schema and workloads for the demo, the tests and the benchmarks.

Three related tables with a mix of types (bigint, int, numeric, text, varchar, boolean,
timestamp, timestamptz, date, uuid, jsonb, bytea), and a workload of inserts, updates and
deletes, some in transactions that span several tables.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

SCHEMA = """
CREATE TABLE customers (
    id          bigserial PRIMARY KEY,
    email       text NOT NULL UNIQUE,
    name        varchar(100) NOT NULL,
    vip         boolean NOT NULL DEFAULT false,
    profile     jsonb,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE orders (
    id           bigserial PRIMARY KEY,
    customer_id  bigint NOT NULL REFERENCES customers(id) ON DELETE CASCADE,
    public_id    uuid NOT NULL DEFAULT gen_random_uuid(),
    status       text NOT NULL,
    total        numeric(12,2) NOT NULL DEFAULT 0,
    ordered_at   timestamp NOT NULL,
    ship_date    date
);
CREATE TABLE order_items (
    order_id   bigint NOT NULL REFERENCES orders(id) ON DELETE CASCADE,
    line_no    integer NOT NULL,
    sku        varchar(32) NOT NULL,
    quantity   smallint NOT NULL,
    unit_price numeric(10,2) NOT NULL,
    gift_note  bytea,
    PRIMARY KEY (order_id, line_no)
);
"""

TABLES = ("public.customers", "public.orders", "public.order_items")
STATUSES = ("new", "paid", "shipped", "delivered", "cancelled")


@dataclass
class WorkloadStats:
    inserts: dict[str, int] = field(default_factory=dict)
    updates: dict[str, int] = field(default_factory=dict)
    deletes: dict[str, int] = field(default_factory=dict)
    transactions: int = 0

    def add(self, kind: str, table: str, n: int = 1) -> None:
        bucket = getattr(self, kind)
        bucket[table] = bucket.get(table, 0) + n


def create_schema(conn) -> None:
    conn.execute(SCHEMA)


def _customer_row(rng: random.Random, n: int) -> tuple:
    profile = json.dumps({"tier": rng.choice(["gold", "silver", "bronze"]), "tags": rng.sample("abcdef", 2)})
    return (f"user{n}@example.com", f"Customer “{n}”", rng.random() < 0.2, profile)


def seed(conn, *, customers: int = 40, orders_per_customer: int = 3, seed: int = 7) -> WorkloadStats:
    """Initial data, in one transaction."""
    rng = random.Random(seed)
    stats = WorkloadStats()
    with conn.transaction():
        for n in range(1, customers + 1):
            cid = conn.execute(
                "INSERT INTO customers (email, name, vip, profile) VALUES (%s, %s, %s, %s) RETURNING id",
                _customer_row(rng, n),
            ).fetchone()[0]
            stats.add("inserts", "customers")
            for _ in range(orders_per_customer):
                _insert_order(conn, rng, cid, stats)
    stats.transactions += 1
    return stats


def _insert_order(conn, rng: random.Random, customer_id: int, stats: WorkloadStats) -> int:
    oid = conn.execute(
        "INSERT INTO orders (customer_id, status, ordered_at, ship_date) "
        "VALUES (%s, %s, now()::timestamp - make_interval(days => %s), current_date + %s) RETURNING id",
        (customer_id, rng.choice(STATUSES), rng.randint(0, 30), rng.randint(1, 9)),
    ).fetchone()[0]
    stats.add("inserts", "orders")
    total = 0
    for line in range(1, rng.randint(1, 4) + 1):
        qty, price = rng.randint(1, 5), round(rng.uniform(1, 200), 2)
        total += qty * price
        note = rng.randbytes(rng.randint(0, 12)) if rng.random() < 0.5 else None
        conn.execute(
            "INSERT INTO order_items VALUES (%s, %s, %s, %s, %s, %s)",
            (oid, line, f"SKU-{rng.randint(1000, 9999)}", qty, price, note),
        )
        stats.add("inserts", "order_items")
    conn.execute("UPDATE orders SET total = %s WHERE id = %s", (round(total, 2), oid))
    stats.add("updates", "orders")
    return oid


def mutate(conn, *, round_no: int, seed: int = 11) -> WorkloadStats:
    """One hour of activity: new orders (multi-table transactions), updates and deletes."""
    rng = random.Random(seed * 1000 + round_no)
    stats = WorkloadStats()
    customer_ids = [r[0] for r in conn.execute("SELECT id FROM customers ORDER BY id")]
    # New customers placing orders: one transaction across all three tables.
    for n in range(3):
        with conn.transaction():
            cid = conn.execute(
                "INSERT INTO customers (email, name, vip, profile) VALUES (%s, %s, %s, %s) RETURNING id",
                _customer_row(rng, 10_000 * round_no + n),
            ).fetchone()[0]
            stats.add("inserts", "customers")
            _insert_order(conn, rng, cid, stats)
        stats.transactions += 1
    # Existing customers ordering again.
    for cid in rng.sample(customer_ids, 4):
        with conn.transaction():
            _insert_order(conn, rng, cid, stats)
        stats.transactions += 1
    # Status changes, one statement each (autocommit).
    for oid in [r[0] for r in conn.execute("SELECT id FROM orders ORDER BY random() LIMIT 6")]:
        conn.execute("UPDATE orders SET status = %s WHERE id = %s", (rng.choice(STATUSES), oid))
        stats.add("updates", "orders")
        stats.transactions += 1
    # A customer changes profile and name.
    cid = rng.choice(customer_ids)
    conn.execute(
        "UPDATE customers SET vip = NOT vip, name = name || ' (updated)', profile = profile || '{\"updated\": true}' "
        "WHERE id = %s",
        (cid,),
    )
    stats.add("updates", "customers")
    stats.transactions += 1
    # An order cancelled: its items deleted, the order updated, in one transaction.
    oid = conn.execute(
        "SELECT id FROM orders ORDER BY id LIMIT 1 OFFSET mod(%s, (SELECT count(*) FROM orders))", (round_no,)
    ).fetchone()[0]
    with conn.transaction():
        deleted = conn.execute("DELETE FROM order_items WHERE order_id = %s", (oid,)).rowcount
        stats.add("deletes", "order_items", deleted)
        conn.execute("UPDATE orders SET status = 'cancelled', total = 0 WHERE id = %s", (oid,))
        stats.add("updates", "orders")
    stats.transactions += 1
    return stats
