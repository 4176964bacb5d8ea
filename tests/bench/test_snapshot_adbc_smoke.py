"""CI-sized run of ``bench/snapshot_adbc.py``: the hand-written binary COPY parser and the ADBC
PostgreSQL driver (plus the casts to today's arrays) give equal arrays, bit for bit, on the
benchmark tables and on the type matrix's edge values in every value mode, and the script prints
its ratios (no timing asserted)."""

from __future__ import annotations

from tests.bench.test_bench_smoke import ratio, run


def test_snapshot_adbc_benchmark():
    out = run("snapshot_adbc.py", "--rows", "1000", "--repeat", "1", "--matrix")
    assert "type matrix edge values: ADBC + casts equal to the parser in 4 value modes" in out, out
    assert "arrays equal, bit for bit: yes" in out, out
    for table in ("accounts", "wide"):
        ratio(out, f"ratio {table} ADBC/parser speed (wall)")
        ratio(out, f"ratio {table} ADBC/parser speed (client CPU)")
