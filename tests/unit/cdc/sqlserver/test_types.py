"""SQL Server types → Arrow, for every type and handling mode, without a database.

Inputs are what pyodbc returns for each codec's ``select()``: native Python values, or the
text of ``CONVERT(varchar, [c], 121)`` as SQL Server prints it. The property-based tests format
Python values the way SQL Server's CONVERT styles print them (an oracle independent of the
module) and check the parsed result. The same mappings through pyodbc and a stand-in server:
tests/standin/test_sqlserver_types.py.
"""

from __future__ import annotations

import base64
import datetime as dt
import uuid
from decimal import Context, Decimal

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_cdc.cdc.events.value_modes import TIME_PRECISION_MODES, ValueModes
from airflow_provider_cdc.cdc.sources.sqlserver.types import (
    CATALOG_SQL,
    MAPPED_TYPES,
    Codec,
    SqlServerType,
    ValueConversionError,
    codec_for,
    text_codec,
)

SPARK = ValueModes()
ADAPTIVE = ValueModes(time_precision="adaptive")
ADAPTIVE_US = ValueModes(time_precision="adaptive_time_microseconds")
CONNECT = ValueModes(time_precision="connect")
TIME_MODES = {mode: ValueModes(time_precision=mode) for mode in TIME_PRECISION_MODES}
ALL_MODES = [
    ValueModes(decimal=d, time_precision=t, binary=b)
    for d in ("precise", "double", "string")
    for t in TIME_PRECISION_MODES
    for b in ("bytes", "base64", "hex")
]
UTC = dt.timezone.utc
EPOCH = dt.datetime(1970, 1, 1)


def T(name: str, max_length: int = 0, precision: int = 0, scale: int = 0) -> SqlServerType:
    return SqlServerType(name, max_length, precision, scale)


# The catalog's description of each declared type (sys.columns max_length, precision, scale).
BIT, TINYINT, SMALLINT, INT, BIGINT = (
    T("bit", 1, 1),
    T("tinyint", 1, 3),
    T("smallint", 2, 5),
    T("int", 4, 10),
    T("bigint", 8, 19),
)
REAL, FLOAT = T("real", 4, 24), T("float", 8, 53)
MONEY, SMALLMONEY = T("money", 8, 19, 4), T("smallmoney", 4, 10, 4)
DATE, DATETIME, SMALLDATETIME = T("date", 3, 10), T("datetime", 8, 23, 3), T("smalldatetime", 4, 16)


def decimal(precision: int, scale: int, name: str = "decimal") -> SqlServerType:
    return T(name, 17, precision, scale)


def time(n: int) -> SqlServerType:
    return T("time", 5, 8 + (n + 1 if n else 0), n)


def datetime2(n: int) -> SqlServerType:
    return T("datetime2", 8, 19 + (n + 1 if n else 0), n)


def datetimeoffset(n: int) -> SqlServerType:
    return T("datetimeoffset", 10, 26 + (n + 1 if n else 0), n)


def convert(sql_type: SqlServerType, values: list, modes: ValueModes = SPARK) -> list:
    codec = codec_for(sql_type, modes)
    array = codec.to_arrow(values)
    assert array.type == codec.arrow_type
    return array.to_pylist()


def one(sql_type: SqlServerType, value, modes: ValueModes = SPARK):
    result = convert(sql_type, [value, None], modes)
    assert result[1] is None
    return result[0]


def ints(sql_type: SqlServerType, values: list, modes: ValueModes) -> list:
    """Temporal results as plain integers (timestamps as their epoch count, dates as days)."""
    array = codec_for(sql_type, modes).to_arrow(values)
    if pa.types.is_timestamp(array.type) or pa.types.is_date(array.type):
        array = array.cast(pa.int64() if pa.types.is_timestamp(array.type) else pa.int32())
    return array.to_pylist()


def seconds_since_epoch(value: dt.datetime) -> int:
    return (value - EPOCH) // dt.timedelta(seconds=1)


# -- SqlServerType -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql_type", "declared"),
    [
        (datetime2(7), "datetime2(7)"),
        (datetime2(0), "datetime2(0)"),
        (time(3), "time(3)"),
        (datetimeoffset(7), "datetimeoffset(7)"),
        (T("nvarchar", -1), "nvarchar(max)"),
        (T("nvarchar", 20), "nvarchar(10)"),  # max_length is in bytes: two per character
        (T("nchar", 6), "nchar(3)"),
        (T("varchar", -1), "varchar(max)"),
        (T("varchar", 8000), "varchar(8000)"),
        (T("char", 3), "char(3)"),
        (T("varbinary", 16), "varbinary(16)"),
        (T("varbinary", -1), "varbinary(max)"),
        (T("binary", 4), "binary(4)"),
        (decimal(18, 4), "decimal(18,4)"),
        (decimal(5, 0, "numeric"), "numeric(5,0)"),
        (FLOAT, "float"),
        (REAL, "real"),
        (T("float", 8, 24), "float(24)"),
        (INT, "int"),
        (MONEY, "money"),
        (T("timestamp", 8), "timestamp"),
        (T("xml", -1), "xml"),
        (T("NVARCHAR", 40), "nvarchar(20)"),  # names are lower-cased
        (T("vector", 20), "vector"),
    ],
)
def test_declared(sql_type, declared):
    assert sql_type.declared() == declared


def test_json_round_trip():
    for sql_type in (datetime2(7), T("nvarchar", -1), decimal(38, 10), T("geography", -1), T("Int", 4, 10)):
        data = sql_type.to_json()
        assert data == {
            "name": sql_type.name,
            "max_length": sql_type.max_length,
            "precision": sql_type.precision,
            "scale": sql_type.scale,
        }
        assert SqlServerType.from_json(data) == sql_type
    assert SqlServerType.from_json({"name": "INT"}) == SqlServerType("int")
    assert T("Int").name == "int"


def test_catalog_sql_shape():
    assert CATALOG_SQL.count("?") == 2
    assert CATALOG_SQL.index("s.name = ?") < CATALOG_SQL.index("tb.name = ?")  # (schema, table)
    assert CATALOG_SQL.rstrip().endswith("ORDER BY c.column_id")


# -- Arrow types and select expressions ----------------------------------------------------------

SELECT_COLUMN = "[c]"
CONVERT_121 = {
    "time": "CONVERT(varchar(16), [c], 121)",
    "datetime": "CONVERT(varchar(23), [c], 121)",
    "smalldatetime": "CONVERT(varchar(23), [c], 121)",
    "datetime2": "CONVERT(varchar(27), [c], 121)",
    "datetimeoffset": "CONVERT(varchar(34), [c], 121)",
}


@pytest.mark.parametrize(
    ("sql_type", "modes", "arrow_type"),
    [
        (BIT, SPARK, pa.bool_()),
        (TINYINT, SPARK, pa.int16()),
        (SMALLINT, SPARK, pa.int16()),
        (INT, SPARK, pa.int32()),
        (BIGINT, SPARK, pa.int64()),
        (decimal(18, 4), SPARK, pa.decimal128(18, 4)),
        (decimal(38, 0, "numeric"), SPARK, pa.decimal128(38, 0)),
        (decimal(18, 4), ValueModes(decimal="double"), pa.float64()),
        (decimal(18, 4), ValueModes(decimal="string"), pa.string()),
        (MONEY, SPARK, pa.decimal128(19, 4)),
        (SMALLMONEY, SPARK, pa.decimal128(10, 4)),
        (MONEY, ValueModes(decimal="double"), pa.float64()),
        (SMALLMONEY, ValueModes(decimal="string"), pa.string()),
        (REAL, SPARK, pa.float32()),
        (FLOAT, SPARK, pa.float64()),
        (T("float", 4, 24), SPARK, pa.float32()),
        (T("float", 8, 25), SPARK, pa.float64()),
        (DATE, SPARK, pa.date32()),
        (DATE, CONNECT, pa.date32()),
        (DATE, ADAPTIVE, pa.int32()),
        (DATE, ADAPTIVE_US, pa.int32()),
        (time(7), SPARK, pa.int64()),
        (time(0), SPARK, pa.int64()),
        (time(3), ADAPTIVE, pa.int32()),
        (time(4), ADAPTIVE, pa.int64()),
        (time(6), ADAPTIVE, pa.int64()),
        (time(7), ADAPTIVE, pa.int64()),
        (time(3), ADAPTIVE_US, pa.int64()),
        (time(7), CONNECT, pa.int32()),
        (DATETIME, SPARK, pa.timestamp("us")),
        (DATETIME, ADAPTIVE, pa.int64()),
        (DATETIME, CONNECT, pa.timestamp("ms")),
        (SMALLDATETIME, SPARK, pa.timestamp("us")),
        (SMALLDATETIME, ADAPTIVE_US, pa.int64()),
        (datetime2(7), SPARK, pa.timestamp("us")),
        (datetime2(3), ADAPTIVE, pa.int64()),
        (datetime2(7), ADAPTIVE, pa.int64()),
        (datetime2(7), CONNECT, pa.timestamp("ms")),
        (datetimeoffset(7), SPARK, pa.timestamp("us", tz="UTC")),
        (datetimeoffset(7), ADAPTIVE, pa.string()),
        (datetimeoffset(0), ADAPTIVE_US, pa.string()),
        (datetimeoffset(3), CONNECT, pa.string()),
        (T("char", 3), SPARK, pa.string()),
        (T("varchar", -1), SPARK, pa.string()),
        (T("nchar", 2), SPARK, pa.string()),
        (T("nvarchar", 40), SPARK, pa.string()),
        (T("text", 16), SPARK, pa.string()),
        (T("ntext", 16), SPARK, pa.string()),
        (T("xml", -1), SPARK, pa.string()),
        (T("uniqueidentifier", 16), SPARK, pa.string()),
        (T("sql_variant", 8016), SPARK, pa.string()),
        (T("binary", 4), SPARK, pa.binary()),
        (T("varbinary", -1), ValueModes(binary="base64"), pa.string()),
        (T("image", 16), ValueModes(binary="hex"), pa.string()),
        (T("timestamp", 8), SPARK, pa.binary()),
        (T("hierarchyid", 892), SPARK, pa.binary()),
        (T("geometry", -1), ValueModes(binary="hex"), pa.string()),
        (T("geography", -1), SPARK, pa.binary()),
        (T("vector", 20), SPARK, pa.string()),
    ],
)
def test_arrow_types(sql_type, modes, arrow_type):
    assert codec_for(sql_type, modes).arrow_type == arrow_type


@pytest.mark.parametrize(
    ("sql_type", "select"),
    [
        (INT, "[c]"),
        (decimal(18, 4), "[c]"),
        (DATE, "[c]"),
        (T("nvarchar", -1), "[c]"),
        (T("uniqueidentifier", 16), "[c]"),
        (T("varbinary", -1), "[c]"),
        (T("timestamp", 8), "[c]"),
        (time(7), CONVERT_121["time"]),
        (DATETIME, CONVERT_121["datetime"]),
        (SMALLDATETIME, CONVERT_121["smalldatetime"]),
        (datetime2(3), CONVERT_121["datetime2"]),
        (datetimeoffset(7), CONVERT_121["datetimeoffset"]),
        (T("xml", -1), "CAST([c] AS nvarchar(max))"),
        (T("sql_variant", 8016), "CAST([c] AS nvarchar(max))"),
        (T("hierarchyid", 892), "CAST([c] AS varbinary(max))"),
        (T("geometry", -1), "CAST([c] AS varbinary(max))"),
        (T("geography", -1), "CAST([c] AS varbinary(max))"),
        (T("vector", 20), "CAST([c] AS nvarchar(max))"),
    ],
)
def test_select_is_the_same_in_every_mode(sql_type, select):
    for modes in ALL_MODES:
        assert codec_for(sql_type, modes).select(SELECT_COLUMN) == select
        assert text_codec(sql_type, modes).select(SELECT_COLUMN) == select


def test_select_keeps_the_column_reference_verbatim():
    assert codec_for(datetime2(7), SPARK).select("[a {0} ]]b]") == "CONVERT(varchar(27), [a {0} ]]b], 121)"


EVERY_TYPE = [
    BIT,
    TINYINT,
    SMALLINT,
    INT,
    BIGINT,
    decimal(18, 4),
    decimal(38, 38),
    MONEY,
    SMALLMONEY,
    REAL,
    FLOAT,
    DATE,
    *(time(n) for n in range(8)),
    DATETIME,
    SMALLDATETIME,
    *(datetime2(n) for n in range(8)),
    *(datetimeoffset(n) for n in range(8)),
    *(T(name, 10) for name in ("char", "varchar", "nchar", "nvarchar", "binary", "varbinary")),
    *(T(name, -1) for name in ("varchar", "nvarchar", "varbinary", "xml", "geometry", "geography")),
    *(T(name, 16) for name in ("text", "ntext", "image", "uniqueidentifier")),
    T("timestamp", 8),
    T("sql_variant", 8016),
    T("hierarchyid", 892),
    T("sysname", 256),
    T("vector", 20),
]
SPARK_READABLE = (
    pa.bool_(),
    pa.int16(),
    pa.int32(),
    pa.int64(),
    pa.float32(),
    pa.float64(),
    pa.string(),
    pa.binary(),
    pa.date32(),
    pa.timestamp("us"),
    pa.timestamp("ms"),
    pa.timestamp("us", tz="UTC"),
)


def test_every_codec_has_a_spark_readable_type_and_keeps_nulls():
    for sql_type in EVERY_TYPE:
        for modes in ALL_MODES:
            for codec in (codec_for(sql_type, modes), text_codec(sql_type, modes)):
                assert codec.arrow_type in SPARK_READABLE or pa.types.is_decimal128(codec.arrow_type), (sql_type, modes)
                assert sql_type.declared() in codec.description
                for values in ([], [None, None]):
                    array = codec.to_arrow(values)
                    assert array.type == codec.arrow_type and array.to_pylist() == values


def test_text_codec_is_always_a_string():
    for sql_type in EVERY_TYPE:
        codec = text_codec(sql_type, SPARK)
        assert codec.arrow_type == pa.string() and "column_text_list" in codec.description


# -- numbers -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql_type", "values"),
    [
        (TINYINT, [0, 255]),
        (SMALLINT, [-32768, 32767]),
        (INT, [-(2**31), 2**31 - 1]),
        (BIGINT, [-(2**63), 2**63 - 1]),
    ],
)
def test_integers(sql_type, values):
    assert convert(sql_type, [*values, None]) == [*values, None]


def test_integer_out_of_range_names_the_value():
    with pytest.raises(ValueConversionError, match=r"column 'n' of dbo\.t: value 70000 cannot be captured as int16"):
        codec_for(SMALLINT, SPARK).to_arrow([1, None, 70000, 2], column="n", table="dbo.t")


def test_bit():
    assert convert(BIT, [True, False, None, 1, 0]) == [True, False, None, True, False]
    with pytest.raises(ValueConversionError, match="value 2 cannot be captured as boolean"):
        convert(BIT, [True, 2])


def test_decimal_modes():
    values = [Decimal("12345678901234.5678"), Decimal("-0.0001"), Decimal("1.5"), Decimal("0"), None]
    assert convert(decimal(18, 4), values) == [
        Decimal("12345678901234.5678"),
        Decimal("-0.0001"),
        Decimal("1.5000"),
        Decimal("0.0000"),
        None,
    ]
    assert convert(decimal(18, 4), values, ValueModes(decimal="double")) == [
        12345678901234.5678,
        -0.0001,
        1.5,
        0.0,
        None,
    ]
    # Debezium's string form: BigDecimal.toPlainString() at the column's scale
    assert convert(decimal(18, 4), values, ValueModes(decimal="string")) == [
        "12345678901234.5678",
        "-0.0001",
        "1.5000",
        "0.0000",
        None,
    ]
    assert one(decimal(5, 2), Decimal("-0.00"), ValueModes(decimal="string")) == "0.00"  # no negative zero
    assert one(decimal(10, 0), Decimal("1E+3"), ValueModes(decimal="string")) == "1000"


def test_decimal_38_digits():
    big = Decimal("9" * 28 + "." + "9" * 10)
    assert one(decimal(38, 10), big) == big
    assert one(decimal(38, 10), big.copy_negate(), ValueModes(decimal="string")) == "-" + "9" * 28 + "." + "9" * 10
    assert one(decimal(38, 38), Decimal("0." + "1" * 38)) == Decimal("0." + "1" * 38)
    assert one(decimal(38, 0), Decimal(10**38 - 1)) == Decimal(10**38 - 1)


def test_decimal_that_does_not_fit_names_the_value():
    codec = codec_for(decimal(5, 2), SPARK)
    with pytest.raises(ValueConversionError) as info:
        codec.to_arrow([Decimal("1.5"), None, Decimal("1234.5")], column="amount", table="dbo.orders")
    message = str(info.value)
    assert "column 'amount' of dbo.orders: value Decimal('1234.5') cannot be captured as decimal (decimal(5,2))" in (
        message
    )
    assert "more than 3 integer or 2 fraction digits" in message
    assert "decimal_handling_mode='string'" in message
    with pytest.raises(ValueConversionError, match=r"Decimal\('1\.234'\)"):
        codec.to_arrow([Decimal("1.234")])
    # the string mode keeps what it is given rather than rounding it away
    assert one(decimal(5, 2), Decimal("1.234"), ValueModes(decimal="string")) == "1.234"


def test_decimal_without_a_fitting_arrow_type_keeps_its_text():
    codec = codec_for(T("decimal", 17, 0, 0), SPARK)  # no precision: not a real catalog row
    assert codec.arrow_type == pa.string()
    assert codec.to_arrow([Decimal("1.5")]).to_pylist() == ["1.5"]


def test_money():
    assert convert(MONEY, [Decimal("922337203685477.5807"), Decimal("-922337203685477.5808"), Decimal("1.5")]) == [
        Decimal("922337203685477.5807"),
        Decimal("-922337203685477.5808"),
        Decimal("1.5000"),
    ]
    assert one(SMALLMONEY, Decimal("-214748.3648")) == Decimal("-214748.3648")
    assert one(MONEY, Decimal("-1234.56"), ValueModes(decimal="string")) == "-1234.5600"
    assert one(SMALLMONEY, Decimal("214748.3647"), ValueModes(decimal="double")) == 214748.3647


def test_floats():
    assert convert(REAL, [3.140000104904175, -0.0, 3.4028234663852886e38, None])[:3] == pytest.approx(
        [3.14, -0.0, 3.4028235e38]
    )
    assert np.float32(one(REAL, 3.140000104904175)) == np.float32(3.14)
    assert one(FLOAT, 0.1) == 0.1
    assert one(FLOAT, -1.7976931348623157e308) == -1.7976931348623157e308


# -- dates and times -----------------------------------------------------------------------------


def test_date():
    values = [dt.date(2024, 2, 29), dt.date(1, 1, 1), dt.date(9999, 12, 31), dt.date(1969, 12, 31), None]
    assert convert(DATE, values) == values
    assert convert(DATE, values, CONNECT) == values
    for modes in (ADAPTIVE, ADAPTIVE_US):
        assert convert(DATE, values, modes) == [19782, -719162, 2932896, -1, None]


TIME_CASES = {
    # text: {mode: value}; spark: µs since midnight; adaptive by precision; connect: ms
    "00:00:00": 0,
    "13:14:15": 47_655_000_000_000,
    "13:14:15.123": 47_655_123_000_000,
    "23:59:59.9999999": 86_399_999_999_900,
    "00:00:00.0000001": 100,
}


@pytest.mark.parametrize("text", list(TIME_CASES))
def test_time_in_every_mode(text):
    nanos = TIME_CASES[text]
    for n in range(8):
        sql_type = time(n)
        assert one(sql_type, text, SPARK) == nanos // 1000  # microseconds, the 7th digit truncated
        assert one(sql_type, text, ADAPTIVE_US) == nanos // 1000  # MicroTime
        assert one(sql_type, text, CONNECT) == nanos // 1_000_000  # Time (ms)
        adaptive = nanos // 1_000_000 if n <= 3 else nanos // 1000 if n <= 6 else nanos
        assert one(sql_type, text, ADAPTIVE) == adaptive  # Time / MicroTime / NanoTime


def test_time_100ns_digits_are_kept_only_in_nanotime():
    assert one(time(7), "12:00:00.1234567", ADAPTIVE) == 43_200_123_456_700
    assert one(time(7), "12:00:00.1234567", SPARK) == 43_200_123_456  # truncated, not rounded
    assert one(time(7), "12:00:00.1234567", ADAPTIVE_US) == 43_200_123_456


def micros(*args) -> int:
    return (dt.datetime(*args) - EPOCH) // dt.timedelta(microseconds=1)


def test_datetime_keeps_what_convert_121_prints():
    # datetime counts 1/300 s; SQL Server prints (and Debezium reads) the rounded millisecond.
    values = ["2024-01-02 03:04:05.003", "2024-01-02 03:04:05.007", "1753-01-01 00:00:00.000", None]
    assert convert(DATETIME, values) == [
        dt.datetime(2024, 1, 2, 3, 4, 5, 3000),
        dt.datetime(2024, 1, 2, 3, 4, 5, 7000),
        dt.datetime(1753, 1, 1),
        None,
    ]
    assert convert(DATETIME, values, ADAPTIVE) == [
        micros(2024, 1, 2, 3, 4, 5, 3000) // 1000,
        micros(2024, 1, 2, 3, 4, 5, 7000) // 1000,
        -6847804800000,
        None,
    ]
    assert convert(DATETIME, values, CONNECT)[1] == dt.datetime(2024, 1, 2, 3, 4, 5, 7000)
    assert one(DATETIME, "9999-12-31 23:59:59.997", ADAPTIVE_US) == 253402300799997


def test_smalldatetime():
    assert one(SMALLDATETIME, "2079-06-06 23:59:00.000") == dt.datetime(2079, 6, 6, 23, 59)
    assert one(SMALLDATETIME, "1900-01-01 00:00:00", ADAPTIVE) == -2208988800000


@pytest.mark.parametrize("n", range(8))
def test_datetime2_in_every_mode(n):
    digits = "1234567"[:n]
    text = "2024-01-02 03:04:05" + (f".{digits}" if n else "")
    nanos = int(digits.ljust(9, "0")) if n else 0
    seconds = seconds_since_epoch(dt.datetime(2024, 1, 2, 3, 4, 5))
    assert ints(datetime2(n), [text], SPARK) == [seconds * 10**6 + nanos // 1000]
    assert ints(datetime2(n), [text], CONNECT) == [seconds * 10**3 + nanos // 10**6]
    adaptive = seconds * 10**3 + nanos // 10**6 if n <= 3 else seconds * 10**6 + nanos // 1000
    if n == 7:
        adaptive = seconds * 10**9 + nanos
    for modes in (ADAPTIVE, ADAPTIVE_US):
        assert ints(datetime2(n), [text], modes) == [adaptive]


def test_datetime2_100ns_digits():
    # spark: the 7th digit is truncated (floor, towards the earlier instant), never rounded up
    assert one(datetime2(7), "9999-12-31 23:59:59.9999999") == dt.datetime(9999, 12, 31, 23, 59, 59, 999999)
    assert one(datetime2(7), "1969-12-31 23:59:59.9999999") == dt.datetime(1969, 12, 31, 23, 59, 59, 999999)
    assert ints(datetime2(7), ["1969-12-31 23:59:59.9999999"], SPARK) == [-1]
    assert ints(datetime2(7), ["1969-12-31 23:59:59.9999999"], CONNECT) == [-1]
    # adaptive: NanoTimestamp keeps all seven digits
    assert one(datetime2(7), "1969-12-31 23:59:59.9999999", ADAPTIVE) == -100
    assert one(datetime2(7), "2024-01-02 03:04:05.1234567", ADAPTIVE) == 1704164645123456700
    assert one(datetime2(7), "1677-09-21 00:12:43.1452242", ADAPTIVE) == -(2**63) + 8  # near int64's end


def test_datetime2_nanotimestamp_range():
    codec = codec_for(datetime2(7), ADAPTIVE)
    with pytest.raises(ValueConversionError) as info:
        codec.to_arrow(["2024-01-01 00:00:00.0000000", None, "9999-12-31 23:59:59.9999999"], column="c", table="t")
    assert "value '9999-12-31 23:59:59.9999999' cannot be captured as int64 ns since 1970" in str(info.value)
    assert "time_precision_mode='spark'" in str(info.value)
    with pytest.raises(ValueConversionError, match="0001-01-01"):
        codec.to_arrow(["0001-01-01 00:00:00.0000000"])
    # the same values in the other modes
    assert one(datetime2(7), "0001-01-01 00:00:00.0000000") == dt.datetime(1, 1, 1)
    assert one(datetime2(6), "0001-01-01 00:00:00.000000", ADAPTIVE) == -62135596800000000


def test_timestamps_accept_what_other_styles_print():
    # The codecs read style 121; style 126's "T" and any digit count (up to 9) parse the same.
    assert one(datetime2(3), "2024-01-02T03:04:05.5") == dt.datetime(2024, 1, 2, 3, 4, 5, 500000)
    assert one(datetime2(3), "2024-01-02 03:04:05.5000000", ADAPTIVE) == micros(2024, 1, 2, 3, 4, 5, 500000) // 1000
    assert one(DATETIME, "2024-01-02T03:04:05") == dt.datetime(2024, 1, 2, 3, 4, 5)


@pytest.mark.parametrize(
    "bad",
    [
        "2024-02-30 00:00:00.000",  # no such day
        "2024-13-01 00:00:00.000",
        "2024-01-01 24:00:00.000",
        "2024-01-01 00:60:00.000",
        "2024-01-01 00:00:00.1234567890",  # ten digits
        "2024-01-01 00:00:00 +00:00",  # an offset on a zone-less type
        "Jan  1 2024 12:00AM",  # style 0: the select was not applied
        "",
    ],
)
def test_timestamp_text_that_is_not_convert_121_fails_naming_it(bad):
    for modes in TIME_MODES.values():
        with pytest.raises(ValueConversionError, match="value " + repr(bad).replace("+", r"\+")):
            codec_for(datetime2(3), modes).to_arrow(["2024-01-01 00:00:00.000", bad])


def test_native_value_instead_of_the_select_text_fails_clearly():
    with pytest.raises(ValueConversionError, match=r"datetime\.datetime\(2024, 1, 1, 0, 0\).*Codec\.select"):
        codec_for(datetime2(7), SPARK).to_arrow([dt.datetime(2024, 1, 1)])


@pytest.mark.parametrize("bad", ["24:00:00", "12:00", "12:00:00.", "12:00:00 +01:00", "1:00:00"])
def test_bad_time_text(bad):
    with pytest.raises(ValueConversionError, match="value " + repr(bad).replace("+", r"\+")):
        codec_for(time(7), SPARK).to_arrow([bad])


DTO = [
    "2024-01-02 03:04:05.1234567 +05:30",
    "2024-01-02 03:04:05.0000000 -00:00",  # negative zero offset
    "2024-01-02 03:04:05.5000000 +00:00",
    "0001-01-01 00:00:00.0000000 +14:00",  # before 0001-01-01 in UTC
    "9999-12-31 23:59:59.9999999 -14:00",  # after 9999-12-31 in UTC
    "1969-12-31 23:59:59.9999999 -00:30",
    None,
]


def test_datetimeoffset_spark_is_the_utc_instant():
    assert ints(datetimeoffset(7), DTO, SPARK) == [
        micros(2024, 1, 1, 21, 34, 5, 123456),
        micros(2024, 1, 2, 3, 4, 5),
        micros(2024, 1, 2, 3, 4, 5, 500000),
        micros(1, 1, 1) - 14 * 3600 * 10**6,
        micros(9999, 12, 31, 23, 59, 59, 999999) + 14 * 3600 * 10**6,
        micros(1970, 1, 1, 0, 29, 59, 999999),
        None,
    ]
    assert one(datetimeoffset(0), "2024-01-02 03:04:05 +05:30") == dt.datetime(2024, 1, 1, 21, 34, 5, tzinfo=UTC)


def test_datetimeoffset_zoned_timestamp_keeps_the_written_offset():
    expected = [
        "2024-01-02T03:04:05.1234567+05:30",
        "2024-01-02T03:04:05Z",  # Java prints a zero offset as Z, and no zero fraction
        "2024-01-02T03:04:05.5Z",  # trailing zeros removed (ISO_OFFSET_DATE_TIME)
        "0001-01-01T00:00:00+14:00",
        "9999-12-31T23:59:59.9999999-14:00",
        "1969-12-31T23:59:59.9999999-00:30",
        None,
    ]
    for modes in (ADAPTIVE, ADAPTIVE_US, CONNECT):
        assert convert(datetimeoffset(7), DTO, modes) == expected
    assert one(datetimeoffset(0), "2024-01-02 03:04:05 -08:00", ADAPTIVE) == "2024-01-02T03:04:05-08:00"
    assert one(datetimeoffset(3), "2024-01-02T03:04:05.120Z", ADAPTIVE) == "2024-01-02T03:04:05.12Z"  # style 127


@pytest.mark.parametrize(
    "bad", ["2024-01-02 03:04:05.1234567", "2024-01-02 03:04:05 +15:00", "2024-01-02 03:04:05 +05", "x"]
)
def test_bad_datetimeoffset_text(bad):
    for modes in (SPARK, ADAPTIVE):
        with pytest.raises(ValueConversionError, match="value " + repr(bad).replace("+", r"\+")):
            codec_for(datetimeoffset(7), modes).to_arrow([bad])


# -- characters and binary data ------------------------------------------------------------------


def test_strings_are_kept_as_read():
    for sql_type in (T("char", 3), T("nchar", 6), T("varchar", -1), T("nvarchar", -1), T("text", 16), T("xml", -1)):
        assert convert(sql_type, ["ab ", "héllo ☃", "", None]) == ["ab ", "héllo ☃", "", None]


def test_uniqueidentifier_is_upper_case():
    value = uuid.UUID("6f9619ff-8b86-d011-b42d-00c04fc964ff")
    expected = "6F9619FF-8B86-D011-B42D-00C04FC964FF"
    assert convert(T("uniqueidentifier", 16), [str(value), value, expected, None]) == [expected] * 3 + [None]


BINARY = [b"\x00\xff\x10", bytearray(b"\x01"), memoryview(b""), None]


@pytest.mark.parametrize("sql_type", [T("binary", 3), T("varbinary", -1), T("image", 16), T("timestamp", 8)])
def test_binary_modes(sql_type):
    assert convert(sql_type, BINARY) == [b"\x00\xff\x10", b"\x01", b"", None]
    assert convert(sql_type, BINARY, ValueModes(binary="base64")) == ["AP8Q", "AQ==", "", None]
    assert convert(sql_type, BINARY, ValueModes(binary="hex")) == ["00ff10", "01", "", None]


def test_rowversion_is_eight_bytes():
    value = (2001).to_bytes(8, "big")
    assert one(T("timestamp", 8), value) == value
    assert one(T("timestamp", 8), value, ValueModes(binary="hex")) == "00000000000007d1"


@pytest.mark.parametrize("name", ["hierarchyid", "geometry", "geography"])
def test_clr_types_are_their_native_bytes(name):
    point = bytes.fromhex("E6100000010C000000000000F03F0000000000000040")
    assert one(T(name, -1), point) == point
    assert one(T(name, -1), point, ValueModes(binary="base64")) == base64.b64encode(point).decode()


def test_binary_rejects_text():
    with pytest.raises(ValueConversionError, match="value 'AP8Q' cannot be captured as binary"):
        convert(T("varbinary", -1), [b"", "AP8Q"])


def test_sql_variant_and_unknown_types_are_their_nvarchar_text():
    assert one(T("sql_variant", 8016), "Jan  2 2024  3:04AM") == "Jan  2 2024  3:04AM"
    codec = codec_for(T("vector", 20), SPARK)
    assert "unmapped type 'vector'" in codec.description
    assert codec.to_arrow(["[1.0000000e+000,2.0000000e+000]"]).to_pylist() == ["[1.0000000e+000,2.0000000e+000]"]
    with pytest.raises(ValueConversionError) as info:
        codec.to_arrow([b"\x01"], column="embedding", table="dbo.docs")
    assert "column 'embedding' of dbo.docs" in str(info.value) and "'vector'" in str(info.value)


def test_to_arrow_accepts_an_arrow_array():
    codec = codec_for(datetime2(3), SPARK)
    assert codec.to_arrow(pa.array(["2024-01-02 03:04:05.123", None])).to_pylist() == [
        dt.datetime(2024, 1, 2, 3, 4, 5, 123000),
        None,
    ]


def test_error_without_column_context():
    with pytest.raises(ValueConversionError, match=r"^value 'x' cannot be captured"):
        codec_for(time(0), SPARK).to_arrow(["x"])
    with pytest.raises(ValueConversionError, match=r"^column 'c': value 'x'"):
        codec_for(time(0), SPARK).to_arrow(["x"], column="c")


def test_mapped_types():
    assert {"datetime2", "timestamp", "geography", "sql_variant"} <= MAPPED_TYPES
    assert "vector" not in MAPPED_TYPES and "json" not in MAPPED_TYPES


def test_text_codec_failure_does_not_suggest_column_text_list_again():
    with pytest.raises(ValueConversionError, match="already captured as text"):
        text_codec(datetime2(7), SPARK).to_arrow(["x"], column="c", table="t")


def test_codec_is_a_value():
    assert codec_for(datetime2(7), SPARK) == codec_for(datetime2(7), SPARK)
    assert isinstance(codec_for(INT, SPARK), Codec)


# -- text form (column_text_list) ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql_type", "value", "text"),
    [
        (BIT, True, "1"),
        (BIT, False, "0"),
        (TINYINT, 255, "255"),
        (BIGINT, -(2**63), "-9223372036854775808"),
        (decimal(18, 4), Decimal("1.5"), "1.5000"),
        (decimal(38, 0), Decimal(10**38 - 1), "9" * 38),
        (MONEY, Decimal("-1234.56"), "-1234.5600"),
        (REAL, 3.140000104904175, "3.14"),
        (FLOAT, 0.1, "0.1"),
        (FLOAT, 1e300, "1e+300"),
        (DATE, dt.date(1, 1, 1), "0001-01-01"),
        (time(0), "13:14:15", "13:14:15"),
        (time(7), "13:14:15.1234567", "13:14:15.1234567"),
        (time(3), "13:14:15.1230000", "13:14:15.123"),  # the type's digits
        (DATETIME, "2024-01-02 03:04:05.007", "2024-01-02 03:04:05.007"),
        (SMALLDATETIME, "2024-01-02 03:05:00.000", "2024-01-02 03:05:00"),
        (datetime2(0), "9999-12-31 23:59:59", "9999-12-31 23:59:59"),
        (datetime2(7), "2024-01-02 03:04:05.1234567", "2024-01-02 03:04:05.1234567"),
        (datetimeoffset(7), "2024-01-02 03:04:05.1234567 +05:30", "2024-01-02 03:04:05.1234567 +05:30"),
        (datetimeoffset(0), "2024-01-02T03:04:05Z", "2024-01-02 03:04:05 +00:00"),
        (datetimeoffset(3), "2024-01-02 03:04:05.120 -00:00", "2024-01-02 03:04:05.120 +00:00"),
        (T("nvarchar", -1), "héllo", "héllo"),
        (T("uniqueidentifier", 16), "6f9619ff-8b86-d011-b42d-00c04fc964ff", "6F9619FF-8B86-D011-B42D-00C04FC964FF"),
        (T("varbinary", 16), b"\x0a\x0b", "0x0A0B"),
        (T("timestamp", 8), (2001).to_bytes(8, "big"), "0x00000000000007D1"),
        (T("hierarchyid", 892), b"\x58", "0x58"),
        (T("geometry", -1), b"", "0x"),
        (T("sql_variant", 8016), "variant", "variant"),
        (T("vector", 20), "[1]", "[1]"),
    ],
)
def test_text_codec(sql_type, value, text):
    for modes in (SPARK, ValueModes(decimal="double", time_precision="adaptive", binary="base64")):
        assert text_codec(sql_type, modes).to_arrow([value, None]).to_pylist() == [text, None]


# -- properties: what CONVERT prints, parsed back ------------------------------------------------

FAST = settings(max_examples=60, deadline=None)

datetimes = st.datetimes(min_value=dt.datetime(1, 1, 1), max_value=dt.datetime(9999, 12, 31, 23, 59, 59))
digit_counts = st.integers(0, 7)


@st.composite
def fractions(draw, digits: int) -> int:
    """Nanoseconds within a second that ``digits`` fractional digits can write."""
    return draw(st.integers(0, 10**digits - 1)) * 10 ** (9 - digits)


def fraction_text(nanos: int, digits: int) -> str:
    return f".{nanos:09d}"[: digits + 1] if digits else ""


def style_121(value: dt.datetime, nanos: int, digits: int) -> str:
    """CONVERT(varchar, datetime2(digits), 121): yyyy-mm-dd hh:mi:ss[.fffffff]."""
    return f"{value.year:04d}-{value:%m-%d %H:%M:%S}" + fraction_text(nanos, digits)


def offset_text(minutes: int, *, negative_zero: bool = False) -> str:
    sign = "-" if minutes < 0 or (minutes == 0 and negative_zero) else "+"
    return f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


@st.composite
def local_timestamps(draw):
    digits = draw(digit_counts)
    value = draw(datetimes).replace(microsecond=0)
    return value, draw(fractions(digits)), digits


@FAST
@given(st.lists(st.one_of(st.none(), local_timestamps()), max_size=8), st.sampled_from([7, 6, 3]))
def test_property_datetime2_text_parses_to_the_written_instant(rows, n):
    rows = [r if r is None or r[2] <= n else (r[0], r[1] // 10 ** (9 - n) * 10 ** (9 - n), n) for r in rows]
    texts = [None if r is None else style_121(*r) for r in rows]
    seconds = [None if r is None else (seconds_since_epoch(r[0]), r[1]) for r in rows]

    def expect(unit_nanos: int) -> list:
        return [None if s is None else s[0] * (10**9 // unit_nanos) + s[1] // unit_nanos for s in seconds]

    assert ints(datetime2(n), texts, SPARK) == expect(1000)
    assert ints(datetime2(n), texts, CONNECT) == expect(10**6)
    adaptive_unit = 10**6 if n <= 3 else 1000 if n <= 6 else 1
    in_range = all(s is None or -(2**63) <= s[0] * 10**9 + s[1] < 2**63 for s in seconds)
    if adaptive_unit > 1 or in_range:
        assert ints(datetime2(n), texts, ADAPTIVE) == expect(adaptive_unit)
    else:
        with pytest.raises(ValueConversionError, match="NanoTimestamp"):
            ints(datetime2(n), texts, ADAPTIVE)
    # the text form prints it back exactly, with n digits
    assert text_codec(datetime2(n), SPARK).to_arrow(texts).to_pylist() == [
        None if r is None else style_121(r[0], r[1], n) for r in rows
    ]


@FAST
@given(
    st.lists(
        st.one_of(st.none(), st.tuples(local_timestamps(), st.integers(-840, 840), st.booleans())),
        max_size=8,
    )
)
def test_property_datetimeoffset_text(rows):
    texts, instants, zoned = [], [], []
    for row in rows:
        if row is None:
            texts.append(None)
            instants.append(None)
            zoned.append(None)
            continue
        (local, nanos, digits), minutes, negative_zero = row
        texts.append(style_121(local, nanos, digits) + " " + offset_text(minutes, negative_zero=negative_zero))
        utc_seconds = seconds_since_epoch(local) - minutes * 60
        instants.append(utc_seconds * 10**6 + nanos // 1000)
        fraction = f"{nanos:09d}".rstrip("0")
        zoned.append(
            f"{local.year:04d}-{local:%m-%dT%H:%M:%S}"
            + (f".{fraction}" if fraction else "")
            + ("Z" if minutes == 0 else offset_text(minutes))
        )
    assert ints(datetimeoffset(7), texts, SPARK) == instants
    for modes in (ADAPTIVE, ADAPTIVE_US, CONNECT):
        assert convert(datetimeoffset(7), texts, modes) == zoned
    canonical = [
        None if row is None else style_121(*row[0][:2], 7) + " " + offset_text(row[1]) for row in rows
    ]  # -00:00 prints +00:00
    assert text_codec(datetimeoffset(7), SPARK).to_arrow(texts).to_pylist() == canonical


@FAST
@given(
    st.lists(
        st.one_of(
            st.none(),
            st.tuples(st.integers(0, 86399), digit_counts).flatmap(
                lambda p: st.tuples(st.just(p[0]), fractions(p[1]), st.just(p[1]))
            ),
        ),
        max_size=8,
    ),
    st.integers(0, 7),
)
def test_property_time_text(rows, n):
    rows = [r if r is None or r[2] <= n else (r[0], r[1] // 10 ** (9 - n) * 10 ** (9 - n), n) for r in rows]

    def text(seconds: int, nanos: int, digits: int) -> str:
        return f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" + fraction_text(nanos, digits)

    texts = [None if r is None else text(*r) for r in rows]
    nanos_of_day = [None if r is None else r[0] * 10**9 + r[1] for r in rows]

    def expect(unit: int) -> list:
        return [None if v is None else v // unit for v in nanos_of_day]

    assert convert(time(n), texts, SPARK) == expect(1000)
    assert convert(time(n), texts, ADAPTIVE_US) == expect(1000)
    assert convert(time(n), texts, CONNECT) == expect(10**6)
    assert convert(time(n), texts, ADAPTIVE) == expect(10**6 if n <= 3 else 1000 if n <= 6 else 1)
    assert text_codec(time(n), SPARK).to_arrow(texts).to_pylist() == [
        None if r is None else text(r[0], r[1], n) for r in rows
    ]


@FAST
@given(st.integers(1, 38).flatmap(lambda p: st.tuples(st.just(p), st.integers(0, p))), st.data())
def test_property_decimal_string_and_precise(precision_scale, data):
    precision, scale = precision_scale
    unscaled = data.draw(st.integers(-(10**precision) + 1, 10**precision - 1))
    value = Decimal(unscaled).scaleb(-scale, Context(prec=80))  # the default 28 digits would round
    text = one(decimal(precision, scale), value, ValueModes(decimal="string"))
    assert Decimal(text) == value
    assert len(text.partition(".")[2]) == scale  # the column's scale, as toPlainString() prints it
    assert unscaled != 0 or not text.startswith("-")
    assert one(decimal(precision, scale), value) == value
    assert one(decimal(precision, scale), value, ValueModes(decimal="double")) == float(value)
