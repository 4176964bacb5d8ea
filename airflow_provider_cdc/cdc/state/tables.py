"""Current-state tables in a lake format: one captured table's current rows as an Iceberg or Delta table.

Every commit is tagged with the window it brings the table up to (:meth:`WindowTag.properties`:
``cdc.window-seq``, ``cdc.window-id`` ... in the Iceberg snapshot summary or the Delta
``commitInfo``), so the table's own history says which windows it holds
(:meth:`StateTable.current_window_seq`) and which version was the state at any window
(:meth:`StateTable.version_for_window`). Two ways to write, each one table commit:

- :meth:`StateTable.commit_merge` removes the current rows of some keys and writes new rows:
  Delta ``MERGE`` on the key, Iceberg delete + append in one transaction. Both formats are
  copy-on-write, so only the data files holding those keys are rewritten;
- :meth:`StateTable.overwrite` replaces the whole table, schema included (snapshot windows,
  truncates, tables without a key).

Rows are written sorted by key into files of a bounded size, so a window's keys hit few files, and
reads and commits find those files by the files' min/max statistics: Iceberg through ``In`` filters
cut into lists of at most 200 values (pyiceberg stops pruning above that), Delta by matching the
keys against its add actions' statistics, and its MERGE predicate names the keys' values
(deltalake prunes the target by the predicate's target-only terms, not by the join).
Columns the captured table gained are added to the table (union by name, :mod:`.sinks.schemas`'
rules); a type change the format cannot promote (int → text, say) fails the merge: re-snapshot.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol

import pyarrow as pa

from airflow_provider_cdc.cdc.basics.naming import Topic, directory_parts, topic_location
from airflow_provider_cdc.cdc.sinks.formats import (
    CATALOG_DIR,
    DELTA,
    TableCommit,
    WindowTag,
    local_base,
)


class StateTable(Protocol):
    """The current-state table of one captured table, in one lake format."""

    format: ClassVar[str]

    @property
    def name(self) -> str:
        """The table's identifier (Iceberg) or URI (Delta)."""

    def exists(self) -> bool: ...

    def schema(self) -> pa.Schema | None:
        """The table's current schema (None if there is no table yet)."""

    def read_keys(self, keys: Sequence[str], key_values: pa.Table) -> pa.Table:
        """The current rows whose key (columns ``keys``) is one of the rows of ``key_values``."""

    def read_version(self, version: int | None = None) -> pa.Table:
        """All rows of ``version`` (default: the current one)."""

    def current_window_seq(self) -> int | None:
        """The window the newest tagged commit brought the table to (None: no tagged commit)."""

    def tagged_versions(self) -> list[tuple[int, int]]:
        """(version, window seq) of the commits tagged with a window, newest first."""

    def version_for_window(self, window_seq: int) -> int:
        """The version tagged with the newest window <= ``window_seq`` (CdcStateError if none)."""

    def commit_merge(
        self, new_rows: pa.Table, delete_keys: pa.Table, tag: WindowTag, *, keys: Sequence[str]
    ) -> TableCommit | None:
        """One commit: the rows of ``delete_keys`` (every current row replaced or removed) go,
        ``new_rows`` come in. None when both are empty (nothing to commit)."""

    def overwrite(self, rows: pa.Table, tag: WindowTag, *, keys: Sequence[str] = ()) -> TableCommit:
        """One commit replacing the table's rows and schema with ``rows`` (creates the table)."""

    def data_files(self) -> list[str]:
        """The Parquet files of the current version."""


# -- Arrow helpers ---------------------------------------------------------------------------------


# -- Iceberg ---------------------------------------------------------------------------------------


# -- Delta -----------------------------------------------------------------------------------------


def state_table(sink_format: str, state_path: str, topic_prefix: str, topic: Topic, table_catalog: dict | None) -> Any:
    """The state table of ``topic`` (not created until its first commit)."""
    from airflow_provider_cdc.cdc.state.delta_table import DeltaStateTable
    from airflow_provider_cdc.cdc.state.iceberg_table import IcebergStateTable

    location = topic_location(local_base(state_path), topic.directory)
    if sink_format == DELTA:
        return DeltaStateTable(location)
    parts = directory_parts(topic.directory)
    identifier = (f"{parts[0]}_state", *parts[1:])
    # A catalog the user names holds the state tables beside the event tables (the sink's catalog
    # name, "cdc"); without one, a SQLite catalog of the state path's own.
    catalog = (
        {"name": "cdc", **table_catalog}
        if table_catalog
        else str(Path(local_base(state_path)) / CATALOG_DIR / "iceberg.db")
    )
    return IcebergStateTable(catalog, identifier, location)
