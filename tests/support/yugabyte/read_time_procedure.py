"""The ``read_time_procedure`` SQL of docs/yugabytedb.md, as the tests run it.

The docs are the single source: :func:`documented` reads the SQL block that follows the
``<!-- read-time-procedure: ... -->`` marker, so what is tested is what users copy.
:data:`BEFORE_REVIEW` is the text the docs carried before the security review (commit d26bef3),
kept to show that the attack worked on it.

PostgreSQL knows no ``yb_read_time`` and refuses ``SET`` of an unknown setting whose name has no
dot, so :func:`on_postgres` renames the setting the procedure sets to the placeholder
:data:`SETTING` (any dotted name is a valid placeholder) and nothing else: the procedure's
security properties (owner, ``SECURITY DEFINER``, ``search_path``, qualification, the value check,
its grants) are those of the documented text.
"""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[3] / "docs" / "yugabytedb.md"
MARKER = "<!-- read-time-procedure:"
#: The placeholder that stands for YugabyteDB's ``yb_read_time`` on plain PostgreSQL.
SETTING = "yb_standin.yb_read_time"
#: The role the documented block grants to.
DOCS_ROLE = "cdc_reader"

#: docs/yugabytedb.md's procedure before the security review (d26bef3): no search_path, an
#: unqualified quote_literal and ||, executable by PUBLIC.
BEFORE_REVIEW = """\
CREATE PROCEDURE cdc.set_yb_read_time(value text) LANGUAGE plpgsql
  AS $$ BEGIN EXECUTE 'SET LOCAL yb_read_time = ' || quote_literal(value); END $$ SECURITY DEFINER;
GRANT EXECUTE ON PROCEDURE cdc.set_yb_read_time(text) TO cdc_reader;
"""


def documented(docs: Path = DOCS) -> str:
    """The SQL block after the marker in docs/yugabytedb.md, exactly as written."""
    text = docs.read_text(encoding="utf-8")
    assert text.count(MARKER) == 1, f"{docs} must mark exactly one read_time_procedure block"
    match = re.match(r"[^\n]*\n```sql\n(.*?)\n```", text[text.index(MARKER) :], re.DOTALL)
    assert match, f"no ```sql block right after the {MARKER} marker in {docs}"
    return match.group(1) + "\n"


def on_postgres(sql: str, role: str) -> str:
    """``sql`` as plain PostgreSQL runs it: the setting renamed to :data:`SETTING` (exactly one
    occurrence: the SET's target; the procedure's name ``set_yb_read_time`` is left alone) and the
    grantee ``cdc_reader`` replaced by ``role``."""
    renamed, settings = re.subn(r"(?<![\w.])yb_read_time\b", SETTING, sql)
    assert settings == 1, f"expected the one SET of yb_read_time, found {settings}"
    return with_role(renamed, role)


def with_role(sql: str, role: str) -> str:
    """``sql`` granting to ``role`` instead of the docs' ``cdc_reader``."""
    granted, count = re.subn(rf"\b{DOCS_ROLE}\b", role, sql)
    assert count >= 1, f"no grant to {DOCS_ROLE} in the procedure's SQL"
    return granted
