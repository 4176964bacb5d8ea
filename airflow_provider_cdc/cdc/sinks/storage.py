"""File operations the sink needs for its commit log, on a local path or any Hadoop URI.

The commit log needs one primitive beyond reading and listing: *publish a small file so that it
appears whole or not at all, and never replaces an existing one*. Locally that is write-to-temp
+ ``os.link`` (fails if the name exists); on Hadoop file systems it is create-temp + ``rename``,
which HDFS and the local Hadoop file system implement atomically and without overwriting. (On
object stores rename is a copy: the log stays correct under the one-writer-per-capture rule the
capture lock enforces, but is not atomic against a crash mid-copy; see docs/architecture.md.)

Plain paths use :class:`LocalStorage` and need no JVM. URIs with a scheme (``file://``,
``hdfs://``, ``s3a://``, ``abfss://`` ...) use :class:`HadoopStorage` through the Spark session's
Hadoop configuration inside jobs, so they work wherever Spark can write; outside Spark (the
operator reading the commit log) they use :class:`ArrowFsStorage`, Arrow's file systems.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from airflow_provider_cdc.cdc.errors import CdcConfigurationError


class Storage(Protocol):
    def uri(self, rel: str) -> str: ...

    def read_text(self, rel: str) -> str: ...

    def publish_text(self, rel: str, text: str) -> None:
        """Make ``rel`` appear atomically with ``text``; ``FileExistsError`` if it exists."""

    def list_names(self, rel_dir: str) -> list[str]: ...

    def delete_tree(self, rel: str) -> None: ...

    def exists(self, rel: str) -> bool: ...


def is_uri(base_path: str) -> bool:
    scheme = urlparse(base_path).scheme
    return len(scheme) > 1  # a Windows drive letter is not a scheme


def storage_for(base_path: str, spark_provider: Callable[[], Any] | None = None) -> Storage:
    if not base_path or not str(base_path).strip():
        raise CdcConfigurationError("sink_path is empty; give a local directory or a Hadoop URI")
    if is_uri(base_path):
        if spark_provider is None:
            return ArrowFsStorage(base_path)
        return HadoopStorage(base_path, spark_provider)
    return LocalStorage(base_path)


def check_writable(base_path: str) -> None:
    """Fail before anything is written when a local sink path cannot hold the sink.

    The path need not exist yet; its nearest existing ancestor must be a directory this process
    may create entries in. Hadoop URIs are left to their jobs (checking them needs the file system).
    """
    if not base_path or not str(base_path).strip():
        raise CdcConfigurationError("sink_path is empty; give a local directory or a Hadoop URI")
    if is_uri(base_path):
        return
    root = Path(base_path).expanduser().absolute()
    nearest = root
    while not nearest.exists() and nearest != nearest.parent:
        nearest = nearest.parent
    if nearest == root and not root.is_dir():
        raise CdcConfigurationError(
            f"sink_path {str(root)!r} exists and is not a directory: point sink_path at a directory"
        )
    if not nearest.is_dir():
        raise CdcConfigurationError(
            f"sink_path {str(root)!r} cannot be created: {str(nearest)!r} is a file, not a directory. "
            "Choose another sink_path"
        )
    if not os.access(nearest, os.W_OK | os.X_OK):
        raise CdcConfigurationError(
            f"sink_path {str(root)!r} is not writable: this process cannot create entries in "
            f"{str(nearest)!r}. Fix its permissions or choose another sink_path"
        )


class LocalStorage:
    def __init__(self, base_path: str | os.PathLike[str]):
        self.root = Path(base_path).expanduser().absolute()
        if self.root.exists() and not self.root.is_dir():
            raise CdcConfigurationError(f"sink_path {str(self.root)!r} exists and is not a directory")

    def uri(self, rel: str) -> str:
        return str(self.root / rel)

    def read_text(self, rel: str) -> str:
        return (self.root / rel).read_text(encoding="utf-8")

    def publish_text(self, rel: str, text: str) -> None:
        target = self.root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.parent / f".{target.name}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, target)  # atomic, and refuses to replace an existing entry
        finally:
            tmp.unlink(missing_ok=True)
        _fsync_dir(target.parent)

    def list_names(self, rel_dir: str) -> list[str]:
        path = self.root / rel_dir
        return sorted(p.name for p in path.iterdir()) if path.is_dir() else []

    def delete_tree(self, rel: str) -> None:
        shutil.rmtree(self.root / rel, ignore_errors=True)

    def exists(self, rel: str) -> bool:
        return (self.root / rel).exists()


class HadoopStorage:
    """Storage through Hadoop's FileSystem API of a running Spark session (via py4j)."""

    def __init__(self, base_uri: str, spark_provider: Callable[[], Any]):
        self.base_uri = base_uri.rstrip("/")
        self._spark_provider = spark_provider
        self._fs_cache: Any = None

    def _fs(self) -> tuple[Any, Any]:
        if self._fs_cache is None:
            spark = self._spark_provider()
            jvm = spark._jvm
            conf = spark._jsc.hadoopConfiguration()
            path_class = jvm.org.apache.hadoop.fs.Path
            fs = path_class(self.base_uri).getFileSystem(conf)
            self._fs_cache = (fs, path_class)
        return self._fs_cache

    def uri(self, rel: str) -> str:
        return f"{self.base_uri}/{rel}" if rel else self.base_uri

    def _path(self, rel: str) -> Any:
        _, path_class = self._fs()
        return path_class(self.uri(rel))

    def read_text(self, rel: str) -> str:
        fs, _ = self._fs()
        stream = fs.open(self._path(rel))
        try:
            jvm = self._spark_provider()._jvm
            buffer = jvm.java.io.ByteArrayOutputStream()
            jvm.org.apache.hadoop.io.IOUtils.copyBytes(stream, buffer, 65536, False)
            return bytes(buffer.toByteArray()).decode("utf-8")
        finally:
            stream.close()

    def publish_text(self, rel: str, text: str) -> None:
        fs, path_class = self._fs()
        target = self._path(rel)
        if fs.exists(target):
            raise FileExistsError(self.uri(rel))
        parent = target.getParent()
        fs.mkdirs(parent)
        tmp = path_class(parent, f".{target.getName()}.{uuid.uuid4().hex}.tmp")
        out = fs.create(tmp, False)
        try:
            out.write(bytearray(text.encode("utf-8")))
            out.hflush()
        finally:
            out.close()
        if not fs.rename(tmp, target):
            fs.delete(tmp, False)
            raise FileExistsError(self.uri(rel))

    def list_names(self, rel_dir: str) -> list[str]:
        fs, _ = self._fs()
        path = self._path(rel_dir)
        if not fs.exists(path):
            return []
        return sorted(status.getPath().getName() for status in fs.listStatus(path))

    def delete_tree(self, rel: str) -> None:
        fs, _ = self._fs()
        fs.delete(self._path(rel), True)

    def exists(self, rel: str) -> bool:
        fs, _ = self._fs()
        return bool(fs.exists(self._path(rel)))


class ArrowFsStorage:
    """Storage through ``pyarrow.fs`` (local, S3, GCS, HDFS, Azure), without a JVM."""

    #: Hadoop connector schemes and the Arrow file system that reads the same data.
    SCHEME_ALIASES = {"s3a": "s3", "s3n": "s3", "gcs": "gs", "abfss": "abfs"}

    def __init__(self, base_uri: str):
        from pyarrow import fs as pafs

        self.base_uri = base_uri.rstrip("/")
        parsed = urlparse(self.base_uri)
        scheme = self.SCHEME_ALIASES.get(parsed.scheme, parsed.scheme)
        try:
            self._fs, self._root = pafs.FileSystem.from_uri(scheme + self.base_uri[len(parsed.scheme) :])
        except (ValueError, OSError) as exc:
            raise CdcConfigurationError(f"cannot open sink_path {base_uri!r} outside Spark: {exc}") from None

    def uri(self, rel: str) -> str:
        return f"{self.base_uri}/{rel}" if rel else self.base_uri

    def _path(self, rel: str) -> str:
        return f"{self._root}/{rel}" if rel else self._root

    def read_text(self, rel: str) -> str:
        with self._fs.open_input_stream(self._path(rel)) as stream:
            return stream.read().decode("utf-8")

    def publish_text(self, rel: str, text: str) -> None:
        target = self._path(rel)
        if self.exists(rel):
            raise FileExistsError(self.uri(rel))
        parent = target.rsplit("/", 1)[0]
        self._fs.create_dir(parent, recursive=True)
        tmp = f"{parent}/.{uuid.uuid4().hex}.tmp"
        with self._fs.open_output_stream(tmp) as out:
            out.write(text.encode("utf-8"))
        self._fs.move(tmp, target)

    def list_names(self, rel_dir: str) -> list[str]:
        from pyarrow import fs as pafs

        infos = self._fs.get_file_info(pafs.FileSelector(self._path(rel_dir), allow_not_found=True))
        return sorted(info.base_name for info in infos)

    def delete_tree(self, rel: str) -> None:
        if self.exists(rel):
            self._fs.delete_dir(self._path(rel))

    def exists(self, rel: str) -> bool:
        from pyarrow import fs as pafs

        return self._fs.get_file_info(self._path(rel)).type != pafs.FileType.NotFound


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
