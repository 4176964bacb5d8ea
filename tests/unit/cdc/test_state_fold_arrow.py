"""The Arrow fold (``state_fold_arrow.fold``) gives the table the Spark fold (``state.fold``) gives.

Generated change sequences (inserts, updates, deletes, key changes, unchanged TOAST columns,
truncates, snapshot windows, keyless multisets, several windows) are written window by window as
the capture writes them (``EventLog`` of the MERGE tests); the Spark fold reads them as the state
job's Spark engine does, the Arrow fold as its Arrow engine does, over the same base.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pyarrow as pa
import pytest

from airflow_provider_cdc.cdc.state.arrow import read_parquet_arrow
from airflow_provider_cdc.cdc.state.arrow_fold import fold as arrow_fold
from airflow_provider_cdc.cdc.state.merge import _to_spark
from airflow_provider_cdc.cdc.state.spark_fold import fold as spark_fold
from airflow_provider_cdc.cdc.state.table_rows import plain_types
from tests.unit.cdc.test_state_merge import EventLog, rows_of

pytestmark = pytest.mark.spark

COLUMNS = {"id": pa.int32(), "v": pa.int32(), "body": pa.string()}
EXAMPLES = int(os.environ.get("CDC_FOLD_EXAMPLES", "4"))


def _change(log: EventLog, model: list[dict], kind: str, key: int, n: int) -> None:
    """One valid change of the source: applied to ``model`` (a list of rows) and logged."""
    keyed = bool(log.keys)
    present = [row for row in model if row["id"] == key]
    if kind == "truncate":
        log.truncate()
        model.clear()
    elif kind == "insert" or not present or (kind == "dup" and not keyed):
        if keyed and present:
            return
        row = {"id": key, "v": n, "body": f"new {key}.{n}"}
        model.append(row)
        log.insert(row)
    elif kind in ("update", "toast", "dup"):
        old = present[0]
        new = {**old, "v": old["v"] + 1}
        model[model.index(old)] = new
        log.update(old, new, unchanged=["body"] if kind == "toast" else ())
    elif kind == "delete":
        model.remove(present[0])
        log.delete(present[0])
    elif keyed and not any(row["id"] == key + 31 for row in model):  # a key change, to a free key
        old = present[0]
        new = {**old, "id": key + 31}
        model[model.index(old)] = new
        log.move({"id": key}, new, unchanged=["body"] if kind == "toast_move" else ())


def _both(spark, log: EventLog, since: int, base: pa.Table | None) -> tuple[list, list]:
    paths = [p for s, p in log.paths.items() if s >= since]
    spark_base = None if base is None else _to_spark(spark, base)
    by_spark = spark_fold(spark, log.events(spark, since=since), spark_base)
    by_arrow = arrow_fold(read_parquet_arrow(paths), base)
    return rows_of(plain_types(by_spark.toArrow())), rows_of(plain_types(by_arrow))


@pytest.mark.slow
def test_arrow_fold_equals_spark_fold(spark):
    from hypothesis import HealthCheck, example, given, settings
    from hypothesis import strategies as st

    kinds = ["insert", "update", "toast", "delete", "move", "toast_move", "toast_move", "truncate", "dup"]
    change = st.tuples(st.sampled_from(kinds), st.integers(0, 12))
    window = st.one_of(st.lists(change, min_size=1, max_size=8), st.just("snapshot"))
    windows = st.lists(window, min_size=1, max_size=4)

    # Each kind of change for sure (random examples start small), then random ones.
    @example(keyed=True, initial=[1, 2, 3], windows=[[("toast_move", 1), ("truncate", 0), ("insert", 5)]], split=1)
    @example(keyed=False, initial=[1, 1, 2], windows=[[("dup", 1), ("delete", 1), ("toast", 2)], "snapshot"], split=2)
    @example(
        keyed=True,
        initial=[1, 2, 3, 4],
        windows=[[("toast_move", 1), ("toast", 2), ("delete", 3)], "snapshot", [("toast_move", 32), ("update", 4)]],
        split=3,
    )
    # A few random examples in CI (each runs Spark); CDC_FOLD_EXAMPLES=200 for a longer search.
    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        keyed=st.booleans(), initial=st.lists(st.integers(0, 12), max_size=6), windows=windows, split=st.integers(1, 4)
    )
    def check(keyed, initial, windows, split):
        with tempfile.TemporaryDirectory() as directory:
            log = EventLog(Path(directory) / "events", COLUMNS, ["id"] if keyed else [])
            model = [{"id": i, "v": 0, "body": f"b{i}"} for i in (sorted(set(initial)) if keyed else initial)]
            log.snapshot(model)
            for changes in windows:
                if changes == "snapshot":
                    log.snapshot(model)
                    continue
                for n, (kind, key) in enumerate(changes):
                    _change(log, model, kind, key, n)
                log.commit()
            # Every window folded at once, then the later windows over the earlier ones' state.
            by_spark, by_arrow = _both(spark, log, 1, None)
            assert by_arrow == by_spark
            split_at = min(split, log.seq)
            if split_at > 1:
                base_paths = [p for s, p in log.paths.items() if s < split_at]
                base = plain_types(arrow_fold(read_parquet_arrow(base_paths), None))
                by_spark, by_arrow = _both(spark, log, split_at, base)
                assert by_arrow == by_spark

    check()


def test_arrow_fold_keeps_unchanged_toast_values_across_a_key_change():
    """A key change whose create half lists a TOAST column as unchanged keeps the old key's value
    (without Spark: this runs in the fast suite)."""
    with tempfile.TemporaryDirectory() as directory:
        log = EventLog(Path(directory) / "events", COLUMNS, ["id"])
        log.snapshot([{"id": 1, "v": 0, "body": "long text"}, {"id": 2, "v": 0, "body": "other"}])
        log.move({"id": 1}, {"id": 9, "v": 1, "body": None}, unchanged=["body"])
        log.update({}, {"id": 2, "v": 1, "body": None}, unchanged=["body"])
        log.commit()
        log.truncate()
        log.insert({"id": 3, "v": 3, "body": "after"})
        before_truncate = arrow_fold(read_parquet_arrow([log.paths[1], log.paths[2]]), None)
        log.commit()
        after_truncate = arrow_fold(read_parquet_arrow(list(log.paths.values())), None)
    assert sorted(before_truncate.to_pylist(), key=lambda r: r["id"]) == [
        {"id": 2, "v": 1, "body": "other"},
        {"id": 9, "v": 1, "body": "long text"},
    ]
    assert after_truncate.to_pylist() == [{"id": 3, "v": 3, "body": "after"}]


def test_the_state_job_spec_carries_the_engine():
    from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
    from airflow_provider_cdc.cdc.planning.spec import StateJobSpec
    from airflow_provider_cdc.cdc.state.arrow import SPARK, choose_engine

    spec = StateJobSpec("shop", "/lake", "/state", (("shop.public.a", "shop.public.a"),), state_engine="arrow")
    assert StateJobSpec.from_json(spec.to_json()) == spec
    assert choose_engine(spec) == ("arrow", None)
    # Only Spark opens Hadoop URIs: auto takes Spark there without looking at the sizes.
    hdfs = StateJobSpec("shop", "hdfs://nn/lake", "hdfs://nn/state", spec.topics, state_engine="auto")
    assert choose_engine(hdfs) == (SPARK, None)
    with pytest.raises(CdcConfigurationError, match="state_engine"):
        StateJobSpec("shop", "/lake", "/state", spec.topics, state_engine="duckdb")
