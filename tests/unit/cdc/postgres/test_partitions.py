"""How many block ranges a snapshot reads a table in."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_cdc.cdc.sources.postgres.snapshot import MIN_SPLIT_BYTES, partition_count

MiB = 1024 * 1024


def test_whole_waves_of_tasks():
    # 300 MiB in 128 MiB partitions is 3; on 2 cores that is rounded up to 4 (two full waves).
    assert partition_count(300 * MiB, partition_bytes=128 * MiB, max_partitions=64, parallelism=2) == 4
    # a 100 MiB table still uses both cores
    assert partition_count(100 * MiB, partition_bytes=128 * MiB, max_partitions=64, parallelism=2) == 2


def test_small_tables_are_not_split_for_parallelism():
    assert partition_count(MIN_SPLIT_BYTES - 1, partition_bytes=128 * MiB, max_partitions=64, parallelism=8) == 1
    assert partition_count(3 * MIN_SPLIT_BYTES, partition_bytes=128 * MiB, max_partitions=64, parallelism=8) == 3


def test_the_cap_wins():
    assert partition_count(10_000 * MiB, partition_bytes=128 * MiB, max_partitions=16, parallelism=3) == 16


@given(
    st.integers(0, 2**40),
    st.integers(1, 2**31),
    st.integers(1, 256),
    st.integers(1, 64),
)
def test_partition_count_properties(size, partition_bytes, max_partitions, parallelism):
    count = partition_count(
        size, partition_bytes=partition_bytes, max_partitions=max_partitions, parallelism=parallelism
    )
    assert 1 <= count <= max_partitions
    needed = max(1, -(-size // partition_bytes))
    # never fewer partitions than the size asks for, unless capped
    assert count >= min(needed, max_partitions)
    effective = max(1, min(parallelism, size // MIN_SPLIT_BYTES))
    if count < max_partitions:
        assert count % effective == 0  # whole waves
        assert count < needed + effective  # and no more than one extra wave's worth
