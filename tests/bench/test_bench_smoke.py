"""CI-sized runs of every benchmark under ``bench/``: the harness works and computes its ratios.

No timing is asserted (the machine is shared and noisy); what is asserted is that each command
builds its workload, runs every measurement, checks its own correctness conditions (each
script asserts the events it wrote equal the workload) and prints every ratio as a number.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent.parent / "bench"


def run(script: str, *args: str, timeout: int = 600) -> str:
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), *args], capture_output=True, text=True, timeout=timeout, cwd=BENCH.parent
    )
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def ratio(output: str, label: str) -> float:
    found = re.search(rf"{re.escape(label)}: ([\d.e+-]+)", output)
    assert found, f"no {label!r} in:\n{output}"
    value = float(found.group(1))
    assert value > 0
    return value


def test_stream_window_benchmark():
    out = run("stream_window.py", "--changes", "3000", "--repeat", "1", "--chunk", "1000")
    for reader in ("stream", "sql"):
        ratio(out, f"ratio window[{reader}]/limit")
        ratio(out, f"ratio window[{reader}]/pg_recvlogical")
    ratio(out, "ratio pg_recvlogical/limit")
    assert "raw decode rows (peek): 3" in out  # 3,000 changes plus BEGIN/COMMIT rows
    assert "pyspark imported by a window: False" in out
    for reader in ("stream", "sql"):  # against the peers given the readers' decoding memory too
        ratio(out, f"ratio window[{reader}]/limit at the same memory")
        ratio(out, f"window[{reader}]/pg_recvlogical at the same memory")


def test_stream_window_benchmark_of_one_transaction():
    out = run(
        "stream_window.py", "--changes", "3000", "--repeat", "1", "--workload", "one-transaction", "--readers", "sql"
    )
    ratio(out, "ratio window[sql]/pg_recvlogical")


def test_decoding_memory_benchmark():
    out = run("decoding_memory.py", "--changes", "20000", "--settings", "64kB", "64MB", "--repeat", "1")
    spilled = {
        m.group(1): int(m.group(2)) for m in re.finditer(r"^\| (\w+) \| [\d.]+ \| [\d., ]+ \| (\d+) \|$", out, re.M)
    }
    assert spilled["64kB"] > 0 and spilled["64MB"] == 0, out  # the transaction spills only past the setting


def test_backlog_scaling_benchmark():
    out = run("backlog_scaling.py", "--changes", "1500", "--repeat", "1", "--chunk", "1000", "--reader", "sql")
    ratio(out, "time ratio 4N/N")
    ratio(out, "peak RSS ratio 4N/N")
    assert re.search(r"\| 6,000 \|", out), out


def test_snapshot_benchmark():
    pytest.importorskip("pyspark")
    out = run("snapshot.py", "--rows", "5000", "--repeat", "1", "--warmup", "1")
    ratio(out, "ratio snapshot/COPY")
    ratio(out, "ratio snapshot/connectorx")  # connectorx comes with bootstrap's bench extra: never skipped
    ratio(out, "ratio connectorx/COPY")
    ratio(out, "ratio snapshot/naive JDBC")
    assert re.search(r"SparkSession start \(local\[2\], with the JDBC jar\): [\d.]+s", out), out


def test_snapshot_stages_benchmark():
    pytest.importorskip("pyspark")
    out = run("snapshot_stages.py", "--rows", "5000", "--repeat", "1", "--jobs", "1")
    for stage in ("read loop", "framing", "values", "envelope", "Parquet (writer thread)", "server (PostgreSQL)"):
        assert re.search(rf"\| {re.escape(stage)} \| [\d.]+ \|", out), (stage, out)
    assert re.search(r"bound on \d+ cores: [\d.]+s per 1 M rows", out), out
    assert re.search(r"fixed cost per snapshot job\): [\d.]+s", out), out


def test_idle_run_benchmark():
    out = run("idle_run.py", "--runs", "1", "--neighbour-rows", "2000")
    assert "idle runs: no JVM, slot acknowledged every time" in out, out
    assert re.search(r"window task / limit: \d+x", out), out


def test_lake_write_benchmark():
    out = run("lake_write.py", "--changes", "2000", "--repeat", "1", "--windows", "2", "--chunk", "500")
    ratio(out, "ratio iceberg/parquet")
    ratio(out, "ratio delta/parquet")
    assert "window(s) into delta" in out, out
    # The same windows on the S3 server (SeaweedFS), interleaved: each format's S3/local ratio.
    for sink_format in ("parquet", "iceberg", "delta"):
        ratio(out, f"ratio {sink_format} s3/local")
    assert "window(s) into delta on s3" in out, out


def test_state_merge_benchmark():
    pytest.importorskip("pyspark")
    # One distribution keeps CI short; the uniform one runs every step the recent one does.
    out = run(
        "state_merge.py", "--rows", "5000", "20000", "--changes", "200", "--repeat", "1", "--distribution", "uniform"
    )
    for label in ("full rewrite", "Delta MERGE", "Iceberg MERGE"):
        ratio(out, f"ratio {label} 20,000/5,000")


def test_yugabyte_cdc_window_benchmark():
    out = run("yugabyte_cdc_window.py", "--changes", "3000", "--repeat", "1", "--chunk", "1000")
    ratio(out, "ratio window/fetch")
    assert "tablets: 4," in out, out
    assert re.search(r"peak RSS \(own process\), 12,000 changes: \d+ MiB", out), out  # the 4N window
