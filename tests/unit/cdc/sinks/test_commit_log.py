"""The sink's commit log and window writer on a local path (no Spark)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from airflow_provider_cdc.cdc.basics.errors import CdcStateError
from airflow_provider_cdc.cdc.basics.naming import Topic
from airflow_provider_cdc.cdc.basics.window import Window
from airflow_provider_cdc.cdc.sinks.commit_log import CommitLog
from airflow_provider_cdc.cdc.sinks.parquet import ParquetSink
from airflow_provider_cdc.cdc.sinks.reader import committed_windows, read_topic_arrow
from airflow_provider_cdc.cdc.sinks.storage import LocalStorage
from airflow_provider_cdc.cdc.sources.postgres.lsn import Lsn

TOPIC = Topic.for_table("p", "public", "t")


def batch(values: list[int]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"op": ["c"] * len(values), "v": values})


def write_window(sink: ParquetSink, seq: int, values: list[int]):
    window = Window(seq, "stream", Lsn(seq * 10), Lsn(seq * 10 + 10), 1)
    writer = sink.open_window(window, [TOPIC])
    writer.write_batches(TOPIC, [batch(values)])
    return writer, window


def test_readers_see_only_committed_windows(tmp_path):
    sink = ParquetSink(str(tmp_path), "p")
    writer, window = write_window(sink, 1, [1, 2])
    assert read_topic_arrow(str(tmp_path), "p", TOPIC.name) is None  # written, not committed
    writer.commit(window)
    assert read_topic_arrow(str(tmp_path), "p", TOPIC.name).column("v").to_pylist() == [1, 2]
    write_window(sink, 2, [3])  # a crashed attempt: never committed
    assert sorted(read_topic_arrow(str(tmp_path), "p", TOPIC.name).column("v").to_pylist()) == [1, 2]


def test_rerun_of_a_window_replaces_it(tmp_path):
    sink = ParquetSink(str(tmp_path), "p")
    _crashed, _ = write_window(sink, 1, [9, 9, 9])  # an earlier attempt that never committed
    first, window = write_window(sink, 1, [1, 2])
    first.commit(window)
    second, window = write_window(sink, 1, [1, 2])
    second.commit(window)
    assert sorted(read_topic_arrow(str(tmp_path), "p", TOPIC.name).column("v").to_pylist()) == [1, 2]
    entries = committed_windows(str(tmp_path), "p")
    assert [e.window.seq for e in entries] == [1] and entries[0].attempt == second.attempt
    attempts = sorted(p.name for p in (tmp_path / TOPIC.directory / "window=0000000001").iterdir())
    assert attempts == [f"attempt={second.attempt}"]  # older attempts' files were removed


def test_log_entries_are_never_overwritten(tmp_path):
    storage = LocalStorage(tmp_path)
    storage.publish_text("x/1.json", "{}")
    with pytest.raises(FileExistsError):
        storage.publish_text("x/1.json", "{}")
    assert storage.read_text("x/1.json") == "{}"
    assert storage.list_names("x") == ["1.json"]  # no temporary files left behind


def test_unreadable_log_entry_is_an_error(tmp_path):
    sink = ParquetSink(str(tmp_path), "p")
    writer, window = write_window(sink, 1, [1])
    writer.commit(window)
    (tmp_path / "_cdc_log" / "p" / "00000000000000000002.json").write_text("{broken")
    with pytest.raises(CdcStateError, match="unreadable"):
        CommitLog(LocalStorage(tmp_path), "p").entries()


def test_counts_per_op(tmp_path):
    sink = ParquetSink(str(tmp_path), "p")
    window = Window(1, "stream", Lsn(0), Lsn(1), 1)
    writer = sink.open_window(window, [TOPIC])
    writer.write_batches(TOPIC, [pa.RecordBatch.from_pydict({"op": ["c", "u", "u", "d"], "v": [1, 2, 3, 4]})])
    entry = writer.commit(window)
    assert entry.dataset(TOPIC.name).ops == {"c": 1, "u": 2, "d": 1}
    assert entry.dataset(TOPIC.name).events == 4


def test_sink_path_must_be_a_directory(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(Exception, match="not a directory"):
        ParquetSink(str(tmp_path / "file"), "p")


# -- paths read back from the sink: the attacker is whoever may write the sink -------------------


def test_a_symbolic_link_planted_in_the_sink_is_never_followed(tmp_path):
    """The name checks pass a landed directory swapped for a link (or a file that is a link), so
    the reader would return someone else's rows and a delete would remove a directory elsewhere."""
    import shutil

    sink_dir, outside = tmp_path / "lake", tmp_path / "outside"
    sink = ParquetSink(str(sink_dir), "p")
    writer, window = write_window(sink, 1, [1, 2])
    writer.commit(window)
    landed = sink_dir / writer.dataset_path(TOPIC)
    shutil.copytree(landed, outside / "rows")  # someone else's data, in the capture's format
    (outside / "keep.txt").write_text("x")
    shutil.rmtree(landed)
    landed.symlink_to(outside / "rows", target_is_directory=True)
    with pytest.raises(CdcStateError, match="leads outside"):
        read_topic_arrow(str(sink_dir), "p", TOPIC.name)
    landed.unlink()
    landed.mkdir()
    (landed / "part-00001.parquet").symlink_to(next((outside / "rows").iterdir()))
    with pytest.raises(CdcStateError, match="is a symbolic link"):
        read_topic_arrow(str(sink_dir), "p", TOPIC.name)
    window_dir = landed.parent
    shutil.rmtree(window_dir)
    window_dir.symlink_to(outside, target_is_directory=True)
    storage = LocalStorage(sink_dir)
    with pytest.raises(CdcStateError):
        storage.delete_tree(writer.dataset_path(TOPIC).rsplit("/attempt=", 1)[0])
    assert (outside / "keep.txt").exists() and (outside / "rows").exists()


@pytest.mark.parametrize(
    "path",
    ["/etc", "../x", "a/../../x", "a//b", "a\\b", "c:/x", "a/./b", "s3://bucket/x", "a\x00b"],
)
def test_storage_refuses_paths_that_leave_the_sink(tmp_path, path):
    storage = LocalStorage(tmp_path / "lake")
    for call in (storage.uri, storage.read_text, storage.exists, storage.list_names, storage.delete_tree):
        with pytest.raises(CdcStateError, match="does not stay inside the sink"):
            call(path)


def test_arrow_reads_escaped_names_through_a_path_and_a_file_uri(tmp_path):
    # The directory is 'p.Sales%20Dept.o%27rders%3A%20%C3%A9t%C3%A9': Arrow decodes the URIs it is
    # given, so a file:// sink must hand it that name encoded once more (and the base's space too).
    odd = Topic.for_table("p", "Sales Dept", "o'rders: été")
    base = tmp_path / "my lake"
    writer = ParquetSink(str(base), "p").open_window(window := Window(1, "stream", Lsn(10), Lsn(20), 1), [odd])
    writer.write_batches(odd, [batch([1, 2])])
    writer.commit(window)
    for sink_path in (str(base), f"file://{base}"):
        assert read_topic_arrow(sink_path, "p", odd.name).column("v").to_pylist() == [1, 2], sink_path
