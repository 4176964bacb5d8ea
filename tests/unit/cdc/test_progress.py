"""The per-chunk progress line: counts, bytes, rate and lag in one line."""

from __future__ import annotations

import logging
import re
import time

import pyarrow as pa

from airflow_provider_cdc.cdc.basics.progress import batch_bytes, human_bytes, lag_text, log_chunk


def test_one_line_says_changes_bytes_rate_and_lag(caplog):
    batch = pa.record_batch({"x": pa.array(range(1000), pa.int64())})
    log = logging.getLogger("progress-test")
    with caplog.at_level(logging.INFO, logger="progress-test"):
        log_chunk(
            log,
            chunk=3,
            changes=1000,
            transactions=10,
            event_bytes=batch_bytes([batch]),
            started=time.monotonic() - 2.0,
            last_commit_ts_us=int((time.time() - 90) * 1e6),
            topics=["shop.public.b", "shop.public.a"],
        )
    (line,) = [r.getMessage() for r in caplog.records]
    match = re.fullmatch(
        r"chunk 3: 1000 changes in 10 transactions so far, 7\.8 KiB of events, (\d+) changes/s \(([\d.]+) KiB/s\), "
        r"lag (\d+\.\d)s behind the last commit read; topics: shop\.public\.a, shop\.public\.b",
        line,
    )
    assert match, line
    assert 400 <= int(match.group(1)) <= 500  # 1000 changes in about 2 s
    assert 89.0 <= float(match.group(3)) <= 95.0


def test_sizes_and_unknown_lag():
    assert [human_bytes(n) for n in (0, 1023, 1024, 5 * 1024**2, 3 * 1024**4)] == [
        "0 B",
        "1023 B",
        "1.0 KiB",
        "5.0 MiB",
        "3072.0 GiB",
    ]
    assert lag_text(None) == "unknown"
    assert lag_text(2_000_000, now=1.0) == "0.0s"  # a clock behind the server is no negative lag
