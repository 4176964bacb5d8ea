"""A small shop workload for the YugabyteDB source's tests (run through the stand-in, like a user's SQL).

Tables keep YugabyteDB's default replica identity, CHANGE: an update streams only the key and the
columns it changed, so the rounds update single columns, set a column to NULL explicitly, change
a key and touch both tables in one transaction.
"""

from __future__ import annotations

import random
from decimal import Decimal

TABLES = ("public.customers", "public.orders")
KEYS = {"public.customers": ["id"], "public.orders": ["id"]}
#: The transactions one ``mutate`` round commits (each touches a captured table).
TRANSACTIONS_PER_ROUND = 5

SCHEMA = (
    "CREATE TABLE public.customers (id int PRIMARY KEY, name text NOT NULL, email text, "
    "balance numeric(12,2), active boolean NOT NULL DEFAULT true)",
    "CREATE TABLE public.orders (id bigint PRIMARY KEY, customer_id int NOT NULL, amount numeric(10,2) NOT NULL, "
    "note text, placed_at timestamptz NOT NULL DEFAULT '2026-01-01 00:00:00+00')",
)


def create(standin, *, customers: int = 10, orders_per_customer: int = 2) -> None:
    """The tables with ``customers`` (fewer than 200: rounds insert orders 10000 * (round + 1) and
    one more, and customer ``c``'s orders are ``c * 100 + n``) and their orders."""
    assert customers < 200, "customer 200's first order would collide with round 1's"
    with standin.connect() as conn:
        for statement in SCHEMA:
            conn.execute(statement)
        for c in range(1, customers + 1):
            conn.execute(
                "INSERT INTO public.customers (id, name, email, balance, active) VALUES (%s, %s, %s, %s, %s)",
                (c, f"customer {c}", f"c{c}@example.com", Decimal(c * 10) + Decimal("0.25"), c % 2 == 0),
            )
            for o in range(orders_per_customer):
                order_id = c * 100 + o
                conn.execute(
                    "INSERT INTO public.orders (id, customer_id, amount, note) VALUES (%s, %s, %s, %s)",
                    (order_id, c, Decimal(order_id) / 10, None if o % 2 else f"note {order_id}"),
                )


def mutate(standin, round_no: int) -> dict[str, int]:
    """Five transactions: a two-table insert, single-column updates (one to NULL), a delete, and a
    primary-key change (YugabyteDB streams it as a delete and an insert). Returns op counts."""
    rng = random.Random(round_no * 7919)
    counts = {"c": 0, "u": 0, "d": 0}
    base = 1000 * (round_no + 1)
    with standin.connect(autocommit=False) as conn:
        conn.execute(
            "INSERT INTO public.customers (id, name, email, balance) VALUES (%s, %s, %s, %s)",
            (base, f"new {base}", f"n{base}@example.com", Decimal("1.50")),
        )
        conn.execute(
            "INSERT INTO public.orders (id, customer_id, amount, note) VALUES (%s, %s, %s, %s), (%s, %s, %s, %s)",
            (base * 10, base, Decimal("3.00"), "first", base * 10 + 1, base, Decimal("4.00"), None),
        )
        conn.commit()
        counts["c"] += 3
        ids = [r[0] for r in conn.execute("SELECT id FROM public.customers WHERE id < 1000 ORDER BY id").fetchall()]
        if len(ids) < 4:  # every round deletes one seeded customer and moves one: then any will do
            ids = [r[0] for r in conn.execute("SELECT id FROM public.customers ORDER BY id").fetchall()]
        conn.commit()
        victim, renamed, nulled, moved = rng.sample(ids, 4)
        conn.execute("UPDATE public.customers SET name = %s WHERE id = %s", (f"renamed {round_no}", renamed))
        conn.execute("UPDATE public.customers SET email = NULL, balance = balance + 1 WHERE id = %s", (nulled,))
        conn.commit()
        counts["u"] += 2
        conn.execute("DELETE FROM public.orders WHERE customer_id = %s", (victim,))
        deleted = conn.execute("DELETE FROM public.customers WHERE id = %s", (victim,)).rowcount
        conn.commit()
        counts["d"] += deleted + 2 if deleted else 0
        conn.execute("UPDATE public.orders SET amount = amount * 2 WHERE customer_id = %s", (moved,))
        conn.commit()
        counts["u"] += 2
        conn.execute("UPDATE public.customers SET id = %s WHERE id = %s", (base + 1, moved))
        conn.execute("UPDATE public.orders SET customer_id = %s WHERE customer_id = %s", (base + 1, moved))
        conn.commit()
        counts["d"] += 1
        counts["c"] += 1
        counts["u"] += 2
    return counts


def source_rows(standin, table: str) -> dict[tuple, dict]:
    from tests.support.oracle import source_rows as rows

    with standin.connect() as conn:
        return rows(conn, table, KEYS[table])
