"""SQL Server column types -> the PostgreSQL types the stand-in stores them in.

Each declared T-SQL type is recorded (``standin.declared_columns``) so ``sys.columns``,
``sys.types`` and ``INFORMATION_SCHEMA.COLUMNS`` report the SQL Server type, not the PG one.
``normalize`` names the write-time rule a per-table trigger applies where PostgreSQL would
otherwise store a value SQL Server cannot hold (datetime's 1/300 s ticks, smalldatetime's
minutes, binary(n) padding, tinyint's range, rowversion's automatic value).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# sys.types: name -> (system_type_id, user_type_id)
SYSTEM_TYPE_IDS = {
    "image": (34, 34),
    "text": (35, 35),
    "uniqueidentifier": (36, 36),
    "date": (40, 40),
    "time": (41, 41),
    "datetime2": (42, 42),
    "datetimeoffset": (43, 43),
    "tinyint": (48, 48),
    "smallint": (52, 52),
    "int": (56, 56),
    "smalldatetime": (58, 58),
    "real": (59, 59),
    "money": (60, 60),
    "datetime": (61, 61),
    "float": (62, 62),
    "sql_variant": (98, 98),
    "ntext": (99, 99),
    "bit": (104, 104),
    "decimal": (106, 106),
    "numeric": (108, 108),
    "smallmoney": (122, 122),
    "bigint": (127, 127),
    "hierarchyid": (240, 128),
    "geometry": (240, 129),
    "geography": (240, 130),
    "varbinary": (165, 165),
    "varchar": (167, 167),
    "binary": (173, 173),
    "char": (175, 175),
    "timestamp": (189, 189),
    "nvarchar": (231, 231),
    "nchar": (239, 239),
    "xml": (241, 241),
    "sysname": (231, 256),
}

MAX = -1  # (max)


@dataclass(frozen=True)
class ColumnType:
    declared: str  # as SQL Server prints it, e.g. "datetime2(7)", "nvarchar(max)"
    type_name: str  # sys.types name ("timestamp" for rowversion, as SQL Server reports it)
    pg_type: str
    max_length: int  # sys.columns.max_length (bytes; -1 for (max))
    precision: int
    scale: int
    char_max_length: int | None  # INFORMATION_SCHEMA.COLUMNS.CHARACTER_MAXIMUM_LENGTH
    datetime_precision: int | None
    normalize: str | None  # datetime | smalldatetime | rowversion | binary | tinyint | None


class UnsupportedType(ValueError):
    pass


_SYNONYMS = {"integer": "int", "dec": "decimal", "character": "char"}
_DECL = re.compile(r"^\s*(\w+)\s*(?:\(\s*(max|\d+)\s*(?:,\s*(\d+)\s*)?\))?\s*$", re.IGNORECASE)


def parse(declared: str) -> ColumnType:
    """``'decimal(18,4)'`` -> its ColumnType. Raises UnsupportedType for anything else."""
    m = _DECL.match(declared)
    if not m:
        raise UnsupportedType(f"cannot read SQL Server type {declared!r}")
    # One-word synonyms map to their base type, which is what sys.types then reports (Learn, "Data
    # type synonyms (Transact-SQL)"); multi-word ones (double precision, national char, ...) are not read.
    name = _SYNONYMS.get(m.group(1).lower(), m.group(1).lower())
    arg1 = m.group(2)
    arg2 = int(m.group(3)) if m.group(3) is not None else None
    n = MAX if arg1 and arg1.lower() == "max" else (int(arg1) if arg1 else None)
    fixed = {
        "bit": ("boolean", 1, 1, 0),
        "tinyint": ("smallint", 1, 3, 0),
        "smallint": ("smallint", 2, 5, 0),
        "int": ("integer", 4, 10, 0),
        "bigint": ("bigint", 8, 19, 0),
        "money": ("numeric(19,4)", 8, 19, 4),
        "smallmoney": ("numeric(10,4)", 4, 10, 4),
        "real": ("real", 4, 24, 0),
        "uniqueidentifier": ("uuid", 16, 0, 0),
        "xml": ("xml", MAX, 0, 0),
        "sql_variant": ("text", 8016, 0, 0),
        "hierarchyid": ("bytea", 892, 0, 0),
        "geometry": ("bytea", MAX, 0, 0),
        "geography": ("bytea", MAX, 0, 0),
        "image": ("bytea", 16, 0, 0),
        "text": ("text", 16, 0, 0),
        "ntext": ("text", 16, 0, 0),
        "date": ("date", 3, 10, 0),
        "datetime": ("timestamp(3)", 8, 23, 3),
        "smalldatetime": ("timestamp(0)", 4, 16, 0),
    }
    if name in ("rowversion", "timestamp"):
        return ColumnType("timestamp", "timestamp", "bytea", 8, 0, 0, None, None, "rowversion")
    if name in fixed:
        pg, max_length, precision, scale = fixed[name]
        char_len = {"text": 2147483647, "ntext": 1073741823, "xml": MAX}.get(name)
        dt_prec = {"date": 0, "datetime": 3, "smalldatetime": 0}.get(name)
        normalize = {"datetime": "datetime", "smalldatetime": "smalldatetime", "tinyint": "tinyint"}.get(name)
        return ColumnType(name, name, pg, max_length, precision, scale, char_len, dt_prec, normalize)
    if name in ("decimal", "numeric"):
        p = n if n is not None else 18
        s = arg2 if arg2 is not None else 0
        if not (1 <= p <= 38 and 0 <= s <= p):
            raise UnsupportedType(f"invalid {name}({p},{s})")
        max_length = 5 if p <= 9 else 9 if p <= 19 else 13 if p <= 28 else 17
        return ColumnType(f"{name}({p},{s})", name, f"numeric({p},{s})", max_length, p, s, None, None, None)
    if name == "float":
        bits = n if n is not None else 53
        if bits <= 24:  # float(1..24) is real
            return ColumnType("real", "real", "real", 4, 24, 0, None, None, None)
        return ColumnType("float", "float", "double precision", 8, 53, 0, None, None, None)
    if name in ("time", "datetime2", "datetimeoffset"):
        frac = n if n is not None else 7
        if not 0 <= frac <= 7:
            raise UnsupportedType(f"invalid {name}({frac})")
        pg_frac = min(frac, 6)  # PostgreSQL keeps microseconds; 100 ns is a known difference
        size = 3 if frac <= 2 else 4 if frac <= 4 else 5
        base = {"time": 8, "datetime2": 19, "datetimeoffset": 26}[name]
        precision = base + (frac + 1 if frac else 0)
        pg = {"time": "time", "datetime2": "timestamp", "datetimeoffset": "timestamptz"}[name]
        max_length = size + {"time": 0, "datetime2": 3, "datetimeoffset": 5}[name]
        return ColumnType(f"{name}({frac})", name, f"{pg}({pg_frac})", max_length, precision, frac, None, frac, None)
    if name in ("char", "varchar", "nchar", "nvarchar", "binary", "varbinary"):
        length = n if n is not None else 1
        unicode = name.startswith("n")
        if length == MAX:
            if name in ("char", "nchar", "binary"):
                raise UnsupportedType(f"{name}(max) is not a SQL Server type")
            pg = "bytea" if name == "varbinary" else "text"
            return ColumnType(f"{name}(max)", name, pg, MAX, 0, 0, None if pg == "bytea" else MAX, None, None)
        limit = 4000 if unicode else 8000
        if not 1 <= length <= limit:
            raise UnsupportedType(f"invalid {name}({length})")
        if name in ("binary", "varbinary"):
            return ColumnType(f"{name}({length})", name, "bytea", length, 0, 0, None, None, name)
        pg = f"char({length})" if name.endswith("char") and not name.endswith("varchar") else f"varchar({length})"
        return ColumnType(f"{name}({length})", name, pg, length * (2 if unicode else 1), 0, 0, length, None, None)
    raise UnsupportedType(f"SQL Server type {declared!r} is not supported by the stand-in")
