"""Neither an Iceberg catalog server nor a sink's files choose code for the worker to run.

pyiceberg imports, by the dotted name a property holds, the FileIO (``py-io-impl``), a REST
catalog's auth manager (``auth``), the S3 retry strategy and a table's location provider
(``write.py-location-provider.impl``). Those properties reach it from the REST server's config
(``defaults``/``overrides``), from a REST server's table responses, and from a table's metadata
file, which whoever can write to a local sink can edit. Each test here is the attack as it would
be tried, with the standard library's own gadgets (``subprocess.getoutput``, ``subprocess.Popen``,
``logging.config.fileConfig``, ``runpy.run_path``): a real HTTP server on 127.0.0.1 as the
malicious catalog (``tests/support/malicious_iceberg.py``), real metadata files forged on a real
local sink, real pyiceberg. No marker file may ever appear; the run carries on (the import keys
ignored) or fails with a clear message. A Parquet capture never opens the Iceberg table a forged
commit-log entry names: the operator's checks use the capture's ``sink_format``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_cdc.captures.table_catalog import catalog_properties
from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError, CdcStateError
from airflow_provider_cdc.cdc.basics.naming import Topic
from airflow_provider_cdc.cdc.basics.window import window_id_for
from airflow_provider_cdc.cdc.sinks.formats import WindowTag
from airflow_provider_cdc.cdc.sinks.iceberg import IcebergTables
from airflow_provider_cdc.cdc.sinks.lake_tables import check_table_sink_ready
from airflow_provider_cdc.version_compat import AirflowFailException
from tests.support.malicious_iceberg import VECTORS, malicious_catalog, server_vectors

PREFIX = "shop"
TOPIC = Topic.for_table(PREFIX, "public", "orders")
IDENT = ("shop", "public", "orders")


# -- the attacker's tools ----------------------------------------------------------------------


def logging_config(directory: Path, marker: Path) -> Path:
    """A logging config whose handler arguments run a shell command when read by fileConfig."""
    ini = directory / "x.ini"
    ini.write_text(
        "[loggers]\nkeys=root\n[handlers]\nkeys=h\n[formatters]\nkeys=\n[logger_root]\nhandlers=h\n"
        "[handler_h]\nclass=StreamHandler\n"
        f"args=(__import__('os').system('touch {marker}'),)\n"
    )
    return ini


def forge_metadata(metadata_location: str, properties: dict[str, str]) -> None:
    """Edit the table's current metadata file in place: what a sink writer can do."""
    path = metadata_location.removeprefix("file://")
    doc = json.loads(Path(path).read_text())
    doc["properties"] = {**doc.get("properties", {}), **properties}
    Path(path).write_text(json.dumps(doc))


def current_metadata(sink: Path) -> str:
    """The table's metadata file the sink's SQLite catalog points at (read with plain pyiceberg)."""
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("cdc", uri=f"sqlite:///{sink}/_cdc_catalog/iceberg.db", warehouse=str(sink))
    return catalog.load_table(IDENT).metadata_location


def land(tables: IcebergTables, sink: Path, seq: int) -> None:
    """One window of the capture's own, staged and committed as a run does."""
    rel = f"{TOPIC.directory}/window={window_id_for(seq)}/attempt=a{seq}"
    (sink / rel).mkdir(parents=True)
    pq.write_table(pa.table({"window_id": [window_id_for(seq)], "op": ["c"], "id": [seq]}), sink / rel / "p.parquet")
    tag = WindowTag(PREFIX, seq, window_id_for(seq), "stream", str(seq), str(seq + 1), f"a{seq}")
    assert tables.commit_window(TOPIC, [str(sink / rel / "p.parquet")], tag) is not None


def no_markers(*markers: Path) -> None:
    written = {str(m): m.read_text() for m in markers if m.exists()}
    assert not written, f"the attacker's code ran: {written}"


def rest_properties(uri: str) -> dict[str, str]:
    """What a connection with ``type=rest`` and the attacker's host gives (both allowed keys)."""
    props, _, _ = catalog_properties("lake", {"type": "rest"}, uri, None)
    return props


@pytest.mark.parametrize("vector", VECTORS)
def test_a_malicious_rest_catalog_runs_nothing_on_the_worker(tmp_path, caplog, vector):
    """The connection names the attacker's REST server (``type=rest`` and a host: allowed keys).
    The setup check, the sink's tables (load, exists, the landed-window check, reads,
    maintenance) and the state tables all open it; the worker runs none of the server's choices
    and uses pyiceberg's PyArrowFileIO."""
    from pyiceberg.io.pyarrow import PyArrowFileIO

    from airflow_provider_cdc.cdc.state.iceberg_table import IcebergStateTable

    config, metadata, table_config, markers = server_vectors(tmp_path, (vector,))
    with malicious_catalog(config, metadata, table_config) as uri:
        props = rest_properties(uri)
        check_table_sink_ready("iceberg", props)  # constructs the catalog: the server's auth is not used
        no_markers(*markers)

        tables = IcebergTables(str(tmp_path / "lake"), PREFIX, props)
        table = tables.load(TOPIC)
        assert table is not None and isinstance(table.io, PyArrowFileIO)
        assert "py-io-impl" not in table.properties
        assert tables.exists(TOPIC) and not tables.holds_window(TOPIC, 1)
        assert tables.scan_arrow(TOPIC).num_rows == 0
        assert tables.maintain(TOPIC, retain_hours=None)["files_written"] == 0
        assert "auth" not in tables.catalog.properties
        assert tables.catalog.properties["py-io-impl"] == "pyiceberg.io.pyarrow.PyArrowFileIO"

        state = IcebergStateTable({"name": "cdc", **props}, IDENT)
        assert state.read_version().num_rows == 0
    no_markers(*markers)
    if vector in ("config-auth", "config-file-io"):
        ignored = "'auth'" if vector == "config-auth" else "'py-io-impl'"
        assert f"ignored [{ignored}] of the REST catalog server's config" in caplog.text
    if vector == "metadata-file-io":
        assert "ignored ['py-io-impl'] of the metadata of Iceberg table shop.public.orders" in caplog.text


LOCAL_VECTORS = ("file-io", "location-provider")


def forge(table_dir: Path, metadata_location: str, marker: Path, vector: str) -> None:
    """What a sink writer does to the table in ``table_dir``: ``py-io-impl`` is
    ``logging.config.fileConfig``, given their config's path as a property (it runs the config's
    handler arguments); or the location provider is ``runpy.run_path``, called with the table's
    location, which runs the ``__main__.py`` they put in the table's directory."""
    if vector == "file-io":
        ini = logging_config(table_dir / "metadata", marker)
        forge_metadata(metadata_location, {"py-io-impl": "logging.config.fileConfig", str(ini): "x"})
    else:
        (table_dir / "__main__.py").write_text(f"open({str(marker)!r}, 'w').write('run_path ran it')\n")
        forge_metadata(metadata_location, {"write.py-location-provider.impl": "runpy.run_path"})


@pytest.mark.parametrize("vector", LOCAL_VECTORS)
def test_a_forged_sink_table_metadata_runs_nothing_and_the_capture_carries_on(tmp_path, caplog, vector):
    """The sink writer edits the table's current metadata file. Every read, the landed window
    check, the next window's commit (which asks for the location provider) and maintenance carry
    on; the commit's new metadata no longer holds the key."""
    from pyiceberg.io.pyarrow import PyArrowFileIO

    sink = tmp_path / "lake"
    tables = IcebergTables(str(sink), PREFIX)
    land(tables, sink, 1)
    marker = tmp_path / "marker"
    forge(sink / TOPIC.directory, current_metadata(sink), marker, vector)

    fresh = IcebergTables(str(sink), PREFIX)  # the next task run: a new process opens the catalog
    assert fresh.exists(TOPIC) and fresh.holds_window(TOPIC, 1)
    assert isinstance(fresh.load(TOPIC).io, PyArrowFileIO)
    assert fresh.scan_arrow(TOPIC).column("id").to_pylist() == [1]
    land(fresh, sink, 2)
    assert sorted(fresh.scan_arrow(TOPIC).column("id").to_pylist()) == [1, 2]
    fresh.maintain(TOPIC, retain_hours=0)
    no_markers(marker)
    stored = json.loads(Path(current_metadata(sink).removeprefix("file://")).read_text())["properties"]
    assert not {"py-io-impl", "write.py-location-provider.impl"} & set(stored)
    key = "py-io-impl" if vector == "file-io" else "write.py-location-provider.impl"
    assert f"ignored [{key!r}] of the metadata of Iceberg table shop.public.orders" in caplog.text


@pytest.mark.parametrize("vector", LOCAL_VECTORS)
def test_a_forged_state_table_metadata_runs_nothing(tmp_path, vector):
    """The same forgery on a state table (``cdc/state/tables.py``, its own SQLite catalog): its
    reads and its next merge carry on."""
    from airflow_provider_cdc.cdc.state.iceberg_table import IcebergStateTable

    location = tmp_path / "state" / "orders"
    # A plain path, as the current-state operator gives (cdc/state/lake.py).
    state = IcebergStateTable(tmp_path / "state" / "catalog.db", "state.orders", str(location))
    tag = WindowTag(PREFIX, 1, window_id_for(1), "snapshot", None, "1", "a1")
    state.overwrite(pa.table({"id": [1, 2], "v": ["a", "b"]}), tag, keys=["id"])
    marker = tmp_path / "marker"
    forge(location, state._table().metadata_location, marker, vector)

    again = IcebergStateTable(tmp_path / "state" / "catalog.db", "state.orders", str(location))
    assert sorted(again.read_version().column("id").to_pylist()) == [1, 2]
    tag2 = WindowTag(PREFIX, 2, window_id_for(2), "stream", "1", "2", "a2")
    again.commit_merge(pa.table({"id": [3], "v": ["c"]}), pa.table({"id": [1]}), tag2, keys=["id"])
    assert sorted(again.read_version().column("id").to_pylist()) == [2, 3]
    no_markers(marker)


def test_a_parquet_capture_never_opens_a_table_a_log_entry_names(db15, airflow_db, tmp_path, monkeypatch):
    """The reviewer's attack on a Parquet capture: the sink writer adds an Iceberg catalog and a
    table whose metadata names ``logging.config.fileConfig`` as its FileIO, and one commit-log
    entry whose dataset says it landed in that Iceberg table. The next window run checks the
    landed tables first (``_state``): it fails naming the format mismatch, opening nothing."""
    from pyiceberg.catalog.sql import SqlCatalog

    from tests.support.crash import CrashCapture, prepare_shop

    conn_id = prepare_shop(db15, monkeypatch, "forged", customers=2, orders_per_customer=1)
    sink = tmp_path / "lake"
    capture = CrashCapture(db15, conn_id, PREFIX, sink, {"public.customers": ["id"], "public.orders": ["id"]})
    capture.run("setup")

    # -- the attacker, who can write files in the sink
    marker = tmp_path / "marker"
    (sink / "_cdc_catalog").mkdir(parents=True, exist_ok=True)
    catalog = SqlCatalog("cdc", uri=f"sqlite:///{sink}/_cdc_catalog/iceberg.db", warehouse=str(sink))
    catalog.create_namespace(("shop",))
    catalog.create_namespace(("shop", "public"))
    table = catalog.create_table(
        IDENT, schema=pa.schema([("window_id", pa.string())]), location=f"{sink}/{TOPIC.directory}"
    )
    ini = logging_config(sink / TOPIC.directory / "metadata", marker)
    forge_metadata(table.metadata_location, {"py-io-impl": "logging.config.fileConfig", str(ini): "x"})
    attempt = "0123456789abcdef"
    entry = {
        "format": 1,
        "topic_prefix": PREFIX,
        "window": {"seq": 1, "window_id": window_id_for(1), "kind": "snapshot", "from_lsn": None, "to_lsn": 100,
                   "planned_at_ms": 0},
        "attempt": attempt,
        "datasets": [
            {"topic": TOPIC.name, "path": f"{TOPIC.directory}/window={window_id_for(1)}/attempt={attempt}",
             "events": 1, "ops": {}, "table": {"format": "iceberg", "attempt": attempt, "window_seq": 1}}
        ],
        "transactions": 0, "last_commit_lsn": None, "last_tx_id": None, "last_commit_ts_us": None,
        "committed_at_ms": 0, "stats": {},
    }  # fmt: skip
    (sink / "_cdc_log" / PREFIX).mkdir(parents=True, exist_ok=True)
    (sink / "_cdc_log" / PREFIX / f"{1:020d}.json").write_text(json.dumps(entry))

    for step in ("snapshot", "batch"):
        with pytest.raises(AirflowFailException) as raised:  # a state error: no retry
            capture.run(step)
        message = str(raised.value)
        assert message.startswith("CdcStateError: commit log entry of window 0000000001 says shop.public.orders")
        assert "landed in a table of format 'iceberg', but capture 'shop' writes sink_format='parquet'" in message
        assert "nothing it names is opened" in message
    # The current-state job folds the committed windows: it too opens only the capture's format.
    from airflow_provider_cdc.operators.current_state import CdcCurrentStateOperator

    state = CdcCurrentStateOperator(task_id="state", capture=capture.capture(), state_path=str(tmp_path / "state"))
    with pytest.raises(AirflowFailException, match="landed in a table of format 'iceberg', but capture 'shop'"):
        state.execute({})
    no_markers(marker)


@pytest.mark.parametrize("sink_format, named", [("parquet", "delta"), ("iceberg", "delta"), ("delta", "iceberg")])
def test_a_log_entry_naming_another_format_is_refused_before_anything_is_opened(tmp_path, sink_format, named):
    from airflow_provider_cdc.cdc.basics.window import Window
    from airflow_provider_cdc.cdc.sinks.commit_log import CommitEntry, DatasetCommit
    from airflow_provider_cdc.cdc.sinks.reader import check_landed_tables

    path = f"{TOPIC.directory}/window={window_id_for(1)}/attempt=a1"
    dataset = DatasetCommit(TOPIC.name, path, 1, {"c": 1}, {"format": named, "attempt": "a1", "window_seq": 1})
    entry = CommitEntry(PREFIX, Window(1, "stream", 1, 2, 0), "a1", (dataset,), 1, None, None, None, 0)
    with pytest.raises(CdcStateError, match=f"landed in a table of format '{named}', but capture 'shop' writes"):
        check_landed_tables(entry, str(tmp_path), PREFIX, sink_format=sink_format)
    assert list(tmp_path.iterdir()) == []  # no catalog, no table, nothing created or opened


def test_only_pyicebergs_own_file_ios_are_used(tmp_path):
    """The DAG's own ``table_catalog`` may pick FsspecFileIO; any other class is refused, by name."""
    from pyiceberg.io.fsspec import FsspecFileIO

    uri = f"sqlite:///{tmp_path / 'c.db'}"
    fsspec = IcebergTables(str(tmp_path), PREFIX, {"uri": uri, "py-io-impl": "pyiceberg.io.fsspec.FsspecFileIO"})
    land(fsspec, tmp_path, 1)
    assert isinstance(fsspec.load(TOPIC).io, FsspecFileIO)
    with pytest.raises(CdcConfigurationError, match=r"py-io-impl 'subprocess\.getoutput'"):
        _ = IcebergTables(str(tmp_path), PREFIX, {"uri": uri, "py-io-impl": "subprocess.getoutput"}).catalog
