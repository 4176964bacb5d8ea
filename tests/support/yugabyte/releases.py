"""Which YugabyteDB release the stand-in emulates, and what changes with the release.

One place for the per-release switches, each with the source it comes from (the full citations are in
docs/yugabytedb-standin.md and docs/research/issue29/logical-replication.md):

- advisory locks: cluster-wide from 2025.1; before, 0A000 with hint #3642 (``lockfuncs.c``).
- ``ysql_enable_pg_export_snapshot``: on by default from 2025.2.2.0 (docs PR yugabyte-db#32263,
  "Synchronized snapshots are enabled by default from v2025.2.2.0"); a preview flag, off, before.
- publication changes: applied at the periodic refresh (``cdcsdk_publication_list_refresh_interval_secs``,
  900 s) up to 2025.2, at commit from 2026.1 (docs "Slot behavior by version").
"""

from __future__ import annotations

# the default: the newest release whose slot still refreshes its publication on a timer, with the
# export-snapshot flag on: the strictest combination for a client
DEFAULT_RELEASE = "2025.2.2.0"
BEFORE_ADVISORY_LOCKS = "2024.2.4.0"


def release_tuple(release: str) -> tuple[int, ...]:
    """``"2025.2.2.0"`` -> ``(2025, 2, 2, 0)``."""
    return tuple(int(part) for part in release.split(".")[:4])


def at_least(release: str, floor: str) -> bool:
    return release_tuple(release) >= release_tuple(floor)


def has_advisory_locks(release: str) -> bool:
    return at_least(release, "2025.1")


def export_snapshot_default(release: str) -> bool:
    """``ysql_enable_pg_export_snapshot``'s default in ``release``."""
    return at_least(release, "2025.2.2")


def publication_refresh_at_commit(release: str) -> bool:
    """Whether publication changes reach a slot at commit (2026.1+) rather than at the periodic refresh."""
    return at_least(release, "2026.1")
