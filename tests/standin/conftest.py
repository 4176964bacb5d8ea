"""A SQL Server stand-in per test, on the suite's PostgreSQL 15; one statement recorder for the module."""

from __future__ import annotations

import pytest

from tests.support.sqlserver import StatementRecorder
from tests.support.sqlserver.fixtures import standin_for

RECORDER = StatementRecorder()  # every statement the tests send, checked as T-SQL at the end


@pytest.fixture
def sqlserver(request, pg15):
    yield from standin_for(request, pg15, RECORDER)
