"""Iceberg on S3 (SeaweedFS): the sink's tables, the current-state tables, ``as_of`` and
maintenance, with a pyiceberg SQL catalog in the suite's PostgreSQL and every file in the bucket
through pyiceberg's ``PyArrowFileIO``; read back with the product and with Polars from the store."""

from __future__ import annotations

import uuid
import warnings

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.basics.naming import Topic
from airflow_provider_cdc.cdc.basics.window import window_id_for
from airflow_provider_cdc.cdc.sinks import object_store
from airflow_provider_cdc.cdc.sinks.formats import WindowTag, check_iceberg_catalog, check_table_sink
from airflow_provider_cdc.cdc.sinks.lake_tables import table_format
from tests.support.s3_server import ADMIN, BUCKET


@pytest.fixture
def sql_catalog(db15) -> dict[str, str]:
    """pyiceberg SQL catalog properties on a fresh PostgreSQL database (SQLAlchemy + psycopg 3)."""
    cluster = db15.cluster
    uri = f"postgresql+psycopg://{cluster.superuser}:{cluster.password}@{cluster.host}:{cluster.port}/{db15.name}"
    return {"type": "sql", "uri": uri}


def _key(uri: str) -> str:
    return object_store.split_bucket(uri)[1]


def _tag(seq: int, prefix: str = "t") -> WindowTag:
    return WindowTag(prefix, seq, window_id_for(seq), "stream", None, None, uuid.uuid4().hex[:16])


def _stage(table_uri: str, seq: int, ids: list[int]) -> str:
    """A window attempt's Parquet file in the bucket, where the window writer stages it."""
    rows = pa.table(
        {"id": pa.array(ids, pa.int64()), "name": [f"n{i}" for i in ids], "window_id": [window_id_for(seq)] * len(ids)}
    )
    uri = f"{table_uri}/window={window_id_for(seq)}/attempt={uuid.uuid4().hex[:8]}/part-00000.parquet"
    fs, path = object_store.filesystem(uri)
    pq.write_table(rows, path, filesystem=fs)
    return uri


def _polars_scan(s3_server, metadata_location: str):
    """Polars' scan of the table at its metadata file (pyiceberg's property names for the store)."""
    import polars as pl

    options = {
        "s3.endpoint": s3_server.endpoint_url,
        "s3.access-key-id": ADMIN[0],
        "s3.secret-access-key": ADMIN[1],
        "s3.region": "us-east-1",
        "s3.force-virtual-addressing": "false",
    }
    with warnings.catch_warnings():  # "install polars_iceberg": planning with pyiceberg is fine here
        warnings.simplefilter("ignore", pl.exceptions.PerformanceWarning)
        return pl.scan_iceberg(metadata_location, storage_options=options).collect()


def test_sink_tables_commit_read_and_maintain_in_the_bucket(s3_server, s3_prefix, sql_catalog):
    tables = table_format("iceberg", s3_prefix, "t", sql_catalog)
    topic = Topic.for_table("t", "public", "orders")
    table_uri = tables.table_uri(topic)
    assert table_uri.startswith(f"s3://{BUCKET}/")
    for seq, ids in ((1, [1, 2, 3]), (2, [4, 5]), (3, [6])):
        commit = tables.commit_window(topic, [_stage(table_uri, seq, ids)], _tag(seq))
        assert commit is not None and commit.rows_added == len(ids)
    assert sorted(tables.scan_arrow(topic).column("id").to_pylist()) == [1, 2, 3, 4, 5, 6]
    assert sorted(tables.window_commits(topic)) == [1, 2, 3]
    assert tables.holds_window(topic, 2)
    assert all(f.startswith(table_uri) for f in tables.data_files(topic))

    # A third-party reader, from the store: Polars through the table's current metadata file.
    metadata = tables.load(topic).metadata_location
    assert metadata.startswith(table_uri)
    polars_rows = _polars_scan(s3_server, metadata)
    assert sorted(polars_rows["id"].to_list()) == [1, 2, 3, 4, 5, 6]

    before = set(s3_server.keys(BUCKET, _key(table_uri)))
    done = tables.maintain(topic, compact=True, retain_hours=0)
    assert done["files_compacted"] == 3 and done["files_written"] == 1
    assert done["snapshots_expired"] >= 3 and done["files_deleted"] == 3
    assert sorted(tables.scan_arrow(topic).column("id").to_pylist()) == [1, 2, 3, 4, 5, 6]
    after = set(s3_server.keys(BUCKET, _key(table_uri)))
    gone = {k for k in before - after if k.endswith("part-00000.parquet")}
    assert len(gone) == 3  # the windows' own files, deleted
    assert not [k for k in after if k.endswith("/")]  # and no empty "directory" marker objects
    (data,) = tables.data_files(topic)
    assert _key(data) in after and "compacted-" in data


def test_a_retried_window_replaces_its_files_in_the_bucket(s3_server, s3_prefix, sql_catalog):
    tables = table_format("iceberg", s3_prefix, "t", sql_catalog)
    topic = Topic.for_table("t", "public", "orders")
    table_uri = tables.table_uri(topic)
    tables.commit_window(topic, [_stage(table_uri, 1, [1, 2])], _tag(1))
    # A retry whose file has a type the table must conform (int32 → rewritten beside it in the bucket).
    rows = pa.table(
        {
            "id": pa.array([1, 2, 7], pa.int64()),
            "name": ["a", "b", "c"],
            "extra": pa.array([1, 2, 3], pa.uint16()),
            "window_id": [window_id_for(1)] * 3,
        }
    )
    uri = f"{table_uri}/window={window_id_for(1)}/attempt=retry/part-00000.parquet"
    fs, path = object_store.filesystem(uri)
    pq.write_table(rows, path, filesystem=fs)
    tables.commit_window(topic, [uri], _tag(1))
    assert sorted(tables.scan_arrow(topic).column("id").to_pylist()) == [1, 2, 7]
    (data,) = tables.data_files(topic)
    assert data.endswith(".conformed.parquet") and _key(data) in s3_server.keys(BUCKET, _key(table_uri))


def _forge_manifest(s3_server, table, manifest, forged: list[str], tmp_path) -> None:
    """What whoever may write the bucket can do: replace a manifest object with one whose entries
    name ``forged`` files."""
    local = tmp_path / f"forged-{uuid.uuid4().hex[:8]}.avro"
    _write_forged_manifest(table, manifest, forged, local)
    s3_server.client().put_object(Bucket=BUCKET, Key=_key(manifest.manifest_path), Body=local.read_bytes())


def _write_forged_manifest(table, manifest, forged: list[str], local) -> None:
    """``manifest`` with entries naming ``forged`` files (the first entry's statistics kept), as
    the local file ``local``, written with pyiceberg's own writer."""
    from pyiceberg.io.pyarrow import PyArrowFileIO
    from pyiceberg.manifest import write_manifest

    entries = manifest.fetch_manifest_entry(table.io, discard_deleted=False)
    output = PyArrowFileIO().new_output(str(local))
    spec = table.specs()[manifest.partition_spec_id]
    with write_manifest(2, spec, table.schema(), output, manifest.added_snapshot_id, "deflate") as writer:
        for path in forged:
            entry = entries[0]
            entry.data_file[1] = path  # DataFile's file_path
            writer.add_entry(entry)


def _exists(s3_server, uri: str) -> bool:
    return _key(uri) in s3_server.keys(BUCKET, _key(uri))


def test_a_forged_manifest_makes_neither_maintenance_delete_nor_the_fold_read_outside_the_table(
    s3_server, s3_prefix, tmp_path
):
    """Another capture's object in the bucket and a file on the worker, named by a forged manifest
    of this table: expiry refuses to delete them, ``data_files`` (the state fold's files) to list them."""
    from airflow_provider_cdc.cdc.basics.errors import CdcStateError

    tables = table_format("iceberg", s3_prefix, "t", {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db"})
    topic = Topic.for_table("t", "public", "orders")
    table_uri = tables.table_uri(topic)
    other = f"{s3_prefix}/other-capture/t.public.orders/window={window_id_for(1)}/attempt=a/part-00000.parquet"
    fs, path = object_store.filesystem(other)
    rows = pa.table({"id": [99], "name": ["other capture's row"], "window_id": [window_id_for(1)]})
    pq.write_table(rows, path, filesystem=fs)
    local = tmp_path / "worker-file.parquet"
    local.write_bytes(b"the worker's own file")
    forged = [other, f"file://{local}", f"{table_uri}/../other-capture/x.parquet"]

    tables.commit_window(topic, [_stage(table_uri, 1, [1, 2])], _tag(1))
    (first,) = tables.load(topic).current_snapshot().manifests(tables.load(topic).io)
    tables.commit_window(topic, [_stage(table_uri, 1, [3])], _tag(1))  # a retry: only the first snapshot names it
    _forge_manifest(s3_server, tables.load(topic), first, forged, tmp_path)
    with pytest.raises(CdcStateError, match="outside the table") as refused:
        tables.maintain(topic, compact=False, retain_hours=0)
    assert other in str(refused.value)
    assert _exists(s3_server, other) and local.exists()

    # The current snapshot's manifest forged: the files the state fold reads are refused, not read.
    table = tables.load(topic)
    current = next(m for m in table.current_snapshot().manifests(table.io) if m.added_files_count)
    _forge_manifest(s3_server, table, current, [other], tmp_path)
    with pytest.raises(CdcStateError, match="outside the table"):
        tables.data_files(topic)
    with pytest.raises(CdcStateError, match="outside the table"):
        tables.scan_arrow(topic)
    # And a state table's (the fold reads its files to merge into it).
    from airflow_provider_cdc.cdc.state.iceberg_table import IcebergStateTable

    catalog = {"name": "cdc", "type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db"}
    state = IcebergStateTable(catalog, ("t_state", "public", "orders"), f"{s3_prefix}/state/t.public.orders")
    state.overwrite(pa.table({"id": [1], "name": ["a"]}), _tag(1), keys=["id"])
    (manifest,) = state._table().current_snapshot().manifests(state._table().io)
    _forge_manifest(s3_server, state._table(), manifest, [other], tmp_path)
    with pytest.raises(CdcStateError, match="outside the table"):
        state.data_files()
    assert _exists(s3_server, other)


def test_a_forged_manifest_of_a_local_sink_deletes_and_lists_nothing_outside_it(tmp_path):
    """The same refusals for a local sink (its SQLite catalog): a worker file named by path, by
    ``file://`` URI, through ``..`` or through a link planted in the table's directory."""
    from pathlib import Path

    from airflow_provider_cdc.cdc.basics.errors import CdcStateError

    secret = tmp_path / "outside" / "secret.parquet"
    secret.parent.mkdir()
    pq.write_table(pa.table({"id": [99], "name": ["not the capture's"], "window_id": [window_id_for(1)]}), secret)
    tables = table_format("iceberg", str(tmp_path / "lake"), "t")
    topic = Topic.for_table("t", "public", "orders")
    table_uri = tables.table_uri(topic)

    def stage(ids: list[int]) -> str:
        path = Path(table_uri, f"window={window_id_for(1)}", f"attempt={uuid.uuid4().hex[:8]}", "part-00000.parquet")
        path.parent.mkdir(parents=True)
        rows = pa.table({"id": ids, "name": ["n"] * len(ids), "window_id": [window_id_for(1)] * len(ids)})
        pq.write_table(rows, path)
        return str(path)

    def forge(manifest, forged: list[str]) -> None:
        local = tmp_path / "forged.avro"
        _write_forged_manifest(tables.load(topic), manifest, forged, local)
        Path(manifest.manifest_path.removeprefix("file://")).write_bytes(local.read_bytes())

    Path(table_uri).mkdir(parents=True)
    Path(table_uri, "link.parquet").symlink_to(secret)
    link = str(Path(table_uri, "link.parquet"))
    tables.commit_window(topic, [stage([1, 2])], _tag(1))
    (first,) = tables.load(topic).current_snapshot().manifests(tables.load(topic).io)
    tables.commit_window(topic, [stage([3])], _tag(1))
    forge(first, [str(secret), f"file://{secret}", f"{table_uri}/../../outside/secret.parquet", link])
    with pytest.raises(CdcStateError, match="outside the table"):
        tables.maintain(topic, compact=False, retain_hours=0)
    assert secret.exists() and Path(link).is_symlink()

    table = tables.load(topic)
    current = next(m for m in table.current_snapshot().manifests(table.io) if m.added_files_count)
    for forged in (str(secret), link):
        forge(current, [forged])
        with pytest.raises(CdcStateError, match="outside the table"):
            tables.data_files(topic)
        with pytest.raises(CdcStateError, match="outside the table"):
            tables.scan_arrow(topic)


def test_state_table_merge_and_as_of_in_the_bucket(s3_server, s3_prefix, sql_catalog):
    from airflow_provider_cdc.cdc.state.iceberg_table import IcebergStateTable

    state = IcebergStateTable(
        {"name": "cdc", **sql_catalog}, ("t_state", "public", "orders"), f"{s3_prefix}/state/orders"
    )
    first = state.overwrite(pa.table({"id": [1, 2, 3], "v": ["a", "b", "c"]}), _tag(1), keys=["id"])
    state.commit_merge(pa.table({"id": [2, 4], "v": ["B", "d"]}), pa.table({"id": [2, 3]}), _tag(2), keys=["id"])
    assert sorted(state.read_version().to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "v": "a"},
        {"id": 2, "v": "B"},
        {"id": 4, "v": "d"},
    ]
    assert state.current_window_seq() == 2
    # as_of: time travel to the version of window 1, from the bucket.
    assert state.version_for_window(1) == first.version
    assert sorted(state.read_version(state.version_for_window(1)).column("v").to_pylist()) == ["a", "b", "c"]
    files = state.data_files()
    assert files and all(f.startswith(f"{s3_prefix}/state/orders/") for f in files)
    metadata = state._table().metadata_location
    rows = _polars_scan(s3_server, metadata)
    assert sorted(rows["v"].to_list()) == ["B", "a", "d"]


def test_the_access_wins_over_the_table_metadata_and_keys_stay_out_of_messages(s3_server, s3_prefix, sql_catalog):
    """A table's metadata (anyone who can write the bucket) cannot point its FileIO elsewhere:
    the capture's object-store access is what every table's FileIO uses."""
    tables = table_format("iceberg", s3_prefix, "t", sql_catalog)
    topic = Topic.for_table("t", "public", "orders")
    tables.commit_window(topic, [_stage(tables.table_uri(topic), 1, [1])], _tag(1))
    table = tables.load(topic)
    with table.transaction() as txn:
        txn.set_properties(
            {"s3.endpoint": "http://127.0.0.1:9", "s3.proxy-uri": "http://127.0.0.1:9", "s3.access-key-id": "forged"}
        )
    tables = table_format("iceberg", s3_prefix, "t", sql_catalog)
    assert tables.scan_arrow(topic).column("id").to_pylist() == [1]
    io_props = tables.load(topic).io.properties
    assert io_props["s3.endpoint"] == s3_server.endpoint_url and io_props["s3.access-key-id"] == ADMIN[0]
    assert "s3.proxy-uri" not in io_props

    # The wrong secret: the failure names neither key.
    wrong = object_store.ObjectStoreAccess(
        endpoint_url=s3_server.endpoint_url,
        region="us-east-1",
        path_style=True,
        access_key_id=ADMIN[0],
        secret_access_key="wrong-secret-9d2f",
    )
    with object_store.using(wrong), pytest.raises(Exception) as failure:
        table_format("iceberg", s3_prefix, "t", sql_catalog).scan_arrow(topic)
    assert "ACCESS_DENIED" in str(failure.value) and "wrong-secret-9d2f" not in str(failure.value)


def test_an_object_store_sink_needs_a_catalog(s3_prefix):
    with pytest.raises(CdcConfigurationError, match="table_catalog"):
        check_table_sink("iceberg", s3_prefix, {})
    with pytest.raises(CdcConfigurationError, match="table_catalog"):
        check_table_sink("iceberg", "s3a://lake/x", {})
    check_table_sink("iceberg", s3_prefix, {"type": "rest", "uri": "http://catalog"})
    check_table_sink("iceberg", s3_prefix, {}, catalog_conn_id="lake_catalog")
    check_table_sink("delta", s3_prefix, {})  # Delta keeps its log in the table
    check_table_sink("iceberg", "/tmp/lake", {})  # local: the SQLite catalog beside the sink
    with pytest.raises(CdcConfigurationError, match="state_path 's3://lake/state'"):
        check_iceberg_catalog("iceberg", "s3://lake/state", "state_path", has_catalog=False)
    # At DAG parse, a capture names the settings that fix it; a catalog connection is enough.
    from airflow_provider_cdc.captures.postgres import PostgresCapture

    settings = {"postgres_conn_id": "db", "tables": ["public.t"], "topic_prefix": "t", "sink_path": s3_prefix}
    with pytest.raises(CdcConfigurationError, match="table_catalog_conn_id"):
        PostgresCapture(**settings, sink_format="iceberg")
    PostgresCapture(**settings, sink_format="iceberg", table_catalog_conn_id="lake_catalog")
    # Below the parse check too: no SQLite catalog is made for a bucket (the sink's or the state's).
    with pytest.raises(CdcConfigurationError, match="table_catalog"):
        _ = table_format("iceberg", s3_prefix, "t").catalog
    from airflow_provider_cdc.cdc.state.tables import state_table

    state = None
    with pytest.raises(CdcConfigurationError, match="table_catalog"):
        state = state_table("iceberg", s3_prefix, "t", Topic.for_table("t", "public", "orders"), None)
    assert state is None


@pytest.mark.spark
def test_postgres_capture_lands_iceberg_tables_on_s3(db15, spark, s3_server, s3_prefix, sql_catalog):
    """A snapshot and a stream window into Iceberg tables in the bucket, the catalog in PostgreSQL;
    then the current state (Iceberg MERGE) in the bucket too, and ``as_of`` the snapshot."""
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
    access = s3_server.access()
    options = {"sink_format": "iceberg", "table_catalog": sql_catalog, "object_store": access}
    snapshot = run_window_job(db.spec(["public.t"], snapshot_window(1), s3_prefix, **options))
    topic = Topic.for_table("t", "public", "t")
    state_path = f"{s3_prefix}/state"
    spec = StateJobSpec(
        topic_prefix="t",
        sink_path=s3_prefix,
        state_path=state_path,
        topics=((topic.name, topic.directory),),
        sink_format="iceberg",
        table_catalog=sql_catalog,
        object_store=access,
    )
    assert [r["action"] for r in run_state_job(spec)] == ["applied"]  # the state at window 1 (an overwrite)
    with db.connect() as conn:
        admin.advance_slot(conn, db.slot, snapshot.window.to_lsn)
        conn.execute("UPDATE t SET v = 'changed' WHERE id <= 5")
        conn.execute("DELETE FROM t WHERE id > 27")
        conn.execute("INSERT INTO t VALUES (100, 'new')")
    window = stream_window(2, snapshot.window.to_lsn, db.current_lsn())
    assert run_window_job(db.spec(["public.t"], window, s3_prefix, **options)).dataset("t.public.t").ops == {
        "u": 5,
        "d": 3,
        "c": 1,
    }

    events = read_topic_arrow(s3_prefix, "t", "t.public.t", table_catalog=sql_catalog)
    with db.connect() as conn:
        source = source_rows(conn, "public.t", ["id"])
    assert_same_state(replay(events.to_pylist(), ["id"]), source)
    sink = table_format("iceberg", s3_prefix, "t", sql_catalog)
    assert _polars_scan(s3_server, sink.load(topic).metadata_location).height == events.num_rows == 30 + 9
    assert not s3_server.keys(BUCKET, _key(s3_prefix) + "/_cdc_catalog")  # the catalog is PostgreSQL's

    (second,) = run_state_job(spec)
    assert (second["action"], second["merge"]["action"], second["rows"]) == ("applied", "merged", 28)
    assert (second["merge"]["rows_written"], second["merge"]["rows_deleted"]) == (6, 3)  # only the keys changed
    state = state_table("iceberg", state_path, "t", topic, sql_catalog)
    assert all(f.startswith(state_path) for f in state.data_files())
    current = {r["id"]: r for r in state.read_version().to_pylist()}
    assert {k: v["v"] for k, v in current.items()} == {k[0]: r["v"] for k, r in source.items()}
    # as_of the snapshot: Iceberg time travel to the snapshot tagged with window 1, in the bucket.
    (as_of,) = run_state_job(StateJobSpec(**{**spec.__dict__, "as_of_seq": 1}))
    assert (as_of["action"], as_of["rows"]) == ("time_travel", 30)


def test_an_object_store_state_path_needs_a_catalog_at_parse(tmp_path):
    from airflow_provider_cdc.captures.postgres import PostgresCapture
    from airflow_provider_cdc.operators.current_state import CdcCurrentStateOperator

    capture = PostgresCapture(
        postgres_conn_id="pg",
        topic_prefix="shop",
        tables=["public.orders"],
        sink_path=str(tmp_path),
        sink_format="iceberg",
    )
    with pytest.raises(CdcConfigurationError, match="state_path 's3://lake/state' on an object store needs an Iceberg"):
        CdcCurrentStateOperator(task_id="state", capture=capture, state_path="s3://lake/state")
