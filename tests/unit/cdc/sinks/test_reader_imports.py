"""Reading landed Parquet windows with Arrow does not import ``pyarrow.dataset``: its import makes
pyarrow import pandas (~1 s of a task's CPU, apache/arrow#34994), and a task that only checks
what landed (the skipped snapshot of every hourly run) paid it for nothing. The files found are
the ones ``pyarrow.dataset`` finds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from airflow_provider_cdc.cdc.sinks.reader import _parquet_files

ROOT = Path(__file__).resolve().parents[4]


def _landed(base: Path) -> Path:
    """A topic directory as windows land it, with what Spark, Hadoop and Arrow leave beside."""
    topic = base / "shop.public.orders"
    for rel, ids in (
        ("window=0000000001/part-0.parquet", [1, 2]),
        ("window=0000000002/part-0.parquet", [3]),
        ("window=0000000002/nested/part-1.parquet", [4]),
        ("_temporary/0/part-9.parquet", [9]),
        (".staging/part-8.parquet", [8]),
    ):
        (topic / rel).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}), topic / rel)
    (topic / "window=0000000002" / "_SUCCESS").write_text("")
    (topic / "window=0000000002" / ".part-0.parquet.crc").write_text("")
    return topic


def test_reading_landed_windows_imports_neither_pyarrow_dataset_nor_pandas(tmp_path: Path):
    topic = _landed(tmp_path)
    code = f"""
import json, sys
from airflow_provider_cdc.cdc.state.arrow import read_parquet_arrow
rows = read_parquet_arrow([{str(topic)!r}])  # as a state refresh reads its windows
print(json.dumps({{"ids": sorted(rows.column("id").to_pylist()),
                  "loaded": sorted(m for m in ("pyarrow.dataset", "pandas") if m in sys.modules)}}))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == {"ids": [1, 2, 3, 4], "loaded": []}


@pytest.mark.parametrize("form", ["dir", "dir/", "file-uri", "window", "one-file"])
def test_the_files_found_are_pyarrow_datasets(tmp_path: Path, form: str):
    topic = _landed(tmp_path)
    uri = {
        "dir": str(topic),
        "dir/": f"{topic}/",
        "file-uri": topic.as_uri(),
        "window": str(topic / "window=0000000002"),
        "one-file": str(topic / "window=0000000001" / "part-0.parquet"),
    }[form]
    assert sorted(f for _, f in _parquet_files([uri])) == sorted(ds.dataset(uri, format="parquet").files)


def test_a_missing_dataset_is_an_error_as_before(tmp_path: Path):
    with pytest.raises(FileNotFoundError):
        ds.dataset(str(tmp_path / "gone"), format="parquet")
    with pytest.raises(FileNotFoundError):
        _parquet_files([str(tmp_path / "gone")])
