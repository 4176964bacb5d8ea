"""Delta Lake on S3 (SeaweedFS): the sink's tables, the current-state tables, ``as_of``, maintenance
and two writers racing for one table version, every call through delta-rs's object store and every
staged file through Arrow's S3 file system; read back with the product, Polars and DuckDB from
the store."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from collections import Counter
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

deltalake = pytest.importorskip("deltalake")

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError, CdcStateError  # noqa: E402
from airflow_provider_cdc.cdc.basics.window import window_id_for  # noqa: E402
from airflow_provider_cdc.cdc.sinks import object_store  # noqa: E402
from airflow_provider_cdc.cdc.sinks.delta import DeltaTables, time_travel_version  # noqa: E402
from airflow_provider_cdc.cdc.sinks.lake_tables import table_format  # noqa: E402
from airflow_provider_cdc.cdc.state.delta_table import DeltaStateTable  # noqa: E402
from tests.support.s3_server import BUCKET  # noqa: E402
from tests.unit.cdc.sinks.test_delta_tables import PREFIX, TOPIC, events, ids_by_window, tag  # noqa: E402


def _canonical(rows: pa.Table) -> list[str]:
    return sorted(json.dumps(r, sort_keys=True, default=str) for r in rows.to_pylist())


def _key(uri: str) -> str:
    return object_store.split_bucket(uri)[1]


def _stage(tables: DeltaTables, seq: int, attempt: str, *data: pa.Table) -> list[str]:
    """A window attempt's Parquet files in the bucket, where the window writer stages them (the
    URIs in the form the sink's storage names them: the capture's own ``s3a://`` scheme)."""
    directory = f"{tables.table_uri(TOPIC)}/window={window_id_for(seq)}/attempt={attempt}"
    uris = []
    for n, rows in enumerate(data, 1):
        uri = f"{directory}/part-{n:05d}.parquet"
        fs, path = object_store.filesystem(uri)
        pq.write_table(rows, path, filesystem=fs)
        uris.append("s3a" + uri[len("s3") :])
    return uris


def _land(tables: DeltaTables, seq: int, attempt: str, *data: pa.Table):
    return tables.commit_window(TOPIC, _stage(tables, seq, attempt, *data), tag(seq, attempt))


def _table_keys(s3_server, tables: DeltaTables) -> set[str]:
    """The table's objects in the bucket, relative to the table (not the directory markers)."""
    prefix = _key(tables.table_uri(TOPIC)) + "/"
    return {k[len(prefix) :] for k in s3_server.keys(BUCKET, prefix) if not k.endswith("/")}


def test_windows_land_retry_time_travel_and_maintenance_on_s3(s3_server, s3_prefix):
    tables = table_format("delta", "s3a" + s3_prefix[len("s3") :], PREFIX)
    assert isinstance(tables, DeltaTables) and tables.table_uri(TOPIC).startswith("s3://")
    assert not tables.exists(TOPIC) and tables.scan_arrow(TOPIC) is None

    first = _land(tables, 1, "a", events(1, [1, 2]))
    assert (first.version, first.files_added, first.rows_added) == (0, 1, 2)
    _land(tables, 2, "a", events(2, [3]))
    # A file whose types Delta lacks (uint32) is conformed: a rewritten copy in the table, the
    # staged original deleted from the bucket.
    odd = events(3, [4]).set_column(5, "id", pa.array([4], pa.uint32()))
    _land(tables, 3, "a", odd)
    attempt3 = {k for k in _table_keys(s3_server, tables) if k.startswith(f"window={window_id_for(3)}/")}
    assert len(attempt3) == 1 and attempt3.pop().endswith("-conformed.parquet")
    assert not [k for k in s3_server.keys(BUCKET, _key(s3_prefix)) if k.endswith("/")]  # no "directory" marker
    # A retry of window 2 replaces the earlier attempt in one commit.
    retried = _land(tables, 2, "b", events(2, [30, 31]))
    assert (retried.files_removed, retried.rows_added) == (1, 2)
    expected = {"0000000001": [1, 2], "0000000002": [30, 31], "0000000003": [4]}
    assert ids_by_window(tables.scan_arrow(TOPIC)) == expected
    assert tables.holds_window(TOPIC, 2) and not tables.holds_window(TOPIC, 9)
    assert tables.last_window_seq(TOPIC) == 2  # the txn version: the last window committed
    assert {s: c.attempt for s, c in tables.window_commits(TOPIC).items()} == {1: "a", 2: "b", 3: "a"}
    files = tables.data_files(TOPIC)
    assert len(files) == 3 and all(f.startswith(tables.table_uri(TOPIC) + "/window=") for f in files)

    # as_of: the version of window 2's first attempt, by time travel on the store.
    version = time_travel_version(tables.table_uri(TOPIC), 2)
    assert version == retried.version and tables.version_of(TOPIC, 1) == 0
    options = object_store.delta_storage_options(tables.table_uri(TOPIC))
    old = deltalake.DeltaTable(tables.table_uri(TOPIC), version=2, storage_options=options)
    assert ids_by_window(old.to_pyarrow_table()) == {"0000000001": [1, 2], "0000000002": [3], "0000000003": [4]}

    # Third-party readers from the store: Polars (delta-rs underneath) and DuckDB over Arrow.
    frame = pl.scan_delta(tables.table_uri(TOPIC), storage_options=options).collect()
    assert sorted(frame["id"].to_list()) == [1, 2, 4, 30, 31]
    dataset = deltalake.DeltaTable(tables.table_uri(TOPIC), storage_options=options).to_pyarrow_dataset()
    query = "SELECT window_id, count(*) FROM dataset GROUP BY window_id ORDER BY 1"
    duck = duckdb.connect().register("dataset", dataset).sql(query).fetchall()
    assert duck == [("0000000001", 2), ("0000000002", 2), ("0000000003", 1)]

    # Maintenance on the store: one compacted file, the originals vacuumed out of the bucket, and
    # so are the files a crashed attempt staged but never committed to this table.
    crashed = _stage(tables, 3, "crashed", events(3, [5]))
    before = {k for k in _table_keys(s3_server, tables) if not k.startswith("_delta_log/")}
    assert f"window={window_id_for(3)}/attempt=crashed/part-00001.parquet" in before and len(crashed) == 1
    result = tables.maintain(TOPIC, compact=True, retain_hours=0)
    assert result["compact"]["numFilesRemoved"] == 3 and len(result["vacuumed"]) >= 3
    after = {k for k in _table_keys(s3_server, tables) if not k.startswith("_delta_log/")}
    assert len(tables.data_files(TOPIC)) == 1 and not (after & before)
    assert ids_by_window(tables.scan_arrow(TOPIC)) == expected
    # A retry after compaction still replaces the window's rows (filtered out of the compacted file).
    _land(tables, 3, "b", events(3, [40]))
    assert ids_by_window(tables.scan_arrow(TOPIC)) == {**expected, "0000000003": [40]}


def test_a_staged_file_outside_the_table_or_a_forged_log_entry_is_refused_on_s3(s3_server, s3_prefix):
    tables = DeltaTables(s3_prefix, PREFIX)
    elsewhere = f"{s3_prefix}/elsewhere/part-00001.parquet"
    fs, path = object_store.filesystem(elsewhere)
    pq.write_table(events(1, [1]), path, filesystem=fs)
    for outside in (elsewhere, f"{tables.table_uri(TOPIC)}/../elsewhere/part-00001.parquet", "/tmp/x.parquet"):
        with pytest.raises(CdcConfigurationError, match="is not inside the Delta table"):
            tables.commit_window(TOPIC, [outside], tag(1, "a"))
    assert not tables.exists(TOPIC)

    # Whoever may write the bucket appends a commit naming a file of another prefix: the next
    # window's commit refuses to read or rewrite it, and writes nothing.
    _land(tables, 1, "a", events(1, [1, 2]))
    for forged in (f"s3://{BUCKET}/{_key(elsewhere)}", "../elsewhere/part-00001.parquet"):
        table = deltalake.DeltaTable(
            tables.table_uri(TOPIC), storage_options=object_store.delta_storage_options(s3_prefix)
        )
        add = {"path": forged, "size": 1, "partitionValues": {}, "modificationTime": 1, "dataChange": True}
        log = f"{_key(tables.table_uri(TOPIC))}/_delta_log/{table.version() + 1:020d}.json"
        s3_server.client().put_object(Bucket=BUCKET, Key=log, Body=json.dumps({"add": add}).encode())
        keys = {k for k in s3_server.keys(BUCKET, _key(s3_prefix)) if "attempt=b" not in k}
        with pytest.raises(CdcStateError, match=r"lists a data file .* outside it"):
            _land(tables, 2, "b", events(2, [3]))
        staged = {k for k in s3_server.keys(BUCKET, _key(s3_prefix)) if "attempt=b" not in k}
        assert staged == keys  # nothing written but the window's staged file
        s3_server.client().delete_object(Bucket=BUCKET, Key=log)


def _forge_add(s3_server, table_uri: str, path: str) -> None:
    """What whoever may write the bucket can do: the table's next ``_delta_log`` version, adding ``path``."""
    version = deltalake.DeltaTable(table_uri, storage_options=object_store.delta_storage_options(table_uri)).version()
    add = {"path": path, "size": 1000, "partitionValues": {}, "modificationTime": 1, "dataChange": True}
    log = f"{_key(table_uri)}/_delta_log/{version + 1:020d}.json"
    s3_server.client().put_object(Bucket=BUCKET, Key=log, Body=json.dumps({"add": add}).encode())


def test_a_forged_log_entry_never_makes_the_state_fold_read_another_captures_files_on_s3(s3_server, s3_prefix):
    """``data_files`` (the files the current-state fold reads, event tables and state tables) refuses
    a forged add action outside the table in every form; the other capture's object is never read."""
    other = f"{s3_prefix}/other-capture/t.public.orders/window={window_id_for(1)}/attempt=a/part-00001.parquet"
    fs, path = object_store.filesystem(other)
    pq.write_table(events(1, [99]), path, filesystem=fs)
    state = DeltaStateTable(f"{s3_prefix}/state/t.public.orders")
    state.overwrite(pa.table({"id": pa.array([1], pa.int32())}), tag(1, "a"), keys=["id"])
    tables = DeltaTables(s3_prefix, PREFIX)
    _land(tables, 1, "a", events(1, [1]))
    for forged in (other, f"../{_key(other).split('/', 1)[1]}", "../../" + _key(other), "%2E%2E/%2E%2E/" + _key(other)):
        for table_uri, data_files in (
            (tables.table_uri(TOPIC), lambda: tables.data_files(TOPIC)),
            (state.name, state.data_files),
        ):
            _forge_add(s3_server, table_uri, forged)
            with pytest.raises(CdcStateError, match=r"lists a data file .* outside it"):
                data_files()
            keys = s3_server.keys(BUCKET, f"{_key(table_uri)}/_delta_log/")
            s3_server.client().delete_object(Bucket=BUCKET, Key=max(k for k in keys if k.endswith(".json")))
    assert tables.data_files(TOPIC)[0].startswith(tables.table_uri(TOPIC) + "/window=")
    assert _key(other) in s3_server.keys(BUCKET, _key(other))


def test_a_forged_log_entry_of_a_local_table_lists_nothing_outside_it(tmp_path):
    """The same refusal for a local sink table and state table: ``..``, an absolute path, a link out."""
    secret = tmp_path / "outside" / "secret.parquet"
    secret.parent.mkdir()
    pq.write_table(events(1, [99]), secret)
    tables = DeltaTables(str(tmp_path / "lake"), PREFIX)
    staged = Path(tables.table_uri(TOPIC), f"window={window_id_for(1)}", "attempt=a", "part-00001.parquet")
    staged.parent.mkdir(parents=True)
    pq.write_table(events(1, [1]), staged)
    tables.commit_window(TOPIC, [str(staged)], tag(1, "a"))
    state = DeltaStateTable(str(tmp_path / "state" / "shop.public.orders"))
    state.overwrite(pa.table({"id": pa.array([1], pa.int32())}), tag(1, "a"), keys=["id"])
    for table_dir, data_files in (
        (tables.table_uri(TOPIC), lambda: tables.data_files(TOPIC)),
        (state.name, state.data_files),
    ):
        Path(table_dir, "link.parquet").symlink_to(secret)
        version = deltalake.DeltaTable(table_dir).version()
        for forged in (os.path.relpath(secret, table_dir), str(secret), "link.parquet"):
            add = {"path": forged, "size": 1000, "partitionValues": {}, "modificationTime": 1, "dataChange": True}
            log = Path(table_dir, "_delta_log", f"{version + 1:020d}.json")
            log.write_text(json.dumps({"add": add}))
            with pytest.raises(CdcStateError, match=r"outside"):
                data_files()
            log.unlink()
        assert data_files() and all(f.startswith(table_dir + "/") for f in data_files())


def test_two_writers_racing_for_one_version_on_s3_cannot_both_win(s3_server, s3_prefix, monkeypatch):
    """delta-rs publishes ``_delta_log/<version>.json`` with a create-only PUT (``If-None-Match: *``):
    of writers that all read version N and commit without retrying, exactly one gets N+1. The
    product's options pin that mode: the environment cannot turn it off."""
    monkeypatch.setenv("AWS_CONDITIONAL_PUT", "disabled")  # object_store's own variable
    options = object_store.delta_storage_options(s3_prefix)
    assert options["AWS_CONDITIONAL_PUT"] == "etag"
    uri = f"{s3_prefix}/race"
    deltalake.write_deltalake(uri, pa.table({"n": [0]}), storage_options=options)
    writers = [deltalake.DeltaTable(uri, storage_options=options) for _ in range(4)]
    outcomes: dict[int, str] = {}
    start = threading.Barrier(len(writers))

    def commit(i: int) -> None:
        start.wait()
        try:
            deltalake.write_deltalake(
                writers[i],
                pa.table({"n": [i + 1]}),
                mode="append",
                commit_properties=deltalake.CommitProperties(max_commit_retries=0),
            )
            outcomes[i] = "won"
        except deltalake.exceptions.CommitFailedError:
            outcomes[i] = "refused"

    threads = [threading.Thread(target=commit, args=(i,)) for i in range(len(writers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes.values()) == ["refused", "refused", "refused", "won"]
    table = deltalake.DeltaTable(uri, storage_options=options)
    winner = next(i for i, o in outcomes.items() if o == "won")
    assert table.version() == 1 and sorted(table.to_pyarrow_table()["n"].to_pylist()) == [0, winner + 1]

    # Two runs of one capture racing to commit windows 2 and 3 (their txn actions name the same
    # app id): when their commits overlap, delta-rs's conflict check refuses the second
    # (ConcurrentTransaction), and the refused window is simply absent until its run is retried.
    tables = [DeltaTables(s3_prefix, PREFIX) for _ in range(2)]
    _land(tables[0], 1, "a", events(1, [1]))
    staged = {seq: _stage(tables[i], seq, "a", events(seq, [seq])) for i, seq in ((0, 2), (1, 3))}
    go = threading.Barrier(2)
    commits: dict[int, object] = {}

    def land(i: int, seq: int) -> None:
        go.wait()
        try:
            commits[seq] = tables[i].commit_window(TOPIC, staged[seq], tag(seq, "a")).version
        except deltalake.exceptions.CommitFailedError:
            commits[seq] = "refused"

    racers = [threading.Thread(target=land, args=(i, seq)) for i, seq in ((0, 2), (1, 3))]
    for t in racers:
        t.start()
    for t in racers:
        t.join()
    landed = {seq for seq, v in commits.items() if v != "refused"}
    assert landed and sorted(commits[seq] for seq in landed) == list(range(1, len(landed) + 1))
    assert set(ids_by_window(tables[0].scan_arrow(TOPIC))) == {window_id_for(seq) for seq in {1, *landed}}
    for seq in {2, 3} - landed:  # the refused run, retried
        tables[0].commit_window(TOPIC, staged[seq], tag(seq, "a"))
    assert ids_by_window(tables[0].scan_arrow(TOPIC)) == {"0000000001": [1], "0000000002": [2], "0000000003": [3]}


def test_state_table_merge_and_as_of_on_s3(s3_server, s3_prefix):
    uri = "s3a" + f"{s3_prefix}/state/t.public.orders"[len("s3") :]
    state = DeltaStateTable(uri)
    assert state.name.startswith("s3://") and not state.exists()
    rows = pa.table({"id": pa.array([1, 2, 3], pa.int32()), "status": ["new", "new", "new"]})
    state.overwrite(rows, tag(1, "a"), keys=["id"])
    changed = pa.table({"id": pa.array([2, 4], pa.int32()), "status": ["paid", "new"], "note": ["rush", None]})
    merged = state.commit_merge(changed, pa.table({"id": pa.array([1, 2], pa.int32())}), tag(2, "a"), keys=["id"])
    assert merged.version == 1 and state.current_window_seq() == 2

    def by_id(table: pa.Table) -> dict:
        return {r["id"]: (r["status"], r.get("note")) for r in table.to_pylist()}

    assert by_id(state.read_version()) == {2: ("paid", "rush"), 3: ("new", None), 4: ("new", None)}
    assert by_id(state.read_keys(["id"], pa.table({"id": pa.array([2, 9], pa.int32())}))) == {2: ("paid", "rush")}
    # as_of window 1: time travel to the version tagged with it.
    assert state.version_for_window(1) == 0
    assert by_id(state.read_version(state.version_for_window(1))) == {
        1: ("new", None),
        2: ("new", None),
        3: ("new", None),
    }
    files = state.data_files()
    assert files and all(f.startswith(state.name + "/") for f in files)
    frame = pl.read_delta(state.name, storage_options=object_store.delta_storage_options(state.name))
    assert sorted(frame["id"].to_list()) == [2, 3, 4]
    with pytest.raises(CdcStateError, match="no version of window 0"):
        state.version_for_window(0)


@pytest.mark.spark
@pytest.mark.slow  # ~25 s: a Spark snapshot and two state jobs (MERGE on S3)
def test_a_capture_lands_delta_tables_and_their_current_state_on_s3(db15, spark, s3_server, s3_prefix, monkeypatch):
    """A PostgreSQL snapshot (Spark tasks) and a stream window into Delta tables on S3, read back
    with the product, Polars and DuckDB from the store (the window killed once between its table
    commit and its log entry, then run again: nothing lost or duplicated); the current state by
    Delta MERGE on S3, ``as_of`` the snapshot by time travel; maintenance on the store leaves
    every read unchanged."""
    from airflow_provider_cdc.cdc.basics import faults
    from airflow_provider_cdc.cdc.basics.errors import CdcTransientError
    from airflow_provider_cdc.cdc.basics.naming import Topic
    from airflow_provider_cdc.cdc.jobs import run_window_job
    from airflow_provider_cdc.cdc.planning.spec import StateJobSpec
    from airflow_provider_cdc.cdc.sinks.reader import read_topic_arrow
    from airflow_provider_cdc.cdc.sources.postgres import admin
    from airflow_provider_cdc.cdc.state.jobs import run_state_job
    from airflow_provider_cdc.cdc.state.tables import state_table
    from tests.support.databases import snapshot_window, stream_window
    from tests.support.oracle import assert_same_state, replay, source_rows

    db = db15
    db.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 30) g"
    )
    db.setup_capture(["public.t"])
    sink = "s3a" + s3_prefix[len("s3") :]  # the capture's scheme as Hadoop users write it
    options = {"sink_format": "delta", "object_store": s3_server.access()}
    topic = Topic.for_table("t", "public", "t")
    snapshot = run_window_job(db.spec(["public.t"], snapshot_window(1), sink, **options))
    # The current state: a Delta table on S3, after the snapshot, then by MERGE after the window.
    state_path = f"{sink}/state"
    spec = StateJobSpec(
        topic_prefix="t",
        sink_path=sink,
        state_path=state_path,
        topics=((topic.name, topic.directory),),
        sink_format="delta",
        object_store=s3_server.access(),
    )
    assert [r["action"] for r in run_state_job(spec)] == ["applied"]

    with db.connect() as conn:
        admin.advance_slot(conn, db.slot, snapshot.window.to_lsn)
        conn.execute("UPDATE t SET v = 'changed' WHERE id <= 5")
        conn.execute("DELETE FROM t WHERE id > 27")
        conn.execute("ALTER TABLE t ADD COLUMN note text")
        conn.execute("INSERT INTO t VALUES (100, 'new', 'gift')")
    window = stream_window(2, snapshot.window.to_lsn, db.current_lsn())
    # Killed after its first table commit, before the commit-log entry; then run again.
    monkeypatch.setattr(faults, "_hits", Counter())  # fault counts are per process
    monkeypatch.setenv(faults.ENV, "sink.table_committed:raise:1")
    with pytest.raises(CdcTransientError):
        run_window_job(db.spec(["public.t"], window, sink, **options))
    monkeypatch.delenv(faults.ENV)
    second = run_window_job(db.spec(["public.t"], window, sink, **options))
    assert second.dataset("t.public.t").ops == {"u": 5, "d": 3, "c": 1}

    tables = table_format("delta", sink, "t")
    table_uri = tables.table_uri(topic)
    assert table_uri == f"{s3_prefix}/{topic.directory}"
    assert s3_server.keys(BUCKET, f"{_key(table_uri)}/_delta_log/")
    events = read_topic_arrow(sink, "t", "t.public.t")
    with db.connect() as conn:
        source = source_rows(conn, "public.t", ["id"])
    assert_same_state(replay(events.to_pylist(), ["id"]), source)
    delta_options = object_store.delta_storage_options(table_uri)
    frame = pl.scan_delta(table_uri, storage_options=delta_options).collect()
    assert frame.height == events.num_rows == 30 + 9
    dataset = deltalake.DeltaTable(table_uri, storage_options=delta_options).to_pyarrow_dataset()
    ops = duckdb.connect().register("events", dataset).sql("SELECT op, count(*) FROM events GROUP BY op ORDER BY op")
    assert ops.fetchall() == [("c", 1), ("d", 3), ("r", 30), ("u", 5)]

    assert [r["action"] for r in run_state_job(spec)] == ["applied"]  # MERGE of window 2
    state = state_table("delta", state_path, "t", topic, None)
    assert state.name == f"{s3_prefix}/state/{topic.directory}"
    current = {r["id"]: (r["v"], r["note"]) for r in state.read_version().to_pylist()}
    assert current == {k[0]: (r["v"], r["note"]) for k, r in source.items()}
    # as_of the snapshot: time travel to the version tagged with window 1.
    (as_of,) = run_state_job(StateJobSpec(**{**spec.__dict__, "as_of_seq": 1}))
    assert (as_of["action"], as_of["rows"]) == ("time_travel", 30)
    snapshot_state = state.read_version(state.version_for_window(1))
    assert snapshot_state.num_rows == 30 and set(snapshot_state.column("v").to_pylist()) == {
        f"v{i}" for i in range(1, 31)
    }

    # Maintenance on the store (compaction, vacuum): the events and the state read the same.
    tables.maintain(topic, compact=True, retain_hours=0)
    assert len(tables.data_files(topic)) == 1
    # The killed attempt's and the compacted files are gone from the bucket: only the table's file.
    objects = {k for k in s3_server.keys(BUCKET, _key(table_uri) + "/") if "/_delta_log/" not in k}
    assert {f"s3://{BUCKET}/{k}" for k in objects if not k.endswith("/")} == set(tables.data_files(topic))
    assert _canonical(read_topic_arrow(sink, "t", "t.public.t")) == _canonical(events)
    assert pl.scan_delta(table_uri, storage_options=delta_options).collect().height == events.num_rows


def test_the_stores_error_answers_never_show_the_keys(s3_server, s3_prefix):
    """delta-rs's errors quote the store's answer, and the answer quotes the request (AWS's
    ``SignatureDoesNotMatch`` the access key id, SeaweedFS the resource path): here an unknown key
    id that is also a directory of the path stands for it; every message shows it masked."""
    key = "cdc-unknown-key-7f3e"
    access = dataclasses.replace(s3_server.access(), access_key_id=key)
    base = f"{s3_prefix}/{key}"
    with object_store.using(access):
        calls = (
            lambda: DeltaTables(base, PREFIX).exists(TOPIC),
            lambda: time_travel_version(f"{base}/{TOPIC.directory}", 1),
            lambda: DeltaStateTable(f"{base}/state").overwrite(events(1, [1]), tag(1, "a")),
        )
        for call in calls:
            with pytest.raises(Exception) as raised:  # the clients' own error types
                call()
            message = str(raised.value)
            assert "403" in message and key not in message and "***" in message, message
            assert raised.value.__suppress_context__ and access.secret_access_key not in message
