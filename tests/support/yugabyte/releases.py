"""Which YugabyteDB release the stand-in emulates, and what changes with the release.

One place for the per-release switches, each with the source it comes from (the full citations are in
docs/yugabytedb-standin.md and docs/research/issue29/logical-replication.md):

- advisory locks: cluster-wide from 2025.1; before, 0A000 with hint #3642 (``lockfuncs.c``).
- ``ysql_enable_pg_export_snapshot``: on by default from 2025.2.2.0 (docs PR yugabyte-db#32263,
  "Synchronized snapshots are enabled by default from v2025.2.2.0"); a preview flag, off, before.
- publication changes: applied at the periodic refresh (``cdcsdk_publication_list_refresh_interval_secs``,
  900 s) up to 2025.2, at commit from 2026.1 (docs "Slot behavior by version").
- the PostgreSQL line: 11.2 up to 2024.2, 15 from 2025.1 (docs ``api/ysql/pg15-features``: "Initially
  based on PostgreSQL 11.2 ... Starting with v2025.1 (stable) ... based on PostgreSQL 15"; "upgrading a
  PostgreSQL 11-based universe (v2024.2 and earlier)"). A PG11 release reports ``11.2-YB-<release>-b0``
  and its ``pg_attribute`` has no ``attgenerated`` (PostgreSQL 12, commit fc22b66 "Generated columns";
  "Stored generated columns" are listed as new in YSQL's PG15 line).
"""

from __future__ import annotations

import re

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


def default_snapshot_action(release: str) -> str:
    """``CREATE_REPLICATION_SLOT``'s snapshot action when no keyword is given. YB's walsender once
    overrode PostgreSQL's default with ``USE_SNAPSHOT`` ("Exporting a snapshot is not supported yet. So
    we change the default for YSQL"; walsender.c @ 04140979 and arpang/yugabyte-db @ 0372c901); the
    newest code (@ d0352220) has no override, so PostgreSQL's ``EXPORT_SNAPSHOT`` applies, and YB's
    upgrade test gets an exported id from a bare command on the current version
    (ysql_cdc_upgrade-test.cc ``DefaultBehaviorAfterUpgrade``). **Guess:** the override went with the
    flag's new default (2025.2.2.0); no source dates the commit."""
    return "EXPORT_SNAPSHOT" if export_snapshot_default(release) else "USE_SNAPSHOT"


def consistent_point(release: str) -> str:
    """``CREATE_REPLICATION_SLOT``'s ``consistent_point``: ``0/0`` on the early PG11 line ("Send "0/0"
    as the consistent wal location instead of a NULL value", walsender.c @ 04140979 and @ 7e22b285,
    both 2024.1 era), ``0/2`` on the PG15 line (@ d0352220). 2024.2 (PG11, the first with LSN types)
    was not found: taken as ``0/2`` (guess)."""
    return "0/0" if not at_least(release, "2024.2") else "0/2"


def publication_refresh_at_commit(release: str) -> bool:
    """Whether publication changes reach a slot at commit (2026.1+) rather than at the periodic refresh."""
    return at_least(release, "2026.1")


def pg11_based(release: str | None) -> bool:
    """Whether ``release`` is built on PostgreSQL 11.2 (2024.2 and earlier)."""
    return release is not None and not at_least(release, "2025.1")


def server_version(release: str | None, backing: str) -> str:
    """The ``server_version`` YSQL reports: ``11.2-YB-2024.2.0.0-b0`` on the PG11 line (``version()``
    of a 2024.2.0.0 node, quoted in a ysqlsh session of a YB install guide, and ptah's
    "Measured on PostgreSQL 11.2-YB-2024.2.10.0-b0"); from 2025.1 the backing PostgreSQL's own
    version stands in for YB's ``15.2`` (a 2.25 node: ``PostgreSQL 15.2-YB-2.25.0.0-b0``)."""
    return f"{'11.2' if pg11_based(release) else backing}-YB-{release}-b0"


# a catalog column PostgreSQL 12+ has and a PG11 release lacks, with the qualifier it is named with
_PG12_COLUMN = re.compile(r"(?:\b([A-Za-z_]\w*)\s*\.\s*)?\b(attgenerated)\b", re.IGNORECASE)


def pg11_refusal(sql: str, release: str | None) -> str | None:
    """A statement that PostgreSQL refuses at parse time just as a PG11 release refuses ``sql``
    (42703 ``column a.attgenerated does not exist``: ptah's measurement on 11.2-YB-2024.2.10.0-b0,
    "ERROR: column a.attgenerated does not exist (SQLSTATE 42703)"); None when ``sql`` runs there.
    Refused at Parse, so an extended-protocol statement's parameters are never bound."""
    if not pg11_based(release):
        return None
    found = _PG12_COLUMN.search(sql)
    if found is None:
        return None
    qualifier = found.group(1)
    if qualifier:
        return f"SELECT {qualifier}.attgenerated FROM (SELECT) AS {qualifier}"
    return "SELECT attgenerated FROM (SELECT) AS pg11_attribute"
