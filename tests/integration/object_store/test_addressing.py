"""S3 addressing (issue 31, review finding 3): every engine (Arrow, obstore, delta-rs, pyiceberg)
addresses the same bucket. An ``aws`` connection with an ``endpoint_url`` and no addressing style
(boto3's ``auto``, how S3-compatible stores are usually configured) is path-style everywhere; an
explicit ``virtual`` style puts the bucket in the host name for every engine."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from airflow_provider_cdc.cdc.sinks import object_store
from airflow_provider_cdc.cdc.sinks.path_checks import check_writable
from tests.support.s3_server import ADMIN, BUCKET


def _buckets(s3_server) -> set[str]:
    return {b["Name"] for b in s3_server.client().list_buckets()["Buckets"]}


def _every_engine_writes(uri: str) -> None:
    """The setup probe, a commit-log publish (obstore), an Arrow write, a Delta table and an
    Iceberg FileIO write under ``uri``, with the active access."""
    from deltalake import DeltaTable, write_deltalake
    from pyiceberg.io.pyarrow import PyArrowFileIO

    check_writable(uri)
    object_store.put_if_absent(f"{uri}/_cdc_log/app/000001.json", b"{}")
    fs, path = object_store.filesystem(uri)
    with fs.open_output_stream(f"{path}/arrow.txt") as out:
        out.write(b"arrow")
    names = [i.base_name for i in fs.get_file_info(pafs.FileSelector(f"{path}/_cdc_log/app"))]
    assert names == ["000001.json"]  # Arrow reads where obstore wrote
    table_uri = f"{uri}/delta"
    write_deltalake(table_uri, pa.table({"id": [1]}), storage_options=object_store.delta_storage_options(table_uri))
    read = DeltaTable(table_uri, storage_options=object_store.delta_storage_options(table_uri))
    assert read.to_pyarrow_table().column("id").to_pylist() == [1]
    io = PyArrowFileIO(object_store.iceberg_io_properties(uri))
    with io.new_output(f"{uri}/iceberg.txt").create(overwrite=True) as out:
        out.write(b"iceberg")


def _expected_keys(prefix_key: str) -> set[str]:
    return {f"{prefix_key}/_cdc_log/app/000001.json", f"{prefix_key}/arrow.txt", f"{prefix_key}/iceberg.txt"}


def test_an_endpoint_without_an_addressing_style_is_path_style_for_every_engine(s3_server, s3_prefix, monkeypatch):
    from airflow_provider_cdc.captures.object_store_connection import object_store_access

    extra = {k: v for k, v in s3_server.connection_extra().items() if k != "config_kwargs"}  # no style: 'auto'
    connection = {"conn_type": "aws", "login": ADMIN[0], "password": ADMIN[1], "extra": extra}
    monkeypatch.setenv("AIRFLOW_CONN_LAKE_AUTO_STYLE", json.dumps(connection))
    access = object_store_access("lake_auto_style")
    before = _buckets(s3_server)
    with object_store.using(access):
        _every_engine_writes(s3_prefix)
    assert _buckets(s3_server) == before  # nothing went to a bucket named after the prefix
    key = object_store.split_bucket(s3_prefix)[1]
    keys = set(s3_server.keys(BUCKET, key))
    assert _expected_keys(key) <= keys, keys
    assert any(k.startswith(f"{key}/delta/_delta_log/") for k in keys), keys


def test_an_explicit_virtual_style_puts_the_bucket_in_the_host_for_every_engine(s3_server, s3_prefix, monkeypatch):
    # The server answers http://lake.localhost:<port> (tests/support/s3_server.py). Arrow's curl
    # resolves *.localhost itself; the Rust clients (obstore, delta-rs) reach it through a
    # forwarder as their HTTP proxy, which records the Host each request named.
    from dataclasses import replace

    from tests.support.s3_server import VIRTUAL_HOST_DOMAIN, Forwarder

    port = s3_server.endpoint_url.rsplit(":", 1)[1]
    access = replace(s3_server.access(), endpoint_url=f"http://{VIRTUAL_HOST_DOMAIN}:{port}", path_style=False)
    before = _buckets(s3_server)
    proxy = Forwarder(s3_server.endpoint_url)
    for name in ("http_proxy", "HTTP_PROXY"):
        monkeypatch.setenv(name, proxy.endpoint_url)
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    try:
        with object_store.using(access):
            _every_engine_writes(s3_prefix)
    finally:
        monkeypatch.undo()  # the proxy settings (boto3 would use them too)
        proxy.close()
    assert _buckets(s3_server) == before
    key = object_store.split_bucket(s3_prefix)[1]
    keys = set(s3_server.keys(BUCKET, key))
    assert _expected_keys(key) <= keys, keys
    assert any(k.startswith(f"{key}/delta/_delta_log/") for k in keys), keys
    hosts = {host for _, host, _ in proxy.seen}
    paths = [path for _, _, path in proxy.seen]
    assert hosts == {f"{BUCKET}.{VIRTUAL_HOST_DOMAIN}:{port}"}, hosts  # obstore's and delta-rs's requests
    assert any("_cdc_log" in p for p in paths) and any("_delta_log" in p for p in paths), paths
    assert not any(p.startswith(f"/{BUCKET}/") for p in paths), paths


def test_virtual_style_needs_a_host_name_endpoint():
    with pytest.raises(Exception, match=r"virtual-hosted.*host name.*addressing_style.*path"):
        object_store.ObjectStoreAccess(endpoint_url="http://127.0.0.1:9000", path_style=False)
    # Path style (explicit or by default with an endpoint) is fine with an address.
    assert object_store.ObjectStoreAccess(endpoint_url="http://127.0.0.1:9000").uses_path_style
