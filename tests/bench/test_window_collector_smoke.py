"""A CI-sized run of ``bench/window_collector.py``: both collectors see the same captured window,
land the same number of events (the script asserts it) and the ratios come out as numbers."""

from __future__ import annotations

from tests.bench.test_bench_smoke import ratio, run


def test_window_collector_benchmark():
    out = run("window_collector.py", "--changes", "3000", "--repeat", "1", "--chunk", "1000", "--batch-rows", "700")
    assert "window: 3061 messages, 3000 changes, 4 chunks of 1000" in out, out
    ratio(out, "ratio frames/batches, seconds (median of per-repeat ratios)")
    ratio(out, "ratio frames/batches, cpu (median of per-repeat ratios)")
