"""A SQL Server stand-in for the SQL Server source's tests: PostgreSQL 15 emulating SQL Server's
CDC surface, reached through pyodbc + psqlODBC via a T-SQL-translating wire proxy.

Test support only; see docs/sqlserver-standin.md.
"""

from .lsn import ZERO_LSN, debezium_string
from .standin import ODBC_DRIVER, SqlServerStandIn
from .statements import STATEMENTS, InvalidTsql, StatementRecorder, assert_valid_tsql
from .translate import Untranslatable, translate

__all__ = [
    "ODBC_DRIVER",
    "STATEMENTS",
    "ZERO_LSN",
    "InvalidTsql",
    "SqlServerStandIn",
    "StatementRecorder",
    "Untranslatable",
    "assert_valid_tsql",
    "debezium_string",
    "translate",
]
