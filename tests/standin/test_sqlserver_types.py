"""SQL Server type mapping, end to end on the stand-in: T-SQL table → CATALOG_SQL → codec_for →
SELECT codec.select(...) through pyodbc → to_arrow, in every handling mode.

What the stand-in cannot show (docs/sqlserver-standin.md, "Known differences"), and is verified
only by construction and the unit tests (tests/unit/cdc/sqlserver/test_types.py):

* 100 ns digits: the stand-in keeps microseconds, so datetime2(7)/time(7)/datetimeoffset(7)
  values here have at most 6 significant fractional digits (CONVERT prints a 7th ``0``).
* datetimeoffset keeps the instant, not the written offset: CONVERT 121 prints UTC (``+00:00``),
  so the ZonedTimestamp strings here end in ``Z`` where SQL Server would keep ``+05:30``.
  The instant (the ``spark`` mode's UTC timestamp) is what SQL Server gives.
* hierarchyid/geometry/geography are opaque bytes: ``CAST(... AS varbinary(max))`` returns
  the bytes written, as SQL Server returns the native serialisation.
* Alias types (``CREATE TYPE ... FROM``) cannot be created on the stand-in: CATALOG_SQL's
  resolution of them to the base type is checked only for the system types.
"""

from __future__ import annotations

import base64
import datetime as dt
from decimal import Decimal

import numpy as np
import pytest

from airflow_provider_cdc.cdc.events.value_modes import ValueModes
from airflow_provider_cdc.cdc.sources.sqlserver.types import CATALOG_SQL, SqlServerType, codec_for, text_codec
from tests.support.sqlserver import assert_valid_tsql

pytestmark = pytest.mark.pg

UTC = dt.timezone.utc
EPOCH = dt.datetime(1970, 1, 1)
GEOMETRY = bytes.fromhex("E6100000010C000000000000F03F0000000000000040")  # POINT(1 2), SRID 4326


def since_epoch(value: dt.datetime, unit: dt.timedelta) -> int:
    return (value - EPOCH) // unit


MS, US = dt.timedelta(milliseconds=1), dt.timedelta(microseconds=1)


def ms(*args) -> int:
    return since_epoch(dt.datetime(*args), MS)


def us(*args) -> int:
    return since_epoch(dt.datetime(*args), US)


def of_day(h: int, m: int, s: int, micro: int = 0) -> int:
    """Microseconds since midnight."""
    return ((h * 60 + m) * 60 + s) * 1_000_000 + micro


MODES = {
    "spark": ValueModes(),
    "adaptive": ValueModes(time_precision="adaptive"),
    "adaptive_time_microseconds": ValueModes(time_precision="adaptive_time_microseconds"),
    "connect": ValueModes(time_precision="connect"),
    "double": ValueModes(decimal="double"),
    "string": ValueModes(decimal="string"),
    "base64": ValueModes(binary="base64"),
    "hex": ValueModes(binary="hex"),
}
ADAPTIVE = ("adaptive", "adaptive_time_microseconds")

# (column, declared type, T-SQL literal, expected catalog (type name, max_length, precision, scale),
#  expected value by mode name ("*": every mode not listed), expected text form)
COLUMNS = [
    ("c_bit", "bit", "1", ("bit", 1, 1, 0), {"*": True}, "1"),
    ("c_tinyint", "tinyint", "255", ("tinyint", 1, 3, 0), {"*": 255}, "255"),
    ("c_smallint", "smallint", "-32768", ("smallint", 2, 5, 0), {"*": -32768}, "-32768"),
    ("c_int", "int", "-2147483648", ("int", 4, 10, 0), {"*": -2147483648}, "-2147483648"),
    (
        "c_bigint",
        "bigint",
        "9223372036854775807",
        ("bigint", 8, 19, 0),
        {"*": 9223372036854775807},
        "9223372036854775807",
    ),
    (
        "c_decimal",
        "decimal(38,10)",
        "1234567890123456789012345678.1234567890",
        ("decimal", 17, 38, 10),
        {
            "*": Decimal("1234567890123456789012345678.1234567890"),
            "double": 1.2345678901234568e27,
            "string": "1234567890123456789012345678.1234567890",
        },
        "1234567890123456789012345678.1234567890",
    ),
    (
        "c_numeric",
        "numeric(5,2)",
        "-1.5",
        ("numeric", 5, 5, 2),
        {"*": Decimal("-1.50"), "double": -1.5, "string": "-1.50"},
        "-1.50",
    ),
    (
        "c_money",
        "money",
        "922337203685477.5807",
        ("money", 8, 19, 4),
        {"*": Decimal("922337203685477.5807"), "double": 922337203685477.6, "string": "922337203685477.5807"},
        "922337203685477.5807",
    ),
    (
        "c_smallmoney",
        "smallmoney",
        "-214748.3648",
        ("smallmoney", 4, 10, 4),
        {"*": Decimal("-214748.3648"), "double": -214748.3648, "string": "-214748.3648"},
        "-214748.3648",
    ),
    ("c_real", "real", "3.14", ("real", 4, 24, 0), {"*": float(np.float32(3.14))}, "3.14"),
    ("c_float24", "float(24)", "0.25", ("real", 4, 24, 0), {"*": 0.25}, "0.25"),
    ("c_float", "float", "0.1", ("float", 8, 53, 0), {"*": 0.1}, "0.1"),
    (
        "c_date",
        "date",
        "'2024-02-29'",
        ("date", 3, 10, 0),
        {"*": dt.date(2024, 2, 29), **dict.fromkeys(ADAPTIVE, 19782)},
        "2024-02-29",
    ),
    (
        "c_date_min",
        "date",
        "'0001-01-01'",
        ("date", 3, 10, 0),
        {"*": dt.date(1, 1, 1), **dict.fromkeys(ADAPTIVE, -719162)},
        "0001-01-01",
    ),
    (
        "c_time0",
        "time(0)",
        "'13:14:15'",
        ("time", 3, 8, 0),
        {"*": of_day(13, 14, 15), "adaptive": of_day(13, 14, 15) // 1000, "connect": of_day(13, 14, 15) // 1000},
        "13:14:15",
    ),
    (
        "c_time3",
        "time(3)",
        "'13:14:15.123'",
        ("time", 4, 12, 3),
        {
            "*": of_day(13, 14, 15, 123000),
            "adaptive": of_day(13, 14, 15, 123000) // 1000,
            "connect": of_day(13, 14, 15, 123000) // 1000,
        },
        "13:14:15.123",
    ),
    (
        "c_time7",
        "time(7)",
        "'23:59:59.999999'",
        ("time", 5, 16, 7),
        {
            "*": of_day(23, 59, 59, 999999),
            "adaptive": of_day(23, 59, 59, 999999) * 1000,  # NanoTime
            "connect": of_day(23, 59, 59, 999999) // 1000,
        },
        "23:59:59.9999990",
    ),
    (
        "c_datetime",
        "datetime",
        "'2024-01-02 03:04:05.007'",
        ("datetime", 8, 23, 3),
        {
            "*": dt.datetime(2024, 1, 2, 3, 4, 5, 7000),  # CONVERT 121 prints .007 (a 1/300 s tick)
            **dict.fromkeys(ADAPTIVE, ms(2024, 1, 2, 3, 4, 5, 7000)),
        },
        "2024-01-02 03:04:05.007",
    ),
    (
        "c_datetime_min",
        "datetime",
        "'1753-01-01 00:00:00.004'",  # rounds to the .003 tick
        ("datetime", 8, 23, 3),
        {"*": dt.datetime(1753, 1, 1, 0, 0, 0, 3000), **dict.fromkeys(ADAPTIVE, ms(1753, 1, 1, 0, 0, 0, 3000))},
        "1753-01-01 00:00:00.003",
    ),
    (
        "c_smalldatetime",
        "smalldatetime",
        "'2024-01-02 03:04:29.999'",  # rounds up to the next minute
        ("smalldatetime", 4, 16, 0),
        {"*": dt.datetime(2024, 1, 2, 3, 5), **dict.fromkeys(ADAPTIVE, ms(2024, 1, 2, 3, 5))},
        "2024-01-02 03:05:00",
    ),
    (
        "c_datetime2_0",
        "datetime2(0)",
        "'9999-12-31 23:59:59'",
        ("datetime2", 6, 19, 0),
        {"*": dt.datetime(9999, 12, 31, 23, 59, 59), **dict.fromkeys(ADAPTIVE, ms(9999, 12, 31, 23, 59, 59))},
        "9999-12-31 23:59:59",
    ),
    (
        "c_datetime2_3",
        "datetime2(3)",
        "'0001-01-01 00:00:00.001'",
        ("datetime2", 7, 23, 3),
        {"*": dt.datetime(1, 1, 1, 0, 0, 0, 1000), **dict.fromkeys(ADAPTIVE, ms(1, 1, 1, 0, 0, 0, 1000))},
        "0001-01-01 00:00:00.001",
    ),
    (
        "c_datetime2_6",
        "datetime2(6)",
        "'1969-12-31 23:59:59.999999'",
        ("datetime2", 8, 26, 6),
        {
            "*": dt.datetime(1969, 12, 31, 23, 59, 59, 999999),
            **dict.fromkeys(ADAPTIVE, -1),  # MicroTimestamp
            "connect": dt.datetime(1969, 12, 31, 23, 59, 59, 999000),  # floor to the millisecond
        },
        "1969-12-31 23:59:59.999999",
    ),
    (
        "c_datetime2_7",
        "datetime2(7)",
        "'2024-01-02 03:04:05.123456'",
        ("datetime2", 8, 27, 7),
        {
            "*": dt.datetime(2024, 1, 2, 3, 4, 5, 123456),
            **dict.fromkeys(ADAPTIVE, us(2024, 1, 2, 3, 4, 5, 123456) * 1000),  # NanoTimestamp
            "connect": dt.datetime(2024, 1, 2, 3, 4, 5, 123000),
        },
        "2024-01-02 03:04:05.1234560",
    ),
    (
        "c_datetimeoffset0",
        "datetimeoffset(0)",
        "'2024-01-02 03:04:05 +05:30'",
        ("datetimeoffset", 8, 26, 0),
        {
            # SQL Server: "2024-01-02T03:04:05+05:30" (the stand-in keeps only the instant)
            "*": "2024-01-01T21:34:05Z",
            **dict.fromkeys(
                ("spark", "double", "string", "base64", "hex"), dt.datetime(2024, 1, 1, 21, 34, 5, tzinfo=UTC)
            ),
        },
        "2024-01-01 21:34:05 +00:00",
    ),
    (
        "c_datetimeoffset7",
        "datetimeoffset(7)",
        "'2024-01-02 03:04:05.5 -00:00'",
        ("datetimeoffset", 10, 34, 7),
        {
            "*": "2024-01-02T03:04:05.5Z",
            **dict.fromkeys(
                ("spark", "double", "string", "base64", "hex"), dt.datetime(2024, 1, 2, 3, 4, 5, 500000, tzinfo=UTC)
            ),
        },
        "2024-01-02 03:04:05.5000000 +00:00",
    ),
    ("c_char", "char(3)", "'ab'", ("char", 3, 0, 0), {"*": "ab "}, "ab "),
    ("c_varchar", "varchar(20)", "'varchar'", ("varchar", 20, 0, 0), {"*": "varchar"}, "varchar"),
    ("c_varcharmax", "varchar(max)", "'max'", ("varchar", -1, 0, 0), {"*": "max"}, "max"),
    ("c_nchar", "nchar(3)", "N'nc'", ("nchar", 6, 0, 0), {"*": "nc "}, "nc "),
    ("c_nvarchar", "nvarchar(20)", "N'héllo ☃'", ("nvarchar", 40, 0, 0), {"*": "héllo ☃"}, "héllo ☃"),
    ("c_nvarcharmax", "nvarchar(max)", "N'max ☃'", ("nvarchar", -1, 0, 0), {"*": "max ☃"}, "max ☃"),
    ("c_text", "text", "'text'", ("text", 16, 0, 0), {"*": "text"}, "text"),
    ("c_ntext", "ntext", "N'ntext ☃'", ("ntext", 16, 0, 0), {"*": "ntext ☃"}, "ntext ☃"),
    (
        "c_binary",
        "binary(4)",
        "0x0102",
        ("binary", 4, 0, 0),
        {"*": b"\x01\x02\x00\x00", "base64": "AQIAAA==", "hex": "01020000"},
        "0x01020000",
    ),
    (
        "c_varbinary",
        "varbinary(16)",
        "0x0A0B",
        ("varbinary", 16, 0, 0),
        {"*": b"\x0a\x0b", "base64": "Cgs=", "hex": "0a0b"},
        "0x0A0B",
    ),
    (
        "c_varbinarymax",
        "varbinary(max)",
        "0xFFFF",
        ("varbinary", -1, 0, 0),
        {"*": b"\xff\xff", "base64": "//8=", "hex": "ffff"},
        "0xFFFF",
    ),
    ("c_image", "image", "0x00", ("image", 16, 0, 0), {"*": b"\x00", "base64": "AA==", "hex": "00"}, "0x00"),
    (
        "c_uniqueidentifier",
        "uniqueidentifier",
        "'6f9619ff-8b86-d011-b42d-00c04fc964ff'",
        ("uniqueidentifier", 16, 0, 0),
        {"*": "6F9619FF-8B86-D011-B42D-00C04FC964FF"},
        "6F9619FF-8B86-D011-B42D-00C04FC964FF",
    ),
    ("c_xml", "xml", "N'<a>1</a>'", ("xml", -1, 0, 0), {"*": "<a>1</a>"}, "<a>1</a>"),
    ("c_sql_variant", "sql_variant", "N'variant'", ("sql_variant", 8016, 0, 0), {"*": "variant"}, "variant"),
    (
        "c_hierarchyid",
        "hierarchyid",
        "0x58",
        ("hierarchyid", 892, 0, 0),
        {"*": b"\x58", "base64": "WA==", "hex": "58"},
        "0x58",
    ),
    (
        "c_geometry",
        "geometry",
        "0x" + GEOMETRY.hex().upper(),
        ("geometry", -1, 0, 0),
        {"*": GEOMETRY, "base64": base64.b64encode(GEOMETRY).decode(), "hex": GEOMETRY.hex()},
        "0x" + GEOMETRY.hex().upper(),
    ),
    (
        "c_geography",
        "geography",
        "0x" + GEOMETRY.hex().upper(),
        ("geography", -1, 0, 0),
        {"*": GEOMETRY, "base64": base64.b64encode(GEOMETRY).decode(), "hex": GEOMETRY.hex()},
        "0x" + GEOMETRY.hex().upper(),
    ),
]

CREATE = (
    "CREATE TABLE [dbo].[typed] ([id] int NOT NULL PRIMARY KEY, "
    + ", ".join(f"[{name}] {declared} NULL" for name, declared, *_ in COLUMNS)
    + ", [c_rowversion] rowversion)"
)
INSERT = (
    "INSERT INTO [dbo].[typed] ([id], "
    + ", ".join(f"[{name}]" for name, *_ in COLUMNS)
    + ") VALUES (1, "
    + ", ".join(literal for _, _, literal, *_ in COLUMNS)
    + ")"
)
INSERT_NULLS = "INSERT INTO [dbo].[typed] ([id]) VALUES (2)"


def expected_value(by_mode: dict, mode: str):
    return by_mode.get(mode, by_mode["*"])


def read(conn, types: dict[str, SqlServerType], make_codec) -> dict[str, list]:
    """SELECT every column with its codec's select(), convert with to_arrow(): {column: [row 1, row 2]}."""
    codecs = {name: make_codec(sql_type) for name, sql_type in types.items()}
    sql = (
        "SELECT "
        + ", ".join(codec.select(f"[{name}]") for name, codec in codecs.items())
        + " FROM [dbo].[typed] ORDER BY [id]"
    )
    assert_valid_tsql(sql)
    rows = conn.execute(sql).fetchall()
    result = {}
    for index, (name, codec) in enumerate(codecs.items()):
        array = codec.to_arrow([row[index] for row in rows], column=name, table="dbo.typed")
        assert array.type == codec.arrow_type, name
        result[name] = array.to_pylist()
    return result


def test_catalog_codecs_and_values_in_every_mode(sqlserver):
    sqlserver.execute_tsql(CREATE)
    sqlserver.execute_tsql(INSERT)
    sqlserver.execute_tsql(INSERT_NULLS)
    conn = sqlserver.connect()
    try:
        assert_valid_tsql(CATALOG_SQL)
        catalog = conn.execute(CATALOG_SQL, "dbo", "typed").fetchall()
        assert [row[0] for row in catalog] == ["id"] + [c[0] for c in COLUMNS] + ["c_rowversion"]
        assert tuple(catalog[0][1:]) == ("int", 4, 10, 0, False, False)
        for row, (name, declared, _, described, *_rest) in zip(catalog[1:], COLUMNS):
            assert (row[1], row[2], row[3], row[4]) == described, name
            assert (bool(row[5]), bool(row[6])) == (True, False), name
            if declared != "float(24)":  # float(1..24) is real in the catalog
                assert SqlServerType(*row[1:5]).declared() == declared, name
        assert tuple(catalog[-1][1:5]) == ("timestamp", 8, 0, 0)
        types = {row[0]: SqlServerType(row[1], row[2], row[3], row[4]) for row in catalog if row[0] != "id"}

        rowversion = None
        for mode, modes in MODES.items():
            values = read(conn, types, lambda t, modes=modes: codec_for(t, modes))
            for name, *_, by_mode, _text in COLUMNS:
                assert values[name] == [expected_value(by_mode, mode), None], (mode, name)
            first, second = values["c_rowversion"]
            assert second is not None  # rowversion is never NULL: a new value on every insert
            if mode in ("base64", "hex"):
                assert first == (base64.b64encode(rowversion).decode() if mode == "base64" else rowversion.hex())
            else:
                assert isinstance(first, bytes) and len(first) == 8 and first < second
                rowversion = first

        text = read(conn, types, lambda t: text_codec(t, ValueModes()))
        for name, *_, text_form in COLUMNS:
            assert text[name] == [text_form, None], name
        assert text["c_rowversion"][0] == "0x" + rowversion.hex().upper()
    finally:
        conn.close()
