"""The sink and state path settings, checked: at DAG parse the path's form (characters Spark reads
as a glob, templates, an object store's URI), at setup whether the path is writable (an object
store: credentials, bucket, the conditional PUT the commit log relies on), with one message per
problem that names its fix.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.sinks.storage import is_uri

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


#: An S3 bucket's name (and a GCS bucket's without dots or underscores): 3 to 63 lowercase letters,
#: digits, dots and hyphens, starting and ending with a letter or digit.
