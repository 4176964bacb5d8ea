"""Library code guards with explicit errors, never ``assert`` (issue 30, item 11): ``python -O``
strips asserts, so a guard written as one would let a run go on with a broken state."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import airflow_provider_cdc

PACKAGE = Path(airflow_provider_cdc.__file__).parent


def test_library_code_has_no_assert_statements():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        found += [f"{path.relative_to(PACKAGE.parent)}:{n.lineno}" for n in ast.walk(tree) if isinstance(n, ast.Assert)]
    assert found == [], "replace these asserts with explicit errors (a CdcError subclass, TypeError, RuntimeError)"


def test_a_guard_still_fires_under_python_O():
    # Restoring an offset from a commit log that has no committed window: with an assert as the
    # guard, ``python -O`` returned None as the offset and the run went on without one.
    code = """
from airflow_provider_cdc.cdc.basics.errors import CdcStateError
from airflow_provider_cdc.cdc.planning.offset import CaptureOffset, OffsetIdentity
from airflow_provider_cdc.cdc.planning.plan import restore_from_log
from airflow_provider_cdc.cdc.sinks.commit_log import CommitEntry
from airflow_provider_cdc.cdc.basics.window import Window

assert False, "this interpreter must run with -O"
entry = CommitEntry("shop", Window(1, "snapshot", None, None, 0), "a", (), 0, None, None, None, 0)
try:
    restore_from_log(entry, OffsetIdentity("shop", "1", "shop"), lambda: [], offset_type=CaptureOffset)
except CdcStateError as exc:
    print("refused:", exc)
else:
    print("no error")
"""
    result = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("refused: "), result.stdout
