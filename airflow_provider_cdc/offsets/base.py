"""Where offsets live: the store interface shared by the Variable and state-table stores.

A store keeps one JSON document per capture (keyed by topic prefix) and knows nothing about its
contents except the ``revision`` counter it compares on write: a save names the revision it
read, and fails with :class:`StaleOffsetError` if the stored document moved on meanwhile.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol, TypeVar, runtime_checkable

from airflow_provider_cdc.cdc.basics.errors import StaleOffsetError
from airflow_provider_cdc.cdc.planning.offset import CaptureOffset

OffsetT = TypeVar("OffsetT", bound=CaptureOffset)

__all__ = ["OffsetStore", "StaleOffsetError", "load_offset", "peek_offset", "save_offset"]


@runtime_checkable
class OffsetStore(Protocol):
    def load(self, capture: str) -> str | None:
        """The stored document of ``capture``, or None."""

    def save(self, capture: str, document: str, *, revision: int, expected_revision: int | None) -> None:
        """Store ``document`` (whose revision is ``revision``) if the stored revision is still
        ``expected_revision`` (None: nothing stored yet)."""

    def delete(self, capture: str) -> None: ...

    def describe(self, capture: str) -> str:
        """Where the offset of ``capture`` is stored, for messages."""


def load_offset(store: OffsetStore, capture: str, offset_type: type[OffsetT] | None = None) -> OffsetT | None:
    """The stored offset of ``capture`` as the source's offset type (PostgreSQL's by default, the
    only one before there were two sources)."""
    text = store.load(capture)
    if text is None:
        return None
    return _offset_type(offset_type).from_json(text, source=store.describe(capture))


def peek_offset(store: OffsetStore, capture: str, offset_type: type[OffsetT] | None = None) -> OffsetT | None:
    """The stored offset, read without creating anything where the store can (setup's checks run
    before it creates anything): a store with a ``peek(capture)`` method (the state table) is read
    with it; others are loaded."""
    peek = getattr(store, "peek", None)
    text = peek(capture) if callable(peek) else store.load(capture)
    if text is None:
        return None
    return _offset_type(offset_type).from_json(text, source=store.describe(capture))


def _offset_type(offset_type: type[OffsetT] | None) -> type[OffsetT]:
    if offset_type is not None:
        return offset_type
    from airflow_provider_cdc.cdc.sources.postgres.offset import PostgresOffset

    return PostgresOffset  # type: ignore[return-value]


def save_offset(store: OffsetStore, offset: OffsetT, *, previous: CaptureOffset | None) -> OffsetT:
    """Store ``offset`` as the successor of ``previous`` (compare-and-set on the revision)."""
    expected = previous.revision if previous is not None else None
    saved = replace(offset, revision=(expected or 0) + 1)
    store.save(saved.identity.topic_prefix, saved.to_json(), revision=saved.revision, expected_revision=expected)
    return saved
