"""A malicious Iceberg REST catalog: a real HTTP server on 127.0.0.1 answering with the
attacker's config and table, and the stdlib gadgets it names (see
``tests/integration/test_iceberg_metadata_attacks.py``)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pyarrow as pa


def table_metadata(tmp_path: Path, properties: dict[str, str]) -> dict[str, Any]:
    """Valid Iceberg table metadata (made by pyiceberg in a scratch catalog) with ``properties``."""
    from pyiceberg.catalog.sql import SqlCatalog

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    catalog = SqlCatalog("scratch", uri=f"sqlite:///{scratch}/c.db", warehouse=f"file://{scratch}")
    catalog.create_namespace(("x",))
    table = catalog.create_table(("x", "t"), schema=pa.schema([("window_id", pa.string())]))
    doc = json.loads(Path(table.metadata_location.removeprefix("file://")).read_text())
    doc["properties"] = properties
    return doc


@contextmanager
def malicious_catalog(config: dict[str, Any], metadata: dict[str, Any], table_config: dict[str, str]) -> Iterator[str]:
    """An Iceberg REST catalog on 127.0.0.1 answering with the attacker's config and table."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def send(self, obj: Any) -> None:
            body = json.dumps(obj).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_HEAD(self) -> None:
            self.send_response(204)
            self.end_headers()

        def do_GET(self) -> None:
            if self.path.startswith("/v1/config"):
                return self.send(config)
            if "/tables/" in self.path:
                location = metadata["location"] + "/metadata/00000-forged.metadata.json"
                return self.send({"metadata-location": location, "metadata": metadata, "config": table_config})
            return self.send({"namespaces": []})

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


#: Where the server names a class: its config's ``auth`` (``subprocess.Popen``, instantiated while
#: pyiceberg constructs the catalog), its config's ``overrides``, the table's metadata or the table
#: response's ``config`` (``py-io-impl``: ``subprocess.getoutput``, called with the properties,
#: whose first key, from the config's ``defaults``, is a shell command).
VECTORS = ("config-auth", "config-file-io", "metadata-file-io", "table-config-file-io")


def server_vectors(
    tmp_path: Path, vectors: tuple[str, ...] = VECTORS
) -> tuple[dict[str, Any], dict[str, Any], dict[str, str], list[Path]]:
    """The config, table metadata and table config of a server trying ``vectors``, and the
    marker files their commands write."""
    marker = {name: tmp_path / f"marker-{name}" for name in vectors}
    defaults: dict[str, Any] = {}
    if set(vectors) - {"config-auth"}:
        command = " ; ".join(f"touch {marker[v]}" for v in vectors if v != "config-auth")
        defaults[f"{command} ; echo"] = "x"  # first key: what subprocess.getoutput(dict) runs
    if "config-auth" in vectors:
        defaults["auth"] = {
            "type": "custom",
            "impl": "subprocess.Popen",  # AuthManagerFactory.create: Popen(args=..., shell=True)
            "custom": {"args": f"touch {marker['config-auth']}", "shell": True},
        }
    getoutput = {"py-io-impl": "subprocess.getoutput"}
    config = {"defaults": defaults, "overrides": getoutput if "config-file-io" in vectors else {}}
    metadata = table_metadata(tmp_path, getoutput if "metadata-file-io" in vectors else {})
    table_config = getoutput if "table-config-file-io" in vectors else {}
    return config, metadata, table_config, list(marker.values())
