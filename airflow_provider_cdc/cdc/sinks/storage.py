"""File operations the sink needs for its commit log, on a local path, an object store or any
Hadoop URI.

The commit log needs one primitive beyond reading and listing: *publish a small file so that it
appears whole or not at all, and never replaces an existing one*. Locally that is write-to-temp
+ ``os.link`` (fails if the name exists); on Hadoop file systems it is create-temp + ``rename``,
which HDFS and the local Hadoop file system implement atomically and without overwriting. On
object stores there is no rename: it is one conditional PUT (``If-None-Match: *``,
:func:`.object_store.put_if_absent`), which the store applies atomically and refuses when the
name exists (see docs/architecture.md).

Plain paths use :class:`LocalStorage` and need no JVM. Object stores (``s3://``, ``s3a://``,
``gs://``, ``abfss://`` ...) use :class:`ObjectStoreStorage`, Arrow's file systems and obstore,
inside jobs and out (Spark's S3 connector is not used: every object-store read and write is
Arrow's). Other URIs (``file://``, ``hdfs://``) use :class:`HadoopStorage` through the Spark
session's Hadoop configuration inside jobs, so they work wherever Spark can write; outside Spark
(the operator reading the commit log) they use :class:`ArrowFsStorage`, Arrow's file systems.

What lands is a full copy of the captured tables: a local sink's (or state path's) root
directory is created ``0o700`` when the product creates it (:func:`ensure_private_root`), so
nothing under it is reachable by other users whatever the umask gives the files; SQLite catalog
files are created ``0o600`` (:func:`create_private_file`). An existing root is left as it is
(sharing it through a group may be intended): setup warns when others may enter it
(:func:`exposed_root`).
"""

from __future__ import annotations

import os
import shutil
import stat
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError, CdcStateError
from airflow_provider_cdc.cdc.basics.naming import encoded_uri
from airflow_provider_cdc.cdc.sinks import object_store
from airflow_provider_cdc.cdc.sinks.object_store import is_object_store


class Storage(Protocol):
    def uri(self, rel: str) -> str: ...

    def dataset_uri(self, rel: str) -> str:
        """The URI of a landed dataset directory about to be read (local: holding no links)."""

    def read_text(self, rel: str) -> str: ...

    def publish_text(self, rel: str, text: str) -> None:
        """Make ``rel`` appear atomically with ``text``; ``FileExistsError`` if it exists."""

    def list_names(self, rel_dir: str) -> list[str]: ...

    def delete_tree(self, rel: str) -> None: ...

    def exists(self, rel: str) -> bool: ...


def inside(rel: str) -> str:
    """``rel`` if it names a place inside the sink's base path, else :class:`CdcStateError`.

    Every path the storage is handed is relative to the base path; some are read back from the
    commit log or the offset, which others can write. Each part must be a plain name: no absolute
    path (which would replace the base), no ``..``, ``.`` or empty part, no backslash, colon
    (a scheme or drive to Hadoop and Windows) or NUL. The layout's own names never have them."""
    if rel == "":
        return rel
    if (
        not isinstance(rel, str)
        or any(c in rel for c in "\\:\x00")
        or any(p in ("", ".", "..") for p in rel.split("/"))
    ):
        raise CdcStateError(f"path {rel!r} does not stay inside the sink: refused (it was not written by this capture)")
    return rel


def contained(root: str | os.PathLike[str], rel: str) -> Path:
    """``root / rel`` on the local file system, refused (:class:`CdcStateError`) when it resolves
    outside ``root``: ``rel`` passed :func:`inside`, but a part of it may be a symbolic link that
    someone who may write the sink planted (the checks above are on names only)."""
    path = Path(root) / rel
    base = os.path.realpath(root)
    real = os.path.realpath(path)
    if real != base and os.path.commonpath([real, base]) != base:
        raise CdcStateError(f"{str(path)!r} leads outside {str(root)!r} (through a symbolic link): refused")
    return path


def check_no_links(directory: str) -> None:
    """A landed directory about to be read holds files, never links to files elsewhere: a reader
    would otherwise read another capture's (or anyone's) data into this capture's topics."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return  # absent: the read that follows says so
    for entry in entries:
        if entry.is_symlink():
            raise CdcStateError(f"{entry.path!r} is a symbolic link: the sink's files are never links; refused")


def is_uri(base_path: str) -> bool:
    scheme = urlparse(base_path).scheme
    return len(scheme) > 1  # a Windows drive letter is not a scheme


def storage_for(base_path: str, spark_provider: Callable[[], Any] | None = None) -> Storage:
    if not base_path or not str(base_path).strip():
        raise CdcConfigurationError("sink_path is empty; give a local directory or a Hadoop URI")
    if is_uri(base_path):
        if is_object_store(base_path):
            return ObjectStoreStorage(base_path)  # with or without Spark: Spark never touches the store
        if spark_provider is None:
            return ArrowFsStorage(base_path)
        return HadoopStorage(base_path, spark_provider)
    return LocalStorage(base_path)


#: Mode of the directories and files the sink creates for itself (before the umask).
PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


def local_root(base_path: str) -> Path | None:
    """The local directory of a plain path or a ``file://`` URI (None for other URIs)."""
    if not base_path or not str(base_path).strip():
        return None
    parsed = urlparse(str(base_path))
    if is_uri(str(base_path)):
        if parsed.scheme != "file" or parsed.netloc not in ("", "localhost"):
            return None
        return Path(parsed.path)
    return Path(base_path).expanduser().absolute()


def ensure_private_root(base_path: str) -> None:
    """Create a local ``base_path`` (plain or ``file://``) that does not exist yet as a directory
    only its owner may enter (its missing parents get the usual mode). An existing directory is
    left as it is; a path that cannot be created is left to the writer's own error."""
    root = local_root(base_path)
    if root is None or root.exists():
        return
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(root, PRIVATE_DIR_MODE)
    except FileExistsError:
        pass  # made meanwhile (another task of the capture): its maker chose its mode
    except OSError:
        pass  # the write that follows fails, saying why


def exposed_root(base_path: str, name: str = "sink_path") -> str | None:
    """A warning when a local ``base_path`` exists and other users (its group, or everyone) may
    enter or list it; None when it is private, absent or not local."""
    root = local_root(base_path)
    if root is None:
        return None
    try:
        mode = stat.S_IMODE(root.stat().st_mode)
    except OSError:
        return None
    if not mode & 0o077:
        return None
    who = "everyone" if mode & 0o007 else "its group"
    return (
        f"{name} {str(root)!r} is open to {who} (mode {mode:04o}): the landed files are full copies of the "
        f"captured tables, readable by those users unless each file's own mode stops them. Run chmod 700 "
        f"{str(root)!r} unless sharing it is intended (a root the capture creates is made 0700)"
    )


def create_private_file(path: str | os.PathLike[str]) -> None:
    """Create ``path`` empty with mode 0600 if it does not exist (an empty file is an empty SQLite
    database: SQLite then keeps the mode, and gives it to its journal and WAL files)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE))
    except FileExistsError:
        pass


def create_private_sqlite(uri: str | None) -> None:
    """Before pyiceberg's SQL catalog opens a ``sqlite:///`` file that does not exist yet: create
    it 0600 (SQLAlchemy would create it with the umask's mode). Other URIs are left alone, and so
    is a file whose directory does not exist (opening it fails, saying so)."""
    if not uri or not str(uri).startswith("sqlite:"):
        return
    try:
        from sqlalchemy.engine import make_url

        url = make_url(str(uri))
    except Exception:  # not SQLAlchemy's URL syntax: pyiceberg's own error says so
        return
    database = url.database
    if not database or database == ":memory:" or database.startswith("file:") or url.query.get("uri"):
        return
    path = Path(database).expanduser()
    if path.parent.is_dir():
        create_private_file(path)


class LocalStorage:
    def __init__(self, base_path: str | os.PathLike[str]):
        self.root = Path(base_path).expanduser().absolute()
        if self.root.exists() and not self.root.is_dir():
            raise CdcConfigurationError(f"sink_path {str(self.root)!r} exists and is not a directory")

    def _path(self, rel: str) -> Path:
        return contained(self.root, inside(rel))

    def uri(self, rel: str) -> str:
        return str(self._path(rel))

    def dataset_uri(self, rel: str) -> str:
        path = str(self._path(rel))
        check_no_links(path)
        return path

    def read_text(self, rel: str) -> str:
        return self._path(rel).read_text(encoding="utf-8")

    def publish_text(self, rel: str, text: str) -> None:
        target = self._path(rel)
        ensure_private_root(str(self.root))
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
        path = self._path(rel_dir)
        return sorted(p.name for p in path.iterdir()) if path.is_dir() else []

    def delete_tree(self, rel: str) -> None:
        if not inside(rel):
            raise CdcStateError("refusing to delete the sink's base path")
        path = self._path(rel)
        if path.is_symlink():
            raise CdcStateError(f"{str(path)!r} is a symbolic link: the sink's directories are never links; refused")
        shutil.rmtree(path, ignore_errors=True)

    def exists(self, rel: str) -> bool:
        return self._path(rel).exists()


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
        return f"{self.base_uri}/{inside(rel)}" if rel else self.base_uri

    def dataset_uri(self, rel: str) -> str:
        return self.uri(rel)

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
        if not inside(rel):
            raise CdcStateError("refusing to delete the sink's base path")
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
            uri = encoded_uri(scheme + self.base_uri[len(parsed.scheme) :])  # Arrow decodes it
            self._fs, self._root = pafs.FileSystem.from_uri(uri)
        except (ValueError, OSError) as exc:
            raise CdcConfigurationError(f"cannot open sink_path {base_uri!r} outside Spark: {exc}") from None
        self._local = isinstance(self._fs, pafs.LocalFileSystem)

    def uri(self, rel: str) -> str:
        self._path(rel)
        return f"{self.base_uri}/{inside(rel)}" if rel else self.base_uri

    def dataset_uri(self, rel: str) -> str:
        """Encoded: Arrow reads it (as a URI, decoding it), and escaped names hold '%'."""
        uri = self.uri(rel)
        if self._local:
            check_no_links(self._path(rel))
        return encoded_uri(uri)

    def _path(self, rel: str) -> str:
        if rel and self._local:  # a file:// sink: links are followed there too
            return str(contained(self._root, inside(rel)))
        return f"{self._root}/{inside(rel)}" if rel else self._root

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
        if not inside(rel):
            raise CdcStateError("refusing to delete the sink's base path")
        if self.exists(rel):
            self._fs.delete_dir(self._path(rel))

    def exists(self, rel: str) -> bool:
        from pyarrow import fs as pafs

        return self._fs.get_file_info(self._path(rel)).type != pafs.FileType.NotFound


class ObjectStoreStorage:
    """Storage on an object store (S3 and S3-compatible, GCS, Azure): Arrow's file system for
    reads and lists, obstore for the create-only publish and for deletes.

    The clients are built from the access active when first used (:func:`.object_store.using`).
    Paths are keys: there are no directories to create, no links to follow and no rename; a name
    is taken verbatim (an escaped topic directory's ``%`` is part of its key)."""

    def __init__(self, base_uri: str):
        self.base_uri = base_uri.rstrip("/")
        self._client: tuple[Any, str] | None = None

    @property
    def filesystem(self) -> Any:
        """Arrow's file system of the store (paths in it: :meth:`path`)."""
        return self._fs()[0]

    def _fs(self) -> tuple[Any, str]:
        if self._client is None:
            self._client = object_store.filesystem(self.base_uri)
        return self._client

    def path(self, rel: str) -> str:
        """``rel`` as a path in :attr:`filesystem` (``bucket/key``)."""
        root = self._fs()[1]
        return f"{root}/{inside(rel)}" if rel else root

    def uri(self, rel: str) -> str:
        return f"{self.base_uri}/{inside(rel)}" if rel else self.base_uri

    def dataset_uri(self, rel: str) -> str:
        """Verbatim, with the scheme the libraries know (``s3a://`` → ``s3://``): open it with
        :func:`.object_store.filesystem`, which does not decode it."""
        return object_store.library_uri(self.uri(rel))

    def read_text(self, rel: str) -> str:
        with self.filesystem.open_input_stream(self.path(rel)) as stream:
            return stream.read().decode("utf-8")

    def publish_text(self, rel: str, text: str) -> None:
        # One conditional PUT: whole or nothing, never over an existing entry (no temp + rename).
        object_store.put_if_absent(object_store.library_uri(self.uri(rel)), text.encode("utf-8"))

    def list_names(self, rel_dir: str) -> list[str]:
        from pyarrow import fs as pafs

        infos = self.filesystem.get_file_info(pafs.FileSelector(self.path(rel_dir), allow_not_found=True))
        return sorted(info.base_name for info in infos)

    def delete_tree(self, rel: str) -> None:
        if not inside(rel):
            raise CdcStateError("refusing to delete the sink's base path")
        object_store.delete_prefix(object_store.library_uri(self.uri(rel)))

    def exists(self, rel: str) -> bool:
        from pyarrow import fs as pafs

        return self.filesystem.get_file_info(self.path(rel)).type != pafs.FileType.NotFound


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
