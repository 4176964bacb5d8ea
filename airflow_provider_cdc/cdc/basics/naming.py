"""Topic names (Debezium's ``<prefix>.<schema>.<table>``) and the directories that hold them.

Topic names stay exactly as Debezium spells them. Directory names must survive every file
system and never collide, so each part is percent-encoded except ``[A-Za-z0-9_-]`` (dots,
spaces, quotes, slashes and non-ASCII characters are all escaped) and the parts are joined with
dots. Unlike Debezium's ``_`` replacement this is reversible, so ``a.b``/``a_b`` cannot collide.

That escaping is the only one: a directory name is used as it is everywhere else. Every path
the provider builds is a *path string* in Hadoop's sense (the directory's name verbatim, never
percent-encoded again): local paths, Arrow paths, Spark (Hadoop ``Path``) strings, the lake
tables' locations and the ``file://`` URIs of Airflow assets and OpenLineage datasets (Airflow's
own ``file`` assets carry the path verbatim too). Libraries that hand back real, percent-encoded
URIs (Spark's ``inputFiles()``, Delta's ``file_uris()``) go through :func:`path_from_uri` once
before anything else reads them, and a path string handed to a library that decodes URIs
(Arrow) goes through :func:`encoded_uri`: a ``%`` read twice is how ``acc.Sales%20Dept`` became
``acc.Sales%2520Dept``, and one read as an escape makes it ``acc.Sales Dept``.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote, unquote

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError

_PREFIX = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
COMMIT_LOG_DIR = "_cdc_log"


def validate_topic_prefix(prefix: str) -> str:
    if not isinstance(prefix, str) or not _PREFIX.match(prefix):
        raise CdcConfigurationError(
            f"topic_prefix {prefix!r} is invalid: use letters, digits and '_' and start with a "
            "letter or '_' (it names topics, directories and the stored offset)"
        )
    return prefix


def table_topic(prefix: str, schema: str, table: str) -> str:
    return f"{prefix}.{schema}.{table}"


def transaction_topic(prefix: str) -> str:
    return f"{prefix}.transaction"


def message_topic(prefix: str) -> str:
    """Debezium's topic of logical decoding messages."""
    return f"{prefix}.message"


def gap_topic(prefix: str) -> str:
    """Side table of capture gaps (see :mod:`airflow_provider_cdc.cdc.planning.gaps`)."""
    return f"{prefix}.capture_gap"


def side_topics(prefix: str) -> frozenset[str]:
    """Topics that are not change events of a table."""
    return frozenset({transaction_topic(prefix), message_topic(prefix), gap_topic(prefix)})


def topic_directory(*parts: str) -> str:
    """Directory name for a topic given its parts (prefix, schema, table)."""
    return ".".join(_escape(p) for p in parts)


def topic_location(base: str, directory: str) -> str:
    """The path string of a topic's ``directory`` under a base path or URI (the name verbatim)."""
    return f"{base.rstrip('/')}/{directory}"


def path_from_uri(uri: str) -> str:
    """The path string of a file a library reported as a percent-encoded URI (Spark's
    ``inputFiles()``, Delta's ``file_uris()``): decoded once, so ``%2520`` is the ``%20`` of
    the escaped directory name again, which Spark, Arrow and the file system read verbatim."""
    return unquote(uri)


def encoded_uri(uri: str) -> str:
    """A URI built as a path string (``scheme://authority/<path verbatim>``) percent-encoded, for
    a library that decodes the URIs it is given (Arrow's ``FileSystem.from_uri``, ``dataset``)."""
    scheme, sep, rest = uri.partition("://")
    authority, slash, path = rest.partition("/")
    path, mark, query = path.partition("?")  # Arrow's options (s3://b/p?region=...) stay as they are
    return f"{scheme}{sep}{authority}{slash}{quote(path, safe='/=')}{mark}{query}"


def directory_parts(directory: str) -> tuple[str, ...]:
    """The name parts (prefix, schema, table ...) of a topic directory: :func:`topic_directory` undone."""
    return tuple(unquote(part) for part in directory.split("."))


def commit_log_directory(prefix: str) -> str:
    return f"{COMMIT_LOG_DIR}/{_escape(prefix)}"


#: A window's attempt: 16 hex digits (:class:`sinks.parquet.WindowWriter`).
_ATTEMPT = re.compile(r"^[0-9a-f]{16}$")
_PART = r"[A-Za-z0-9_%-]+"  # an escaped name part: no dot, slash or anything else


def dataset_path(directory: str, window_id: str, attempt: str) -> str:
    """Where one attempt of one window of a dataset lands, relative to the sink's base path."""
    return f"{directory}/window={window_id}/attempt={attempt}"


def landed_path_problem(
    prefix: str, path: Any, window_id: str, attempt: str, *, parts: int | None = None
) -> str | None:
    """Why ``path`` (read back from the sink's commit log or the offset, both writable by others)
    is not where this capture lands ``window_id``'s ``attempt``: None when it is. The path must be
    exactly the layout's (a topic directory of this prefix, the window, the attempt), so nothing
    read back can point outside the sink or at another capture's files. ``parts``: how many name
    parts the topic directory has (3 for tables, 4 for staged chunks; None: 2 or more)."""
    if not isinstance(attempt, str) or not _ATTEMPT.match(attempt):
        return f"attempt {attempt!r} is not 16 hex digits"
    if not isinstance(window_id, str) or not window_id.isascii() or not window_id.isdigit():
        return f"window id {window_id!r} is not a number"
    if not isinstance(path, str):
        return f"path {path!r} is not a string"
    directory, sep, rest = path.partition("/")
    if not sep or rest != f"window={window_id}/attempt={attempt}":
        return f"path {path!r} is not <topic directory>/window={window_id}/attempt={attempt}"
    count = "+" if parts is None else f"{{{parts - 1}}}"
    if not re.fullmatch(rf"{re.escape(_escape(prefix))}(?:\.{_PART}){count}", directory):
        return f"path {path!r} is not in a topic directory of capture {prefix!r}"
    return None


def _escape(part: str) -> str:
    if not part:
        raise CdcConfigurationError("empty name part in a topic")
    return quote(part, safe="").replace(".", "%2E").replace("~", "%7E")


class Topic:
    """A dataset of the sink: its Debezium topic name and its directory under the base path."""

    __slots__ = ("directory", "name")

    def __init__(self, name: str, directory: str):
        self.name = name
        self.directory = directory

    @classmethod
    def for_table(cls, prefix: str, schema: str, table: str) -> Topic:
        return cls(table_topic(prefix, schema, table), topic_directory(prefix, schema, table))

    @classmethod
    def transactions(cls, prefix: str) -> Topic:
        return cls(transaction_topic(prefix), topic_directory(prefix, "transaction"))

    @classmethod
    def messages(cls, prefix: str) -> Topic:
        return cls(message_topic(prefix), topic_directory(prefix, "message"))

    @classmethod
    def gaps(cls, prefix: str) -> Topic:
        return cls(gap_topic(prefix), topic_directory(prefix, "capture_gap"))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Topic) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return f"Topic({self.name!r})"


def staged_topic(prefix: str, ref: Any) -> Topic:
    """Where a window stages the incremental-snapshot chunks of table ``ref`` for the next
    window: not a Debezium topic (the ``:`` cannot follow the prefix in a topic name) and a
    directory of four parts (table topics have three), so it never collides with captured data."""
    return Topic(
        f"{prefix}:incremental:{ref.data_collection}", topic_directory(prefix, "_incremental", ref.schema, ref.name)
    )


def is_staged_topic(prefix: str, name: str) -> bool:
    return name.startswith(f"{prefix}:incremental:")
