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

import contextlib
import os
import re
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


#: Jinja's markers: a path setting holding one was written for a templating it does not get.
_JINJA_MARKERS = ("{{", "{%", "{#")

_GLOB = "Spark (Hadoop) reads every path as a glob pattern"
#: Characters a path setting cannot hold, and why: each makes one of the readers of the path
#: (Spark, Arrow, delta-rs, Airflow's Asset URIs, OpenLineage) see another place than the others.
#: Escaping them instead would have to be done right in every one of those, for every format.
_REFUSED_CHARACTERS = {
    "%": "Spark reads it verbatim while Arrow and delta-rs decode it as a URI escape, so they would not agree "
    "on the directory",
    "?": "a URI's query starts there (the outlet Assets and lineage would name only the part before it, one "
    f"Asset for every dataset) and {_GLOB}, where it matches any character",
    "#": "a URI's fragment starts there: the outlet Assets and lineage would name only the part before it, one "
    "Asset for every dataset",
    "*": f"{_GLOB}, where it matches any name: a read could take in other directories' data",
    "[": f"{_GLOB}, where it opens a character class: the read would not find the directory",
    "]": f"{_GLOB}, where it closes a character class: the read would not find the directory",
    "{": f"{_GLOB}, where it opens a list of alternatives: the read would not find the directory",
    "}": f"{_GLOB}, where it closes a list of alternatives: the read would not find the directory",
    "\\": f"{_GLOB}, where it escapes the next character: the read would not find the directory",
}


def check_path_setting(path: Any, name: str = "sink_path") -> str:
    """A sink or state path as a DAG file gives it, checked when the DAG is parsed (no I/O);
    returns it as a string.

    The path fixes where the data and the capture's durable records live and which Airflow
    Assets the tasks update, and Airflow needs those Assets when it parses the DAG (lineage,
    asset-triggered DAGs). So the path must mean the same place in every process that reads it:
    no Jinja (it is not templated: it would be rendered only at run time, after the Assets were
    named), no relative or ``~`` path (resolved against each process's working or home
    directory: the DAG processor's at parse, each worker's at run; a URI's path must be absolute
    too), and none of the characters in :data:`_REFUSED_CHARACTERS` or control characters (Spark
    globs read paths, Arrow and delta-rs decode ``%``, URI parsers cut at ``?`` and ``#``: the
    readers would disagree on the directory, or the Assets would name another one)."""
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str) or not path.strip():
        raise CdcConfigurationError(f"{name} is required (an absolute local directory or a Hadoop URI), got {path!r}")
    if any(marker in path for marker in _JINJA_MARKERS):
        raise CdcConfigurationError(
            f"{name} {path!r} holds a Jinja template, but {name} is not templated: it names where the data lands "
            "and the Assets the tasks update, which Airflow needs when it parses the DAG. Resolve it in the DAG "
            f'file instead: {name}=Variable.get("lake") (read at each parse), an environment variable, or the '
            "path written out"
        )
    for char, why in _REFUSED_CHARACTERS.items():
        if char in path:
            raise CdcConfigurationError(f"{name} {path!r} contains {char!r}: {why}. Choose a path without {char!r}")
    control = next((c for c in path if ord(c) < 0x20 or ord(c) == 0x7F), None)
    if control is not None:
        raise CdcConfigurationError(
            f"{name} {path!r} contains the control character {control!r}: URI parsers drop it, so the outlet "
            "Assets and lineage would name another directory. Choose a path without control characters"
        )
    if is_uri(path):
        parsed = urlparse(path)
        _check_object_store_uri(path, name)
        if not (parsed.path.startswith("/") or (parsed.netloc and not parsed.path)):
            raise CdcConfigurationError(
                f"{name} {path!r} is a URI with a relative path ({parsed.path!r}): like a relative local path, "
                "it would be resolved against each process's working directory, or not at all. Give the "
                "absolute path after the scheme: file:///abs/dir, hdfs://namenode:8020/abs/dir, "
                "hdfs:///abs/dir (the default file system), s3a://bucket/prefix"
            )
        if parsed.scheme == "file" and parsed.netloc not in ("", "localhost"):
            raise CdcConfigurationError(
                f"{name} {path!r} names the host {parsed.netloc!r}: a file URI's local directory follows three "
                f"slashes, file:///{parsed.netloc}{parsed.path} for the directory /{parsed.netloc}{parsed.path}"
            )
    elif not os.path.isabs(path):
        raise CdcConfigurationError(
            f"{name} {path!r} is not absolute: it would be resolved against the working (or home) directory "
            "of each process that reads it, the DAG processor's when the DAG is parsed and each worker's at run "
            "time, so the data and its Assets could end up in different places. Give an absolute path or a "
            f"URI (for a directory beside the DAG file: str(Path(__file__).parent / {path!r}))"
        )
    return path


#: An S3 bucket's name (and a GCS bucket's without dots or underscores): 3 to 63 lowercase letters,
#: digits, dots and hyphens, starting and ending with a letter or digit.
_S3_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_GCS_BUCKET = re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]")


def _check_object_store_uri(path: str, name: str) -> None:
    """An object-store path's bucket, at parse: present, well formed, no credentials in the URI
    (``s3://KEY:SECRET@bucket`` would put the keys in the serialized DAG, the Assets and the logs)."""
    from airflow_provider_cdc.cdc.sinks.object_store import AZURE_SCHEMES, GCS_SCHEMES, S3_SCHEMES, scheme_of

    scheme = scheme_of(path)
    if scheme not in S3_SCHEMES | GCS_SCHEMES | AZURE_SCHEMES:
        return
    netloc = urlparse(path).netloc
    userinfo = netloc.rpartition("@")[0]
    # Azure's abfs://container@account.dfs.core.windows.net names the container before '@'.
    if ":" in userinfo or (userinfo and scheme not in AZURE_SCHEMES):
        raise CdcConfigurationError(
            f"{name} holds credentials before '@' in the URI (shown here without it: "
            f"{scheme}://{netloc.rpartition('@')[2]}{urlparse(path).path}): they would be stored in the serialized "
            "DAG, the Assets and the logs. Remove them from the URI and put the keys in an Airflow 'aws' connection "
            "named by the capture's object_store_conn_id"
        )
    if scheme in AZURE_SCHEMES:
        return
    pattern = _S3_BUCKET if scheme in S3_SCHEMES else _GCS_BUCKET
    if not pattern.fullmatch(netloc):
        raise CdcConfigurationError(
            f"{name} {path!r} does not name a valid bucket ({netloc!r}): a bucket name is 3 to 63 lowercase "
            f"letters, digits, dots and hyphens, starting and ending with a letter or digit ({scheme}://bucket/prefix)"
        )


#: How long setup's object-store check waits for the store before failing: each request is
#: bounded by object_store's timeouts, but with retries a store that accepts connections and never
#: answers would hold the task for minutes.
SETUP_CHECK_TIMEOUT_SECONDS = 30.0


def check_writable(base_path: str, name: str = "sink_path") -> None:
    """Fail before anything is written when a sink (or state) path cannot hold the sink.

    Locally the path need not exist yet; its nearest existing ancestor must be a directory this
    process may create entries in. On an object store (:func:`check_object_store`) the bucket must
    exist and the access list, create and delete objects under the prefix. Other Hadoop URIs are
    left to their jobs (checking them needs the file system).
    """
    if not base_path or not str(base_path).strip():
        raise CdcConfigurationError(f"{name} is empty; give a local directory or a Hadoop URI")
    from airflow_provider_cdc.cdc.sinks.object_store import is_object_store

    if is_object_store(str(base_path)):
        check_object_store(str(base_path), name)
        return
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


def check_object_store(base_uri: str, name: str = "sink_path") -> None:
    """The setup check of an object-store path, with the active access: the bucket exists, the
    prefix can be listed, and a probe object is created (create-only, as the commit log publishes)
    and deleted. Each failure is a :class:`CdcConfigurationError` that says what to fix, without
    the keys; nothing is left written. Bounded by :data:`SETUP_CHECK_TIMEOUT_SECONDS`."""
    import threading

    from airflow_provider_cdc.cdc.sinks import object_store

    # Given to the probe explicitly: a probe abandoned at the bound may end long after this
    # task's access stopped being the process's, and must neither read nor set the process's.
    access = object_store.current() or object_store.ObjectStoreAccess()
    outcome: list[BaseException | None] = []

    def probe() -> None:
        try:
            _probe_object_store(base_uri, name, access)
            outcome.append(None)
        except BaseException as exc:  # reported by the caller's thread
            outcome.append(exc)

    worker = threading.Thread(target=probe, name="cdc-object-store-check", daemon=True)
    worker.start()
    worker.join(SETUP_CHECK_TIMEOUT_SECONDS)
    if not outcome:
        raise CdcConfigurationError(
            f"{name} {base_uri!r}: the object store{_endpoint_of(access)} did not answer within "
            f"{SETUP_CHECK_TIMEOUT_SECONDS:g} s; nothing was written. Check the connection's endpoint_url and that "
            "the store is up and reachable from the workers"
        )
    if outcome[0] is not None:
        raise outcome[0]


def _endpoint_of(access: Any) -> str:
    endpoint = getattr(access, "endpoint_url", None)
    return f" at {endpoint}" if endpoint else ""


def _probe_object_store(base_uri: str, name: str, access: Any) -> None:
    import pyarrow.fs as pafs

    from airflow_provider_cdc.cdc.sinks import object_store

    uri = object_store.library_uri(base_uri).rstrip("/")
    bucket, _ = object_store.split_bucket(uri)
    where = f"{name} {base_uri!r}"
    step = "listing"
    try:
        fs, path = object_store.filesystem(uri, access)
        # Listing first (its errors name refused credentials; HeadBucket's have no body), then
        # the bucket: a listing finds nothing in a missing one, and some stores create a missing
        # bucket on the first write.
        fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
        if fs.get_file_info(path.split("/", 1)[0]).type == pafs.FileType.NotFound:
            raise CdcConfigurationError(
                f"{where}: the bucket {bucket!r} does not exist{_endpoint_of(access)}; nothing was written. "
                "Create it, or correct the bucket in the path"
            )
        step = "writing"
        probe_uri = f"{uri}/.cdc-setup-probe-{uuid.uuid4().hex}"
        object_store.put_if_absent(probe_uri, b"", access)
        try:
            honoured = _refuses_second_create(probe_uri, access)
        except Exception:
            with contextlib.suppress(Exception):  # the write's error is the one to report
                object_store.delete_prefix(probe_uri, access)
            raise
        step = "deleting"
        object_store.delete_prefix(probe_uri, access)  # not Arrow's delete: it would leave a marker
        if not honoured:
            raise CdcConfigurationError(
                f"{where}: the object store{_endpoint_of(access)} does not honour conditional writes "
                "(If-None-Match): a second create-only PUT of the setup probe's name replaced it instead of "
                "failing. The commit log publishes each entry with one create-only PUT and relies on the store "
                "refusing a name that exists (docs/architecture.md); use a store (or a version of it) that "
                "supports conditional writes. Nothing was left written"
            )
    except CdcConfigurationError:
        raise
    except Exception as exc:
        raise CdcConfigurationError(_store_failure(where, step, exc, access)) from None


def _refuses_second_create(uri: str, access: Any) -> bool:
    """Whether a second create-only PUT of ``uri`` (which exists) is refused, as the commit log
    needs: a store that ignores ``If-None-Match`` replaces the object instead."""
    from airflow_provider_cdc.cdc.sinks import object_store

    try:
        object_store.put_if_absent(uri, b"", access)
    except FileExistsError:
        return True
    return False


#: Words of the S3 clients' errors (Arrow's, obstore's), lowercased, and what they mean.
_CREDENTIALS_REFUSED = (
    "signature_does_not_match",
    "signaturedoesnotmatch",
    "invalid_access_key_id",
    "invalidaccesskeyid",
    "expiredtoken",
    "expired_token",
    "invalidtoken",
)
_NO_ANSWER = (
    "could not connect",
    "couldn't connect",
    "connection refused",
    "timed out",
    "timeout",
    "error sending request",
    "network_connection",
    "resolve host",
)
_DENIED = ("accessdenied", "access_denied", "access denied", "forbidden", "lacked the necessary privileges")
_NO_BUCKET = ("no_such_bucket", "nosuchbucket", "bucket does not exist")


def _store_failure(where: str, step: str, exc: BaseException, access: Any) -> str:
    """What failed talking to the store, what to do, and the library's own words, without the keys."""
    from airflow_provider_cdc.cdc.sinks import object_store

    detail = object_store.redact(" ".join(str(exc).split())[:600], access)
    text = detail.lower()
    if any(word in text for word in _CREDENTIALS_REFUSED):
        why = (
            "the store refused the credentials: check the access key id and secret (or the role) of the "
            "capture's object_store_conn_id connection"
        )
    elif any(word in text for word in _NO_ANSWER):
        why = (
            f"the object store{_endpoint_of(access)} did not answer: check the connection's endpoint_url and that "
            "the store is up and reachable from the workers"
        )
    elif any(word in text for word in _DENIED):
        needed = "s3:PutObject and s3:DeleteObject" if step in ("writing", "deleting") else "s3:ListBucket"
        why = (
            f"the credentials may not do this ({step} under the prefix): grant them {needed} on the bucket and "
            "prefix (a capture needs list, get, put and delete)"
        )
    elif any(word in text for word in _NO_BUCKET):
        why = "the bucket does not exist: create it, or correct the bucket in the path"
    else:
        why = "see the store's answer"
    left = " (a probe object may be left: delete '.cdc-setup-probe-*' objects)" if step == "deleting" else ""
    return f"{where}: {step} failed: {why}; nothing was written{left}. The store said: {type(exc).__name__}: {detail}"


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
