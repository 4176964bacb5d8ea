"""The SQL Server stand-in behaves like SQL Server's documented CDC behaviour, through pyodbc.

Everything goes the product's way: pyodbc -> psqlODBC -> the T-SQL proxy -> PostgreSQL 15.
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
import time
import uuid

import pyodbc
import pytest

from tests.standin.conftest import RECORDER
from tests.support.sqlserver import STATEMENTS, ZERO_LSN, InvalidTsql, assert_valid_tsql, lsn

pytestmark = pytest.mark.pg

ORDERS = (
    "CREATE TABLE [dbo].[orders] ([id] int NOT NULL PRIMARY KEY, [name] nvarchar(100) NULL, "
    "[amount] decimal(18,4) NULL, [created] datetime2(7) NULL)"
)
ALL_CHANGES = (
    "SELECT * FROM cdc.fn_cdc_get_all_changes_dbo_orders(?, ?, N'all update old') "
    "ORDER BY __$start_lsn, __$seqval, __$operation"
)


def _orders(sqlserver, enable: bool = True):
    sqlserver.execute_tsql(ORDERS)
    if enable:
        sqlserver.enable_db()
        sqlserver.enable_table("dbo", "orders")


def _window(sqlserver, instance: str = "dbo_orders") -> tuple[bytes, bytes]:
    low = sqlserver.execute_tsql("SELECT sys.fn_cdc_get_min_lsn(?)", (instance,))[0][0]
    high = sqlserver.execute_tsql("SELECT sys.fn_cdc_get_max_lsn()")[0][0]
    return low, high


def _changes(sqlserver, instance: str = "dbo_orders", option: str = "all update old"):
    low, high = _window(sqlserver, instance)
    return sqlserver.execute_tsql(
        f"SELECT * FROM [cdc].[fn_cdc_get_all_changes_{instance}](?, ?, N'{option}') "
        "ORDER BY [__$start_lsn], [__$seqval], [__$operation]",
        (low, high),
    )


def _raises_sqlserver_error(number: int, call, *args):
    with pytest.raises(pyodbc.Error) as info:
        call(*args)
    sqlstate, message = info.value.args
    assert f"({number})" in message, message
    return info.value, sqlstate, message


# ------------------------------------------------------------------------------ capture behaviour


def test_changes_appear_only_after_commit_and_capture(sqlserver):
    _orders(sqlserver)
    sqlserver.pause_capture()  # SQL Server Agent stopped
    agent = sqlserver.execute_tsql(
        "SELECT CASE WHEN dss.[status]=4 THEN 1 ELSE 0 END AS isRunning FROM sys.dm_server_services dss "
        "WHERE dss.[servicename] LIKE N'SQL Server Agent (%'"
    )
    assert agent == [(0,)]
    writer = sqlserver.connect(autocommit=False)
    writer.execute("INSERT INTO [dbo].[orders] ([id], [name]) VALUES (?, ?)", 1, "uncommitted")
    time.sleep(0.3)
    assert sqlserver.execute_tsql("SELECT sys.fn_cdc_get_max_lsn()") == [(None,)]
    writer.commit()
    time.sleep(0.3)  # committed, but the capture job is not running
    assert sqlserver.execute_tsql("SELECT COUNT(*) FROM [cdc].[dbo_orders_CT]") == [(0,)]
    sqlserver.resume_capture()
    sqlserver.wait_until_captured()
    assert [(r[2], r[4], r[5]) for r in _changes(sqlserver)] == [(2, 1, "uncommitted")]

    # capture latency: a commit shows up only after the configured lag
    sqlserver.set_capture_lag(1.0)
    writer.execute("INSERT INTO [dbo].[orders] ([id], [name]) VALUES (?, ?)", 2, "lagged")
    writer.commit()
    committed = time.monotonic()
    time.sleep(0.3)
    assert len(_changes(sqlserver)) == 1
    sqlserver.wait_until_captured()
    assert time.monotonic() - committed >= 0.95
    assert len(_changes(sqlserver)) == 2
    writer.close()


def test_commit_order_one_start_lsn_per_transaction_and_seqval_order(sqlserver):
    _orders(sqlserver)
    first, second = sqlserver.connect(autocommit=False), sqlserver.connect(autocommit=False)
    first.execute("INSERT INTO [dbo].[orders] ([id], [name]) VALUES (?, ?)", 1, "first-a")
    second.execute("INSERT INTO [dbo].[orders] ([id], [name]) VALUES (?, ?)", 2, "second")
    second.commit()  # commits before `first`, although it began later
    first.execute("INSERT INTO [dbo].[orders] ([id], [name]) VALUES (?, ?), (?, ?)", 3, "first-b", 4, "first-c")
    first.commit()
    sqlserver.wait_until_captured()
    rows = sqlserver.execute_tsql(
        ALL_CHANGES.replace("SELECT *", "SELECT __$start_lsn, __$seqval, id"), _window(sqlserver)
    )
    assert [r[2] for r in rows] == [2, 1, 3, 4]
    starts = [r[0] for r in rows]
    assert starts[0] < starts[1] == starts[2] == starts[3]
    assert rows[1][1] < rows[2][1] < rows[3][1]  # seqval orders changes inside the transaction
    assert all(len(r[0]) == len(r[1]) == 10 for r in rows)
    direct = sqlserver.execute_tsql(
        "SELECT [__$command_id], [id] FROM [cdc].[dbo_orders_CT] WHERE [__$start_lsn] = ? ORDER BY [__$command_id]",
        (starts[1],),
    )
    assert direct == [(1, 1), (2, 3), (3, 4)]
    mapping = sqlserver.execute_tsql(
        "SELECT start_lsn, tran_begin_time, tran_end_time, tran_id FROM cdc.lsn_time_mapping "
        "WHERE start_lsn BETWEEN ? AND ? AND tran_id <> 0x00 ORDER BY start_lsn",
        _window(sqlserver),
    )
    assert [m[0] for m in mapping] == [starts[0], starts[1]]
    assert all(isinstance(m[2], dt.datetime) and m[1] <= m[2] and len(m[3]) == 10 for m in mapping)
    first.close()
    second.close()


def test_update_and_delete_images_with_all_and_all_update_old(sqlserver):
    _orders(sqlserver)
    x = sqlserver.execute_tsql
    x("INSERT INTO [dbo].[orders] ([id], [name], [amount]) VALUES (?, ?, ?)", (1, "before", decimal.Decimal("1.5")))
    x("UPDATE [dbo].[orders] SET [name] = ? WHERE [id] = ?", ("after", 1))
    x("DELETE FROM [dbo].[orders] WHERE [id] = ?", (1,))
    x("INSERT INTO [dbo].[orders] ([id], [name]) VALUES (?, ?)", (5, "key"))
    x("UPDATE [dbo].[orders] SET [id] = ? WHERE [id] = ?", (6, 5))  # key update: delete + insert
    sqlserver.wait_until_captured()
    rows = _changes(sqlserver)
    ops = [(r[2], r[4], r[5]) for r in rows]
    assert ops == [
        (2, 1, "before"),
        (3, 1, "before"),
        (4, 1, "after"),
        (1, 1, "after"),
        (2, 5, "key"),
        (1, 5, "key"),
        (2, 6, "key"),
    ]
    assert rows[1][3] == rows[2][3] == b"\x02"  # update mask: column 2 (name) changed
    assert rows[0][3] == b"\x0f"  # insert: every captured column
    assert rows[1][1] == rows[2][1]  # before and after images share the seqval
    assert rows[5][0] == rows[6][0] and rows[5][1] == rows[6][1]
    assert rows[0][6] == decimal.Decimal("1.5000")
    assert [r[2] for r in _changes(sqlserver, option="all")] == [2, 4, 1, 2, 1, 2]
    cols = [d[0] for d in sqlserver.connect().execute(ALL_CHANGES, *_window(sqlserver)).description]
    assert cols == ["__$start_lsn", "__$seqval", "__$operation", "__$update_mask", "id", "name", "amount", "created"]


def test_the_function_has_no_command_id_column(sqlserver):
    """Like SQL Server, fn_cdc_get_all_changes_<ci> returns four metadata columns: ordering its
    result by __$command_id is error 207; __$command_id is only in the change table."""
    _orders(sqlserver)
    sqlserver.execute_tsql("INSERT INTO [dbo].[orders] ([id]) VALUES (1)")
    sqlserver.wait_until_captured()
    _raises_sqlserver_error(
        207, sqlserver.execute_tsql, ALL_CHANGES.replace("__$seqval", "__$command_id, __$seqval"), _window(sqlserver)
    )


def test_error_313_when_the_range_is_outside_the_validity_interval(sqlserver):
    _orders(sqlserver)
    sqlserver.execute_tsql("INSERT INTO [dbo].[orders] ([id]) VALUES (1)")
    sqlserver.wait_until_captured()
    low, high = _window(sqlserver)
    run = sqlserver.execute_tsql
    for bad in ((lsn.decrement(low), high), (low, lsn.increment(high)), (high, low), (ZERO_LSN, high)):
        error, sqlstate, message = _raises_sqlserver_error(313, run, ALL_CHANGES, bad)
        assert isinstance(error, pyodbc.ProgrammingError)
        assert sqlstate == "42000"
        assert (
            "An insufficient number of arguments were supplied for the procedure or function "
            "cdc.fn_cdc_get_all_changes_dbo_orders. (313)"
        ) in message
    assert len(run(ALL_CHANGES, (low, high))) == 1


def test_cleanup_purges_by_retention_and_raises_the_min_lsn(sqlserver):
    _orders(sqlserver)
    for i in range(3):
        sqlserver.execute_tsql("INSERT INTO [dbo].[orders] ([id]) VALUES (?)", (i,))
    sqlserver.wait_until_captured()
    low_before, high = _window(sqlserver)
    assert sqlserver.cleanup(retention_minutes=60) is None  # nothing is older than an hour
    assert _window(sqlserver)[0] == low_before
    time.sleep(0.01)
    water = sqlserver.cleanup(retention_minutes=0)  # everything is older than "now"
    low_after = _window(sqlserver)[0]
    assert water == low_after == high > low_before  # the newest commit older than the retention
    assert [r[4] for r in _changes(sqlserver)] == [2]
    _raises_sqlserver_error(313, sqlserver.execute_tsql, ALL_CHANGES, (low_before, high))
    assert sqlserver.execute_tsql("SELECT COUNT(*) FROM cdc.lsn_time_mapping WHERE start_lsn < ?", (low_after,)) == [
        (0,)
    ]


def test_two_capture_instances_after_a_schema_change(sqlserver):
    _orders(sqlserver)
    x = sqlserver.execute_tsql
    x("INSERT INTO [dbo].[orders] ([id], [name]) VALUES (1, N'old shape')")
    x("ALTER TABLE [dbo].[orders] ADD [phone] varchar(32) NULL")
    x("INSERT INTO [dbo].[orders] ([id], [name], [phone]) VALUES (2, N'after DDL', '555')")
    sqlserver.wait_until_captured()
    x(
        "EXEC sys.sp_cdc_enable_table @source_schema = N'dbo', @source_name = N'orders', @role_name = NULL, "
        "@capture_instance = N'dbo_orders_v2', @supports_net_changes = 0"
    )
    x("INSERT INTO [dbo].[orders] ([id], [name], [phone]) VALUES (3, N'new shape', '556')")
    sqlserver.wait_until_captured()
    instances = x(
        "SELECT s.name AS source_schema, t.name AS source_table, ct.capture_instance, ct.start_lsn, ct.end_lsn "
        "FROM cdc.change_tables ct JOIN sys.tables t ON t.object_id = ct.source_object_id "
        "JOIN sys.schemas s ON s.schema_id = t.schema_id ORDER BY ct.create_date"
    )
    assert [(i[0], i[1], i[2], i[4]) for i in instances] == [
        ("dbo", "orders", "dbo_orders", None),
        ("dbo", "orders", "dbo_orders_v2", None),
    ]
    old_start, new_start = instances[0][3], instances[1][3]
    assert old_start < new_start
    old = _changes(sqlserver, "dbo_orders")
    assert [r[4] for r in old] == [1, 2, 3]  # the old instance keeps capturing, with its own columns
    assert len(old[0]) == 8  # no phone
    new = _changes(sqlserver, "dbo_orders_v2")
    assert [(r[4], r[8]) for r in new] == [(3, "556")]  # starts at its start_lsn, with the new column
    assert _window(sqlserver, "dbo_orders_v2")[0] == new_start
    _raises_sqlserver_error(
        313,
        x,
        "SELECT * FROM cdc.fn_cdc_get_all_changes_dbo_orders_v2(?, ?, N'all')",
        (old_start, _window(sqlserver)[1]),
    )
    # Debezium's capture-instance query, with the newest instance per start_lsn
    debezium = x(
        "WITH ordered_change_tables AS (SELECT ROW_NUMBER() OVER (PARTITION BY ct.source_object_id, ct.start_lsn "
        "ORDER BY ct.create_date DESC) AS ct_sequence, ct.* FROM cdc.change_tables AS ct) "
        "SELECT OBJECT_SCHEMA_NAME(source_object_id, DB_ID(?)), OBJECT_NAME(source_object_id, DB_ID(?)), "
        "capture_instance, object_id, start_lsn FROM ordered_change_tables WHERE ct_sequence = 1 "
        "ORDER BY start_lsn",
        (sqlserver.database, sqlserver.database),
    )
    assert [(d[0], d[1], d[2]) for d in debezium] == [
        ("dbo", "orders", "dbo_orders"),
        ("dbo", "orders", "dbo_orders_v2"),
    ]
    _raises_sqlserver_error(22962, lambda: sqlserver.enable_table("dbo", "orders", capture_instance="dbo_orders_v3"))
    sqlserver.disable_table("dbo", "orders", "dbo_orders")
    _raises_sqlserver_error(208, x, ALL_CHANGES, _window(sqlserver, "dbo_orders_v2"))
    assert x("SELECT sys.fn_cdc_get_min_lsn(N'dbo_orders')") == [(ZERO_LSN,)]
    assert x("SELECT is_tracked_by_cdc FROM sys.tables WHERE name = N'orders'") == [(True,)]
    sqlserver.disable_table("dbo", "orders", "all")
    assert x("SELECT is_tracked_by_cdc FROM sys.tables WHERE name = N'orders'") == [(False,)]


def test_map_time_to_lsn_with_each_operator(sqlserver):
    _orders(sqlserver)
    for i in range(3):
        sqlserver.execute_tsql("INSERT INTO [dbo].[orders] ([id]) VALUES (?)", (i,))
        time.sleep(0.05)  # distinct datetime commit times (1/300 s ticks)
    sqlserver.wait_until_captured()
    (l1, t1), (l2, t2), (l3, t3) = sqlserver.execute_tsql(
        "SELECT start_lsn, tran_end_time FROM cdc.lsn_time_mapping ORDER BY start_lsn"
    )
    assert t1 < t2 < t3
    assert t2.microsecond % 1000 == 0 and (t2.microsecond // 1000) % 10 in (0, 3, 7)  # datetime precision

    def map_time(op):
        return sqlserver.execute_tsql(f"SELECT sys.fn_cdc_map_time_to_lsn(N'{op}', ?)", (t2,))[0][0]

    assert map_time("largest less than") == l1
    assert map_time("largest less than or equal") == l2
    assert map_time("smallest greater than") == l3
    assert map_time("smallest greater than or equal") == l2
    assert sqlserver.execute_tsql("SELECT sys.fn_cdc_map_time_to_lsn(N'largest less than', ?)", (t1,)) == [(None,)]
    assert sqlserver.execute_tsql("SELECT sys.fn_cdc_map_lsn_to_time(?)", (l2,)) == [(t2,)]
    _raises_sqlserver_error(313, sqlserver.execute_tsql, "SELECT sys.fn_cdc_map_time_to_lsn(N'nearest', ?)", (t2,))


def test_lsn_bytes_round_trip_and_order(sqlserver):
    _orders(sqlserver)
    for i in range(3):
        sqlserver.execute_tsql("INSERT INTO [dbo].[orders] ([id]) VALUES (?)", (i,))
    sqlserver.wait_until_captured()
    low, high = _window(sqlserver)
    x = sqlserver.execute_tsql
    assert isinstance(high, bytes) and len(high) == 10
    assert x("SELECT sys.fn_cdc_increment_lsn(?)", (high,)) == [(lsn.increment(high),)]
    assert x("SELECT sys.fn_cdc_decrement_lsn(?)", (high,)) == [(lsn.decrement(high),)]
    carry = bytes.fromhex("000000000000000000ff")
    assert x("SELECT sys.fn_cdc_increment_lsn(?)", (carry,)) == [(bytes.fromhex("00000000000000000100"),)]
    starts = [
        r[0]
        for r in x(
            "SELECT [__$start_lsn] FROM [cdc].[dbo_orders_CT] WHERE [__$start_lsn] >= ? "
            "AND [__$start_lsn] <= ? ORDER BY [__$start_lsn]",
            (low, high),
        )
    ]
    assert starts == sorted(starts) and len(set(starts)) == 3  # bytewise order = commit order
    hexed = x(
        "SELECT CONVERT(varchar(22), [__$start_lsn], 2), CONVERT(varchar(22), [__$start_lsn], 1) "
        "FROM [cdc].[dbo_orders_CT] WHERE [__$start_lsn] = ?",
        (high,),
    )
    assert hexed == [(high.hex().upper(), "0x" + high.hex().upper())]
    assert x(
        "SELECT start_lsn FROM cdc.lsn_time_mapping WHERE start_lsn IN (?, ?) ORDER BY start_lsn",
        (starts[0], starts[2]),
    ) == [(starts[0],), (starts[2],)]
    assert lsn.debezium_string(high).count(":") == 2


# ------------------------------------------------------------------------------ types and catalog

TYPES_TABLE = """CREATE TABLE [dbo].[all_types] (
    [id] int NOT NULL PRIMARY KEY, [c_bit] bit, [c_tinyint] tinyint, [c_smallint] smallint, [c_bigint] bigint,
    [c_decimal] decimal(18,4), [c_numeric] numeric(10,2), [c_money] money, [c_smallmoney] smallmoney,
    [c_real] real, [c_float] float, [c_date] date, [c_time] time(7), [c_datetime] datetime,
    [c_smalldatetime] smalldatetime, [c_datetime2] datetime2(7), [c_datetimeoffset] datetimeoffset(7),
    [c_char] char(3), [c_varchar] varchar(20), [c_nchar] nchar(3), [c_nvarchar] nvarchar(20),
    [c_nvarcharmax] nvarchar(max), [c_text] text, [c_ntext] ntext, [c_binary] binary(4), [c_varbinary] varbinary(16),
    [c_varbinarymax] varbinary(max), [c_uniqueidentifier] uniqueidentifier, [c_xml] xml, [c_rowversion] rowversion,
    [c_sql_variant] sql_variant, [c_hierarchyid] hierarchyid, [c_geometry] geometry, [c_geography] geography)"""

TYPES_INSERT = """INSERT INTO [dbo].[all_types] ([id], [c_bit], [c_tinyint], [c_smallint], [c_bigint], [c_decimal],
    [c_numeric], [c_money], [c_smallmoney], [c_real], [c_float], [c_date], [c_time], [c_datetime], [c_smalldatetime],
    [c_datetime2], [c_datetimeoffset], [c_char], [c_varchar], [c_nchar], [c_nvarchar], [c_nvarcharmax], [c_text],
    [c_ntext], [c_binary], [c_varbinary], [c_varbinarymax], [c_uniqueidentifier], [c_xml], [c_sql_variant],
    [c_hierarchyid], [c_geometry], [c_geography])
    VALUES (1, 1, 255, -32768, 9223372036854775807, 12345678901234.5678, 12345678.91, 922337203685477.5807, 214748.3647,
    1.5, 2.25, '2024-02-29', '23:59:59.123456', '2024-01-02 03:04:05.124', '2024-01-02 03:04:29.999',
    '2024-01-02 03:04:05.123456', '2024-01-02 03:04:05.123456 +00:00', 'ab', 'varchar', N'nc', N'héllo ☃',
    N'max ☃', 'text', N'ntext', 0x0102, 0x0A0B, 0xFFFF, '6F9619FF-8B86-D011-B42D-00C04FC964FF', N'<a>1</a>',
    N'variant', 0x58, 0xE6100000, 0xE6100000)"""

EXPECTED_PYTHON_TYPES = {
    "c_bit": bool,
    "c_tinyint": int,
    "c_smallint": int,
    "c_bigint": int,
    "c_decimal": decimal.Decimal,
    "c_numeric": decimal.Decimal,
    "c_money": decimal.Decimal,
    "c_smallmoney": decimal.Decimal,
    "c_real": float,
    "c_float": float,
    "c_date": dt.date,
    "c_time": dt.time,
    "c_datetime": dt.datetime,
    "c_smalldatetime": dt.datetime,
    "c_datetime2": dt.datetime,
    "c_datetimeoffset": dt.datetime,
    "c_char": str,
    "c_varchar": str,
    "c_nchar": str,
    "c_nvarchar": str,
    "c_nvarcharmax": str,
    "c_text": str,
    "c_ntext": str,
    "c_binary": bytes,
    "c_varbinary": bytes,
    "c_varbinarymax": bytes,
    "c_uniqueidentifier": str,
    "c_xml": str,
    "c_rowversion": bytes,
    "c_sql_variant": str,
    "c_hierarchyid": bytes,
    "c_geometry": bytes,
    "c_geography": bytes,
}


def test_pyodbc_types_and_sql_server_value_rules(sqlserver):
    x = sqlserver.execute_tsql
    x(TYPES_TABLE)
    x(TYPES_INSERT)
    conn = sqlserver.connect()
    cursor = conn.execute("SELECT * FROM [dbo].[all_types]")
    names = [d[0] for d in cursor.description]
    row = dict(zip(names, cursor.fetchone()))
    for name, expected in EXPECTED_PYTHON_TYPES.items():
        assert isinstance(row[name], expected), (name, type(row[name]), row[name])
    assert row["c_bit"] is True
    assert row["c_money"] == decimal.Decimal("922337203685477.5807")
    assert row["c_datetime"] == dt.datetime(2024, 1, 2, 3, 4, 5, 123000)  # .124 -> 1/300 s tick .123
    assert row["c_smalldatetime"] == dt.datetime(2024, 1, 2, 3, 5)  # 29.999 s rounds up
    assert row["c_binary"] == b"\x01\x02\x00\x00"  # binary(n) pads
    assert len(row["c_rowversion"]) == 8
    assert row["c_nvarchar"] == "héllo ☃" and row["c_char"] == "ab "
    before = row["c_rowversion"]
    x("UPDATE [dbo].[all_types] SET [c_varchar] = 'changed' WHERE [id] = 1")
    after = x("SELECT [c_rowversion] FROM [dbo].[all_types]")[0][0]
    assert after > before  # rowversion: a new, larger value on every update
    assert x(
        "SELECT CONVERT(varchar(27), [c_datetime2], 121), CONVERT(varchar(23), [c_datetime], 121), "
        "CONVERT(varchar(33), [c_datetime2], 126), CONVERT(varchar(16), [c_time], 121) FROM [dbo].[all_types]"
    ) == [("2024-01-02 03:04:05.1234560", "2024-01-02 03:04:05.123", "2024-01-02T03:04:05.1234560", "23:59:59.1234560")]
    _raises_sqlserver_error(220, x, "UPDATE [dbo].[all_types] SET [c_tinyint] = 256")

    declared = x(
        "SELECT c.name, ty.name, c.max_length, c.precision, c.scale FROM sys.columns c "
        "JOIN sys.types ty ON ty.user_type_id = c.user_type_id WHERE c.object_id = OBJECT_ID(?) "
        "ORDER BY c.column_id",
        ("dbo.all_types",),
    )
    by_name = {d[0]: d[1:] for d in declared}
    assert by_name["c_datetime2"] == ("datetime2", 8, 27, 7)
    assert by_name["c_nvarcharmax"] == ("nvarchar", -1, 0, 0)
    assert by_name["c_decimal"] == ("decimal", 9, 18, 4)
    assert by_name["c_uniqueidentifier"] == ("uniqueidentifier", 16, 0, 0)
    assert by_name["c_rowversion"] == ("timestamp", 8, 0, 0)
    assert by_name["c_ntext"][0] == "ntext" and by_name["c_geography"][0] == "geography"
    info = x(
        "SELECT COLUMN_NAME, DATA_TYPE, CHARACTER_MAXIMUM_LENGTH, NUMERIC_PRECISION, NUMERIC_SCALE, "
        "DATETIME_PRECISION, IS_NULLABLE FROM INFORMATION_SCHEMA.COLUMNS WHERE TABLE_SCHEMA = ? AND "
        "TABLE_NAME = ? ORDER BY ORDINAL_POSITION",
        ("dbo", "all_types"),
    )
    by_name = {i[0]: i[1:] for i in info}
    assert by_name["id"] == ("int", None, 10, 0, None, "NO")
    assert by_name["c_nvarchar"] == ("nvarchar", 20, None, None, None, "YES")
    assert by_name["c_datetimeoffset"][0] == "datetimeoffset" and by_name["c_datetimeoffset"][4] == 7
    assert by_name["c_money"][1:4] == (None, 19, 4)
    conn.close()


def test_catalog_and_server_identity(sqlserver):
    _orders(sqlserver)
    x = sqlserver.execute_tsql
    name, server, version, product = x("SELECT DB_NAME(), @@SERVERNAME, @@VERSION, SERVERPROPERTY('ProductVersion')")[0]
    assert name == sqlserver.database and server == "STANDIN"
    assert version.startswith("Microsoft SQL Server") and product.startswith("16.")
    guid = x("SELECT database_guid FROM sys.database_recovery_status WHERE database_id = DB_ID()")[0][0]
    assert (
        uuid.UUID(guid)
        and x("SELECT database_guid FROM sys.database_recovery_status WHERE database_id = DB_ID()")[0][0] == guid
    )
    assert x("SELECT is_cdc_enabled, snapshot_isolation_state FROM sys.databases WHERE name = DB_NAME()") == [(True, 0)]
    assert x(
        "SELECT kcu.COLUMN_NAME FROM INFORMATION_SCHEMA.TABLE_CONSTRAINTS tc JOIN "
        "INFORMATION_SCHEMA.KEY_COLUMN_USAGE kcu "
        "ON kcu.CONSTRAINT_NAME = tc.CONSTRAINT_NAME AND kcu.TABLE_SCHEMA = tc.TABLE_SCHEMA "
        "WHERE tc.CONSTRAINT_TYPE = 'PRIMARY KEY' AND tc.TABLE_SCHEMA = ? AND tc.TABLE_NAME = ? "
        "ORDER BY kcu.ORDINAL_POSITION",
        ("dbo", "orders"),
    ) == [("id",)]
    assert x(
        "SELECT i.is_primary_key, c.name FROM sys.indexes i JOIN sys.index_columns ic ON ic.object_id = i.object_id "
        "AND ic.index_id = i.index_id JOIN sys.columns c ON c.object_id = ic.object_id AND c.column_id = ic.column_id "
        "WHERE i.object_id = OBJECT_ID(N'dbo.orders')"
    ) == [(True, "id")]
    help_rows = sqlserver.connect().execute("EXEC sys.sp_cdc_help_change_data_capture")
    cols = [d[0] for d in help_rows.description]
    row = dict(zip(cols, help_rows.fetchone()))
    assert row["capture_instance"] == "dbo_orders" and row["index_column_list"] == "id"
    assert row["captured_column_list"] == "id, name, amount, created"
    assert x("SELECT column_name, column_type, column_ordinal FROM cdc.captured_columns ORDER BY column_ordinal")[
        3
    ] == ("created", "datetime2", 4)
    assert x("SELECT job_type, pollinginterval, retention FROM msdb.dbo.cdc_jobs ORDER BY job_type") == [
        ("capture", 5, 0),
        ("cleanup", 0, 4320),
    ]
    assert x("SELECT HAS_PERMS_BY_NAME('cdc.dbo_orders_CT', 'OBJECT', 'SELECT')") == [(1,)]
    x("INSERT INTO [dbo].[orders] ([id]) VALUES (1)")
    sqlserver.wait_until_captured()
    assert x("SELECT TOP 1 start_lsn FROM sys.dm_cdc_log_scan_sessions ORDER BY session_id DESC")[0][0] == (
        lsn.debezium_string(_window(sqlserver)[1])
    )
    assert x("SELECT [id], [name] FROM [dbo].[orders] WHERE [id] >= ? AND [id] < ? ORDER BY [id]", (0, 10)) == [
        (1, None)
    ]
    assert x("SELECT MIN([id]), MAX([id]), COUNT_BIG(*) FROM [dbo].[orders]") == [(1, 1, 1)]


def test_snapshot_isolation_error_3952_and_snapshot_reads(sqlserver):
    _orders(sqlserver)
    sqlserver.execute_tsql("INSERT INTO [dbo].[orders] ([id]) VALUES (1)")
    reader = sqlserver.connect(autocommit=True)
    reader.execute("SET TRANSACTION ISOLATION LEVEL SNAPSHOT")
    reader.execute("BEGIN TRANSACTION")
    with pytest.raises(pyodbc.Error) as info:
        reader.execute("SELECT COUNT_BIG(*) FROM [dbo].[orders]").fetchall()
    assert info.value.args[0] == "42000"
    assert "Snapshot isolation transaction failed accessing database" in info.value.args[1]
    assert "(3952)" in info.value.args[1]
    reader.execute("ROLLBACK")
    sqlserver.set_snapshot_isolation(True)
    assert sqlserver.execute_tsql("SELECT snapshot_isolation_state FROM sys.databases WHERE name = DB_NAME()") == [(1,)]
    reader.execute("BEGIN TRANSACTION")
    assert reader.execute("SELECT COUNT_BIG(*) FROM [dbo].[orders]").fetchall()[0][0] == 1
    sqlserver.execute_tsql("INSERT INTO [dbo].[orders] ([id]) VALUES (2)")  # committed by another session
    assert reader.execute("SELECT COUNT_BIG(*) FROM [dbo].[orders]").fetchall()[0][0] == 1  # the snapshot holds
    reader.execute("COMMIT")
    assert reader.execute("SELECT COUNT_BIG(*) FROM [dbo].[orders]").fetchall()[0][0] == 2
    reader.close()
    # manual-commit mode (pyodbc's default): the driver opens the transaction
    manual = sqlserver.connect(autocommit=False)
    manual.execute("SET TRANSACTION ISOLATION LEVEL SNAPSHOT")
    assert manual.execute("SELECT COUNT_BIG(*) FROM [dbo].[orders]").fetchall()[0][0] == 2
    sqlserver.execute_tsql("INSERT INTO [dbo].[orders] ([id]) VALUES (3)")
    assert manual.execute("SELECT COUNT_BIG(*) FROM [dbo].[orders]").fetchall()[0][0] == 2
    manual.commit()
    manual.close()


def test_permission_denied_surfaces_as_error_229(sqlserver):
    _orders(sqlserver)
    sqlserver.create_login("cdc_reader", "s3cret!")
    conn = pyodbc.connect(sqlserver.connection_string(user="cdc_reader", password="s3cret!"), autocommit=True)
    with pytest.raises(pyodbc.Error) as info:
        conn.execute("SELECT * FROM [cdc].[dbo_orders_CT]").fetchall()
    sqlstate, message = info.value.args
    assert sqlstate == "42000" and "The SELECT permission was denied on the object 'dbo_orders_CT'" in message
    assert "(229)" in message
    assert conn.execute("SELECT sys.fn_cdc_get_min_lsn(N'dbo_orders')").fetchone()[0] == ZERO_LSN  # not authorized
    assert conn.execute("SELECT HAS_PERMS_BY_NAME('cdc.dbo_orders_CT', 'OBJECT', 'SELECT')").fetchone()[0] == 0
    assert conn.execute("EXEC sys.sp_cdc_help_change_data_capture").fetchall() == []
    conn.close()


def test_another_process_needs_only_the_connection_string(sqlserver):
    """Spark's Python workers open their own pyodbc connections: nothing to patch, just the string."""
    import subprocess
    import sys

    _orders(sqlserver)
    sqlserver.execute_tsql("INSERT INTO [dbo].[orders] ([id]) VALUES (1)")
    high = sqlserver.wait_until_captured()
    code = (
        "import pyodbc, sys; c = pyodbc.connect(sys.argv[1]); "
        "print(c.execute('SELECT sys.fn_cdc_get_max_lsn()').fetchone()[0].hex())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, sqlserver.connection_string()], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == high.hex()


# ------------------------------------------------------------------------------ statements


def test_an_untranslatable_statement_fails_loudly(sqlserver):
    with pytest.raises(pyodbc.Error) as info:
        sqlserver.execute_tsql("SELECT * FROM cdc.fn_cdc_get_net_changes_dbo_orders(?, ?, N'all')", (b"0", b"1"))
    assert "cannot translate" in info.value.args[1] and "fn_cdc_get_net_changes_dbo_orders" in info.value.args[1]


def test_selects_come_through_the_drivers_cursor_a_page_at_a_time(sqlserver, monkeypatch):
    """psqlODBC reads a SELECT through a cursor of its own (``UseDeclareFetch=1``), ``CURSOR_ROWS``
    rows per FETCH, so a large result is never held whole in the client (SQL Server's drivers stream
    it). Its parameters arrive written into the statement (cast where psqlODBC casts them); the
    proxy translates only the product's statement, passes the driver's DECLARE/FETCH/CLOSE through,
    and records only the product's statement."""
    from tests.support.odbc import CURSOR_ROWS
    from tests.support.sqlserver import proxy

    sent: list[str] = []
    relay = proxy._Session._query

    def spy(session, body: bytes) -> bytes:
        out = relay(session, body)
        sent.append(out[5:].rstrip(b"\0").decode())
        return out

    monkeypatch.setattr(proxy._Session, "_query", spy)
    sqlserver.execute_tsql(
        "CREATE TABLE [dbo].[pages] ([id] int NOT NULL PRIMARY KEY, [at] datetime2(7) NOT NULL, "
        "[ratio] float NOT NULL, [note] nvarchar(50) NULL)"
    )
    total = 2 * CURSOR_ROWS + 7
    sqlserver.admin_query(
        "INSERT INTO dbo.pages SELECT g, timestamp '2024-01-01' + g * interval '1 second', g / 2.0, "
        "'note ' || g FROM generate_series(1, %s) g",
        (total,),
    )
    statement = (
        "SELECT [id], [at], [ratio], [note] FROM [dbo].[pages] "
        "WHERE [id] > ? AND [at] >= ? AND [ratio] >= ? AND [note] <> ? ORDER BY [id]"
    )
    marked = "it's; ::timestamp"  # what looks like a statement end or a driver cast inside a value
    conn = sqlserver.connect()
    cursor = conn.cursor()
    cursor.execute(statement, 0, dt.datetime(2024, 1, 1, 0, 0, 2), 1.0, marked)
    rows = []
    while page := cursor.fetchmany(CURSOR_ROWS):
        rows += page
    cursor.close()
    conn.close()
    assert [r[0] for r in rows] == list(range(2, total + 1))
    assert rows[0][1:] == (dt.datetime(2024, 1, 1, 0, 0, 2), 1.0, "note 2")

    declared = [m for m in sent if '"pages"' in m and "CREATE TABLE" not in m]
    assert len(declared) == 1 and declared[0].startswith('BEGIN;declare "SQL_CUR'), declared
    assert marked.replace("'", "''") in declared[0]  # the value as written: no cast dropped inside it
    # Later pages come with FETCHes of their own (the first behind the driver's savepoint, as the
    # cursor's transaction is open: SAVEPOINT _EXEC_SVP_x;fetch ...).
    fetches = [m for m in sent if f'fetch {CURSOR_ROWS} in "SQL_CUR' in m and "declare" not in m]
    assert len(fetches) >= 2, sent
    # Recorded as the product wrote it, with the values written in for its markers and no driver casts.
    recorded = [r for r in RECORDER.statements() if "[pages]" in r and r.startswith("SELECT")]
    assert recorded == [
        statement.split(" WHERE ")[0] + " WHERE [id] > 0 AND [at] >= '2024-01-01 00:00:02' AND [ratio] >= '1' "
        "AND [note] <> 'it''s; ::timestamp' ORDER BY [id]"
    ]
    assert not [r for r in RECORDER.statements() if re.match(r"\s*(declare|fetch|close|move)\b", r, re.I)]


def test_the_drivers_settings_hold_on_the_products_connection_string(sqlserver, monkeypatch):
    """The product passes no psqlODBC settings (its allowlist is Microsoft's driver's): they are the
    defaults of the driver entry the tests register (tests/support/odbc.py). Through the product's
    own connection string: a bit reads back as bool (BoolsAsChar=0), a SELECT comes through the
    driver's cursor CURSOR_ROWS rows per FETCH (UseDeclareFetch=1, Fetch), a statement with
    parameters as a Parse with $n markers (psqlODBC's default server-side prepare). A braced driver
    name would lose all of it silently (psqlODBC looks the entry up under the braced name)."""
    from airflow_provider_cdc.cdc.sources.sqlserver.connection import SqlServerConnectionInfo, connect
    from tests.support import odbc
    from tests.support.sqlserver import ODBC_DRIVER, proxy

    sent: list[str] = []
    query, parse = proxy._Session._query, proxy._Session._parse

    def spy_query(session, body: bytes) -> bytes:
        sent.append(body.rstrip(b"\0").decode())
        return query(session, body)

    def spy_parse(session, body: bytes):
        sent.append("Parse: " + body.split(b"\0")[1].decode())
        return parse(session, body)

    monkeypatch.setattr(proxy._Session, "_query", spy_query)
    monkeypatch.setattr(proxy._Session, "_parse", spy_parse)
    info = SqlServerConnectionInfo(
        host="127.0.0.1",
        port=sqlserver.proxy.port,
        database=sqlserver.database,
        user=sqlserver.cluster.superuser,
        password=sqlserver.cluster.password,
        driver=sqlserver.driver,
    )
    assert info.odbc().startswith(f"DRIVER={ODBC_DRIVER};") and info.options == ()
    _orders(sqlserver, enable=False)
    conn = connect(info)
    cursor = conn.cursor()
    assert cursor.execute("SELECT CAST(1 AS bit)").fetchone()[0] is True
    cursor.execute("UPDATE [dbo].[orders] SET [name] = ? WHERE [id] = ?", "x", 1)
    cursor.close()
    conn.close()
    assert any(m.startswith('BEGIN;declare "SQL_CUR') and f'fetch {odbc.CURSOR_ROWS} in "SQL_CUR' in m for m in sent)
    assert any(m.startswith("Parse: UPDATE") and "$2" in m for m in sent), sent


def test_a_failed_statement_rolls_back_only_itself(sqlserver):
    """psqlODBC's default rollback level (statement: a SAVEPOINT before each statement of a
    transaction, ROLLBACK TO on an error), as SQL Server does for a statement-terminating error
    such as a duplicate key (XACT_ABORT OFF, its default): the transaction and its earlier work stay."""
    _orders(sqlserver, enable=False)
    conn = sqlserver.connect(autocommit=False)
    conn.execute("INSERT INTO [dbo].[orders] ([id]) VALUES (?)", 1)
    with pytest.raises(pyodbc.IntegrityError):
        conn.execute("INSERT INTO [dbo].[orders] ([id]) VALUES (?)", 1)
    conn.execute("INSERT INTO [dbo].[orders] ([id]) VALUES (?)", 2)
    conn.commit()
    conn.close()
    assert sqlserver.execute_tsql("SELECT [id] FROM [dbo].[orders] ORDER BY [id]") == [(1,), (2,)]


def test_registry_statements_are_valid_tsql():
    for sql in STATEMENTS:
        assert_valid_tsql(sql)
    for bad in ("SELECT * FROM", "SELECT a FROM t WHERE", "SELEC 1"):
        with pytest.raises(InvalidTsql):
            assert_valid_tsql(bad)


def test_registry_statements_run_on_the_standin(sqlserver):
    """Every registered statement form translates and runs (with representative parameters)."""
    _orders(sqlserver)
    sqlserver.execute_tsql("INSERT INTO [dbo].[orders] ([id]) VALUES (1)")
    sqlserver.wait_until_captured()
    low, high = _window(sqlserver)
    skip = (
        "CREATE TABLE",
        "EXEC sys.sp_cdc_enable_db",
        "EXEC sys.sp_cdc_enable_table",
        "COMMIT",
        "ROLLBACK",
        "BEGIN",
        "EXEC sys.sp_cdc_disable_table",
        "ALTER TABLE",
    )
    probe = (dt.datetime.now(),)
    params_for = [  # (substring, parameters) for the statement forms with markers; first match wins
        ("fn_cdc_get_min_lsn(?)", ("dbo_orders",)),
        ("map_time_to_lsn", probe),
        ("TOP (?)", (5, low)),
        ("fn_cdc_increment_lsn", (low,)),
        ("fn_cdc_decrement_lsn", (high,)),
        ("map_lsn_to_time", (high,)),
        ("start_lsn >= ? AND tran_id", (low,)),
        ("start_lsn <= ? AND tran_end_time", (high, *probe, *probe)),
        ("tran_end_time >= ? AND tran_end_time", (*probe, *probe)),
        ("lsn", (low, high)),
        ("OBJECT_ID(?)", ("dbo.orders",)),
        ("INFORMATION_SCHEMA", ("dbo", "orders")),
        ("sys.tables", ("dbo", "orders")),
        ("INSERT", (2, "x")),
        ("UPDATE", ("y", 2)),
        ("DELETE", (2,)),
        ("[id] >= ?", (0, 10)),
    ]
    conn = sqlserver.connect(autocommit=True)
    for sql in STATEMENTS:
        if sql.startswith(skip):
            continue
        params = next((p for key, p in params_for if key in sql), ()) if "?" in sql else ()
        assert sql.count("?") == len(params), sql
        conn.execute(sql, *params)
    conn.close()


def test_every_recorded_statement_parses_as_tsql():
    """Runs last in this module: everything the tests above sent through the proxy is valid T-SQL."""
    recorded = RECORDER.statements()
    assert len(recorded) > 40
    assert RECORDER.invalid() == []


# ------------------------------------------------------------------------------ batches, permissions, msdb


def _results(cursor) -> list:
    """Every result of the statement: rows (a result with columns) or the row count."""
    out = []
    while True:
        out.append([tuple(r) for r in cursor.fetchall()] if cursor.description is not None else cursor.rowcount)
        if not cursor.nextset():
            return out


def test_a_batch_runs_statement_by_statement_with_sql_servers_results(sqlserver):
    """Variables live in the batch; DECLARE and SET send nothing; DML sends its row count unless SET
    NOCOUNT is ON, which stays on for the session (KB 240882)."""
    _orders(sqlserver, enable=False)
    conn = sqlserver.connect()
    cursor = conn.cursor()
    cursor.execute("DECLARE @x int = 5; SET @x = @x + 1; SELECT @x AS x")
    assert _results(cursor) == [[(6,)]]
    cursor.execute("INSERT INTO [dbo].[orders] ([id]) VALUES (?); SELECT COUNT(*) FROM [dbo].[orders]", 1)
    assert _results(cursor) == [1, [(1,)]]
    cursor.execute("SET NOCOUNT ON; INSERT INTO [dbo].[orders] ([id]) VALUES (2); SELECT COUNT(*) FROM [dbo].[orders]")
    assert _results(cursor) == [[(2,)]]
    cursor.execute("UPDATE [dbo].[orders] SET [name] = N'x'; SELECT COUNT(*) FROM [dbo].[orders]")  # still ON
    assert _results(cursor) == [[(2,)]]
    cursor.execute("SET NOCOUNT OFF; DELETE FROM [dbo].[orders] WHERE [id] = 2; SELECT COUNT(*) FROM [dbo].[orders]")
    assert _results(cursor) == [1, [(1,)]]
    with pytest.raises(pyodbc.Error, match=r'Must declare the scalar variable "@y"'):
        cursor.execute("DECLARE @x int; SELECT @y")
    conn.close()


def test_sp_getapplock_return_codes(sqlserver):
    """0 granted at once, -1 not granted within @LockTimeout (0: no wait), 1 granted after waiting,
    -999 a bad parameter (sp_getapplock's page, Return code values); a session lock is held until
    released or the session ends."""
    take = (
        "SET NOCOUNT ON; DECLARE @r int; EXEC @r = sys.sp_getapplock @Resource = N'res', @LockMode = N'{mode}', "
        "@LockOwner = N'Session', @LockTimeout = {timeout}; SELECT @r AS r"
    )
    first, second = sqlserver.connect(), sqlserver.connect()
    assert _results(first.cursor().execute(take.format(mode="Exclusive", timeout=0))) == [[(0,)]]
    assert _results(second.cursor().execute(take.format(mode="Exclusive", timeout=0))) == [[(-1,)]]
    assert _results(second.cursor().execute(take.format(mode="Exclusive", timeout=200))) == [[(-1,)]]
    assert _results(second.cursor().execute(take.format(mode="Sideways", timeout=0))) == [[(-999,)]]
    import threading

    threading.Timer(0.3, first.close).start()  # the session ends: its lock goes
    assert _results(second.cursor().execute(take.format(mode="Exclusive", timeout=5000))) == [[(1,)]]
    # Without NOCOUNT the procedure's own DML row count comes before the SELECT (a stand-in guess).
    cursor = second.cursor().execute(
        "SET NOCOUNT OFF; DECLARE @r int; EXEC @r = sys.sp_getapplock @Resource = N'res', @LockMode = N'Exclusive', "
        "@LockOwner = N'Session', @LockTimeout = 0; SELECT @r AS r"
    )
    assert _results(cursor) == [1, [(0,)]]
    second.cursor().execute("EXEC sys.sp_releaseapplock @Resource = N'res', @LockOwner = N'Session'")
    second.close()


def test_reading_change_data_needs_select_on_the_captured_columns_and_the_gating_role(sqlserver):
    """fn_cdc_get_min_lsn's Permissions: SELECT on all captured columns of the source table and
    membership of the gating role, which sp_cdc_enable_table creates when it does not exist."""
    sqlserver.execute_tsql(ORDERS)
    sqlserver.enable_db()
    sqlserver.enable_table("dbo", "orders", role_name="orders_gate", captured_column_list="[id], [name]")
    assert sqlserver.admin_query("SELECT count(*) FROM pg_roles WHERE rolname = 'orders_gate'") == [(1,)]
    sqlserver.execute_tsql("INSERT INTO [dbo].[orders] ([id], [name]) VALUES (1, N'a')")
    sqlserver.wait_until_captured()
    sqlserver.create_login("gated_reader", "s3cret!")
    sqlserver.execute_tsql("GRANT SELECT ON SCHEMA::[cdc] TO [gated_reader]")
    conn = pyodbc.connect(sqlserver.connection_string(user="gated_reader", password="s3cret!"), autocommit=True)
    low = sqlserver.execute_tsql("SELECT sys.fn_cdc_get_min_lsn(N'dbo_orders')")[0][0]
    high = sqlserver.execute_tsql("SELECT sys.fn_cdc_get_max_lsn()")[0][0]

    def readable() -> bool:
        return conn.execute("SELECT sys.fn_cdc_get_min_lsn(N'dbo_orders')").fetchone()[0] != ZERO_LSN

    assert not readable()
    assert [tuple(r) for r in conn.execute("SELECT capture_instance, role_name FROM cdc.change_tables")] == [
        ("dbo_orders", "orders_gate")  # the metadata table shows it (the cdc schema grant)
    ]
    assert conn.execute("EXEC sys.sp_cdc_help_change_data_capture").fetchall() == []  # only readable instances
    _raises_sqlserver_error(229, lambda: conn.execute(ALL_CHANGES, low, high).fetchall())
    assert conn.execute("SELECT IS_MEMBER(N'orders_gate')").fetchone()[0] == 0
    sqlserver.execute_tsql("ALTER ROLE [orders_gate] ADD MEMBER [gated_reader]")
    assert conn.execute("SELECT IS_MEMBER(N'orders_gate')").fetchone()[0] == 1
    assert not readable()  # membership without SELECT on the source's captured columns
    sqlserver.execute_tsql("GRANT SELECT ([id]) ON [dbo].[orders] TO [gated_reader]")
    assert not readable()  # [name] is captured too
    sqlserver.execute_tsql("GRANT SELECT ([name]) ON [dbo].[orders] TO [gated_reader]")
    assert readable()  # [amount] and [created] are not captured: not needed
    assert len(conn.execute(ALL_CHANGES, low, high).fetchall()) == 1
    assert [r[2] for r in conn.execute("EXEC sys.sp_cdc_help_change_data_capture").fetchall()] == ["dbo_orders"]
    sqlserver.execute_tsql("ALTER ROLE [orders_gate] DROP MEMBER [gated_reader]")
    assert not readable()
    conn.close()


def test_msdb_cdc_jobs_needs_a_grant_in_msdb_and_sp_cdc_help_jobs_needs_db_owner(sqlserver):
    _orders(sqlserver)
    sqlserver.create_login("jobs_reader", "s3cret!")
    conn = pyodbc.connect(sqlserver.connection_string(user="jobs_reader", password="s3cret!"), autocommit=True)
    query = "SELECT job_type, retention FROM msdb.dbo.cdc_jobs ORDER BY job_type"
    _, _, message = _raises_sqlserver_error(229, lambda: conn.execute(query).fetchall())
    assert "object 'cdc_jobs', database 'msdb'" in message
    _raises_sqlserver_error(22904, lambda: conn.execute("EXEC sys.sp_cdc_help_jobs").fetchall())
    sqlserver.grant_msdb_cdc_jobs("jobs_reader")
    assert [tuple(r) for r in conn.execute(query).fetchall()] == [("capture", 0), ("cleanup", 4320)]
    jobs = sqlserver.execute_tsql("EXEC sys.sp_cdc_help_jobs")  # the superuser: db_owner
    assert [(r[1], r[7]) for r in jobs] == [("capture", 0), ("cleanup", 4320)]
    conn.close()


def test_azure_sql_database_refuses_three_part_names_into_msdb(pg15):
    from tests.support.sqlserver import SqlServerStandIn

    with SqlServerStandIn(pg15, "ss_azure_msdb", azure_sql_database=True, recorder=RECORDER) as azure:
        azure.enable_db()
        conn = azure.connect()
        _, sqlstate, message = _raises_sqlserver_error(
            40515, lambda: conn.execute("SELECT retention FROM msdb.dbo.cdc_jobs").fetchall()
        )
        assert sqlstate == "42000"
        assert "Reference to database and/or server name in 'msdb.dbo.cdc_jobs' is not supported" in message
        assert [r[1] for r in conn.execute("EXEC sys.sp_cdc_help_jobs").fetchall()] == ["capture", "cleanup"]
        conn.close()
