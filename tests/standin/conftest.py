"""A SQL Server stand-in per test, on the suite's PostgreSQL 15; one statement recorder for the module."""

from __future__ import annotations

import pytest

from tests.support.sqlserver import StatementRecorder
from tests.support.sqlserver.fixtures import standin_for

RECORDER = StatementRecorder()  # every statement the tests send, checked as T-SQL at the end


@pytest.fixture
def sqlserver(request, pg15):
    yield from standin_for(request, pg15, RECORDER)


@pytest.fixture
def yugabyte(request, pg15):
    """A YugabyteDB stand-in per test (tests/support/yugabyte), on the suite's PostgreSQL 15."""
    from tests.support.yugabyte.fixtures import standin_for as yugabyte_standin_for

    yield from yugabyte_standin_for(request, pg15)
