"""Backlog scaling: does a window of 4N changes cost 4x a window of N, in time and in memory?

    .venv/bin/python bench/backlog_scaling.py --changes 250000 --repeat 3 [--reader sql|stream]

Runs ``bench/stream_window.py`` (same workload, same throwaway PostgreSQL setup) at N and at 4N,
each in a process of its own so the driver's peak memory is that run's alone, and prints the
time ratio (4.0 = linear; re-decoding from the slot's start per chunk would make it quadratic)
and both peak RSS figures (flat = memory bounded by the chunk, not by the backlog).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def measure(changes: int, repeat: int, chunk: int, reader: str) -> dict[str, float]:
    command = [sys.executable, str(HERE / "stream_window.py"), "--changes", str(changes), "--repeat", str(repeat)]
    command += ["--chunk", str(chunk), "--readers", reader]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    window = re.search(rf"\| window end to end, window_reader='{reader}' \| ([\d.]+) \|", out)
    limit = re.search(r"\| limit: peek count\(\*\) \| ([\d.]+) \|", out)
    rss = re.search(rf"peak RSS window\[{reader}\]: (\d+) MiB", out)
    if not (window and limit and rss):
        raise SystemExit(f"unexpected output of stream_window.py:\n{out}")
    return {"window": float(window.group(1)), "limit": float(limit.group(1)), "rss": float(rss.group(1))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=int, default=250_000, help="N (the second run uses 4N)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--chunk", type=int, default=100_000, help="max_changes_per_chunk")
    parser.add_argument("--reader", choices=["sql", "stream"], default="sql", help="the window_reader measured")
    args = parser.parse_args()
    small = measure(args.changes, args.repeat, args.chunk, args.reader)
    large = measure(4 * args.changes, args.repeat, args.chunk, args.reader)
    print("| backlog | window s (median) | peek limit s | window/limit | driver peak RSS |")
    print("|---|---|---|---|---|")
    for n, r in ((args.changes, small), (4 * args.changes, large)):
        print(f"| {n:,} | {r['window']:.2f} | {r['limit']:.2f} | {r['limit'] / r['window']:.2f} | {r['rss']:.0f} MiB |")
    print(f"time ratio 4N/N: {large['window'] / small['window']:.3g} (4.0 = linear)")
    print(f"peak RSS ratio 4N/N: {large['rss'] / small['rss']:.3g} (1.0 = flat)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
