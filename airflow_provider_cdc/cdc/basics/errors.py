"""Error hierarchy of the capture engine.

Terminal errors mean "retrying the same run cannot help": bad configuration, a lost slot,
offsets that disagree with the source. Operators turn them into failed tasks without retries.
Transient errors (a dropped connection, a restarted server) are left to Airflow's retries.
Every error carries only its message, so it pickles across Spark and Airflow processes, and no
message ever contains a password or a connection string.
"""

from __future__ import annotations

import re


class CdcError(Exception):
    """Base class of every error raised by airflow-provider-cdc."""

    terminal = True


class CdcConfigurationError(CdcError, ValueError):
    """The capture is configured in a way that cannot work; nothing was read or written."""


class InvalidLsnError(CdcConfigurationError):
    """A value given as an LSN is not one."""


class UnknownTableError(CdcConfigurationError):
    """A captured table does not exist (or is not visible to the capture role)."""


class ReplicaIdentityError(CdcConfigurationError):
    """A captured table cannot emit complete update/delete events."""


class PublicationError(CdcConfigurationError):
    """The publication is missing or does not contain exactly the captured tables."""


class SlotConfigurationError(CdcConfigurationError):
    """The replication slot exists but was created for another plugin or database."""


class ServerConfigurationError(CdcConfigurationError):
    """The server cannot do logical decoding (wal_level, privileges, version)."""


class InvalidOffsetError(CdcConfigurationError):
    """A stored offset document is malformed or belongs to another capture."""


class CdcStateError(CdcError):
    """Stored offsets, the sink's commit log and the replication slot disagree."""


class SlotMissingError(CdcStateError):
    """The replication slot does not exist."""


class WalLostError(CdcStateError):
    """The slot can no longer deliver the WAL the stored offset needs."""


class OffsetMismatchError(CdcStateError):
    """Offset, commit log and slot positions cannot be reconciled without losing data."""


class SnapshotRequiredError(CdcStateError):
    """Streaming was asked for before the snapshot that must precede it completed."""


class ConcurrentCaptureError(CdcError):
    """Another run holds this capture. Retrying later may succeed."""

    terminal = False


class CdcTransientError(CdcError):
    """The source went away mid-run (connection dropped, server restarted). Retry the run."""

    terminal = False


class DecodingError(CdcError):
    """A replication message could not be decoded (protocol violation or unsupported message)."""


class StaleOffsetError(CdcStateError):
    """The stored offset changed since it was read: another writer got there first."""


_REMOTE_ERROR = re.compile(r"^airflow_provider_cdc\.[\w.]+?\.(\w+): (.+)$", re.MULTILINE)


def from_remote_traceback(text: str) -> CdcError | None:
    """The engine error at the bottom of a traceback that crossed a process boundary.

    Spark reports exceptions raised in its Python workers as a generic exception carrying the
    worker's traceback as text; this recovers the original class and message, so a terminal
    error in a Spark task stays terminal.
    """
    matches = _REMOTE_ERROR.findall(text)
    if not matches:
        return None
    name, message = matches[-1]
    known = {cls.__name__: cls for cls in _all_subclasses(CdcError)}
    cls = known.get(name)
    return None if cls is None else cls(message.strip())


def _all_subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_all_subclasses(sub))
    return out
