"""Every statement form the SQL Server source sends, and a check that each is valid T-SQL.

The stand-in translates T-SQL for PostgreSQL, so a statement SQL Server would reject could still
"work" in tests. ``STATEMENTS`` lists the product's statement forms (append to it from the
product's tests: ``STATEMENTS.append(...)``); ``assert_valid_tsql`` parses one with sqlglot's
T-SQL dialect. The proxy records every statement it receives (``StatementRecorder``), so a test
can also check everything actually sent during a session.
"""

from __future__ import annotations

import re
import threading

import sqlglot
from sqlglot import exp

# Valid T-SQL that sqlglot (30.x) cannot parse, or only parses as an opaque Command: checked
# against these exact grammars instead.
_SQLGLOT_GAPS = (
    re.compile(
        r"^\s*SET\s+TRANSACTION\s+ISOLATION\s+LEVEL\s+(READ\s+UNCOMMITTED|READ\s+COMMITTED|REPEATABLE\s+READ|SNAPSHOT|SERIALIZABLE)\s*;?\s*$",
        re.I,
    ),
    re.compile(
        r"^\s*ALTER\s+DATABASE\s+(CURRENT|\[?\w+\]?)\s+SET\s+(ALLOW_SNAPSHOT_ISOLATION|READ_COMMITTED_SNAPSHOT)\s+(ON|OFF)(\s+WITH\s+(ROLLBACK\s+IMMEDIATE|NO_WAIT))?\s*;?\s*$",
        re.I,
    ),
    re.compile(
        r"^\s*SET\s+(NOCOUNT|XACT_ABORT|ANSI_NULLS|QUOTED_IDENTIFIER|IMPLICIT_TRANSACTIONS)\s+(ON|OFF)\s*;?\s*$", re.I
    ),
    re.compile(r"^\s*SET\s+LOCK_TIMEOUT\s+-?\d+\s*;?\s*$", re.I),
    # GRANT/REVOKE with a securable class, and VIEW SERVER STATE (sqlglot reads only ``ON dbo.orders``):
    # learn.microsoft.com/en-us/sql/t-sql/statements/grant-schema-permissions-transact-sql,
    # .../grant-object-permissions-transact-sql, .../grant-server-permissions-transact-sql
    re.compile(
        r"^\s*(GRANT|REVOKE)\s+(SELECT|INSERT|UPDATE|DELETE|REFERENCES|EXECUTE)(\s*,\s*(SELECT|INSERT|UPDATE|DELETE|"
        r"REFERENCES|EXECUTE))*\s+ON\s+(SCHEMA\s*::\s*(\[[^\]]+\]|\w+)|OBJECT\s*::\s*((\[[^\]]+\]|\w+)\s*\.\s*)?"
        r"(\[[^\]]+\]|\w+))\s+(TO|FROM)\s+(\[[^\]]+\]|\w+)(\s*,\s*(\[[^\]]+\]|\w+))*\s*;?\s*$",
        re.I,
    ),
    # ALTER ROLE ... ADD | DROP MEMBER: learn.microsoft.com/en-us/sql/t-sql/statements/alter-role-transact-sql
    re.compile(r"^\s*ALTER\s+ROLE\s+(\[[^\]]+\]|\w+)\s+(ADD|DROP)\s+MEMBER\s+(\[[^\]]+\]|\w+)\s*;?\s*$", re.I),
    re.compile(
        r"^\s*(GRANT|REVOKE)\s+VIEW\s+(SERVER\s+STATE|ANY\s+DATABASE)\s+(TO|FROM)\s+(\[[^\]]+\]|\w+)(\s*,\s*(\[[^\]]+\]|\w+))*\s*;?\s*$",
        re.I,
    ),
)

STATEMENTS: list[str] = [
    "SELECT sys.fn_cdc_get_max_lsn()",
    "SELECT sys.fn_cdc_get_min_lsn(?)",
    "SELECT sys.fn_cdc_get_min_lsn(N'dbo_orders')",
    "SELECT sys.fn_cdc_increment_lsn(?)",
    "SELECT sys.fn_cdc_decrement_lsn(?)",
    "SELECT sys.fn_cdc_map_time_to_lsn(N'largest less than or equal', ?)",
    "SELECT sys.fn_cdc_map_time_to_lsn(N'largest less than', ?)",
    "SELECT sys.fn_cdc_map_time_to_lsn(N'smallest greater than', ?)",
    "SELECT sys.fn_cdc_map_time_to_lsn(N'smallest greater than or equal', ?)",
    "SELECT sys.fn_cdc_map_lsn_to_time(?)",
    # Not "ORDER BY __$start_lsn, __$command_id, ...": the function returns no __$command_id (error 207).
    "SELECT * FROM cdc.fn_cdc_get_all_changes_dbo_orders(?, ?, N'all update old') "
    "ORDER BY __$start_lsn, __$seqval, __$operation",
    "SELECT * FROM cdc.fn_cdc_get_all_changes_dbo_orders(?, ?, N'all') ORDER BY __$start_lsn, __$seqval, __$operation",
    "SELECT * FROM [cdc].[fn_cdc_get_all_changes_dbo_orders](?, ?, N'all update old') "
    "ORDER BY [__$start_lsn] ASC, [__$seqval] ASC, [__$operation] ASC",
    "SELECT * FROM [cdc].[dbo_orders_CT] WHERE [__$start_lsn] >= ? AND [__$start_lsn] <= ? "
    "ORDER BY [__$start_lsn], [__$command_id], [__$seqval], [__$operation]",
    # change_queries.changes_sql (direct; function mode re-reads one transaction so, with "= ?"): the
    # update-mask flag of a column a before image may not carry.
    "SELECT __$start_lsn, __$seqval, __$operation, __$command_id, [id] AS [id], "
    "sys.fn_cdc_has_column_changed(N'dbo_orders', N'name', __$update_mask) AS [__$changed_name] "
    "FROM cdc.[dbo_orders_CT] WHERE __$start_lsn >= ? AND __$start_lsn <= ? "
    "ORDER BY __$start_lsn, __$command_id, __$seqval, __$operation",
    "SELECT s.name AS source_schema, t.name AS source_table, ct.capture_instance, ct.object_id, ct.source_object_id, "
    "ct.start_lsn, ct.create_date FROM cdc.change_tables ct JOIN sys.tables t ON t.object_id = ct.source_object_id "
    "JOIN sys.schemas s ON s.schema_id = t.schema_id ORDER BY ct.create_date",
    "SELECT object_id, column_name, column_id, column_type, column_ordinal FROM cdc.captured_columns "
    "ORDER BY object_id, column_ordinal",
    "SELECT object_id, column_name, index_ordinal, column_id FROM cdc.index_columns ORDER BY object_id, index_ordinal",
    "EXEC sys.sp_cdc_help_change_data_capture",
    "SELECT start_lsn, tran_begin_time, tran_end_time, tran_id FROM cdc.lsn_time_mapping WHERE start_lsn IN (?, ?)",
    "SELECT start_lsn, tran_begin_time, tran_end_time, tran_id FROM cdc.lsn_time_mapping "
    "WHERE start_lsn BETWEEN ? AND ? AND tran_id <> 0x00 ORDER BY start_lsn",
    "SELECT MAX(start_lsn) FROM (SELECT TOP (?) start_lsn FROM cdc.lsn_time_mapping WHERE start_lsn >= ? "
    "AND tran_id <> 0x00 ORDER BY start_lsn) AS next_lsns",
    "SELECT is_cdc_enabled, snapshot_isolation_state FROM sys.databases WHERE name = DB_NAME()",
    "SELECT name, is_cdc_enabled, snapshot_isolation_state, is_read_committed_snapshot_on FROM sys.databases",
    "SELECT t.name, t.is_tracked_by_cdc FROM sys.tables t JOIN sys.schemas s ON s.schema_id = t.schema_id "
    "WHERE s.name = ? AND t.name = ?",
    "SELECT COLUMN_NAME, DATA_TYPE, CHARACTER_MAXIMUM_LENGTH, NUMERIC_PRECISION, NUMERIC_SCALE, DATETIME_PRECISION, "
    "IS_NULLABLE FROM INFORMATION_SCHEMA.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION",
    "SELECT kcu.COLUMN_NAME FROM INFORMATION_SCHEMA.TABLE_CONSTRAINTS tc JOIN INFORMATION_SCHEMA.KEY_COLUMN_USAGE kcu "
    "ON kcu.CONSTRAINT_NAME = tc.CONSTRAINT_NAME AND kcu.TABLE_SCHEMA = tc.TABLE_SCHEMA "
    "WHERE tc.CONSTRAINT_TYPE = 'PRIMARY KEY' AND tc.TABLE_SCHEMA = ? AND tc.TABLE_NAME = ? ORDER BY "
    "kcu.ORDINAL_POSITION",
    "SELECT c.name, ty.name AS type_name, c.max_length, c.precision, c.scale, c.is_nullable FROM sys.columns c "
    "JOIN sys.types ty ON ty.user_type_id = c.user_type_id WHERE c.object_id = OBJECT_ID(?) ORDER BY c.column_id",
    "SELECT DB_NAME(), @@SERVERNAME, @@VERSION, SERVERPROPERTY('ProductVersion')",
    "SELECT database_guid FROM sys.database_recovery_status WHERE database_id = DB_ID()",
    "SELECT HAS_PERMS_BY_NAME('cdc.dbo_orders_CT', 'OBJECT', 'SELECT')",
    "SELECT HAS_PERMS_BY_NAME('cdc', 'SCHEMA', 'SELECT')",
    "SELECT CASE WHEN dss.[status]=4 THEN 1 ELSE 0 END AS isRunning FROM sys.dm_server_services dss "
    "WHERE dss.[servicename] LIKE N'SQL Server Agent (%'",
    "SELECT TOP 1 start_lsn FROM sys.dm_cdc_log_scan_sessions ORDER BY session_id DESC",
    "SELECT job_type, pollinginterval, retention FROM msdb.dbo.cdc_jobs",
    "SET TRANSACTION ISOLATION LEVEL SNAPSHOT",
    "SET TRANSACTION ISOLATION LEVEL READ COMMITTED",
    "BEGIN TRANSACTION",
    "COMMIT",
    "COMMIT TRANSACTION",
    "ROLLBACK",
    "SELECT [id], [name] FROM [dbo].[orders] WHERE [id] >= ? AND [id] < ? ORDER BY [id]",
    "SELECT MIN([id]), MAX([id]), COUNT_BIG(*) FROM [dbo].[orders]",
    "SELECT CONVERT(varchar(27), [created], 121), CONVERT(varchar(33), [created], 126) FROM [dbo].[orders]",
    "SELECT CONVERT(varchar(22), [__$start_lsn], 2) FROM [cdc].[dbo_orders_CT]",
    "EXEC sys.sp_cdc_enable_db",
    "EXEC sys.sp_cdc_enable_table @source_schema = N'dbo', @source_name = N'orders', @role_name = NULL, "
    "@capture_instance = N'dbo_orders_v2', @supports_net_changes = 0",
    "EXEC sys.sp_cdc_disable_table @source_schema = N'dbo', @source_name = N'orders', "
    "@capture_instance = N'dbo_orders'",
    "ALTER TABLE [dbo].[orders] ADD [phone] varchar(32) NULL",
    "ALTER DATABASE CURRENT SET ALLOW_SNAPSHOT_ISOLATION ON",
    "CREATE TABLE [dbo].[orders] ([id] int NOT NULL PRIMARY KEY, [name] nvarchar(100) NULL, "
    "[created] datetime2(7) NULL)",
    "INSERT INTO [dbo].[orders] ([id], [name]) VALUES (?, ?)",
    "UPDATE [dbo].[orders] SET [name] = ? WHERE [id] = ?",
    "DELETE FROM [dbo].[orders] WHERE [id] = ?",
    # the capture lock (admin.LOCK_SQL, its marker written in) and the health check's sources
    "SET NOCOUNT ON; DECLARE @result int; EXEC @result = sys.sp_getapplock @Resource = N'airflow-provider-cdc:0', "
    "@LockMode = N'Exclusive', @LockOwner = N'Session', @LockTimeout = 0; SET NOCOUNT OFF; "
    "SELECT @result AS lock_result",
    "EXEC sys.sp_releaseapplock @Resource = N'airflow-provider-cdc:0', @LockOwner = N'Session'",
    "SELECT retention FROM msdb.dbo.cdc_jobs WHERE job_type = N'cleanup' AND database_id = DB_ID()",
    "EXEC sys.sp_cdc_help_jobs",
    # the server's clock (server_clock.OFFSET_SQL, REPEATED_HOUR_SQL, REPEATED_HOUR_COMMITS_SQL) and the
    # oldest unread commit (health.OLDEST_UNREAD_SQL)
    "SELECT DATEPART(TZOFFSET, SYSDATETIMEOFFSET()), SYSUTCDATETIME()",
    "SELECT tran_end_time FROM cdc.lsn_time_mapping "
    "WHERE start_lsn <= ? AND tran_end_time >= ? AND tran_end_time < ? ORDER BY start_lsn",
    "SELECT start_lsn, tran_end_time FROM cdc.lsn_time_mapping "
    "WHERE tran_end_time >= ? AND tran_end_time < ? ORDER BY start_lsn",
    "SELECT TOP (1) start_lsn, tran_end_time FROM cdc.lsn_time_mapping "
    "WHERE start_lsn >= ? AND tran_id <> 0x00 ORDER BY start_lsn",
    # telling "not authorized" from "disabled" (admin.instance_access_problem)
    "SELECT ct.role_name, s.name, t.name, ct.object_id FROM cdc.change_tables ct "
    "JOIN sys.tables t ON t.object_id = ct.source_object_id JOIN sys.schemas s ON s.schema_id = t.schema_id "
    "WHERE ct.capture_instance = N'dbo_orders'",
    "SELECT IS_MEMBER(N'db_owner')",
    "SELECT HAS_PERMS_BY_NAME(N'[dbo].[orders]', 'OBJECT', 'SELECT', N'id', 'COLUMN')",
]


class InvalidTsql(AssertionError):
    pass


def assert_valid_tsql(sql: str) -> None:
    """Raises InvalidTsql unless ``sql`` parses as T-SQL (``?`` markers allowed); a batch statement
    by statement."""
    from .translate import split_batch

    statements = split_batch(sql)
    if len(statements) > 1:
        for statement in statements:
            assert_valid_tsql(statement)
        return
    if any(gap.match(sql) for gap in _SQLGLOT_GAPS):
        return
    try:
        trees = sqlglot.parse(sql, read="tsql", error_level=sqlglot.ErrorLevel.RAISE)
    except sqlglot.errors.ParseError as error:
        raise InvalidTsql(f"not valid T-SQL: {sql!r}: {str(error).splitlines()[0]}") from error
    for tree in trees:
        if isinstance(tree, exp.Command) and not re.match(r"^\s*EXEC(UTE)?\b", sql, re.I):
            raise InvalidTsql(f"sqlglot could only read {sql!r} as an opaque command; add its grammar to _SQLGLOT_GAPS")


class StatementRecorder:
    """Every statement the proxy received from clients, in T-SQL form (``?`` markers; a SELECT's
    parameters as psqlODBC wrote them into its cursor's statement)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[str, None] = {}

    def record(self, sql: str) -> None:
        with self._lock:
            self._seen.setdefault(sql.strip(), None)

    def statements(self) -> list[str]:
        with self._lock:
            return list(self._seen)

    def invalid(self) -> list[str]:
        """Recorded statements that are not valid T-SQL, with the reason."""
        problems = []
        for sql in self.statements():
            try:
                assert_valid_tsql(sql)
            except InvalidTsql as error:
                problems.append(str(error))
        return problems
