"""What lands is private to the user the tasks run as.

A sink holds full copies of the captured tables. Its root (and a state path's) is created 0700
when the product creates it, whatever the umask, so no other user can reach a file under it; a
SQLite catalog file is created 0600 before pyiceberg opens it. An existing root shared with a
group or everyone is kept (it may be shared on purpose) and setup warns about it.

Real PostgreSQL, real extraction runs that land Parquet, real pyiceberg and SQLite; when the
suite runs as root, "unreadable by others" is checked by reading as the ``nobody`` user.
"""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from airflow_provider_cdc.cdc.sinks.iceberg import IcebergTables
from airflow_provider_cdc.cdc.sinks.lake_tables import check_table_sink_ready
from airflow_provider_cdc.operators.query_extract import PostgresQueryExtractOperator


@contextmanager
def umask(mask: int):
    """The common ``022`` (files 0644, directories 0755) while the product creates its files."""
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def readable_by_others(root: Path) -> list[str]:
    """Every file under ``root`` another user can read: as root, what ``nobody`` reads; otherwise
    the files whose modes (and every directory's on the way from ``root``) let others read them."""
    files = [p for p in root.rglob("*") if p.is_file()]
    assert files, f"nothing landed under {root}"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("nobody")
        except KeyError:
            pytest.skip("no 'nobody' user to read as")
        above = subprocess.run(["ls", "--", str(root.parent)], user="nobody", capture_output=True, check=False, cwd="/")
        assert above.returncode == 0, above.stderr  # nobody gets as far as the root: the sink's modes decide
        readable = []
        for path in files:  # one at a time: which ones
            one = subprocess.run(["cat", "--", str(path)], user="nobody", capture_output=True, check=False, cwd="/")
            if one.returncode == 0:
                readable.append(str(path))
        return readable

    def reachable(path: Path) -> bool:  # others may enter every directory from the root down
        return all(mode(d) & 0o001 for d in (root, *(root / p for p in path.relative_to(root).parents[:-1])))

    return [str(p) for p in files if mode(p) & 0o004 and reachable(p)]


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory every user may enter, in one every user may enter (pytest's tmp_path is inside a
    0700 directory, which would hide everything from other users whatever the sink does)."""
    path = Path(tempfile.mkdtemp(prefix="cdc-modes-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def source(db15, monkeypatch):
    conn_id = f"fm_{db15.name}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", db15.cluster.airflow_uri(db15.name))
    db15.execute("CREATE TABLE items (id int PRIMARY KEY, v text, updated_at timestamptz NOT NULL DEFAULT now())")
    db15.execute("INSERT INTO items (id, v) SELECT g, 'secret row ' || g FROM generate_series(1, 50) g")
    return db15, conn_id


def extractor(conn_id: str, sink: Path | str) -> PostgresQueryExtractOperator:
    return PostgresQueryExtractOperator(
        task_id="extract",
        postgres_conn_id=conn_id,
        table="public.items",
        cursor_column="updated_at",
        topic_prefix="fm",
        sink_path=str(sink),
        offset_store="state_table",
        offset_table="public.fm_offsets",
    )


@pytest.mark.parametrize("form", ["plain", pytest.param("file_uri", marks=pytest.mark.spark)])  # Spark writes URIs
def test_a_fresh_sink_root_is_private_and_no_landed_file_is_readable_by_others(source, open_dir, form):
    _, conn_id = source
    root = open_dir / "lake" / "sink"  # the root and a parent, both missing
    with umask(0o022):
        result = extractor(conn_id, str(root) if form == "plain" else f"file://{root}").execute({})
    assert result["rows"] == 50
    assert any(root.rglob("*.parquet")) and any(root.rglob("*.json"))  # data and commit log landed
    assert mode(root) == 0o700
    assert mode(root.parent) == 0o755  # a parent it made has the usual mode: the root is what is private
    assert readable_by_others(root) == []


def test_an_existing_root_keeps_its_mode_and_setup_warns_that_others_may_enter_it(source, tmp_path, caplog):
    from airflow_provider_cdc.capture import PostgresCapture
    from airflow_provider_cdc.operators.setup import CdcSetupOperator

    db, conn_id = source
    shared, private, fresh = tmp_path / "shared", tmp_path / "private", tmp_path / "fresh"
    shared.mkdir(mode=0o750)
    shared.chmod(0o750)  # shared with a group on purpose
    private.mkdir(mode=0o700)

    def setup(sink: Path) -> list[str]:
        capture = PostgresCapture(
            postgres_conn_id=conn_id,
            tables=["public.items"],
            topic_prefix=f"fm_{sink.name}",
            sink_path=str(sink),
            slot_name=f"fm_{sink.name}_{db.name}"[:63],
            publication_name=f"fm_{sink.name}",
            offset_store="state_table",
            offset_table="public.fm_offsets",
        )
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            CdcSetupOperator(task_id="setup", capture=capture).execute({})
        return [r.getMessage() for r in caplog.records if "open to" in r.getMessage()]

    warned = setup(shared)
    assert len(warned) == 1, warned
    assert f"sink_path {str(shared)!r} is open to its group (mode 0750)" in warned[0]
    assert f"chmod 700 {str(shared)!r}" in warned[0]
    assert mode(shared) == 0o750  # a warning, not a change
    assert setup(private) == [] and setup(fresh) == []
    assert not fresh.exists()  # setup creates no sink

    with umask(0o022):
        extractor(conn_id, shared).execute({})
    assert mode(shared) == 0o750  # an existing root is left as the user made it


def test_sqlite_catalog_files_are_created_private(open_dir):
    """The default catalog beside the sink, and a connection's ``sqlite:///`` catalog opened by
    setup's check, are created 0600 (and their directory 0700) before SQLite writes to them."""
    tmp_path = open_dir
    with umask(0o022):
        tables = IcebergTables(str(tmp_path / "lake"), "shop")
        tables.catalog.create_namespace(("shop", "public"))
        named = tmp_path / "catalogs" / "named.db"
        named.parent.mkdir()
        check_table_sink_ready(
            "iceberg", {"type": "sql", "uri": f"sqlite:///{named}", "warehouse": f"file://{tmp_path}"}
        )
    catalog_dir = tmp_path / "lake" / "_cdc_catalog"
    assert mode(tmp_path / "lake") == 0o700 and mode(catalog_dir) == 0o700
    assert {p.name: mode(p) for p in catalog_dir.iterdir()} == {"iceberg.db": 0o600}
    assert {p.name: mode(p) for p in named.parent.iterdir() if p.name.startswith("named.db")} == {"named.db": 0o600}
    assert named.stat().st_size > 0  # SQLite made its catalog tables in the file created for it
