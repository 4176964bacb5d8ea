"""A SQL Server stand-in per test, on the suite's PostgreSQL 15; one statement recorder for the module."""

from __future__ import annotations

import hashlib
import re

import pytest

from tests.support.sqlserver import SqlServerStandIn, StatementRecorder

RECORDER = StatementRecorder()  # every statement the tests send, checked as T-SQL at the end


@pytest.fixture
def sqlserver(request, pg15):
    readable = re.sub(r"[^a-z0-9_]", "_", request.node.originalname.lower())[:30]
    digest = hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:6]
    standin = SqlServerStandIn(pg15, f"ss_{readable}_{digest}", recorder=RECORDER, poll_interval=0.05).start()
    try:
        yield standin
    finally:
        standin.stop()
